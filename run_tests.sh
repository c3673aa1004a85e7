#!/usr/bin/env bash
# The test command (README): set up the pinned virtual environment and its Jupyter kernel,
# install headless Chromium for the audit-record browser test, then run pytest.
# Extra arguments go to pytest, e.g. ./run_tests.sh -k threshold
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$root/scripts/bootstrap.sh"
"$root/scripts/install_chromium.sh"
cd "$root"
exec "$root/.venv/bin/python" -m pytest "$@"
