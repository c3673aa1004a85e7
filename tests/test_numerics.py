"""The CPU numerics pin (endoexplain_core.numerics): one instruction set on every machine.

A machine is simulated by the ceilings its CPU would give the libraries: a machine whose best
instruction set is AVX2 is what oneDNN, MKL and ATen do under ``ONEDNN_MAX_CPU_ISA=AVX2``,
``MKL_CBWR=AVX2`` and ``ATEN_CPU_CAPABILITY=avx2``. The same tiny EfficientNet-B0 training runs
in fresh subprocesses on "this machine" (its best instruction set) and on the simulated AVX2
machine; under the pin their weights are byte-identical, and without it they differ (so the
test can fail), unless this machine's best is AVX2 already. Both memory formats are checked:
the profiles train in channels_last, which takes other oneDNN kernels than contiguous.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from endoexplain_core import numerics
from endoexplain_core.models import networks

TRAIN_SCRIPT = """
import hashlib, sys
import endoexplain_core  # pins the CPU numerics (unless ENDOEXPLAIN_CPU_PIN=off)
import torch
from endoexplain_core.models import networks, training
torch.set_num_threads(2)
torch.manual_seed(0)
model = networks.build_model("efficientnet_b0")
channels_last = sys.argv[1] == "channels_last"
optimiser = torch.optim.AdamW(model.parameters(), lr=0.004)
generator = torch.Generator().manual_seed(1)
images = torch.randn(8, 3, 64, 64, generator=generator)
labels = torch.randint(0, 2, (8,), generator=generator)
with training.optimiser_memory_format(model, channels_last):
    for _ in range(2):
        loss = torch.nn.functional.cross_entropy(
            model(training.to_device(images, torch.device("cpu"), channels_last)), labels)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
digest = hashlib.sha256()
for name, value in sorted(model.state_dict().items()):
    digest.update(name.encode())
    digest.update(value.contiguous().numpy().tobytes())
print(digest.hexdigest(), torch.backends.cpu.get_cpu_capability())
"""

AVX2_MACHINE = {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def _train_digest(machine: dict[str, str], pin: str, memory_format: str) -> tuple[str, str]:
    environment = {k: v for k, v in os.environ.items()
                   if k not in numerics.CPU_PIN and k != numerics.PIN_SWITCH}
    environment.update(machine)
    environment[numerics.PIN_SWITCH] = pin
    result = subprocess.run([sys.executable, "-c", TRAIN_SCRIPT, memory_format], env=environment,
                            capture_output=True, text=True, timeout=600, check=True)
    digest, capability = result.stdout.split()
    return digest, capability


@pytest.mark.skipif("AVX2" not in numerics.detected_cpu()["isa_levels"], reason="needs an x86 CPU with AVX2")
@pytest.mark.parametrize("memory_format", ["contiguous", "channels_last"])
def test_pin_gives_identical_weights_on_simulated_machines(memory_format):
    pinned_here, capability_here = _train_digest({}, "on", memory_format)
    pinned_avx2_machine, _ = _train_digest(AVX2_MACHINE, "on", memory_format)
    assert capability_here == numerics.PINNED_CAPABILITY
    assert pinned_here == pinned_avx2_machine
    if numerics.detected_cpu()["best_isa"] == "AVX2":
        pytest.skip("this CPU's best instruction set is AVX2: the unpinned half cannot differ here")
    native_here, native_capability = _train_digest({}, "off", memory_format)
    native_avx2_machine, _ = _train_digest(AVX2_MACHINE, "off", memory_format)
    assert native_capability != numerics.PINNED_CAPABILITY
    assert native_here != native_avx2_machine  # without the pin the machines disagree


def test_importing_the_package_pins_this_process():
    """The test process imported endoexplain_core before any tensor work (conftest-free: the
    import at the top of this module is enough), so ATen runs the pinned kernels."""
    if numerics.pin_enabled() and "AVX2" in numerics.detected_cpu()["isa_levels"]:
        assert torch.backends.cpu.get_cpu_capability() == numerics.PINNED_CAPABILITY
        numerics.check_cpu_pin()
        for key, value in numerics.CPU_PIN.items():
            assert os.environ[key] == value
    record = numerics.cpu_numerics()
    assert set(record) >= {"pin", "pinned", "aten_capability", "detected", "torch_threads"}


# Torch does tensor work on another capability (here the portable DEFAULT kernels, which any
# x86 CPU runs) before endoexplain_core is imported; training must then refuse to start.
LATE_IMPORT_TRAINING = """
import os
os.environ["ATEN_CPU_CAPABILITY"] = "default"
import torch
torch.ones(8).sum()
from endoexplain_core import numerics
from endoexplain_core.models import training
try:
    training.train_checkpoint(None, None, None, None, None, "unused")
except numerics.CpuPinError as error:
    print("refused:", error)
"""


@pytest.mark.skipif("AVX2" not in numerics.detected_cpu()["isa_levels"], reason="needs an x86 CPU with AVX2")
def test_training_refuses_a_process_where_torch_ran_before_the_pin():
    result = subprocess.run([sys.executable, "-c", LATE_IMPORT_TRAINING], capture_output=True,
                            text=True, timeout=300, env={**os.environ, numerics.PIN_SWITCH: "on"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("refused: ATen runs DEFAULT kernels, not the pinned AVX2"), result.stdout


@pytest.mark.parametrize("arch", ["efficientnet_b0", "convnext_tiny"])
def test_random_masks_never_use_vendor_dependent_bernoulli(arch, monkeypatch):
    """Train-mode forward passes draw dropout / stochastic-depth masks without the scalar
    ``bernoulli_`` (MKL's stream on Intel CPUs, ATen's elsewhere)."""
    torch.manual_seed(0)
    model = networks.build_model(arch).train()

    def refuse(*args, **kwargs):
        raise AssertionError("scalar bernoulli_ called: vendor-dependent random masks")

    monkeypatch.setattr(torch.Tensor, "bernoulli_", refuse)
    model(torch.randn(2, 3, 64, 64))
    portable = (networks.PortableDropout, networks.PortableStochasticDepth)
    assert any(isinstance(m, portable) for m in model.modules())


def test_portable_masks_keep_the_expected_share_and_scale():
    torch.manual_seed(0)
    dropout = networks.PortableDropout(0.2).train()
    out = dropout(torch.ones(200_000))
    kept = out != 0
    assert abs(kept.float().mean().item() - 0.8) < 0.005
    assert torch.allclose(out[kept], torch.full_like(out[kept], 1 / 0.8))
    depth = networks.PortableStochasticDepth(0.25, "row").train()
    rows = depth(torch.ones(40_000, 3, 2, 2))
    per_row = rows.flatten(1)
    assert bool(((per_row == 0).all(1) | (per_row == 1 / 0.75).all(1)).all())
    assert abs((per_row[:, 0] != 0).float().mean().item() - 0.75) < 0.01
    assert torch.equal(depth.eval()(torch.ones(3, 2)), torch.ones(3, 2))
