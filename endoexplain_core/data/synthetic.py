"""The embedded synthetic cohort: endoscopy-like frames with planted truth, in real layouts.

Real HyperKvasir and the external polyp cohorts cannot be downloaded on the build machines, so
the default run generates a small stand-in that the very same loaders read: ``render_frame``
draws one frame (a polyp looks the same with or without dye, so standard polyps stay
recognisable to a model trained mostly on dyed-lifted ones); ``generate_cohort`` writes the
published layouts (docs/protocol.md, "Dataset layouts"; docs/data_models_runs.md, "The
synthetic cohort's design").

Determinism: every random draw comes from ``numpy.random.Generator`` streams derived from
(seed, stream name), never from global state; files are encoded by Pillow with fixed options
and named from the streams, so the same seed and parameters give byte-identical trees in the
pinned environment. Geometry below uses "frame units": the half-length of the frame's shorter
side is 1, the frame centre is (0, 0), x grows rightwards and y downwards.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from PIL import Image, ImageDraw

from endoexplain_core import config, files
from endoexplain_core.data import mirror, roles
from endoexplain_core.data.imageio import is_image_file, read_mask, read_rgb

GENERATOR_VERSION = 2
LAYOUTS = ("embedded", "mirror", "downloaded")
JPEG_QUALITY = 92

# Colours in linear [0, 1] RGB.
MUCOSA = np.array([0.80, 0.42, 0.35], dtype=np.float32)
POLYP = np.array([0.96, 0.70, 0.56], dtype=np.float32)
DYE = np.array([0.18, 0.30, 0.66], dtype=np.float32)
SCAR = np.array([0.93, 0.87, 0.72], dtype=np.float32)
FIBRIN = np.array([0.95, 0.91, 0.76], dtype=np.float32)
STOOL = np.array([0.55, 0.40, 0.14], dtype=np.float32)
POSITION_BOX_GREEN = np.array([0.15, 0.85, 0.25], dtype=np.float32)
LIGHT_DIRECTION = np.array([-0.7, -0.7], dtype=np.float32)  # light from the upper left

# HyperKvasir lower-GI categories: (group folder, category folder) -> render_frame knobs.
# Counts in the real dataset are summarised in docs/protocol.md ("Dataset layouts"); the profiles' category_counts scale them.
CATEGORY_STYLES: dict[tuple[str, str], dict[str, Any]] = {
    ("anatomical-landmarks", "cecum"): {"fold_strength": 0.8},
    ("anatomical-landmarks", "ileum"): {"villi": True, "fold_strength": 0.3},
    ("anatomical-landmarks", "retroflex-rectum"): {"scope_shaft": True},
    ("pathological-findings", "hemorrhoids"): {"scope_shaft": True, "inflammation": 0.3},
    ("pathological-findings", "polyps"): {"lesion": True},
    ("pathological-findings", "ulcerative-colitis-grade-0-1"): {"inflammation": 0.15},
    ("pathological-findings", "ulcerative-colitis-grade-1"): {"inflammation": 0.3},
    ("pathological-findings", "ulcerative-colitis-grade-1-2"): {"inflammation": 0.45},
    ("pathological-findings", "ulcerative-colitis-grade-2"): {"inflammation": 0.6},
    ("pathological-findings", "ulcerative-colitis-grade-2-3"): {"inflammation": 0.75},
    ("pathological-findings", "ulcerative-colitis-grade-3"): {"inflammation": 0.9},
    ("quality-of-mucosal-views", "bbps-0-1"): {"stool": 0.6},
    ("quality-of-mucosal-views", "bbps-2-3"): {"stool": 0.08},
    ("quality-of-mucosal-views", "impacted-stool"): {"stool": 1.0},
    ("therapeutic-interventions", "dyed-lifted-polyps"): {"lesion": True, "dye": True},
    ("therapeutic-interventions", "dyed-resection-margins"): {"dye": True, "scar": True},
}

# External cohorts: centre/modality-specific colour multipliers and frame sizes (relative to
# ``frame_size``; (height factor, width factor)).
POLYPGEN_CENTRES: dict[int, dict[str, Any]] = {
    1: {"colour_shift": (1.00, 1.00, 1.00), "size": (1.00, 1.25), "position_box": False},
    2: {"colour_shift": (1.08, 0.95, 0.90), "size": (1.00, 1.00), "position_box": True},
    3: {"colour_shift": (0.95, 1.00, 1.08), "size": (0.90, 1.20), "position_box": False},
    4: {"colour_shift": (1.05, 1.05, 0.85), "size": (1.10, 1.10), "position_box": False},
    5: {"colour_shift": (0.92, 0.92, 0.92), "size": (1.00, 1.33), "position_box": False},
    6: {"colour_shift": (1.10, 0.90, 1.00), "size": (0.85, 1.00), "position_box": True},
}
POLYPDB_MODALITIES: dict[str, tuple[float, float, float]] = {
    "WLI": (1.00, 1.00, 1.00),  # white light
    "NBI": (0.55, 0.90, 0.85),  # narrow band: brown/teal
    "BLI": (0.62, 0.82, 1.05),  # blue light
    "LCI": (1.12, 0.85, 0.80),  # linked colour: vivid red
    "FICE": (1.05, 0.92, 0.55),  # spectral colour enhancement: orange
}
POLYPDB_CENTRE_MODALITIES: dict[str, tuple[str, ...]] = {
    "Simula": ("WLI", "NBI"),
    "BKAI": ("WLI", "BLI", "FICE", "LCI"),
    "Karolinska": ("WLI", "NBI"),
}


# --- Procedural fields (random draws: ``roles.stream``) ---------------------------------

def _value_noise(rng: np.random.Generator, shape: tuple[int, int], cells: int) -> np.ndarray:
    """Smooth random field, float32 (H, W) in [0, 1]: a ``cells`` x ``cells`` random lattice
    interpolated with smoothstep weights (cells span the shorter side)."""
    height, width = shape
    cells_y = max(1, round(cells * height / min(shape)))
    cells_x = max(1, round(cells * width / min(shape)))
    lattice = rng.random((cells_y + 1, cells_x + 1), dtype=np.float32)
    ys = (np.arange(height, dtype=np.float32) + 0.5) * (cells_y / height)
    xs = (np.arange(width, dtype=np.float32) + 0.5) * (cells_x / width)
    iy, ix = ys.astype(np.int64), xs.astype(np.int64)
    ty, tx = ys - iy, xs - ix
    ty, tx = (ty * ty * (3 - 2 * ty))[:, None], (tx * tx * (3 - 2 * tx))[None, :]
    top = lattice[np.ix_(iy, ix)] * (1 - tx) + lattice[np.ix_(iy, ix + 1)] * tx
    bottom = lattice[np.ix_(iy + 1, ix)] * (1 - tx) + lattice[np.ix_(iy + 1, ix + 1)] * tx
    return top * (1 - ty) + bottom * ty


def _fractal_noise(rng: np.random.Generator, shape: tuple[int, int], cells: int,
                   octaves: int) -> np.ndarray:
    """Sum of ``octaves`` value-noise layers (cells doubling, amplitude halving), in [0, 1]."""
    total = np.zeros(shape, dtype=np.float32)
    weight = 0.0
    for octave in range(octaves):
        amplitude = 0.5 ** octave
        total += amplitude * _value_noise(rng, shape, cells * 2 ** octave)
        weight += amplitude
    return total / weight


def _frame_coordinates(shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, float]:
    """Pixel-centre coordinates (y, x) in frame units, and pixels per frame unit."""
    height, width = shape
    half = min(height, width) / 2.0
    ys = ((np.arange(height, dtype=np.float32) + 0.5) - height / 2.0) / half
    xs = ((np.arange(width, dtype=np.float32) + 0.5) - width / 2.0) / half
    return ys[:, None], xs[None, :], half


def _blend(image: np.ndarray, alpha: np.ndarray, colour: np.ndarray) -> None:
    """In place: image = image * (1 - alpha) + alpha * colour (colour (3,) or (H, W, 3))."""
    image *= (1.0 - alpha)[..., None]
    image += alpha[..., None] * colour


def _spots(image: np.ndarray, y: np.ndarray, x: np.ndarray, centres: np.ndarray,
           radii: np.ndarray, colour: np.ndarray, strength: float) -> None:
    """In place: blend Gaussian spots (centres (K, 2) as (y, x), radii (K,)) towards colour."""
    alpha = np.zeros(image.shape[:2], dtype=np.float32)
    for (cy, cx), radius in zip(centres, radii):
        alpha = np.maximum(alpha, np.exp(-(((y - cy) ** 2 + (x - cx) ** 2) / radius ** 2) * 2.0))
    _blend(image, np.clip(alpha * strength, 0.0, 1.0), colour)


# --- One frame --------------------------------------------------------------------------

# Polyp geometry, chosen to match the masked images of the paper's spatial audit (docs/protocol.md,
# "Synthetic lesion geometry"): mean area share about 0.15 (a random heatmap's peak misses in
# about 83% of frames), the frame centre inside the polyp in about half of the frames, far more
# often for large polyps than for small ones.
LESION_AREA = (0.13, 0.80)          # log-normal area share: median, log standard deviation
LESION_AREA_RANGE = (0.015, 0.45)   # clip of the area share
LESION_OFFSET_SD = 0.19             # centre offset per axis, share of the shorter side
LESION_CENTRE_REACH = 0.80          # polyp centre at most this far out, frame units
ETIS_LESION_AREA = (0.04, 0.70)     # ETIS: the small polyps of its wide frames


def lesion_geometry(rng: np.random.Generator, area: tuple[float, float], offset_sd: float
                    ) -> tuple[float, float, float]:
    """Draw one polyp's radius and centre (frame units: 1 = half the shorter side, centre 0).

    The area share (of the square on the shorter side) is log-normal with median ``area[0]``
    and log standard deviation ``area[1]``, clipped to ``LESION_AREA_RANGE``; the radius of the
    disc with that area follows. The centre is a 2-D Gaussian offset with standard deviation
    ``offset_sd`` of the shorter side per axis, scaled back radially when it lies further out
    than ``LESION_CENTRE_REACH``. Always three normal draws, in this order: area, offset y, offset x, so
    the stream stays aligned whatever the values.
    """
    median, log_sd = area
    if not (0.0 < median < 1.0 and log_sd >= 0.0 and offset_sd >= 0.0):
        raise ValueError(f"lesion geometry needs 0 < median area < 1, log_sd >= 0 and "
                         f"offset_sd >= 0, got area={tuple(area)}, offset_sd={offset_sd}")
    share = float(np.clip(median * np.exp(log_sd * rng.normal()), *LESION_AREA_RANGE))
    radius = 2.0 * np.sqrt(share / np.pi)
    offset_y, offset_x = 2.0 * offset_sd * rng.normal(size=2)
    distance = np.hypot(offset_y, offset_x)
    if distance > LESION_CENTRE_REACH:
        offset_y, offset_x = (offset_y * LESION_CENTRE_REACH / distance,
                              offset_x * LESION_CENTRE_REACH / distance)
    return radius, float(offset_y), float(offset_x)


def render_frame(rng: np.random.Generator, size: int | tuple[int, int], *,
                 lesion: bool = True, dye: bool = False, conspicuity: float = 0.85,
                 dye_strength: float = 0.8,
                 lesion_area: tuple[float, float] = LESION_AREA,
                 lesion_offset_sd: float = LESION_OFFSET_SD,
                 scar: bool = False, inflammation: float = 0.0, stool: float = 0.0,
                 villi: bool = False, scope_shaft: bool = False, fold_strength: float = 0.5,
                 position_box: bool = False,
                 colour_shift: Sequence[float] = (1.0, 1.0, 1.0)) -> tuple[np.ndarray, np.ndarray]:
    """Render one endoscopy-like frame: image uint8 (H, W, 3) RGB, and mask bool (H, W), True on
    the polyp (all False when ``lesion`` is False).
    rng: the only source of randomness (same state -> same frame).
    size: frame size in pixels, ``S`` (square) or ``(height, width)``.
    lesion: plant a polyp; the mask is its footprint (inside the field of view).
    dye: blue dye, a submucosal cushion around the polyp when ``lesion``, else a free patch.
    conspicuity: 0..1, how visible the polyp is (at 0 invisible, its mask still returned).
    dye_strength: 0..1, opacity of the dye.
    lesion_area: (median, log_sd) of the polyp's log-normal area as a share of the square on the
        shorter side, clipped to ``LESION_AREA_RANGE`` (``lesion_geometry``).
    lesion_offset_sd: per-axis SD of the polyp centre's offset from the frame centre, share of the
        shorter side (``lesion_geometry``); independent of size (docs/protocol.md, "Synthetic lesion geometry").
    scar: pale, flat resection scar in the middle of the dye patch (resection margins).
    inflammation: 0..1, ulcerative-colitis severity (redness, lost vessels, erosions, bleeding).
    stool: 0..1, share of the wall covered by stool (bowel-preparation quality).
    villi: granular ileal villi texture.
    scope_shaft: the endoscope's own shaft entering from the bottom (retroflexion).
    fold_strength: 0..1, contrast of the haustral folds around the lumen.
    position_box: green scope-position box in the bottom-left corner.
    colour_shift: per-channel RGB multipliers (centre or imaging-modality shift).
    The layers are drawn in a fixed order, each from ``rng`` in turn: the bytes depend on it.
    """
    height, width = (size, size) if isinstance(size, (int, np.integer)) else tuple(size)
    shape = (height, width)
    _check_frame_arguments(shape, conspicuity=conspicuity, dye_strength=dye_strength,
                           inflammation=inflammation, stool=stool, fold_strength=fold_strength)
    y, x, pixels_per_unit = _frame_coordinates(shape)
    # Geometry first: the polyp (if any), then the lumen on the far side so it never hides it.
    lesion_r, lesion_cy, lesion_cx = lesion_geometry(rng, lesion_area, lesion_offset_sd)
    lumen_r, lumen_cy, lumen_cx = _lumen_geometry(rng, lesion, lesion_r, lesion_cy, lesion_cx)
    lumen_distance = np.sqrt((x - lumen_cx) ** 2 + (y - lumen_cy) ** 2)
    image, texture = _draw_mucosa(rng, shape, y, x, inflammation=inflammation, villi=villi,
                                  stool=stool)
    # Dye, then scar, then the polyp on top (the lifted polyp sits on its blue cushion).
    if dye:
        _draw_dye(image, rng, shape, y, x, texture, lesion=lesion, lesion_r=lesion_r,
                  lesion_cy=lesion_cy, lesion_cx=lesion_cx, dye_strength=dye_strength, scar=scar)
    mask = np.zeros(shape, dtype=bool)
    if lesion:
        mask = _draw_polyp(image, rng, shape, y, x, pixels_per_unit, lesion_r, lesion_cy,
                           lesion_cx, conspicuity)
    _illuminate(image, rng, shape, lumen_distance, lumen_r, fold_strength)
    if scope_shaft:
        _draw_scope_shaft(image, rng, y, x, pixels_per_unit)
    _draw_highlights(image, rng, y, x, lesion_r, lesion_cy, lesion_cx,
                     polyp_conspicuity=conspicuity if lesion else 0.0)
    image *= np.asarray(colour_shift, dtype=np.float32)
    image += rng.normal(0.0, 0.012, image.shape).astype(np.float32)
    # Black circular field of view (the corners and, on wide frames, the sides are black).
    field = np.clip((rng.uniform(0.98, 1.10) - np.sqrt(x * x + y * y)) * pixels_per_unit, 0, 1)
    image *= field[..., None]
    mask &= field > 0.5
    if position_box:
        _draw_position_box(image)
    return (np.clip(image, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8), mask


def _check_frame_arguments(shape: tuple[int, int], **shares: float) -> None:
    """``ValueError`` for a frame under 16 pixels or a share outside [0, 1]."""
    if min(shape) < 16:
        raise ValueError(f"frame size must be at least 16 pixels, got {shape[0]}x{shape[1]}")
    for name, value in shares.items():
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {value}")


def _lumen_geometry(rng: np.random.Generator, lesion: bool, lesion_r: float, lesion_cy: float,
                   lesion_cx: float) -> tuple[float, float, float]:
    """The lumen's radius and centre (frame units), on the far side of the polyp so that it
    never hides it."""
    centre_angle = np.arctan2(lesion_cy, lesion_cx)
    lumen_r = rng.uniform(0.16, 0.30)
    lumen_angle = centre_angle + np.pi + rng.uniform(-0.8, 0.8)
    if lesion:
        lumen_offset = lesion_r + 1.4 * lumen_r + rng.uniform(0.0, 0.25)
        lumen_cy = lesion_cy + lumen_offset * np.sin(lumen_angle)
        lumen_cx = lesion_cx + lumen_offset * np.cos(lumen_angle)
    else:
        lumen_offset = rng.uniform(0.1, 0.6)
        lumen_cy, lumen_cx = lumen_offset * np.sin(lumen_angle), lumen_offset * np.cos(lumen_angle)
    return lumen_r, lumen_cy, lumen_cx


def _draw_mucosa(rng: np.random.Generator, shape: tuple[int, int], y: np.ndarray, x: np.ndarray,
                 *, inflammation: float, villi: bool, stool: float) -> tuple[np.ndarray, np.ndarray]:
    """The mucosa: base colour, texture, vessels, villi, inflammation and stool. Returns the
    float image (H, W, 3) and the texture field (H, W) later layers reuse."""
    texture = _fractal_noise(rng, shape, cells=4, octaves=4)
    mucosa = MUCOSA + rng.normal(0.0, 0.025, 3).astype(np.float32)
    mucosa = mucosa * np.array([1.0 + 0.06 * inflammation, 1.0 - 0.35 * inflammation,
                                1.0 - 0.30 * inflammation], dtype=np.float32)
    image = mucosa * (0.85 + 0.30 * (texture - 0.5))[..., None]
    vessel_field = _fractal_noise(rng, shape, cells=5, octaves=2)
    vessels = np.exp(-((vessel_field - 0.5) / 0.025) ** 2) * (0.9 * (1.0 - inflammation))
    image *= 1.0 - vessels[..., None] * np.array([0.15, 0.40, 0.35], dtype=np.float32)
    if villi:
        granules = _value_noise(rng, shape, cells=max(4, min(shape) // 3))
        image *= (0.88 + 0.24 * granules)[..., None]
        image += 0.06
    if inflammation > 0:
        granules = _value_noise(rng, shape, cells=max(4, min(shape) // 4))
        image *= (1.0 + 0.25 * inflammation * (granules - 0.5))[..., None]
        bleeding = np.clip((_value_noise(rng, shape, cells=6) - (1.0 - 0.35 * inflammation)) * 8,
                           0, 1)
        _blend(image, bleeding * 0.6, np.array([0.45, 0.05, 0.06], dtype=np.float32))
        erosion_count = int(round(14 * inflammation))
        _spots(image, y, x, rng.uniform(-0.8, 0.8, (erosion_count, 2)),
               rng.uniform(0.015, 0.045, erosion_count), FIBRIN, 0.9)
    if stool > 0:
        stool_field = _fractal_noise(rng, shape, cells=3, octaves=3)
        cover = np.clip((stool_field - (1.0 - stool) * 0.75 - 0.2) * 6.0, 0.0, 1.0)
        _blend(image, cover * 0.95, STOOL * (0.75 + 0.5 * texture)[..., None])
    return image, texture


def _draw_dye(image: np.ndarray, rng: np.random.Generator, shape: tuple[int, int], y: np.ndarray,
              x: np.ndarray, texture: np.ndarray, *, lesion: bool, lesion_r: float,
              lesion_cy: float, lesion_cx: float, dye_strength: float, scar: bool) -> None:
    """In place: blue dye (a cushion under the polyp, or a free patch) and the resection scar."""
    if lesion:
        dye_cy, dye_cx = lesion_cy, lesion_cx
        # The cushion grows with the polyp but leaves some mucosa around large ones.
        dye_r = min(lesion_r * rng.uniform(1.7, 2.5), lesion_r + 0.5)
    else:
        dye_cy, dye_cx = rng.uniform(-0.45, 0.45, 2)
        dye_r = rng.uniform(0.25, 0.45)
    dye_edge = _fractal_noise(rng, shape, cells=5, octaves=2)
    dye_relative = np.sqrt((x - dye_cx) ** 2 + (y - dye_cy) ** 2) / (
        dye_r * (1.0 + 0.5 * (dye_edge - 0.5)))
    dye_alpha = np.clip((1.0 - dye_relative) * 3.0, 0, 1) * (0.65 + 0.35 * dye_edge)
    _blend(image, dye_alpha * dye_strength, DYE * (0.8 + 0.4 * texture)[..., None])
    if scar:
        scar_r = dye_r * rng.uniform(0.35, 0.5)
        scar_relative = np.sqrt((x - dye_cx) ** 2 + (y - dye_cy) ** 2) / (
            scar_r * (1.0 + 0.6 * (texture - 0.5)))
        scar_alpha = np.clip((1.0 - scar_relative) * 4.0, 0, 1)
        _blend(image, scar_alpha * 0.9, SCAR * (0.9 + 0.2 * texture)[..., None])


def _draw_polyp(image: np.ndarray, rng: np.random.Generator, shape: tuple[int, int],
                y: np.ndarray, x: np.ndarray, pixels_per_unit: float, lesion_r: float,
                lesion_cy: float, lesion_cx: float, conspicuity: float) -> np.ndarray:
    """In place: the polyp (dome shading, pits, rim shadow) blended by ``conspicuity``.
    Returns its footprint, bool (H, W)."""
    angle = np.arctan2(y - lesion_cy, x - lesion_cx)
    harmonics = rng.uniform(0.0, 1.0, 3) * np.array([0.12, 0.07, 0.04])
    phases = rng.uniform(0.0, 2 * np.pi, 3)
    stretch = rng.uniform(0.8, 1.2)
    boundary = lesion_r * (1.0 + sum(a * np.cos((k + 1) * angle + p)
                                     for k, (a, p) in enumerate(zip(harmonics, phases))))
    dx, dy = (x - lesion_cx) * stretch, (y - lesion_cy) / stretch
    relative = np.sqrt(dx * dx + dy * dy) / boundary
    mask = relative < 1.0
    edge_alpha = np.clip((1.0 - relative) * boundary * pixels_per_unit / 1.5, 0, 1)
    dome = np.sqrt(np.clip(1.0 - relative ** 2, 0, 1))
    towards_light = (dx * LIGHT_DIRECTION[1] + dy * LIGHT_DIRECTION[0]) / boundary
    shading = 0.78 + 0.30 * dome + 0.22 * towards_light
    pits = _value_noise(rng, shape, cells=max(4, int(min(shape) / 4)))
    surface = POLYP * (shading * (1.0 + 0.16 * conspicuity * (pits - 0.5)))[..., None]
    rim = np.exp(-((relative - 1.1) / 0.08) ** 2) * np.clip(0.5 - towards_light, 0, 1)
    image *= (1.0 - 0.45 * conspicuity * rim)[..., None]
    _blend(image, edge_alpha * conspicuity, surface)
    return mask


def _illuminate(image: np.ndarray, rng: np.random.Generator, shape: tuple[int, int],
                lumen_distance: np.ndarray, lumen_r: float, fold_strength: float) -> None:
    """In place: haustral folds around the lumen, brighter near the scope, a dark lumen."""
    fold_phase = _fractal_noise(rng, shape, cells=3, octaves=2)
    fold_period = rng.uniform(0.22, 0.34)
    folds = np.sin(2 * np.pi * lumen_distance / fold_period + 5.0 * fold_phase)
    fold_shading = 1.0 + fold_strength * 0.22 * folds * np.clip(1.4 - lumen_distance, 0, 1)
    illumination = 0.5 + 0.5 * np.clip(lumen_distance / 1.1, 0, 1) ** 0.7
    lumen_dark = np.exp(-(lumen_distance / lumen_r) ** 2)
    image *= (fold_shading * illumination * (1.0 - 0.93 * lumen_dark))[..., None]


def _draw_scope_shaft(image: np.ndarray, rng: np.random.Generator, y: np.ndarray, x: np.ndarray,
                      pixels_per_unit: float) -> None:
    """In place: the endoscope's own shaft entering from the bottom (retroflexion)."""
    shaft_x = rng.uniform(-0.5, 0.5)
    shaft_halfwidth = rng.uniform(0.18, 0.28)
    shaft_top = rng.uniform(0.0, 0.45)
    across = (x - shaft_x) / shaft_halfwidth
    inside = np.clip((1.0 - np.abs(across)) * shaft_halfwidth * pixels_per_unit, 0, 1)
    inside = inside * np.clip((y - shaft_top) * pixels_per_unit, 0, 1)
    shaft_colour = np.float32(0.10) * (0.6 + 1.2 * np.clip(1.0 - across ** 2, 0, 1))
    _blend(image, inside, np.repeat(shaft_colour[..., None], 3, axis=2))


