#!/usr/bin/env bash
# `make examples` (a step of .ci/run): run every example script given as an argument, two at a time
# (the CI machine has two cores), each on one CPU thread. Each script's output is kept in a log and
# printed whole when it ends, with its time; the status is non-zero if any script failed.
#
#   bash scripts/run_examples.sh PYTHON SCRIPT...      # JOBS=1 runs them one after the other
set -uo pipefail
PY="$1"; shift
JOBS="${JOBS:-2}"
LOGS="$(mktemp -d "${TMPDIR:-/tmp}/pointformers-examples.XXXXXX")"
trap 'rm -rf "$LOGS"' EXIT
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

run_one() {  # script index: runs the script, then prints its log and time under one lock
    local script="$1" log="$LOGS/$2.log" t0 rc
    t0=$(date +%s)
    "$PY" "$script" >"$log" 2>&1
    rc=$?
    {
        flock 9
        echo "== $script"
        cat "$log"
        if [ "$rc" = 0 ]; then echo "== $script: ok ($(( $(date +%s) - t0 )) s)"
        else echo "== $script: FAILED with status $rc ($(( $(date +%s) - t0 )) s)"; fi
    } 9>"$LOGS/print.lock"
    echo "$rc" >"$LOGS/$2.rc"
}

i=0
for script in "$@"; do
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    run_one "$script" "$i" &
    i=$((i + 1))
done
wait
failed=0
i=0
for script in "$@"; do  # a script without its status file was killed before it could write it
    rc="$(cat "$LOGS/$i.rc" 2>/dev/null || echo missing)"
    [ "$rc" = 0 ] || { failed=1; echo "examples: $script failed (status $rc)" >&2; }
    i=$((i + 1))
done
exit "$failed"
