"""The validity gate: can each CAM method find planted truth in the audited pipeline?

Per replicate seed, models of the primary's architecture on planted frames (``GATE_MODELS``:
a lesion and a shortcut model, a shuffled-label control and several untrained initialisations,
each on its own seed), audited on one pool of frames with a polyp and a separate cue (the polyp
is the audit mask). A method's rate is an expectation over model draws: the mean of the
replicates' rates with a Student t interval over them (``stats.draw_mean_interval``); against
chance, the centre and salience baselines and the controls it "passes", "fails" or is
"inconclusive" (``gate_table``). Method: docs/statistics_and_gate.md, "Validity gate".
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from endoexplain_core.analysis import audit, audit_schema, stats
from endoexplain_core import artefacts, config
from endoexplain_core.data import roles, synthetic
from endoexplain_core.data.datasets import to_normalised_tensor
from endoexplain_core.kernels import grid
from endoexplain_core.methods import CAM_METHODS, MAP_METHODS, method_label
from endoexplain_core.marks import NOT_VALIDATED_MARK
from endoexplain_core.models import networks, training
from endoexplain_core.numerics import resolve_device
from endoexplain_core.progress import progress_bar

GATE_MODELS = ("lesion", "shortcut", "untrained", "shuffled")
CONTROL_MODELS = ("untrained", "shuffled")
GATE_DATASET = "validity_gate"
DAGGER = NOT_VALIDATED_MARK
VERDICTS = ("passes", "fails", "inconclusive")
# What one new model draw may show: the central 80% of draws (``stats.draw_prediction_interval``).
PREDICTION_LEVEL = 0.80

CUE_COLOUR = synthetic.DYE           # the cue is a blue dye blob, as in dyed-lifted frames
CUE_RADIUS = (0.20, 0.26)           # cue radius range, frame units (1 = half the shorter side)
CUE_CLEARANCE = 0.08                # minimum gap between cue and polyp, frame units
# Planted polyps keep the study's area distribution but are spread over the whole field of
# view (centre offset sd, in units of the side; docs/architecture.md, "Audit validity").
GATE_LESION_OFFSET_SD = 0.35


@dataclass(frozen=True)
class GateSettings:
    """The gate's settings: the profile's ``stages.03_validity_gate`` section, passed whole, with
    the primary's input size and memory format and the study's fixed recipe.

    section: ``config.ValidityGateSettings`` (frames, steps, pass rule, replicate seeds; field
    descriptions there). image_size: frame and model input side in pixels (the primary's).
    channels_last: the optimiser steps run in channels_last memory format
    (``training.optimiser_memory_format``; the trained model is returned contiguous).
    weight_decay, label_smoothing: AdamW and loss of the recipe (not profile keys). level:
    confidence of the Wilson intervals. batchnorm_recalibration_images: training frames behind
    the eval-mode BatchNorm statistics (``training.recalibrate_batchnorm``).
    """

    section: config.ValidityGateSettings
    image_size: int
    channels_last: bool
    weight_decay: float = 0.05
    label_smoothing: float = 0.03
    level: float = stats.CONFIDENCE_LEVEL
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

    The polyp is fully conspicuous (``conspicuity=1``), placed anywhere in the field
    (``GATE_LESION_OFFSET_SD``); no dye cushion, no position box, so the cue is the only blue
    structure. Masks are all False when the finding is absent.
    """
    image, lesion_mask = synthetic.render_frame(rng, size, lesion=lesion, conspicuity=1.0,
                                                lesion_offset_sd=GATE_LESION_OFFSET_SD)
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
    rng = roles.stream(seed, f"validity_gate/{task}/{size}")
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
    rng = roles.stream(seed, f"validity_gate/pool/{size}")
    pool = []
    for i in range(n_images):
        image, lesion_mask, cue_mask = planted_frame(rng, size, lesion=True, cue=True)
        pool.append({"sample_id": f"gate_{seed}_{i:04d}", "image": image,
                     "lesion_mask": lesion_mask, "cue_mask": cue_mask})
    return pool


# --- models -----------------------------------------------------------------------------------

def _normalise(batch: torch.Tensor) -> torch.Tensor:
    """uint8 (B, 3, S, S) -> normalised float32 (ImageNet mean/std, as every model input)."""
    return torch.stack([to_normalised_tensor(image.permute(1, 2, 0).numpy()) for image in batch])


def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
             batch_size: int) -> float:
    """Share of ``images`` (uint8 (n, 3, S, S)) whose argmax logit equals ``labels``."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(labels), batch_size):
            logits = model(_normalise(images[start:start + batch_size]))
            correct += int((logits.argmax(dim=1) == labels[start:start + batch_size]).sum())
    return correct / len(labels)


def initial_gate_model(arch: str, seed: int,
                       init_state: dict[str, torch.Tensor] | None = None) -> nn.Module:
    """A gate model before training: ``arch`` on ``seed`` (``training.seed_everything``) or, with
    ``init_state`` (a 2-class state dict of ``arch``, loaded strictly), those weights; either way
    with the zero-initialised head of the study's recipe, so a fine-tuned model learns its
    planted task from the same start of the head as one trained from scratch."""
    training.seed_everything(seed)
    model = networks.build_model(arch)
    if init_state is not None:
        model.load_state_dict(init_state, strict=True)
    training.zero_init_head(model)
    return model


def gate_optimiser(model: nn.Module, settings: GateSettings):
    """(optimiser, scheduler, loss function) of the gate's recipe: AdamW at the section's
    learning rate, linear warm-up then cosine decay over ``steps``, label-smoothed
    cross-entropy."""
    optimiser = torch.optim.AdamW(model.parameters(), lr=settings.section.learning_rate,
                                  weight_decay=settings.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimiser, training.cosine_with_warmup(settings.section.warmup_steps, settings.section.steps))
    return optimiser, scheduler, nn.CrossEntropyLoss(label_smoothing=settings.label_smoothing)


def gate_training_step(model: nn.Module, recipe, inputs: torch.Tensor, labels: torch.Tensor,
                       flips: torch.Tensor, *, arch: str, channels_last: bool,
                       device: torch.device) -> float:
    """One optimiser step of the gate's recipe on one batch; returns the loss.

    ``recipe``: ``gate_optimiser``'s triple; ``inputs``: normalised float32 (B, 3, S, S) on the
    CPU; ``labels``: int64 (B,); ``flips``: bool (2,), horizontal / vertical flip of the whole
    batch. A non-finite loss raises ``training.NonFiniteLossError`` before the step.
    """
    optimiser, scheduler, loss_function = recipe
    if flips[0]:
        inputs = inputs.flip(-1)
    if flips[1]:
        inputs = inputs.flip(-2)
    loss = loss_function(model(training.to_device(inputs, device, channels_last)), labels.to(device))
    if not torch.isfinite(loss):
        raise training.NonFiniteLossError(f"validity-gate model ({arch}) loss became "
                                          f"{loss.item()}; lower the gate learning rate")
    optimiser.zero_grad(set_to_none=True)
    loss.backward()
    optimiser.step()
    scheduler.step()
    return float(loss.detach())


def train_gate_model(arch: str, images: torch.Tensor, labels: torch.Tensor,
                     settings: GateSettings, seed: int, *,
                     init_state: dict[str, torch.Tensor] | None = None,
                     device: torch.device = torch.device("cpu")) -> nn.Module:
    """Train ``arch`` on planted frames; return it in eval mode, on the CPU.

    The study's recipe (zero-initialised head, AdamW, linear warm-up then cosine decay,
    label-smoothed cross-entropy: ``gate_training_step``), ``settings.section.steps`` optimiser
    steps of ``batch_size`` frames drawn without replacement per pass (seeded). Random flips keep
    the position of the planted evidence from being learnt as a fixed location. From scratch, or
    with ``init_state`` fine-tuned from those weights (``initial_gate_model``). ``device``: where
    the steps run (default the CPU, with deterministic kernels).
    """
    model = initial_gate_model(arch, seed, init_state).to(device)
    recipe = gate_optimiser(model, settings)
    generator = torch.Generator().manual_seed(seed)
    order = torch.empty(0, dtype=torch.int64)
    model.train()
    with (training.deterministic_algorithms(device),
          training.optimiser_memory_format(model, settings.channels_last)):
        # the gate trains nine such models: a bar per model says where a 15-minute stage is
        for _ in progress_bar(range(settings.section.steps), desc=f"gate model {arch} (seed {seed})", unit="step"):
            if len(order) < settings.section.batch_size:
                order = torch.cat([order, torch.randperm(len(labels), generator=generator)])
            batch, order = order[:settings.section.batch_size], order[settings.section.batch_size:]
            flips = torch.rand(2, generator=generator) < 0.5
            gate_training_step(model, recipe, _normalise(images[batch]), labels[batch], flips,
                               arch=arch, channels_last=settings.channels_last, device=device)
    with training.deterministic_algorithms(device):
        # Eval-mode BatchNorm statistics of the final weights (as in 01_training): the moving
        # averages of a few hundred steps from scratch still describe earlier weights.
        count = settings.batchnorm_recalibration_images
        training.recalibrate_batchnorm(
            model, ((_normalise(images[start:start + settings.section.batch_size]), None, None)
                    for start in range(0, min(count, len(labels)), settings.section.batch_size)),
            count, device)
    return model.cpu().eval()


def time_training_step(arch: str, settings: GateSettings, *,
                       init_state: dict[str, torch.Tensor] | None = None,
                       device: torch.device = torch.device("cpu")) -> float:
    """Seconds of one optimiser step of ``train_gate_model``'s recipe on one batch of planted
    lesion frames at ``settings.image_size`` (the first replicate's seed: a timing, not a
    result), after one untimed step (the first step also pays
    for allocations and kernel selection). What ``endoexplain gate`` multiplies into its
    estimate before the work starts."""
    seed = settings.section.replicate_seeds[0]
    images, labels = task_frames("lesion", settings.section.batch_size, settings.image_size, seed)
    model = initial_gate_model(arch, seed, init_state).to(device).train()
    recipe = gate_optimiser(model, settings)
    inputs, no_flip = _normalise(images), torch.zeros(2, dtype=torch.bool)
    with (training.deterministic_algorithms(device),
          training.optimiser_memory_format(model, settings.channels_last)):
        timings = []
        for _ in range(2):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            started = time.perf_counter()
            gate_training_step(model, recipe, inputs, labels, no_flip, arch=arch,
                               channels_last=settings.channels_last, device=device)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            timings.append(time.perf_counter() - started)
    return timings[-1]


def untrained_seed(replicate_seed: int, draw: int) -> int:
    """Seed of untrained initialisation ``draw`` (1, 2, ...) of a replicate: derived from both by
    SHA-256 (``roles.stream``), so it never equals a trained model's seed."""
    return int(roles.stream(replicate_seed, f"validity-gate/untrained/{draw}").integers(0, 2 ** 31 - 1))


