#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment from the pins, install the core in
# editable mode and register its Jupyter kernel ("endoexplain"). Idempotent: a digest of the
# pin files is stamped into the venv, and nothing is reinstalled while it matches.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${ENDOEXPLAIN_VENV:-$root/.venv}"
python="${PYTHON:-python3}"

if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
  echo "bootstrap: need Python 3.11 (the torch 2.14.1 wheels are for 3.11); set PYTHON=..." >&2
  exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "bootstrap: creating virtual environment $venv"
  "$python" -m venv "$venv"
fi
stamp="$venv/.endoexplain-pins.sha256"
want="$(cat "$root/requirements.txt" "$root/constraints.txt" "$root/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "bootstrap: installing pinned requirements into $venv (first time: several minutes)"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -r "$root/requirements.txt" -c "$root/constraints.txt"
  # The distribution was named endoexplain-core before 1.0: drop that one's editable install.
  "$venv/bin/python" -m pip uninstall --quiet --yes endoexplain-core >/dev/null 2>&1 || true
  # The editable build is chatty (setuptools warnings); keep its log and show it on failure.
  if ! "$venv/bin/python" -m pip install --quiet --no-deps -e "$root" >"$venv/editable-install.log" 2>&1; then
    cat "$venv/editable-install.log" >&2
    exit 1
  fi
  "$venv/bin/python" -m ipykernel install --sys-prefix --name endoexplain \
      --display-name "endoExplain (.venv)" >/dev/null
  echo "$want" > "$stamp"
fi
