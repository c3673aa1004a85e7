"""The paper's reported values beside this run's (``table_paper_comparison``).

The paper's numbers are data (``data_manifest/paper/paper_reported_values.csv``), never code;
``run_values`` reads the same quantities from this run's artefacts (blank where the run has
none). Method: docs/statistics_and_gate.md, "Comparison with the paper's reported values".
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from endoexplain_core.run_layout import RunLayout
from endoexplain_core.artefacts import read_table
from endoexplain_core.data.cohorts import DATASET_LABELS
from endoexplain_core.methods import CAM_METHODS
from endoexplain_core import artefacts

PAPER_VALUES_FILE = "paper_reported_values.csv"
PAPER_COLUMNS = ("key", "quantity", "paper_value", "source_section")
MANIFEST_KEYS = ("manifest_rows", "manifest_digest_prefix", "role_train", "role_val", "role_test",
                 "role_spatial_audit")
TABLE5_KEYS = {"or_gradcampp": "Grad-CAM++ versus Grad-CAM", "or_xgradcam": "XGrad-CAM versus Grad-CAM",
               "or_hirescam": "HiResCAM versus Grad-CAM", "or_eigencam": "Eigen-CAM* versus Grad-CAM",
               "or_lesion_area": "Lesion area per 0.10 frame fraction",
               "or_centre_distance": "Lesion-centre distance per 0.10",
               "or_score": "Scaled score per 0.10"}


PAPER_VALUES_DIR = Path(__file__).resolve().parents[2] / "data_manifest" / "paper"


def read_paper_values(paper_dir: str | Path = PAPER_VALUES_DIR) -> pd.DataFrame:
    """The shipped paper values; raises naming the file when it is missing or malformed."""
    path = Path(paper_dir) / PAPER_VALUES_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: the paper's reported values ship with the "
                                "package under data_manifest/paper/")
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = [c for c in PAPER_COLUMNS if c not in table.columns]
    if missing or table["key"].duplicated().any():
        raise ValueError(f"{path}: needs columns {list(PAPER_COLUMNS)} and unique keys "
                         f"(missing {missing})")
    return table


def run_values(run_dir: str | Path, figures_dir: str | Path) -> dict[str, object]:
    """This run's value of every paper quantity it produces (keys of the paper CSV); a
    quantity whose table is missing, or whose value is NaN, is left out."""
    layout, figures_dir = RunLayout(Path(run_dir)), Path(figures_dir)
    values = {**_role_values(layout), **_model_values(layout, figures_dir),
              **_calibration_values(figures_dir), **_audit_values(figures_dir),
              **_transfer_values(figures_dir)}
    return {k: v for k, v in values.items() if not (isinstance(v, float) and np.isnan(v))}


def _role_values(layout: RunLayout) -> dict[str, object]:
    """Manifest rows per role and the manifest digest's prefix."""
    values: dict[str, object] = {}
    manifest_path = layout.manifest
    if manifest_path.is_file():
        manifest = pd.read_csv(manifest_path, dtype={"mask_path": str}, keep_default_na=False)
        values["manifest_rows"] = len(manifest)
        for role in ("train", "val", "test", "spatial_audit"):
            values[f"role_{role}"] = int((manifest["role"] == role).sum())
        for role in ("train", "val", "test"):
            values[f"standard_polyps_{role}"] = int(((manifest["role"] == role)
                                                     & (manifest["source"] == "polyps")).sum())
    digest_path = layout.manifest_digest_file
    if digest_path.is_file():
        values["manifest_digest_prefix"] = digest_path.read_text().strip()[:12]
    return values


