"""``endoexplain gate``: notebook 03's validity gate at the architecture, target layer and input
size of a user's own model, and the gate folder that ``endoexplain audit --gate`` reads.

The gate is ``validity_gate.run_gate`` itself (the same planted frames, models, controls, the
interval over model draws and the verdict rule); this module adds the front door of
``endoexplain audit`` (``cli``: one-line refusals, the lock on ``--out``, staging, the commit
record, here ``gate.json``), the cost stated before the work, and the report. Options, outputs
and what the knobs buy: docs/own_model.md, "Validate the methods first: endoexplain gate".
"""

from __future__ import annotations

import argparse
import base64
import datetime
import html
import json
import math
import shutil
import sys
import time
from pathlib import Path

import endoexplain_core
from endoexplain_core import files
from endoexplain_core.front_door import (GATE_RECORD_NAME, MAX_RECORD_BYTES, RECORD_NAME, REPORT_CSS,
                                         add_run_arguments,
                                         CommandError, _check_methods, _os_error_text,
                                         check_output_folder, commit_outputs, load_user_model,
                                         output_folder_lock, probe_model, record_in, staging_folder,
                                         verify_folder)

GATE_TABLE = "table_validity_gate"      # the name notebook 03 gives it; read_gate_table reads it
GPU_ADVISED_SECONDS = 3600.0            # on the CPU above this estimate the command advises a GPU
EXAMPLE_FRAME = 0                       # pool frame drawn in example_maps (of the first usable replicate)
# The frame counts of the default profile (configs/default.yaml, stages.03_validity_gate): the
# settings behind the measured between-draw spreads of docs/statistics_and_gate.md.
DEFAULT_STEPS, DEFAULT_REPLICATES = 160, 3
DEFAULT_TRAIN_IMAGES, DEFAULT_VAL_IMAGES, DEFAULT_POOL_IMAGES = 192, 48, 64


# ----------------------------------------------------------------------------- arguments


def add_arguments(gate: argparse.ArgumentParser) -> None:
    """The ``endoexplain gate`` options."""
    from endoexplain_core.models.networks import AUDITABLE_ARCHITECTURES

    model = gate.add_argument_group("what the gate validates")
    model.add_argument("--arch", required=True, metavar="ARCH",
                       help=f"torchvision architecture: {', '.join(AUDITABLE_ARCHITECTURES)}")
    model.add_argument("--image-size", type=int, default=256, metavar="PX",
                       help="square input size in pixels, as the audit's (default 256)")
    model.add_argument("--target-layer", metavar="NAME", default=None,
                       help="CAM target layer as a module path (default: the protocol's layer "
                            "for ARCH, e.g. layer4.1 for resnet18), as the audit's")
    model.add_argument("--methods", nargs="+", metavar="METHOD", default=None,
                       help="CAM methods judged (default all five; audit --gate marks the "
                            "others as not validated)")
    model.add_argument("--init-weights", metavar="FILE", default=None,
                       help="fine-tune the gate's trained models from these 2-class weights of "
                            "ARCH (safetensors or a torch state dict, loaded as audit --weights; "
                            "the head is re-initialised) instead of training from scratch")
    power = gate.add_argument_group("cost and power (docs/own_model.md)")
    power.add_argument("--replicates", type=int, default=DEFAULT_REPLICATES, metavar="K",
                       help=f"model draws: replicate seeds 1..K, each with its own frames, models "
                            f"and controls (at least 2; default {DEFAULT_REPLICATES})")
    power.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="N",
                       help=f"optimiser steps per trained model (default {DEFAULT_STEPS})")
    power.add_argument("--train-images", type=int, default=DEFAULT_TRAIN_IMAGES, metavar="N",
                       help=f"planted training frames per model (default {DEFAULT_TRAIN_IMAGES})")
    power.add_argument("--val-images", type=int, default=DEFAULT_VAL_IMAGES, metavar="N",
                       help=f"held-out frames of the accuracy rule (default {DEFAULT_VAL_IMAGES})")
    power.add_argument("--pool-images", type=int, default=DEFAULT_POOL_IMAGES, metavar="N",
                       help=f"audited frames per replicate (default {DEFAULT_POOL_IMAGES})")
    power.add_argument("--untrained-initialisations", type=int, default=4, metavar="N",
                       help="untrained networks per replicate (default 4)")
    run = gate.add_argument_group("run")
    add_run_arguments(run, device_help="where the models are trained and audited (default auto: "
                                       "CUDA when available)",
                      batch_help="frames per optimiser step and per CAM batch (default 16)")
    run.add_argument("--top-fraction", type=float, default=0.20, metavar="F",
                     help="fraction of pixels in a map's top area (default 0.20)")