def _draw_highlights(image: np.ndarray, rng: np.random.Generator, y: np.ndarray, x: np.ndarray,
                     lesion_r: float, lesion_cy: float, lesion_cx: float, *,
                     polyp_conspicuity: float) -> None:
    """In place: a few specular highlights on the wall, and one on the polyp's lit side
    (none when ``polyp_conspicuity`` is 0: no polyp, or an invisible one)."""
    highlight_count = int(rng.integers(3, 9))
    _spots(image, y, x, rng.uniform(-0.85, 0.85, (highlight_count, 2)),
           rng.uniform(0.008, 0.025, highlight_count), np.ones(3, dtype=np.float32), 1.0)
    if polyp_conspicuity > 0:
        lit_spot = np.array([[lesion_cy + 0.4 * lesion_r * LIGHT_DIRECTION[0],
                              lesion_cx + 0.4 * lesion_r * LIGHT_DIRECTION[1]]])
        _spots(image, y, x, lit_spot, np.array([0.14 * lesion_r]),
               np.ones(3, dtype=np.float32), polyp_conspicuity)


def _draw_position_box(image: np.ndarray) -> None:
    """In place: the green scope-position box in the bottom-left corner (outline + a curve)."""
    height, width = image.shape[:2]
    box_h, box_w = max(6, round(0.17 * height)), max(8, round(0.21 * width))
    top, left = height - box_h - 1, 1
    image[top:top + box_h, left:left + box_w] = 0.0
    image[top, left:left + box_w] = POSITION_BOX_GREEN
    image[top + box_h - 1, left:left + box_w] = POSITION_BOX_GREEN
    image[top:top + box_h, left] = POSITION_BOX_GREEN
    image[top:top + box_h, left + box_w - 1] = POSITION_BOX_GREEN
    columns = np.arange(2, box_w - 2)
    rows = (box_h / 2 + (box_h / 3) * np.sin(columns / max(1, box_w - 4) * np.pi)).astype(int)
    image[top + np.clip(rows, 1, box_h - 2), left + columns] = POSITION_BOX_GREEN