def control_accuracy_rule(held_out_accuracy: float, max_control_accuracy: float) -> tuple[str, bool]:
    """(rule text, met) of the shuffled-label control: its held-out accuracy on the lesion task
    must stay within ``1 - max_control_accuracy`` .. ``max_control_accuracy`` of the balanced
    frames. Two-sided: a control far *below* chance has learned the lesion with its sign
    inverted (ResNet-18 at 128 px, replicate 3: 0.10), and its maps follow the lesion as a
    trained model's would, so it is no control."""
    low = 1.0 - max_control_accuracy
    met = low - 1e-12 <= held_out_accuracy <= max_control_accuracy + 1e-12
    return f"{low:.2f}-{max_control_accuracy:.2f}", bool(met)


def build_gate_models(arch: str, settings: GateSettings, seed: int,
                      shared_control: tuple[nn.Module, int] | None = None, *, batch_size: int,
                      init_state: dict[str, torch.Tensor] | None = None,
                      device: torch.device = torch.device("cpu")
                      ) -> tuple[dict[str, nn.Module], pd.DataFrame]:
    """The gate models of one replicate (``seed``) and a table of their training facts
    (accuracies measured ``batch_size`` frames per forward pass): lesion, shortcut, shuffled,
    and ``settings.section.untrained_initialisations`` untrained networks named
    ``untrained_1``, ``untrained_2``, ... (each initialised on ``untrained_seed``).

    ``shared_control``: (shuffled-label model, the seed it was trained with) to reuse instead of
    training this replicate's own (the profile's ``shuffled_control_per_replicate`` off); its
    held-out accuracy is still measured on this replicate's frames, its training accuracy is
    NaN (these training frames are not its own).

    ``init_state``: a 2-class state dict of ``arch`` the trained models (lesion, shortcut and the
    shuffled control, so that the control differs from the lesion model only in its labels) are
    fine-tuned from (``train_gate_model``); the untrained networks stay random initialisations.
    None: every model from scratch. ``device``: where the optimiser steps run.

    Returns ({model name: model}, DataFrame with columns gate_seed, model (the kind:
    ``GATE_MODELS``), draw (the untrained initialisation's number, 0 for the others), task,
    labels, steps, trained_with_seed, train_accuracy, held_out_accuracy, accuracy_required,
    accuracy_ok, seconds). ``task`` is the frames the model is evaluated on (the lesion task for the
    controls); ``accuracy_ok`` applies the gate's accuracy rule (trained models learn, the
    shuffled control does not; the untrained model has no requirement).
    """
    data = {task: task_frames(task, settings.section.train_images, settings.image_size, seed)
            for task in ("lesion", "shortcut")}
    held_out = {task: task_frames(task, settings.section.val_images, settings.image_size, seed + 1)
                for task in ("lesion", "shortcut")}
    shuffled = torch.from_numpy(training.shuffled_targets(data["lesion"][1].numpy(), seed))
    recipes = {"lesion": ("lesion", data["lesion"][1], "planted lesion"),
               "shortcut": ("shortcut", data["shortcut"][1], "planted cue"),
               "shuffled": ("lesion", shuffled, "permuted lesion labels")}
    models, rows = {}, []
    draws = [(name, 0) for name in GATE_MODELS if name != "untrained"]
    draws += [("untrained", draw) for draw in range(1, settings.section.untrained_initialisations + 1)]
    for name, draw in draws:
        started = time.perf_counter()
        trained_with, steps = seed, settings.section.steps
        if name == "untrained":
            trained_with = untrained_seed(seed, draw)
            training.seed_everything(trained_with)
            model, task, label_text = networks.build_model(arch).eval(), "lesion", "none (random weights)"
            steps = 0
        elif name == "shuffled" and shared_control is not None:
            (model, trained_with), (task, _, label_text) = shared_control, recipes[name]
        else:
            task, labels, label_text = recipes[name]
            model = train_gate_model(arch, data[task][0], labels, settings, seed,
                                     init_state=init_state, device=device)
        own_frames = trained_with == seed or name == "untrained"
        train_acc = (accuracy(model, data[task][0], recipes.get(name, (task, data[task][1]))[1],
                              batch_size=batch_size) if own_frames else float("nan"))
        held_acc = accuracy(model, *held_out[task], batch_size=batch_size)
        if name in ("lesion", "shortcut"):
            required, ok = f">= {settings.section.min_accuracy:.2f}", held_acc >= settings.section.min_accuracy
        elif name == "shuffled":
            required, ok = control_accuracy_rule(held_acc, settings.section.max_control_accuracy)
        else:
            required, ok = "none", True
        models[model_name(name, draw)] = model
        rows.append({"gate_seed": seed, "model": name, "draw": draw, "task": task,
                     "labels": label_text, "steps": steps,
                     "trained_with_seed": trained_with,
                     "train_accuracy": train_acc, "held_out_accuracy": held_acc,
                     "accuracy_required": required, "accuracy_ok": bool(ok),
                     "seconds": round(time.perf_counter() - started, 1)})
    return models, pd.DataFrame(rows)


