"""Profiles: YAML files in ``configs/`` that hold every parameter of a run, checked by a schema.

A profile has a ``shared`` section, a ``stages`` section keyed by notebook name (``00_roles``,
...) and an optional ``description``; ``load_profile`` validates every section before any work
and raises ``ProfileError`` naming the file and the key (with the closest valid key for a
typo). Defaults live only here. A notebook receives the shared keys its stage declares
(``uses_shared``), its own section (stage keys win) and the run paths (``stage_parameters``).
Design: docs/data_models_runs.md, "Profiles and the schema".
"""

from __future__ import annotations

import copy
import difflib
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, ValidationError,
                      field_validator, model_validator)

from endoexplain_core.files import FileTooLarge, read_bounded, short_text
from endoexplain_core.run_layout import RunLayout

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "configs"
PROFILES = ("smoke", "default", "paper")
# Classifiers the training matrix can build (models.networks builds exactly these): the paper's
# three, then two that train from scratch on two CPU cores (the default profile's matrix).
PAPER_ARCHITECTURES = ("efficientnet_b0", "resnet34", "convnext_tiny")
ARCHITECTURES = PAPER_ARCHITECTURES + ("resnet18", "mobilenet_v3_large")
EXTERNAL_COHORTS = ("etis", "polypgen", "polypdb", "kvasir_seg", "cvc_clinicdb")
# HyperKvasir's 16 lower-GI categories (of its 23 classes) -> group folder (docs/protocol.md,
# "Dataset layouts"); data.hyperkvasir reads by it and category_counts is checked against it.
LOWER_GI_CATEGORIES: dict[str, str] = {
    "cecum": "anatomical-landmarks",
    "ileum": "anatomical-landmarks",
    "retroflex-rectum": "anatomical-landmarks",
    "hemorrhoids": "pathological-findings",
    "polyps": "pathological-findings",
    "ulcerative-colitis-grade-0-1": "pathological-findings",
    "ulcerative-colitis-grade-1": "pathological-findings",
    "ulcerative-colitis-grade-1-2": "pathological-findings",
    "ulcerative-colitis-grade-2": "pathological-findings",
    "ulcerative-colitis-grade-2-3": "pathological-findings",
    "ulcerative-colitis-grade-3": "pathological-findings",
    "bbps-0-1": "quality-of-mucosal-views",
    "bbps-2-3": "quality-of-mucosal-views",
    "impacted-stool": "quality-of-mucosal-views",
    "dyed-lifted-polyps": "therapeutic-interventions",
    "dyed-resection-margins": "therapeutic-interventions",
}

# Keys that choose where work runs, not what it computes: left out of stage digests.
EXECUTION_KEYS = ("scheduler", "allow_insecure_scheduler")
# Scheduler settings by shape (pipeline.tasks.parse_scheduler decides, with
# allow_insecure_scheduler, whether a tcp:// address may be used; this layer cannot import it).
SCHEDULER_ADDRESS = re.compile(r"^(tcp|tls)://[^\s:/]+:\d+$")

# Upper bounds a machine can honour, so that a typo (image_size=100000000) is refused before any
# work instead of failing hours later on memory. Generous: about 10x the paper profile's values.
MAX_SEED = 2**32 - 1            # numpy's and torch's seed range
MAX_IMAGE_SIZE = 2048           # pixels per side (paper: 256)
MAX_REPLICATES = 100_000        # bootstrap replicates (paper: 5,000)
MAX_REPETITIONS = 1_000         # random deletions per image and the like (paper: 20)
MAX_BATCH = 4_096               # images per batch
MAX_IMAGES = 1_000_000          # synthetic files per key, gate frames, steps
MAX_EPOCHS = 1_000
MAX_LIST_ITEMS = 100            # items of any profile list: seeds, thresholds, fractions, cohorts (paper: at most 5)


def _distinct_items(values: list) -> list:
    """``values`` unchanged; ValueError naming the repeats (a repeated seed or architecture
    would train one checkpoint twice under one name). Linear in ``len(values)`` (counted once,
    not ``values.count`` per item: 100,000 seeds took 101 s)."""
    repeated = sorted(str(v) for v, n in Counter(values).items() if n > 1)
    if repeated:
        raise ValueError(f"items must be distinct; repeated: {', '.join(repeated)}")
    return values


class ProfileError(ValueError):
    """A profile file is missing, malformed, or has an unknown key or an invalid value."""


def _sequence_as_tuple(value: Any) -> Any:
    """YAML has lists, not tuples: a list becomes a tuple (its items are still checked strictly)."""
    return tuple(value) if isinstance(value, list) else value


# A fixed-length YAML list of numbers (strict mode accepts only tuples for tuple fields).
FloatPair = Annotated[tuple[float, float], BeforeValidator(_sequence_as_tuple)]
FloatTriple = Annotated[tuple[float, float, float], BeforeValidator(_sequence_as_tuple)]


class Section(BaseModel):
    """A profile section: unknown keys are errors, values are checked on assignment too."""

    # strict: no string coercions ('128' is not 128); no .inf or .nan where a number is expected.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=True, strict=True,
                              allow_inf_nan=False)