def _model_values(layout: RunLayout, figures_dir: Path) -> dict[str, object]:
    """The primary checkpoint, its validation and test scores, and the source categories."""
    values: dict[str, object] = {}
    registry = pd.read_csv(layout.registry) if layout.registry.is_file() else None
    primary_id = None
    if registry is not None and registry["is_primary"].any():
        primary = registry.loc[registry["is_primary"].astype(bool)].iloc[0]
        primary_id = primary["checkpoint_id"]
        values["primary_checkpoint"] = primary_id
        values["primary_val_auprc"] = float(primary["val_auprc"])
    training = read_table(figures_dir, "table_s1_training")
    if training is not None and primary_id is not None:
        row = training.set_index("checkpoint_id").loc[primary_id]
        values["primary_test_auprc"] = row.get("test_auprc", np.nan)
        values["primary_test_accuracy"] = row.get("test_accuracy_at_0.5", np.nan)
    sources = read_table(figures_dir, "table_source_category")
    if sources is not None:
        by_source = sources.set_index("source")
        for source, key in (("dyed-lifted-polyps", "sensitivity_dyed_lifted"), ("polyps", "sensitivity_standard")):
            if source in by_source.index:
                values[key] = by_source.loc[source, "sensitivity"]
        if "dyed-resection-margins" in by_source.index:
            values["false_positives_dyed_resection_margins"] = int(by_source.loc["dyed-resection-margins", "false_positives"])
            values["fpr_dyed_resection_margins"] = by_source.loc["dyed-resection-margins", "false_positive_rate"]
    return values


def _calibration_values(figures_dir: Path) -> dict[str, object]:
    """Table 3's raw and scaled NLL, Brier and ECE, and the primary's temperature."""
    values: dict[str, object] = {}
    table3 = read_table(figures_dir, "table3_calibration")
    if table3 is not None:
        for split, prefix in (("Validation", "val"), ("Test", "test")):
            for score, kind in (("Raw", "raw"), ("Temperature-scaled", "scaled")):
                part = table3[(table3["split"] == split) & (table3["score"] == score)]
                for metric in ("nll", "brier", "ece"):
                    if len(part):
                        values[f"{prefix}_{kind}_{metric}"] = float(part[metric].iloc[0])
        scaled = table3[table3["score"] == "Temperature-scaled"]
        if len(scaled):
            values["primary_temperature"] = float(scaled["temperature"].iloc[0])
    return values


def _audit_values(figures_dir: Path) -> dict[str, object]:
    """Table 4's failure rates, the threshold and lesion-size tables, and Table 5's odds ratios."""
    values: dict[str, object] = {}
    table4 = read_table(figures_dir, "table4_spatial_audit")
    if table4 is not None:
        panel = table4.set_index(["panel", "method"])
        values["n_high_score"] = int(table4.loc[table4["panel"] == "A", "n"].iloc[0])
        for method in CAM_METHODS:
            for letter in ("A", "B"):
                if (letter, method) in panel.index:
                    values[f"panel_{letter.lower()}_failure_{method}"] = panel.loc[(letter, method), "peak_failure"]
        if ("B", "random_deletion") in panel.index:
            values["panel_b_random_deletion"] = panel.loc[("B", "random_deletion"), "logit_drop"]
    thresholds = read_table(figures_dir, "table_threshold_sensitivity")
    if thresholds is not None:
        for threshold, n in thresholds.groupby("score_threshold")["n_eligible"].first().items():
            values[f"eligible_{threshold:.2f}".replace(".", "_")] = int(n)
    strata = read_table(figures_dir, "table_lesion_strata_high_score")
    if strata is not None:
        for (method, stratum), rate in strata.set_index(["method", "stratum"])["failure_rate"].items():
            values[f"strata_{method}_{stratum}"] = rate
    table5 = read_table(figures_dir, "table5_adjusted_model")
    if table5 is not None:
        by_term = table5.set_index("term")
        for key, term in TABLE5_KEYS.items():
            if term in by_term.index:
                estimable = bool(by_term.loc[term].get("estimable", True))
                values[key] = (by_term.loc[term, "odds_ratio"] if estimable
                               else by_term.loc[term].get("note", "not estimable"))
    return values


def _transfer_values(figures_dir: Path) -> dict[str, object]:
    """Cases, eligible images and the centre baseline's IoU per external cohort."""
    values: dict[str, object] = {}
    transfer = read_table(figures_dir, "table_transfer")
    if transfer is not None:
        for dataset, label in DATASET_LABELS.items():
            part = transfer[transfer["cohort"] == label]
            if len(part):
                values[f"transfer_{dataset}_cases"] = int(part["n_cases"].iloc[0])
                values[f"transfer_{dataset}_eligible"] = int(part["n_eligible"].iloc[0])
                values[f"transfer_{dataset}_centre_iou"] = float(part["centre_baseline_iou"].iloc[0])
    return values


