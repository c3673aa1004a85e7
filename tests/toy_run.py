"""``python -m tests.toy_run ROOT [run_all options]``: the orchestrator's command line
(``orchestrator.main``, entered as ``python -m endoexplain_core.pipeline`` enters it) on the
throwaway stages of ``ROOT/notebooks`` with ``ROOT/tiny.yaml``, writing under ``ROOT/out``.
The interrupt tests send real signals to it; like the real entry, Ctrl-C while it loads is one
line."""

import sys

try:
    from pathlib import Path

    from endoexplain_core import config
    from endoexplain_core.pipeline import orchestrator
except KeyboardInterrupt:
    print("\nrun_all: interrupted while starting; nothing was written", file=sys.stderr)
    sys.exit(130)


class ToyShared(config.Section):
    value: int = 0


class ToyStage(config.StageSettings):
    uses_shared = ("value",)


if __name__ == "__main__":
    root = Path(sys.argv[1])
    stages = {path.stem: ToyStage for path in orchestrator.discover_stages(root / "notebooks")}
    orchestrator.exit_quietly(lambda: orchestrator.main(
        ["--profile", str(root / "tiny.yaml"), "--output-root", str(root / "out"), *sys.argv[2:]],
        notebook_dir=root / "notebooks", stage_settings=stages, shared_settings=ToyShared))
