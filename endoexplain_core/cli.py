"""The ``endoexplain`` command (also ``python -m endoexplain_core``): ``audit`` runs notebook 04's
spatial audit on a user's own classifier and masked frames with the same functions
(``analysis.audit.audit_checkpoint``, ``figures.audit_report``, ``artefacts``); ``verify`` checks
an audit folder against its ``audit.json`` record. Inputs are checked before anything is
written, outputs are staged and committed whole. Exit codes: 0 done, 2 refused with one line,
1 unexpected error. Options, refusals and outputs: docs/own_model.md.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import endoexplain_core
from endoexplain_core import files  # light: hashes and atomic writes (torch loads lazily below)
from endoexplain_core.front_door import (  # noqa: F401 (also the commands' names for tests and users)
    _same_bytes, add_run_arguments, CommandError, GATE_RECORD_NAME, LOCK_NAME, MAX_RECORD_BYTES,
    RECORD_NAME,
    RECORD_NAMES, REPORT_CSS, _check_methods, _listed_files, _os_error_text,
    check_output_folder, check_weight_tensors, commit_outputs, load_user_model, output_folder_lock,
    probe_model, record_in, staging_folder, verify_folder)

UNPAIRED_SHOWN = 5
DEFAULT_DATASET = "own"


# ----------------------------------------------------------------------------- pairing


@dataclass(frozen=True)
class Case:
    """One image and its mask, paired by file stem."""

    sample_id: str
    image_path: Path
    mask_path: Path


def _image_files(folder: Path, what: str) -> dict[str, Path]:
    """stem -> file for the image files in ``folder`` (refuses two files with one stem)."""
    from endoexplain_core.data import imageio

    if not folder.is_dir():
        raise CommandError(f"{what} folder {folder} does not exist or is not a folder")
    by_stem: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        if imageio.is_image_file(path):
            if path.stem in by_stem:
                raise CommandError(f"{what} folder {folder} has two files with the stem "
                                   f"{path.stem!r}: {by_stem[path.stem].name} and {path.name}")
            by_stem[path.stem] = path
    if not by_stem:
        raise CommandError(f"{what} folder {folder} holds no image files "
                           f"({', '.join(imageio.IMAGE_SUFFIXES)})")
    return by_stem


def pair_by_stem(images_dir: str | Path, masks_dir: str | Path, mask_suffix: str = "") -> list[Case]:
    """Pair every image ``<stem>.<ext>`` with the mask ``<stem><mask_suffix>.<ext>``.

    Extensions may differ between image and mask (e.g. ``a.jpg`` with ``a_mask.png``); JPEG,
    PNG, TIFF and BMP are read. Every image needs a mask and every mask an image: otherwise
    ``CommandError`` lists the first unpaired files of each side. Cases are sorted by stem.
    """
    if Path(images_dir).resolve() == Path(masks_dir).resolve():
        raise CommandError(f"--masks {masks_dir} is the --images folder: masks must be separate "
                           f"files (white lesion on black), in their own folder")
    images = _image_files(Path(images_dir), "images")
    masks = _image_files(Path(masks_dir), "masks")
    by_image_stem: dict[str, Path] = {}
    lonely_masks: list[str] = []
    for stem, path in masks.items():
        if mask_suffix and not stem.endswith(mask_suffix):
            lonely_masks.append(path.name)
            continue
        image_stem = stem[:len(stem) - len(mask_suffix)]
        if image_stem in images:
            by_image_stem[image_stem] = path
        else:
            lonely_masks.append(path.name)
    lonely_images = sorted(set(images) - set(by_image_stem))
    if lonely_images or lonely_masks:
        parts = []
        if lonely_images:
            shown = ", ".join(images[s].name for s in lonely_images[:UNPAIRED_SHOWN])
            parts.append(f"{len(lonely_images)} image(s) without a mask '<stem>{mask_suffix}.*' "
                         f"(first: {shown})")
        if lonely_masks:
            parts.append(f"{len(lonely_masks)} mask(s) without an image "
                         f"(first: {', '.join(lonely_masks[:UNPAIRED_SHOWN])})")
        raise CommandError(f"unpaired files in {images_dir} / {masks_dir}: " + "; ".join(parts)
                           + (". Pass --mask-suffix if mask names carry one" if not mask_suffix else ""))
    cases = [Case(stem, images[stem], by_image_stem[stem]) for stem in sorted(images)]
    for case in cases:
        if _same_bytes(case.image_path, case.mask_path):
            raise CommandError(f"mask {case.mask_path} is a byte copy of its image "
                               f"{case.image_path}: --masks must hold the lesion masks")
    return cases


def check_cases(cases: list[Case]) -> None:
    """Refuse, before any model work, the first image whose header fails ``read_rgb``'s checks
    (format, pixel limit, EXIF orientation) and the first mask that is unreadable, refused by
    ``imageio.read_mask``'s rules (0/1, colour, transparency) or of another size."""
    from endoexplain_core.data import imageio

    for case in cases:
        try:
            width, height = imageio.check_image_header(case.image_path)
            mask = imageio.read_mask(case.mask_path)
            imageio.check_mask_size(case.image_path, (height, width), case.mask_path, mask.shape)
        except (imageio.ImageReadError, imageio.MaskSizeError) as error:
            raise CommandError(str(error)) from error