def gate_settings(args: argparse.Namespace):
    """``validity_gate.GateSettings`` from the options: the default profile's recipe (learning
    rate, margin, accuracy rules, two random deletions per pool frame) with the frame counts,
    steps and replicates given, warm-up over the first tenth of the steps (the default's 16 of
    160) and a shuffled-label control per replicate. Out-of-range values are refused in one
    line, naming the option (``config.ValidityGateSettings``' bounds)."""
    from pydantic import ValidationError

    from endoexplain_core import config
    from endoexplain_core.analysis import validity_gate

    if args.replicates < 2:
        raise CommandError(f"--replicates must be at least 2, got {args.replicates}: one model "
                           f"draw has no spread to estimate, so it decides nothing")
    if not 0 < args.top_fraction < 1:
        raise CommandError(f"--top-fraction must be in (0, 1), got {args.top_fraction}")
    if not (math.isfinite(args.wait_for_lock) and args.wait_for_lock >= 0):
        raise CommandError(f"--wait-for-lock must be a finite number of seconds >= 0, got {args.wait_for_lock}")
    if args.image_size < 1:
        raise CommandError(f"--image-size must be at least 1, got {args.image_size}")
    options = {"train_images": "--train-images", "val_images": "--val-images",
               "pool_images": "--pool-images", "steps": "--steps", "batch_size": "--batch-size",
               "untrained_initialisations": "--untrained-initialisations",
               "pool_batch_size": "--batch-size", "replicate_seeds": "--replicates"}
    try:
        section = config.ValidityGateSettings(
            train_images=args.train_images, val_images=args.val_images,
            pool_images=args.pool_images, replicate_seeds=list(range(1, args.replicates + 1)),
            steps=args.steps, batch_size=args.batch_size, pool_batch_size=args.batch_size,
            warmup_steps=round(args.steps / 10), learning_rate=0.004, margin=0.25,
            min_accuracy=0.90, max_control_accuracy=0.75, random_deletion_repetitions=2,
            shuffled_control_per_replicate=True,
            untrained_initialisations=args.untrained_initialisations)
    except ValidationError as error:
        problem = error.errors()[0]
        option = options.get(str(problem["loc"][0]), str(problem["loc"][0]))
        raise CommandError(f"{option}: {problem['msg']}") from None
    return validity_gate.GateSettings(section, image_size=args.image_size, channels_last=True)


def check_gate_inputs(args: argparse.Namespace):
    """The refusals that need no output folder: methods, architecture, init weights, layer and
    input size (one forward pass: a grid under 2x2 or non-finite logits). Returns (methods,
    init state dict or None, its SHA-256 or None, resolved layer name)."""
    from endoexplain_core.methods import CAM_METHODS
    from endoexplain_core.models import networks

    methods = _check_methods(args.methods, CAM_METHODS)
    if args.arch not in networks.AUDITABLE_ARCHITECTURES:
        raise CommandError(f"unknown architecture {args.arch!r}; known: "
                           f"{', '.join(networks.AUDITABLE_ARCHITECTURES)}")
    init_state, init_sha = None, None
    if args.init_weights:
        # The audit's loader: weights_only, tensors checked, strict fit to a 2-class ARCH.
        model, init_sha = load_user_model(args.arch, args.init_weights)
        init_state = model.state_dict()
    else:
        model = networks.build_model(args.arch).eval()
    try:
        layer_name, layer = networks.resolve_target_layer(model, args.arch, args.target_layer)
    except ValueError as error:
        raise CommandError(str(error)) from error
    probe_model(model.eval(), layer, layer_name, args.image_size)
    return methods, init_state, init_sha, layer_name


def check_gate_output(args: argparse.Namespace) -> Path:
    """``cli.check_output_folder`` for ``--out``, and a gate never writes into a folder that
    holds an audit (each folder has one commit record) or around its ``--init-weights``."""
    out = Path(args.out)
    if args.init_weights and out.resolve() in Path(args.init_weights).resolve().parents:
        raise CommandError(f"--out {out} contains the --init-weights file {args.init_weights}; "
                           f"write the gate to a folder of its own")
    if (out / RECORD_NAME).is_file():
        raise CommandError(f"--out {out} holds an audit ({RECORD_NAME}); write the gate to a "
                           f"folder of its own")
    return check_output_folder(out, {})


