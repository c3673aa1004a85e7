"""Preflight: what a run needs, checked all at once, before any training.

``./run_all.sh --profile P [--data-root DATA] [--set ...] --check`` calls ``run_preflight`` and
``report``: one line per ``Finding``; exit 0 when the run is ready, 2 when a finding is
``missing`` or ``problem``. Nothing is trained or written. Areas: ``data`` (HyperKvasir and
each external cohort, read by the run's own readers: cases kept, exclusions by reason, sizes
and formats; an unreadable data root, or an output root inside it, is a problem), ``weights``
(each ImageNet file the profile asks for: SHA-256 against its torchvision name, then loaded as
the run loads it, tensors only, into its architecture), ``scheduler`` (an address is probed with
a TCP connect), ``device``, ``disk`` (free space); with ``estimate``, minutes and disk per
stage from per-image costs measured here (``measure_costs``, ``decode_cost``; model passes only).
Design: docs/data_models_runs.md, "Preflight".
"""

from __future__ import annotations

import os
import shutil
import socket
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from endoexplain_core import config as profiles
from endoexplain_core import files
from endoexplain_core.run_layout import output_inside_data_root
from endoexplain_core.data import cohorts, hyperkvasir
from endoexplain_core.data.imageio import ImageReadError

READY, MISSING, PROBLEM, INFO = "ready", "missing", "problem", "info"
NAMED_EXAMPLES = 3                      # files named per exclusion reason (all are counted)
PAPER_MANIFEST_ROWS_KEY = "manifest_rows"
MIN_FREE_DISK_GB = 5.0                  # below this the run folder may fill the disk
CHECKPOINT_COPIES = 4   # float32 copies kept per trained model: best weights + resume state (weights, AdamW's two moments)
# Measured on the paper rehearsal (configs/paper_rehearsal.sets on the mirror, 128 px):
RECORD_BYTES_PER_STAGE = 2.0e6      # executed notebook + HTML, tables and figures of one stage (1.6 MB)
BROWSER_BYTES_PER_IMAGE = 27e3      # case browser strip per audited image at 128 px (JPEG; grows with the area)
SCHEDULER_PROBE_SECONDS = 3.0       # a scheduler that does not accept a TCP connection within this is not there



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
    """One of the paper's reported values (``paper_comparison.read_paper_values``), or None."""
    from endoexplain_core.analysis import paper_comparison

    values = paper_comparison.read_paper_values(reference_dir).set_index("key")["paper_value"]
    return values.get(key)


def hyperkvasir_findings(data_root: Path, *, paper_reference: Path | None = None
                         ) -> tuple[list[Finding], hyperkvasir.HyperKvasirIndex | None]:
    """HyperKvasir under ``data_root``: per-category counts and the segmented set, every
    unreadable image and unusable mask (counted, the first few named), or the reason the tree
    cannot be read (a missing folder, an unknown category); with the index when it could be read."""
    problems: list[tuple[str, str, str]] = []
    try:
        index = hyperkvasir.index_hyperkvasir(data_root, progress=False, problems=problems)
    except (hyperkvasir.HyperKvasirError, ImageReadError, ValueError, OSError) as error:
        status = MISSING if "not found" in str(error) or "does not exist" in str(error) else PROBLEM
        return [Finding("data", "HyperKvasir", status, str(error)),
                *problem_findings("HyperKvasir", problems, data_root)], None
    summary = index.summary
    categories = ", ".join(f"{name} {count}" for name, count in summary["per_category"].items())
    paper_rows = _paper_value(PAPER_MANIFEST_ROWS_KEY, paper_reference) if paper_reference else None
    beside = f" (the paper's manifest: {int(paper_rows):,})" if paper_rows else ""
    findings = [Finding("data", "HyperKvasir", READY,
                        f"{summary['labelled_lower_gi']:,} labelled lower-GI images{beside}; "
                        f"{summary['segmented_with_masks']:,} segmented with masks (twins by "
                        f"SHA-256 {summary['segmented_matched_by_sha256']:,}, by average hash "
                        f"{summary['segmented_matched_by_ahash']:,}"
                        + (f", re-encodings {summary['segmented_matched_by_reencoding']:,}"
                           if summary["segmented_matched_by_reencoding"] else "") + "); "
                        f"{summary['upper_gi_excluded']:,} upper-GI left out"),
                *problem_findings("HyperKvasir", problems, data_root)]
    without_twin = summary["segmented_without_twin"]
    if without_twin:
        findings.append(Finding("data", "HyperKvasir", INFO, f"{len(without_twin)} segmented "
                                "image(s) without a labelled twin left out (no near-copy among the "
                                f"labelled images), e.g. {', '.join(without_twin[:NAMED_EXAMPLES])}"))
    moved = {name: where for name, where in summary["folders"].items()
             if where != f"{hyperkvasir.HYPERKVASIR_FOLDER}/{name}"}
    if moved:
        findings.append(Finding("data", "HyperKvasir", INFO, "read from nested folders: "
                                + ", ".join(moved.values())))
    findings.append(Finding("data", "HyperKvasir categories", INFO, categories))
    if summary["ignored_files"]:
        findings.append(Finding("data", "HyperKvasir", INFO, f"{len(summary['ignored_files'])} "
                                f"non-image files ignored, e.g. {', '.join(summary['ignored_files'][:NAMED_EXAMPLES])}"))
    findings.append(Finding("data", "HyperKvasir sizes", INFO, _sizes_and_formats(index.images, "path")))
    return findings, index


