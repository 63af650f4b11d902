"""The hook: runs inside every training rank (stdlib, plus torch once the program imports it).
It counts steps and collectives into the rank's beacon, never blocks and never raises into
training. `boot/sitecustomize.py` installs it as Python starts, under `watchdog run/launch`."""

from watchdog.hook.lifecycle import install, phase, step

__all__ = ["install", "phase", "step"]