class LocalisationSettings(Section):
    """The localisation scores' scales, one home for 07 and 08 (``shared.localisation``):
    the pointing game's tolerance zone and smoothing, the DoG conspicuity map and the energy
    lift, as fractions of the input size (``pixels``)."""

    dog_sigma_small_fraction: float = Field(0.01, gt=0, lt=1, description="DoG small blur sigma, fraction of the input size")
    dog_sigma_large_fraction: float = Field(0.08, gt=0, lt=1, description="DoG large blur sigma, fraction of the input size")
    pointing_radius_fraction: float = Field(0.03, ge=0, lt=1, description="pointing tolerance radius r (zone D_r), fraction of the input size")
    pointing_smooth_fraction: float = Field(0.01, ge=0, le=0.25, description="pointing smoothing sigma, fraction of the input size")
    energy_alpha: float = Field(0.01, gt=0, lt=1, description="uniform share mixed in before the energy lift")

    @model_validator(mode="after")
    def _dog_scales_ordered(self):
        if not self.dog_sigma_small_fraction < self.dog_sigma_large_fraction:
            raise ValueError("dog_sigma_small_fraction must be below dog_sigma_large_fraction")
        return self

    def pixels(self, image_size: int) -> dict[str, float]:
        """The scales in pixels at ``image_size``: ``dog_sigma_small_px``, ``dog_sigma_large_px``,
        ``radius_px`` (the tolerance zone's radius), ``smooth_sigma_px``."""
        return {"dog_sigma_small_px": self.dog_sigma_small_fraction * image_size,
                "dog_sigma_large_px": self.dog_sigma_large_fraction * image_size,
                "radius_px": self.pointing_radius_fraction * image_size,
                "smooth_sigma_px": self.pointing_smooth_fraction * image_size}


class SharedSettings(Section):
    seed: int = Field(20260721, ge=0, le=MAX_SEED, description="master seed (bootstrap, synthetic cohort)")
    image_size: int = Field(128, ge=32, le=MAX_IMAGE_SIZE, description="model input size in pixels")
    device: Literal["cpu", "cuda", "auto"] = Field("cpu", description="cpu | cuda | auto")
    architectures: list[Literal[ARCHITECTURES]] = Field(  # type: ignore[valid-type]
        list(PAPER_ARCHITECTURES), min_length=1, max_length=MAX_LIST_ITEMS, description="torchvision classifiers of the matrix")
    training_seeds: list[Annotated[int, Field(ge=0, le=MAX_SEED)]] = Field([1129, 2089, 3253], min_length=1, max_length=MAX_LIST_ITEMS,
                                      description="one checkpoint per architecture and seed")
    score_threshold: float = Field(0.90, gt=0.0, lt=1.0,
                                   description="panel A: temperature-scaled score >= this")
    top_fraction: float = Field(0.20, gt=0.0, lt=1.0,
                                description="fraction of pixels kept by the top-area rule")
    scheduler: str = Field("", description='where tasks run: "" in process | local:N | tls://host:port')
    allow_insecure_scheduler: bool = Field(
        False, description="accept a plain tcp:// scheduler (unencrypted, unauthenticated)")
    channels_last: bool = Field(
        False, description="channels_last memory format in the optimiser steps (01 training, 03 gate models)")
    prior_negatives: int = Field(
        48, ge=0, le=MAX_IMAGES, description="held-out test negatives behind each method's prior map (04 and 05)")
    audit_batch_size: int = Field(
        16, ge=1, le=MAX_BATCH, description="images per CAM/deletion batch of the audits (01's validation map check, 04-07) and of the case "
                              "browser's redraws (09): one value, so the browser redraws the audited maps exactly")
    decision_threshold: float = Field(
        0.5, gt=0.0, lt=1.0, description="scaled-score decision boundary t (02's source-category "
                                         "audit; 08's correctness and margin |z - t|/T)")
    localisation: LocalisationSettings = Field(
        default_factory=LocalisationSettings,
        description="pointing, DoG and energy-lift scales of 07 and 08 (fractions of the input size)")

    @field_validator("architectures", "training_seeds")
    @classmethod
    def _distinct(cls, values: list) -> list:
        return _distinct_items(values)

    @field_validator("scheduler")
    @classmethod
    def _known_scheduler(cls, scheduler: str) -> str:
        if scheduler in ("", "sequential") or SCHEDULER_ADDRESS.match(scheduler):
            return scheduler
        workers = scheduler.removeprefix("local:")
        if scheduler.startswith("local:") and workers.isdigit() and int(workers) >= 1:
            return scheduler
        raise ValueError('expected "", "sequential", "local:N" (N >= 1) or "tls://HOST:PORT" '
                         '("tcp://HOST:PORT" with allow_insecure_scheduler)')


class StageSettings(Section):
    """Base of every stage model; ``uses_shared`` names the shared keys the stage reads."""

    uses_shared: ClassVar[tuple[str, ...]] = ()


