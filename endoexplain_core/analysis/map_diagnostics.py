"""Map-prior diagnostics and practical identity of CAM methods (tables over a checkpoint).

Per audited checkpoint: each method's prior map on held-out negatives and where its peaks sit
on the feature grid, which method pairs are identical in practice (``IDENTITY_RULE``), and
which methods' maps are degenerate there (``degenerate_maps``, ``DEGENERACY_RULE``): their
rates are not read as localisation, whatever the gate says.
Method: docs/statistics_and_gate.md, "Map diagnostics: position prior, use of the lesion,
practical identity" and "Degenerate maps".
"""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from endoexplain_core.kernels import cams, map_priors, metrics
from endoexplain_core.marks import DEGENERATE_MARK
from endoexplain_core.methods import CAM_METHODS, method_label
from endoexplain_core.data.datasets import resize_rgb, to_normalised_tensor
from endoexplain_core.data.imageio import read_rgb

# Identity in practice (docs/statistics_and_gate.md, "Map diagnostics", 3). Table 4 reads a
# method's peak outcome (inside or outside the lesion) per image, so two methods are one piece
# of evidence when their maps look alike AND give the same peak outcome almost everywhere:
# Pearson 0.98 leaves 4% of the pixel variance unexplained (two maps of the same evidence on a
# coarse grid, upsampled); 95% same outcome bounds the difference of their peak-failure rates by
# 0.05, less than the half-width of a Wilson 95% interval at a rate of 0.5 on under 384 images.
IDENTITY_PEARSON = 0.98
IDENTITY_OUTCOME_SHARE = 0.95
IDENTITY_RULE = (f"identical in practice: median per-image Pearson >= {IDENTITY_PEARSON} between the "
                 f"two methods' maps and the same peak outcome (inside or outside the lesion, a "
                 f"constant map outside, as in Table 4) on >= {IDENTITY_OUTCOME_SHARE:.0%} of the audited "
                 "images; groups are the connected components of these pairs and of the pairs "
                 "identical by construction")
IDENTITY_GROUP_COLUMN = "identical_maps"


def feature_grid(model: torch.nn.Module, layer: torch.nn.Module, image_size: int,
                 device: torch.device | str = "cpu") -> tuple[int, int]:
    """(h, w) of the target layer's output for an S x S input (one no-grad forward of zeros)."""
    shapes = []
    handle = layer.register_forward_hook(lambda module, inputs, output: shapes.append(output.shape))
    try:
        model.eval()
        with torch.no_grad():
            model(torch.zeros(1, 3, image_size, image_size, device=device))
    finally:
        handle.remove()
    if len(shapes) != 1 or len(shapes[0]) != 4:
        raise ValueError(f"target layer produced {shapes}; expected one (B, C, h, w) output")
    return int(shapes[0][2]), int(shapes[0][3])


def held_out_negatives(manifest: pd.DataFrame, max_images: int) -> pd.DataFrame:
    """Up to ``max_images`` test-split negatives (target 0), sorted by sample_id: never used for
    training, calibration or selection, and without a lesion."""
    rows = manifest[(manifest["role"] == "test") & (manifest["target"] == 0)]
    return rows.sort_values("sample_id").head(max_images).reset_index(drop=True)


def negative_images(rows: pd.DataFrame, data_root: str | Path, image_size: int) -> torch.Tensor:
    """Normalised float32 (N, 3, S, S) images of manifest ``rows`` (read from ``data_root``)."""
    data_root = Path(data_root)
    return torch.stack([to_normalised_tensor(resize_rgb(read_rgb(data_root / path, image_size), image_size))
                        for path in rows["path"]])


