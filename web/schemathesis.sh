#!/usr/bin/env bash
# Fuzzes the running API against its own OpenAPI document with schemathesis (examples, coverage,
# fuzzing and stateful phases): any 5xx or response that breaks the documented schema fails the
# run. CI time-boxes it to 3 minutes (the suite before it takes most of the 40-minute CI budget); run it longer on demand:
#   WAVEGUARD_SCHEMATHESIS_SECONDS=3600 bash web/schemathesis.sh
# Needs web/schemathesis-setup.sh (schemathesis in a virtualenv; .ci/setup runs it). Serves on a loopback port with a throw-away
# SQLite database and an admin API token, so every route is reachable.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${WAVEGUARD_SCHEMATHESIS_VENV:-/opt/waveguard-schemathesis}"
SECONDS_BUDGET="${WAVEGUARD_SCHEMATHESIS_SECONDS:-180}"
ST="$VENV/bin/st"
if [ ! -x "$ST" ]; then
    if [ "${WAVEGUARD_REQUIRE_ALL:-0}" = 1 ]; then
        echo "schemathesis: $ST missing (run web/schemathesis-setup.sh)" >&2
        exit 1
    fi
    echo "schemathesis: SKIPPED ($ST missing; run web/schemathesis-setup.sh)"
    exit 0
fi

cargo build --quiet --locked -p waveguard
BIN="${CARGO_TARGET_DIR:-target}/debug/waveguard"
WORK="$(mktemp -d)"
SERVER_PID=""
cleanup() {
    if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT

DB="sqlite://$WORK/waveguard.db"
# Nodes the fuzzer registers name BMCs anywhere; the RMA monitor would try to reach them, and tests
# talk to loopback only.
printf '[rma]\nenabled = false\n' >"$WORK/waveguard.toml"
"$BIN" --database-url "$DB" user add fuzz --role admin --no-password >/dev/null
TOKEN="$("$BIN" --database-url "$DB" user token fuzz --label schemathesis 2>/dev/null | tail -n 1)"

# The webhook needs a token of its own, or it answers 503 to everything.
export WAVEGUARD_SCHEMATHESIS_ALERT_TOKEN="schemathesis-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
"$BIN" --config "$WORK/waveguard.toml" --database-url "$DB" serve --listen 127.0.0.1:0 --alertmanager-token-env WAVEGUARD_SCHEMATHESIS_ALERT_TOKEN \
    >"$WORK/serve.out" 2>"$WORK/serve.err" &
SERVER_PID=$!
URL=""
for _ in $(seq 1 100); do
    URL="$(sed -n 's/^waveguard listening on \(http:[^ ]*\)$/\1/p' "$WORK/serve.out")"
    [ -n "$URL" ] && break
    sleep 0.1
done
if [ -z "$URL" ]; then
    echo "schemathesis: the server did not start" >&2
    cat "$WORK/serve.err" >&2
    exit 1
fi

echo "schemathesis: $URL for ${SECONDS_BUDGET}s"
status=0
# The budget bounds fuzzing and stateful testing; the outer timeout is a backstop.
# From the work directory, so schemathesis's cache stays out of the checkout.
(cd "$WORK" && timeout $((SECONDS_BUDGET + 120)) "$ST" run "$URL/api/v1/openapi.json" \
    --url "$URL" \
    --header "Authorization: Bearer $TOKEN" \
    --phases examples,coverage,fuzzing,stateful \
    --checks not_a_server_error,response_schema_conformance \
    --max-time "$SECONDS_BUDGET" \
    --workers 1 \
    --request-timeout 30 \
    --no-color) || status=$?
if grep -q "panicked" "$WORK/serve.err"; then
    echo "schemathesis: the server panicked" >&2
    grep -A5 "panicked" "$WORK/serve.err" >&2
    status=1
fi
exit "$status"
