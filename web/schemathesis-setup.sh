#!/usr/bin/env bash
# Installs schemathesis (from PyPI, into its own virtualenv) for web/schemathesis.sh, which fuzzes
# the API against its OpenAPI document. Idempotent and fast when it is already installed; called
# from web/ci-setup.sh.
set -euo pipefail

VENV="${WAVEGUARD_SCHEMATHESIS_VENV:-/opt/waveguard-schemathesis}"
# Pinned to the major version the script's options are written for.
SPEC='schemathesis>=4.3,<5'

if [ -x "$VENV/bin/st" ] && "$VENV/bin/st" --version >/dev/null 2>&1; then
    exit 0
fi
echo "web ci-setup: installing $SPEC into $VENV"
if ! python3 -m venv "$VENV" 2>/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 update
    apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends python3-venv
    python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install --quiet --disable-pip-version-check "$SPEC"
"$VENV/bin/st" --version