def prior_maps(model: torch.nn.Module, layer: torch.nn.Module, images: torch.Tensor,
               sample_ids, *, grid: tuple[int, int], top_fraction: float,
               batch_size: int) -> tuple[dict[str, torch.Tensor], pd.DataFrame]:
    """Prior map per CAM method over negatives, and where each negative's map peaks.

    ``images``: normalised (N, 3, S, S) negatives on the model's device. Returns (method ->
    float32 (S, S) mean normalised map on the CPU; one row per negative and method: sample_id,
    method, constant_map, peak_row, peak_col, peak_border_ring, peak_corner_cell, prior_top_iou).
    Constant maps add nothing to the mean; they are flagged and left out of every share.
    """
    sample_ids = list(sample_ids)
    size = images.shape[-1]
    collected = {method: [] for method in CAM_METHODS}
    for start in range(0, len(images), batch_size):
        maps = cams.compute_cams(model, layer, images[start:start + batch_size], target_class=1,
                                 methods=CAM_METHODS)
        for method in CAM_METHODS:
            collected[method].append(maps[method].cpu())
    rows = []
    priors = {}
    for method in CAM_METHODS:
        maps = torch.cat(collected[method])
        prior = maps.mean(dim=0)
        priors[method] = prior
        peak_row, peak_col = metrics.peak_location(maps)
        constant = maps.flatten(1).amax(dim=1) <= 0
        rows.append(pd.DataFrame({
            "sample_id": sample_ids, "method": method, "constant_map": constant.numpy(),
            "peak_row": peak_row.numpy(), "peak_col": peak_col.numpy(),
            "peak_border_ring": map_priors.border_ring(peak_row, peak_col, size, grid).numpy(),
            "peak_corner_cell": map_priors.corner_cell(peak_row, peak_col, size, grid).numpy(),
            "prior_top_iou": map_priors.top_set_iou(maps, prior, top_fraction).numpy()}))
    return priors, pd.concat(rows, ignore_index=True)


def _share(values: pd.Series, defined: pd.Series) -> float:
    values = values[defined]
    return float(values.mean()) if len(values) else np.nan


def prior_table(cases: pd.DataFrame, negatives: pd.DataFrame, grid: tuple[int, int]) -> pd.DataFrame:
    """Supplementary map-prior table of one checkpoint: one row per CAM method.

    ``cases``: the checkpoint's audit rows (with the diagnostic columns); ``negatives``:
    ``prior_maps`` rows. Columns: method, label, grid, border_ring_chance, n_positive,
    n_constant_positive, border_ring_positive, corner_positive, n_negative, n_constant_negative,
    border_ring_negative, corner_negative, prior_top_iou_positive_median,
    prior_top_iou_negative_median, lesion_logit_drop_mean, cam_top_logit_drop_mean. Shares are
    over maps with a defined peak (non-constant maps).
    """
    rows = []
    for method in CAM_METHODS:
        positive = cases[cases["method"] == method]
        negative = negatives[negatives["method"] == method]
        defined_positive, defined_negative = ~positive["constant_map"], ~negative["constant_map"]
        rows.append({
            "method": method, "label": method_label(method), "grid": f"{grid[0]}x{grid[1]}",
            "border_ring_chance": map_priors.border_ring_share(grid),
            "n_positive": len(positive), "n_constant_positive": int((~defined_positive).sum()),
            "border_ring_positive": _share(positive["peak_border_ring"], defined_positive),
            "corner_positive": _share(positive["peak_corner_cell"], defined_positive),
            "n_negative": len(negative), "n_constant_negative": int((~defined_negative).sum()),
            "border_ring_negative": _share(negative["peak_border_ring"], defined_negative),
            "corner_negative": _share(negative["peak_corner_cell"], defined_negative),
            "prior_top_iou_positive_median": float(positive.loc[defined_positive, "prior_top_iou"].median()),
            "prior_top_iou_negative_median": float(negative.loc[defined_negative, "prior_top_iou"].median()),
            "lesion_logit_drop_mean": float(positive["lesion_logit_drop"].mean()),
            "cam_top_logit_drop_mean": float(positive.loc[defined_positive, "logit_drop"].mean()),
        })
    return pd.DataFrame(rows)


