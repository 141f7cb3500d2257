#!/usr/bin/env bash
# gotest.sh ARGS...: `go test ARGS` with its output as usual, then each
# package's test time, slowest first, and the step's wall-clock time, so a slow
# or growing package is seen on every run. The exit status is go test's.
set -uo pipefail
GO=${GO:-go}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s)
"$GO" test "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
wall=$(($(date +%s) - start))
# The header names the flags, not the package list (test-fast passes ~40
# import paths): everything before the first package pattern.
flags=()
for a in "$@"; do
  case $a in ./* | github.com/* | all | std) break ;; esac
  flags+=("$a")
done
echo
echo "per-package test time, slowest first (go test ${flags[*]}):"
awk '($1 == "ok" || $1 == "FAIL") && $3 ~ /s$/ { t = $3; sub(/s$/, "", t); printf "%9.1fs  %-4s %s\n", t, $1, $2 }' "$log" | sort -rn
passed=$(grep -c '^ok ' "$log")
failed=$(grep -Ec '^FAIL[[:space:]]+[^[:space:]]+[[:space:]]' "$log")
# The failed tests with their messages, again at the end: a CI system that
# keeps only the output's tail (nodes' logs can follow a failure for pages)
# still shows what failed and why.
if [ "$failed" -gt 0 ] || [ "$rc" -ne 0 ]; then
  echo "failed tests (their own lines, at most 40):"
  grep -E '^[[:space:]]*--- FAIL|^[[:space:]]+[A-Za-z0-9_]+_test\.go:[0-9]+:|^panic:|^FAIL[[:space:]]|test timed out' "$log" | cut -c1-300 | head -40
fi
echo "packages: $passed passed, $failed failed; wall clock ${wall}s (compiling included), load average $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo n/a)"
exit "$rc"
