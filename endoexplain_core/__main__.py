"""``python -m endoexplain_core``: the ``endoexplain`` command (see ``endoexplain_core.cli``)."""

import sys

from endoexplain_core.cli import main

if __name__ == "__main__":
    sys.exit(main())
