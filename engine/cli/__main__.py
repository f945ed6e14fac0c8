"""``python -m engine.cli``."""

import sys

from engine.cli.main import main

sys.exit(main())
