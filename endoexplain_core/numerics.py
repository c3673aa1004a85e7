"""The numerical settings every stage runs under, in one place.

CPU: ``pin_cpu_environment`` sets ``CPU_PIN`` in ``os.environ`` (oneDNN and ATen capped at
AVX2, MKL on its vendor-independent ``COMPATIBLE`` branch); it runs when ``endoexplain_core``
is imported, before any tensor work, and child processes inherit it. ``ENDOEXPLAIN_CPU_PIN=off``
leaves the libraries' own dispatch. CUDA: ``configure_torch`` (applied by ``resolve_device`` to
every CUDA device) turns off cuDNN benchmark mode, TF32 and non-deterministic algorithms.
``cpu_numerics`` and ``torch_settings`` read what is in force, for the run's provenance. This
module does not import torch at import time (the pin must precede torch's first use).
Rule: docs/protocol.md, "CPU numerics"; method: docs/maps_and_scores.md, "Numerical settings".
"""

from __future__ import annotations

import os
import platform
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported only where it is used: the pin must precede it
    import torch

# environment variable -> value the package sets before torch's first use.
CPU_PIN = {
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_CBWR": "COMPATIBLE",
    "ATEN_CPU_CAPABILITY": "avx2",
}
PIN_SWITCH = "ENDOEXPLAIN_CPU_PIN"   # "off": keep the libraries' own dispatch (cost measurement)
PINNED_CAPABILITY = "AVX2"          # what torch.backends.cpu.get_cpu_capability() reports pinned

# flag -> value the package sets on CUDA; names are the torch attributes below.
POLICY = {
    "cudnn_benchmark": False,       # no speed-dependent algorithm choice
    "cudnn_deterministic": True,    # deterministic convolution algorithms
    "cuda_matmul_allow_tf32": False,  # full float32 matrix products (CAM parity)
    "cudnn_allow_tf32": False,        # full float32 convolutions
}

# CPU feature flags (/proc/cpuinfo names) from the oldest to the newest level that matters here.
_ISA_LEVELS = (("avx2", "AVX2"), ("avx512f", "AVX-512"), ("avx512_bf16", "AVX-512 BF16"),
               ("amx_tile", "AMX"))


class CpuPinError(RuntimeError):
    """The CPU pin cannot be in force in this process (tensor work ran before it was set)."""


def pin_enabled() -> bool:
    """False only when ``ENDOEXPLAIN_CPU_PIN=off`` (case-insensitive) is set."""
    return os.environ.get(PIN_SWITCH, "on").strip().lower() != "off"


def pin_cpu_environment() -> dict[str, str]:
    """Set ``CPU_PIN`` in ``os.environ`` (overriding other values) unless the pin is switched
    off; return the variables set. Idempotent; child processes inherit them."""
    if not pin_enabled():
        return {}
    os.environ.update(CPU_PIN)
    return dict(CPU_PIN)


def detected_cpu() -> dict[str, object]:
    """What this machine's CPU offers: vendor, model name and its best instruction-set level
    (from /proc/cpuinfo on Linux; ``platform`` elsewhere)."""
    vendor, model, flags = None, platform.processor() or None, set()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "vendor_id" and vendor is None:
                    vendor = value.strip()
                elif key == "model name" and (model is None or model == platform.processor()):
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    levels = [name for flag, name in _ISA_LEVELS if flag in flags]
    return {"vendor": vendor, "model": model, "best_isa": levels[-1] if levels else None,
            "isa_levels": levels}


def cpu_numerics() -> dict[str, object]:
    """The CPU numerics in force: pin on/off, the pinned variables, ATen's active capability,
    the detected CPU and torch's thread count (results depend on it too: record it)."""
    import torch

    active = torch.backends.cpu.get_cpu_capability()
    return {"pin": "on" if pin_enabled() else "off",
            "pinned": {k: os.environ.get(k) for k in CPU_PIN},
            "aten_capability": active,
            "detected": detected_cpu(),
            "torch_threads": torch.get_num_threads(),
            "torch_version": torch.__version__,
            "machine": platform.machine()}


def check_cpu_pin() -> None:
    """Raise ``CpuPinError`` when the pin should be in force but ATen runs another capability
    (torch did tensor work before ``endoexplain_core`` was imported). On a CPU without AVX2,
    ATen's best is below the pin and nothing can be matched: that is reported, not refused."""
    if not pin_enabled() or platform.machine().lower() not in ("x86_64", "amd64"):
        return
    import torch

    active = torch.backends.cpu.get_cpu_capability()
    if active != PINNED_CAPABILITY and "AVX2" in detected_cpu()["isa_levels"]:
        raise CpuPinError(
            f"ATen runs {active} kernels, not the pinned {PINNED_CAPABILITY}: torch did tensor "
            f"work before endoexplain_core was imported. Import endoexplain_core first (or "
            f"start Python with {' '.join(f'{k}={v}' for k, v in CPU_PIN.items())}).")


def configure_torch() -> dict[str, bool]:
    """Apply ``POLICY`` to the torch backends of this process; return ``torch_settings()``."""
    import torch

    torch.backends.cudnn.benchmark = POLICY["cudnn_benchmark"]
    torch.backends.cudnn.deterministic = POLICY["cudnn_deterministic"]
    torch.backends.cuda.matmul.allow_tf32 = POLICY["cuda_matmul_allow_tf32"]
    torch.backends.cudnn.allow_tf32 = POLICY["cudnn_allow_tf32"]
    return torch_settings()


def torch_settings() -> dict[str, bool | int | str | None]:
    """The backend flags in force in this process, the thread count and the cuDNN version."""
    import torch

    return {"cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
            "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
            "torch_threads": torch.get_num_threads(),
            "cudnn_version": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}


def resolve_device(device: str) -> "torch.device":
    """``cpu`` | ``cuda`` | ``auto`` (CUDA when available) -> torch.device: the one device rule
    of every stage. A CUDA device gets the package's numerical policy (``configure_torch``)
    before any work runs on it."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("the profile asks for device 'cuda' but no CUDA device is available")
    resolved = torch.device(device)
    if resolved.type == "cuda":
        configure_torch()  # deterministic cuDNN, no TF32
    return resolved
