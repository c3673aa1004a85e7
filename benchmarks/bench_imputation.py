"""Benchmark: the cost of ROAD's noisy linear imputation relative to the forwards it feeds.

ROAD at 5 fractions x 2 orders adds 10 forwards per image and map; every filled image needs
one imputation solve first. This prints, per architecture and for one batch with several
maps (as in notebook 08):
  imputation/forwards   seconds in the conjugate-gradient imputation / seconds in the
                        no-grad forwards of the filled images                 (target < 1)
plus CG iterations, and the same ratio for LSR's larger, solid zones.

Usage: python benchmarks/bench_imputation.py --archs efficientnet_b0 --image-size 128 \
           --batch 16 --maps 6 [--device cuda]
Random weights (same cost as trained ones) and smooth random images with disc-shaped lesions.
"""

from __future__ import annotations

import argparse
import time

import torch

from endoexplain_core.kernels import imputation, localisation, reliance, road
from endoexplain_core.models import networks


def _images(batch: int, size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Smooth random frames (normalised units) and disc lesions of varying place and size."""
    generator = torch.Generator().manual_seed(0)
    coarse = torch.randn(batch, 3, size // 8, size // 8, generator=generator)
    images = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear",
                                             align_corners=False)
    rows = torch.arange(size, dtype=torch.float32)[:, None]
    cols = torch.arange(size, dtype=torch.float32)[None, :]
    masks = torch.stack([(rows - size * (0.3 + 0.4 * b / batch)) ** 2
                         + (cols - size * 0.5) ** 2 <= (size * (0.06 + 0.1 * b / batch)) ** 2
                         for b in range(batch)])
    return images.to(device), masks.to(device)


def bench(arch: str, args, device: torch.device) -> None:
    torch.manual_seed(0)
    model = networks.build_model(arch).to(device).eval()
    images, masks = _images(args.batch, args.image_size, device)
    fov = localisation.field_of_view(images, masks)
    maps = {f"map{k}": torch.rand(args.batch, args.image_size, args.image_size,
                                  generator=torch.Generator().manual_seed(k)).to(device)
            for k in range(args.maps)}
    keys = list(range(args.batch))
    road.road_drops(model, images[:2], {"warm": maps["map0"][:2]}, fov[:2], keys[:2], temperature=1.0)
    timings: dict = {}
    started = time.perf_counter()
    road.road_drops(model, images, maps, fov, keys, temperature=1.0, timings=timings)
    total = time.perf_counter() - started
    removed = road.road_removal_masks(maps["map0"], fov, "morf")[-1]
    _, info = imputation.solve_linear_imputation(images, removed)
    print(f"{arch:16s} ROAD  {args.batch} images x {args.maps} maps x 10 removals: "
          f"imputation {timings['imputation_s']:.2f} s, forwards {timings['forward_s']:.2f} s "
          f"({timings['forwards']} images), total {total:.2f} s; "
          f"imputation/forwards = {timings['imputation_s'] / timings['forward_s']:.3f} "
          f"(CG iterations at 20%: {info.iterations})")
    zones = localisation.tolerance_zone(masks, fov, 0.03 * args.image_size)
    lsr_timings: dict = {}
    reliance.lesion_specific_reliance(model, images, zones, fov, keys, temperature=1.0,
                                      timings=lsr_timings)
    _, zone_info = imputation.solve_linear_imputation(images, zones)
    print(f"{arch:16s} LSR   zone + up to 5 regions per image: imputation "
          f"{lsr_timings['imputation_s']:.2f} s, forwards {lsr_timings['forward_s']:.2f} s; "
          f"imputation/forwards = {lsr_timings['imputation_s'] / lsr_timings['forward_s']:.3f} "
          f"(CG iterations for the zones: {zone_info.iterations})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", nargs="+", default=["efficientnet_b0"], choices=networks.ARCHITECTURES)
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--maps", type=int, default=6)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    print(f"device {device}, torch threads {torch.get_num_threads()}, image size {args.image_size}")
    for arch in args.archs:
        bench(arch, args, device)


if __name__ == "__main__":
    main()