class RolesSettings(StageSettings):
    uses_shared: ClassVar[tuple[str, ...]] = ("seed",)
    frame_size: int = Field(128, ge=32, le=MAX_IMAGE_SIZE, description="synthetic frames are frame_size x frame_size px")
    synthetic_layout: Literal["embedded", "mirror", "downloaded"] = Field(
        "embedded", description="embedded: small square frames; mirror: the real datasets' "
                                "frame sizes, overlays, formats and stray files; downloaded: "
                                "the mirror as unpacked downloads sit (nested folders, PraNet's "
                                "ETIS layout, known quirks)")
    category_counts: dict[str, int] = Field(default_factory=dict,
                                            description="synthetic labelled images per category")
    n_segmented: int = Field(20, ge=1, le=MAX_IMAGES, description="synthetic polyps with a mask")
    n_development_polyps: int = Field(3, ge=0, le=MAX_IMAGES, description="standard polyps outside the masked set")
    n_audit_near_duplicates: int = Field(2, ge=0, le=MAX_IMAGES, description="re-encoded copies of masked polyps")
    n_development_duplicates: int = Field(1, ge=0, le=MAX_IMAGES, description="byte copies of negative frames")
    n_development_near_duplicates: int = Field(1, ge=0, le=MAX_IMAGES, description="re-encoded negative copies")
    conspicuity: float = Field(0.85, ge=0.0, le=1.0, description="polyp visibility 0..1")
    standard_conspicuity_floor: float = Field(
        0.75, ge=0.0, le=1.0, description="standard (undyed) polyps' per-frame conspicuity factor "
        "is uniform in [this, 1] (dyed-lifted polyps: [0.75, 1]); below 0.75 many standard polyps "
        "are subtle and score low, as in the paper")
    standard_conspicuity_power: float = Field(
        1.0, ge=0.5, le=4.0, description="standard polyps' factor is floor + (1 - floor) x U^power "
        "(U uniform in [0, 1]): 1 spreads them evenly, 2 makes most of them subtle")
    dye_strength: float = Field(0.8, ge=0.0, le=1.0, description="blue dye opacity 0..1")
    lesion_area: FloatPair = Field((0.13, 0.80), description="polyp area share of the square on "
                                   "the shorter side: log-normal median and log standard deviation")
    lesion_offset_sd: float = Field(0.19, ge=0.0, le=0.5, description="polyp centre offset from the "
                                    "frame centre: standard deviation per axis, share of the side")
    position_box_rate: float = Field(0.5, ge=0.0, le=1.0,
                                     description="share of frames with the green position box")
    etis_count: int = Field(8, ge=0, le=MAX_IMAGES, description="synthetic ETIS frames")
    etis_duplicates: int = Field(1, ge=0, le=MAX_IMAGES, description="extra byte-identical ETIS frames")
    polypgen_counts: list[Annotated[int, Field(ge=0, le=MAX_IMAGES)]] = Field([3, 3, 3, 2, 2, 2], min_length=6, max_length=6,
                                       description="synthetic PolypGen frames per centre C1..C6")
    polypgen_empty_per_centre: int = Field(1, ge=0, le=MAX_IMAGES, description="PolypGen frames without a polyp")
    polypgen_duplicates: int = Field(1, ge=0, le=MAX_IMAGES, description="extra byte-identical PolypGen frames")
    polypdb_per_cell: int = Field(2, ge=0, le=MAX_IMAGES, description="PolypDB frames per (centre, modality)")
    require_real_data: bool = Field(False, description="refuse to run without data_root")
    split_fractions: FloatTriple = Field(
        (0.70, 0.15, 0.15), description="train / val / test share of non-audit images")
    split_seed: int = Field(20260721, ge=0, le=MAX_SEED, description="seed of the group-wise stratified split")

    @field_validator("category_counts")
    @classmethod
    def _known_bounded_counts(cls, counts: dict[str, int]) -> dict[str, int]:
        # "polyps" is derived (n_segmented, n_development_polyps, near-duplicates)
        known = sorted(set(LOWER_GI_CATEGORIES) - {"polyps"})
        for name in counts:
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
                hint = f"; did you mean '{close[0]}'?" if close else f"; known: {', '.join(known)}"
                raise ValueError(f"unknown category '{name}'{hint}")
        outside = {name: n for name, n in counts.items() if not 0 <= n <= MAX_IMAGES}
        if outside:
            raise ValueError(f"counts must be in [0, {MAX_IMAGES:,}], got {outside}")
        return counts

    @field_validator("lesion_area")
    @classmethod
    def _area_distribution(cls, area: tuple[float, float]) -> tuple[float, float]:
        if not (0 < area[0] < 0.5 and 0 <= area[1] <= 2):
            raise ValueError(f"need 0 < median < 0.5 and 0 <= log_sd <= 2, got {list(area)}")
        return area

    @field_validator("split_fractions")
    @classmethod
    def _fractions_sum_to_one(cls, fractions: tuple[float, float, float]) -> tuple[float, ...]:
        if min(fractions) <= 0 or abs(sum(fractions) - 1.0) > 1e-9:
            raise ValueError(f"need three positive fractions summing to 1, got {list(fractions)}")
        return fractions