# ----------------------------------------------------------------------------- cost


def estimate_seconds(section, step_seconds: float, audit_seconds_per_frame: float) -> float:
    """The gate's wall time from two timed pieces, in seconds: per replicate, three trained
    models (lesion, shortcut, shuffled control) of ``steps`` optimiser steps, their forward
    passes for the accuracy rule and BatchNorm statistics (a forward costs about a third of a
    step: forward, backward and update), and the pool audit of those three and the untrained
    networks. What it leaves out (building frames and models, writing tables) is small."""
    batches = lambda n: math.ceil(n / section.batch_size)   # noqa: E731 - one-line count
    training = 3 * section.steps * step_seconds
    forwards = (3 * batches(section.train_images + section.val_images + 128)
                + section.untrained_initialisations * batches(section.train_images + section.val_images))
    audit = (3 + section.untrained_initialisations) * section.pool_images * audit_seconds_per_frame
    return len(section.replicate_seeds) * (training + forwards * step_seconds / 3 + audit)


def time_pool_audit(arch: str, settings, layer_name: str, folder: Path, device: str,
                    batch_size: int, top_fraction: float) -> float:
    """Seconds per frame of the gate's pool audit (``audit.audit_checkpoint`` as
    ``validity_gate.audit_gate_models`` calls it) on one batch of pool frames with a random
    network, after one untimed frame (allocations); its tables go to ``folder``, removed after."""
    from endoexplain_core.analysis import audit, validity_gate
    from endoexplain_core.models import networks

    frames = validity_gate.gate_pool(batch_size + 1, settings.image_size, seed=0)
    cases = [(f["sample_id"], f["image"], f["lesion_mask"]) for f in frames]
    model = networks.build_model(arch).eval()
    folder.mkdir(parents=True, exist_ok=True)
    seconds = []
    try:
        for part in (cases[:1], cases[1:]):
            started = time.perf_counter()
            audit.audit_checkpoint(
                model, {"checkpoint_id": "gate_cost", "arch": arch, "seed": 0,
                        "control": "untrained", "target_layer": layer_name},
                1.0, part, dataset=validity_gate.GATE_DATASET, image_size=settings.image_size,
                table_path=folder / "cost.parquet", random_deletion_path=folder / "cost_rd.parquet",
                top_fraction=top_fraction, repetitions=settings.section.random_deletion_repetitions,
                batch_size=batch_size, device=device, total=len(part))
            seconds.append((time.perf_counter() - started) / len(part))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return seconds[-1]


def state_cost(args: argparse.Namespace, settings, init_state, layer_name: str, staging: Path,
               say) -> dict:
    """Time one training step and the pool audit of one batch, then ``say`` the estimated total
    (and, on the CPU above ``GPU_ADVISED_SECONDS``, that a GPU is advised). Returns the timings
    for the record."""
    from endoexplain_core.analysis import validity_gate
    from endoexplain_core.numerics import resolve_device

    device = resolve_device(args.device)
    say(f"timing one training step of {args.arch} at {args.image_size} px on {device.type} ...")
    step = validity_gate.time_training_step(args.arch, settings, init_state=init_state, device=device)
    per_frame = time_pool_audit(args.arch, settings, layer_name, staging / ".cost", args.device,
                                args.batch_size, args.top_fraction)
    total = estimate_seconds(settings.section, step, per_frame)
    replicates = len(settings.section.replicate_seeds)
    say(f"one training step {step:.2f} s, pool audit {per_frame:.2f} s per frame: estimated "
        f"{_duration(total)} for {replicates} replicates x 3 trained models x {args.steps} steps "
        f"and {3 + args.untrained_initialisations} pool audits of {args.pool_images} frames "
        f"(about {_duration(total / replicates)} per replicate)")
    if device.type == "cpu" and total > GPU_ADVISED_SECONDS:
        say("a GPU is advised for this gate (--device cuda); on the CPU, --replicates and --steps "
            "set the cost (docs/own_model.md)")
    return {"device": device.type, "step_seconds": round(step, 3),
            "pool_audit_seconds_per_frame": round(per_frame, 3),
            "estimated_seconds": round(total, 1)}


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


# ----------------------------------------------------------------------------- the run


