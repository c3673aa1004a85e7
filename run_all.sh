#!/usr/bin/env bash
# Regenerate every table and figure of the endoExplain audit (README: "Run everything").
#
#   ./run_all.sh [--profile smoke|default|paper] [--data-root DIR] [--force] [--only STAGE...]
#                [--adopt-manifest] [--output-root DIR] [--scheduler sequential|local:N|tls://HOST:PORT]
#                [--allow-insecure-scheduler]   (needed for a plain tcp://HOST:PORT scheduler)
#                [--set SECTION.KEY=VALUE ...]  (one profile setting for this run, e.g. --set shared.image_size=128)
#                [--set-file FILE]  (--set lines from a file, e.g. configs/paper_rehearsal.sets)
#                [--manifest-reference DIR]  (reference manifest folder; default data_manifest/<profile>)
#                [--check]   (preflight: data, weights, device, disk; exit 0 ready / 2 not ready; trains nothing)
#
# Sets up (or reuses) the pinned virtual environment and its Jupyter kernel, then executes the
# numbered notebooks with Papermill into runs/<profile>/notebooks/ (executed .ipynb + HTML),
# skipping stages whose inputs, parameters and code are unchanged. Figures and tables go to
# figures/<profile>/; the run record is runs/<profile>/index.html.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$root/scripts/bootstrap.sh"
exec "$root/.venv/bin/python" -m endoexplain_core.pipeline "$@"
