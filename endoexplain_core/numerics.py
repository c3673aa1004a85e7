"""The numerical settings every stage runs under, in one place.

GPU kernels may pick algorithms by speed (cuDNN benchmark mode), use TF32 matrix products and
reduce in a non-deterministic order. Each of these changes results in low bits from run to
run; for an audit whose tables must match between runs and against a float32 CPU reference
(pytorch-grad-cam parity), the package turns them off. On the CPU they have no effect.

``configure_torch`` applies the policy (``models.training.resolve_device`` calls it for every
CUDA device); ``torch_settings`` reads what is in force, for the run's provenance.
"""

from __future__ import annotations

import torch

# flag -> value the package sets; names are the torch attributes below.
POLICY = {
    "cudnn_benchmark": False,       # no speed-dependent algorithm choice
    "cudnn_deterministic": True,    # deterministic convolution algorithms
    "cuda_matmul_allow_tf32": False,  # full float32 matrix products (CAM parity)
    "cudnn_allow_tf32": False,        # full float32 convolutions
}


def configure_torch() -> dict[str, bool]:
    """Apply ``POLICY`` to the torch backends of this process; return ``torch_settings()``."""
    torch.backends.cudnn.benchmark = POLICY["cudnn_benchmark"]
    torch.backends.cudnn.deterministic = POLICY["cudnn_deterministic"]
    torch.backends.cuda.matmul.allow_tf32 = POLICY["cuda_matmul_allow_tf32"]
    torch.backends.cudnn.allow_tf32 = POLICY["cudnn_allow_tf32"]
    return torch_settings()


def torch_settings() -> dict[str, bool | int | str | None]:
    """The backend flags in force in this process, the thread count and the cuDNN version."""
    return {"cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
            "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
            "torch_threads": torch.get_num_threads(),
            "cudnn_version": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}