def run(args: argparse.Namespace) -> dict:
    """``endoexplain gate``: every output under ``args.out``; returns the record."""
    settings = gate_settings(args)
    methods, init_state, init_sha, layer_name = check_gate_inputs(args)
    # Only now is anything created: every refusal above leaves the disk as it was.
    out = check_gate_output(args)
    with output_folder_lock(out, args.wait_for_lock, holders="gate or audit"):
        staging = staging_folder(out)
        try:
            try:
                record = _gate_into(args, staging, settings, methods, init_state, init_sha, layer_name)
            except OSError as error:
                raise CommandError(f"stopped by an OS error, nothing was moved into {out}: "
                                   f"{_os_error_text(error, staging, out)}") from error
            try:
                record["written"] = [str(p) for p in commit_outputs(staging, out, record, GATE_RECORD_NAME)]
            except OSError as error:
                raise CommandError(f"moving the finished files into {out} failed, so it has no "
                                   f"{GATE_RECORD_NAME} now (rerun the gate): "
                                   f"{_os_error_text(error, staging, out)}") from error
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return record


def _say(message: str) -> None:
    print(f"endoexplain gate: {message}", file=sys.stderr, flush=True)


def _gate_into(args: argparse.Namespace, out: Path, settings, methods, init_state, init_sha,
               layer_name: str) -> dict:
    """The body of ``run`` while ``out`` (the staging folder) is locked: the cost, the gate,
    its tables, the example maps and the report."""
    import matplotlib.pyplot as plt

    from endoexplain_core import artefacts
    from endoexplain_core.analysis import validity_gate
    from endoexplain_core.figures import style

    cost = state_cost(args, settings, init_state, layer_name, out, _say)
    examples = {}

    def keep_examples(seed, models, pool, layer):
        # every replicate's maps are drawn (cheap: one frame); the figure shows the first
        # replicate whose models passed the accuracy rule, not a model that did not learn
        examples[seed] = example_maps(models, pool[EXAMPLE_FRAME], layer, methods)

    style.apply()
    result = validity_gate.run_gate(
        out / "replicates", arch=args.arch, settings=settings, layer_name=layer_name,
        top_fraction=args.top_fraction, batch_size=args.batch_size, progress=_say,
        init_state=init_state, device=args.device, on_replicate=keep_examples)
    tables = {name: keep_methods(result[key], methods) for name, key in (
        (GATE_TABLE, "gate"), ("table_validity_gate_clauses", "clauses"),
        ("table_validity_gate_replicates", "replicates"),
        ("table_validity_gate_stability", "stability"))}
    tables["table_validity_gate_models"] = result["models"]
    written = []
    for name, table in tables.items():
        written += artefacts.save_table(table, name, out)
    result["cases"].to_parquet(out / "gate_cases.parquet", index=False)
    shown_seed, title = example_replicate(validity_gate.usable_replicates(result["models"]), list(examples))
    examples[shown_seed].suptitle(title, fontsize=9)
    examples[shown_seed].tight_layout(rect=(0, 0, 1, 0.97))   # room for the title above the column heads
    written += artefacts.save_figure(examples[shown_seed], "example_maps", out)
    for figure in examples.values():
        plt.close(figure)
    gate = tables[GATE_TABLE]
    record = {
        "command": "endoexplain gate", "endoexplain_version": endoexplain_core.__version__, "arch": args.arch,
        "target_layer": result["layer"], "image_size": args.image_size,
        "methods_judged": list(methods), "replicate_seeds": settings.section.replicate_seeds,
        "steps": args.steps, "train_images": args.train_images, "val_images": args.val_images,
        "pool_images": args.pool_images, "untrained_initialisations": args.untrained_initialisations,
        "batch_size": args.batch_size, "top_fraction": args.top_fraction,
        "init_weights": args.init_weights, "init_weights_sha256": init_sha,
        "verdicts": {m: v for m, v in validity_gate.gate_verdicts(gate).items() if m in methods},
        "replicates_used": validity_gate.usable_replicates(result["models"]),
        **cost, "seconds": result["seconds"], "settings": result["settings"],
    }
    write_gate_report(out, record, tables, out / "example_maps.png",
                      [Path(p) for p in written] + [out / "gate_cases.parquet", out / GATE_RECORD_NAME])
    return record


def keep_methods(table, methods):
    """The rows of a gate table for the judged CAM methods and every reference map."""
    from endoexplain_core.methods import CAM_METHODS

    keep = ~table["method"].isin(CAM_METHODS) | table["method"].isin(methods)
    return table[keep].reset_index(drop=True)