def map_agreement(maps: dict[str, torch.Tensor], sample_ids, top_fraction: float,
                  methods=CAM_METHODS) -> pd.DataFrame:
    """Per image and method pair: Pearson correlation, top-set IoU and same peak pixel.

    ``maps``: method -> float (B, S, S) maps of the same images. Rows: sample_id, first,
    second, pearson, top_iou and same_peak (1/0); all NaN when either map is constant (tie
    order alone would make two constant maps "agree").
    """
    sample_ids = list(sample_ids)
    peaks = {m: metrics.peak_location(maps[m]) for m in methods}
    constant = {m: (maps[m].flatten(1).amax(dim=1) <= 0).cpu().numpy() for m in methods}
    frames = []
    for first, second in combinations(methods, 2):
        same_peak = (peaks[first][0] == peaks[second][0]) & (peaks[first][1] == peaks[second][1])
        undefined = constant[first] | constant[second]  # no peak / top set: no agreement either
        top_iou = map_priors.top_set_iou(maps[first], maps[second], top_fraction).cpu().numpy()
        frames.append(pd.DataFrame({
            "sample_id": sample_ids, "first": first, "second": second,
            "pearson": map_priors.pearson_per_map(maps[first], maps[second]).cpu().numpy(),
            "top_iou": np.where(undefined, np.nan, top_iou),
            "same_peak": np.where(undefined, np.nan, same_peak.cpu().numpy().astype(float))}))
    return pd.concat(frames, ignore_index=True)


def peak_outcomes(cases: pd.DataFrame, methods=CAM_METHODS) -> pd.DataFrame:
    """Per image and method of one checkpoint's audit table: sample_id, method, peak_outside
    (the peak outside the lesion, a constant map counted as outside: Table 4's failure)."""
    rows = cases[cases["method"].isin(list(methods))]
    outside = rows["peak_outside_mask"].astype(bool) | rows["constant_map"].astype(bool)
    return pd.DataFrame({"sample_id": rows["sample_id"].to_numpy(), "method": rows["method"].to_numpy(),
                         "peak_outside": outside.to_numpy()})


def _same_outcome(agreement: pd.DataFrame, outcomes: pd.DataFrame | None) -> pd.Series:
    """1/0 per ``map_agreement`` row: the two methods' peak outcomes agree on that image. From
    ``outcomes`` (``peak_outcomes``) when given (NaN where either is missing); without them a
    shared peak pixel counts as the same outcome and a parted peak as a different one (NaN for
    a constant map), which never understates disagreement."""
    if outcomes is None:
        return agreement["same_peak"].astype(float)
    by_image = outcomes.set_index(["sample_id", "method"])["peak_outside"]
    first = by_image.reindex(list(zip(agreement["sample_id"], agreement["first"]))).to_numpy(dtype=float)
    second = by_image.reindex(list(zip(agreement["sample_id"], agreement["second"]))).to_numpy(dtype=float)
    same = np.where(np.isnan(first) | np.isnan(second), np.nan, (first == second).astype(float))
    return pd.Series(same, index=agreement.index)


