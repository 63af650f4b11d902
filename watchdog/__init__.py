"""torch-hang-watchdog: names the rank that hung a torchrun job, with evidence.

Training code needs only `install`, `step` and `phase`. Importing the package stays cheap and
never imports torch or gRPC: training ranks, the CLI and the daemons all import it.
"""

from watchdog.errors import WatchdogError
from watchdog.hook import install, phase, step

__version__ = "0.1.0"
__all__ = ["WatchdogError", "__version__", "install", "phase", "step"]
