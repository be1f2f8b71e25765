#!/usr/bin/env bash
# Installs what bmc-sim's tests need beyond cargo, all from PyPI, pinned:
# - DMTF's redfish-service-validator (tests/validator.rs). The DMTF CSDL schemas it validates against come
#   from the `nv-redfish-schema` crate (a dev-dependency), so no download from dmtf.org is needed.
# - DMTF's redfish-protocol-validator (tests/protocol_validator.rs, run through
#   tests/tools/protocol_validator_no_ssdp.py, which disables its SSDP multicast).
# - sushy, OpenStack's Redfish client (tests/sushy.rs).
# - ansible, whose PyPI package bundles the community.general collection with its redfish_command and
#   redfish_info modules (tests/ansible.rs); Ansible Galaxy is not needed.
# Idempotent: only what is missing is installed. Called from .ci/run through .ci/setup.
set -euo pipefail
PY=${PYTHON:-python3}
have_module() { "$PY" -c "import $1" >/dev/null 2>&1; }
# pyenv installs console scripts behind shims that need a rehash.
rehash() { if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi; }

wanted=()
command -v rf_service_validator >/dev/null 2>&1 || wanted+=("redfish-service-validator==3.1.8")
have_module redfish_protocol_validator || wanted+=("redfish-protocol-validator==1.3.2")
have_module sushy || wanted+=("sushy==5.14.0")
if ! command -v ansible-playbook >/dev/null 2>&1 || ! have_module ansible_collections.community.general; then
    wanted+=("ansible==12.3.0")
fi
if ((${#wanted[@]})); then
    echo "bmc-sim ci-setup: installing ${wanted[*]}"
    "$PY" -m pip install --quiet --disable-pip-version-check "${wanted[@]}"
    rehash
fi

command -v rf_service_validator >/dev/null 2>&1 || { echo "rf_service_validator not on PATH after install" >&2; exit 1; }
command -v ansible-playbook >/dev/null 2>&1 || { echo "ansible-playbook not on PATH after install" >&2; exit 1; }
for m in redfish_protocol_validator sushy ansible_collections.community.general; do
    have_module "$m" || { echo "Python module $m not importable after install" >&2; exit 1; }
done
echo "bmc-sim ci-setup: rf_service_validator, redfish-protocol-validator, sushy, ansible ready"
