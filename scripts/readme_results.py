"""Paste the default run's summary into the README's results block (between the markers).

    .venv/bin/python scripts/readme_results.py            # README block <- the committed reference
    .venv/bin/python scripts/readme_results.py --check    # exit 1 if the README block differs
    .venv/bin/python scripts/readme_results.py --from figures/default/summary.md
                                                          # adopt a new default run's summary as the
                                                          # reference, then rewrite the README block

The reference is ``tests/expected/default/summary.md``; ``tests/test_summary.py`` checks that
the README block equals it, so a number in the README cannot drift from the run that made it.
"""

import argparse
import shutil
import sys
from pathlib import Path

from endoexplain_core.pipeline import summary

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "tests" / "expected" / "default" / "summary.md"
README = ROOT / "README.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="report a difference, change nothing")
    parser.add_argument("--from", dest="source", type=Path, default=None,
                        help="a run's summary.md to adopt as the reference first")
    args = parser.parse_args()
    if args.source is not None:
        if not args.source.is_file():
            print(f"readme_results: {args.source} does not exist", file=sys.stderr)
            return 2
        shutil.copyfile(args.source, REFERENCE)
    readme = README.read_text()
    updated = summary.replace_readme_block(readme, REFERENCE.read_text())
    if args.check:
        if updated != readme:
            print("readme_results: the README's results block differs from "
                  f"{REFERENCE.relative_to(ROOT)}; run scripts/readme_results.py", file=sys.stderr)
            return 1
        print("readme_results: README results block matches the reference")
        return 0
    README.write_text(updated)
    print(f"readme_results: README results block {'unchanged' if updated == readme else 'rewritten'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