class TrainingSettings(Section):
    """Optimisation settings of one checkpoint: 01's ``training_settings`` merged with
    ``arch_overrides[arch]``, read by ``models.training`` directly. Schedule and BatchNorm
    recalibration: docs/data_models_runs.md, "Profiles and the schema"."""

    epochs: int = Field(4, ge=1, le=MAX_EPOCHS, description="maximum epochs (early stopping may end sooner)")
    batch_size: int = Field(32, ge=1, le=MAX_BATCH, description="training images per optimiser step")
    learning_rate: float = Field(1e-3, gt=0.0, description="AdamW peak learning rate")
    weight_decay: float = Field(0.05, ge=0.0, description="AdamW decoupled weight decay")
    warmup_steps: int = Field(0, ge=0, le=MAX_IMAGES, description="linear warm-up steps before cosine decay")
    label_smoothing: float = Field(0.03, ge=0.0, lt=1.0, description="cross-entropy smoothing")
    patience: int = Field(3, ge=1, le=MAX_EPOCHS, description="epochs without a better val AUPRC before stop")
    max_steps_per_epoch: int | None = Field(None, ge=1, le=MAX_IMAGES, description="cap on steps per epoch")
    eval_batch_size: int = Field(64, ge=1, le=MAX_BATCH, description="images per evaluation forward")
    num_workers: int = Field(0, ge=0, le=64, description="DataLoader workers")
    batchnorm_recalibration_images: int = Field(
        128, ge=0, le=MAX_BATCH, description="training images behind BatchNorm statistics before each validation (0: off)")