# ----------------------------------------------------------------------------- the model


def resolve_temperature(temperature: float | None, calibration_logits: str | None) -> tuple[float, str]:
    """(T, how it was obtained). ``--temperature`` as given; ``--calibration-logits`` CSV with
    columns logit_neg, logit_pos, target (0/1) fitted by ``analysis.calibration``; else T = 1."""
    if temperature is not None and calibration_logits:
        raise CommandError("give either --temperature or --calibration-logits, not both")
    if temperature is not None:
        if not (math.isfinite(temperature) and temperature > 0):
            raise CommandError(f"--temperature must be a finite number > 0, got {temperature}")
        return float(temperature), "given (--temperature)"
    if calibration_logits:
        import pandas as pd

        from endoexplain_core.analysis import calibration

        path = Path(calibration_logits)
        if not path.is_file():
            raise CommandError(f"calibration logits file {path} does not exist")
        try:
            table = pd.read_csv(path)
        except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as error:
            raise CommandError(f"{path}: not a readable CSV ({type(error).__name__})") from error
        missing = sorted({"logit_neg", "logit_pos", "target"} - set(table.columns))
        if missing:
            raise CommandError(f"{path}: missing columns {missing} (need logit_neg, logit_pos, target)")
        try:
            z = calibration.logit_difference(table["logit_neg"].to_numpy(float),
                                             table["logit_pos"].to_numpy(float))
            fitted = calibration.fit_temperature(z, table["target"].to_numpy())
        except (ValueError, RuntimeError) as error:
            raise CommandError(f"{path}: cannot fit a temperature: {error}") from error
        return fitted, f"fitted on {len(table)} validation logits ({path.name})"
    return 1.0, "none (T = 1: the score is the uncalibrated sigmoid of the logit difference)"


# ----------------------------------------------------------------------------- the audit


