"""Do two runs of one profile reach the same verdicts?

``compare_runs(figures_dir, reference_dir)``: one row (check, ok, skipped, detail) per check of
the ``HEADLINE_TABLES`` (and, where written, the ``OVER_SEEDS_TABLES``) against a reference
(default ``tests/expected/default/``, the tables of a default run): compatible gate verdicts
per CAM (never "passes" in one run and "fails" in the other), the same learned checkpoints, the
same primary (after a reseed, ``reseeded``: as many learned per architecture and the primary's
architecture), panel A's size within ``PANEL_A_TOLERANCE``, and per CAM the two runs' means over
seeds (``table4_over_seeds``) closer than a Welch bound Bonferroni-corrected over the CAMs
(``SEED_MEANS_ALPHA``). One checkpoint's Table 4 rates are not compared: they are one draw of
a training run each, and an image-level interval says nothing about another draw.
``python -m endoexplain_core.pipeline.verdicts FIGURES_DIR [REFERENCE_DIR]`` prints them;
exit 1 when a check fails; exit 2, one line, when the comparison cannot be made: a table
missing, or breaking its own invariants (``TABLE_COLUMNS``, unique ``TABLE_KEYS``, rows, one
primary checkpoint, a per-seed table that disagrees with its over-seeds table:
``TableInvalid``), or a folder compared with itself. A reference without
``table4_over_seeds`` skips that check and says so.

Design: docs/data_models_runs.md, "Run summary and verdicts"; the bounds:
docs/statistics_and_gate.md, "Table 4 over seeds".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from endoexplain_core.artefacts import bool_column
from endoexplain_core.config import REPO_ROOT
from endoexplain_core.methods import CAM_METHODS
from endoexplain_core.run_layout import RunLayout

HEADLINE_TABLES = ("table_validity_gate", "table4_spatial_audit", "table_checkpoint_learning")
# Written by 05_robustness; a reference without them (an older default run) skips their check.
OVER_SEEDS_TABLES = ("table4_over_seeds", "table4_per_seed")
DEFAULT_REFERENCE = REPO_ROOT / "tests" / "expected" / "default"
PANEL_A_TOLERANCE = 0.10
# Two exchangeable runs' seed means differ by more than the Welch bound with probability
# alpha per CAM; Bonferroni over the five CAMs keeps a false "different" under 5% per run.
SEED_MEANS_ALPHA = 0.05 / len(CAM_METHODS)
# What the checks read from each table; the key columns name one row each.
TABLE_COLUMNS = {"table_validity_gate": ("method", "verdict"),
                 "table4_spatial_audit": ("panel", "method", "n"),
                 "table_checkpoint_learning": ("checkpoint_id", "arch", "seed", "control", "learned",
                                               "is_primary"),
                 "table4_over_seeds": ("method", "n_seeds", "n_images", "peak_failure", "seed_sd"),
                 "table4_per_seed": ("checkpoint_id", "method", "n", "peak_failure")}
TABLE_KEYS = {"table_validity_gate": ("method",), "table4_spatial_audit": ("panel", "method"),
              "table_checkpoint_learning": ("checkpoint_id",), "table4_over_seeds": ("method",),
              "table4_per_seed": ("checkpoint_id", "method")}
NUMERIC_COLUMNS = ("n", "peak_failure", "peak_failure_ci_low", "peak_failure_ci_high", "n_seeds",
                   "n_images", "seed_sd")
BOOLEAN_COLUMNS = ("learned", "is_primary")


class TableInvalid(ValueError):
    """The comparison cannot be made: a headline table that is not a readable CSV, has no
    rows, lacks a column the checks read, repeats a key, has non-numbers where numbers belong,
    not exactly one primary checkpoint or no panel A; or a folder compared with itself."""


def _read_optional(folder: Path, name: str) -> pd.DataFrame | None:
    """``_read`` of a table a folder may lack (``OVER_SEEDS_TABLES``): None when absent."""
    return _read(folder, name) if (Path(folder) / f"{name}.csv").is_file() else None


def _read(folder: Path, name: str) -> pd.DataFrame:
    """The table ``name`` of ``folder``, checked (``check_table``); ``FileNotFoundError`` when
    it is missing, ``TableInvalid`` (one line) when it breaks an invariant."""
    path = Path(folder) / f"{name}.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the run did not write its {name} table")
    try:
        table = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError, OSError) as error:
        # ValueError covers UnicodeDecodeError (random bytes)
        detail = " ".join(str(error).split())[:160]
        raise TableInvalid(f"{path} is not a readable CSV table ({type(error).__name__}: {detail})") from None
    problem = check_table(name, table)
    if problem:
        raise TableInvalid(f"{path}: {problem}")
    return table


def _is_boolean(value) -> bool:
    return str(value).strip().lower() in ("true", "false")


def check_table(name: str, table: pd.DataFrame) -> str:
    """What makes ``table`` (headline table ``name``) unfit to compare, in a few words, or ""."""
    missing = [c for c in TABLE_COLUMNS[name] if c not in table.columns]
    if missing:
        return f"no column {', '.join(missing)} (the checks read {', '.join(TABLE_COLUMNS[name])})"
    if table.empty:
        return "no rows"
    keys = list(TABLE_KEYS[name])
    if table[keys].isna().any().any():
        return f"a row without its {'/'.join(keys)}"
    repeated = table[table.duplicated(keys, keep=False)][keys].drop_duplicates()
    if len(repeated):
        first = "/".join(str(v) for v in repeated.iloc[0])
        return f"{len(repeated)} {'/'.join(keys)} repeated (first: {first[:80]})"
    for column in (c for c in NUMERIC_COLUMNS if c in TABLE_COLUMNS[name]):
        present = table[column].dropna()
        if pd.to_numeric(present, errors="coerce").isna().any():
            return f"column {column} holds values that are not numbers"
    for column in (c for c in BOOLEAN_COLUMNS if c in TABLE_COLUMNS[name]):
        if not table[column].map(_is_boolean).all():
            return f"column {column} holds values other than True and False"
    if name == "table_checkpoint_learning":
        primaries = int(bool_column(table, "is_primary").sum())
        if primaries != 1:
            return f"{primaries} primary checkpoints (is_primary), not exactly one"
    if name == "table4_spatial_audit" and not table.loc[table["panel"] == "A", "n"].notna().any():
        return "no panel A row with its image count n"
    return ""


def per_seed_problem(over_seeds: pd.DataFrame, per_seed: pd.DataFrame) -> str:
    """What makes a folder's ``table4_per_seed`` disagree with its ``table4_over_seeds`` (per
    method: the seeds with a panel A and proper maps, their images and the mean of their
    rates), or ""."""
    used = per_seed[pd.to_numeric(per_seed["n"], errors="coerce") > 0]
    used = used[~bool_column(used, "degenerate")]  # left out of the means
    for row in over_seeds.itertuples():
        rates = pd.to_numeric(used.loc[used["method"] == row.method, "peak_failure"], errors="coerce")
        images = pd.to_numeric(used.loc[used["method"] == row.method, "n"], errors="coerce").sum()
        mean = float(rates.mean()) if len(rates) else np.nan
        if (len(rates) != int(row.n_seeds) or int(images) != int(row.n_images)
                or not (np.isclose(mean, float(row.peak_failure), atol=1e-9)
                        or (np.isnan(mean) and pd.isna(row.peak_failure)))):
            return (f"table4_per_seed does not add up to table4_over_seeds for {row.method} "
                    f"({len(rates)} seeds, {int(images)} images, mean {mean:.4f} against "
                    f"{int(row.n_seeds)}, {int(row.n_images)}, {float(row.peak_failure):.4f})")
    return ""


def gate_check(gate: pd.DataFrame, reference: pd.DataFrame) -> dict:
    """Compatible verdicts for every CAM method: never "passes" in one run and "fails" in the
    other (a method that lies a little above its bar passes in some runs and is inconclusive in
    others: compatible, named in the detail); a method judged in one run only differs."""
    ours = gate.set_index("method")["verdict"]
    theirs = reference.set_index("method")["verdict"]
    clash, notes = [], []
    for method in CAM_METHODS:
        pair = (ours.get(method), theirs.get(method))
        if (pair[0] is None) != (pair[1] is None) or {"passes", "fails"} <= set(pair):
            clash.append(f"{method}: {pair[0]} vs {pair[1]}")
        elif pair[0] != pair[1]:
            notes.append(f"{method}: {pair[0]} vs {pair[1]} (compatible: one run decided, the other did not)")
    detail = "; ".join(clash or notes) or ", ".join(f"{m} {ours.get(m)}" for m in CAM_METHODS)
    if not clash and notes:
        detail = "compatible; " + detail
    return {"check": "gate verdicts", "ok": not clash, "detail": detail}


def reseeded(learning: pd.DataFrame, reference: pd.DataFrame) -> bool:
    """Were the two runs trained on different seeds (``shared.training_seeds`` changed)? Then
    their checkpoints differ by name, and only what the recipe promises is compared: how many
    checkpoints of each architecture learned and the primary's architecture."""
    return set(learning["seed"].astype(str)) != set(reference["seed"].astype(str))


