"""Regenerate every notebook's ``parameters`` cell from the profile schema.

    .venv/bin/python scripts/sync_parameters.py          # rewrite the cells that differ
    .venv/bin/python scripts/sync_parameters.py --check  # exit 1 if any cell differs

Run it after adding or changing a key in ``endoexplain_core/config.py`` or configs/smoke.yaml.
"""

import argparse
import sys

from endoexplain_core.pipeline import orchestrator, parameters


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="report differences, change nothing")
    args = parser.parse_args()
    stale = []
    for notebook in orchestrator.discover_stages():
        expected = parameters.render_parameters_cell(notebook.stem)
        current = "".join(parameters.parameters_cell(notebook)["source"])
        if current != expected:
            stale.append(notebook.name)
            if not args.check:
                parameters.sync_notebook(notebook)
    verb = "differ" if args.check else "rewritten"
    print(f"{len(stale)} parameters cell(s) {verb}: {', '.join(stale) or '-'}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
