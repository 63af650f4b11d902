"""The beacon, one rank's progress in shared memory (stdlib only): `layout` places the bytes,
`records` are what they hold, `writer` runs in the hook (the rank), `reader` in the agent."""

from watchdog.beacon.layout import (
    CHECK_NAMES,
    EXIT_CLEAN,
    EXIT_EXCEPTION,
    EXIT_RUNNING,
    MAX_EXIT_REASON,
    MAX_GROUPS,
    MAX_LISTED_RANKS,
    MAX_WORLD,
    SIZE,
)
from watchdog.beacon.reader import open_beacon, read_beacon, read_head
from watchdog.beacon.records import (
    NO_CHECKS,
    NO_ENVIRONMENT,
    NO_PACE,
    NO_SETUP,
    BeaconGroup,
    BeaconHead,
    BeaconSnapshot,
    CheckState,
    Environment,
    Fingerprint,
    Identity,
    Pace,
    RaisedException,
    Setup,
)
from watchdog.beacon.writer import NOT_ENTERED, UNTIMED, BeaconWriter, Entered, beacon_path

__all__ = [
    "CHECK_NAMES", "EXIT_CLEAN", "EXIT_EXCEPTION", "EXIT_RUNNING", "MAX_EXIT_REASON",
    "MAX_GROUPS", "MAX_LISTED_RANKS", "MAX_WORLD", "NOT_ENTERED", "NO_CHECKS",
    "NO_ENVIRONMENT", "NO_PACE", "NO_SETUP", "SIZE", "UNTIMED", "BeaconGroup", "BeaconHead",
    "BeaconSnapshot", "BeaconWriter", "CheckState", "Entered", "Environment", "Fingerprint",
    "Identity", "Pace", "RaisedException", "Setup",
    "beacon_path", "open_beacon", "read_beacon", "read_head",
]
