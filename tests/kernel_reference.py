"""A reference tester for the kernels, in the spirit of TorchMetrics' ``MetricTester``.

``check_against_reference(kernel, reference, make_inputs)`` draws many seeded random cases,
runs the package kernel (on torch tensors) and an independent reference (on the same NumPy
arrays) for each, and compares the outputs; a failure names the seed, so
``make_inputs(Draw(seed))`` rebuilds the failing case exactly.

``Draw`` supplies the inputs. Its maps and masks cycle through kinds (``MAP_KINDS``,
``MASK_KINDS``) by seed and batch position, so every run covers ties (few value levels,
constant and all-zero maps), single-pixel and full masks, and, where asked for, empty ones,
besides plain continuous noise.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

MAP_KINDS = (
    "continuous",   # uniform [0, 1): ties are practically absent
    "few_levels",   # 4 levels 0, 1/3, 2/3, 1: most pixels tie with many others
    "grid",         # multiples of 0.05: values sit exactly on the IoU-curve thresholds
    "constant",     # one value everywhere (a positive one): every pixel ties
    "zeros",        # all 0: what a constant CAM becomes after min-max
    "one_peak",     # zeros with a single 1: a unique maximum, ties everywhere else
)
MASK_KINDS = (
    "scattered",    # independent pixels with a random density
    "block",        # one solid rectangle
    "one_pixel",    # a single pixel
    "full",         # every pixel
    "empty",        # no pixel (only drawn when the caller allows it)
)
NON_EMPTY_MASK_KINDS = MASK_KINDS[:-1]


class Draw:
    """The random inputs of one case: ``rng`` is a NumPy generator seeded by ``seed``.

    Item b of a batch drawn by ``maps`` or ``masks`` gets kind ``kinds[(seed + b + offset) %
    len(kinds)]``, so consecutive seeds walk through every kind (and, with different offsets,
    through the map-kind x mask-kind pairs).
    """

    def __init__(self, seed: int):
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    def _kind(self, kinds, index: int, offset: int) -> str:
        return kinds[(self.seed + index + offset) % len(kinds)]

    def size(self, low: int = 1, high: int = 12) -> int:
        """A side length in [low, high]."""
        return int(self.rng.integers(low, high + 1))

    def maps(self, batch: int, height: int, width: int, kinds=MAP_KINDS, offset: int = 0
             ) -> np.ndarray:
        """float32 (B, H, W) in [0, 1], one kind per map (see ``MAP_KINDS``)."""
        out = np.zeros((batch, height, width), dtype=np.float32)
        for b in range(batch):
            kind = self._kind(kinds, b, offset)
            if kind == "continuous":
                out[b] = self.rng.random((height, width))
            elif kind == "few_levels":
                out[b] = self.rng.integers(0, 4, (height, width)) / 3
            elif kind == "grid":
                # the same float32 values as the threshold grid round(0.05 k, 2)
                levels = np.array([round(0.05 * k, 2) for k in range(21)], dtype=np.float32)
                out[b] = levels[self.rng.integers(0, 21, (height, width))]
            elif kind == "constant":
                out[b] = self.rng.uniform(0.1, 1.0)
            elif kind == "one_peak":
                out[b, self.rng.integers(height), self.rng.integers(width)] = 1.0
            # "zeros": left as is
        return out

    def masks(self, batch: int, height: int, width: int, kinds=NON_EMPTY_MASK_KINDS,
              offset: int = 0) -> np.ndarray:
        """bool (B, H, W), one kind per mask (see ``MASK_KINDS``); non-empty unless "empty" is
        among ``kinds``."""
        out = np.zeros((batch, height, width), dtype=bool)
        for b in range(batch):
            kind = self._kind(kinds, b, offset)
            if kind == "scattered":
                out[b] = self.rng.random((height, width)) < self.rng.uniform(0.05, 0.9)
                if not out[b].any():
                    out[b, self.rng.integers(height), self.rng.integers(width)] = True
            elif kind == "block":
                top, left = self.rng.integers(height), self.rng.integers(width)
                bottom = self.rng.integers(top, height) + 1
                right = self.rng.integers(left, width) + 1
                out[b, top:bottom, left:right] = True
            elif kind == "one_pixel":
                out[b, self.rng.integers(height), self.rng.integers(width)] = True
            elif kind == "full":
                out[b] = True
            # "empty": left as is
        return out

    def fraction(self, height: int, width: int) -> float:
        """A fraction f in (0, 1] of an H x W map that keeps round(f * H * W) >= 1 pixels: the
        audit's 0.2, a whole count k / N, a half count (k - 0.5) / N (Python's round goes to
        the even integer there) or 1."""
        n_pixels = height * width
        k = int(self.rng.integers(1, n_pixels + 1))
        choice = int(self.rng.integers(4))
        fraction = (0.2, k / n_pixels, (k - 0.5) / n_pixels, 1.0)[choice]
        return fraction if round(fraction * height * width) >= 1 else 1.0


def _to_torch(value):
    return torch.from_numpy(value) if isinstance(value, np.ndarray) else value


def _to_numpy(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, dict):
        return {key: _to_numpy(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return [_to_numpy(item) for item in value]
    return np.asarray(value)


def _compare(got, want, atol: float, rtol: float, where: str = "output") -> None:
    """Exact equality for bool and integer outputs, ``assert_allclose`` (NaN equals NaN) for
    floats; shapes must match exactly. Dicts are compared key by key, sequences item by item."""
    if isinstance(want, dict):
        assert set(got) == set(want), f"{where}: keys {sorted(got)} != {sorted(want)}"
        for key in want:
            _compare(got[key], want[key], atol, rtol, f"{where}[{key!r}]")
        return
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want), f"{where}: {len(got)} items != {len(want)}"
        for index, (item, expected) in enumerate(zip(got, want)):
            _compare(item, expected, atol, rtol, f"{where}[{index}]")
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{where}: shape {got.shape} != reference {want.shape}"
    if got.dtype.kind in "biu" and want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=where)
    else:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                                   atol=atol, equal_nan=True, err_msg=where)


def _describe(inputs) -> str:
    return ", ".join(f"{value.dtype}{list(value.shape)}" if isinstance(value, np.ndarray)
                     else repr(value) for value in inputs)


def check_against_reference(kernel: Callable, reference: Callable,
                            make_inputs: Callable[[Draw], tuple], *, seeds=range(60),
                            atol: float = 0.0, rtol: float = 0.0) -> int:
    """Run ``kernel`` and ``reference`` on ``make_inputs(Draw(seed))`` for every seed.

    make_inputs : Draw -> tuple of positional arguments (NumPy arrays and plain values).
    kernel : called with the arrays turned into torch tensors (``torch.from_numpy``: same
        dtype, shared memory), returns tensors (or a tuple / dict of them).
    reference : called with the NumPy arrays themselves; returns the same structure as arrays.
    Bool and integer outputs must be equal; float outputs agree to ``atol`` + ``rtol`` (NaN
    where the reference has NaN). Inputs are copied for the reference, so a kernel writing
    into its inputs cannot hide a difference.

    Raises AssertionError naming the seed and the input shapes at the first difference.
    Returns the number of cases checked.
    """
    count = 0
    for seed in seeds:
        inputs = tuple(make_inputs(Draw(seed)))
        want = reference(*[value.copy() if isinstance(value, np.ndarray) else value
                           for value in inputs])
        got = _to_numpy(kernel(*[_to_torch(value) for value in inputs]))
        try:
            _compare(got, _to_numpy(want), atol, rtol)
        except AssertionError as error:
            raise AssertionError(f"kernel differs from its reference at seed {seed} "
                                 f"(inputs {_describe(inputs)}):\n{error}") from None
        count += 1
    assert count > 0, "no case was checked"
    return count