class TrainingStageSettings(StageSettings):
    uses_shared: ClassVar[tuple[str, ...]] = ("seed", "image_size", "device", "architectures",
                                              "training_seeds", "scheduler",
                                              "allow_insecure_scheduler", "channels_last",
                                              "audit_batch_size")
    training_settings: dict[str, Any] = Field(default_factory=dict,
                                              description="TrainingSettings for every architecture")
    arch_overrides: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per-architecture replacements of training_settings")
    control_seed: int = Field(1129, ge=0, le=MAX_SEED, description="shuffled-label control: seed and permutation")
    bootstrap_replicates: int = Field(
        5000, ge=100, le=MAX_REPLICATES, description="image-bootstrap replicates for the test-split metric intervals")
    imagenet_weights: Literal["none", "auto"] | dict[str, str] = Field(
        "none", description="none | auto (local torchvision cache) | {arch: path}")
    mixed_precision: bool = Field(
        False, description="float16 autocast + gradient scaler in training and validation (CUDA only)")
    keep_epoch_snapshots: bool = Field(
        False, description="keep every epoch's weights (checkpoints/epochs/) for the per-epoch C-Score of 07")

    @field_validator("training_settings")
    @classmethod
    def _known_training_keys(cls, settings: dict[str, Any]) -> dict[str, Any]:
        _check_training_settings(settings, "training_settings")
        return settings

    @field_validator("arch_overrides")
    @classmethod
    def _known_overrides(cls, overrides: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for arch, settings in overrides.items():
            if arch not in ARCHITECTURES:
                raise ValueError(f"unknown architecture {arch!r}{_suggest(arch, ARCHITECTURES)}")
            _check_training_settings(settings, f"arch_overrides.{arch}")
        return overrides


class CalibrationSettings(StageSettings):
    uses_shared: ClassVar[tuple[str, ...]] = ("seed", "decision_threshold")
    n_bins: int = Field(10, ge=2, le=MAX_EPOCHS, description="equal-width score bins for ECE and reliability")
    reliability_split: Literal["val", "test"] = Field(
        "test", description="split of the reliability diagram and the source-category audit")
    bootstrap_replicates: int = Field(
        2000, ge=100, le=MAX_REPLICATES, description="image-bootstrap replicates for the mean scaled score per source category")


class SpatialAuditSettings(StageSettings):
    uses_shared: ClassVar[tuple[str, ...]] = ("seed", "image_size", "device", "architectures",
                                              "score_threshold", "top_fraction", "prior_negatives",
                                              "audit_batch_size")
    random_deletion_repetitions: int = Field(20, ge=1, le=MAX_REPETITIONS,
                                             description="exact-area random deletions per image")
    bootstrap_replicates: int = Field(2000, ge=100, le=MAX_REPLICATES, description="image-bootstrap replicates")


class ValidityGateSettings(StageSettings):
    uses_shared: ClassVar[tuple[str, ...]] = ("seed", "image_size", "device", "architectures",
                                              "top_fraction", "channels_last", "scheduler",
                                              "allow_insecure_scheduler")
    train_images: int = Field(256, ge=8, le=MAX_IMAGES, description="planted training frames per gate model")
    val_images: int = Field(64, ge=8, le=MAX_IMAGES, description="held-out planted frames for the accuracy rule")
    pool_images: int = Field(48, ge=8, le=MAX_IMAGES, description="common audited pool (polyp + separate cue)")
    replicate_seeds: list[Annotated[int, Field(ge=0, le=MAX_SEED)]] = Field([1, 2, 3], min_length=1, max_length=MAX_LIST_ITEMS,
                                       description="one gate replicate (frames, models, pool) per seed")
    steps: int = Field(60, ge=1, le=MAX_IMAGES, description="optimiser steps per trained gate model")
    batch_size: int = Field(16, ge=2, le=MAX_BATCH, description="frames per optimiser step")

    @field_validator("replicate_seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: list) -> list:
        return _distinct_items(seeds)

    learning_rate: float = Field(0.004, gt=0, description="AdamW peak learning rate")
    warmup_steps: int = Field(6, ge=0, le=MAX_IMAGES, description="linear warm-up steps")
    margin: float = Field(0.25, gt=0, lt=1, description="rate above chance a method must clear")
    min_accuracy: float = Field(0.90, gt=0.5, le=1, description="held-out accuracy the lesion and shortcut models need")
    max_control_accuracy: float = Field(0.75, ge=0.5, le=1, description="the shuffled control's held-out accuracy must lie within 1 - this .. this")
    pool_batch_size: int = Field(16, ge=1, le=MAX_BATCH, description="images per CAM/deletion batch of the gate's pool audit (memory)")
    random_deletion_repetitions: int = Field(2, ge=1, le=MAX_REPETITIONS, description="random deletions per pool image")
    shuffled_control_per_replicate: bool = Field(
        True, description="a shuffled-label control per replicate (false: the first replicate's, reused)")
    untrained_initialisations: int = Field(
        4, ge=1, le=64, description="untrained networks per replicate, each on its own seed (the untrained control's draws)")


class RobustnessSettings(StageSettings):
    uses_shared: ClassVar[tuple[str, ...]] = ("seed", "image_size", "device", "score_threshold",
                                              "top_fraction", "scheduler",
                                              "allow_insecure_scheduler", "prior_negatives", "audit_batch_size")
    other_random_deletion_repetitions: int = Field(
        20, ge=1, le=MAX_REPETITIONS, description="random deletions per image, the checkpoints other than the primary (its audit is 04's)")
    bootstrap_replicates: int = Field(2000, ge=100, le=MAX_REPLICATES, description="image-bootstrap replicates")
    cluster_bootstrap_replicates: int = Field(500, ge=50, le=MAX_REPLICATES,
                                              description="image-cluster replicates for Table 5")
    score_thresholds: list[float] = Field([0.80, 0.85, 0.90, 0.95], min_length=1, max_length=MAX_LIST_ITEMS,
                                          description="thresholds of the sensitivity analysis")
    resolution_check_size: int = Field(0, ge=0, le=MAX_IMAGE_SIZE, description="second input size for the primary's panel A (0: skip)")
    resolution_check_repetitions: int = Field(1, ge=1, le=MAX_REPETITIONS, description="random deletions per image at the second size")
    layer_check: bool = Field(True, description="the primary's panel A at the neighbouring layer, with channel-weight diagnostics")
    audit_unlearned: bool = Field(
        True, description="also audit checkpoints that did not learn (false: listed as not audited; controls always audited)")

    @field_validator("score_thresholds")
    @classmethod
    def _thresholds_in_unit_interval(cls, thresholds: list[float]) -> list[float]:
        outside = [t for t in thresholds if not 0 < t < 1]
        if outside:
            raise ValueError(f"thresholds must lie in (0, 1), got {outside}")
        return thresholds


class TransferSettings(StageSettings):
    uses_shared: ClassVar[tuple[str, ...]] = ("seed", "image_size", "device", "score_threshold",
                                              "top_fraction", "scheduler",
                                              "allow_insecure_scheduler", "audit_batch_size")
    external_cohorts: list[Literal[EXTERNAL_COHORTS]] = Field(  # type: ignore[valid-type]
        ["etis", "polypgen", "polypdb"], max_length=MAX_LIST_ITEMS, description="cohorts audited (must exist)")
    optional_cohorts: list[Literal[EXTERNAL_COHORTS]] = Field(  # type: ignore[valid-type]
        ["kvasir_seg", "cvc_clinicdb"], max_length=MAX_LIST_ITEMS, description="audited only when their folder exists")

    @field_validator("external_cohorts", "optional_cohorts")
    @classmethod
    def _distinct_cohorts(cls, cohorts: list) -> list:
        return _distinct_items(cohorts)

    random_deletion_repetitions: int = Field(20, ge=1, le=MAX_REPETITIONS,
                                             description="exact-area random deletions per image")
    figure_bootstrap_replicates: int = Field(5000, ge=100, le=MAX_REPLICATES,
                                             description="replicates for Figure 5 mean IoU CIs")
    breakdown_bootstrap_replicates: int = Field(
        2000, ge=100, le=MAX_REPLICATES, description="replicates for the per-centre / per-modality CIs")


class ExtendedLocalisationSettings(StageSettings):
    uses_shared: ClassVar[tuple[str, ...]] = ("seed", "image_size", "device", "score_threshold",
                                              "top_fraction", "localisation", "audit_batch_size")
    matrix_checkpoints: bool = Field(True, description="score every learned checkpoint of the matrix, not only the primary")
    external_cohorts: list[Literal[EXTERNAL_COHORTS]] = Field(  # type: ignore[valid-type]
        ["etis", "polypgen", "polypdb"], max_length=MAX_LIST_ITEMS, description="cohorts the primary is scored on (if present)")
    bootstrap_replicates: int = Field(2000, ge=100, le=MAX_REPLICATES, description="image-bootstrap replicates")
    c_score_negatives: int = Field(
        64, ge=0, le=MAX_IMAGES, description="held-out test negatives of the negative-class C-Score (0: polyp class only)")


class FaithfulnessSettings(StageSettings):
    uses_shared: ClassVar[tuple[str, ...]] = ("seed", "image_size", "device", "score_threshold",
                                              "top_fraction", "localisation", "decision_threshold")
    faithfulness_batch_size: int = Field(16, ge=1, le=MAX_BATCH, description="images per CAM/ROAD batch (memory)")
    road_fractions: list[float] = Field([0.01, 0.02, 0.05, 0.10, 0.20], min_length=1, max_length=MAX_LIST_ITEMS,
                                        description="shares of the field of view removed (MoRF/LeRF)")
    imputation_noise_std: float = Field(0.01, ge=0.0, description="noise on imputed pixels")
    lsr_regions: int = Field(5, ge=1, le=MAX_REPETITIONS, description="LSR comparison regions per image (up to)")
    shape_repetitions: int = Field(20, ge=1, le=MAX_REPETITIONS, description="shape-preserving random deletions")
    all_checkpoints: bool = Field(False, description="every learned checkpoint, not only the primary")
    randomisation_images: int = Field(32, ge=1, le=MAX_IMAGES, description="images of the cascading randomisation")
    subgroup_cohorts: list[Literal[EXTERNAL_COHORTS]] = Field(  # type: ignore[valid-type]
        ["etis", "polypgen", "polypdb"], max_length=MAX_LIST_ITEMS, description="external cohorts of the subgroup analysis")
    min_subgroup_images: int = Field(8, ge=2, le=MAX_IMAGES, description="images needed on each side of a contrast")
    subgroup_checkpoints: Literal["primary", "learned"] = Field(
        "learned", description="maps in the subgroup models: the primary's, or every learned checkpoint's (images stay the clusters; one intercept per method and checkpoint)")
    subgroup_faithfulness: bool = Field(
        True, description="SRG and LSR of the primary on the external subgroup cohorts too (ROAD on every external image); false: only on the audit pool, where 08 computes them anyway")
    bootstrap_replicates: int = Field(2000, ge=100, le=MAX_REPLICATES, description="replicates for SRG/LSR/curve CIs")

    @field_validator("road_fractions")
    @classmethod
    def _fractions_in_unit_interval(cls, fractions: list[float]) -> list[float]:
        outside = [f for f in fractions if not 0 < f <= 1]
        if outside:
            raise ValueError(f"fractions must lie in (0, 1], got {outside}")
        return fractions


class FiguresSettings(StageSettings):
    uses_shared: ClassVar[tuple[str, ...]] = ("image_size", "device", "score_threshold", "top_fraction",
                                              "audit_batch_size")
    table_digits: int = Field(3, ge=0, le=8, description="decimals in the final tables")
    case_browser: bool = Field(True, description="write the case browser (runs/<profile>/cases/): "
                               "every audited image of the primary, its maps recomputed")


# One model per stage; a notebook without an entry here cannot be configured.
STAGE_SETTINGS: dict[str, type[StageSettings]] = {
    "00_roles": RolesSettings,
    "01_training": TrainingStageSettings,
    "02_calibration": CalibrationSettings,
    "03_validity_gate": ValidityGateSettings,
    "04_spatial_audit": SpatialAuditSettings,
    "05_robustness": RobustnessSettings,
    "06_transfer": TransferSettings,
    "07_extended_localisation": ExtendedLocalisationSettings,
    "08_faithfulness": FaithfulnessSettings,
    "09_figures": FiguresSettings,
}


class Profile(BaseModel):
    """A validated profile: name, description, shared settings and one model per stage;
    ``overrides``: the command line's ``--set`` texts applied on top of the file, in order."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    profile: str
    description: str = ""
    shared: Section
    stages: dict[str, StageSettings]
    overrides: tuple[str, ...] = ()

    def stage_settings(self, stage: str) -> StageSettings:
        if stage not in self.stages:
            raise ProfileError(f"profile {self.profile!r} has no settings for stage {stage!r}")
        return self.stages[stage]


def _suggest(key: str, valid) -> str:
    close = difflib.get_close_matches(str(key), [str(v) for v in valid], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def short_value(value: Any, limit: int = 40) -> str:
    """A value for an error message: its type and the start of its repr (a profile can hold a
    very large value; the message stays one short line)."""
    text = repr(value)
    return f"{type(value).__name__} {text[:limit]}{'...' if len(text) > limit else ''}"


def _problems(error: ValidationError, prefix: str, model: type[BaseModel]):
    """One ``<key path>: <message>`` per problem, key paths under ``prefix``, with a suggestion for typos."""
    for problem in error.errors():
        location = ".".join(str(part) for part in (prefix, *problem["loc"]))
        if problem["type"] == "extra_forbidden":
            yield f"{location}: unknown key{_suggest(problem['loc'][-1], model.model_fields)}"
        else:
            message = problem["msg"].removeprefix("Value error, ")
            yield f"{location}: {message} (got {short_value(problem.get('input'))})"


def _format_error(path: Path, prefix: str, error: ValidationError, model: type[BaseModel]) -> str:
    """One line per problem: ``<file>: <key path>: <message>``."""
    return "\n".join(f"{path}: {problem}" for problem in _problems(error, prefix, model))


def _check_training_settings(settings: dict[str, Any], where: str) -> None:
    """Validate a (partial) training_settings mapping; ValueError naming the key on a problem."""
    try:
        TrainingSettings(**settings)
    except ValidationError as error:
        raise ValueError("; ".join(_problems(error, where, TrainingSettings))) from None


# A profile's stem names its run and figures folders: a plain name, never "." or "..".
PROFILE_STEM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
MAX_PROFILE_BYTES = 1 << 20      # profiles and --set-files: 1 MiB of YAML is plenty


def profile_path(profile: str) -> Path:
    """Path of ``configs/<profile>.yaml`` (or ``profile`` itself if it is a YAML path).
    ``ProfileError`` when the stem is not a plain name (letters, digits, ``_``, ``-``): it becomes
    the run folder's name, and a stem like ``..`` would put the run on the output root."""
    candidate = Path(profile)
    path = candidate if candidate.suffix in (".yaml", ".yml") else CONFIG_DIR / f"{profile}.yaml"
    if not PROFILE_STEM.match(path.stem):
        raise ProfileError(f"profile {short_text(str(profile))!r}: the file's stem "
                           f"{short_text(path.stem)!r} must be a plain name (letters, digits, '_', '-'); "
                           "it names the run and figures folders")
    return path


def _validate(model: type[BaseModel], values: Any, path: Path, prefix: str) -> BaseModel:
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise ProfileError(f"{path}: {prefix}: expected a mapping, got {type(values).__name__}")
    try:
        return model(**values)
    except ValidationError as error:
        raise ProfileError(_format_error(path, prefix, error, model)) from None


class ProfileLoader(yaml.SafeLoader):
    """YAML for profiles: no aliases, no duplicate keys, and only true/false as booleans
    (docs/data_models_runs.md, "Profiles and the schema")."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, f"alias *{event.anchor} is not allowed "
                                              "in a profile (write the value out)", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


ProfileLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
ProfileLoader.add_implicit_resolver("tag:yaml.org,2002:bool",
                                    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def read_profile_yaml(text: str) -> Any:
    """Parse profile text with ``ProfileLoader``; ``yaml.YAMLError`` on a refused construct."""
    return yaml.load(text, Loader=ProfileLoader)  # noqa: S506 (a SafeLoader subclass)


@dataclass(frozen=True)
class Override:
    """One ``--set SECTION.KEY[.SUBKEY...]=VALUE`` of the command line: ``section`` is
    ``shared`` or a stage name, ``keys`` the path inside that section, ``value`` the VALUE read
    as profile YAML (``3``, ``0.5``, ``true``, ``[0.8, 0.9]``, ``{epochs: 1}``, ``null``; an
    empty VALUE is the empty string)."""

    text: str
    section: str
    keys: tuple[str, ...]
    value: Any


def parse_override(text: str) -> Override:
    """Parse one ``--set`` argument; ``ProfileError`` naming it when it is malformed."""
    target, separator, value_text = text.partition("=")
    parts = target.strip().split(".")
    if not separator or len(parts) < 2 or not all(parts):
        raise ProfileError(f"--set {short_text(text)!r}: expected SECTION.KEY=VALUE, e.g. "
                           "--set 01_training.training_settings.epochs=1 or --set shared.image_size=128")
    try:
        value = read_profile_yaml(value_text) if value_text.strip() else ""
    except (yaml.YAMLError, ValueError) as error:   # ValueError: e.g. an integer of 200,000 digits
        raise ProfileError(f"--set {short_text(text)!r}: the value is not valid profile YAML: "
                           f"{' '.join(str(error).split())}") from None
    return Override(text, parts[0], tuple(parts[1:]), value)


def read_set_file(path: str | Path) -> list[str]:
    """The ``--set`` texts of a file (``run_all.sh --set-file``): one SECTION.KEY=VALUE per line;
    blank lines and lines starting with ``#`` are skipped. ``ProfileError`` naming the file when
    it cannot be read."""
    path = Path(path)
    try:
        text = read_bounded(path, MAX_PROFILE_BYTES, "--set-file").decode("utf-8")
    except FileTooLarge as error:
        raise ProfileError(str(error)) from None
    except (OSError, UnicodeDecodeError) as error:
        raise ProfileError(f"--set-file {path}: cannot be read ({error})") from None
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def apply_overrides(raw: dict, overrides: list[Override], stage_settings: dict[str, type[StageSettings]],
                    shared_settings: type[Section]) -> dict:
    """A copy of the profile's raw mapping with each override written in, in order. The section
    must be ``shared`` or a known stage and the first key one of its settings (errors name the
    ``--set`` argument and suggest the closest name); the values are validated afterwards with
    the file's, by the same models."""
    raw = copy.deepcopy(raw)
    for override in overrides:
        if override.section == "shared":
            model, section = shared_settings, raw.setdefault("shared", {})
        elif override.section in stage_settings:
            model = stage_settings[override.section]
            stages = raw.setdefault("stages", {})
            section = stages.get(override.section)
            if section is None:
                section = stages[override.section] = {}
        else:
            raise ProfileError(f"--set {short_text(override.text)!r}: unknown section {short_text(override.section)!r}: use "
                               f"'shared' or a stage{_suggest(override.section, ['shared', *stage_settings])}")
        if override.keys[0] not in model.model_fields:
            raise ProfileError(f"--set {short_text(override.text)!r}: {override.section} has no key "
                               f"{short_text(override.keys[0])!r}{_suggest(override.keys[0][:200], model.model_fields)}")
        for key in override.keys[:-1]:
            inner = section.get(key)
            if inner is None:
                inner = section[key] = {}
            if not isinstance(inner, dict):
                raise ProfileError(f"--set {short_text(override.text)!r}: {short_text(key)!r} is not a mapping in this profile")
            section = inner
        section[override.keys[-1]] = override.value
    return raw


def load_profile(profile: str, stage_names: list[str] | None = None, *,
                 stage_settings: dict[str, type[StageSettings]] | None = None,
                 shared_settings: type[Section] = SharedSettings,
                 overrides: list[str] | tuple[str, ...] = ()) -> Profile:
    """Read and validate a profile; raise ``ProfileError`` naming the file and key on any problem.

    ``stage_names``: the stages the run will execute (default: every stage with a model); a
    section for an unknown stage is an error, a stage without one gets the defaults.
    ``stage_settings`` / ``shared_settings``: the schema (default: this module's). ``overrides``:
    ``--set SECTION.KEY=VALUE`` texts applied on top of the file and validated like it; an error
    in an overridden section names the ``--set``.
    """
    stage_settings = STAGE_SETTINGS if stage_settings is None else stage_settings
    path = profile_path(profile)
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
        raise ProfileError(f"profile file {path} does not exist (known profiles: {known})")
    try:
        raw = read_profile_yaml(read_bounded(path, MAX_PROFILE_BYTES, "profile").decode("utf-8"))
    except (FileTooLarge, UnicodeDecodeError) as error:
        raise ProfileError(f"{path}: not a valid profile: {error}") from None
    except yaml.YAMLError as error:
        raise ProfileError(f"{path}: not a valid profile: {' '.join(str(error).split())}") from error
    if not isinstance(raw, dict):
        raise ProfileError(f"{path}: expected a mapping at the top level")
    unknown = sorted(set(raw) - {"description", "shared", "stages"})
    if unknown:
        raise ProfileError(f"{path}: unknown top-level key {unknown[0]!r}"
                           f"{_suggest(unknown[0], ('description', 'shared', 'stages'))}")
    for section in ("shared", "stages"):
        if not isinstance(raw.get(section), dict):
            raise ProfileError(f"{path}: missing mapping section '{section}'")
    parsed = [parse_override(text) for text in overrides]
    raw = apply_overrides(raw, parsed, stage_settings, shared_settings)

    def validated(model, values, prefix: str, section: str):
        try:
            return _validate(model, values, path, prefix)
        except ProfileError as error:
            texts = [o.text for o in parsed if o.section == section]
            if texts:
                raise ProfileError(f"{error} (with --set {', --set '.join(short_text(t) for t in texts)})") from None
            raise

    shared = validated(shared_settings, raw["shared"], "shared", "shared")
    known_stages = list(stage_names or stage_settings)
    stages: dict[str, StageSettings] = {}
    for stage, values in raw["stages"].items():
        if stage not in stage_settings:
            raise ProfileError(f"{path}: stages.{stage}: unknown stage{_suggest(stage, stage_settings)};"
                               " a new stage needs a settings model in config.STAGE_SETTINGS")
        stages[stage] = validated(stage_settings[stage], values, f"stages.{stage}", stage)
    for stage in known_stages:
        if stage in stage_settings and stage not in stages:
            stages[stage] = stage_settings[stage]()
    return Profile(profile=path.stem, description=str(raw.get("description", "")),
                   shared=shared, stages=stages, overrides=tuple(overrides))


def stage_parameters(profile: Profile, stage: str) -> dict[str, Any]:
    """Parameters for one notebook: the shared keys the stage uses, then its own section."""
    settings = profile.stage_settings(stage)
    shared = profile.shared.model_dump(mode="json")
    parameters = {key: shared[key] for key in settings.uses_shared}
    parameters.update(settings.model_dump(mode="json"))
    return parameters


def stage_section(stage: str, parameters: dict[str, Any]) -> StageSettings:
    """A stage's own profile section, typed and validated again from a notebook's parameters
    (e.g. ``stage_section("03_validity_gate", globals())``): the object the analysis code
    takes, instead of the keys one by one. Every key of the section must be in
    ``parameters`` (a missing one is an error, never the schema default); other names are
    ignored."""
    model = STAGE_SETTINGS[stage]
    missing = [key for key in model.model_fields if key not in parameters]
    if missing:
        raise ProfileError(f"stage {stage}: parameters lack {', '.join(missing)}")
    values = {key: parameters[key] for key in model.model_fields}
    try:
        return model(**values)
    except ValidationError as error:
        raise ProfileError(_format_error(Path(f"<{stage} parameters>"), f"stages.{stage}", error,
                                         model)) from None


SYNTHETIC_MARKER = "synthetic_cohort.json"   # written by the synthetic generator at its root


def is_synthetic_data(data_root: str | Path | None) -> bool:
    """True when a run reads synthetic frames: no data root (the embedded cohort), or a data
    root the synthetic generator wrote (its ``SYNTHETIC_MARKER``, e.g. the mirror of the real
    datasets). Every table, figure and record of such a run says "synthetic". A data root
    that cannot be read (e.g. mode 000) is not synthetic here: the preflight and stage 00's
    readers say it cannot be read, naming it."""
    if not data_root:
        return True
    try:
        return (Path(data_root).expanduser() / SYNTHETIC_MARKER).is_file()
    except OSError:
        return False


def resolve_data_root(data_root: str | Path | None, run_dir: str | Path) -> Path:
    """The folder cohorts are read from: ``data_root`` if given, else ``<run_dir>/data``."""
    if data_root:
        return Path(data_root).expanduser().resolve()
    return RunLayout(run_dir).data