def _sizes_and_formats(table: pd.DataFrame, path_column: str) -> str:
    """"1920x1080 (52), 720x576 (10); .jpg 62" from a table with width, height and a path."""
    sizes = Counter(f"{int(w)}x{int(h)}" for w, h in zip(table["width"], table["height"]))
    formats = Counter(Path(str(p)).suffix.lower() for p in table[path_column])
    shown = ", ".join(f"{size} ({n})" for size, n in sizes.most_common(4))
    more = f" and {len(sizes) - 4} more sizes" if len(sizes) > 4 else ""
    return f"{shown}{more}; " + ", ".join(f"{suffix} {n}" for suffix, n in formats.most_common())


def cohort_findings(data_root: Path, required, optional) -> tuple[list[Finding], int]:
    """Each external cohort: cases kept and exclusions by reason, or why it cannot be read. A
    missing required cohort blocks the run; a missing optional one is reported. Returns the
    findings and the number of cases kept over every cohort read."""
    findings, kept = [], 0
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
        problems: list[tuple[str, str, str]] = []
        try:
            cases, report = cohorts.read_cohort(name, data_root, problems)
        except (cohorts.CohortError, ImageReadError, ValueError, OSError) as error:
            findings.append(Finding("data", label, PROBLEM, str(error)))
            continue
        findings += problem_findings(label, problems, data_root)
        reasons = Counter(reason for _, reason in report.exclusions)
        excluded = "; ".join(
            f"{reason}: {count} (e.g. "
            + ", ".join([path for path, why in report.exclusions if why == reason][:NAMED_EXAMPLES]) + ")"
            for reason, count in reasons.items())
        kept += len(cases)
        status = READY if len(cases) else PROBLEM
        findings.append(Finding("data", label, status,
                                f"{len(cases):,} cases kept of {report.rows_read + len(problems):,} files; "
                                f"{report.duplicates_collapsed} byte duplicates collapsed"
                                + (f"; excluded {excluded}" if excluded else "")))
        if len(cases):
            findings.append(Finding("data", f"{label} sizes", INFO, _sizes_and_formats(cases, "image_path")))
    return findings, kept


def problem_findings(label: str, problems: list[tuple[str, str, str]], data_root: Path) -> list[Finding]:
    """One blocking line per kind of bad file a reader recorded (``(path, kind, message)``):
    how many, and the first few named."""
    findings = []
    for kind, count in Counter(kind for _, kind, _ in problems).items():
        named = [path for path, found, _ in problems if found == kind][:NAMED_EXAMPLES]
        shown = ", ".join(_relative_to(path, data_root) for path in named)
        findings.append(Finding("data", label, PROBLEM, f"{kind}: {count} file(s) the run would "
                                f"refuse, e.g. {shown}"))
    return findings