# --- Encoding with fixed options (byte-determinism) -------------------------------------

def encode_image(array: np.ndarray, file_format: str, quality: int = JPEG_QUALITY) -> bytes:
    """Encode uint8 (H, W, 3) RGB or bool/uint8 (H, W) with fixed Pillow options.

    ``file_format`` is "JPEG", "PNG" or "TIFF". Bool arrays are written as 0/255 greyscale.
    No metadata (no EXIF, no timestamps), 4:2:0 chroma subsampling for colour JPEG.
    """
    if array.dtype == bool:
        array = array.astype(np.uint8) * 255
    image = Image.fromarray(array)
    buffer = io.BytesIO()
    if file_format == "JPEG":
        image.save(buffer, format="JPEG", quality=quality, subsampling=2 if array.ndim == 3 else 0,
                   optimize=False, progressive=False)
    elif file_format == "PNG":
        image.save(buffer, format="PNG", compress_level=6, optimize=False)
    elif file_format == "TIFF":
        image.save(buffer, format="TIFF", compression=None)
    else:
        raise ValueError(f"unsupported format {file_format!r}")
    return buffer.getvalue()


class NearDuplicateError(RuntimeError):
    """No re-encoding of a frame kept its average hash (happens on very small frames)."""


def near_duplicate(array: np.ndarray, original: bytes) -> bytes:
    """JPEG bytes of ``array`` that differ from ``original`` but share its 16x16 average hash.

    Models the same frame saved twice: re-encoding at other qualities keeps the picture but
    changes the bytes. Candidates are tried in a fixed order (deterministic): the rendered
    array at other qualities, then the decoded original re-saved (smaller change, needed for
    tiny frames whose 16x16 hash is sensitive).
    """
    target = roles.hash_image_bytes(original)["ahash"]
    with Image.open(io.BytesIO(original)) as decoded:
        resaved = np.asarray(decoded.convert("RGB"))
    candidates = [(array, q) for q in (88, 95, 85, 97, 90, 80, 75)]
    candidates += [(resaved, q) for q in (JPEG_QUALITY, 93, 91, 94, 90, 95, 89, 96)]
    for pixels, quality in candidates:
        candidate = encode_image(pixels, "JPEG", quality)
        if candidate != original and roles.hash_image_bytes(candidate)["ahash"] == target:
            return candidate
    raise NearDuplicateError("no re-encoding kept the average hash; pick another frame")


