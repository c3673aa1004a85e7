#!/usr/bin/env bash
# Open JupyterLab on the project with the "endoexplain" kernel, to read and rerun the notebooks
# by hand (README: "Rerun a notebook yourself"). Sets up the pinned environment first, like
# run_all.sh. Extra arguments go to `jupyter lab`, e.g. scripts/lab.sh --no-browser --port 8899
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
exec "$root/.venv/bin/jupyter" lab --notebook-dir="$root" \
     --MappingKernelManager.default_kernel_name=endoexplain "$@"
