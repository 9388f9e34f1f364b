# Sourced by scripts/test.sh: pytest with the exit-code-5 guard, and the default suite in two
# processes at once.
#   run_pytest ARGS...        one pytest run (its 15 slowest tests listed); a run that
#                             collects no tests fails
#   run_split ROOT -- DIRS... ROOT's tests in two processes at the same time: DIRS in one,
#                             the rest of ROOT in the other; the second one's output follows
#                             the first's. Fails if either fails.
# Why two: about half the default suite's wall time is waiting (stacks starting, model
# servers, timeouts), so two processes keep both cores busy. Each process has its own session
# fixtures (stacks, brokers, databases on free ports) and its own --basetemp.

run_pytest() {
  local rc
  set +e
  "$PY" -m pytest -q --durations=15 "$@"  # the slowest tests, for keeping CI in its time
  rc=$?
  set -e
  if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: failing on purpose" >&2
    return 1
  fi
  return "$rc"
}

run_split() {
  local root=$1 scratch pid rc_one=0 rc_two=0 ignores=()
  shift 2  # ROOT --
  for dir in "$@"; do ignores+=("--ignore=$dir"); done
  scratch=$(mktemp -d)
  run_pytest -p no:cacheprovider --basetemp="$scratch/two" "$root" "${ignores[@]}" \
    >"$scratch/two.log" 2>&1 &
  pid=$!
  echo "-- first process: $*"
  run_pytest -p no:cacheprovider --basetemp="$scratch/one" "$@" || rc_one=$?
  wait "$pid" || rc_two=$?
  echo "-- second process: $root without $*"
  cat "$scratch/two.log"
  rm -rf "$scratch"
  [ "$rc_one" -eq 0 ] && [ "$rc_two" -eq 0 ]
}