def _uuid_name(rng: np.random.Generator) -> str:
    """A UUID-shaped lowercase hex name (HyperKvasir's labelled images are named by UUID)."""
    digits = rng.bytes(16).hex()
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


def _kvasir_name(rng: np.random.Generator) -> str:
    """A 25-character name shaped like Kvasir-SEG's segmented-image ids."""
    return "cj" + rng.bytes(12).hex()[:23]


# --- The cohort -------------------------------------------------------------------------

class _TreeWriter:
    """Writes files under a root and remembers what it wrote (relative POSIX paths).

    ``layout`` "mirror" dresses every rendered frame as the real datasets look on disk
    (``dress``, from the ``mirror/<name>`` streams); "embedded" leaves frames as rendered.
    """

    def __init__(self, root: Path, seed: int, layout: str):
        self.root = root
        self.written: list[str] = []
        self.mirror = layout == "mirror"
        self._seed = seed
        self._streams: dict[str, np.random.Generator] = {}

    def dress(self, name: str, image: np.ndarray, mask: np.ndarray,
              sizes: Sequence[tuple[int, int]], text: bool) -> tuple[np.ndarray, np.ndarray]:
        """``mirror.dress_frame`` with the stream ``mirror/<name>`` in the mirror layout; the
        frame unchanged in the embedded one."""
        if not self.mirror:
            return image, mask
        if name not in self._streams:
            self._streams[name] = roles.stream(self._seed, f"mirror/{name}")
        return mirror.dress_frame(self._streams[name], image, mask, sizes, text=text)

    def write(self, relative: str, data: bytes) -> None:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            raise FileExistsError(f"{path}: generator tried to write the same file twice")
        # A plain write: the whole tree is built in ``<root>.partial`` and renamed into place
        # (``generate_cohort``), so per-file atomic replacement would add nothing but cost.
        path.write_bytes(data)
        self.written.append(relative)