def practical_identity(agreement: pd.DataFrame, identical_groups=(), outcomes: pd.DataFrame | None = None,
                       pearson: float = IDENTITY_PEARSON, outcome_share: float = IDENTITY_OUTCOME_SHARE
                       ) -> pd.DataFrame:
    """Per method pair (``IDENTITY_RULE``), columns: first, second, pair, n, median_pearson,
    median_top_iou, n_constant_pairs (left out of the medians), same_peak_share,
    peak_disagreements, n_outcome, same_outcome_share, outcome_disagreements,
    identical_by_construction, identical_in_practice (median Pearson >= ``pearson`` and the
    same peak outcome on >= ``outcome_share`` of the images), identical_maps (the label of the
    ``identity_groups`` group holding both, "" when they are in different groups) and
    independent_evidence (False for every pair inside one group, chained pairs included).

    ``outcomes``: ``peak_outcomes`` of the same images (None: outcome agreement read from the
    shared peak pixel, see ``_same_outcome``)."""
    agreement = agreement.assign(same_outcome=_same_outcome(agreement, outcomes))
    rows = []
    for (first, second), group in agreement.groupby(["first", "second"], sort=False):
        median_pearson = float(group["pearson"].median())   # NaN (constant maps) skipped
        same_outcome = group["same_outcome"].dropna()
        share = float(same_outcome.mean()) if len(same_outcome) else np.nan
        rows.append({"first": first, "second": second,
                     "pair": f"{method_label(first)} vs {method_label(second)}", "n": len(group),
                     "median_pearson": median_pearson, "median_top_iou": float(group["top_iou"].median()),
                     "n_constant_pairs": int(group["top_iou"].isna().sum()),
                     "same_peak_share": float(group["same_peak"].mean()),
                     "peak_disagreements": int((group["same_peak"] == 0).sum()),   # NaN not counted
                     "n_outcome": len(same_outcome), "same_outcome_share": share,
                     "outcome_disagreements": int((same_outcome == 0).sum()),
                     "identical_by_construction": any(first in g and second in g for g in identical_groups),
                     "identical_in_practice": bool(median_pearson >= pearson and share >= outcome_share)})
    identity = pd.DataFrame(rows)
    group_of = {m: group_label(g) for g in identity_groups(identity) for m in g}
    identity[IDENTITY_GROUP_COLUMN] = [group_of.get(a, "") if group_of.get(a) == group_of.get(b) else ""
                                       for a, b in zip(identity["first"], identity["second"])]
    identity["independent_evidence"] = identity[IDENTITY_GROUP_COLUMN] == ""
    return identity


def identity_groups(identity: pd.DataFrame, methods=CAM_METHODS) -> list[tuple[str, ...]]:
    """Groups of two or more methods whose maps are one piece of evidence on the checkpoint:
    the connected components of the pairs ``identical_in_practice`` or
    ``identical_by_construction`` in a ``practical_identity`` table (components, not cliques,
    so the groups never overlap; a chained pair is in the group and its numbers are printed
    by ``identity_statement``). Each group and the groups are in ``methods`` order."""
    parent = {m: m for m in methods}

    def root(method: str) -> str:
        while parent[method] != method:
            method = parent[method]
        return method
    joined = identity[identity["identical_in_practice"].astype(bool)
                      | identity["identical_by_construction"].astype(bool)]
    for first, second in zip(joined["first"], joined["second"]):
        if first in parent and second in parent:
            parent[root(second)] = root(first)
    components: dict[str, list[str]] = {}
    for method in methods:
        components.setdefault(root(method), []).append(method)
    return [tuple(group) for group in components.values() if len(group) > 1]


def group_label(group) -> str:
    """"Grad-CAM = Grad-CAM++ = Eigen-CAM*": the display labels of one identity group."""
    return " = ".join(method_label(m) for m in group)


def mark_identity_groups(table: pd.DataFrame, groups, *, method_column: str = "method") -> pd.DataFrame:
    """Copy of ``table`` with ``IDENTITY_GROUP_COLUMN``: the ``group_label`` of the method's
    identity group ("" for a method in no group and for baselines), so a table shows methods
    whose maps are one piece of evidence as one group."""
    label_of = {m: group_label(g) for g in groups for m in g}
    return table.assign(**{IDENTITY_GROUP_COLUMN: table[method_column].astype(str).map(label_of).fillna("")})


def with_identity_flags(identity: pd.DataFrame) -> pd.DataFrame:
    """An identity table read back from CSV, its two identity flags booleans again."""
    return identity.assign(**{c: identity[c].astype(str).str.lower() == "true"
                              for c in ("identical_in_practice", "identical_by_construction")})


def read_identity_table(figures_dir: str | Path) -> pd.DataFrame | None:
    """A run's ``table4_map_identity.csv`` (written by 04) with its flags as booleans; None
    when the run has none."""
    path = Path(figures_dir) / "table4_map_identity.csv"
    return with_identity_flags(pd.read_csv(path)) if path.is_file() else None


def identity_footer(identity: pd.DataFrame | None) -> str:
    """A figure's footer line naming the primary's identity groups, so a figure that draws
    their maps side by side says they are one piece of evidence ("" without a group)."""
    groups = identity_groups(identity) if identity is not None else []
    if not groups:
        return ""
    named = "; ".join(group_label(g) for g in groups)
    return (f"Practically identical maps on the primary (table4_map_identity): {named}; "
            "each group is one piece of evidence, not several.")