def _learned_per_architecture(learning: pd.DataFrame) -> str:
    """"efficientnet_b0 3, mobilenet_v3_large 2": the learned checkpoints counted by architecture
    (a control named beside its architecture)."""
    learned = learning[bool_column(learning, "learned")]
    control = learned["control"].fillna("none").astype(str)
    name = learned["arch"].astype(str).where(control == "none", learned["arch"].astype(str) + " (" + control + ")")
    return ", ".join(f"{arch} {count}" for arch, count in sorted(name.value_counts().items())) or "none"


def learned_check(learning: pd.DataFrame, reference: pd.DataFrame) -> dict:
    """The same checkpoints learned; after a reseed (``reseeded``), as many of each
    architecture."""
    if reseeded(learning, reference):
        ours, theirs = _learned_per_architecture(learning), _learned_per_architecture(reference)
        detail = f"{ours} in both" if ours == theirs else f"{ours} vs {theirs}"
        return {"check": "learned checkpoints", "ok": ours == theirs,
                "detail": f"reseeded, learned per architecture: {detail}"}
    ours = set(learning.loc[bool_column(learning, "learned"), "checkpoint_id"])
    theirs = set(reference.loc[bool_column(reference, "learned"), "checkpoint_id"])
    differ = sorted(ours ^ theirs)
    return {"check": "learned checkpoints", "ok": not differ,
            "detail": (f"differ: {', '.join(differ)}" if differ else f"{len(ours)} learned in both")}