def model_name(kind: str, draw: int) -> str:
    """A gate model's name: its kind, and for an untrained draw its number (``untrained_2``)."""
    return f"{kind}_{draw}" if draw else kind


def model_kind(name: str) -> str:
    """The kind (``GATE_MODELS``) of a gate model's name (``untrained_2`` -> ``untrained``)."""
    return name.split("_")[0]


# --- audit and rates --------------------------------------------------------------------------

def audit_gate_models(models: dict[str, nn.Module], pool: list[dict], output_dir: str | Path, *,
                      arch: str, layer_name: str, settings: GateSettings, seed: int,
                      top_fraction: float, batch_size: int, device: str = "cpu") -> pd.DataFrame:
    """Audit every gate model of replicate ``seed`` on its pool; return case rows with the cue
    columns added.

    Each model's audit table goes to ``<output_dir>/gate_<name>.parquet``. Added columns:
    ``gate_seed``, ``model`` (the kind), ``draw`` (untrained initialisation, else 0),
    ``peak_defined`` (not a constant map), ``peak_inside_lesion`` and
    ``peak_on_cue`` (float 1/0; 0 for a constant map), ``cue_area_fraction``, and the
    resolution ceilings ``lesion_node_inside`` / ``cue_node_inside`` at the layer's CAM grid.
    ``device``: where the maps are computed (``audit.audit_checkpoint``).
    """
    output_dir = Path(output_dir)
    cue_masks = {case["sample_id"]: case["cue_mask"] for case in pool}
    cases = [(case["sample_id"], case["image"], case["lesion_mask"]) for case in pool]
    grid_shape = networks.cam_grid_shape(models["lesion"], layer_name, settings.image_size)
    lesion_ceiling = grid.nearest_node_inside(np.stack([case["lesion_mask"] for case in pool]), grid_shape)
    cue_ceiling = grid.nearest_node_inside(np.stack([case["cue_mask"] for case in pool]), grid_shape)
    ceilings = {case["sample_id"]: (bool(on_lesion), bool(on_cue))
                for case, on_lesion, on_cue in zip(pool, lesion_ceiling, cue_ceiling)}
    tables = []
    for name, model in models.items():
        checkpoint_id = f"gate_{name}"
        audit.audit_checkpoint(
            model, {"checkpoint_id": checkpoint_id, "arch": arch, "seed": seed,
                    "control": model_kind(name), "target_layer": layer_name},
            1.0, cases, dataset=GATE_DATASET, image_size=settings.image_size,
            table_path=output_dir / f"{checkpoint_id}.parquet",
            random_deletion_path=output_dir / f"{checkpoint_id}_random_deletion.parquet",
            top_fraction=top_fraction, repetitions=settings.section.random_deletion_repetitions,
            batch_size=batch_size, device=device, total=len(cases))
        model.cpu()   # the next model's audit needs the device memory, not this one
        table = audit_schema.read_audit_table(output_dir / f"{checkpoint_id}.parquet")
        draw = int(name.split("_")[1]) if "_" in name else 0
        tables.append(table.assign(gate_seed=seed, model=model_kind(name), draw=draw))
    rows = pd.concat(tables, ignore_index=True)
    return add_cue_columns(rows, cue_masks, ceilings)


def add_cue_columns(rows: pd.DataFrame, cue_masks: dict[str, np.ndarray],
                    ceilings: dict[str, tuple[bool, bool]] | None = None) -> pd.DataFrame:
    """Add ``peak_defined``, ``peak_inside_lesion``, ``peak_on_cue`` and ``cue_area_fraction``,
    and with ``ceilings`` the resolution-ceiling columns ``lesion_node_inside`` and
    ``cue_node_inside``.

    ``rows``: audit case rows (peak_row, peak_col, peak_outside_mask, constant_map,
    sample_id); ``cue_masks``: sample_id -> bool (S, S) at the audited size; ``ceilings``:
    sample_id -> (the CAM-grid node nearest the lesion centroid lies in the lesion, the same
    for the cue) (``kernels.grid.nearest_node_inside``).
    """
    rows = rows.copy()
    if ceilings is not None:
        rows["lesion_node_inside"] = rows["sample_id"].map({s: float(c[0]) for s, c in ceilings.items()})
        rows["cue_node_inside"] = rows["sample_id"].map({s: float(c[1]) for s, c in ceilings.items()})
    defined = ~rows["constant_map"].astype(bool)
    on_cue = np.array([bool(cue_masks[s][r, c]) for s, r, c in
                       zip(rows["sample_id"], rows["peak_row"], rows["peak_col"])])
    rows["peak_defined"] = defined
    # One denominator rule with Table 4: a constant map has no peak on anything, so it is a miss.
    rows["peak_inside_lesion"] = np.where(defined, (~rows["peak_outside_mask"].astype(bool)).astype(float), 0.0)
    rows["peak_on_cue"] = np.where(defined, on_cue.astype(float), 0.0)
    rows["cue_area_fraction"] = rows["sample_id"].map({s: float(m.mean()) for s, m in cue_masks.items()})
    return rows


