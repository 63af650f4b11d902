"""`python -m watchdog`: the same as the `watchdog` console script."""

import sys

from watchdog.cli import main

sys.exit(main())
