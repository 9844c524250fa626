#!/usr/bin/env bash
# make soak: run the tests that once lost a command many times, under the
# race detector and under load, keep the log of every failing run and say
# how many failed (docs/soak.md).
#
#   SOAK=300           runs of each single test (TestRelaysShareShards,
#                      TestFirstCommitOfEveryProducerIsVisible,
#                      TestStatusPage)
#   SOAK_PACKAGES=10   runs of the relay's and the projector's whole
#                      package tests
#   SOAK_LOAD=copies   two runs at once (default); hog: one run at a time
#                      beside a busy loop on one core; none: one at a time
#   SOAK_ONLY=regexp   only the jobs whose name matches
#   KAFKA_BROKERS=...  run the tests that honour it against that cluster
#                      (make kafka-up) instead of the embedded broker
#   DATABASE_URL       the Postgres the tests use (make soak sets it)
#
# Each run is a process of its own (-test.count=1), so a failure's log is
# that run's alone: .data/soak/<start time>/<job>-<run>.log. The summary
# is printed and written to summary.txt next to them.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${SOAK:-300}
pkgruns=${SOAK_PACKAGES:-10}
load=${SOAK_LOAD:-copies}
only=${SOAK_ONLY:-.}
case "$load" in copies | hog | none) ;; *) echo "soak: SOAK_LOAD is copies, hog or none, not $load" >&2; exit 2 ;; esac
[ -n "${DATABASE_URL:-}" ] || { echo "soak: DATABASE_URL is not set (make soak sets it)" >&2; exit 2; }

dir=.data/soak/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$dir/bin"
echo "soak: building the test binaries (race detector) into $dir/bin"
go test -race -c -o "$dir/bin/relay.test" ./pipeline/relay
go test -race -c -o "$dir/bin/projector.test" ./pipeline/projector
go test -race -c -o "$dir/bin/statuspage.test" ./test/statuspage

# name, binary, package directory (tests run there), -test.run pattern, runs
jobs=(
  "TestRelaysShareShards relay.test pipeline/relay ^TestRelaysShareShards\$ $runs"
  "TestFirstCommitOfEveryProducerIsVisible relay.test pipeline/relay ^TestFirstCommitOfEveryProducerIsVisible\$ $runs"
  "TestStatusPage statuspage.test test/statuspage ^TestStatusPage\$ $runs"
  "relay-package relay.test pipeline/relay . $pkgruns"
  "projector-package projector.test pipeline/projector . $pkgruns"
)

hog=
if [ "$load" = hog ]; then
  (while :; do :; done) &
  hog=$!
fi
cleanup() { [ -z "$hog" ] || kill "$hog" 2>/dev/null || true; }
trap cleanup EXIT

# runjob NAME BIN DIR PATTERN FIRST STEP LAST: runs FIRST, FIRST+STEP, ...
# up to LAST, each in a process of its own; a failing run's output is
# kept, and its number appended to NAME.failed.
runjob() {
  local name=$1 bin=$2 pkg=$3 pattern=$4 first=$5 step=$6 last=$7 i out
  for ((i = first; i <= last; i += step)); do
    out="$dir/$name-$i.log"
    if (cd "$pkg" && "$OLDPWD/$dir/bin/$bin" -test.run "$pattern" -test.count=1 -test.v -test.timeout=20m >"$OLDPWD/$out" 2>&1) &&
      grep -q '^--- PASS' "$out" && ! grep -q 'no tests to run' "$out"; then
      rm -f "$out"
      echo "$i" >>"$dir/$name.passed"
    else
      echo "$i" >>"$dir/$name.failed"
      echo "soak: $name run $i FAILED (log: $out)"
    fi
  done
}

lines() { if [ -f "$1" ]; then wc -l <"$1"; else echo 0; fi; }

start=$(date +%s)
for job in "${jobs[@]}"; do
  read -r name bin pkg pattern n <<<"$job"
  [[ "$name" =~ $only ]] || continue
  [ "$n" -gt 0 ] || continue
  echo "soak: $name, $n runs ($load), $(uptime | sed 's/.*load/load/')"
  if [ "$load" = copies ]; then
    runjob "$name" "$bin" "$pkg" "$pattern" 1 2 "$n" &
    runjob "$name" "$bin" "$pkg" "$pattern" 2 2 "$n" &
    wait
  else
    runjob "$name" "$bin" "$pkg" "$pattern" 1 1 "$n"
  fi
done

{
  echo "soak: $(date -u '+%Y-%m-%d %H:%M UTC'), $(($(date +%s) - start)) s, $(nproc) cores, SOAK_LOAD=$load, broker ${KAFKA_BROKERS:-embedded}, $(uptime | sed 's/.*load/load/')"
  printf '%-40s %6s %6s\n' job runs failed
  for job in "${jobs[@]}"; do
    read -r name _ _ _ n <<<"$job"
    [[ "$name" =~ $only ]] || continue
    passed=$(lines "$dir/$name.passed")
    failed=$(lines "$dir/$name.failed")
    printf '%-40s %6d %6d\n' "$name" $((passed + failed)) "$failed"
  done
  echo "logs of failing runs: $dir"
} | tee "$dir/summary.txt"
! ls "$dir"/*.failed >/dev/null 2>&1
