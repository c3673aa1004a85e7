"""Cost of the extended localisation scores against the CAM computation they follow.

Prints  extended/CAM = seconds of everything notebook 07 adds per image (field of view, DoG,
random and centre maps, 19-threshold IoU curve, top-k sweep, energy lift, pointing game, for
nine maps) / seconds of the fused CAM pass (five CAMs + LayerCAM, one forward and backward).
Target: <= 10%.

Two sources of images:
  --run-dir RUN    the primary checkpoint of a run on its masked HyperKvasir pool (the real
                   cost: ``analysis.extended_localisation.score_registered``);
  (default)        a random-weight model of --arch on --n-images random frames with disc
                   masks at --image-size (same cost as trained weights).

Usage: python benchmarks/bench_extended.py --arch efficientnet_b0 --image-size 224 --n-images 64
       python benchmarks/bench_extended.py --run-dir /tmp/out/runs/default --image-size 224
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from endoexplain_core.run_layout import RunLayout
from endoexplain_core import config
from endoexplain_core.analysis import audit_inputs
from endoexplain_core.analysis import extended_localisation as ext
from endoexplain_core.kernels import localisation
from endoexplain_core.models import networks


def synthetic_cases(count: int, size: int, seed: int = 0):
    """(sample_id, uint8 RGB endoscopy-like frame, bool polyp mask): a lit disc on black with
    texture and one brighter polyp disc of random size and place."""
    generator = np.random.default_rng(seed)
    rows, cols = np.mgrid[:size, :size]
    view = (rows - size / 2) ** 2 + (cols - size / 2) ** 2 <= (0.47 * size) ** 2
    for index in range(count):
        image = np.zeros((size, size, 3), dtype=np.uint8)
        image[view] = generator.integers(90, 150, size=(view.sum(), 3))
        centre = generator.uniform(0.3 * size, 0.7 * size, size=2)
        radius = generator.uniform(0.05, 0.15) * size
        polyp = (rows - centre[0]) ** 2 + (cols - centre[1]) ** 2 <= radius ** 2
        image[polyp] = (210, 150, 140)
        yield f"bench{index:04d}", image, polyp


def kernel_breakdown(images: torch.Tensor, masks: torch.Tensor, settings: config.LocalisationSettings,
                     repeats: int = 3) -> dict[str, float]:
    """Median seconds of each extended kernel on one batch of nine maps (a guide to the cost)."""
    maps = {m: torch.rand(masks.shape, generator=torch.Generator().manual_seed(i))
            for i, m in enumerate(ext.EXTENDED_METHODS)}
    fov = localisation.field_of_view(images, masks)
    scales = settings.pixels(masks.shape[-1])
    steps = {
        "field_of_view": lambda: localisation.field_of_view(images),
        "dog_conspicuity": lambda: localisation.dog_conspicuity(images, scales["dog_sigma_small_px"],
                                                                scales["dog_sigma_large_px"], fov=fov),
        "iou_curve x9": lambda: [localisation.iou_curve(v, masks) for v in maps.values()],
        "top_k_sweep x9": lambda: [localisation.top_k_sweep(v, masks) for v in maps.values()],
        "energy_lift x9": lambda: [localisation.energy_lift_bits(v, masks, fov, settings.energy_alpha) for v in maps.values()],
        "pointing x9": lambda: [localisation.pointing_hits(v, masks, fov, radius_px=scales["radius_px"],
                                                           smooth_sigma_px=scales["smooth_sigma_px"])
                                for v in maps.values()],
    }
    timings = {}
    for name, step in steps.items():
        seconds = []
        for _ in range(repeats):
            started = time.perf_counter()
            step()
            seconds.append(time.perf_counter() - started)
        timings[name] = float(np.median(seconds))
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", default="", help="a run folder with a primary checkpoint")
    parser.add_argument("--data-root", default="", help="cohort root of that run ('' = synthetic in the run)")
    parser.add_argument("--arch", default="efficientnet_b0", choices=config.ARCHITECTURES)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--n-images", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = config.LocalisationSettings()
    # the C-Score interval's bootstrap, as 07 runs it (profile defaults)
    bootstrap = {"replicates": config.ExtendedLocalisationSettings().bootstrap_replicates,
                 "seed": config.SharedSettings().seed}
    if args.run_dir:
        primary_id = RunLayout(args.run_dir).primary_id()
        data_root = config.resolve_data_root(args.data_root, args.run_dir)
        _, _, summary = ext.score_registered(args.run_dir, data_root, primary_id, image_size=args.image_size,
                                             settings=settings, batch_size=args.batch, device=args.device, **bootstrap)
        source = f"primary {primary_id} on its masked pool"
    else:
        torch.manual_seed(0)
        model = networks.build_model(args.arch).eval()
        metadata = {"checkpoint_id": f"{args.arch}_random", "arch": args.arch, "seed": 0}
        _, _, summary = ext.score_checkpoint(model, metadata, 1.0,
                                             synthetic_cases(args.n_images, args.image_size),
                                             dataset="synthetic", image_size=args.image_size,
                                             settings=settings, batch_size=args.batch, device=args.device, **bootstrap)
        source = f"random-weight {args.arch} on {args.n_images} synthetic frames"
    n = summary["n_audited"]
    print(f"{source}: {n} images at {args.image_size} px, batch {args.batch}, "
          f"{torch.get_num_threads()} threads, device {args.device}")
    print(f"  CAM pass (5 CAMs + LayerCAM)  {summary['cam_seconds']:8.2f} s  ({1000 * summary['cam_seconds'] / n:.1f} ms/image)")
    print(f"  extended scores (9 maps)      {summary['metric_seconds']:8.2f} s  ({1000 * summary['metric_seconds'] / n:.1f} ms/image)")
    ratio = summary["metric_seconds"] / summary["cam_seconds"]
    print(f"  extended/CAM = {ratio:.1%}  (target <= 10%: {'met' if ratio <= 0.10 else 'NOT met'})")
    frames = list(synthetic_cases(args.batch, args.image_size))
    prepared = [audit_inputs.prepare_case(i, image, mask, args.image_size) for i, image, mask in frames]
    images = torch.stack([p[0] for p in prepared])
    masks = torch.stack([p[1] for p in prepared])
    print(f"  per-kernel seconds for one batch of {args.batch} (median of 3):")
    for name, seconds in kernel_breakdown(images, masks, settings).items():
        print(f"    {name:18s} {seconds * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
