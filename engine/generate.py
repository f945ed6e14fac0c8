"""``python -m engine.generate``: the CLI's historical entry point (:mod:`engine.cli.main`)."""

import sys

from engine.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
