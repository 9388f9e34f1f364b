# Sourced by scripts/up.sh and scripts/test.sh: create or reuse the project's virtualenv and
# install a lock file into it. Sets PY to the venv's python and puts its bin/ first on PATH.
#   ensure_venv requirements/service.txt
# EAGLENEST_VENV picks another folder (default .venv); EAGLENEST_PYTHON the interpreter that
# creates it (default python3.11, else python3; the lock is resolved for CPython 3.11).
ensure_venv() {
  local lock=$1 venv=${EAGLENEST_VENV:-$PWD/.venv} base=${EAGLENEST_PYTHON:-}
  if [ -z "$base" ]; then
    if command -v python3.11 >/dev/null 2>&1; then base=python3.11; else base=python3; fi
  fi
  echo "EagleNest: virtualenv $venv (from $lock)"
  if [ ! -x "$venv/bin/python" ]; then
    "$base" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || {
      echo "EagleNest needs CPython 3.11 (the lock is resolved for it); set EAGLENEST_PYTHON" >&2
      return 1
    }
    "$base" -m venv "$venv"
  fi
  PY="$venv/bin/python"
  export PATH="$venv/bin:$PATH"
  # Installed once per lock content: the stamp holds the hash of the lock and pyproject.toml.
  local stamp="$venv/.eaglenest-$(basename "$lock").sha256"
  local want
  want=$(cat "$lock" pyproject.toml | sha256sum | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  echo "EagleNest: installing $lock into $venv (the first time takes minutes;" \
    "a line every ${EAGLENEST_HEARTBEAT_SECONDS:-15} s until it is done)"
  _heartbeat "${EAGLENEST_HEARTBEAT_SECONDS:-15}" &
  local beat=$! rc=0
  _install_lock "$lock" || rc=$?
  kill "$beat" 2>/dev/null || true
  wait "$beat" 2>/dev/null || true
  if [ "$rc" -ne 0 ]; then
    echo "EagleNest: installing $lock failed (pip's errors above)" >&2
    return "$rc"
  fi
  echo "EagleNest: installed $lock"
  echo "$want" > "$stamp"
}

# torch first (its CPU build is not on PyPI: a local wheel (find-links) or PyTorch's CPU
# index), then the lock, then EagleNest itself; returns non-zero at the first failure.
_install_lock() {
  local lock=$1 torch_pin
  local pip=(_quiet_pip "$PY" -m pip install -q --disable-pip-version-check --no-deps)
  torch_pin=$(grep -E '^torch==' "$lock") || return 1
  "${pip[@]}" "$torch_pin" 2>/dev/null \
    || "${pip[@]}" --index-url https://download.pytorch.org/whl/cpu "$torch_pin" || return 1
  "${pip[@]}" -r "$lock" || return 1
  "${pip[@]}" -e . || return 1
}

# "EagleNest: still installing (<n> s)" every $1 seconds, until killed.
_heartbeat() {
  local every=$1 waited=0
  while sleep "$every"; do
    waited=$((waited + every))
    echo "EagleNest: still installing (${waited} s)"
  done
}

# pip without the warnings about index locations a machine lists but lacks (noise, not errors).
_quiet_pip() {
  "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}