def example_replicate(usable: list[int], drawn: list[int]) -> tuple[int, str]:
    """(seed, figure title) of the replicate ``example_maps`` shows: the first of ``usable``
    (replicates whose models all met their accuracy rule) among ``drawn``, else the first drawn,
    titled so that a reader does not take a model that did not learn for the method's map."""
    for seed in drawn:
        if seed in usable:
            return seed, f"replicate {seed}"
    return drawn[0], f"replicate {drawn[0]}: no replicate's models all passed the accuracy rule"


def example_maps(models: dict, frame: dict, layer_name: str, methods):
    """A figure: one pool frame (polyp outlined in white, cue in cyan) and, per judged CAM
    method (rows), the map of each gate model of one replicate (columns: lesion, shortcut,
    shuffled, first untrained), its peak marked with a cross. What a reader checks at a glance:
    the lesion model's peaks on the polyp, the shortcut model's on the cue, the controls on
    neither."""
    import matplotlib.pyplot as plt
    import numpy as np

    from endoexplain_core.data.datasets import to_normalised_tensor
    from endoexplain_core.kernels import cams
    from endoexplain_core.methods import method_label

    shown = [name for name in ("lesion", "shortcut", "shuffled", "untrained_1") if name in models]
    batch = to_normalised_tensor(frame["image"])[None]
    figure, axes = plt.subplots(len(methods), len(shown) + 1, squeeze=False,
                                figsize=(1.5 * (len(shown) + 1), 1.5 * len(methods)))
    for row, method in enumerate(methods):
        axes[row, 0].imshow(frame["image"])
        axes[row, 0].set_ylabel(method_label(method))
        for column, name in enumerate(shown, start=1):
            model = models[name].cpu().eval()
            map_ = cams.compute_cams(model, layer_name, batch, methods=(method,))[method][0]
            map_ = map_.detach().cpu().numpy()
            axes[row, column].imshow(frame["image"])
            axes[row, column].imshow(map_, cmap="jet", alpha=0.45, vmin=0, vmax=1)
            if map_.max() > map_.min():
                peak_row, peak_col = np.unravel_index(int(np.argmax(map_)), map_.shape)
                axes[row, column].plot(peak_col, peak_row, "x", color="white", markersize=7, mew=2)
            if row == 0:
                axes[row, column].set_title(name.replace("_1", ""), fontsize=8)
    for axis in axes.flat:
        axis.contour(frame["lesion_mask"], levels=[0.5], colors="white", linewidths=0.8)
        axis.contour(frame["cue_mask"], levels=[0.5], colors="cyan", linewidths=0.8)
        axis.set_xticks([])
        axis.set_yticks([])
    axes[0, 0].set_title("frame", fontsize=8)
    figure.tight_layout()
    return figure


# ----------------------------------------------------------------------------- the report


