"""A worker that does nothing until the file named by its argument exists (or 180 s passed),
then exits with code 7. Runs without site (python -S): stdlib built-ins only."""

import os
import sys
import time

deadline = time.monotonic() + 180.0
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.1)
sys.exit(7)