def run_audit(args: argparse.Namespace) -> dict:
    """``endoexplain audit``: every output under ``args.out``; returns the run summary."""
    from endoexplain_core.methods import CAM_METHODS
    from endoexplain_core.models import networks

    methods = _check_methods(args.methods, CAM_METHODS)
    temperature, calibration_note = resolve_temperature(args.temperature, args.calibration_logits)
    if args.torchscript and not args.trust_code:
        raise CommandError("--torchscript runs the code stored in the archive when it is loaded; "
                           "add --trust-code if you trust the file, or export a state dict instead")
    cases = pair_by_stem(args.images, args.masks, args.mask_suffix)
    check_cases(cases)
    model, weights_sha = load_user_model(args.arch, args.weights, torchscript=args.torchscript,
                                         positive_class=args.positive_class)
    try:
        layer_name, layer = networks.resolve_target_layer(model, args.arch, args.target_layer)
    except ValueError as error:
        raise CommandError(str(error)) from error
    probe_model(model, layer, layer_name, args.image_size)
    gate = None
    if args.gate:
        from endoexplain_core import gate_command

        gate = gate_command.read_gate_folder(args.gate, arch=args.arch, target_layer=layer_name,
                                             image_size=args.image_size)
    # Only now is anything created: every refusal above leaves the disk as it was.
    if (Path(args.out) / GATE_RECORD_NAME).is_file():
        raise CommandError(f"--out {args.out} holds a gate ({GATE_RECORD_NAME}); write the audit "
                           f"to a folder of its own")
    inputs = {"--images": args.images, "--masks": args.masks}
    out = check_output_folder(args.out, {**inputs, "--gate": args.gate} if args.gate else inputs)
    with output_folder_lock(out, args.wait_for_lock):
        staging = staging_folder(out)
        try:
            try:
                record = _audit_into(args, staging, methods, temperature, calibration_note, cases,
                                     model, weights_sha, layer_name, layer, gate)
            except OSError as error:  # a full disk or quota while staging: --out is untouched
                raise CommandError(f"stopped by an OS error, nothing was moved into {out} (its "
                                   f"previous files and {RECORD_NAME} are unchanged): "
                                   f"{_os_error_text(error, staging, out)}") from error
            try:
                record["written"] = [str(p) for p in commit_outputs(staging, out, record)]
            except OSError as error:
                raise CommandError(f"moving the finished files into {out} failed, so it has no "
                                   f"{RECORD_NAME} now (endoexplain verify says so; rerun the "
                                   f"audit): {_os_error_text(error, staging, out)}") from error
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return record


