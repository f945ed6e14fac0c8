"""``python -m engine.serve``: the OpenAI-compatible server (:mod:`engine.cli.serve`)."""

import sys

from engine.cli.serve import main

if __name__ == "__main__":
    sys.exit(main())
