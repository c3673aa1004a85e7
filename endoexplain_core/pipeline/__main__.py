"""``python -m endoexplain_core.pipeline`` (what ``run_all.sh`` execs): the orchestrator's
command line. Ctrl-C while the orchestrator is still loading is one line, like every later one:
nothing has been read or written yet."""

import sys

try:
    from endoexplain_core.pipeline.orchestrator import exit_quietly, main
except KeyboardInterrupt:
    print("\nrun_all: interrupted while starting; nothing was written", file=sys.stderr)
    sys.exit(130)

exit_quietly(main)