def _count(rows: pd.DataFrame, column: str) -> tuple[int, int, int]:
    """(hits, n maps, n constant maps) of a 0/1 column (a constant map is a 0 there)."""
    values = rows[column]
    counted = values.notna()
    constant = int((~rows["peak_defined"].astype(bool)).sum()) if "peak_defined" in rows else 0
    return int(values[counted].sum()), int(counted.sum()), constant


def _replicate_counts(rows: pd.DataFrame, column: str) -> tuple[list[int], list[int]]:
    """(hits, maps) of a 0/1 column per gate replicate (``gate_seed``), in seed order."""
    hits, maps = [], []
    for _, of_seed in rows.groupby("gate_seed", sort=True):
        seed_hits, seed_maps, _ = _count(of_seed, column)
        hits.append(seed_hits)
        maps.append(seed_maps)
    return hits, maps


def _replicate_rates(hits: list[int], maps: list[int]) -> list[float]:
    """One rate per replicate draw (replicates without a map are left out)."""
    return [h / m for h, m in zip(hits, maps) if m]


def _rate_text(rate: float, low: float, high: float, rates: list[float], n_maps: int) -> str:
    """A rate over draws for the reason column: "0.625 (mean of 3 draws: 0.50, 0.62, 0.75;
    95% CI 0.41-0.84; 144 maps)", so a verdict carried by a few draws shows as such."""
    if not rates:
        return f"undefined (no maps of {n_maps} with a rate)"
    draws = ", ".join(f"{r:.2f}" for r in rates)
    interval = f"95% CI {low:.3f}-{high:.3f}" if np.isfinite(low) else "no interval with one draw"
    return f"{rate:.3f} (mean of {len(rates)} draw{'s' * (len(rates) > 1)}: {draws}; {interval}; {n_maps} maps)"


def usable_replicates(model_facts: pd.DataFrame) -> list[int]:
    """Gate seeds whose four models all met their accuracy rule (``accuracy_ok``)."""
    facts = _with_seed(model_facts)
    ok = facts.groupby("gate_seed")["accuracy_ok"].all()
    return [int(seed) for seed, passed in ok.items() if bool(passed)]


