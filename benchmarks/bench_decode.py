"""Reduced-scale JPEG decoding of large frames: full decode + resize against decode-for-size +
resize (``imageio.read_rgb(path, decode_size=S)``), one run, on the mirror's largest frames.

Writes a small mirror of the real datasets (``synthetic.generate_cohort(layout="mirror")``),
takes its largest JPEG frames and, for each input size S, times both ways (minimum over
``--repeats`` passes, interleaved) and compares the two uint8 S x S model inputs. Prints per S:
seconds per frame of each way, the speed-up (full / reduced) and the mean and maximum absolute
difference in grey levels.

Usage: python benchmarks/bench_decode.py --sizes 128 256 512 --frames 12 --repeats 3
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from endoexplain_core import config
from endoexplain_core.data import imageio, synthetic
from endoexplain_core.data.datasets import decode_resized, resize_rgb


def largest_jpegs(root: Path, count: int) -> list[Path]:
    """The ``count`` JPEG frames with the most pixels under ``root`` (masks left out)."""
    frames = [p for p in root.rglob("*.jpg") if imageio.is_image_file(p)
              and "mask" not in p.parent.name and not p.stem.endswith("_mask")]
    return sorted(frames, key=lambda p: (-np.prod(Image.open(p).size), str(p)))[:count]


def seconds_per_frame(function, paths, size: int) -> float:
    started = time.perf_counter()
    for path in paths:
        function(path, size)
    return (time.perf_counter() - started) / len(paths)


def full_decode(path: Path, size: int) -> np.ndarray:
    return resize_rgb(imageio.read_rgb(path), size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[128, 256, 512])
    parser.add_argument("--frames", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "mirror"
        design = config.RolesSettings(
            frame_size=128, synthetic_layout="mirror", category_counts={"cecum": 4, "dyed-lifted-polyps": 4},
            n_segmented=4, n_development_polyps=1, n_audit_near_duplicates=1, n_development_duplicates=1,
            n_development_near_duplicates=0, etis_count=2, etis_duplicates=0, polypgen_counts=[4, 1, 1, 4, 1, 4],
            polypgen_empty_per_centre=0, polypgen_duplicates=0, polypdb_per_cell=1)
        synthetic.generate_cohort(root, seed=1, design=design)
        paths = largest_jpegs(root, args.frames)
        sizes = sorted({Image.open(p).size for p in paths})
        print(f"{len(paths)} mirror JPEG frames, sizes (W x H): "
              + ", ".join(f"{w}x{h}" for w, h in sizes))
        for size in args.sizes:
            full, reduced = [], []
            for _ in range(args.repeats):
                full.append(seconds_per_frame(full_decode, paths, size))
                reduced.append(seconds_per_frame(decode_resized, paths, size))
            differences = np.concatenate([
                np.abs(full_decode(p, size).astype(int) - decode_resized(p, size).astype(int)).ravel()
                for p in paths])
            print(f"S={size:4d}: full {min(full) * 1e3:6.1f} ms/frame, reduced "
                  f"{min(reduced) * 1e3:6.1f} ms/frame, speed-up {min(full) / min(reduced):4.1f}x; "
                  f"|difference| mean {differences.mean():.2f}, 99th percentile "
                  f"{np.percentile(differences, 99):.0f}, max {differences.max()} grey levels")


if __name__ == "__main__":
    main()
