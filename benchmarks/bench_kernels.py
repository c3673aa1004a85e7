"""Benchmark of the audit kernels against their physical floor and against pytorch-grad-cam.

Prints, for each architecture, from one run on the same batch:
  fused/fwd        fused 5-CAM kernel time / one no-grad forward            (target <= 1.15)
  library/fused    pytorch-grad-cam's five methods one by one / fused       (target >= 10)
  audit/floor      whole per-image audit (5 CAMs, 2 baselines, metrics, 5 CAM + 1 lesion +
                   20 random deletions) / its 27 no-grad forwards             (target <= 1.15)
and the peak memory of streaming 200 vs 1,000 images through the audit in batches, plus the
memory after repeated streams (target: flat). CPU memory is the resident set's high-water mark
(reset through /proc/self/clear_refs) and tracemalloc's Python-side peak; on CUDA it is
torch.cuda.max_memory_allocated.

Usage: python benchmarks/bench_kernels.py --archs resnet34 --image-size 256 --batch 16 --repeats 5
(forward, fused and audit are timed interleaved, round after round; the minimum is reported)
The timings use random weights (same cost as trained ones) and random images.
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc
from pathlib import Path

import torch
from pytorch_grad_cam import EigenCAM, GradCAM, GradCAMPlusPlus, HiResCAM, XGradCAM
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

from endoexplain_core.analysis import audit

from endoexplain_core.kernels import cams

from endoexplain_core.models import networks

FRACTION = 0.20
RANDOM_REPETITIONS = 20
LIBRARY_CLASSES = (GradCAM, GradCAMPlusPlus, XGradCAM, HiResCAM, EigenCAM)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_seconds(function, repeats: int, device: torch.device) -> float:
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        function()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _interleaved_min_seconds(functions: dict, repeats: int, device: torch.device) -> dict:
    """Minimum wall time of each function over ``repeats`` rounds that call them in turn."""
    times = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            _sync(device)
            start = time.perf_counter()
            function()
            _sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: min(values) for name, values in times.items()}


def _disc_masks(batch: int, size: int, device: torch.device) -> torch.Tensor:
    """bool (B, S, S) lesion discs of varying centre, as stand-ins for real masks."""
    rows = torch.arange(size, device=device, dtype=torch.float32)[:, None]
    cols = torch.arange(size, device=device, dtype=torch.float32)[None, :]
    offsets = torch.linspace(0.3, 0.7, batch, device=device) * size
    return ((rows - offsets[:, None, None]) ** 2 + (cols - size / 2) ** 2) < (size / 6) ** 2


# Forwards of one audited image: the CAM forward, 5 CAM top-area deletions, the lesion
# deletion and the random deletions (``audit.audit_batch``); the audit's physical floor.
AUDIT_FORWARDS = 1 + 6 + RANDOM_REPETITIONS


def audit_batch(model, layer, images: torch.Tensor, masks: torch.Tensor, sample_ids):
    """The spatial audit of one batch exactly as notebooks 04-06 run it (``audit.audit_batch``):
    5 CAMs + 2 baselines, metrics, 5 CAM deletions, the lesion deletion and 20 random deletions.
    ``layer``: the target layer module."""
    return audit.audit_batch(model, layer, images, masks, list(sample_ids), temperature=1.0,
                             top_fraction=FRACTION, repetitions=RANDOM_REPETITIONS)


def _rss_reset() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (the peak RSS)
        return True
    except OSError:
        return False


def _rss_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def stream_peak_mib(model, layer, n_images, batch, size, device) -> tuple[float, float]:
    """Peak memory (MiB) while streaming n_images through audit_batch: (device, tracemalloc).

    On CUDA the device figure is torch.cuda.max_memory_allocated; on CPU it is the growth of
    the resident set's high-water mark over the resident set at the start of the stream.
    """
    masks = _disc_masks(batch, size, device)
    generator = torch.Generator().manual_seed(0)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    elif not _rss_reset():
        raise RuntimeError("cannot reset the peak RSS through /proc/self/clear_refs")
    rss_at_start = _rss_mib("VmRSS")
    tracemalloc.start()
    for start in range(0, n_images, batch):
        count = min(batch, n_images - start)
        images = torch.randn(count, 3, size, size, generator=generator).to(device)
        audit_batch(model, layer, images, masks[:count], [f"img{start + i}" for i in range(count)])
    python_peak = tracemalloc.get_traced_memory()[1] / 2 ** 20
    tracemalloc.stop()
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 20, python_peak
    return _rss_mib("VmHWM") - rss_at_start, python_peak


def time_kernels(model, layer_name: str, layer, images: torch.Tensor, masks: torch.Tensor, args,
                 device: torch.device) -> dict:
    """Seconds of forward / fused / audit (interleaved, minimum of ``args.repeats``) and of the
    library (one run) on one batch, and their ratios fused/fwd, library/fused, audit/floor."""
    sample_ids = [f"img{i}" for i in range(len(images))]

    def forward():
        with torch.no_grad():
            model(images)

    def fused():
        cams.compute_cams(model, layer_name, images)

    def library():
        targets = [ClassifierOutputTarget(1)] * len(images)
        for cam_class in LIBRARY_CLASSES:
            with cam_class(model=model, target_layers=[layer]) as explainer:
                explainer(input_tensor=images, targets=targets)

    forward()  # warm-up (allocator, kernels)
    fused()
    # Interleaved: forward, fused, audit, forward, fused, audit, ... and the minimum of each,
    # so that load from other processes on a shared machine hits all three alike.
    timings = _interleaved_min_seconds(
        {"forward": forward, "fused": fused,
         "audit": lambda: audit_batch(model, layer, images, masks, sample_ids)},
        args.repeats, device)
    t_forward, t_fused, t_audit = timings["forward"], timings["fused"], timings["audit"]
    t_library = _median_seconds(library, 1, device)  # slow: one run is enough
    model.zero_grad(set_to_none=True)  # the library fills parameter gradients
    return {"forward_s": t_forward, "fused_s": t_fused, "library_s": t_library, "audit_s": t_audit,
            "fused/fwd": t_fused / t_forward, "library/fused": t_library / t_fused,
            "audit/floor": t_audit / (AUDIT_FORWARDS * t_forward)}


def random_weight_setup(arch: str, batch: int, image_size: int, device: torch.device):
    """Seeded random-weight ``arch`` in eval mode on ``device``, its target layer, and a batch
    of random frames with disc masks: (model, layer_name, layer, images, masks)."""
    torch.manual_seed(0)
    model = networks.build_model(arch).eval().to(device)
    layer_name, layer = networks.resolve_target_layer(model, arch)
    images = torch.randn(batch, 3, image_size, image_size,
                         generator=torch.Generator().manual_seed(1)).to(device)
    return model, layer_name, layer, images, _disc_masks(batch, image_size, device)


def bench_architecture(arch: str, args, device: torch.device) -> dict:
    model, layer_name, layer, images, masks = random_weight_setup(arch, args.batch, args.image_size, device)
    timings = time_kernels(model, layer_name, layer, images, masks, args, device)

    memory = {}
    for n_images in args.memory_images:
        memory[n_images] = stream_peak_mib(model, layer, n_images, args.batch, args.memory_image_size, device)
    repeated = [stream_peak_mib(model, layer, args.memory_images[0], args.batch,
                                args.memory_image_size, device)[0] for _ in range(2)]
    return {"arch": arch, **timings, "memory": memory, "repeated": repeated}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--archs", nargs="+", default=list(networks.ARCHITECTURES), choices=networks.ARCHITECTURES)
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5,
                        help="interleaved timing rounds (minimum reported; the library: one run)")
    parser.add_argument("--memory-images", type=int, nargs=2, default=[200, 1000],
                        help="image counts streamed for the memory comparison")
    parser.add_argument("--memory-image-size", type=int, default=64,
                        help="image size for the memory streams (small on CPU to keep them short)")
    args = parser.parse_args()
    device = torch.device(args.device)
    print(f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"image {args.image_size}px, batch {args.batch}, repeats {args.repeats}; memory streams at "
          f"{args.memory_image_size}px")
    unit = "MiB (cuda max allocated)" if device.type == "cuda" else "MiB (peak RSS growth)"
    small, large = args.memory_images
    header = (f"{'arch':16s} {'fwd s':>7s} {'fused s':>8s} {'fused/fwd':>9s} {'lib s':>7s} {'lib/fused':>9s} "
              f"{'audit s':>8s} {'audit/27fwd':>11s} | {small} img {large} img  repeated {small}  [{unit}]; "
              f"python peak {small}/{large} MiB")
    print(header)
    for arch in args.archs:
        r = bench_architecture(arch, args, device)
        (mem_small, py_small), (mem_large, py_large) = r["memory"][small], r["memory"][large]
        print(f"{arch:16s} {r['forward_s']:7.3f} {r['fused_s']:8.3f} {r['fused/fwd']:9.2f} {r['library_s']:7.2f} "
              f"{r['library/fused']:9.1f} {r['audit_s']:8.2f} {r['audit/floor']:11.2f} | "
              f"{mem_small:7.0f} {mem_large:7.0f}  {' '.join(f'{m:.0f}' for m in r['repeated'])}; "
              f"{py_small:.1f}/{py_large:.1f}", flush=True)


if __name__ == "__main__":
    main()
