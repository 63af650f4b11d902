"""The coordinator (its own process, or embedded in `watchdog run`): joins node reports into
jobs, detects stalls, decides the verdict with a pure function, stores and announces incidents."""

from watchdog.coordinator.service import Coordinator
from watchdog.coordinator.stall import StallPolicy
from watchdog.coordinator.store import IncidentStore, default_db_path

__all__ = ["Coordinator", "IncidentStore", "StallPolicy", "default_db_path"]
