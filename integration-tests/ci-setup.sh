#!/usr/bin/env bash
# Installs what integration-tests/tests/prometheus_alertmanager.rs drives: a real Prometheus and a real
# Alertmanager, from Debian (`prometheus`, `prometheus-alertmanager`); and a real Slurm (`slurmctld`,
# `slurmd`, `slurm-client`, `munge`) for the scheduler crate's loopback tests. Idempotent and fast when all are
# present; called from .ci/setup. Only the binaries are used: the packages' systemd units are not started
# (the test runs its own processes on loopback ports with configs in a temp dir).
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }

missing=()
have prometheus || missing+=(prometheus)
# A real Slurm for orchestrator/scheduler/tests/slurm_loopback.rs (integration-tests/slurm/start.sh runs it).
have slurmctld || missing+=(slurmctld)
have slurmd || missing+=(slurmd)
have scontrol || missing+=(slurm-client)
have munged || missing+=(munge)
# Debian names the binary prometheus-alertmanager; upstream tarballs name it alertmanager.
have prometheus-alertmanager || have alertmanager || missing+=(prometheus-alertmanager)

if [ ${#missing[@]} -gt 0 ]; then
    echo "integration-tests ci-setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Package scripts try to start services; in a container without an init system that fails the
    # install. policy-rc.d exit 101 tells invoke-rc.d not to start anything (only if none exists).
    created_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        created_policy=1
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    # Other ci-setup scripts may be running apt at the same time: wait for the lock rather than fail.
    apt-get -o DPkg::Lock::Timeout=600 update
    apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "${missing[@]}"
    if [ "$created_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; trap - EXIT; fi
fi

have prometheus || { echo "prometheus not on PATH after install" >&2; exit 1; }
have prometheus-alertmanager || have alertmanager || { echo "alertmanager not on PATH after install" >&2; exit 1; }
have slurmctld && have slurmd && have scontrol && have munged || { echo "Slurm or munge not on PATH after install" >&2; exit 1; }
echo "integration-tests ci-setup: $(slurmd -V 2>&1 | head -n 1) (slurmd)"
echo "integration-tests ci-setup: $(prometheus --version 2>&1 | head -n 1)"
echo "integration-tests ci-setup: $( (prometheus-alertmanager --version 2>&1 || alertmanager --version 2>&1) | head -n 1)"
