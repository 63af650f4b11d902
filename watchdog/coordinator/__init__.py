"""The coordinator (its own process, or embedded in `watchdog run`): joins node reports into
jobs, detects stalls, decides the verdict with a pure function, stores and announces incidents."""

from watchdog.coordinator.service import Coordinator
from watchdog.coordinator.stall import StallPolicy
from watchdog.coordinator.store import IncidentStore, store_for

__all__ = ["Coordinator", "IncidentStore", "StallPolicy", "store_for"]
