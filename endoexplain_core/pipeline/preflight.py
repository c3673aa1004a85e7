"""Preflight: what a run needs, checked all at once, before any training.

``./run_all.sh --profile P [--data-root DATA] [--set ...] --check`` runs every check below,
prints one line per finding and exits 0 when the run is ready, 2 when it is not. Nothing is
trained or written.

  data     the data root; HyperKvasir's tree (labelled lower-GI images per category beside the
           paper's counts for the paper profile, segmented images with masks); each external
           cohort the profile audits (required ones must exist; optional ones are reported):
           cases kept, files excluded by reason (the first few named, all counted), frame
           sizes and formats seen
  weights  every ImageNet weight file the profile asks for, at its expected path
  device   the device the profile asks for (CUDA present, its memory)
  disk     free space where the run folder will be

Each data check uses the reader the run itself uses (``data.hyperkvasir``, ``data.cohorts``),
so a problem the preflight does not see is one the run would not see either. A dataset's
reader stops at its first unreadable file: that dataset reports one problem; every other
check still runs.
"""

from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from endoexplain_core import config as profiles
from endoexplain_core.data import cohorts, hyperkvasir
from endoexplain_core.data.imageio import ImageReadError

READY, MISSING, PROBLEM, INFO = "ready", "missing", "problem", "info"
NAMED_EXAMPLES = 3                      # files named per exclusion reason (all are counted)
PAPER_MANIFEST_ROWS_KEY = "manifest_rows"
MIN_FREE_DISK_GB = 5.0                  # below this the run folder may fill the disk


@dataclass(frozen=True)
class Finding:
    """One line of the preflight: ``area`` (data, weights, device, disk), what was checked,
    its status (ready, missing, problem, info) and the detail a user acts on."""

    area: str
    item: str
    status: str
    detail: str

    @property
    def blocks(self) -> bool:
        return self.status in (MISSING, PROBLEM)

    def line(self) -> str:
        return f"[{self.status:>7}] {self.area:<7} {self.item}: {self.detail}"


def _paper_value(key: str, reference_dir: Path) -> str | None:
    path = reference_dir / "paper_reported_values.csv"
    if not path.is_file():
        return None
    values = pd.read_csv(path, dtype=str).set_index("key")["paper_value"]
    return values.get(key)


def hyperkvasir_findings(data_root: Path, *, paper_reference: Path | None = None) -> list[Finding]:
    """HyperKvasir under ``data_root``: per-category counts and the segmented set, or the reader's
    first problem (a missing folder, an unreadable image, a mask that does not fit)."""
    try:
        index = hyperkvasir.index_hyperkvasir(data_root, progress=False)
    except (hyperkvasir.HyperKvasirError, ImageReadError, ValueError) as error:
        status = MISSING if "not found" in str(error) or "does not exist" in str(error) else PROBLEM
        return [Finding("data", "HyperKvasir", status, str(error))]
    summary = index.summary
    categories = ", ".join(f"{name} {count}" for name, count in summary["per_category"].items())
    paper_rows = _paper_value(PAPER_MANIFEST_ROWS_KEY, paper_reference) if paper_reference else None
    beside = f" (the paper's manifest: {int(paper_rows):,})" if paper_rows else ""
    findings = [Finding("data", "HyperKvasir", READY,
                        f"{summary['labelled_lower_gi']:,} labelled lower-GI images{beside}; "
                        f"{summary['segmented_matched_by_sha256']:,} segmented with masks; "
                        f"{summary['upper_gi_excluded']:,} upper-GI left out")]
    findings.append(Finding("data", "HyperKvasir categories", INFO, categories))
    if summary["ignored_files"]:
        findings.append(Finding("data", "HyperKvasir", INFO, f"{len(summary['ignored_files'])} "
                                f"non-image files ignored, e.g. {', '.join(summary['ignored_files'][:NAMED_EXAMPLES])}"))
    findings.append(Finding("data", "HyperKvasir sizes", INFO, _sizes_and_formats(index.images, "path")))
    return findings


def _sizes_and_formats(table: pd.DataFrame, path_column: str) -> str:
    """"1920x1080 (52), 720x576 (10); .jpg 62" from a table with width, height and a path."""
    sizes = Counter(f"{int(w)}x{int(h)}" for w, h in zip(table["width"], table["height"]))
    formats = Counter(Path(str(p)).suffix.lower() for p in table[path_column])
    shown = ", ".join(f"{size} ({n})" for size, n in sizes.most_common(4))
    more = f" and {len(sizes) - 4} more sizes" if len(sizes) > 4 else ""
    return f"{shown}{more}; " + ", ".join(f"{suffix} {n}" for suffix, n in formats.most_common())