def _weakest_pair(identity: pd.DataFrame, group) -> pd.Series:
    """The pair of ``group`` with the lowest same-outcome share (then Pearson)."""
    inside = identity[identity["first"].isin(group) & identity["second"].isin(group)]
    return inside.sort_values(["same_outcome_share", "median_pearson"], na_position="first").iloc[0]


def identity_statement(identity: pd.DataFrame) -> str:
    """One sentence per ``identity_groups`` group (or that there is none) with its weakest
    pair's numbers and why it counts as one piece of evidence."""
    groups = identity_groups(identity)
    if not groups:
        return f"No two CAM methods are identical on this checkpoint ({IDENTITY_RULE})."
    parts = []
    for group in groups:
        weakest = _weakest_pair(identity, group)
        how = ("identical by construction" if weakest["identical_by_construction"] else
               f"weakest pair {weakest['pair']}: median Pearson {weakest['median_pearson']:.3f}, same peak "
               f"outcome on {int(weakest['n_outcome'] - weakest['outcome_disagreements'])} of "
               f"{int(weakest['n_outcome'])} images")
        parts.append(f"{group_label(group)} on this checkpoint ({how}): one piece of evidence, "
                     f"not {len(group)}, never independent evidence")
    return "; ".join(parts) + f". Rule: {IDENTITY_RULE}."