def primary_check(learning: pd.DataFrame, reference: pd.DataFrame) -> dict:
    """The same primary checkpoint (``is_primary`` of the learning table); after a reseed
    (``reseeded``) its architecture: which seed wins is itself a draw."""
    def primary(table: pd.DataFrame) -> pd.Series:
        return table.loc[bool_column(table, "is_primary")].iloc[0]
    ours, theirs = primary(learning), primary(reference)
    if reseeded(learning, reference):
        return {"check": "primary", "ok": ours["arch"] == theirs["arch"],
                "detail": f"reseeded, architecture {ours['arch']} vs {theirs['arch']} "
                          f"({ours['checkpoint_id']} vs {theirs['checkpoint_id']})"}
    return {"check": "primary", "ok": ours["checkpoint_id"] == theirs["checkpoint_id"],
            "detail": f"{ours['checkpoint_id']} vs {theirs['checkpoint_id']}"}


def panel_a_check(table4: pd.DataFrame, reference: pd.DataFrame,
                  tolerance: float = PANEL_A_TOLERANCE) -> dict:
    """Panel A's image count within ``tolerance`` (relative to the reference)."""
    ours = int(table4.loc[table4["panel"] == "A", "n"].max())
    theirs = int(reference.loc[reference["panel"] == "A", "n"].max())
    ok = abs(ours - theirs) <= tolerance * theirs
    return {"check": "panel A size", "ok": bool(ok),
            "detail": f"{ours} vs {theirs} images (tolerance {tolerance:.0%})"}