def _relative_to(path: str, root: Path) -> str:
    try:
        return Path(path).relative_to(root).as_posix()
    except ValueError:
        return path


def weight_findings(architectures, imagenet_weights) -> list[Finding]:
    """Each architecture's ImageNet weights: the file found with its SHA-256 checked against
    the hash in its torchvision file name, from scratch, or the expected path and its URL."""
    from endoexplain_core.models import networks, training

    findings = []
    for arch in architectures:
        url = networks.imagenet_weights_url(arch)
        try:
            path = training.locate_imagenet_weights(arch, imagenet_weights)
        except (training.MissingImageNetWeights, FileNotFoundError, ValueError) as error:
            findings.append(Finding("weights", arch, MISSING, f"{error} (torchvision's file: {url})"))
            continue
        except OSError as error:   # e.g. a file name longer than the file system allows
            findings.append(Finding("weights", arch, PROBLEM, f"the weights path "
                                    f"{files.short_text(str(error.filename))} cannot be used: "
                                    f"{error.strerror or error}"))
            continue
        if path is None:
            findings.append(Finding("weights", arch, READY, "from scratch (imagenet_weights: none)"))
            continue
        try:   # the run's own check (``training.imagenet_weights_path``), hashing the file once
            digest, expected = networks.verify_weights_file(path)
        except networks.WeightsHashMismatch as error:
            findings.append(Finding("weights", arch, PROBLEM, str(error)))
            continue
        except OSError as error:
            findings.append(Finding("weights", arch, PROBLEM, f"{path} cannot be read: {error.strerror or error}"))
            continue
        misfit = weights_misfit(arch, path)
        if misfit:
            findings.append(Finding("weights", arch, PROBLEM, misfit))
            continue
        checked = (f"matches the {expected} of its torchvision name" if expected else
                   "its name carries no torchvision hash, so its SHA-256 is not checked")
        findings.append(Finding("weights", arch, READY, f"{path} (SHA-256 {digest[:16]}..., {checked}; "
                                f"loads as tensors only and fits {arch})"))
    return findings


def weights_misfit(arch: str, path: Path) -> str:
    """Why stage 01 could not start ``arch`` from ``path`` ("" when it can), in one line. The file
    is loaded as the run loads it (``networks.build_model``: ``torch.load`` with
    ``weights_only=True``, so a pickle that would run code or build other objects is refused
    without running anything) into torchvision's ``arch`` built without weights, which checks
    every key and shape (a ResNet-18 state dict does not fit ResNet-34). A torch zip archive
    that declares more than ``checkpoint.MAX_ARCHIVE_BYTES`` is refused unread."""
    from endoexplain_core.models import checkpoint, networks

    try:
        with open(path, "rb") as handle:
            checkpoint.check_declared_size(path, handle.read(8))
        networks.build_model(arch, weights_path=path)
    except (checkpoint.CheckpointError, OSError) as error:
        return files.short_text(" ".join(str(error).split()), 300)
    except ValueError as error:
        lines = [line.strip() for line in str(error.__cause__ or error).splitlines() if line.strip()]
        code = next((line for line in lines if "GLOBAL" in line or "Unsupported" in line), "")
        if code:   # torch's weights-only unpickler met a global: the file would run or build objects
            return (f"{path}: refused: loading it would run code or build objects other than "
                    f"tensors ({files.short_text(code, 160)}); save model.state_dict() instead")
        return (f"{path}: not an ImageNet state dict for {arch} that stage 01 can load: "
                + files.short_text(" ".join(lines), 300))
    return ""


