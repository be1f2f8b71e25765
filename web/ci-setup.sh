#!/usr/bin/env bash
# Installs what integration-tests/tests/browser.rs drives: a real headless Chromium and its
# WebDriver (Debian `chromium` + `chromium-driver`). Idempotent and fast when both are present;
# called from .ci/setup.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }

missing=()
have chromium || missing+=(chromium)
have chromedriver || missing+=(chromium-driver)

if [ ${#missing[@]} -gt 0 ]; then
    echo "web ci-setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Other ci-setup scripts may be running apt at the same time: wait for the lock rather than fail.
    apt-get -o DPkg::Lock::Timeout=600 update
    apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "${missing[@]}"
fi
chromium --version
chromedriver --version

# The API fuzzer web/schemathesis.sh drives.
bash "$(dirname "$0")/schemathesis-setup.sh"
