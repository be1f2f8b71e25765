#!/usr/bin/env bash
# Stops a cluster started by start.sh DIR: its slurmds, slurmctld and munged, by the pids they
# recorded in DIR (never by name, so other clusters and the host's own daemons are left alone).
set -uo pipefail
dir=${1:?usage: stop.sh DIR}
[ -d "$dir" ] || exit 0
stop_pid() {
    local pid=$1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
    kill "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
}
# Cancel this cluster's jobs first (SLURM_CONF names it): their slurmstepd processes outlive slurmd.
if [ -f "$dir/slurm.conf" ] && command -v scancel >/dev/null; then
    SLURM_CONF="$dir/slurm.conf" timeout 10 scancel --user=root >/dev/null 2>&1 || true
    sleep 1
fi
for f in "$dir"/slurmd-*.launcher.pid "$dir"/slurmctld.launcher.pid; do
    [ -f "$f" ] && stop_pid "$(cat "$f")"
done
[ -f "$dir/munge/munged.pid" ] && stop_pid "$(cat "$dir/munge/munged.pid")"
exit 0
