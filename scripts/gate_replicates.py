"""Pool the validity gate's replicates from several runs and judge them as one gate.

The gate's verdict is decided by intervals over the replicates' draws (Student t)
(docs/statistics_and_gate.md, "Validity gate"). Whether more replicates would decide a method
that is "inconclusive" is an empirical question: run stage 03 again with other
``03_validity_gate.replicate_seeds`` into a copy of the run (each replicate is independent:
its own frames, models and controls), then pool here. Every replicate keeps its own audit
tables (``runs/<profile>/validity_gate/seed_<seed>/gate_<model>.parquet``) and model facts
(``figures/<profile>/table_validity_gate_models.csv``); the pool frames and their cue masks are
regenerated from the seed (``validity_gate.gate_pool`` is deterministic).

Usage:

    python scripts/gate_replicates.py --profile default ROOT_A ROOT_B [...] [--first 3 --first 6]

ROOT_*: output roots (the folders holding runs/ and figures/). Prints, for the first k
replicates of the pooled set (each ``--first k``; default all), every method's verdict, pooled
rates with intervals and per-replicate point rates. Reads only; trains nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from endoexplain_core import config
from endoexplain_core.analysis import audit_schema, validity_gate
from endoexplain_core.kernels import grid
from endoexplain_core.models import networks


def replicate_cases(run_dir: Path, seed: int, *, grid_shape: tuple[int, int], image_size: int,
                    pool_images: int) -> pd.DataFrame:
    """The case rows of one replicate with the cue columns, as ``audit_gate_models`` returns;
    ``grid_shape``: the CAM grid of the gate's architecture and layer at ``image_size``."""
    pool = validity_gate.gate_pool(pool_images, image_size, seed + 2)
    on_lesion = grid.nearest_node_inside(np.stack([c["lesion_mask"] for c in pool]), grid_shape)
    on_cue = grid.nearest_node_inside(np.stack([c["cue_mask"] for c in pool]), grid_shape)
    ceilings = {c["sample_id"]: (bool(a), bool(b)) for c, a, b in zip(pool, on_lesion, on_cue)}
    folder = run_dir / "validity_gate" / f"seed_{seed}"
    names = sorted(p.stem[len("gate_"):] for p in folder.glob("gate_*.parquet")
                   if not p.stem.endswith("_random_deletion"))
    tables = [audit_schema.read_audit_table(folder / f"gate_{name}.parquet")
              .assign(gate_seed=seed, model=validity_gate.model_kind(name),
                      draw=int(name.split("_")[1]) if "_" in name else 0) for name in names]
    return validity_gate.add_cue_columns(pd.concat(tables, ignore_index=True),
                                         {c["sample_id"]: c["cue_mask"] for c in pool}, ceilings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="+", type=Path, help="output roots of runs with gate replicates")
    parser.add_argument("--profile", default="default")
    parser.add_argument("--first", type=int, action="append", default=None,
                        help="judge the first k pooled replicates (repeatable; default all)")
    args = parser.parse_args()
    profile = config.load_profile(args.profile)
    section = profile.stage_settings("03_validity_gate")
    image_size = profile.shared.image_size
    arch = profile.shared.architectures[0]
    model = networks.build_model(arch)   # untrained: only its layer's grid is read
    layer_name = networks.resolve_target_layer(model, arch, None)[0]
    grid_shape = networks.cam_grid_shape(model, layer_name, image_size)
    cases, facts = [], []
    for root in args.roots:
        run_dir, figures_dir = root / "runs" / profile.profile, root / "figures" / profile.profile
        gate = pd.read_csv(figures_dir / "table_validity_gate_models.csv")
        for seed in sorted(gate["gate_seed"].unique()):
            if seed in {int(s) for f in facts for s in f["gate_seed"]}:
                raise SystemExit(f"replicate seed {seed} appears in two roots")
            cases.append(replicate_cases(run_dir, int(seed), grid_shape=grid_shape,
                                         image_size=image_size, pool_images=section.pool_images))
            facts.append(gate[gate["gate_seed"] == seed])
    seeds = [int(f["gate_seed"].iloc[0]) for f in facts]
    pd.set_option("display.width", 200)
    for k in args.first or [len(seeds)]:
        chosen = seeds[:k]
        rows = pd.concat(cases, ignore_index=True)
        table = validity_gate.gate_table(rows[rows["gate_seed"].isin(chosen)],
                                         pd.concat(facts)[lambda f: f["gate_seed"].isin(chosen)],
                                         margin=section.margin)
        print(f"\n== replicates {chosen} ==")
        print(table[["method", "verdict", "lesion_rate", "lesion_ci_low", "lesion_bar", "cue_rate",
                     "cue_ci_low", "cue_ci_high", "cue_bar", "untrained_lesion_rate",
                     "untrained_lesion_ci_high", "cue_sd"]].round(3).to_string(index=False))
        # the reason names each clause that decided or left the verdict open
        print(table[["method", "reason"]].to_string(index=False, max_colwidth=160))
    per_replicate = (pd.concat(cases).query("method == 'eigencam'")
                     .groupby(["gate_seed", "model"])[["peak_inside_lesion", "peak_on_cue"]].mean())
    print("\nEigen-CAM per replicate (share of maps):")
    print(per_replicate.unstack("model").round(3).to_string())


if __name__ == "__main__":
    main()