def cohort_findings(data_root: Path, required, optional) -> list[Finding]:
    """Each external cohort: cases kept and exclusions by reason, or why it cannot be read. A
    missing required cohort blocks the run; a missing optional one is reported."""
    findings = []
    for name in [*required, *[c for c in optional if c not in required]]:
        label = cohorts.DATASET_LABELS.get(name, name)
        folder = data_root / cohorts.DATASET_FOLDERS[name]
        if not folder.is_dir():
            if name in required:
                findings.append(Finding("data", label, MISSING, f"{folder} not found (06_transfer "
                                        "external_cohorts needs it)"))
            else:
                findings.append(Finding("data", label, INFO, f"{folder} not found (optional: "
                                        "audited only when present)"))
            continue
        try:
            cases, report = cohorts.read_cohort(name, data_root)
        except (cohorts.CohortError, ImageReadError, ValueError) as error:
            findings.append(Finding("data", label, PROBLEM, str(error)))
            continue
        reasons = Counter(reason for _, reason in report.exclusions)
        excluded = "; ".join(
            f"{reason}: {count} (e.g. "
            + ", ".join([path for path, why in report.exclusions if why == reason][:NAMED_EXAMPLES]) + ")"
            for reason, count in reasons.items())
        status = READY if len(cases) else PROBLEM
        findings.append(Finding("data", label, status,
                                f"{len(cases):,} cases kept of {report.rows_read:,} files; "
                                f"{report.duplicates_collapsed} byte duplicates collapsed"
                                + (f"; excluded {excluded}" if excluded else "")))
        if len(cases):
            findings.append(Finding("data", f"{label} sizes", INFO, _sizes_and_formats(cases, "image_path")))
    return findings


def weight_findings(architectures, imagenet_weights) -> list[Finding]:
    """Each architecture's ImageNet weights: the file found, from scratch, or the expected path."""
    from endoexplain_core.models import training

    findings = []
    for arch in architectures:
        try:
            path = training.imagenet_weights_path(arch, imagenet_weights)
        except (training.MissingImageNetWeights, FileNotFoundError, ValueError) as error:
            findings.append(Finding("weights", arch, MISSING, str(error)))
            continue
        findings.append(Finding("weights", arch, READY, f"{path}" if path else "from scratch (imagenet_weights: none)"))
    return findings


def device_findings(device: str) -> list[Finding]:
    """The device the profile asks for: present or not, and a CUDA device's memory."""
    import torch

    if device in ("cuda", "auto") and torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        return [Finding("device", device, READY, f"{properties.name}, "
                        f"{properties.total_memory / 2 ** 30:.0f} GiB, {torch.cuda.device_count()} device(s)")]
    if device == "cuda":
        return [Finding("device", device, MISSING, "the profile asks for CUDA but torch sees no CUDA "
                        "device (set shared.device: auto or cpu, or check the driver)")]
    return [Finding("device", device, READY if device == "cpu" else INFO,
                    f"CPU, {torch.get_num_threads()} torch threads" + (" (no CUDA device: auto runs on the CPU)"
                                                                      if device == "auto" else ""))]


def disk_findings(run_dir: Path, minimum_gb: float = MIN_FREE_DISK_GB) -> list[Finding]:
    """Free space on the file system that will hold the run folder."""
    existing = next(p for p in [run_dir, *run_dir.parents] if p.exists())
    free = shutil.disk_usage(existing).free / 2 ** 30
    status = READY if free >= minimum_gb else PROBLEM
    return [Finding("disk", str(run_dir), status, f"{free:.1f} GiB free (at least {minimum_gb:.0f} "
                    "GiB advised)")]


def run_preflight(config: profiles.Profile, data_root: str, run_dir: Path,
                  paper_reference: Path | None = None) -> list[Finding]:
    """Every check for ``config`` (a validated profile, ``--set`` included) with ``data_root``
    ("" for the embedded synthetic cohort) and the run folder ``run_dir``."""
    findings: list[Finding] = []
    if not data_root:
        findings.append(Finding("data", "embedded synthetic cohort", READY,
                                "generated by 00_roles into the run folder (no data root)"))
    elif not Path(data_root).is_dir():
        findings.append(Finding("data", "data root", MISSING, f"{data_root} is not a folder"))
    else:
        root = Path(data_root)
        findings += hyperkvasir_findings(root, paper_reference=paper_reference)
        transfer = config.stage_settings("06_transfer")
        findings += cohort_findings(root, transfer.external_cohorts, transfer.optional_cohorts)
    training_settings = config.stage_settings("01_training")
    findings += weight_findings(config.shared.architectures, training_settings.imagenet_weights)
    findings += device_findings(config.shared.device)
    findings += disk_findings(run_dir)
    return findings


def report(findings: list[Finding]) -> tuple[str, int]:
    """(text, exit code): every finding, then a verdict line; 0 when nothing blocks, else 2."""
    blocking = [f for f in findings if f.blocks]
    verdict = ("preflight: READY, nothing blocks this run" if not blocking else
               f"preflight: NOT READY, {len(blocking)} problem(s): "
               + "; ".join(f"{f.area} {f.item}" for f in blocking))
    return "\n".join([*(f.line() for f in findings), verdict]), (2 if blocking else 0)
