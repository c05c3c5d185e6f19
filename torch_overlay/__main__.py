"""``python -m torch_overlay``: the CLI, :mod:`torch_overlay.cli.main`."""

import sys

from .cli.main import main

if __name__ == "__main__":
    sys.exit(main())