def _with_seed(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with a ``gate_seed`` column (0 for a one-replicate table without it)."""
    return table if "gate_seed" in table.columns else table.assign(gate_seed=0)


@artefacts.computed_by
def gate_table(case_rows: pd.DataFrame, model_facts: pd.DataFrame, *, margin: float,
               level: float = stats.CONFIDENCE_LEVEL, methods=MAP_METHODS) -> pd.DataFrame:
    """Per map method: its expected rates over model draws with intervals that see the draws,
    chance levels, bars and the verdict.

    ``case_rows``: ``add_cue_columns`` output for the gate models (columns ``model`` = kind,
    ``gate_seed``; several untrained draws per replicate are pooled within it);
    ``model_facts``: ``build_gate_models`` tables (``gate_seed``, ``model``, ``accuracy_ok``).
    Replicates whose models met their accuracy rules are used (``usable_replicates``; with
    none, all are shown and every verdict is "inconclusive"). Each of the six clauses (lesion
    and shortcut models on their targets, each control on both) reads the mean of the used
    replicates' rates with ``stats.draw_mean_interval``; "passes" needs every clause on its
    side at ``level``, "fails" needs one clause on the wrong side at the Bonferroni level over
    the six clauses; otherwise "inconclusive" (fewer than two used replicates always are).
    Columns: ``GATE_COLUMNS``; ``*_sd``: between-draw SD; ``n``: maps per model kind;
    ``centre_*_rate`` / ``salience_*_rate``: the centre and salience baselines' rates on the
    same frames (both part of the bars, ``_method_rates``); ``*_bar_set_by``: which term of
    the bar is the largest ("chance + margin", "centre baseline" or "salience baseline"), also
    named in the reason; ``*_ceiling``: the resolution ceiling (``kernels.grid``). Per clause
    detail: ``gate_clause_table``.
    """
    rows = []
    for method, of_method, meta in _by_method(case_rows, model_facts, margin, methods):
        row, bars = meta["row"], meta["bars"]
        clauses = [_clause(of_method, model, target, column, bars[target], level)
                   for model, target, column, _ in _GATE_CHECKS]
        for clause, (model, target, _, _) in zip(clauses, _GATE_CHECKS):
            clause["bar_set_by"] = row[f"{target}_bar_set_by"]   # named in the reason
            prefix = _prefix(model, target)
            row.update({f"{prefix}_rate": clause["mean"], f"{prefix}_ci_low": clause["low"],
                        f"{prefix}_ci_high": clause["high"], f"{prefix}_sd": clause["sd"]})
        for model in GATE_MODELS:
            row[f"n_constant_{model}"] = int((~of_method.loc[of_method["model"] == model, "peak_defined"]
                                              .astype(bool)).sum())
        verdict, reasons = _verdict(clauses, meta["unusable"], len(meta["usable"]))
        row.update(verdict=verdict, passes=verdict == "passes", reason="; ".join(reasons))
        rows.append(row)
    return pd.DataFrame(rows)[GATE_COLUMNS]


@artefacts.computed_by
def gate_clause_table(case_rows: pd.DataFrame, model_facts: pd.DataFrame, *, margin: float,
                      level: float = stats.CONFIDENCE_LEVEL, methods=MAP_METHODS) -> pd.DataFrame:
    """One row per method and clause: what each of the gate's six tests rests on.

    Columns: method, label, clause (e.g. "lesion model peak-inside"), model, target, bar, side
    (">=" for a trained model, "<" for a control: where the rate must lie), replicates_used,
    replicates_excluded, rate (mean over draws), ci_low, ci_high (``level``), strict_low,
    strict_high (Bonferroni over the six clauses, read for "fails"), between_draw_sd,
    draws_right_side (replicates whose own rate lies on the required side), draws_right_low,
    draws_right_high (Clopper-Pearson), prediction_low, prediction_high (one new draw,
    ``PREDICTION_LEVEL``), n_maps, decides ("pass side", "fail side" or "open").
    """
    rows = []
    for method, of_method, meta in _by_method(case_rows, model_facts, margin, methods):
        for model, target, column, text in _GATE_CHECKS:
            clause = _clause(of_method, model, target, column, meta["bars"][target], level)
            right_low, right_high = stats.clopper_pearson_interval(clause["draws_right"], clause["k"])
            rows.append({"method": method, "label": method_label(method), "clause": text,
                         "model": model, "target": target, "bar": meta["bars"][target],
                         "side": "<" if model in CONTROL_MODELS else ">=",
                         "replicates_used": len(meta["usable"]),
                         "replicates_excluded": meta["n_replicates"] - len(meta["usable"]),
                         "rate": clause["mean"], "ci_low": clause["low"], "ci_high": clause["high"],
                         "strict_low": clause["strict_low"], "strict_high": clause["strict_high"],
                         "between_draw_sd": clause["sd"], "draws_right_side": clause["draws_right"],
                         "draws_right_low": right_low, "draws_right_high": right_high,
                         "prediction_low": clause["prediction"][0],
                         "prediction_high": clause["prediction"][1],
                         "n_maps": clause["n_maps"], "decides": clause["decides"]})
    return pd.DataFrame(rows)


def _by_method(case_rows: pd.DataFrame, model_facts: pd.DataFrame, margin: float, methods):
    """Yield (method, its case rows over the used replicates, facts): the shared part of
    ``gate_table`` and ``gate_clause_table``; facts hold the partial gate row, the bars, the
    used and unusable replicates."""
    case_rows, model_facts = _with_seed(case_rows), _with_seed(model_facts)
    missing = sorted(set(GATE_MODELS) - set(case_rows["model"]))
    if missing:
        raise ValueError(f"gate case rows lack models {missing}")
    n_replicates = len({int(seed) for seed in model_facts["gate_seed"].unique()})
    usable = usable_replicates(model_facts)
    unusable = model_facts[~model_facts["accuracy_ok"].astype(bool)]
    # The used replicates; with none, all of them (shown, but never a verdict).
    used = case_rows[case_rows["gate_seed"].isin(usable)] if usable else case_rows
    references = {method: _baseline_rates(used, method) for method in BAR_BASELINES}
    for method in methods:
        if case_rows[case_rows["method"] == method].empty:
            continue
        of_method = used[used["method"] == method]
        row, bars = _method_rates({m: of_method[of_method["model"] == m] for m in GATE_MODELS},
                                  references, margin)
        row.update(method=method, label=method_label(method), n_replicates=n_replicates,
                   replicates_used=len(usable), replicates_excluded=n_replicates - len(usable),
                   untrained_initialisations=int(of_method.loc[of_method["model"] == "untrained", "draw"]
                                                 .nunique()) if "draw" in of_method else 1,
                   models_ok=bool(usable))
        yield method, of_method, {"row": row, "bars": bars, "usable": usable, "unusable": unusable,
                                  "n_replicates": n_replicates}


def _prefix(model: str, target: str) -> str:
    """Column prefix of a clause: "lesion" / "cue" for the trained models, "<control>_<target>"."""
    return target if model in ("lesion", "shortcut") else f"{model}_{target}"


def _clause(rows: pd.DataFrame, model: str, target: str, column: str, bar: float,
            level: float) -> dict:
    """One clause of the gate for one method: the model's rates over the replicate draws and
    which side of ``bar`` they decide. "pass side": the ``level`` interval lies on the required
    side (a trained model's lower bound >= bar, a control's upper bound < bar); "fail side": the
    Bonferroni interval (``level`` corrected over the six clauses) lies wholly on the other
    side; "open" otherwise, and always with fewer than two draws."""
    hits, maps = _replicate_counts(rows[rows["model"] == model], column)
    rates = _replicate_rates(hits, maps)
    decide = stats.draw_mean_interval(rates, sum(maps), level)
    strict = stats.draw_mean_interval(rates, sum(maps), 1 - (1 - level) / len(_GATE_CHECKS))
    control = model in CONTROL_MODELS
    if control:
        right = sum(r < bar for r in rates)
        decides = ("fail side" if strict["low"] >= bar else
                   "pass side" if decide["high"] < bar else "open")
    else:
        right = sum(r >= bar for r in rates)
        decides = ("fail side" if strict["high"] < bar else
                   "pass side" if decide["low"] >= bar else "open")
    return {**decide, "strict_low": strict["low"], "strict_high": strict["high"],
            "draws_right": int(right), "n_maps": int(sum(maps)), "rates": rates,
            "prediction": stats.draw_prediction_interval(rates, PREDICTION_LEVEL),
            "decides": decides, "bar": bar, "control": control}


def _method_rates(per_model: dict[str, pd.DataFrame], references: dict[str, dict[str, float]],
                  margin: float) -> tuple[dict, dict[str, float]]:
    """One method's chance levels, baseline rates, bars and ceilings (a partial gate row), and
    the bar per target ("lesion", "cue"). ``references``: ``BAR_BASELINES`` method -> its
    rates on the same frames (``_baseline_rates``)."""
    images = per_model["lesion"].groupby(["gate_seed", "sample_id"])
    lesion_chance = float(images["lesion_area_fraction"].first().mean())
    cue_chance = float(images["cue_area_fraction"].first().mean())
    # A method must clear chance by the margin and beat the centre and salience baselines on
    # the same frames: a map that only prefers the middle of the frame, or only follows what is
    # conspicuous in it whether or not the model uses it, is no evidence of either.
    terms = {target: {"chance + margin": chance + margin,
                      **{f"{method} baseline": rates[target] for method, rates in references.items()}}
             for target, chance in (("lesion", lesion_chance), ("cue", cue_chance))}
    bars = {target: max(values.values()) for target, values in terms.items()}
    set_by = {target: max(values, key=values.get) for target, values in terms.items()}
    row = {"n": len(per_model["lesion"]), "margin": margin,
           "lesion_chance": lesion_chance, "cue_chance": cue_chance,
           **{f"{method}_{target}_rate": rates[target] for method, rates in references.items()
              for target in ("lesion", "cue")},
           "lesion_bar": bars["lesion"], "cue_bar": bars["cue"],
           "lesion_bar_set_by": set_by["lesion"], "cue_bar_set_by": set_by["cue"],
           "lesion_ceiling": _ceiling(per_model["lesion"], "lesion_node_inside"),
           "cue_ceiling": _ceiling(per_model["lesion"], "cue_node_inside")}
    return row, bars


# (model, target, column, text) per rate the gate reads: the two planted models, then each
# control on both targets.
_GATE_CHECKS = [("lesion", "lesion", "peak_inside_lesion", "lesion model peak-inside"),
                ("shortcut", "cue", "peak_on_cue", "shortcut model peak-on-cue")]
_GATE_CHECKS += [(c, target, column, f"{c} control {text}") for c in CONTROL_MODELS
                 for target, column, text in (("lesion", "peak_inside_lesion", "peak-inside"),
                                              ("cue", "peak_on_cue", "peak-on-cue"))]


def _bar_text(clause: dict) -> str:
    """A clause's bar for the reason column, with the term that sets it when known: "0.383
    (salience baseline)" says that a method must beat salience, not only the centre."""
    source = clause.get("bar_set_by")
    return f"{clause['bar']:.3f}" + (f" ({source})" if source else "")


def _verdict(clauses: list[dict], unusable: pd.DataFrame, n_used: int) -> tuple[str, list[str]]:
    """The verdict and one plain reason per deciding clause (``_clause`` results, in
    ``_GATE_CHECKS`` order): any clause on the fail side fails the method; all six on the pass
    side pass it; otherwise inconclusive, naming the open clauses. No replicate usable, or fewer
    than two: inconclusive, saying why."""
    if n_used == 0:
        return "inconclusive", ["no gate replicate met the accuracy rules: " + ", ".join(
            f"{r['model']} (seed {r['gate_seed']}"
            + (f", held-out accuracy {r['held_out_accuracy']:.2f}, required {r['accuracy_required']}"
               if "held_out_accuracy" in r else "") + ")" for _, r in unusable.iterrows())]
    if n_used < 2:
        return "inconclusive", ["one usable replicate: the spread between model draws cannot be "
                                "estimated, so no interval over draws exists (run at least two)"]
    failing, open_reasons = [], []
    for clause, (_, _, _, text) in zip(clauses, _GATE_CHECKS):
        described = f"{text} {_rate_text(clause['mean'], clause['low'], clause['high'], clause['rates'], clause['n_maps'])}"
        if clause["decides"] == "fail side":
            bound = "lower" if clause["control"] else "upper"
            value = clause["strict_low"] if clause["control"] else clause["strict_high"]
            relation = "clears" if clause["control"] else "below"
            failing.append(f"{described}: {bound} bound {value:.3f} (Bonferroni over "
                           f"{len(_GATE_CHECKS)} tests) {relation} the bar {_bar_text(clause)}")
        elif clause["decides"] == "open":
            open_reasons.append(f"{described}: interval straddles the bar {_bar_text(clause)}")
    if failing:
        return "fails", failing
    if open_reasons:
        return "inconclusive", open_reasons
    return "passes", ["passes"]


_RATE_PREFIXES = ("lesion", "cue", *(f"{c}_{t}" for c in CONTROL_MODELS for t in ("lesion", "cue")))
GATE_COLUMNS = (["method", "label", "verdict", "passes", "lesion_rate", "lesion_ci_low",
                 "lesion_ci_high", "lesion_chance", "centre_lesion_rate",
                 "salience_lesion_rate", "lesion_bar", "lesion_bar_set_by",
                 "lesion_ceiling", "cue_rate", "cue_ci_low", "cue_ci_high", "cue_chance",
                 "centre_cue_rate", "salience_cue_rate", "cue_bar", "cue_bar_set_by", "cue_ceiling"]
                + [f"{c}_{t}_{k}" for c in CONTROL_MODELS for t in ("lesion", "cue")
                   for k in ("rate", "ci_low", "ci_high")]
                + ["n", "n_replicates", "replicates_used", "replicates_excluded",
                   "untrained_initialisations"] + [f"n_constant_{m}" for m in GATE_MODELS]
                + ["margin", "models_ok", "reason"]
                + [f"{prefix}_sd" for prefix in _RATE_PREFIXES])


# The model-free maps whose rates on the same frames are part of every bar (``_method_rates``).
BAR_BASELINES = ("centre", "salience")


def _baseline_rates(rows: pd.DataFrame, method: str) -> dict[str, float]:
    """A baseline map's (``BAR_BASELINES``) peak-in-lesion and peak-on-cue rates on the lesion
    model's frames (the baseline does not depend on the model); 0 when the rows hold no such
    baseline (tables written before it existed)."""
    baseline = rows[(rows["method"] == method) & (rows["model"] == "lesion")]
    rates = {}
    for target, column in (("lesion", "peak_inside_lesion"), ("cue", "peak_on_cue")):
        hits, n, _ = _count(baseline, column)
        rates[target] = hits / n if n else 0.0
    return rates


def _ceiling(rows: pd.DataFrame, column: str) -> float:
    """Mean of a per-frame resolution-ceiling column over the frames of ``rows`` (NaN without it)."""
    if column not in rows.columns:
        return float("nan")
    return float(rows.groupby(["gate_seed", "sample_id"])[column].first().mean())


def _point_verdict(rows: pd.DataFrame, bars: dict[str, float]) -> tuple[str, str]:
    """One replicate's verdict from its point rates: ("passes", "") when both trained models'
    rates reach their bars and no control's does, else ("fails", the first reason)."""
    for model, target, column in (("lesion", "lesion", "peak_inside_lesion"),
                                  ("shortcut", "cue", "peak_on_cue")):
        hits, n, _ = _count(rows[rows["model"] == model], column)
        if n == 0 or hits / n < bars[target]:
            return "fails", f"{model} model {hits}/{n} below the {target} bar {bars[target]:.3f}"
    for control in CONTROL_MODELS:
        for target, column in (("lesion", "peak_inside_lesion"), ("cue", "peak_on_cue")):
            hits, n, _ = _count(rows[rows["model"] == control], column)
            if n and hits / n >= bars[target]:
                return "fails", f"{control} control {hits}/{n} reaches the {target} bar {bars[target]:.3f}"
    return "passes", "passes"


@artefacts.computed_by
def gate_replicate_table(case_rows: pd.DataFrame, model_facts: pd.DataFrame, *, margin: float,
                         level: float = stats.CONFIDENCE_LEVEL) -> pd.DataFrame:
    """Each replicate's draw on its own, beside the verdict over draws: rows method, label,
    gate_seed, models_ok, point_reading (this draw's point rates against the bars of the gate
    table, ``_point_verdict``: what a reader of this one draw would conclude), why, the draw's
    rates (Wilson interval of the lesion and cue rates: conditional on this draw's models),
    the bars, ceilings and n. The spread the verdict over draws rests on; it is never a vote."""
    case_rows, model_facts = _with_seed(case_rows), _with_seed(model_facts)
    pooled = gate_table(case_rows, model_facts, margin=margin, level=level).set_index("method")
    usable = set(usable_replicates(model_facts))
    rows = []
    for seed in sorted(model_facts["gate_seed"].unique()):
        of_seed = case_rows[case_rows["gate_seed"] == seed]
        for method in pooled.index:
            of_method = of_seed[of_seed["method"] == method]
            bars = {"lesion": pooled.at[method, "lesion_bar"], "cue": pooled.at[method, "cue_bar"]}
            reading, why = _point_verdict(of_method, bars)
            row = {"method": method, "label": method_label(method), "gate_seed": int(seed),
                   "models_ok": int(seed) in usable, "point_reading": reading, "why": why}
            for model, target, column, _ in _GATE_CHECKS:
                hits, n, _ = _count(of_method[of_method["model"] == model], column)
                row[f"{_prefix(model, target)}_rate"] = hits / n if n else np.nan
                if model in ("lesion", "shortcut"):
                    low, high = stats.wilson_interval(hits, n, level)
                    row.update({f"{target}_ci_low": low, f"{target}_ci_high": high})
            row.update({"centre_lesion_rate": _baseline_rates(of_seed, "centre")["lesion"],
                        "salience_lesion_rate": _baseline_rates(of_seed, "salience")["lesion"],
                        "lesion_bar": bars["lesion"], "cue_bar": bars["cue"],
                        "lesion_ceiling": _ceiling(of_method[of_method["model"] == "lesion"], "lesion_node_inside"),
                        "cue_ceiling": _ceiling(of_method[of_method["model"] == "lesion"], "cue_node_inside"),
                        "n": int((of_method["model"] == "lesion").sum())})
            rows.append(row)
    keep = ["method", "label", "gate_seed", "models_ok", "point_reading", "why", "lesion_rate",
            "lesion_ci_low", "lesion_ci_high", "cue_rate", "cue_ci_low", "cue_ci_high",
            "untrained_lesion_rate", "untrained_cue_rate", "shuffled_lesion_rate",
            "shuffled_cue_rate", "centre_lesion_rate", "salience_lesion_rate", "lesion_bar", "cue_bar",
            "lesion_ceiling", "cue_ceiling", "n"]
    return pd.DataFrame(rows)[keep]


@artefacts.computed_by
def gate_stability(clauses: pd.DataFrame, gate: pd.DataFrame) -> pd.DataFrame:
    """What the verdict over draws says about one new model draw (such as the audited
    checkpoint). Rows method, verdict, one_new_draw (each deciding clause's 80% prediction
    interval beside its bar), held: for "passes", every clause's prediction interval lies on
    its required side; for "fails", a failing clause's lies wholly on the wrong side; NaN for
    "inconclusive" or without a prediction interval (fewer than two draws). Unlike agreement
    between replicates, this does not decide less as replicates are added: the prediction
    interval converges to the spread of the draws themselves."""
    rows = []
    for method, verdict in zip(gate["method"], gate["verdict"]):
        of_method = clauses[clauses["method"] == method]
        deciding = of_method if verdict != "fails" else of_method[of_method["decides"] == "fail side"]
        inside = []
        for clause in deciding.itertuples():
            low, high = clause.prediction_low, clause.prediction_high
            if not (np.isfinite(low) and np.isfinite(high)):
                inside = None
                break
            right_side = high < clause.bar if clause.side == "<" else low >= clause.bar
            wrong_side = low >= clause.bar if clause.side == "<" else high < clause.bar
            inside.append(right_side if verdict == "passes" else wrong_side)
        text = "; ".join(f"{c.clause} {c.prediction_low:.2f}-{c.prediction_high:.2f} "
                         f"(bar {c.side} {c.bar:.3f})" for c in deciding.itertuples()
                         if np.isfinite(c.prediction_low))
        held = (bool(all(inside)) if inside is not None and verdict in ("passes", "fails") and inside
                else np.nan)
        rows.append({"method": method, "verdict": verdict,
                     "one_new_draw": text or "no prediction interval (fewer than two draws)",
                     "held": held})
    return pd.DataFrame(rows)


def gate_replicate(output_dir: str | Path, *, arch: str, settings: GateSettings, seed: int,
                   layer_name: str | None, top_fraction: float, batch_size: int,
                   init_state: dict[str, torch.Tensor] | None = None, device: str = "cpu",
                   shared_control: tuple[nn.Module, int] | None = None, on_replicate=None,
                   keep_shuffled: bool = False) -> dict:
    """One gate replicate (``seed``): build its models (``build_gate_models``), audit them on its
    pool (``audit_gate_models``, tables under ``<output_dir>/seed_<seed>/``) and drop the models.

    An independent draw: what it returns depends only on its arguments, so replicates may run
    as tasks in any order and on any worker (``run_gate``'s ``task_map``). Returns a dict with
    ``cases`` (case rows), ``facts`` (model facts), ``layer`` (the resolved target layer name)
    and, with ``keep_shuffled``, ``shuffled`` ((shuffled-label model, seed), the control later
    replicates reuse when ``shuffled_control_per_replicate`` is off). ``on_replicate``: as in
    ``run_gate``.
    """
    models, facts = build_gate_models(arch, settings, seed, shared_control, batch_size=batch_size,
                                      init_state=init_state, device=resolve_device(device))
    layer_name, _ = networks.resolve_target_layer(models["lesion"], arch, layer_name)
    pool = gate_pool(settings.section.pool_images, settings.image_size, seed + 2)
    cases = audit_gate_models(models, pool, Path(output_dir) / f"seed_{seed}", arch=arch,
                              layer_name=layer_name, settings=settings, seed=seed,
                              top_fraction=top_fraction, batch_size=batch_size, device=device)
    if on_replicate is not None:
        on_replicate(seed, models, pool, layer_name)
    replicate = {"cases": cases, "facts": facts, "layer": layer_name}
    if keep_shuffled:
        replicate["shuffled"] = (models["shuffled"], seed)
    return replicate


def run_gate(output_dir: str | Path, *, arch: str, settings: GateSettings,
             layer_name: str | None = None, top_fraction: float, batch_size: int,
             progress=None, init_state: dict[str, torch.Tensor] | None = None,
             device: str = "cpu", on_replicate=None, task_map=None) -> dict:
    """Build, audit and judge the gate models of every replicate at ``arch``'s target layer.

    Writes the per-model audit tables under ``<output_dir>/seed_<seed>/``. Returns a dict with
    ``gate`` (``gate_table``), ``clauses`` (``gate_clause_table``), ``replicates`` (``gate_replicate_table``), ``stability``
    (``gate_stability``), ``models`` (model facts of every replicate), ``cases`` (case
    rows), ``layer`` (target layer name), ``settings`` (dict) and ``seconds``. ``progress``:
    optional callable(message) told when each replicate starts. ``init_state``: fine-tune the
    trained models from these 2-class weights of ``arch`` (``build_gate_models``; default None:
    from scratch, as notebook 03). ``device``: ``cpu`` | ``cuda`` | ``auto``, where the models are
    trained and audited (default the CPU, as notebook 03). ``on_replicate``: optional
    callable(seed, models, pool, layer_name) called once a replicate's models are audited
    (``endoexplain gate`` draws its example maps from it; the models are not kept otherwise).
    ``task_map``: ``pipeline.tasks.TaskRunner.map`` (or any ``(function, calls, labels) ->
    results`` in call order) to run the replicates as independent tasks (``gate_replicate``);
    the tables equal the plain loop's (``None``, the default). When the profile reuses one
    shuffled control, the first replicate runs here first and the others get its control.
    """
    started = time.perf_counter()
    if task_map is not None and on_replicate is not None:
        raise ValueError("run_gate: on_replicate needs the models in this process; it cannot be "
                         "combined with task_map (replicates on other workers)")
    seeds = list(settings.section.replicate_seeds)
    common = dict(output_dir=output_dir, arch=arch, settings=settings, layer_name=layer_name,
                  top_fraction=top_fraction, batch_size=batch_size, init_state=init_state,
                  device=device)
    reuse_control = not settings.section.shuffled_control_per_replicate
    replicates, shared_control = [], None
    for index, seed in enumerate(seeds):
        if task_map is not None and (index > 0 or not reuse_control):
            break   # the remaining replicates run as tasks below
        if progress is not None:
            progress(f"gate replicate {index + 1}/{len(seeds)} (seed {seed})")
        replicate = gate_replicate(seed=seed, shared_control=shared_control, on_replicate=on_replicate,
                                   keep_shuffled=reuse_control and index == 0, **common)
        shared_control = replicate.pop("shuffled", shared_control)
        replicates.append(replicate)
    remaining = seeds[len(replicates):]
    if remaining:
        replicates += task_map(gate_replicate, [{**common, "seed": seed, "shared_control": shared_control}
                                                for seed in remaining],
                               [f"gate/seed_{seed}" for seed in remaining])
    cases = pd.concat([r["cases"] for r in replicates], ignore_index=True)
    facts = pd.concat([r["facts"] for r in replicates], ignore_index=True)
    judged = {"margin": settings.section.margin, "level": settings.level}
    gate = gate_table(cases, facts, **judged)
    clauses = gate_clause_table(cases, facts, **judged)
    return {"gate": gate, "clauses": clauses, "stability": gate_stability(clauses, gate),
            "replicates": gate_replicate_table(cases, facts, **judged),
            "models": facts, "cases": cases, "layer": replicates[0]["layer"],
            "settings": {**asdict(settings), "section": settings.section.model_dump()}, "seconds": round(time.perf_counter() - started, 1)}


def run_gate_at_layers(output_dir: str | Path, *, arch: str, settings: GateSettings,
                       layer_names: list[str], top_fraction: float, batch_size: int,
                       progress=None, init_state: dict[str, torch.Tensor] | None = None,
                       device: str = "cpu") -> dict:
    """The gate at several target layers of ``arch`` on the same model draws.

    A gate model's training does not depend on the CAM layer, so each replicate's models are
    trained once (``run_gate`` at ``layer_names[0]``) and audited at every other layer before
    they are dropped (tables under ``<output_dir>/<layer>/seed_<seed>/``): a difference between
    layers is then the layer's, not another draw's. Returns ``{"gate": the gate tables stacked
    with a ``target_layer`` column (layers in the given order), "models": model facts, "cases":
    {layer: case rows}}``. Cost: one gate plus, per replicate and extra layer, the pool audits.
    """
    if not layer_names or len(set(layer_names)) != len(layer_names):
        raise ValueError(f"run_gate_at_layers needs distinct layer names, got {layer_names}")
    others = list(layer_names[1:])
    extra_cases: dict[str, list[pd.DataFrame]] = {name: [] for name in others}

    def audit_at_other_layers(seed, models, pool, _layer):
        for name in others:
            extra_cases[name].append(audit_gate_models(
                models, pool, Path(output_dir) / name / f"seed_{seed}", arch=arch, layer_name=name,
                settings=settings, seed=seed, top_fraction=top_fraction, batch_size=batch_size,
                device=device))

    result = run_gate(Path(output_dir) / layer_names[0], arch=arch, settings=settings,
                      layer_name=layer_names[0], top_fraction=top_fraction, batch_size=batch_size,
                      progress=progress, init_state=init_state, device=device,
                      on_replicate=audit_at_other_layers)
    cases = {result["layer"]: result["cases"]}
    cases.update({name: pd.concat(found, ignore_index=True) for name, found in extra_cases.items()})
    judged = {"margin": settings.section.margin, "level": settings.level}
    gate = pd.concat([gate_table(of_layer, result["models"], **judged).assign(target_layer=name)
                      for name, of_layer in cases.items()], ignore_index=True)
    return {"gate": gate, "models": result["models"], "cases": cases}


def failing_methods(gate: pd.DataFrame) -> list[str]:
    """CAM methods the gate does not validate (fails or inconclusive), in ``CAM_METHODS``
    order; baselines are not listed."""
    verdict = gate.set_index("method")["passes"]
    return [m for m in CAM_METHODS if m in verdict.index and not bool(verdict[m])]


def gate_verdicts(gate: pd.DataFrame) -> dict[str, str]:
    """method -> "passes" / "fails" / "inconclusive" (tables without a ``verdict`` column,
    written before replicates existed, give "passes" / "fails")."""
    if "verdict" in gate.columns:
        return dict(zip(gate["method"], gate["verdict"]))
    return {m: "passes" if bool(p) else "fails" for m, p in zip(gate["method"], gate["passes"])}


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


FIGURE_GATE_NOTE = (f"{DAGGER} not validated by this run's planted-truth gate (fails or inconclusive; "
                    "table_validity_gate gives the reason): its maps are not shown to find planted "
                    "evidence. LayerCAM and the reference maps are not tested by the gate.")


def figure_marks(figures_dir: str | Path) -> tuple[tuple[str, ...], str]:
    """What a figure needs to mark the gate's verdict: the CAM methods the gate does not validate
    (pass them as ``not_validated=`` to a figure function, whose labels then carry ``DAGGER``)
    and the footer line explaining the mark ("" when every method passes or the gate was not
    run, so a figure never carries a mark without its note)."""
    gate = read_gate_table(figures_dir)
    failing = tuple(failing_methods(gate)) if gate is not None else ()
    return failing, (FIGURE_GATE_NOTE if failing else "")


def mark_table(table: pd.DataFrame, gate: pd.DataFrame | None, *, method_column: str = "method",
               label_column: str | None = "label") -> pd.DataFrame:
    """Copy of ``table`` with a ``validity_gate`` column and daggers on CAM labels the gate does
    not validate.

    ``validity_gate`` per row: "passes" / "fails" / "inconclusive" for CAM methods, "reference"
    for other rows (baselines, random deletion), "not run" when ``gate`` is None. Methods that
    do not pass get ``DAGGER`` appended to ``label_column`` (when given and present); the
    footnote to print beside the table is ``marks.GATE_FOOTNOTE``.
    """
    table = table.copy()
    methods = table[method_column].astype(str)
    if gate is None:
        table["validity_gate"] = np.where(methods.isin(CAM_METHODS), "not run", "reference")
        return table
    verdicts = gate_verdicts(gate)
    failing = set(failing_methods(gate))
    table["validity_gate"] = [verdicts.get(m, "not run") if m in CAM_METHODS else "reference"
                              for m in methods]
    if label_column and label_column in table.columns:
        table[label_column] = [f"{label}{DAGGER}" if m in failing else label
                               for label, m in zip(table[label_column], methods)]
    return table


NOT_RUN_AT_LAYER = "not run at this layer"


def mark_layer_table(table: pd.DataFrame, gate: pd.DataFrame | None, gate_layer: str, *,
                     layer_column: str = "layer") -> pd.DataFrame:
    """``mark_table`` for a table with rows at several CAM layers: the gate's verdicts hold for
    the layer it ran at (``gate_layer``) only; CAM rows at any other layer get
    ``NOT_RUN_AT_LAYER`` and the dagger (not validated there)."""
    marked = mark_table(table, gate)
    elsewhere = (marked[layer_column] != gate_layer) & marked["method"].isin(CAM_METHODS)
    marked.loc[elsewhere, "validity_gate"] = NOT_RUN_AT_LAYER
    if "label" in marked.columns:
        marked.loc[elsewhere, "label"] = [label if label.endswith(DAGGER) else f"{label}{DAGGER}"
                                          for label in marked.loc[elsewhere, "label"]]
    return marked


# --- checkpoints that did not learn -------------------------------------------------------------

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
