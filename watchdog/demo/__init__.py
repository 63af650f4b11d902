"""The bundled jobs torchrun runs as each rank's program: `train.py`, with one injectable fault
(`watchdog demo` and the integration tests), and `minimal.py` (`watchdog check`)."""

from pathlib import Path

TRAIN_SCRIPT = str(Path(__file__).with_name("train.py"))
MINIMAL_SCRIPT = str(Path(__file__).with_name("minimal.py"))
# What minimal.py does, in order, and how it starts the line it prints about each step
MINIMAL_STEPS = ("init_process_group", "all_reduce", "barrier", "destroy_process_group")
MINIMAL_PREFIX = "watchdog-check "

__all__ = ["MINIMAL_PREFIX", "MINIMAL_SCRIPT", "MINIMAL_STEPS", "TRAIN_SCRIPT"]