def write_gate_report(out: Path, record: dict, tables: dict, figure_png: Path,
                      written: list[Path]) -> Path:
    """``<out>/report.html``: one self-contained page (inline CSS, the example maps as a data
    URI, no scripts) with the verdict and reason per method, the clause table, each
    replicate's rates and the training facts."""
    def table_html(frame) -> str:
        return frame.to_html(index=False, escape=True, border=0, na_rep="\u2013",
                             float_format=lambda v: f"{v:.3f}")

    gate = tables[GATE_TABLE]
    verdicts = gate[gate["method"].isin(record["methods_judged"])][["label", "verdict", "reason"]]
    clauses = tables["table_validity_gate_clauses"][
        ["label", "clause", "bar", "side", "rate", "ci_low", "ci_high", "between_draw_sd",
         "draws_right_side", "prediction_low", "prediction_high", "decides"]]
    replicates = tables["table_validity_gate_replicates"][
        ["label", "gate_seed", "models_ok", "point_reading", "lesion_rate", "cue_rate",
         "untrained_lesion_rate", "shuffled_lesion_rate", "lesion_bar", "cue_bar"]]
    models = tables["table_validity_gate_models"][
        ["gate_seed", "model", "draw", "steps", "held_out_accuracy", "accuracy_required",
         "accuracy_ok", "seconds"]]
    figure = base64.b64encode(figure_png.read_bytes()).decode("ascii")
    passed = [m for m, v in record["verdicts"].items() if v == "passes"]
    settings = {key: record[key] for key in (
        "endoexplain_version", "arch", "target_layer", "image_size", "replicate_seeds", "steps",
        "train_images", "val_images", "pool_images", "untrained_initialisations", "batch_size",
        "init_weights", "init_weights_sha256", "device", "estimated_seconds", "seconds")}
    settings_rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
                            for k, v in settings.items())
    file_rows = "".join(f'<li><a href="{html.escape(p.name)}">{html.escape(p.name)}</a></li>'
                        for p in written if p.parent == out)
    title = f"{record['arch']} {record['target_layer']} at {record['image_size']} px"
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>endoExplain validity gate: {html.escape(title)}</title>
<style>{REPORT_CSS}</style></head><body>
<h1>endoExplain validity gate: <code>{html.escape(title)}</code></h1>
<p>Passes: {html.escape(', '.join(passed) or 'no method')}. An audit of a model of this
architecture, layer and input size reads this folder with
<code>endoexplain audit --gate {html.escape(str(out.name))}</code>, which marks every other method
with &dagger; (not validated).</p>
<p class="note">Each method's rate is the mean over {len(record['replicate_seeds'])} model draws
(replicates) with a Student t interval over them; it passes when the lesion and shortcut models
clear their bars and no control reaches them, fails when one clause is on the wrong side at the
Bonferroni level, and is inconclusive otherwise (docs/statistics_and_gate.md, "Validity gate").
More replicates narrow the interval; they never make a verdict harder to reach.</p>
<h2>Verdicts</h2>{table_html(verdicts)}
<h2>Clauses</h2>{table_html(clauses)}
<h2>Each replicate (a description of the spread, never a vote)</h2>{table_html(replicates)}
<h2>Example maps (replicate {record['replicate_seeds'][0]})</h2>
<p class="note">Polyp outlined in white, cue in cyan; &times; marks the peak.</p>
<img alt="example maps of the gate models" src="data:image/png;base64,{figure}">
<h2>Gate models</h2>{table_html(models)}
<h2>Settings</h2><table>{settings_rows}</table>
<h2>Files</h2><ul>{file_rows}</ul>
<p class="note">Written {datetime.date.today().isoformat()} by <code>endoexplain gate</code>.</p>
</body></html>
"""
    return files.write_text_atomic(out / "report.html", page)


# ----------------------------------------------------------------------------- audit --gate


def read_gate_folder(folder: str | Path, *, arch: str, target_layer: str, image_size: int):
    """(gate table, gate record) of a gate folder for an audit at ``arch`` / ``target_layer`` /
    ``image_size``. Refused in one line: a folder that does not verify against its
    ``gate.json`` (or holds an audit instead), and a gate made at another architecture, layer
    or input size (naming each difference). CAM methods the gate did not judge are added as
    "not run" rows that do not pass, so the audit marks them."""
    import pandas as pd

    from endoexplain_core.analysis import validity_gate
    from endoexplain_core.methods import CAM_METHODS, method_label

    folder = Path(folder)
    if not folder.is_dir():
        raise CommandError(f"--gate {folder} is not a folder (run endoexplain gate --out {folder} first)")
    if record_in(folder) != GATE_RECORD_NAME:
        raise CommandError(f"--gate {folder} has no {GATE_RECORD_NAME}: not a finished "
                           f"endoexplain gate folder")
    problems = verify_folder(folder)
    if problems:
        raise CommandError(f"--gate {folder} does not match its {GATE_RECORD_NAME}: {problems[0]}"
                           + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    record = json.loads(files.read_bounded(folder / GATE_RECORD_NAME, MAX_RECORD_BYTES, GATE_RECORD_NAME))
    wanted = {"architecture": ("arch", arch), "target layer": ("target_layer", target_layer),
              "input size": ("image_size", image_size)}
    differences = [f"{what} {record.get(key)!r} (this audit: {value!r})"
                   for what, (key, value) in wanted.items() if record.get(key) != value]
    if differences:
        raise CommandError(f"--gate {folder} was made at another " + "; ".join(differences)
                           + ": a gate validates the methods at its own architecture, layer and "
                             "input size only; run endoexplain gate with this audit's --arch, "
                             "--image-size and --target-layer")
    gate = validity_gate.read_gate_table(folder)
    not_judged = [m for m in CAM_METHODS if m not in set(gate["method"])]
    if not_judged:
        gate = pd.concat([gate, pd.DataFrame({
            "method": not_judged, "label": [method_label(m) for m in not_judged],
            "verdict": "not run", "passes": False,
            "reason": "not judged by this gate (endoexplain gate --methods)"})], ignore_index=True)
    return gate, record