def _audit_into(args: argparse.Namespace, out: Path, methods, temperature: float,
                calibration_note: str, cases: list[Case], model, weights_sha: str,
                layer_name: str, layer, gate=None) -> dict:
    """The body of ``run_audit``, run while ``out`` is locked: the command's steps in their
    order, each writing into the staging folder that is committed as a whole. ``gate``: (gate
    table, gate record) of ``--gate`` (``gate_command.read_gate_folder``), or None."""
    from endoexplain_core import artefacts
    from endoexplain_core.analysis import audit_schema, map_diagnostics, validity_gate
    from endoexplain_core.data.imageio import read_image_and_mask
    from endoexplain_core.figures import audit_report, style
    from endoexplain_core.numerics import resolve_device

    name = args.name or Path(args.weights).stem
    table_path, deletion_path = out / "case_table.parquet", out / "random_deletion.parquet"
    summary = _write_case_tables(args, name, temperature, cases, model, layer_name, layer,
                                 table_path, deletion_path)
    device = resolve_device(args.device)
    style.apply()
    table = audit_schema.read_audit_table(table_path)
    # The audited maps are checked too (position and tie rules; the sign rule needs the
    # map-identity table of a run): a degenerate method's rates are not localisation.
    degeneracy = map_diagnostics.degenerate_maps(table, methods=methods)
    degenerate = map_diagnostics.degenerate_methods(degeneracy)
    report = audit_report.audit_summary(
        table, audit_schema.read_random_deletion(deletion_path), model, layer_name, arch=args.arch,
        score_threshold=args.score_threshold, replicates=args.bootstrap_replicates, seed=args.seed,
        # With --gate, the notebooks' marking (validity_gate.mark_table: a verdict column and a
        # dagger on every method that did not pass); without, no gate of its own: unmarked.
        gate=gate[0] if gate else None, mark_gate=gate is not None, methods=methods,
        degeneracy=degeneracy)
    not_validated = tuple(validity_gate.failing_methods(gate[0])) if gate else ()
    by_id = {case.sample_id: case for case in cases}
    selection, figure, iou_check = audit_report.case_figure(
        table, model, layer,
        lambda ids: {sid: read_image_and_mask(by_id[sid].image_path, by_id[sid].mask_path,
                                              decode_size=args.image_size) for sid in ids},
        score_threshold=args.score_threshold, top_fraction=args.top_fraction,
        image_size=args.image_size, batch_size=args.batch_size, device=device,
        not_validated=not_validated, degenerate=degenerate)
    written = [table_path, deletion_path]
    written += artefacts.save_table(report.summary, "table4_summary", out)
    written += artefacts.save_table(report.formatted, "table4_summary_formatted", out)
    written += artefacts.save_table(report.ties, "map_ties", out)
    written += artefacts.save_table(degeneracy, "map_degeneracy", out)
    written += artefacts.save_figure(figure, "case_figure", out,
                                     footer=validity_gate.FIGURE_GATE_NOTE if not_validated else "")
    written += artefacts.save_table(iou_check, "case_figure_iou_check", out, float_format="{:.4f}")
    import matplotlib.pyplot as plt

    plt.close(figure)

    record = {
        "command": "endoexplain audit", "endoexplain_version": endoexplain_core.__version__, "arch": args.arch, "weights": str(args.weights),
        "weights_sha256": weights_sha, "torchscript": args.torchscript,
        "checkpoint_id": name, "dataset": args.dataset, "target_layer": layer_name,
        "positive_class": args.positive_class, "image_size": args.image_size,
        "temperature": temperature, "calibration": calibration_note,
        "score_threshold": args.score_threshold, "top_fraction": args.top_fraction,
        "random_deletion_repetitions": args.repetitions,
        "bootstrap_replicates": args.bootstrap_replicates, "seed": args.seed,
        "methods_reported": list(methods), "n_pairs": len(cases),
        "n_audited": summary["n_audited"],
        "n_empty_masks_excluded": summary["n_empty_masks_excluded"],
        "excluded_sample_ids": summary["excluded_sample_ids"],
        "n_high_score": report.n_high_score, "selected_cases": selection,
        "degenerate_methods": degenerate,
        "identical_by_construction": [list(g) for g in report.identical],
        "statement": report.identical_statement,
        "audit_seconds": summary["seconds"],
        "validity_gate": _gate_entry(args.gate, gate, not_validated),
    }
    if args.report == "html":
        write_html_report(out, record, report.formatted, report.ties, iou_check,
                          out / "case_figure.png",
                          [Path(p) for p in written] + [out / RECORD_NAME])
    return record


def _gate_entry(folder: str | None, gate, not_validated) -> dict:
    """What ``audit.json`` and the report say about the validity gate: the ``--gate`` folder,
    its verdicts and record hash and the methods marked not validated; without a gate, that no
    method is validated and the command that would validate them."""
    if gate is None:
        return {"folder": None, "not_validated": list(_all_cam_methods()),
                "note": "no method is validated: no --gate folder was given (run endoexplain gate "
                        "--arch ARCH --image-size PX --out GATE_DIR, then audit with --gate GATE_DIR)"}
    table, record = gate
    return {"folder": str(folder), "gate_json_sha256": files.sha256_file(Path(folder) / GATE_RECORD_NAME),
            "verdicts": dict(zip(table["method"], table["verdict"])),
            "not_validated": list(not_validated),
            "replicate_seeds": record.get("replicate_seeds"), "steps": record.get("steps"),
            "init_weights_sha256": record.get("init_weights_sha256")}


def _all_cam_methods() -> tuple[str, ...]:
    from endoexplain_core.methods import CAM_METHODS

    return CAM_METHODS