def scheduler_findings(setting: str, timeout: float = SCHEDULER_PROBE_SECONDS) -> list[Finding]:
    """The scheduler the stages would use (``--scheduler``, else ``shared.scheduler``; already
    validated by ``orchestrator.check_scheduler``): for a ``tls://`` or ``tcp://`` address, a TCP
    connect within ``timeout`` seconds, a problem when nobody accepts it (stage 01 would
    otherwise stop there); in process and ``local:N``, nothing to probe."""
    address = (setting or "").strip()
    if not address.startswith(("tls://", "tcp://")):
        return []
    host, _, port = address.split("://", 1)[1].rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except (OSError, OverflowError, ValueError) as error:   # refused, timed out, unknown host, bad port
        reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
        return [Finding("scheduler", address, PROBLEM, f"no scheduler answers at {host}:{port} "
                        f"(TCP connect within {timeout:g} s: {reason}); start it, or choose "
                        "--scheduler sequential or local:N")]
    return [Finding("scheduler", address, READY, f"{host}:{port} accepts a TCP connection")]


def data_root_problem(root: Path, run_dir: Path) -> str:
    """Why ``root`` cannot be a data root for a run writing ``run_dir`` ("" when it can): it
    cannot be listed and entered (e.g. mode 000), or the output root holding ``run_dir``
    (``<output_root>/runs/<profile>``) is inside it."""
    try:
        names = sorted(os.listdir(root))
        if names:   # entering the folder needs search permission, listing it only read
            (root / names[0]).lstat()
    except OSError as error:
        return f"{root} cannot be read ({error.strerror or error}): give the user running the pipeline read access"
    output_root = run_dir.parents[1] if len(run_dir.parents) > 1 else run_dir   # <output_root>/runs/<profile>
    return output_inside_data_root(output_root, root)


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


def free_gib(run_dir: Path) -> float:
    """GiB free on the file system that will hold ``run_dir`` (its first existing parent)."""
    existing = next(p for p in [run_dir, *run_dir.parents] if p.exists())
    return shutil.disk_usage(existing).free / 2 ** 30


def disk_findings(run_dir: Path, minimum_gb: float = MIN_FREE_DISK_GB) -> list[Finding]:
    """Free space on the file system that will hold the run folder."""
    free = free_gib(run_dir)
    status = READY if free >= minimum_gb else PROBLEM
    return [Finding("disk", str(run_dir), status, f"{free:.1f} GiB free (at least {minimum_gb:.0f} "
                    "GiB advised)")]


@dataclass(frozen=True)
class Costs:
    """Seconds per image on one device for one architecture at the input size."""

    forward: float
    train: float       # forward + backward + optimiser step, in train mode
    cams: float        # one fused pass of the five CAMs (forward + one backward)
    parameters: int = 0  # numbers in the model's state dict (weights and buffers)


def measure_costs(architectures, image_size: int, device: str, *, batch: int = 8,
                  repeats: int = 2) -> dict[str, Costs]:
    """Per-image costs of each architecture (random weights, random input: time does not depend
    on either), measured ``repeats`` times after one warm-up, best of the repeats."""
    import time

    import torch

    from endoexplain_core.kernels import cams
    from endoexplain_core.models import networks
    from endoexplain_core.numerics import resolve_device

    torch_device = resolve_device(device)
    images = torch.randn(batch, 3, image_size, image_size, device=torch_device)
    labels = torch.zeros(batch, dtype=torch.long, device=torch_device)
    costs = {}
    for arch in architectures:
        model = networks.build_model(arch).to(torch_device)
        _, layer = networks.resolve_target_layer(model, arch, None)
        optimiser = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def forward():
            model.eval()
            with torch.no_grad():
                model(images)

        def train_step():
            model.train()
            optimiser.zero_grad()
            torch.nn.functional.cross_entropy(model(images), labels).backward()
            optimiser.step()

        def cam_pass():
            cams.compute_cams(model, layer, images, target_class=1)

        timed = {}
        for name, work in (("forward", forward), ("train", train_step), ("cams", cam_pass)):
            work()                                         # warm-up (allocations, kernel choice)
            runs = []
            for _ in range(repeats):
                started = time.perf_counter()
                work()
                if torch_device.type == "cuda":
                    torch.cuda.synchronize()
                runs.append(time.perf_counter() - started)
            timed[name] = min(runs) / batch
        costs[arch] = Costs(**timed, parameters=sum(t.numel() for t in model.state_dict().values()))
    return costs


