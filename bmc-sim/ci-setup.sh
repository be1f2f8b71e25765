#!/usr/bin/env bash
# Installs what bmc-sim's tests need beyond cargo: DMTF's Redfish service validator (PyPI).
# The DMTF CSDL schemas it validates against come from the `nv-redfish-schema` crate (a dev-dependency),
# so no download from dmtf.org is needed. Idempotent; called from .ci/run.
set -euo pipefail
PY=${PYTHON:-python3}
if ! command -v rf_service_validator >/dev/null 2>&1; then
    "$PY" -m pip install --quiet --disable-pip-version-check "redfish-service-validator==3.1.8"
fi
# pyenv installs console scripts behind shims that need a rehash.
if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi
command -v rf_service_validator >/dev/null 2>&1 || { echo "rf_service_validator not on PATH after install" >&2; exit 1; }
echo "bmc-sim ci-setup: rf_service_validator ready"