def gate_line(record: dict) -> str:
    """The report's first line: which methods the gate validated, or that none is and how to
    run the gate."""
    entry = record["validity_gate"]
    if entry["folder"] is None:
        arch, layer = html.escape(record["arch"]), html.escape(record["target_layer"])
        return (f"No method is validated: this audit was run without a validity gate, so none of "
                f"its CAM maps is shown to find planted evidence at {arch} {layer}, "
                f"{record['image_size']} px. Run <code>endoexplain gate --arch {arch} "
                f"--target-layer {layer} --image-size {record['image_size']} --out GATE_DIR</code>, "
                f"then this audit with <code>--gate GATE_DIR</code>.")
    from endoexplain_core.methods import method_label

    passed = [method_label(m) for m, v in entry["verdicts"].items() if v == "passes"]
    marked = [method_label(m) for m in entry["not_validated"]]
    return (f"Validity gate <code>{html.escape(entry['folder'])}</code>: validated "
            f"{html.escape(', '.join(passed) or 'no method')}; not validated (&dagger;): "
            f"{html.escape(', '.join(marked) or 'none')}.")


def _write_case_tables(args: argparse.Namespace, name: str, temperature: float,
                       cases: list[Case], model, layer_name: str, layer, table_path: Path,
                       deletion_path: Path) -> dict:
    """Run ``audit.audit_checkpoint`` on the cases; an unreadable frame or mask, or no
    non-empty mask, is a ``CommandError``. Returns the audit's summary."""
    from endoexplain_core.analysis import audit
    from endoexplain_core.data.imageio import ImageReadError, MaskSizeError, read_image_and_mask

    metadata = {"checkpoint_id": name, "arch": args.arch, "seed": -1, "control": "none",
                "target_layer": layer_name}

    def read_cases():
        for case in cases:
            # decoded for the input size, as the package's own runs read every model input
            image, mask = read_image_and_mask(case.image_path, case.mask_path,
                                              decode_size=args.image_size)
            yield case.sample_id, image, mask

    try:
        return audit.audit_checkpoint(
            model, metadata, temperature, read_cases(), dataset=args.dataset,
            image_size=args.image_size, table_path=table_path, random_deletion_path=deletion_path,
            top_fraction=args.top_fraction, repetitions=args.repetitions,
            batch_size=args.batch_size, device=args.device, target_layer=(layer_name, layer),
            total=len(cases))
    except (ImageReadError, MaskSizeError) as error:
        raise CommandError(str(error)) from error
    except ValueError as error:
        if "no case with a non-empty mask" in str(error) or "mask size" in str(error):
            raise CommandError(str(error)) from error
        raise


# ----------------------------------------------------------------------------- the report


