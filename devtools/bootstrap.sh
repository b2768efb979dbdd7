#!/usr/bin/env bash
# Creates the virtual environment of `make run` and `make test` on a fresh machine:
#
#   bash devtools/bootstrap.sh PYTHON VENV      (the Makefile's $(VENV)/.installed rule)
#
# One line per step on standard output; a step that fails stops with a line saying which step
# failed and what to do, and a non-zero status (make then stops). The Debian packages
# python3-venv and python3-dev are installed (as root, without recommended packages) only when
# PYTHON cannot create a virtual environment; not being root, it prints the command instead.
set -uo pipefail

python=${1:?usage: bootstrap.sh PYTHON VENV}
venv=${2:?usage: bootstrap.sh PYTHON VENV}

step() { printf 'setup: %s\n' "$*"; }
fail() { printf 'setup: FAILED: %s\n' "$*" >&2; exit 1; }
# with_heartbeat WHAT CMD...: runs CMD (in the foreground: Ctrl-C reaches it) and returns its
# status; meanwhile (pip -q says nothing for a minute) a line every 15 s says it is still WHAT.
with_heartbeat() {
  local what=$1 status beat; shift
  ( t=0; while sleep 15; do t=$((t + 15)); step "still $what ($t s)"; done ) &
  beat=$!
  trap 'kill "$beat" 2>/dev/null' EXIT
  "$@"; status=$?
  kill "$beat" 2>/dev/null; wait "$beat" 2>/dev/null
  trap - EXIT
  return "$status"
}

if ! command -v "$python" >/dev/null 2>&1; then
  fail "authio needs Python 3.11 or newer, and '$python' is not installed.
  On Debian or Ubuntu, as root (or with sudo):  apt-get install python3 python3-venv python3-dev
  With another Python 3.11 or newer:            make PYTHON=/path/to/python3 ..."
fi
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null ||
  fail "authio needs Python 3.11 or newer; '$python' is $("$python" --version 2>&1).
  Install a newer one, then:  make PYTHON=/path/to/python3.11 ..."

if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
  packages=(python3-venv python3-dev)
  if ! command -v apt-get >/dev/null 2>&1; then
    fail "'$python' cannot create virtual environments (no venv or ensurepip module): install them for it"
  fi
  if [ "$(id -u)" -ne 0 ]; then
    fail "'$python' cannot create virtual environments; install the Debian packages, then run make again:
  sudo apt-get install --no-install-recommends ${packages[*]}"
  fi
  step "installing the Debian packages ${packages[*]} (apt-get, without recommended packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || fail "apt-get update (see apt's messages above)"
  apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=600 "${packages[@]}" ||
    fail "apt-get install ${packages[*]} (see apt's messages above)"
  "$python" -c 'import ensurepip, venv' 2>/dev/null ||
    fail "installed ${packages[*]}, yet '$python' still cannot create virtual environments
  (is it Debian's python3? Another Python needs its own pythonX.Y-venv package)"
fi

step "creating the virtual environment $venv ($("$python" --version 2>&1))"
"$python" -m venv "$venv" || fail "creating the virtual environment $venv (see the messages above)"

# A floor rather than a bare --upgrade: pip answers 0 to "--upgrade pip" when the index does not
# answer, so a failed upgrade would pass unnoticed. With a floor above what Debian's venv brings
# (23.0), an unreachable index is an error; a venv that already has it needs no index.
step "upgrading pip in $venv"
"$venv/bin/python" -m pip install -q --upgrade 'pip>=25' ||
  fail "upgrading pip in $venv to 25 or newer: is the package index reachable? (pip's messages above;
  PIP_INDEX_URL sets a mirror)"

step "installing authio, its Python client (clients/python) and their development dependencies into $venv (versions from constraints.txt; a minute or two the first time)"
began=$SECONDS
with_heartbeat "installing into $venv" "$venv/bin/python" -m pip install -q -c constraints.txt -e '.[dev]' -e './clients/python[starlette,aiohttp]' ||
  fail "installing authio into $venv (see pip's messages above)"
step "installed into $venv in $((SECONDS - began)) s"

touch "$venv/.installed" || fail "writing $venv/.installed"
step "$venv is ready"