def checkpoint_map_diagnostics(model: torch.nn.Module, layer: torch.nn.Module, images: torch.Tensor,
                               sample_ids, *, top_fraction: float, batch_size: int,
                               identical_groups=(), cases: pd.DataFrame | None = None
                               ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Practical identity and the Grad-CAM++ epsilon share of one checkpoint on ``images``.

    ``images``: normalised (N, 3, S, S) on the model's device. ``cases``: the checkpoint's
    audit table, whose peak outcomes (``peak_outcomes``) the identity rule reads (None: the
    shared peak pixel stands in). Returns (``practical_identity`` table, per-image DataFrame
    sample_id, gradcampp_epsilon_share).
    """
    sample_ids = list(sample_ids)
    collected = {m: [] for m in CAM_METHODS}
    shares = []
    for start in range(0, len(images), batch_size):
        batch = images[start:start + batch_size]
        maps = cams.compute_cams(model, layer, batch, target_class=1, methods=CAM_METHODS)
        for method in CAM_METHODS:
            collected[method].append(maps[method].cpu())
        activation, gradient = cams.activation_and_gradient(model, layer, batch, target_class=1)
        shares.append(map_priors.gradcampp_epsilon_share(activation, gradient).cpu())
    maps = {m: torch.cat(v) for m, v in collected.items()}
    outcomes = peak_outcomes(cases) if cases is not None else None
    identity = practical_identity(map_agreement(maps, sample_ids, top_fraction), identical_groups, outcomes)
    epsilon = pd.DataFrame({"sample_id": sample_ids,
                            "gradcampp_epsilon_share": torch.cat(shares).numpy()})
    return identity, epsilon


def describe_epsilon(epsilon: pd.DataFrame) -> str:
    """Grad-CAM++'s epsilon share over the maps of ``checkpoint_map_diagnostics``."""
    share = epsilon["gradcampp_epsilon_share"]
    return (f"Grad-CAM++ epsilon share (per map, share of denominators where the 1e-6 epsilon dominates): "
            f"median {share.median():.3f}, max {share.max():.3f} over {len(epsilon)} maps. "
            "Pairs flagged independent_evidence = False below (one identity group) are not independent evidence.")


def audited_grid(table: pd.DataFrame) -> tuple[int, int]:
    """(height, width) of the feature grid an audit table's maps were computed on."""
    return int(table["feature_grid_height"].iloc[0]), int(table["feature_grid_width"].iloc[0])


def describe_priors(priors: pd.DataFrame, negatives: pd.DataFrame, grid: tuple[int, int], *,
                    top_fraction: float) -> str:
    """The prior-map table (``prior_table``, with the gate's ``label`` column or without) in
    words: grid, border-ring chance, the negatives behind the priors and the lesion- and
    CAM-deletion logit drops."""
    labels = priors["label"] if "label" in priors else priors["method"].map(method_label)
    return (f"Feature grid {grid[0]}x{grid[1]} (border-ring chance {priors['border_ring_chance'].iloc[0]:.2f}); "
            f"prior maps from {negatives['sample_id'].nunique()} held-out negatives. Deleting the lesion "
            f"drops the logit by {priors['lesion_logit_drop_mean'].iloc[0]:.3f} on average; deleting each CAM's "
            f"top {top_fraction:.0%}: "
            + ", ".join(f"{label} {drop:.3f}" for label, drop in zip(labels, priors["cam_top_logit_drop_mean"]))
            + ".")


def flag_pairs(paired: pd.DataFrame, identity: pd.DataFrame) -> pd.DataFrame:
    """Paired-test rows (``summaries.paired_tests``) with ``identical_in_practice``,
    ``identical_maps`` and ``independent_evidence`` from ``practical_identity`` (matched on
    first, second): a pair inside one identity group, or identical by construction, is never
    independent evidence."""
    flags = identity[["first", "second", "identical_in_practice", IDENTITY_GROUP_COLUMN, "independent_evidence"]]
    merged = paired.merge(flags.rename(columns={"independent_evidence": "_independent"}),
                          on=["first", "second"], how="left")
    merged["identical_in_practice"] = merged["identical_in_practice"].fillna(False).astype(bool)
    merged[IDENTITY_GROUP_COLUMN] = merged[IDENTITY_GROUP_COLUMN].fillna("")
    merged["independent_evidence"] = (merged.pop("_independent").fillna(True).astype(bool)
                                      & ~merged["identical_by_construction"].astype(bool))
    return merged


# --- degenerate maps --------------------------------------------------------------------------
# A method's maps on one checkpoint are degenerate when any of three measurements says the map
# shows something other than the image's class evidence (docs/statistics_and_gate.md,
# "Degenerate maps"). Shares are over the maps with a peak (a constant map has none).
#
# Position: fewer interior peaks than a quarter of the interior's share of the grid, i.e. a
# border-ring peak share above 1 - 0.25 (1 - ring share): 0.91 on a 5x5 grid, 0.94 on 4x4,
# 0.86 on 8x8. A uniformly placed peak lands in the interior with the interior's share, and the
# audited lesions lie mostly there, so a map that follows them peaks inside more often, not four
# times less; a grid without interior cells (h or w <= 2) is never flagged by this rule.
DEGENERATE_INTERIOR_FRACTION = 0.25
# Ties: more than half the maps with their maximum shared by several pixels. A bilinearly
# upsampled CAM has its maximum at one grid node, one pixel, unless the peak lies in the
# half-cell band along the frame edge, where the upsampling clamps to a plateau, or the map
# saturates: then the row-major tie-break, not the map, picks the peak pixel.
DEGENERATE_TIED_SHARE = 0.5
# Sign: the median per-image Pearson correlation with Grad-CAM (the channel-averaged gradient
# of the class logit times the activations: the plainest map of the class evidence at the
# layer) below -0.5. Maps sharing no structure correlate near 0; at -0.5 the map is bright
# where the evidence is dark on most images, a quarter of its variance the inverted evidence.
DEGENERATE_PEARSON = -0.5
DEGENERACY_REFERENCE = "gradcam"
DEGENERACY_RULE = (f"degenerate maps: border-ring peaks above 1 - {DEGENERATE_INTERIOR_FRACTION} x the "
                   f"interior's area share, tied maxima on more than {DEGENERATE_TIED_SHARE:.0%} of the "
                   f"maps, or a median per-image Pearson correlation with Grad-CAM below "
                   f"{DEGENERATE_PEARSON} (any one)")
DEGENERACY_COLUMNS = ["checkpoint_id", "method", "label", "grid", "n_maps", "n_with_peak",
                      "border_ring_share", "border_ring_chance", "border_ring_limit",
                      "tied_maxima", "tied_share", "tied_limit", "pearson_with_gradcam",
                      "pearson_limit", "degenerate", "why"]


def border_ring_limit(grid: tuple[int, int]) -> float:
    """The border-ring peak share above which a method's maps are degenerate on an h x w grid:
    1 - ``DEGENERATE_INTERIOR_FRACTION`` x the interior's share of the cells (1.0, never
    exceeded, for a grid without interior)."""
    return 1.0 - DEGENERATE_INTERIOR_FRACTION * (1.0 - map_priors.border_ring_share(grid))


def _pearson_with_reference(identity: pd.DataFrame | None, method: str) -> float:
    """Median per-image Pearson of ``method`` with ``DEGENERACY_REFERENCE`` from a
    ``practical_identity`` table (either order of the pair); NaN without one."""
    if identity is None or method == DEGENERACY_REFERENCE:
        return np.nan
    pair = identity[((identity["first"] == method) & (identity["second"] == DEGENERACY_REFERENCE))
                    | ((identity["first"] == DEGENERACY_REFERENCE) & (identity["second"] == method))]
    return float(pair["median_pearson"].iloc[0]) if len(pair) else np.nan


def degenerate_maps(cases: pd.DataFrame, identity: pd.DataFrame | None = None,
                    methods=CAM_METHODS) -> pd.DataFrame:
    """One row per checkpoint x method: are the audited maps proper maps (``DEGENERACY_RULE``)?

    ``cases``: audit rows of one or more checkpoints (``constant_map``, ``max_multiplicity``
    and the diagnostic columns ``peak_border_ring``, ``feature_grid_height`` / ``_width``;
    without them the position rule is not read). ``identity``: ``practical_identity`` rows of
    the same checkpoints (with a ``checkpoint_id`` column when ``cases`` holds several), the
    source of each method's median per-image Pearson correlation with Grad-CAM; None leaves
    the sign rule unread (NaN). Grad-CAM is the reference of the sign rule, so only the
    position and tie rules apply to it. Columns ``DEGENERACY_COLUMNS``: the three
    measurements beside their limits (shares over the ``n_with_peak`` maps with a peak),
    ``degenerate`` (any rule fires) and ``why`` (each rule that fired, in words; "" if none).
    """
    checkpoints = list(dict.fromkeys(cases["checkpoint_id"]))
    if identity is not None and "checkpoint_id" not in identity.columns and len(checkpoints) > 1:
        raise ValueError("identity rows need a checkpoint_id column when cases hold several checkpoints")
    rows = []
    for checkpoint_id in checkpoints:
        of_checkpoint = cases[cases["checkpoint_id"] == checkpoint_id]
        pairs = (identity[identity["checkpoint_id"] == checkpoint_id]
                 if identity is not None and "checkpoint_id" in identity.columns else identity)
        for method in methods:
            of_method = of_checkpoint[of_checkpoint["method"] == method]
            if of_method.empty:
                continue
            rows.append(_degeneracy_row(checkpoint_id, method, of_method,
                                        _pearson_with_reference(pairs, method)))
    return pd.DataFrame(rows, columns=DEGENERACY_COLUMNS)


def _degeneracy_row(checkpoint_id: str, method: str, of_method: pd.DataFrame, pearson: float) -> dict:
    """``degenerate_maps``'s row of one method on one checkpoint."""
    with_peak = of_method[~of_method["constant_map"].astype(bool)]
    n_peak = len(with_peak)
    if "feature_grid_height" in of_method.columns and "peak_border_ring" in of_method.columns:
        grid = (int(of_method["feature_grid_height"].iloc[0]), int(of_method["feature_grid_width"].iloc[0]))
        chance, limit = map_priors.border_ring_share(grid), border_ring_limit(grid)
        border = float(with_peak["peak_border_ring"].astype(bool).mean()) if n_peak else np.nan
        grid_text = f"{grid[0]}x{grid[1]}"
    else:
        chance = limit = border = np.nan
        grid_text = ""
    tied = int((with_peak["max_multiplicity"] > 1).sum())
    tied_share = tied / n_peak if n_peak else np.nan
    why = []
    if border > limit:
        why.append(f"{border:.0%} of peaks on the border ring (limit {limit:.0%}: interior peaks below "
                   f"{DEGENERATE_INTERIOR_FRACTION:g} of the interior's {1 - chance:.0%} area share)")
    if tied_share > DEGENERATE_TIED_SHARE:
        why.append(f"{tied} of {n_peak} maps with tied maxima (limit: more than {DEGENERATE_TIED_SHARE:.0%})")
    if pearson < DEGENERATE_PEARSON:
        why.append(f"median per-image Pearson with Grad-CAM {pearson:.2f} (limit {DEGENERATE_PEARSON:g}): "
                   "anti-correlated with the class evidence")
    return {"checkpoint_id": checkpoint_id, "method": method, "label": method_label(method),
            "grid": grid_text, "n_maps": len(of_method), "n_with_peak": n_peak,
            "border_ring_share": border, "border_ring_chance": chance, "border_ring_limit": limit,
            "tied_maxima": tied, "tied_share": tied_share, "tied_limit": DEGENERATE_TIED_SHARE,
            "pearson_with_gradcam": pearson, "pearson_limit": DEGENERATE_PEARSON,
            "degenerate": bool(why), "why": "; ".join(why)}


def degenerate_methods(degeneracy: pd.DataFrame, checkpoint_id: str | None = None) -> list[str]:
    """Methods ``degenerate_maps`` flags (on ``checkpoint_id``; None: the table's only one)."""
    if checkpoint_id is None:
        ids = degeneracy["checkpoint_id"].unique()
        if len(ids) > 1:
            raise ValueError(f"degeneracy rows of several checkpoints {list(ids)}: name one")
    else:
        degeneracy = degeneracy[degeneracy["checkpoint_id"] == checkpoint_id]
    return [str(m) for m in degeneracy.loc[degeneracy["degenerate"].astype(bool), "method"]]


def mark_degenerate(table: pd.DataFrame, degeneracy: pd.DataFrame | None, *,
                    method_column: str = "method", label_column: str | None = "label") -> pd.DataFrame:
    """Copy of one checkpoint's ``table`` with a ``maps`` column and ``DEGENERATE_MARK`` on the
    labels of degenerate methods (``degenerate_methods``).

    ``maps`` per row: "degenerate" / "proper" for a checked CAM method, "not checked" for a
    CAM without a degeneracy row, "reference" for other rows (baselines, random deletion);
    ``degeneracy`` None returns ``table`` unchanged. The footnote printed beside a marked table
    is ``marks.DEGENERATE_FOOTNOTE`` (``marks.notes_for``)."""
    if degeneracy is None:
        return table
    table = table.copy()
    flagged = set(degenerate_methods(degeneracy))
    checked = set(degeneracy["method"])
    methods = table[method_column].astype(str)
    table["maps"] = ["degenerate" if m in flagged else "proper" if m in checked else
                     "not checked" if m in CAM_METHODS else "reference" for m in methods]
    if label_column and label_column in table.columns:
        table[label_column] = [f"{label}{DEGENERATE_MARK}" if m in flagged else label
                               for label, m in zip(table[label_column], methods)]
    return table


def describe_degeneracy(degeneracy: pd.DataFrame) -> str:
    """The degeneracy table in words: which methods are degenerate on which checkpoint and why."""
    flagged = degeneracy[degeneracy["degenerate"].astype(bool)]
    rule = f"Rule ({DEGENERACY_RULE})."
    if flagged.empty:
        return f"No CAM method's maps are degenerate on {', '.join(degeneracy['checkpoint_id'].unique())}. {rule}"
    return (" ".join(f"{method_label(row.method)} on {row.checkpoint_id} is degenerate: {row.why}."
                     for row in flagged.itertuples())
            + f" Its rates are not read as localisation, whatever the gate's verdict. {rule}")
