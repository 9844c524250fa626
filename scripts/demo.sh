#!/usr/bin/env bash
# make demo: start `onceflow dev` (embedded broker and registry, Postgres,
# all five components), drive a short scripted workload over HTTP, print
# what happened and the balances, and stop. Exits 0 only when the read
# models show exactly the expected numbers.
set -euo pipefail
cd "$(dirname "$0")/.."

key="${ONCEFLOW_DEV_API_KEY:-of_demo_$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')}"
log=bin/demo-dev.log
admin="${ADMIN_ADDR:-127.0.0.1:9090}"
http="${HTTP_ADDR:-127.0.0.1:8080}"

echo "starting onceflow dev (log: $log)"
ONCEFLOW_DEV_API_KEY="$key" HTTP_ADDR="$http" ADMIN_ADDR="$admin" bin/onceflow dev >"$log" 2>&1 &
dev=$!
stop() {
  kill -TERM "$dev" 2>/dev/null || true
  wait "$dev" 2>/dev/null || true
}
trap stop EXIT

for _ in $(seq 1 600); do
  if curl -fsS "http://$admin/readyz" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$dev" 2>/dev/null; then echo "onceflow dev exited:"; tail -n 40 "$log"; exit 1; fi
  sleep 0.1
done
curl -fsS "http://$admin/readyz" >/dev/null || { echo "onceflow dev is not ready:"; tail -n 40 "$log"; exit 1; }
sed -n '/^onceflow dev is running/,/^$/p' "$log"

ONCEFLOW_DEV_API_KEY="$key" bin/onceflow demo -url "http://$http"

cat <<'NEXT'

What to try next:
  ONCEFLOW_DEV_API_KEY=devkey bin/onceflow dev    the same pipeline and data, left running; then, beside it:
    README's "Try it by hand"                     commands of your own over HTTP
    http://127.0.0.1:9090/status                  the status page
    bin/onceflow events tail -from start -follow=false   the events decided so far, decoded (docs/consumers.md)
    bin/onceflow trace KEY                        one command's way, from its Idempotency-Key (docs/operations.md)
  make kafka-up                                   Apache Kafka itself, to run the same on (README, "On Apache Kafka")
  docs/your-first-domain.md                       a domain of your own, in nine steps
NEXT
