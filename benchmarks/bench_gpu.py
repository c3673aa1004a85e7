"""GPU benchmark of the audit and training paths, in one command; the same ratios on a CPU.

For each architecture at --image-size (default 256) and --batch (default 64), on random
weights and random images (same cost as trained ones), it prints and writes to --output:

  fused/fwd        fused 5-CAM kernel / one no-grad inference forward (interleaved, minimum)
  library/fused    pytorch-grad-cam's five methods one by one / the fused kernel
  audit/27fwd      the whole per-image audit (``audit.audit_batch``: 5 CAMs, 2 baselines,
                   metrics, 5 CAM + 1 lesion + 20 random deletions) / its floor of 27 no-grad forwards (1 + 5 + 1 + 20)
  audit img/s      images per second through that audit
  train img/s      optimiser steps of ``models.training`` (AdamW, cross-entropy), float32 and,
                   on CUDA, float16 autocast with a gradient scaler (the profile's
                   ``mixed_precision``); on a CPU the AMP column is n/a
  peak MiB         torch.cuda.max_memory_allocated over the audit (CUDA) or the growth of the
                   resident set's high-water mark (CPU)

The numerics policy of the package (``endoexplain_core.numerics``: deterministic cuDNN, no
TF32) is applied first, as in every stage, and printed.

Usage (GPU):  python benchmarks/bench_gpu.py
       (CPU):  python benchmarks/bench_gpu.py --device cpu --image-size 128 --batch 8 --repeats 2
Output file: benchmarks/results/bench_gpu_<device>.txt (README, Performance, links it).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import nn

import bench_kernels  # same folder: the interleaved timings and the audit batch
from endoexplain_core import numerics
from endoexplain_core.models import networks, training

RESULTS = Path(__file__).resolve().parent / "results"


def training_images_per_second(model: nn.Module, images: torch.Tensor, steps: int,
                               device: torch.device, mixed_precision: bool) -> float:
    """Images per second of ``steps`` optimiser steps of the package's training loop."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    scaler = torch.amp.GradScaler(device.type, enabled=training.use_mixed_precision(device, mixed_precision))
    targets = (torch.arange(len(images)) % 2).to(device)
    loader = [(images, targets, None)] * (steps + 1)
    loss = nn.CrossEntropyLoss()
    training.train_one_epoch(model, loader[:1], 1, optimizer, scheduler, scaler, loss, device,
                              mixed_precision)  # warm-up (allocator, autotuning)
    bench_kernels._sync(device)
    started = time.perf_counter()
    training.train_one_epoch(model, loader, steps, optimizer, scheduler, scaler, loss, device,
                              mixed_precision)
    bench_kernels._sync(device)
    model.eval()
    return steps * len(images) / (time.perf_counter() - started)


def audit_peak_mib(model: nn.Module, layer: nn.Module, images: torch.Tensor, masks: torch.Tensor,
                   device: torch.device) -> float:
    """Peak memory of one audit batch: CUDA max allocated, or CPU peak-RSS growth."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    elif not bench_kernels._rss_reset():
        return float("nan")
    start = bench_kernels._rss_mib("VmRSS")
    bench_kernels.audit_batch(model, layer, images, masks, [f"img{i}" for i in range(len(images))])
    bench_kernels._sync(device)
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 20
    return bench_kernels._rss_mib("VmHWM") - start


def bench_architecture(arch: str, args, device: torch.device) -> dict:
    model, layer_name, layer, images, masks = bench_kernels.random_weight_setup(
        arch, args.batch, args.image_size, device)
    timing_args = argparse.Namespace(batch=args.batch, image_size=args.image_size, repeats=args.repeats)
    timings = bench_kernels.time_kernels(model, layer_name, layer, images, masks, timing_args, device)
    peak = audit_peak_mib(model, layer, images, masks, device)
    fp32 = training_images_per_second(model, images, args.train_steps, device, mixed_precision=False)
    amp = (training_images_per_second(model, images, args.train_steps, device, mixed_precision=True)
           if device.type == "cuda" else float("nan"))
    return {"arch": arch, **timings, "audit_img_s": args.batch / timings["audit_s"],
            "train_fp32_img_s": fp32, "train_amp_img_s": amp, "peak_mib": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--archs", nargs="+", default=list(networks.ARCHITECTURES), choices=networks.ARCHITECTURES)
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timing rounds (minimum reported)")
    parser.add_argument("--train-steps", type=int, default=5, help="timed optimiser steps per setting")
    parser.add_argument("--output", default="", help="result file (default benchmarks/results/bench_gpu_<device>.txt)")
    args = parser.parse_args()
    device = torch.device(args.device)
    policy = numerics.configure_torch()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    lines = [f"device {name}, torch {torch.__version__}, image {args.image_size} px, batch {args.batch}, "
             f"repeats {args.repeats}; numerics {policy}",
             f"{'arch':16s} {'fwd s':>7s} {'fused/fwd':>9s} {'lib/fused':>9s} {'audit/27fwd':>11s} "
             f"{'audit img/s':>11s} {'train img/s':>11s} {'AMP img/s':>9s} {'peak MiB':>9s}"]
    print("\n".join(lines), flush=True)
    for arch in args.archs:
        r = bench_architecture(arch, args, device)
        amp = "n/a" if r["train_amp_img_s"] != r["train_amp_img_s"] else f"{r['train_amp_img_s']:.1f}"
        line = (f"{arch:16s} {r['forward_s']:7.3f} {r['fused/fwd']:9.2f} {r['library/fused']:9.1f} "
                f"{r['audit/floor']:11.2f} {r['audit_img_s']:11.1f} {r['train_fp32_img_s']:11.1f} "
                f"{amp:>9s} {r['peak_mib']:9.0f}")
        print(line, flush=True)
        lines.append(line)
    output = Path(args.output) if args.output else RESULTS / f"bench_gpu_{device.type}.txt"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("\n".join(lines) + "\n")
    print(f"written: {output}")


if __name__ == "__main__":
    main()
