#!/usr/bin/env bash
# gotest.sh ARGS...: `go test ARGS` with its output as usual, then each
# package's test time, slowest first, so a slow or growing package is seen on
# every run. The exit status is go test's.
set -uo pipefail
GO=${GO:-go}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$GO" test "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
echo
echo "per-package test time (go test $*):"
awk '($1 == "ok" || $1 == "FAIL") && $3 ~ /s$/ { t = $3; sub(/s$/, "", t); printf "%9.1fs  %-4s %s\n", t, $1, $2 }' "$log" | sort -rn
passed=$(grep -c '^ok ' "$log")
failed=$(grep -Ec '^FAIL[[:space:]]+[^[:space:]]+[[:space:]]' "$log")
echo "packages: $passed passed, $failed failed"
exit "$rc"