def _effective_sd(row) -> float:
    """The seeds' SD, floored as ``stats.draw_mean_interval`` floors the standard error of their
    mean: sqrt(max(s^2, k p (1 - p) / N)) for k seeds, mean rate p and N images in all, so that
    seeds that happen to agree claim no more precision than their maps hold."""
    k, p, images = float(row["n_seeds"]), float(row["peak_failure"]), float(row["n_images"])
    sd = float(row["seed_sd"]) if pd.notna(row["seed_sd"]) else 0.0
    binomial = k * p * (1 - p) / images if images > 0 else 0.0
    return float(np.sqrt(max(sd * sd, binomial)))


def welch_bound(ours, theirs, alpha: float = SEED_MEANS_ALPHA) -> dict:
    """Welch's test of two runs' means over seeds (rows with peak_failure, seed_sd, n_seeds,
    n_images; SDs floored by ``_effective_sd``): {"difference", "bound" (the largest difference
    Welch's two-sided test at ``alpha`` accepts), "p" (``scipy.stats.ttest_ind_from_stats``,
    equal_var=False), "within" (p >= alpha)}."""
    sd1, sd2 = _effective_sd(ours), _effective_sd(theirs)
    k1, k2 = int(ours["n_seeds"]), int(theirs["n_seeds"])
    difference = float(ours["peak_failure"]) - float(theirs["peak_failure"])
    v1, v2 = sd1 * sd1 / k1, sd2 * sd2 / k2
    if v1 + v2 == 0:   # every seed of both runs at 0 or at 1: nothing to scatter
        return {"difference": difference, "bound": 0.0, "p": float(difference == 0), "within": difference == 0}
    df = (v1 + v2) ** 2 / (v1 * v1 / (k1 - 1) + v2 * v2 / (k2 - 1))
    bound = float(scipy_stats.t.ppf(1 - alpha / 2, df)) * float(np.sqrt(v1 + v2))
    test = scipy_stats.ttest_ind_from_stats(float(ours["peak_failure"]), sd1, k1,
                                            float(theirs["peak_failure"]), sd2, k2, equal_var=False)
    return {"difference": difference, "bound": bound, "p": float(test.pvalue),
            "within": bool(test.pvalue >= alpha)}


def seed_means_check(over: pd.DataFrame | None, reference: pd.DataFrame | None,
                     alpha: float = SEED_MEANS_ALPHA) -> dict:
    """Per CAM, the two runs' mean peak failure over seeds (``table4_over_seeds``) differ by
    less than the Welch bound at ``alpha`` (Bonferroni over the CAMs). A CAM with fewer than two
    seeds in either run is named, not compared; a reference without the table skips the check
    (``skipped``), saying so."""
    name = "Table 4 means over seeds within the Welch bound"
    if reference is None:
        return {"check": name, "ok": True, "skipped": True,
                "detail": "skipped: the reference has no table4_over_seeds.csv (written by a default run's "
                          "05_robustness), so the means over seeds were not compared"}
    if over is None:
        return {"check": name, "ok": False, "detail": "this run has no table4_over_seeds.csv"}
    ours, theirs = over.set_index("method"), reference.set_index("method")
    outside, inside, uncompared = [], [], []
    for method in CAM_METHODS:
        if method not in ours.index or method not in theirs.index:
            uncompared.append(f"{method} (not in both tables)")
            continue
        a, b = ours.loc[method], theirs.loc[method]
        if int(a["n_seeds"]) < 2 or int(b["n_seeds"]) < 2:
            uncompared.append(f"{method} ({int(a['n_seeds'])} vs {int(b['n_seeds'])} seeds)")
            continue
        bound = welch_bound(a, b, alpha)
        text = (f"{method}: {float(a['peak_failure']):.3f} vs {float(b['peak_failure']):.3f}, "
                f"|difference| {abs(bound['difference']):.3f} against bound {bound['bound']:.3f}")
        (inside if bound["within"] else outside).append(text)
    if not inside and not outside:
        return {"check": name, "ok": True, "skipped": True,
                "detail": "skipped: no CAM has two or more seeds with a panel A in both runs ("
                          + ", ".join(uncompared) + ")"}
    detail = "; ".join(outside) if outside else (f"{len(inside)} CAMs within the bound (alpha "
                                                 f"{alpha:.3g} each): " + "; ".join(inside))
    if uncompared:
        detail += "; not compared: " + ", ".join(uncompared)
    return {"check": name, "ok": not outside, "detail": detail}


