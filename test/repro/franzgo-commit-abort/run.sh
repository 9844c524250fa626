#!/usr/bin/env bash
# Reproduce franz-go v1.22.3's commit turned into an abort (README.md).
#   ./run.sh          with franz-go as released: the window is rarely hit
#   ./run.sh widen    with a copy of franz-go whose window is widened by a
#                     20 ms sleep (widen.patch): lost records in every run
set -euo pipefail
cd "$(dirname "$0")"
if [ "${1:-}" != widen ]; then
  exec go run .
fi
src=$(go list -m -f '{{.Dir}}' github.com/twmb/franz-go)
work=$(mktemp -d)
trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
cp -r "$src" "$work/franz-go"
chmod -R u+w "$work/franz-go"
patch -s -d "$work/franz-go" -p1 <widen.patch
cp go.mod go.sum "$work/"
go mod edit -modfile="$work/go.mod" -replace "github.com/twmb/franz-go=$work/franz-go"
go run -modfile="$work/go.mod" .