def decode_cost(paths, image_size: int) -> float:
    """Seconds to decode and resize one image to the input size, over the given files (the
    data's own; 0 when there is none), as the run does it (``datasets.decode_resized``)."""
    import time

    from endoexplain_core.data.datasets import decode_resized

    paths = list(paths)
    if not paths:
        return 0.0
    started = time.perf_counter()
    for path in paths:
        decode_resized(path, image_size)
    return (time.perf_counter() - started) / len(paths)


@dataclass(frozen=True)
class WorkCounts:
    """How much work a run does: images per role and the external cases."""

    development: int   # labelled lower-GI images outside the masked audit pool
    audit_pool: int    # masked audit images
    external: int      # external cases kept (0 on the synthetic cohort's estimate if unknown)


def stage_seconds(config: profiles.Profile, counts: WorkCounts, costs: dict[str, Costs],
                  decode: float) -> dict[str, tuple[float, str]]:
    """stage -> (seconds, the formula's main terms in words); model passes only."""
    from endoexplain_core.models import training

    shared = config.shared
    primary = training.PRIMARY_ARCH
    stage01 = config.stage_settings("01_training")
    fractions = config.stage_settings("00_roles").split_fractions
    n_train = int(counts.development * fractions[0])
    n_val = int(counts.development * fractions[1])
    n_total = counts.development + counts.audit_pool
    train_seconds, checkpoints = 0.0, 0
    for arch in shared.architectures:
        settings = training.settings_for(arch, stage01.training_settings, stage01.arch_overrides)
        steps = -(-n_train // settings.batch_size)
        if settings.max_steps_per_epoch:
            steps = min(steps, settings.max_steps_per_epoch)
        runs = len(shared.training_seeds) + (1 if arch == primary else 0)      # + shuffled control
        per_run = settings.epochs * (steps * settings.batch_size * costs[arch].train
                                     + (n_val + settings.batchnorm_recalibration_images) * costs[arch].forward)
        train_seconds += runs * (per_run + n_total * costs[arch].forward)     # + logit export
        checkpoints += runs
    gate = config.stage_settings("03_validity_gate")
    replicates = len(gate.replicate_seeds)
    gate_seconds = ((2 * replicates + 1) * gate.steps * gate.batch_size * costs[primary].train
                    + 4 * replicates * gate.pool_images
                    * (costs[primary].cams + gate.random_deletion_repetitions * costs[primary].forward))
    audit = config.stage_settings("04_spatial_audit")
    audit_one = counts.audit_pool * (costs[primary].cams + audit.random_deletion_repetitions * costs[primary].forward)
    robustness = config.stage_settings("05_robustness")
    others = sum(costs[a].cams + robustness.other_random_deletion_repetitions * costs[a].forward
                 for a in shared.architectures for _ in shared.training_seeds) - costs[primary].cams
    transfer = config.stage_settings("06_transfer")
    extended = config.stage_settings("07_extended_localisation")
    faith = config.stage_settings("08_faithfulness")
    road_per_image = 2 * len(faith.road_fractions) * 6 * costs[primary].forward
    road = (counts.audit_pool + (counts.external if faith.subgroup_faithfulness else 0)) * road_per_image
    # subgroup maps: every checkpoint in the models and its randomised copy, on every case
    subgroup_nets = 2 * (len(shared.architectures) * len(shared.training_seeds)
                         if faith.subgroup_checkpoints == "learned" else 1)
    subgroup = subgroup_nets * (counts.audit_pool + counts.external) * costs[primary].cams
    return {
        "00_roles": (n_total * decode, "decode + hash every image once"),
        "01_training": (train_seconds + n_total * decode,
                        f"{checkpoints} checkpoints: epochs x steps x batch x (forward + backward) + "
                        "validation and BatchNorm passes + logit export of every image"),
        "03_validity_gate": (gate_seconds, f"{2 * replicates + 1} gate trainings + 4 models x "
                             f"{replicates} replicates x pool x (CAMs + deletions)"),
        "04_spatial_audit": (audit_one, "audit pool x (five CAMs + random deletions), primary"),
        "05_robustness": (counts.audit_pool * max(others, 0.0),
                          "audit pool x (CAMs + deletions) for every other checkpoint"),
        "06_transfer": (counts.external * (costs[primary].cams + transfer.random_deletion_repetitions
                                           * costs[primary].forward),
                        "external cases x (five CAMs + random deletions)"),
        "07_extended_localisation": ((counts.audit_pool + counts.external) * costs[primary].cams
                                     + extended.c_score_negatives * costs[primary].cams
                                     * (len(shared.architectures) * len(shared.training_seeds)
                                        if extended.matrix_checkpoints else 1),
                                     "audit pool + external cases x one fused CAM pass, + the "
                                     "negative-class C-Score's negatives per scored checkpoint"),
        "08_faithfulness": (road + counts.audit_pool * faith.shape_repetitions * 5 * costs[primary].forward
                            + subgroup,
                            "ROAD (2 orders x fractions x 6 maps; audit pool, and the external cases "
                            "with subgroup_faithfulness) + shape-preserving deletions, primary + "
                            "subgroup CAM passes (each checkpoint in the models and its randomised copy; "
                            "at most every matrix checkpoint)"),
    }


def stage_disk_bytes(config: profiles.Profile, counts: WorkCounts, costs: dict[str, Costs]
                     ) -> dict[str, tuple[float, str]]:
    """stage -> (bytes the stage leaves in the run folder, how): trained models exactly
    (parameters x 4 bytes x ``CHECKPOINT_COPIES``, plus one copy per epoch snapshot when kept),
    the rest (notebooks, tables, figures, case browser) from sizes measured on a run."""
    from endoexplain_core.models import training

    shared = config.shared
    primary = training.PRIMARY_ARCH
    stage01 = config.stage_settings("01_training")
    model_bytes = {arch: 4.0 * costs[arch].parameters for arch in shared.architectures}
    checkpoints = 0.0
    for arch in shared.architectures:
        settings = training.settings_for(arch, stage01.training_settings, stage01.arch_overrides)
        runs = len(shared.training_seeds) + (1 if arch == primary else 0)     # + shuffled control
        snapshots = settings.epochs if stage01.keep_epoch_snapshots and arch == primary else 0
        checkpoints += runs * model_bytes[arch] * CHECKPOINT_COPIES + snapshots * model_bytes[arch]
    audited = counts.audit_pool + counts.external
    record = RECORD_BYTES_PER_STAGE
    return {
        "01_training": (checkpoints + record, "trained models x parameters x 4 bytes x "
                        f"{CHECKPOINT_COPIES} (best weights + resume state)"),
        "09_figures": (audited * BROWSER_BYTES_PER_IMAGE * (shared.image_size / 128) ** 2 + record,
                       "case browser: one strip per audited image"),
        "other stages": (8 * record, "notebooks, tables and figures; the gate keeps no model"),
    }


def estimate_findings(config: profiles.Profile, counts: WorkCounts, sample_paths,
                      run_dir: Path | None = None) -> list[Finding]:
    """One info line per stage with its estimated minutes and how, the disk it fills and a
    total; with ``run_dir``, a problem when the disk estimate exceeds its free space."""
    costs = measure_costs(config.shared.architectures, config.shared.image_size, config.shared.device)
    decode = decode_cost(sample_paths, config.shared.image_size)
    findings = [Finding("estimate", "per-image costs", INFO, "; ".join(
        f"{arch}: forward {1000 * c.forward:.1f} ms, forward+backward {1000 * c.train:.1f} ms, "
        f"five CAMs {1000 * c.cams:.1f} ms" for arch, c in costs.items())
        + f"; decode + resize {1000 * decode:.1f} ms (measured here, {config.shared.device}, "
        f"{config.shared.image_size} px)")]
    seconds = stage_seconds(config, counts, costs, decode)
    for stage, (value, how) in seconds.items():
        findings.append(Finding("estimate", stage, INFO, f"{value / 60:.1f} min ({how})"))
    total = sum(value for value, _ in seconds.values())
    disk = stage_disk_bytes(config, counts, costs)
    for stage, (value, how) in disk.items():
        findings.append(Finding("estimate", f"disk {stage}", INFO, f"{value / 2 ** 30:.2f} GiB ({how})"))
    needed = sum(value for value, _ in disk.values()) / 2 ** 30
    free = free_gib(run_dir) if run_dir is not None else float("inf")
    findings.append(Finding("estimate", "disk total", INFO if needed < free else PROBLEM,
                            f"about {needed:.1f} GiB in the run folder"
                            + (f", {free:.1f} GiB free there" if run_dir is not None else "")))
    findings.append(Finding("estimate", "total", INFO, f"about {total / 60:.0f} min of model passes "
                            f"({counts.development:,} development, {counts.audit_pool:,} audit, "
                            f"{counts.external:,} external images); statistics, figures and notebook "
                            "start-up come on top (checked on a default run, Intel Xeon, 2 threads: "
                            "13 min of passes estimated, 17.6 min measured)"))
    return findings


def run_preflight(config: profiles.Profile, data_root: str, run_dir: Path,
                  paper_reference: Path | None = None, estimate: bool = False,
                  scheduler: str | None = None) -> list[Finding]:
    """Every check for ``config`` (a validated profile, ``--set`` included) with ``data_root``
    ("" for the embedded synthetic cohort) and the run folder ``run_dir``; with ``estimate``,
    the time per stage too (it needs the data: a data root that could be read). ``scheduler``:
    the ``--scheduler`` flag (None: the profile's ``shared.scheduler``), probed when an address."""
    findings: list[Finding] = []
    index, external = None, 0
    if not data_root:
        findings.append(Finding("data", "embedded synthetic cohort", READY,
                                "generated by 00_roles into the run folder (no data root)"))
    elif not Path(data_root).is_dir():
        findings.append(Finding("data", "data root", MISSING, f"{data_root} is not a folder"))
    elif problem := data_root_problem(Path(data_root).resolve(), run_dir.resolve()):
        findings.append(Finding("data", "data root", PROBLEM, problem))   # nothing under it is read
    else:
        root = Path(data_root)
        found, index = hyperkvasir_findings(root, paper_reference=paper_reference)
        findings += found
        transfer = config.stage_settings("06_transfer")
        found, external = cohort_findings(root, transfer.external_cohorts, transfer.optional_cohorts)
        findings += found
    training_settings = config.stage_settings("01_training")
    findings += weight_findings(config.shared.architectures, training_settings.imagenet_weights)
    findings += scheduler_findings(scheduler if scheduler is not None
                                   else getattr(config.shared, "scheduler", ""))
    findings += device_findings(config.shared.device)
    findings += disk_findings(run_dir)
    if estimate:
        if index is None:
            findings.append(Finding("estimate", "time per stage", INFO, "needs a data root that can be "
                                    "read (for the synthetic cohort: --data-root runs/<profile>/data "
                                    "after stage 00 has generated it)"))
        elif not any(f.blocks for f in findings if f.area == "device"):
            audit_pool = int(index.summary["segmented_with_masks"])
            counts = WorkCounts(development=int(index.summary["labelled_lower_gi"]) - audit_pool,
                                audit_pool=audit_pool, external=external)
            sample = [Path(data_root) / p for p in index.images["path"].head(6)]
            findings += estimate_findings(config, counts, sample, run_dir)
    return findings


def report(findings: list[Finding]) -> tuple[str, int]:
    """(text, exit code): every finding, then a verdict line; 0 when nothing blocks, else 2."""
    blocking = [f for f in findings if f.blocks]
    verdict = ("preflight: READY, nothing blocks this run" if not blocking else
               f"preflight: NOT READY, {len(blocking)} problem(s): "
               + "; ".join(f"{f.area} {f.item}" for f in blocking))
    return "\n".join([*(f.line() for f in findings), verdict]), (2 if blocking else 0)
