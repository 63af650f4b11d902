"""The bundled training job (`train.py`, run by torchrun as each rank's program) that `watchdog
demo` and the integration tests run, with one injectable fault."""

from pathlib import Path

TRAIN_SCRIPT = str(Path(__file__).with_name("train.py"))

__all__ = ["TRAIN_SCRIPT"]
