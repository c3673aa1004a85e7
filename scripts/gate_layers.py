"""The validity gate at several target layers on the same model draws (issue 48, item 3).

Runs the profile's gate (``stages.03_validity_gate``: frames, steps, replicates, rule) at the
primary architecture and input size, trains each replicate's models once and audits them at
every layer given (``validity_gate.run_gate_at_layers``), then prints per layer and method the
verdict, the lesion model's rate in the lesion and the shortcut model's on the cue (mean over
the usable replicates, with the between-draw SD) and the untrained networks' rate in the lesion.

Usage (about 5 min per replicate plus 1 min per replicate and extra layer, 2 idle cores):

  python scripts/gate_layers.py --out runs/gate_layers \\
      --layers features.8.0 features.8.1 features.8 features.7

Writes ``<out>/gate_by_layer.csv`` (the gate tables with a ``target_layer`` column) and
``<out>/gate_models.csv``. A measurement, not a stage.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from endoexplain_core import config
from endoexplain_core.analysis import validity_gate
from endoexplain_core.methods import CAM_METHODS
from endoexplain_core.models import training

COLUMNS = ["target_layer", "method", "verdict", "lesion_rate", "lesion_sd", "cue_rate", "cue_sd",
           "untrained_lesion_rate", "lesion_bar", "cue_bar"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--profile", default="default")
    parser.add_argument("--arch", default=training.PRIMARY_ARCH)
    parser.add_argument("--layers", nargs="+", required=True, help="module paths; the first is audited by run_gate itself")
    parser.add_argument("--replicate-seeds", type=int, nargs="+", default=None,
                        help="gate replicate seeds (default: the profile's replicate_seeds)")
    parser.add_argument("--init-weights", type=Path, default=None,
                        help="a trunk (models.pretraining) the trained gate models are fine-tuned from")
    args = parser.parse_args()

    profile = config.load_profile(args.profile)
    parameters = config.stage_parameters(profile, "03_validity_gate")
    if args.replicate_seeds:
        parameters["replicate_seeds"] = args.replicate_seeds
    settings = validity_gate.GateSettings(config.stage_section("03_validity_gate", parameters),
                                          image_size=parameters["image_size"],
                                          channels_last=parameters["channels_last"])
    init_state = None
    if args.init_weights is not None:
        from endoexplain_core.models import pretraining
        init_state = pretraining.load_trunk(args.init_weights, arch=args.arch,
                                            image_size=parameters["image_size"])
    result = validity_gate.run_gate_at_layers(
        args.out, arch=args.arch, settings=settings, layer_names=args.layers,
        top_fraction=parameters["top_fraction"], batch_size=parameters["pool_batch_size"],
        progress=print, init_state=init_state)
    args.out.mkdir(parents=True, exist_ok=True)
    result["gate"].to_csv(args.out / "gate_by_layer.csv", index=False)
    result["models"].to_csv(args.out / "gate_models.csv", index=False)
    shown = result["gate"][result["gate"]["method"].isin(CAM_METHODS)]
    print(f"usable replicates: {validity_gate.usable_replicates(result['models'])}")
    print(shown[COLUMNS].to_string(index=False, float_format=lambda v: f"{v:.3f}"))


if __name__ == "__main__":
    main()
