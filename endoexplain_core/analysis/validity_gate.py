"""The validity gate: can each CAM method find planted truth in the audited pipeline?

Before a CAM's "peak outside the lesion" is read as a statement about the classifier, the
method must show, at the audited architecture, target layer and input size, that it points at
what a model is known to use. Four EfficientNet-B0-sized models (or whatever the primary's
architecture is) are built on planted synthetic frames (``synthetic.render_frame`` plus a
planted cue):

``lesion``     label = a conspicuous polyp is present; a blue dye cue is painted on half of
               the frames of each class, so the cue carries no label information;
``shortcut``   every frame carries a polyp; label = the blue dye cue is present, so the only
               label information is the cue, never the lesion;
``untrained``  random weights, never trained (control);
``shuffled``   the lesion recipe trained on permuted labels (control).

All four are audited (``audit.audit_checkpoint``, temperature 1: only localisation matters
here) on one common pool of frames that carry both a polyp and a separate cue, with the polyp
as the audit mask. Per CAM method the gate reports:

- ``lesion_rate``: share of the lesion model's maps whose peak lies inside the polyp;
- ``cue_rate``: share of the shortcut model's maps whose peak lies on the cue;
- the chance levels: the mean area share of the polyp and of the cue (a uniformly random peak
  lands on them with exactly that probability);
- the same two rates for each control.

Rates are over maps with a defined peak: a constant map has no peak and is counted apart
(``n_constant_*``), never as a hit or a miss.

**Pass rule.** A method passes when (1) the lesion and shortcut models learned their planted
label (held-out accuracy >= ``min_accuracy``, default 0.90) and the shuffled-label control did
not (held-out accuracy <= ``max_control_accuracy``, default 0.75); (2) ``lesion_rate`` >=
lesion chance + ``margin`` and ``cue_rate`` >= cue chance + ``margin``; (3) no control clears
either bar. The margin defaults to 0.25: the chance levels are area shares of 0.02-0.10, so a
method passing needs at least a quarter of all maps to peak on the planted evidence beyond
what a random peak achieves. With a pool of 48 frames and chance 0.10 the binomial standard
deviation of a chance-level rate is 0.043, so 0.25 is almost six standard deviations; a
smaller margin would let position priors that happen to overlap the lesion distribution pass,
a larger one would demand more than coarse (4x4-7x7) feature grids can deliver for lesions
that cover a tenth of a cell. A control clearing the bar means the method finds the planted
region without the model using it (an edge or colour detector), so its hits on the trained
models are not evidence either. Why both models: a fixed prior map (e.g. a corner) cannot be
inside the lesion and on the cue of the same frame more often than chance, and a map that
only highlights salient blobs cannot separate the lesion model from the shortcut model.

The module also holds the rule for checkpoints that did not learn (``learning_status``).

Size: over 400 lines on purpose: planted frames, the four gate models and the verdict are one
experiment whose parts must use the same pool and masks.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from endoexplain_core.analysis import audit, stats, summaries
from endoexplain_core.data import synthetic
from endoexplain_core.data.datasets import load_manifest, to_normalised_tensor
from endoexplain_core.methods import CAM_METHODS, MAP_METHODS, method_label
from endoexplain_core.models import networks, training

GATE_MODELS = ("lesion", "shortcut", "untrained", "shuffled")
CONTROL_MODELS = ("untrained", "shuffled")
GATE_DATASET = "validity_gate"
DAGGER = "\u2020"
GATE_FOOTNOTE = (f"{DAGGER} fails the planted-truth validity gate at this architecture, layer and "
                 "input size (table_validity_gate): its peaks do not find planted evidence, so its "
                 "failure rates say nothing about lesion localisation.")

CUE_COLOUR = synthetic.DYE           # the cue is a blue dye blob, as in dyed-lifted frames
CUE_RADIUS = (0.20, 0.26)           # cue radius range, frame units (1 = half the shorter side)
CUE_CLEARANCE = 0.08                # minimum gap between cue and polyp, frame units


@dataclass(frozen=True)
class GateSettings:
    """Size of the gate: frames, optimisation and the pass rule.

    image_size: frame and model input side in pixels (the primary's). train_images: frames per
    trained model (half of each class). val_images: held-out frames for the accuracy check.
    pool_images: common audited pool (polyp + separate cue). steps, batch_size, learning_rate,
    warmup_steps, weight_decay, label_smoothing: AdamW with warm-up and cosine decay (the
    study's recipe, from scratch, zero-initialised head). margin, min_accuracy,
    max_control_accuracy: the pass rule (module docstring). seed: frames, weights, shuffling.
    batchnorm_recalibration_images: training frames behind the eval-mode BatchNorm statistics
    (``training.recalibrate_batchnorm``).
    """

    image_size: int = 128
    train_images: int = 256
    val_images: int = 64
    pool_images: int = 48
    steps: int = 60
    batch_size: int = 16
    learning_rate: float = 0.004
    warmup_steps: int = 6
    weight_decay: float = 0.05
    label_smoothing: float = 0.03
    margin: float = 0.25
    min_accuracy: float = 0.90
    max_control_accuracy: float = 0.75
    seed: int = 20260721
    random_deletion_repetitions: int = 2
    batchnorm_recalibration_images: int = 128


# --- planted frames ---------------------------------------------------------------------------

def paint_cue(rng: np.random.Generator, image: np.ndarray, lesion_mask: np.ndarray
              ) -> np.ndarray:
    """In place: paint a blue dye blob that does not touch the polyp; return its bool mask.

    The blob centre is drawn uniformly inside the field of view (radius 0.72 frame units) until
    the blob plus ``CUE_CLEARANCE`` misses the polyp (100 tries; then the candidate farthest from
    the polyp is used). The mask is the blob's disc (alpha >= 0.5).
    """
    height, width = image.shape[:2]
    half = min(height, width) / 2.0
    y = ((np.arange(height) + 0.5) - height / 2.0)[:, None] / half
    x = ((np.arange(width) + 0.5) - width / 2.0)[None, :] / half
    radius = rng.uniform(*CUE_RADIUS)
    lesion_y, lesion_x = y.repeat(width, 1)[lesion_mask], x.repeat(height, 0)[lesion_mask]
    best, best_gap = None, -np.inf
    for _ in range(100):
        distance, angle = 0.72 * np.sqrt(rng.uniform()), rng.uniform(0, 2 * np.pi)
        cy, cx = distance * np.sin(angle), distance * np.cos(angle)
        gap = (np.sqrt((lesion_y - cy) ** 2 + (lesion_x - cx) ** 2).min() - radius
               if lesion_y.size else np.inf)
        if gap > best_gap:
            best, best_gap = (cy, cx), gap
        if gap >= CUE_CLEARANCE:
            break
    cy, cx = best
    relative = np.sqrt((y - cy) ** 2 + (x - cx) ** 2) / radius
    alpha = np.clip((1.0 - relative) * 4.0, 0.0, 1.0)
    shade = image.astype(np.float32).mean(axis=2, keepdims=True) / 255.0
    colour = CUE_COLOUR * (0.6 + 0.8 * shade) * 255.0
    blended = image * (1.0 - 0.85 * alpha[..., None]) + 0.85 * alpha[..., None] * colour
    image[...] = np.clip(blended + 0.5, 0, 255).astype(np.uint8)
    return (relative < 1.0) & ~lesion_mask


def planted_frame(rng: np.random.Generator, size: int, *, lesion: bool, cue: bool
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One planted frame: uint8 (S, S, 3) RGB, bool lesion mask, bool cue mask (S, S).

    The polyp is fully conspicuous (``conspicuity=1``); no dye cushion, no position box, so the
    cue is the only blue structure. Masks are all False when the finding is absent.
    """
    image, lesion_mask = synthetic.render_frame(rng, size, lesion=lesion, conspicuity=1.0)
    cue_mask = paint_cue(rng, image, lesion_mask) if cue else np.zeros_like(lesion_mask)
    return image, lesion_mask, cue_mask


def task_frames(task: str, n_images: int, size: int, seed: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images (n, 3, S, S) and int64 labels (n,) of one planted task.

    ``lesion``: label 1 = polyp (labels alternate 1, 0), the cue on every second frame of each
    class. ``shortcut``: a polyp in every frame, label 1 = cue (alternating).
    """
    if task not in ("lesion", "shortcut"):
        raise ValueError(f"unknown planted task {task!r}; choose 'lesion' or 'shortcut'")
    rng = synthetic.stream(seed, f"validity_gate/{task}/{size}")
    images, labels = [], []
    for i in range(n_images):
        label, other = i % 2, (i // 2) % 2 == 1
        lesion, cue = (bool(label), other) if task == "lesion" else (True, bool(label))
        image, _, _ = planted_frame(rng, size, lesion=lesion, cue=cue)
        images.append(torch.from_numpy(image).permute(2, 0, 1))
        labels.append(label)
    return torch.stack(images), torch.tensor(labels, dtype=torch.int64)


def gate_pool(n_images: int, size: int, seed: int) -> list[dict]:
    """The common audited pool: frames with a polyp and a separate cue.

    Returns dicts with sample_id, image (uint8 RGB), lesion_mask and cue_mask (bool (S, S)).
    """
    rng = synthetic.stream(seed, f"validity_gate/pool/{size}")
    pool = []
    for i in range(n_images):
        image, lesion_mask, cue_mask = planted_frame(rng, size, lesion=True, cue=True)
        pool.append({"sample_id": f"gate_{i:04d}", "image": image,
                     "lesion_mask": lesion_mask, "cue_mask": cue_mask})
    return pool


# --- models -----------------------------------------------------------------------------------

def _normalise(batch: torch.Tensor) -> torch.Tensor:
    """uint8 (B, 3, S, S) -> normalised float32 (ImageNet mean/std, as every model input)."""
    return torch.stack([to_normalised_tensor(image.permute(1, 2, 0).numpy()) for image in batch])


def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
             batch_size: int = 64) -> float:
    """Share of ``images`` (uint8 (n, 3, S, S)) whose argmax logit equals ``labels``."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(labels), batch_size):
            logits = model(_normalise(images[start:start + batch_size]))
            correct += int((logits.argmax(dim=1) == labels[start:start + batch_size]).sum())
    return correct / len(labels)


def train_gate_model(arch: str, images: torch.Tensor, labels: torch.Tensor,
                     settings: GateSettings, seed: int) -> nn.Module:
    """Train ``arch`` from scratch on planted frames; return it in eval mode.

    The study's recipe (zero-initialised head, AdamW, linear warm-up then cosine decay,
    label-smoothed cross-entropy), ``settings.steps`` optimiser steps of ``batch_size`` frames
    drawn without replacement per pass (seeded). Random flips keep the position of the planted
    evidence from being learnt as a fixed location.
    """
    training.seed_everything(seed)
    model = networks.build_model(arch)
    training.zero_init_head(model)
    optimiser = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate,
                                  weight_decay=settings.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimiser, training.cosine_with_warmup(settings.warmup_steps, settings.steps))
    loss_function = nn.CrossEntropyLoss(label_smoothing=settings.label_smoothing)
    generator = torch.Generator().manual_seed(seed)
    order = torch.empty(0, dtype=torch.int64)
    model.train()
    with training.deterministic_algorithms(torch.device("cpu")):
        for _ in range(settings.steps):
            if len(order) < settings.batch_size:
                order = torch.cat([order, torch.randperm(len(labels), generator=generator)])
            batch, order = order[:settings.batch_size], order[settings.batch_size:]
            inputs = _normalise(images[batch])
            flips = torch.rand(2, generator=generator) < 0.5
            if flips[0]:
                inputs = inputs.flip(-1)
            if flips[1]:
                inputs = inputs.flip(-2)
            loss = loss_function(model(inputs), labels[batch])
            if not torch.isfinite(loss):
                raise training.NonFiniteLossError(f"validity-gate model ({arch}) loss became "
                                                  f"{loss.item()}; lower the gate learning rate")
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            scheduler.step()
        # Eval-mode BatchNorm statistics of the final weights (as in 01_training): the moving
        # averages of a few hundred steps from scratch still describe earlier weights.
        count = settings.batchnorm_recalibration_images
        training.recalibrate_batchnorm(
            model, ((_normalise(images[start:start + settings.batch_size]), None, None)
                    for start in range(0, min(count, len(labels)), settings.batch_size)),
            count, torch.device("cpu"))
    return model.eval()


def build_gate_models(arch: str, settings: GateSettings) -> tuple[dict[str, nn.Module], pd.DataFrame]:
    """The four gate models and a table of their training facts.

    Returns ({model name: model}, DataFrame with columns model, task, labels, steps,
    train_accuracy, held_out_accuracy, accuracy_required, accuracy_ok, seconds). ``task`` is
    the frames the model is evaluated on (the lesion task for the controls); ``accuracy_ok``
    applies the gate's accuracy rule (trained models learn, the shuffled control does not;
    the untrained model has no requirement).
    """
    seed = settings.seed
    data = {task: task_frames(task, settings.train_images, settings.image_size, seed)
            for task in ("lesion", "shortcut")}
    held_out = {task: task_frames(task, settings.val_images, settings.image_size, seed + 1)
                for task in ("lesion", "shortcut")}
    shuffled = torch.from_numpy(training.shuffled_targets(data["lesion"][1].numpy(), seed))
    recipes = {"lesion": ("lesion", data["lesion"][1], "planted lesion"),
               "shortcut": ("shortcut", data["shortcut"][1], "planted cue"),
               "shuffled": ("lesion", shuffled, "permuted lesion labels")}
    models, rows = {}, []
    for name in GATE_MODELS:
        started = time.perf_counter()
        if name == "untrained":
            training.seed_everything(seed)
            model, task, label_text = networks.build_model(arch).eval(), "lesion", "none (random weights)"
            steps = 0
        else:
            task, labels, label_text = recipes[name]
            model = train_gate_model(arch, data[task][0], labels, settings, seed)
            steps = settings.steps
        train_acc = accuracy(model, data[task][0], recipes.get(name, (task, data[task][1]))[1])
        held_acc = accuracy(model, *held_out[task])
        if name in ("lesion", "shortcut"):
            required, ok = f">= {settings.min_accuracy:.2f}", held_acc >= settings.min_accuracy
        elif name == "shuffled":
            required, ok = f"<= {settings.max_control_accuracy:.2f}", held_acc <= settings.max_control_accuracy
        else:
            required, ok = "none", True
        models[name] = model
        rows.append({"model": name, "task": task, "labels": label_text, "steps": steps,
                     "train_accuracy": train_acc, "held_out_accuracy": held_acc,
                     "accuracy_required": required, "accuracy_ok": bool(ok),
                     "seconds": round(time.perf_counter() - started, 1)})
    return models, pd.DataFrame(rows)


# --- audit and rates --------------------------------------------------------------------------

def audit_gate_models(models: dict[str, nn.Module], pool: list[dict], output_dir: str | Path, *,
                      arch: str, layer_name: str, settings: GateSettings,
                      top_fraction: float = 0.20, batch_size: int = 16) -> pd.DataFrame:
    """Audit every gate model on the pool; return case rows with the cue columns added.

    Each model's audit table goes to ``<output_dir>/gate_<model>.parquet``. Added columns:
    ``model``, ``peak_defined`` (not a constant map), ``peak_inside_lesion`` and
    ``peak_on_cue`` (float 1/0, NaN without a defined peak), ``cue_area_fraction``.
    """
    output_dir = Path(output_dir)
    cue_masks = {case["sample_id"]: case["cue_mask"] for case in pool}
    cases = [(case["sample_id"], case["image"], case["lesion_mask"]) for case in pool]
    tables = []
    for name, model in models.items():
        checkpoint_id = f"gate_{name}"
        audit.audit_checkpoint(
            model, {"checkpoint_id": checkpoint_id, "arch": arch, "seed": settings.seed,
                    "control": name, "target_layer": layer_name},
            1.0, cases, dataset=GATE_DATASET, image_size=settings.image_size,
            table_path=output_dir / f"{checkpoint_id}.parquet",
            random_deletion_path=output_dir / f"{checkpoint_id}_random_deletion.parquet",
            top_fraction=top_fraction, repetitions=settings.random_deletion_repetitions,
            batch_size=batch_size, total=len(cases))
        table = audit.read_audit_table(output_dir / f"{checkpoint_id}.parquet")
        tables.append(table.assign(model=name))
    rows = pd.concat(tables, ignore_index=True)
    return add_cue_columns(rows, cue_masks)


def add_cue_columns(rows: pd.DataFrame, cue_masks: dict[str, np.ndarray]) -> pd.DataFrame:
    """Add ``peak_defined``, ``peak_inside_lesion``, ``peak_on_cue`` and ``cue_area_fraction``.

    ``rows``: audit case rows (peak_row, peak_col, peak_outside_mask, constant_map,
    sample_id); ``cue_masks``: sample_id -> bool (S, S) at the audited size.
    """
    rows = rows.copy()
    defined = ~rows["constant_map"].astype(bool)
    on_cue = np.array([bool(cue_masks[s][r, c]) for s, r, c in
                       zip(rows["sample_id"], rows["peak_row"], rows["peak_col"])])
    rows["peak_defined"] = defined
    rows["peak_inside_lesion"] = np.where(defined, (~rows["peak_outside_mask"].astype(bool)).astype(float), np.nan)
    rows["peak_on_cue"] = np.where(defined, on_cue.astype(float), np.nan)
    rows["cue_area_fraction"] = rows["sample_id"].map({s: float(m.mean()) for s, m in cue_masks.items()})
    return rows


def _rate(rows: pd.DataFrame, column: str) -> tuple[float, int, int]:
    """(mean over defined peaks, n defined, n constant) of a 0/1/NaN column."""
    values = rows[column]
    defined = values.notna()
    rate = float(values[defined].mean()) if defined.any() else np.nan
    return rate, int(defined.sum()), int((~defined).sum())


def _rate_text(rows: pd.DataFrame, column: str) -> str:
    """A rate for the reason column, with its count ("0.292 (14/48)": a verdict decided by one
    image must be visible as such); a rate with no defined peak says so."""
    rate, n_defined, n_constant = _rate(rows, column)
    if not np.isfinite(rate):
        return f"undefined (all {n_constant} maps constant)"
    return f"{rate:.3f} ({int(rows[column].sum())}/{n_defined})"


def _bar_text(bar: float, rows: pd.DataFrame, column: str) -> str:
    """A bar for the reason column, with the count it asks for: "0.292 (needs 15/48)"; at three
    decimals a rate one frame short and its bar can print alike."""
    _, n_defined, _ = _rate(rows, column)
    if n_defined == 0:
        return f"{bar:.3f}"
    return f"{bar:.3f} (needs {math.ceil(bar * n_defined - 1e-9)}/{n_defined})"


def gate_table(case_rows: pd.DataFrame, model_facts: pd.DataFrame, *, margin: float = 0.25,
               methods=MAP_METHODS) -> pd.DataFrame:
    """Per map method: the gate's rates, chance levels and verdict.

    ``case_rows``: ``add_cue_columns`` output for the four gate models (column ``model``);
    ``model_facts``: ``build_gate_models`` table (``model``, ``accuracy_ok``). Columns: method,
    label, passes (bool), lesion_rate, lesion_chance, cue_rate, cue_chance, untrained_lesion_rate,
    untrained_cue_rate, shuffled_lesion_rate, shuffled_cue_rate, n, n_constant_<model>, margin,
    models_ok and reason (why it fails, or "passes"). Baseline maps (random, centre) are
    reported as references; the rule is the same, so the random heatmap should fail (its rates
    sit at chance). A method whose maps are all constant for a model has NaN rates and fails.
    """
    missing = sorted(set(GATE_MODELS) - set(case_rows["model"]))
    if missing:
        raise ValueError(f"gate case rows lack models {missing}")
    facts = model_facts.set_index("model")
    models_ok = bool(facts.loc[list(GATE_MODELS), "accuracy_ok"].all())
    bad_models = [m for m in GATE_MODELS if not facts.loc[m, "accuracy_ok"]]
    rows = []
    for method in methods:
        of_method = case_rows[case_rows["method"] == method]
        if of_method.empty:
            continue
        row = {"method": method, "label": method_label(method),
               "n": of_method["sample_id"].nunique(), "margin": margin, "models_ok": models_ok}
        per_model = {m: of_method[of_method["model"] == m] for m in GATE_MODELS}
        lesion_chance = float(per_model["lesion"].groupby("sample_id")["lesion_area_fraction"].first().mean())
        cue_chance = float(per_model["lesion"].groupby("sample_id")["cue_area_fraction"].first().mean())
        row["lesion_rate"], _, row["n_constant_lesion"] = _rate(per_model["lesion"], "peak_inside_lesion")
        row["cue_rate"], _, row["n_constant_shortcut"] = _rate(per_model["shortcut"], "peak_on_cue")
        row["lesion_chance"], row["cue_chance"] = lesion_chance, cue_chance
        for control in CONTROL_MODELS:
            row[f"{control}_lesion_rate"], _, row[f"n_constant_{control}"] = _rate(
                per_model[control], "peak_inside_lesion")
            row[f"{control}_cue_rate"], _, _ = _rate(per_model[control], "peak_on_cue")
        lesion_bar, cue_bar = lesion_chance + margin, cue_chance + margin
        reasons = []
        if not models_ok:
            reasons.append("gate models failed their accuracy rule: " + ", ".join(bad_models))
        if not row["lesion_rate"] >= lesion_bar:   # NaN (no defined peak) fails too
            reasons.append(f"lesion model peak-inside {_rate_text(per_model['lesion'], 'peak_inside_lesion')}"
                           f" < {_bar_text(lesion_bar, per_model['lesion'], 'peak_inside_lesion')}")
        if not row["cue_rate"] >= cue_bar:
            reasons.append(f"shortcut model peak-on-cue {_rate_text(per_model['shortcut'], 'peak_on_cue')}"
                           f" < {_bar_text(cue_bar, per_model['shortcut'], 'peak_on_cue')}")
        for control in CONTROL_MODELS:
            if row[f"{control}_lesion_rate"] >= lesion_bar:
                reasons.append(f"{control} control peak-inside "
                               f"{_rate_text(per_model[control], 'peak_inside_lesion')} >= {lesion_bar:.3f}")
            if row[f"{control}_cue_rate"] >= cue_bar:
                reasons.append(f"{control} control peak-on-cue "
                               f"{_rate_text(per_model[control], 'peak_on_cue')} >= {cue_bar:.3f}")
        row["passes"] = not reasons
        row["reason"] = "passes" if not reasons else "; ".join(reasons)
        rows.append(row)
    columns = ["method", "label", "passes", "lesion_rate", "lesion_chance", "cue_rate", "cue_chance",
               "untrained_lesion_rate", "untrained_cue_rate", "shuffled_lesion_rate",
               "shuffled_cue_rate", "n", "n_constant_lesion", "n_constant_shortcut",
               "n_constant_untrained", "n_constant_shuffled", "margin", "models_ok", "reason"]
    return pd.DataFrame(rows)[columns]


def run_gate(output_dir: str | Path, *, arch: str, settings: GateSettings,
             layer_name: str | None = None, top_fraction: float = 0.20, batch_size: int = 16
             ) -> dict:
    """Build, audit and judge the four gate models at ``arch``'s target layer.

    Writes the per-model audit tables under ``output_dir``. Returns a dict with ``gate``
    (``gate_table``), ``models`` (``build_gate_models`` facts), ``cases`` (case rows),
    ``layer`` (target layer name), ``settings`` (dict) and ``seconds``.
    """
    started = time.perf_counter()
    models, facts = build_gate_models(arch, settings)
    layer_name, _ = networks.resolve_target_layer(models["lesion"], arch, layer_name)
    pool = gate_pool(settings.pool_images, settings.image_size, settings.seed + 2)
    cases = audit_gate_models(models, pool, output_dir, arch=arch, layer_name=layer_name,
                              settings=settings, top_fraction=top_fraction, batch_size=batch_size)
    gate = gate_table(cases, facts, margin=settings.margin)
    return {"gate": gate, "models": facts, "cases": cases, "layer": layer_name,
            "settings": asdict(settings), "seconds": round(time.perf_counter() - started, 1)}


def failing_methods(gate: pd.DataFrame) -> list[str]:
    """CAM methods that fail the gate (in ``CAM_METHODS`` order); baselines are not listed."""
    verdict = gate.set_index("method")["passes"]
    return [m for m in CAM_METHODS if m in verdict.index and not bool(verdict[m])]


def read_gate_table(figures_dir: str | Path) -> pd.DataFrame | None:
    """``table_validity_gate.csv`` of a run, or None when the gate has not been run."""
    path = Path(figures_dir) / "table_validity_gate.csv"
    if not path.is_file():
        return None
    table = pd.read_csv(path)
    for column in ("method", "passes"):
        if column not in table.columns:
            raise ValueError(f"{path}: missing column {column!r}")
    table["passes"] = table["passes"].astype(str).str.lower() == "true"
    return table


def mark_table(table: pd.DataFrame, gate: pd.DataFrame | None, *, method_column: str = "method",
               label_column: str | None = "label") -> pd.DataFrame:
    """Copy of ``table`` with a ``validity_gate`` column and daggers on failing CAM labels.

    ``validity_gate`` per row: "passes" / "fails" for CAM methods, "reference" for other rows
    (baselines, random deletion), "not run" when ``gate`` is None. Failing CAM methods get
    ``DAGGER`` appended to ``label_column`` (when given and present); the footnote to print
    beside the table is ``GATE_FOOTNOTE``.
    """
    table = table.copy()
    methods = table[method_column].astype(str)
    if gate is None:
        table["validity_gate"] = np.where(methods.isin(CAM_METHODS), "not run", "reference")
        return table
    verdict = gate.set_index("method")["passes"]
    failing = set(failing_methods(gate))
    table["validity_gate"] = [("fails" if m in failing else "passes" if m in verdict.index else "not run")
                              if m in CAM_METHODS else "reference" for m in methods]
    if label_column and label_column in table.columns:
        table[label_column] = [f"{label}{DAGGER}" if m in failing else label
                               for label, m in zip(table[label_column], methods)]
    return table


# --- checkpoints that did not learn -------------------------------------------------------------

LEARNING_RULE = ("a checkpoint learned when its validation AUPRC is at least halfway from the "
                 "validation prevalence (an uninformative score) to 1: AUPRC >= prevalence + "
                 "0.5 x (1 - prevalence)")


def learning_status(val_auprc, prevalence: float) -> pd.Series:
    """bool per checkpoint: validation AUPRC >= prevalence + 0.5 * (1 - prevalence).

    The AUPRC of a score that carries no information equals the positive prevalence; halfway
    to a perfect 1 is far outside the spread of an uninformative score on the validation split
    (the shuffled-label control lands near the prevalence) and still well below what a trained
    detector reaches. ``prevalence`` in (0, 1).
    """
    if not 0 < prevalence < 1:
        raise ValueError(f"validation prevalence must be in (0, 1); got {prevalence}")
    values = pd.Series(val_auprc, dtype=float)
    return values >= prevalence + 0.5 * (1.0 - prevalence)


def learning_table(registry: pd.DataFrame, manifest: pd.DataFrame) -> pd.DataFrame:
    """Registry rows with ``val_prevalence``, ``learning_threshold`` and ``learned`` added.

    ``registry``: checkpoints/registry.csv (checkpoint_id, arch, seed, control, val_auprc);
    ``manifest``: the run's manifest (prevalence from its ``val`` rows).
    """
    val = manifest[manifest["role"] == "val"]
    if val.empty:
        raise ValueError("the manifest has no validation rows: cannot judge learning")
    prevalence = float(val["target"].mean())
    table = registry[["checkpoint_id", "arch", "seed", "control", "val_auprc"]].copy()
    table["val_prevalence"] = prevalence
    table["learning_threshold"] = prevalence + 0.5 * (1.0 - prevalence)
    table["learned"] = learning_status(table["val_auprc"].to_numpy(), prevalence).to_numpy()
    return table


def bootstrap_rate_ci(values, replicates: int = 2000, seed: int = stats.BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile CI of a 0/1 rate over defined values (NaN dropped); (NaN, NaN) when empty."""
    array = np.asarray(values, dtype=float)
    array = array[~np.isnan(array)]
    if array.size == 0:
        return np.nan, np.nan
    result = stats.bootstrap_mean_ci(array, replicates=replicates, seed=seed)
    return result["ci_low"], result["ci_high"]


# --- resolution sensitivity ---------------------------------------------------------------------

def resolution_audit(run_dir: str | Path, data_root: str | Path, checkpoint_id: str, *,
                     native_size: int, check_size: int, top_fraction: float = 0.20,
                     repetitions: int = 1, batch_size: int = 16, device: str = "cpu") -> dict:
    """Audit a registered checkpoint (trained at ``native_size``) at another input size.

    The same weights and temperature see every masked pool image resized to ``check_size``;
    the target layer's grid grows with the input (e.g. 4x4 -> 8x8 at 2x). Tables go to
    ``<run_dir>/audit/hyperkvasir_<check_size>px/``. Returns ``audit.audit_checkpoint``'s
    summary plus ``dataset``.
    """
    run_dir = Path(run_dir)
    dataset = f"hyperkvasir_{check_size}px"
    model, metadata = audit.load_registered_model(run_dir, checkpoint_id, native_size, device)
    temperature = audit.checkpoint_temperature(run_dir / "calibration" / "temperatures.csv", checkpoint_id)
    pool = audit.masked_pool(load_manifest(run_dir / "manifest" / "manifest.csv"))
    paths = audit.audit_paths(run_dir, dataset, checkpoint_id)
    summary = audit.audit_checkpoint(
        model, metadata, temperature, audit.manifest_cases(pool, data_root), dataset=dataset,
        image_size=check_size, table_path=paths["table"], random_deletion_path=paths["random_deletion"],
        top_fraction=top_fraction, repetitions=repetitions, batch_size=batch_size, device=device,
        total=len(pool))
    return {**summary, "dataset": dataset}


def resolution_table(tables: dict[int, tuple[pd.DataFrame, pd.DataFrame]], sample_ids, *,
                     replicates: int = stats.SPATIAL_REPLICATES,
                     seed: int = stats.BOOTSTRAP_SEED) -> pd.DataFrame:
    """Table 4 panel A of one checkpoint at several input sizes, on one fixed image set.

    ``tables``: input size -> (audit rows, random-deletion rows); ``sample_ids``: the images
    (e.g. the native-size high-score set, so only the input size changes). Rows: size, grid,
    then ``summaries.panel_summary`` columns.
    """
    frames = []
    for size, (table, random_deletion) in sorted(tables.items()):
        ids = [s for s in sample_ids if s in set(table["sample_id"])]
        frame = summaries.panel_summary(table, random_deletion, ids, replicates, seed)
        grid = f"{int(table['feature_grid_height'].iloc[0])}x{int(table['feature_grid_width'].iloc[0])}"
        frame.insert(0, "grid", grid)
        frame.insert(0, "input_size", size)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def mark_display_labels(table: pd.DataFrame, gate: pd.DataFrame | None) -> pd.DataFrame:
    """Copy of a formatted table with ``DAGGER`` after every cell that is exactly the display
    label of a CAM method failing the gate (e.g. "XGrad-CAM" -> "XGrad-CAM†"), in any text
    column; for final tables whose method names are already display labels."""
    table = table.copy()
    if gate is None:
        return table
    labels = {method_label(m): f"{method_label(m)}{DAGGER}" for m in failing_methods(gate)}
    for column in table.columns:
        if pd.api.types.is_object_dtype(table[column]) or pd.api.types.is_string_dtype(table[column]):
            table[column] = table[column].map(lambda v: labels.get(v, v) if isinstance(v, str) else v)
    return table
