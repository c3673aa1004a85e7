"""Screenshots of a run's record as a reader first sees it, taken in headless Chromium.

    .venv/bin/python -m tests.screenshots runs/default OUT_DIR

writes ``record_first_screen.png`` (the record's ``index.html`` at 1300 x 1100), ``cases_grid.png``
(the case browser with the "high score, every CAM misses" filter on) and ``cases_one_case.png``
(the first case of that filter opened), and ``figure_<name>.png`` for every figure of the record,
each shown as the browser shows the PNG file. Used for the notes of a release; the functions are
exercised by ``tests/test_record.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.browser import run_in_page

OPEN_FIRST_CASE = "document.querySelector('#cases tbody tr').click(); document.getElementById('detail').hidden"
HIGH_SCORE_ALL_MISS = ("document.getElementById('f-all-miss').click(); "
                       "document.getElementById('count').textContent")


def record_screenshots(run_dir: str | Path, out_dir: str | Path) -> dict[str, Path]:
    """Take the record's and the case browser's screenshots (see the module docstring); return
    name -> PNG path. The case browser's shots are skipped when the run has no browser; the
    browser falls back to all cases when the filter leaves none. ``FileNotFoundError`` when
    ``run_dir`` has no ``index.html``: Chromium would show, and this would save, its error page."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if not (run_dir / "index.html").is_file():
        raise FileNotFoundError(f"{run_dir} is not a run folder: it has no index.html "
                                "(give runs/<profile> of a finished run)")
    out_dir.mkdir(parents=True, exist_ok=True)
    shots = {"record_first_screen": out_dir / "record_first_screen.png"}
    run_in_page(run_dir / "index.html", [], screenshots={-1: shots["record_first_screen"]}, wait_seconds=0.0)
    browser = run_dir / "cases" / "index.html"
    if browser.is_file():
        shots["cases_grid"] = out_dir / "cases_grid.png"
        shots["cases_one_case"] = out_dir / "cases_one_case.png"
        count = run_in_page(browser, [HIGH_SCORE_ALL_MISS], wait_seconds=0.2)[0]
        filters = [HIGH_SCORE_ALL_MISS] if not count.startswith("0 of") else ["''"]
        run_in_page(browser, [*filters, OPEN_FIRST_CASE], wait_seconds=0.3,
                    screenshots={0: shots["cases_grid"], 1: shots["cases_one_case"]})
    return shots


def check_figures_folder(figures_dir: Path) -> None:
    """``FileNotFoundError`` unless ``figures_dir`` is a folder holding figure PNGs."""
    if not figures_dir.is_dir() or not any(figures_dir.glob("figure*.png")):
        raise FileNotFoundError(f"{figures_dir} is not a figures folder: it holds no figure*.png "
                                "(give figures/<profile> of a finished run)")


def figure_screenshots(figures_dir: str | Path, out_dir: str | Path) -> dict[str, Path]:
    """Each figure PNG of ``figures_dir`` as the browser shows it (scaled to a 1300 px window).
    ``FileNotFoundError`` when ``figures_dir`` is not a folder holding figure PNGs."""
    figures_dir, out_dir = Path(figures_dir), Path(out_dir)
    check_figures_folder(figures_dir)
    shots = {}
    for png in sorted(figures_dir.glob("figure*.png")):
        shots[png.stem] = out_dir / f"figure_{png.stem}.png"
        run_in_page(png, [], screenshots={-1: shots[png.stem]}, wait_seconds=0.0)
    return shots


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: python -m tests.screenshots RUN_DIR OUT_DIR [FIGURES_DIR]", file=sys.stderr)
        return 2
    run_dir, out_dir = Path(argv[0]), Path(argv[1])
    try:   # every folder is checked before the first screenshot: exit 2 and one line
        if out_dir.exists() and not out_dir.is_dir():
            raise NotADirectoryError(f"OUT_DIR {out_dir} is a file, not a folder")
        if len(argv) == 3:
            check_figures_folder(Path(argv[2]))
        shots = record_screenshots(run_dir, out_dir)
    except (FileNotFoundError, NotADirectoryError) as error:
        print(f"screenshots: {error}", file=sys.stderr)
        return 2
    if len(argv) == 3:
        shots |= figure_screenshots(argv[2], out_dir)
    for name, path in shots.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
