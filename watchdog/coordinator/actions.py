"""What a job's judgement decides, each decision with its reason (coordinator process): the
Coordinator carries it out. `Judgement.step` returns one a tick; `Judgement.conclude`, one a
look, its stacks in hand. Only the Coordinator acts (stores, tells, asks for stacks); the
judgement decides, and moves on when the Coordinator applies what it did (`Judgement.apply`).
"""

from __future__ import annotations

from dataclasses import dataclass

from watchdog.coordinator.after_exit import StillHung
from watchdog.model import JobSnapshot, RankStack, Verdict
from watchdog.schema import Incident


@dataclass(frozen=True, kw_only=True)
class Action:
    reason: str  # why, in words: logged at `level` where one is given
    level: int | None = None


@dataclass(frozen=True, kw_only=True)
class Nothing(Action):
    """Nothing to decide: the job progresses, a look is under way, or it is judged no more."""


@dataclass(frozen=True, kw_only=True)
class Wait(Action):
    """Something to decide, not yet: a hold, a silent node, an exit's peers not quiet long
    enough."""


@dataclass(frozen=True, kw_only=True)
class Look(Action):
    """Ask for `samples` stacks of each live rank, then `conclude`; `early`: during the
    warm-up; `first`: the first look at this stall (counted)."""

    samples: int
    early: bool
    unreachable: tuple[str, ...]
    first: bool


@dataclass(frozen=True, kw_only=True)
class EndNotice(Action):
    """The notice's rank moved on: store `incident` (with `ended_at`) and tell its end."""

    incident: Incident
    lasted: float  # seconds the stall lasted


@dataclass(frozen=True, kw_only=True)
class MarkResumed(Action):
    """A hang the job contradicted: store `incident` (with `resumed_at`), count it, tell it."""

    incident: Incident
    lasted: float


@dataclass(frozen=True, kw_only=True)
class Close(Action):
    """Progress closes the incident, and there is nothing to say of it: an exit, which progress
    cannot contradict, or a hang whose job is being ended."""


@dataclass(frozen=True, kw_only=True)
class TellStillHung(Action):
    """An exit's peers still wait a threshold later: tell `still_hung_listeners`."""

    still: StillHung


@dataclass(frozen=True, kw_only=True)
class StopFollowing(Action):
    """An exit's peers will never be hung by it: nothing more to decide."""


@dataclass(frozen=True, kw_only=True)
class Hold(Action):
    """Say nothing now; look at the stall again at `until`, unless a rank exits (`exits`: how
    many had when it was decided). `busy`: whether ranks work through it, `place`: where its
    culprits are; None leaves each as it was."""

    until: float
    exits: int
    busy: bool | None = None
    place: str | None = None


@dataclass(frozen=True, kw_only=True)
class Tell(Action):
    """Build the incident of `verdict` on `snapshot`, store and tell it; `hold` comes with a
    notice (looked at again soon), `place` with a hang (learned from if it ends by itself)."""

    verdict: Verdict
    snapshot: JobSnapshot
    hold: Hold | None = None
    place: str | None = None


@dataclass(frozen=True, kw_only=True)
class SawProgress(Action):
    """A job without a hook whose stacks moved: record them as its progress."""

    stacks: dict[int, RankStack]