def generate_cohort(root: str | Path, *, seed: int, design: config.RolesSettings) -> dict[str, Any]:
    """Write the synthetic cohort under ``root`` and return a summary of what was written.

    Layout (see docs/architecture.md): ``hyper-kvasir/labeled-images/lower-gi-tract/<group>/
    <category>/<uuid>.jpg``, ``hyper-kvasir/segmented-images/{images,masks}/<id>.jpg``,
    ``ETIS-LaribPolypDB/{ETIS-LaribPolypDB/<n>.tif, Ground Truth/p<n>.tif}``,
    ``PolypGen/data_C<k>/{images_C<k>/<stem>.jpg, masks_C<k>/<stem>_mask.jpg}``,
    ``PolypDB/PolypDB_center_wise/<centre>/<modality>/{images,masks}/<stem>.jpg|png``.

    ``seed``: master seed; every stream is derived from it and a stream name. ``design``: the
    cohort's design, 00's profile section (``config.RolesSettings``; what each key does here:
    docs/data_models_runs.md, "The synthetic cohort's design").

    The tree is built in ``<root>.partial`` and renamed into place, so an interrupted run
    leaves any previous cohort intact. An existing ``root`` is replaced only if it holds this
    generator's marker file (``synthetic_cohort.json``); otherwise ``FileExistsError``.
    """
    root = Path(root)
    _check_design(design, root)
    layout, parameters = design.synthetic_layout, _marker_parameters(design, seed)
    partial = root.with_name(root.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    writer = _TreeWriter(partial, seed, "mirror" if layout == "downloaded" else layout)
    knobs = {"conspicuity": design.conspicuity, "dye_strength": design.dye_strength,
             "standard_conspicuity_floor": design.standard_conspicuity_floor,
             "standard_conspicuity_power": design.standard_conspicuity_power,
             "lesion_area": tuple(design.lesion_area), "lesion_offset_sd": design.lesion_offset_sd}
    frame_size = design.frame_size
    summary: dict[str, Any] = {"parameters": parameters}
    summary["hyper-kvasir"] = _write_hyperkvasir(writer, seed, frame_size, dict(design.category_counts),
                                                 design.n_segmented, design.n_development_polyps,
                                                 design.n_audit_near_duplicates,
                                                 design.n_development_duplicates,
                                                 design.n_development_near_duplicates,
                                                 design.position_box_rate, knobs)
    summary["ETIS-LaribPolypDB"] = _write_etis(writer, seed, frame_size, design.etis_count,
                                               design.etis_duplicates, knobs)
    summary["PolypGen"] = _write_polypgen(writer, seed, frame_size, design.polypgen_counts,
                                          design.polypgen_empty_per_centre,
                                          design.polypgen_duplicates, knobs)
    summary["PolypDB"] = _write_polypdb(writer, seed, frame_size, design.polypdb_per_cell, knobs)
    if writer.mirror:
        summary["mirror_extras"] = _write_mirror_extras(writer, seed, frame_size)
    summary["files"] = len(writer.written)
    if layout == "downloaded":
        summary["downloaded"] = mirror.rearrange_as_downloaded(partial)
    writer.write(config.SYNTHETIC_MARKER, (json.dumps(summary, indent=2, sort_keys=True) + "\n").encode())
    _replace_directory(partial, root)
    return summary


def _check_design(design: config.RolesSettings, root: Path) -> None:
    """``ValueError`` for a design the generator cannot write; ``FileExistsError`` for a
    ``root`` that is not an earlier synthetic cohort."""
    counts = dict(design.category_counts)
    known = {category for _, category in CATEGORY_STYLES}
    unknown = sorted(set(counts) - known | ({"polyps"} & set(counts)))
    if unknown:
        raise ValueError(f"category_counts has unknown or derived categories {unknown}; "
                         f"known: {sorted(known - {'polyps'})}")
    if len(design.polypgen_counts) != len(POLYPGEN_CENTRES):
        raise ValueError(f"polypgen_counts needs {len(POLYPGEN_CENTRES)} values (C1..C6)")
    if design.n_audit_near_duplicates > design.n_segmented:
        raise ValueError("n_audit_near_duplicates cannot exceed n_segmented")
    if design.synthetic_layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {design.synthetic_layout!r}")
    if root.exists() and not (root / config.SYNTHETIC_MARKER).is_file():
        raise FileExistsError(f"{root} exists and is not a synthetic cohort written by this "
                              f"generator (no {config.SYNTHETIC_MARKER}); refusing to overwrite it")


def _marker_parameters(design: config.RolesSettings, seed: int) -> dict[str, Any]:
    """The design as written into the cohort's marker file (its key order and types are part
    of the marker's bytes, hence of the manifest digest)."""
    counts = dict(design.category_counts)
    parameters = {
        "generator_version": GENERATOR_VERSION, "seed": int(seed), "frame_size": int(design.frame_size),
        "category_counts": {k: int(counts[k]) for k in sorted(counts)},
        "n_segmented": design.n_segmented, "n_development_polyps": design.n_development_polyps,
        "n_audit_near_duplicates": design.n_audit_near_duplicates,
        "n_development_duplicates": design.n_development_duplicates,
        "n_development_near_duplicates": design.n_development_near_duplicates,
        "conspicuity": design.conspicuity, "dye_strength": design.dye_strength,
        "lesion_area": list(design.lesion_area), "lesion_offset_sd": design.lesion_offset_sd,
        "position_box_rate": design.position_box_rate,
        "etis_count": design.etis_count, "etis_duplicates": design.etis_duplicates,
        "polypgen_counts": list(design.polypgen_counts),
        "polypgen_empty_per_centre": design.polypgen_empty_per_centre,
        "polypgen_duplicates": design.polypgen_duplicates, "polypdb_per_cell": design.polypdb_per_cell,
    }
    if design.standard_conspicuity_floor != CONSPICUITY_FLOOR:   # earlier markers keep their bytes
        parameters["standard_conspicuity_floor"] = design.standard_conspicuity_floor
    if design.standard_conspicuity_power != 1.0:
        parameters["standard_conspicuity_power"] = design.standard_conspicuity_power
    if design.synthetic_layout != "embedded":   # the embedded marker keeps its earlier bytes
        parameters["layout"] = design.synthetic_layout
    return parameters


def _replace_directory(new: Path, target: Path) -> None:
    """Move ``new`` to ``target``; an old ``target`` is removed only after the move succeeded."""
    old = target.with_name(target.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if target.exists():
        os.replace(target, old)
    os.replace(new, target)
    if old.exists():
        shutil.rmtree(old)


# Per-frame conspicuity factor floor of dyed-lifted polyps (dye outlines a lifted polyp, so it
# stays conspicuous) and of the external cohorts' polyps (their transfer audit reads IoU, not
# scores). Standard HyperKvasir polyps use the design's ``standard_conspicuity_floor``.
CONSPICUITY_FLOOR = 0.75


def _polyp_knobs(rng: np.random.Generator, knobs: dict[str, Any],
                 floor: float = CONSPICUITY_FLOOR, power: float = 1.0) -> dict[str, Any]:
    """Per-frame polyp knobs: the shared conspicuity times a factor floor + (1 - floor) x U^power,
    U uniform in [0, 1] (power 1: uniform in [floor, 1]; power 2: most factors near the floor)."""
    knobs = {key: value for key, value in knobs.items() if not key.startswith("standard_conspicuity")}
    factor = (rng.uniform(floor, 1.0) if power == 1.0 else   # power 1: the earlier cohorts' draws
              floor + (1.0 - floor) * rng.random() ** power)
    return {**knobs, "conspicuity": knobs["conspicuity"] * factor}


def _write_hyperkvasir(writer: _TreeWriter, seed: int, frame_size: int, counts: dict[str, int],
                       n_segmented: int, n_development_polyps: int,
                       n_audit_near_duplicates: int, n_development_duplicates: int,
                       n_development_near_duplicates: int, position_box_rate: float,
                       knobs: dict[str, Any]) -> dict[str, Any]:
    labelled = "hyper-kvasir/labeled-images/lower-gi-tract"
    written: dict[str, int] = {}
    negative_frames: list[tuple[str, np.ndarray, bytes]] = []  # (folder, array, bytes)
    for (group, category), style in CATEGORY_STYLES.items():
        folder = f"{labelled}/{group}/{category}"
        rng = roles.stream(seed, f"hyper-kvasir/{category}")
        count = n_segmented + n_development_polyps if category == "polyps" else counts.get(category, 0)
        frames = []
        for _ in range(count):
            shape = ((CONSPICUITY_FLOOR, 1.0) if style.get("dye") else
                     (knobs["standard_conspicuity_floor"], knobs["standard_conspicuity_power"]))
            frame_knobs = _polyp_knobs(rng, knobs, *shape) if style.get("lesion") else {
                "dye_strength": knobs["dye_strength"]}
            image, mask = render_frame(rng, frame_size, **{"lesion": False, **style},
                                       **frame_knobs,
                                       position_box=bool(rng.random() < position_box_rate))
            image, mask = writer.dress("hyper-kvasir", image, mask, mirror.HYPERKVASIR_SIZES,
                                       mirror.OVERLAY_TEXT["hyper-kvasir"])
            data = encode_image(image, "JPEG")
            writer.write(f"{folder}/{_uuid_name(rng)}.jpg", data)
            frames.append((image, mask, data))
        written[category] = count
        if category == "polyps":
            polyp_frames, polyp_folder, polyp_rng = frames, folder, rng
        elif not style.get("lesion"):
            negative_frames += [(folder, image, data) for image, _, data in frames]

    # Segmented set: byte-identical copies of the first n_segmented polyps, other names.
    for image, mask, data in polyp_frames[:n_segmented]:
        name = _kvasir_name(polyp_rng)
        writer.write(f"hyper-kvasir/segmented-images/images/{name}.jpg", data)
        writer.write(f"hyper-kvasir/segmented-images/masks/{name}.jpg", encode_image(mask, "JPEG"))
    # Audit near-duplicates: the first segmented frames that survive re-encoding unhashed.
    near_copies = []
    for image, _, data in polyp_frames[:n_segmented]:
        if len(near_copies) == n_audit_near_duplicates:
            break
        try:
            near_copies.append(near_duplicate(image, data))
        except NearDuplicateError:
            continue
    if len(near_copies) < n_audit_near_duplicates:
        raise NearDuplicateError(f"only {len(near_copies)} of {n_audit_near_duplicates} audit "
                                 f"near-duplicates possible at frame_size {frame_size}")
    for copy in near_copies:
        writer.write(f"{polyp_folder}/{_uuid_name(polyp_rng)}.jpg", copy)
    written["polyps"] += n_audit_near_duplicates

    # Development duplicates among negatives: byte copies and re-encoded copies.
    duplicate_rng = roles.stream(seed, "hyper-kvasir/duplicates")
    n_copies = n_development_duplicates + n_development_near_duplicates
    if n_copies > len(negative_frames):
        raise ValueError("more development duplicates requested than negative frames")
    chosen = sorted(int(i) for i in duplicate_rng.choice(len(negative_frames), size=n_copies,
                                                          replace=False))
    spare = [i for i in range(len(negative_frames)) if i not in chosen]  # if re-encoding fails
    for number, index in enumerate(chosen):
        if number < n_development_duplicates:
            folder, _, copy = negative_frames[index]
        else:
            used, folder, copy = _negative_near_duplicate(negative_frames, [index] + spare)
            spare = [i for i in spare if i != used]
        writer.write(f"{folder}/{_uuid_name(duplicate_rng)}.jpg", copy)
        written[folder.rsplit("/", 1)[1]] += 1
    return {"labelled": written, "labelled_total": sum(written.values()),
            "segmented": n_segmented, "audit_near_duplicates": n_audit_near_duplicates,
            "development_polyps": n_development_polyps,
            "development_duplicates": n_development_duplicates,
            "development_near_duplicates": n_development_near_duplicates}


def _negative_near_duplicate(frames: list[tuple[str, np.ndarray, bytes]],
                             candidates: list[int]) -> tuple[int, str, bytes]:
    """(index, folder, near-duplicate bytes) of the first candidate frame that allows one."""
    for index in candidates:
        folder, image, data = frames[index]
        try:
            return index, folder, near_duplicate(image, data)
        except NearDuplicateError:
            continue
    raise NearDuplicateError("no negative frame allows a near-duplicate; raise frame_size")


def _scaled(frame_size: int, factors: tuple[float, float]) -> tuple[int, int]:
    return (int(round(frame_size * factors[0])), int(round(frame_size * factors[1])))


def _write_etis(writer: _TreeWriter, seed: int, frame_size: int, count: int, duplicates: int,
                knobs: dict[str, Any]) -> dict[str, Any]:
    """ETIS: TIFF frames 1..N, masks ``Ground Truth/p<n>.tif``; small polyps, wide frames."""
    rng = roles.stream(seed, "ETIS-LaribPolypDB")
    size = _scaled(frame_size, (1.0, 1.27))
    etis_knobs = {**knobs, "lesion_area": ETIS_LESION_AREA}
    frames = []
    for number in range(1, count + 1):
        image, mask = render_frame(rng, size, **_polyp_knobs(rng, etis_knobs),
                                   colour_shift=(1.02, 0.97, 0.92))
        image, mask = writer.dress("ETIS-LaribPolypDB", image, mask, mirror.ETIS_SIZES,
                                   mirror.OVERLAY_TEXT["ETIS-LaribPolypDB"])
        frames.append((encode_image(image, "TIFF"), mask))
        writer.write(f"ETIS-LaribPolypDB/ETIS-LaribPolypDB/{number}.tif", frames[-1][0])
        writer.write(f"ETIS-LaribPolypDB/Ground Truth/p{number}.tif", encode_image(mask, "TIFF"))
    sources = rng.choice(count, size=min(duplicates, count), replace=False) if count else []
    for offset, source in enumerate(sorted(int(i) for i in sources)):
        number = count + 1 + offset
        data, mask = frames[source]
        # Same frame, mask drawn again slightly larger: the union is what the audit uses.
        grown = mask | np.roll(mask, 1, axis=0) | np.roll(mask, 1, axis=1)
        writer.write(f"ETIS-LaribPolypDB/ETIS-LaribPolypDB/{number}.tif", data)
        writer.write(f"ETIS-LaribPolypDB/Ground Truth/p{number}.tif", encode_image(grown, "TIFF"))
    return {"frames": count + len(sources), "duplicate_frames": len(sources)}


def _write_polypgen(writer: _TreeWriter, seed: int, frame_size: int, counts: Sequence[int],
                    empty_per_centre: int, duplicates: int,
                    knobs: dict[str, Any]) -> dict[str, Any]:
    """PolypGen: six centres with their own colour and size; some frames without a polyp."""
    per_centre: dict[str, int] = {}
    empty = 0
    for centre, count in zip(sorted(POLYPGEN_CENTRES), counts):
        style = POLYPGEN_CENTRES[centre]
        rng = roles.stream(seed, f"PolypGen/C{centre}")
        size = _scaled(frame_size, style["size"])
        folder = f"PolypGen/data_C{centre}"
        written = count
        for index in range(count):
            has_polyp = index >= min(empty_per_centre, count)
            empty += not has_polyp
            image, mask = render_frame(rng, size, lesion=has_polyp, **_polyp_knobs(rng, knobs),
                                       colour_shift=style["colour_shift"],
                                       position_box=style["position_box"])
            image, mask = writer.dress(f"PolypGen/C{centre}", image, mask,
                                       mirror.POLYPGEN_SIZES[centre], mirror.OVERLAY_TEXT["PolypGen"])
            stem = f"C{centre}_{index + 1:04d}"
            data = encode_image(image, "JPEG")
            mask_data = encode_image(_polypgen_mask(writer, mask, index), "JPEG")
            writer.write(f"{folder}/images_C{centre}/{stem}.jpg", data)
            writer.write(f"{folder}/masks_C{centre}/{stem}_mask.jpg", mask_data)
            if centre == 1 and has_polyp and index - empty_per_centre < duplicates:
                copy_stem = f"C1_dup{index + 1:04d}"
                writer.write(f"{folder}/images_C1/{copy_stem}.jpg", data)
                writer.write(f"{folder}/masks_C1/{copy_stem}_mask.jpg", mask_data)
                written += 1
        per_centre[f"C{centre}"] = written
    return {"frames": per_centre, "empty_mask_frames": empty}


def _write_polypdb(writer: _TreeWriter, seed: int, frame_size: int, per_cell: int,
                   knobs: dict[str, Any]) -> dict[str, Any]:
    """PolypDB centre-wise tree: modality colour shifts; PNG masks."""
    cells: dict[str, int] = {}
    for centre, modalities in POLYPDB_CENTRE_MODALITIES.items():
        for modality in modalities:
            rng = roles.stream(seed, f"PolypDB/{centre}/{modality}")
            folder = f"PolypDB/PolypDB_center_wise/{centre}/{modality}"
            for index in range(per_cell):
                image, mask = render_frame(rng, frame_size, **_polyp_knobs(rng, knobs),
                                           colour_shift=POLYPDB_MODALITIES[modality],
                                           position_box=centre == "Simula")
                image, mask = writer.dress(f"PolypDB/{centre}", image, mask,
                                           mirror.POLYPDB_SIZES[centre],
                                           mirror.OVERLAY_TEXT[f"PolypDB/{centre}"])
                stem = f"{centre}_{modality}_{index + 1:03d}"
                image_data, mask_data = encode_image(image, "JPEG"), encode_image(mask, "PNG")
                writer.write(f"{folder}/images/{stem}.jpg", image_data)
                writer.write(f"{folder}/masks/{stem}.png", mask_data)
                if writer.mirror:   # the modality-wise tree: the same files re-organised
                    modality_folder = f"PolypDB/PolypDB_modality_wise/{modality}"
                    writer.write(f"{modality_folder}/images/{stem}.jpg", image_data)
                    writer.write(f"{modality_folder}/masks/{stem}.png", mask_data)
            cells[f"{centre}/{modality}"] = per_cell
    return {"frames": sum(cells.values()), "cells": cells}


def _polypgen_mask(writer: _TreeWriter, mask: np.ndarray, index: int) -> np.ndarray:
    """The array a PolypGen mask is saved from: greyscale, or in the mirror layout a 3-channel
    copy for every other frame (several centres ship 3-channel JPEG masks)."""
    if writer.mirror and index % 2 == 0:
        return np.repeat((mask.astype(np.uint8) * 255)[..., None], 3, axis=2)
    return mask


def _write_mirror_extras(writer: _TreeWriter, seed: int, frame_size: int) -> dict[str, Any]:
    """What real downloads hold besides the frames the readers index: stray system files,
    HyperKvasir's label CSV and two upper-GI frames (counted and excluded), an AppleDouble
    ``._`` copy beside a PolypGen frame and PolypGen's ``sequenceData`` video frames."""
    rng = roles.stream(seed, "mirror/extras")
    for relative, data in mirror.STRAY_FILES.items():
        writer.write(relative, data)
    labelled = "hyper-kvasir/labeled-images/lower-gi-tract/"
    label_rows = []
    for path in writer.written:
        if path.startswith(labelled):
            group, category, name = path.removeprefix(labelled).split("/")
            label_rows.append((name.rsplit(".", 1)[0], category, group))
    writer.write(mirror.LABEL_CSV, mirror.label_csv(label_rows))
    upper = "hyper-kvasir/labeled-images/upper-gi-tract/anatomical-landmarks/z-line"
    for _ in range(2):
        image, mask = render_frame(rng, frame_size, lesion=False)
        image, _ = writer.dress("hyper-kvasir/upper-gi", image, mask, mirror.HYPERKVASIR_SIZES, True)
        writer.write(f"{upper}/{_uuid_name(rng)}.jpg", encode_image(image, "JPEG"))
    writer.write("PolypGen/data_C1/images_C1/._C1_0001.jpg", b"\x00\x05\x16\x07" + bytes(78))
    sequence = "PolypGen/sequenceData/positive/seq1"
    for number in (1, 2):
        image, mask = render_frame(rng, frame_size)
        image, mask = writer.dress("PolypGen/sequence", image, mask, mirror.POLYPGEN_SIZES[1], True)
        writer.write(f"{sequence}/images_seq1/seq1_{number:04d}.jpg", encode_image(image, "JPEG"))
        writer.write(f"{sequence}/masks_seq1/seq1_{number:04d}_mask.jpg", encode_image(mask, "JPEG"))
    return {"stray_files": len(mirror.STRAY_FILES) + 1, "label_csv_rows": len(label_rows),
            "upper_gi_frames": 2, "sequence_frames": 2}


# --- Contact sheet ----------------------------------------------------------------------

def _contact_rows(root: Path, per_row: int) -> list[tuple[str, list[Path], list[Path | None]]]:
    """(label, image paths, mask paths or None) for each row of the contact sheet."""
    rows = []
    labelled = root / "hyper-kvasir" / "labeled-images" / "lower-gi-tract"
    for folder in sorted(p for p in labelled.glob("*/*") if p.is_dir()):
        images = sorted(p for p in folder.iterdir() if is_image_file(p))[:per_row]
        rows.append((folder.name, images, [None] * len(images)))
    segmented = root / "hyper-kvasir" / "segmented-images"
    images = sorted(p for p in (segmented / "images").glob("*") if is_image_file(p))[:per_row]
    if images:
        rows.append(("segmented (mask)", images, [segmented / "masks" / p.name for p in images]))
    etis = sorted((root / "ETIS-LaribPolypDB" / "ETIS-LaribPolypDB").glob("*.tif"),
                  key=lambda p: (len(p.stem), p.stem))[:per_row]
    if etis:
        rows.append(("ETIS", etis, [None] * len(etis)))
    for images_dir in sorted((root / "PolypGen").glob("data_C*/images_C*")):
        images = sorted(p for p in images_dir.glob("*") if is_image_file(p))[:per_row]
        rows.append((f"PolypGen {images_dir.parent.name[5:]}", images, [None] * len(images)))
    for modality_dir in sorted((root / "PolypDB" / "PolypDB_center_wise").glob("*/*")):
        images = sorted(p for p in (modality_dir / "images").glob("*") if is_image_file(p))[:per_row]
        rows.append((f"PolypDB {modality_dir.parent.name}/{modality_dir.name}", images,
                     [None] * len(images)))
    return rows


def contact_sheet(root: str | Path, out_png: str | Path, *, per_row: int = 6,
                  thumb: int = 128, font_px: int = 16) -> Path:
    """Save a PNG grid of the first ``per_row`` frames of every category/cohort under ``root``.

    One labelled row per HyperKvasir lower-GI category, one for the segmented set (mask
    outlined in cyan) and one per external centre/modality. Thumbnails fit in ``thumb`` pixels
    (128: a polyp is recognisable), labels are DejaVu Sans at ``font_px`` pixels in a column
    as wide as the longest label. Works on real trees too. Written to a temporary file and
    renamed. Returns ``out_png``.
    """
    from matplotlib import font_manager
    from PIL import ImageFont

    root, out_png = Path(root), Path(out_png)
    rows = _contact_rows(root, per_row)
    if not rows:
        raise FileNotFoundError(f"{root}: no HyperKvasir or external cohort images found")
    font = ImageFont.truetype(font_manager.findfont("DejaVu Sans"), font_px)
    gap = 4
    label_width = int(max(font.getlength(label) for label, _, _ in rows)) + 3 * gap
    sheet = Image.new("RGB", (label_width + per_row * (thumb + gap), len(rows) * (thumb + gap)),
                      (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    for row, (label, images, masks) in enumerate(rows):
        top = row * (thumb + gap)
        draw.text((gap, top + thumb // 2), label, fill=(0, 0, 0), font=font, anchor="lm")
        for column, (image_path, mask_path) in enumerate(zip(images, masks)):
            image = read_rgb(image_path)
            if mask_path is not None:
                mask = read_mask(mask_path)
                inner = mask.copy()
                for shift in (-2, -1, 1, 2):  # a 2-pixel outline survives the thumbnail
                    inner &= np.roll(mask, shift, 0) & np.roll(mask, shift, 1)
                edge = mask & ~inner
                image = image.copy()
                image[edge] = (0, 255, 255)
            tile = Image.fromarray(image)
            tile.thumbnail((thumb, thumb))
            sheet.paste(tile, (label_width + column * (thumb + gap), top))
    return files.replace_atomically(out_png, lambda temporary: sheet.save(temporary, format="PNG"))
