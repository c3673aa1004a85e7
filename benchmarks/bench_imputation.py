"""Benchmark: the cost of ROAD's noisy linear imputation relative to the forwards it feeds.

ROAD at 5 fractions x 2 orders adds 10 forwards per image and map; every filled image needs
one imputation solve first. This prints, per architecture and for one batch with several
maps (as in notebook 08: five smooth CAM-like maps and one random heatmap):
  imputation/forwards   seconds in the imputation / seconds in the no-grad forwards of the
                        filled images, with the device's default solver      (target < 1)
  direct vs cg          seconds of the two solvers on the same 10 x batch removals of one
                        smooth map (CG iterations in brackets)
plus the same ratio for LSR's zones.

Smooth maps matter: a CAM is a coarse grid upsampled, so its top or bottom 20% is one solid
blob, where conjugate gradient needs 100+ iterations; a random map's removals are scattered
pixels that CG fills in a handful. Benchmarking on random maps alone flattered CG by 4x.

Usage: python benchmarks/bench_imputation.py --archs efficientnet_b0 --image-size 160 \
           --batch 16 --maps 6 [--device cuda]
Random weights (same cost as trained ones), smooth random images with disc-shaped lesions.
"""

from __future__ import annotations

import argparse
import time

import torch

from endoexplain_core import config
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


def _smooth_maps(count: int, batch: int, size: int, device: torch.device) -> dict[str, torch.Tensor]:
    """``count - 1`` CAM-like maps (a size/32 grid, bilinear upsampled) and one random map."""
    grid = max(size // 32, 1)
    maps = {}
    for k in range(count - 1):
        coarse = torch.rand(batch, 1, grid, grid, generator=torch.Generator().manual_seed(k))
        maps[f"smooth{k}"] = torch.nn.functional.interpolate(
            coarse, size=(size, size), mode="bilinear", align_corners=False)[:, 0].to(device)
    maps["random"] = torch.rand(batch, size, size, generator=torch.Generator().manual_seed(99)).to(device)
    return maps


def _seconds(function) -> tuple[float, object]:
    started = time.perf_counter()
    result = function()
    return time.perf_counter() - started, result


def bench(arch: str, args, device: torch.device) -> None:
    torch.manual_seed(0)
    model = networks.build_model(arch).to(device).eval()
    images, masks = _images(args.batch, args.image_size, device)
    fov = localisation.field_of_view(images, masks)
    maps = _smooth_maps(args.maps, args.batch, args.image_size, device)
    keys = list(range(args.batch))
    protocol = config.FaithfulnessSettings()  # the profile defaults: ROAD fractions, noise, LSR regions
    fractions, noise = tuple(protocol.road_fractions), protocol.imputation_noise_std
    road.road_drops(model, images[:2], {"warm": maps["random"][:2]}, fov[:2], keys[:2], temperature=1.0,
                    fractions=fractions, noise_std=noise)
    timings: dict = {}
    total, _ = _seconds(lambda: road.road_drops(model, images, maps, fov, keys, temperature=1.0,
                                                fractions=fractions, noise_std=noise, timings=timings))
    print(f"{arch:16s} ROAD  {args.batch} images x {args.maps} maps x 10 removals "
          f"({imputation.default_solver(device)} solver): "
          f"imputation {timings['imputation_s']:.2f} s, forwards {timings['forward_s']:.2f} s "
          f"({timings['forwards']} images), total {total:.2f} s; "
          f"imputation/forwards = {timings['imputation_s'] / timings['forward_s']:.3f}")
    removed = torch.cat([road.road_removal_masks(maps["smooth0"], fov, order, fractions) for order in road.ORDERS]).flatten(0, 1)
    expanded = images[None].expand(removed.shape[0] // args.batch, *images.shape).flatten(0, 1)
    direct_s, _ = _seconds(lambda: imputation.solve_linear_imputation(expanded, removed, solver="direct"))
    cg_s, (_, cg_info) = _seconds(lambda: imputation.solve_linear_imputation(expanded, removed, solver="cg"))
    print(f"{arch:16s} one smooth map's 10 x {args.batch} removals: direct {direct_s:.2f} s, "
          f"cg {cg_s:.2f} s ({cg_info.iterations} iterations); cg/direct = {cg_s / direct_s:.2f}")
    zones = localisation.tolerance_zone(masks, fov, config.LocalisationSettings().pixels(args.image_size)["radius_px"])
    lsr_timings: dict = {}
    reliance.lesion_specific_reliance(model, images, zones, fov, keys, temperature=1.0,
                                      n_regions=protocol.lsr_regions, noise_std=noise, timings=lsr_timings)
    print(f"{arch:16s} LSR   zone + up to 5 regions per image: imputation "
          f"{lsr_timings['imputation_s']:.2f} s, forwards {lsr_timings['forward_s']:.2f} s; "
          f"imputation/forwards = {lsr_timings['imputation_s'] / lsr_timings['forward_s']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", nargs="+", default=["efficientnet_b0"], choices=networks.ARCHITECTURES)
    parser.add_argument("--image-size", type=int, default=160)
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
