#!/usr/bin/env bash
# make test's pytest run. The 3-minute schemathesis stateful run (issue 33: one thread of
# generation against an in-process server, about one core) runs beside the rest of the suite,
# whose longest tests mostly wait on processes; its output follows the suite's. Exit status:
# the suite's if it failed, else the stateful run's.
set -uo pipefail
py=$1
shift
stateful=tests/security/test_stateful.py
mkdir -p build
log=build/stateful.log
"$py" -m pytest -q -p no:cacheprovider --basetemp=build/pytest-stateful "$stateful" >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null' EXIT
"$py" -m pytest -q --ignore="$stateful" "$@"
rc=$?
wait $pid
rc_stateful=$?
trap - EXIT
echo "--- $stateful, run beside the suite (exit $rc_stateful) ---"
if [ "$rc_stateful" -eq 0 ]; then tail -n 3 "$log"; else cat "$log"; fi
exit $((rc != 0 ? rc : rc_stateful))