AGREES = "agrees"
DIFFERS = "differs"
NOT_COMPARABLE = "not comparable (not the paper's cohort)"
TOLERANCE_NOTE = ("Agreement: 'agrees' is equal at the paper's printed precision, within one "
                  "unit of its last printed digit (0.0115 accepts 0.0114-0.0116; a count or text "
                  "must be equal); 'not comparable': this run's manifest is not the paper's "
                  "cohort, so only the manifest facts are compared. Direction: whether an odds "
                  "ratio lies on the same side of 1 as the paper's.")


def _decimals(paper: str) -> int:
    return len(paper.split(".")[1]) if "." in paper else 0


def _agrees(paper: str, run) -> bool:
    """Equal within one unit of the paper's last printed digit (text and counts: equal)."""
    try:
        paper_number = float(paper)
    except ValueError:
        return str(run) == paper or str(run).startswith(paper)
    if isinstance(run, str):
        return False
    unit = 10.0 ** -_decimals(paper)
    return bool(abs(round(float(run), _decimals(paper)) - paper_number) <= unit * (1 + 1e-9))


def _direction(key: str, paper: str, run) -> object:
    """For odds ratios: does the run's lie on the same side of 1 as the paper's? "" otherwise."""
    if not key.startswith("or_") or isinstance(run, str) or run is None:
        return ""
    return bool((float(run) > 1.0) == (float(paper) > 1.0))


def _printed(run, paper: str) -> str:
    """The run's value at the paper's precision (one more digit for a number printed to 0)."""
    if run is None:
        return ""
    if isinstance(run, float):
        try:
            float(paper)
        except ValueError:
            return f"{run:.4g}"
        return f"{run:.{_decimals(paper)}f}"
    return str(run)


def is_paper_cohort(paper: pd.DataFrame, values: dict[str, object]) -> bool:
    """Do the manifest facts (row count, digest prefix, role counts) equal the paper's?"""
    facts = paper[paper["key"].isin(MANIFEST_KEYS)]
    return all(values.get(k) is not None and _agrees(v, values.get(k))
               for k, v in zip(facts["key"], facts["paper_value"]))


@artefacts.computed_by
def comparison_table(paper: pd.DataFrame, values: dict[str, object]) -> pd.DataFrame:
    """Paper value and run value side by side: key, quantity, source_section, paper_value,
    run_value (at the paper's precision; blank where the run has no counterpart), agreement
    (``agrees`` / ``differs`` / ``not comparable``; blank without a run value) and direction
    (odds ratios only). ``TOLERANCE_NOTE`` states the rules. On another cohort than the
    paper's (``is_paper_cohort``) only the manifest facts are compared."""
    same_cohort = is_paper_cohort(paper, values)
    rows = []
    for row in paper.itertuples(index=False):
        run = values.get(row.key)
        if run is None or run == "":
            agreement = ""
        elif row.key in MANIFEST_KEYS or same_cohort:
            agreement = AGREES if _agrees(row.paper_value, run) else DIFFERS
        else:
            agreement = NOT_COMPARABLE
        rows.append({"key": row.key, "quantity": row.quantity, "source_section": row.source_section,
                     "paper_value": row.paper_value, "run_value": _printed(run, row.paper_value),
                     "agreement": agreement, "direction_agrees": _direction(row.key, row.paper_value, run)})
    return pd.DataFrame(rows)


def same_cohort_statement(table: pd.DataFrame) -> str:
    """One sentence: does this run's manifest match the paper's (rows, digest prefix, roles)?"""
    facts = table[table["key"].isin(MANIFEST_KEYS)]
    differing = facts[facts["agreement"] != AGREES]   # blank (no run value) counts as differing
    if differing.empty:
        return ("The manifest matches the paper's cohort (7,210 rows, digest prefix and role counts "
                "equal): the numbers below are a reproduction check.")
    listed = "; ".join(f"{q}: paper {p}, run {r or 'none'}" for q, p, r in
                       zip(differing["quantity"], differing["paper_value"], differing["run_value"]))
    return ("This run does NOT use the paper's cohort (" + listed + "), so the comparison is a "
            "layout check only: differences are expected.")
