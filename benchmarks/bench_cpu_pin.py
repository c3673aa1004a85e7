"""Cost of the CPU numerics pin (endoexplain_core.numerics): pinned / native time, one run.

For each architecture, two fresh subprocesses (``ENDOEXPLAIN_CPU_PIN=on`` and ``off``) time the
same work, interleaved round after round: training steps (forward + backward + AdamW) at the
profile's input size and batch, and the fused 5-CAM kernel on one batch. Prints per
architecture the minimum seconds of each and the ratio pinned / native (> 1: the pin costs
time), and whether the two weight digests differ (they do on a machine whose best instruction
set is above AVX2; that difference is what the pin removes between machines).

``--variant mkldnn`` compares, both pinned, oneDNN on against oneDNN off
(``torch.backends.mkldnn.enabled = False``: ATen's own convolutions), the cost of giving up
oneDNN's machine-dependent kernels altogether. ``--variant aten`` keeps oneDNN off in both and
compares the pin on against off: whether ATen's own kernels still give different weights at
another instruction set (if they do, turning oneDNN off does not make training bit-identical
across machines).

Usage: python benchmarks/bench_cpu_pin.py --image-size 160 --batch 16 --steps 4 --repeats 3
       python benchmarks/bench_cpu_pin.py --variant mkldnn --archs efficientnet_b0 --image-size 136
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

WORK = r"""
import hashlib, json, sys, time
import os
import endoexplain_core
import torch
torch.backends.mkldnn.enabled = os.environ.get("ENDOEXPLAIN_BENCH_MKLDNN", "on") != "off"
from endoexplain_core import numerics
from endoexplain_core.kernels import cams
from endoexplain_core.models import networks
arch, size, batch, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
model = networks.build_model(arch)
optimiser = torch.optim.AdamW(model.parameters(), lr=1e-3)
generator = torch.Generator().manual_seed(1)
images = torch.randn(batch, 3, size, size, generator=generator)
labels = torch.randint(0, 2, (batch,), generator=generator)
model.train()
loss = torch.nn.functional.cross_entropy(model(images), labels); loss.backward()  # warm-up
started = time.perf_counter()
for _ in range(steps):
    loss = torch.nn.functional.cross_entropy(model(images), labels)
    optimiser.zero_grad(); loss.backward(); optimiser.step()
train = (time.perf_counter() - started) / steps
model.eval()
layer = model.get_submodule(networks.TARGET_LAYERS[arch])
cams.compute_cams(model, layer, images)  # warm-up
started = time.perf_counter()
cams.compute_cams(model, layer, images)
cam = time.perf_counter() - started
digest = hashlib.sha256(b"".join(v.contiguous().numpy().tobytes() for _, v in sorted(model.state_dict().items()))).hexdigest()
print(json.dumps({"train_step_s": train, "cam_batch_s": cam, "digest": digest,
                  "aten": torch.backends.cpu.get_cpu_capability()}))
"""


VARIANT_LABELS = {"pin": "the CPU pin", "mkldnn": "oneDNN (pin on)",
                  "aten": "the CPU pin (oneDNN off in both)"}


def run(arch: str, setting: str, args) -> dict:
    """One subprocess; ``setting`` is "on"/"off": the CPU pin (variant pin) or oneDNN with the
    pin on (variant mkldnn)."""
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("ONEDNN_MAX_CPU_ISA", "MKL_CBWR", "ATEN_CPU_CAPABILITY")}
    if args.variant == "pin":
        environment["ENDOEXPLAIN_CPU_PIN"] = setting
    elif args.variant == "mkldnn":
        environment["ENDOEXPLAIN_CPU_PIN"] = "on"
        environment["ENDOEXPLAIN_BENCH_MKLDNN"] = setting
    else:  # aten: oneDNN off in both, the pin (ATen's instruction set) on vs off
        environment["ENDOEXPLAIN_CPU_PIN"] = setting
        environment["ENDOEXPLAIN_BENCH_MKLDNN"] = "off"
    out = subprocess.run([sys.executable, "-c", WORK, arch, str(args.image_size), str(args.batch),
                          str(args.steps)], env=environment, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", nargs="+", default=["efficientnet_b0", "resnet34", "convnext_tiny"])
    parser.add_argument("--image-size", type=int, default=160)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variant", choices=("pin", "mkldnn", "aten"), default="pin",
                        help="pin: CPU pin on vs off; mkldnn: oneDNN on vs off, both pinned; "
                             "aten: CPU pin on vs off, oneDNN off in both")
    args = parser.parse_args()
    from endoexplain_core import numerics

    cpu = numerics.detected_cpu()
    print(f"CPU: {cpu['model']} (best {cpu['best_isa']}); {args.image_size} px, batch {args.batch}, "
          f"{args.steps} training steps, {args.repeats} interleaved rounds (minimum reported); "
          f"on/off = {VARIANT_LABELS[args.variant]}")
    print(f"{'arch':16s} {'train on':>9s} {'train off':>9s} {'ratio':>6s} {'CAM on':>8s} {'CAM off':>8s} "
          f"{'ratio':>6s}  weights differ")
    for arch in args.archs:
        results = {"on": [], "off": []}
        for _ in range(args.repeats):
            for pin in ("on", "off"):
                results[pin].append(run(arch, pin, args))
        best = {pin: {k: min(r[k] for r in rows) for k in ("train_step_s", "cam_batch_s")}
                for pin, rows in results.items()}
        differ = results["on"][0]["digest"] != results["off"][0]["digest"]
        print(f"{arch:16s} {best['on']['train_step_s']:9.3f} {best['off']['train_step_s']:9.3f} "
              f"{best['on']['train_step_s'] / best['off']['train_step_s']:6.2f} "
              f"{best['on']['cam_batch_s']:8.3f} {best['off']['cam_batch_s']:8.3f} "
              f"{best['on']['cam_batch_s'] / best['off']['cam_batch_s']:6.2f}  {differ}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
