#!/usr/bin/env bash
# On demand: DMTF's redfish-service-validator (offline) and redfish-protocol-validator (SSDP disabled by
# bmc-sim/tests/tools/protocol_validator_no_ssdp.py) against bmc-sim on every platform profile.
# CI runs the default layout and hgx-h100 only (bmc-sim/tests/validator.rs, protocol_validator.rs).
# Needs bmc-sim/ci-setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
platforms="default,generic-dmtf,hgx-h100,gb200,dell,trn2"
BMC_SIM_VALIDATOR_PLATFORMS="$platforms" WAVEGUARD_REQUIRE_ALL=1 \
    cargo test -p bmc-sim --test validator -- --nocapture
BMC_SIM_PROTOCOL_VALIDATOR_PLATFORMS="$platforms" WAVEGUARD_REQUIRE_ALL=1 \
    cargo test -p bmc-sim --test protocol_validator -- --nocapture