def _over_seeds_tables(folder: Path) -> pd.DataFrame | None:
    """A folder's ``table4_over_seeds`` (None when absent), checked against its
    ``table4_per_seed`` when that is there too (``per_seed_problem``: ``TableInvalid``)."""
    over = _read_optional(folder, "table4_over_seeds")
    per_seed = _read_optional(folder, "table4_per_seed")
    if over is not None and per_seed is not None:
        problem = per_seed_problem(over, per_seed)
        if problem:
            raise TableInvalid(f"{Path(folder) / 'table4_per_seed.csv'}: {problem}")
    return over


def _check_folder(folder: Path) -> None:
    """``FileNotFoundError`` for a folder that is not there, and for a run folder
    (``runs/<profile>``) given where its figures folder (``figures/<profile>``) belongs."""
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder: give a run's figures folder, e.g. figures/default")
    if RunLayout(folder).provenance.is_file() and not (folder / f"{HEADLINE_TABLES[0]}.csv").is_file():
        raise FileNotFoundError(f"{folder} is a run folder (runs/<profile>); the tables are in its "
                                "figures folder, figures/<profile>")


def compare_runs(figures_dir: str | Path, reference_dir: str | Path = DEFAULT_REFERENCE) -> pd.DataFrame:
    """One row per check (check, ok, skipped, detail) of a run's figures folder against a
    reference folder holding the ``HEADLINE_TABLES`` as CSV, and the ``OVER_SEEDS_TABLES``
    where a run wrote them. ``FileNotFoundError`` for a missing headline table, and for a run
    without ``table4_over_seeds`` compared with a reference that has it; ``TableInvalid`` for a
    table that breaks its invariants (``check_table``, ``per_seed_problem``) and for a folder
    compared with itself (every check would pass whatever it holds)."""
    figures_dir, reference_dir = Path(figures_dir), Path(reference_dir)
    for folder in (figures_dir, reference_dir):
        _check_folder(folder)
    if figures_dir.resolve() == reference_dir.resolve():
        raise TableInvalid(f"{figures_dir} is compared with itself ({reference_dir}): give the "
                           "reference run's folder")
    ours = {name: _read(figures_dir, name) for name in HEADLINE_TABLES}
    theirs = {name: _read(reference_dir, name) for name in HEADLINE_TABLES}
    their_over_seeds = _over_seeds_tables(reference_dir)
    our_over_seeds = _over_seeds_tables(figures_dir)
    if their_over_seeds is not None and our_over_seeds is None:
        raise FileNotFoundError(f"{figures_dir / 'table4_over_seeds.csv'} is missing: the run did not "
                                "write its table4_over_seeds table")
    rows = [gate_check(ours["table_validity_gate"], theirs["table_validity_gate"]),
            learned_check(ours["table_checkpoint_learning"], theirs["table_checkpoint_learning"]),
            primary_check(ours["table_checkpoint_learning"], theirs["table_checkpoint_learning"]),
            panel_a_check(ours["table4_spatial_audit"], theirs["table4_spatial_audit"]),
            seed_means_check(our_over_seeds, their_over_seeds)]
    return pd.DataFrame([{"skipped": False, **row} for row in rows],
                        columns=["check", "ok", "skipped", "detail"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m endoexplain_core.pipeline.verdicts",
        description="Compare a run's headline verdicts with a reference run's tables.")
    parser.add_argument("figures_dir", help="the run's figures folder, e.g. figures/default")
    parser.add_argument("reference_dir", nargs="?", default=str(DEFAULT_REFERENCE),
                        help="folder with the reference tables (default tests/expected/default)")
    args = parser.parse_args(argv)
    try:
        result = compare_runs(args.figures_dir, args.reference_dir)
    except (FileNotFoundError, TableInvalid) as error:   # 2: not compared; 1 means "differ"
        print(f"verdicts: {error}", file=sys.stderr)
        return 2
    for row in result.itertuples():
        status = "SKIPPED" if row.skipped else "same" if row.ok else "DIFFERENT"
        print(f"{status:9} {row.check}: {row.detail}")
    return 0 if bool(np.all(result["ok"])) else 1


if __name__ == "__main__":
    raise SystemExit(main())