def write_html_report(out: Path, record: dict, formatted, ties, iou_check, figure_png: Path,
                      written: list[Path]) -> Path:
    """``<out>/report.html``: one self-contained page (inline CSS, the figure as a data URI,
    no scripts and no links outside the page except to the files written beside it)."""
    def table_html(frame) -> str:
        return frame.to_html(index=False, escape=True, border=0, na_rep="\u2013")

    figure = base64.b64encode(figure_png.read_bytes()).decode("ascii")
    from endoexplain_core.marks import GATE_FOOTNOTE

    gate_note = f" {html.escape(GATE_FOOTNOTE)}" if record["validity_gate"]["not_validated"] and record["validity_gate"]["folder"] else ""
    settings = {key: record[key] for key in (
        "endoexplain_version", "arch", "weights", "weights_sha256", "target_layer", "positive_class", "image_size",
        "temperature", "calibration", "score_threshold", "top_fraction",
        "random_deletion_repetitions", "bootstrap_replicates", "seed", "dataset")}
    settings_rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
                            for k, v in settings.items())
    file_rows = "".join(f'<li><a href="{html.escape(p.name)}">{html.escape(p.name)}</a></li>'
                        for p in written if p.parent == out)
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>endoExplain audit: {html.escape(record['checkpoint_id'])}</title>
<style>{REPORT_CSS}</style></head><body>
<p class="gate"><strong>{gate_line(record)}</strong></p>
<h1>endoExplain audit of <code>{html.escape(record['checkpoint_id'])}</code></h1>
<p>{record['n_audited']} of {record['n_pairs']} image-mask pairs audited;
{record['n_empty_masks_excluded']} excluded because the mask is empty after thresholding at 128
and resizing. {record['n_high_score']} images reach a score of at least
{record['score_threshold']:.2f} (panel A).</p>
<p class="note">The score is sigmoid(z / T) with z = logit(positive) &minus; logit(negative);
calibration: {html.escape(record['calibration'])}. It is a score, not a probability.
Rates have Wilson 95% intervals, means image-bootstrap percentile 95% intervals. Every map is
scored on the same images: a constant map (no peak) counts as a peak failure.</p>
<h2>Settings</h2><table>{settings_rows}</table>
<h2>Summary (Table 4 layout)</h2>{table_html(formatted)}
<p class="note">Panel A: images with score &ge; threshold; panel B: all audited images.
Eigen-CAM* is class-agnostic.{gate_note}</p>
<h2>Map diagnostics</h2><p>{html.escape(record['statement'])}</p>{table_html(ties)}
<h2>Rule-selected cases</h2>
<p>Selected: {html.escape(json.dumps(record['selected_cases']))}</p>
<img alt="rule-selected case figure" src="data:image/png;base64,{figure}">
<h3>Rendered-IoU check</h3>{table_html(iou_check)}
<h2>Files</h2><ul>{file_rows}</ul>
<p class="note">Written {datetime.date.today().isoformat()} by <code>endoexplain audit</code>.</p>
</body></html>
"""

    return files.write_text_atomic(out / "report.html", page)


# ----------------------------------------------------------------------------- the parser


def build_parser() -> argparse.ArgumentParser:
    """The ``endoexplain`` argument parser (subcommands ``audit`` and ``verify``)."""
    parser = argparse.ArgumentParser(
        prog="endoexplain",
        description="endoExplain: audit where CAM explanations of a polyp classifier point.",
        epilog="Run 'endoexplain audit --help' for the audit of your own model.")
    parser.add_argument("--version", action="version", version=f"endoexplain {endoexplain_core.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    audit = commands.add_parser(
        "audit", help="audit your own classifier on a folder of masked frames",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Audit a 2-class polyp classifier's CAMs (Grad-CAM, Grad-CAM++, XGrad-CAM, HiResCAM,\n"
            "Eigen-CAM*) against lesion masks, beside a random heatmap and a centre baseline.\n"
            "Images and masks are paired by file stem; masks are thresholded at 128 (white =\n"
            "lesion) and empty masks are excluded and counted."),
        epilog=(
            "outputs in --out: case_table.parquet (one row per image and map),\n"
            "random_deletion.parquet, table4_summary.{csv,md,tex} (+ _formatted),\n"
            "map_ties.*, map_degeneracy.*, case_figure.{png,pdf}, case_figure_iou_check.*, audit.json, report.html\n\n"
            "example:\n"
            "  endoexplain audit --arch resnet18 --weights model.safetensors \\\n"
            "      --images frames/ --masks masks/ --mask-suffix _mask --out audit_out/\n\n"
            "exit codes: 0 done, 2 refused with a one-line reason, 1 unexpected error"))
    _add_model_arguments(audit.add_argument_group("model"))
    _add_data_arguments(audit.add_argument_group("data"))
    _add_protocol_arguments(audit.add_argument_group("protocol"))
    _add_run_arguments(audit.add_argument_group("run"))
    audit.set_defaults(handler=run_audit)
    from endoexplain_core import gate_command

    gate = commands.add_parser(
        "gate", help="validate the CAM methods on planted truth at your architecture, layer and size",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Notebook 03's validity gate at your architecture, target layer and input size: per\n"
            "replicate, models trained on planted frames (a lesion model, a shortcut model on a\n"
            "dye cue, a shuffled-label control, untrained networks) are audited, and each CAM\n"
            "method passes, fails or is inconclusive. The estimated time is printed before the\n"
            "training starts. Then: endoexplain audit ... --gate DIR marks what did not pass."),
        epilog=(
            "outputs in --out: table_validity_gate{,_clauses,_replicates,_stability,_models}\n"
            ".{csv,md,tex}, gate_cases.parquet, replicates/seed_<k>/ (the models' audit tables),\n"
            "example_maps.{png,pdf}, gate.json (the commit record), report.html\n\n"
            "example:\n"
            "  endoexplain gate --arch resnet18 --image-size 128 --out gate_out/\n"
            "  endoexplain audit --arch resnet18 --image-size 128 --weights model.safetensors \\\n"
            "      --images frames/ --masks masks/ --gate gate_out/ --out audit_out/\n\n"
            "exit codes: 0 done, 2 refused with a one-line reason, 1 unexpected error"))
    gate_command.add_arguments(gate)
    gate.set_defaults(handler=gate_command.run)
    verify = commands.add_parser(
        "verify", help="check an audit or gate folder's files against its record",
        description="Check every file listed in DIR/audit.json or DIR/gate.json (the record an "
                    "audit or gate writes last) against its SHA-256. Exit 0: all match; 2: a file "
                    "is missing or changed, or there is no record (an interrupted run).")
    verify.add_argument("folder", metavar="DIR", help="an endoexplain audit or gate --out folder")
    verify.set_defaults(handler=run_verify)
    return parser


def _add_model_arguments(model) -> None:
    """The audited model: architecture, weights, layer, input size, calibration."""
    from endoexplain_core.models.networks import AUDITABLE_ARCHITECTURES

    model.add_argument("--arch", required=True, metavar="ARCH",
                       help=f"torchvision architecture: {', '.join(AUDITABLE_ARCHITECTURES)}")
    model.add_argument("--weights", required=True, metavar="FILE",
                       help="2-class weights: .safetensors, or a torch state dict (.pt/.pth, "
                            "read with weights_only=True; pickled code is refused)")
    model.add_argument("--torchscript", action="store_true",
                       help="--weights is a TorchScript archive; its parameters are loaded into ARCH "
                            "(needs --trust-code)")
    model.add_argument("--trust-code", action="store_true",
                       help="allow --torchscript: loading a TorchScript archive runs the code "
                            "stored in it; only for files you trust")
    model.add_argument("--target-layer", metavar="NAME", default=None,
                       help="CAM target layer as a module path (default: the protocol's layer "
                            "for ARCH, e.g. layer4.1 for resnet18)")
    model.add_argument("--positive-class", type=int, default=1, metavar="{0,1}",
                       help="output index of the polyp class (default 1)")
    model.add_argument("--image-size", type=int, default=256, metavar="PX",
                       help="square model input size in pixels (default 256)")
    calibration = model.add_mutually_exclusive_group()
    calibration.add_argument("--temperature", type=float, default=None, metavar="T",
                             help="temperature T of the score sigmoid(z / T) (default 1)")
    calibration.add_argument("--calibration-logits", metavar="CSV", default=None,
                             help="fit T on validation logits: CSV with logit_neg, logit_pos, target")


def _add_data_arguments(data) -> None:
    """The masked frames: folders, mask suffix, dataset name."""
    data.add_argument("--images", required=True, metavar="DIR",
                      help="folder of frames (JPEG, PNG, TIFF, BMP)")
    data.add_argument("--masks", required=True, metavar="DIR",
                      help="folder of masks named <image stem><suffix>.<ext>")
    data.add_argument("--mask-suffix", default="", metavar="SUFFIX",
                      help="mask name suffix after the image stem, e.g. _mask (default none)")
    data.add_argument("--dataset", default=DEFAULT_DATASET, metavar="NAME",
                      help=f"dataset name written in the case table (default {DEFAULT_DATASET})")


def _add_protocol_arguments(protocol) -> None:
    """The protocol values: methods shown, panel A threshold, top area, deletions, bootstrap."""
    protocol.add_argument("--methods", nargs="+", metavar="METHOD", default=None,
                          help="CAM methods shown in the summary (default all five; the case "
                               "table always holds all of them)")
    protocol.add_argument("--score-threshold", type=float, default=0.90, metavar="S",
                          help="panel A: images with score >= S (default 0.90)")
    protocol.add_argument("--top-fraction", type=float, default=0.20, metavar="F",
                          help="fraction of pixels in a map's top area (default 0.20)")
    protocol.add_argument("--repetitions", type=int, default=20, metavar="N",
                          help="random deletions per image (default 20)")
    protocol.add_argument("--bootstrap-replicates", type=int, default=2000, metavar="N",
                          help="image-bootstrap replicates for the CIs (default 2000)")
    protocol.add_argument("--seed", type=int, default=20260721, help="bootstrap seed")


def _add_run_arguments(run) -> None:
    """Where and how the audit runs: output folder, device, batch, lock, report."""
    add_run_arguments(run, device_help="where to run (default auto: CUDA when available)",
                      batch_help="images per CAM/deletion batch (memory only; default 16)")
    run.add_argument("--name", default=None, help="model name in the tables (default: weights file stem)")
    run.add_argument("--report", default="html", choices=("html", "none"),
                     help="write the self-contained report.html (default html)")
    run.add_argument("--gate", default=None, metavar="DIR",
                     help="an endoexplain gate folder made at this --arch, --target-layer and "
                          "--image-size: every CAM method it did not pass gets a dagger (not "
                          "validated); without it, no method is validated")


def run_verify(args: argparse.Namespace) -> str:
    """``endoexplain verify DIR``: the one-line verdict; ``CommandError`` listing the problems."""
    problems = verify_folder(args.folder)
    if problems:
        shown = "; ".join(problems[:UNPAIRED_SHOWN])
        more = f" (and {len(problems) - UNPAIRED_SHOWN} more)" if len(problems) > UNPAIRED_SHOWN else ""
        raise CommandError(f"{args.folder} does not match its record: {shown}{more}")
    listed = len(_listed_files(Path(args.folder)))
    return f"{listed} files match {Path(args.folder) / record_in(Path(args.folder))}"


def _check_numbers(args: argparse.Namespace) -> None:
    if not 0 < args.score_threshold < 1:
        raise CommandError(f"--score-threshold must be in (0, 1), got {args.score_threshold}")
    if not 0 < args.top_fraction < 1:
        raise CommandError(f"--top-fraction must be in (0, 1), got {args.top_fraction}")
    if not (math.isfinite(args.wait_for_lock) and args.wait_for_lock >= 0):
        raise CommandError(f"--wait-for-lock must be a finite number of seconds >= 0, got {args.wait_for_lock}")
    for name in ("image_size", "repetitions", "bootstrap_replicates", "batch_size"):
        if getattr(args, name) < 1:
            raise CommandError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``endoexplain`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    from endoexplain_core.presentation import printable

    try:
        if args.command == "audit":
            _check_numbers(args)
        result = args.handler(args)
    except CommandError as error:
        print(f"endoexplain {args.command}: {printable(str(error))}", file=sys.stderr)
        return 2
    if args.command == "audit":
        result = (f"{result['n_audited']} images audited ({result['n_empty_masks_excluded']} "
                  f"empty masks excluded); outputs in {args.out}")
    elif args.command == "gate":
        result = ("; ".join(f"{method} {verdict}" for method, verdict in result["verdicts"].items())
                  + f" ({result['seconds']:.0f} s); outputs in {args.out}")
    print(printable(f"endoexplain {args.command}: {result}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
