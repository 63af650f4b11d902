"""The records a beacon holds: what the hook writes (`writer`) is what the agent reads
(`reader`), field for field. Stdlib only: every rank imports them.

`Pace`, `Fingerprint` and `Environment` also travel on in the agent's report unchanged
(`model.RankState.pace`, `model.CheckEvidence.fingerprints`, `model.RankState.environment`): one
record from the hook to the coordinator.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Identity:
    job_id: str
    rank: int
    local_rank: int
    world_size: int
    host: str
    pid: int
    created_at: float
    attempt: int = 0  # torchrun's restart count (TORCHELASTIC_RESTART_COUNT)


@dataclass(frozen=True)
class Setup:
    """The process-group set-up call a rank is inside, which waits for every member to arrive:
    `call` is init_process_group or new_group ("" when none), `rendezvous` where the members meet
    (an init method such as tcp://host:port, or env://MASTER_ADDR:MASTER_PORT)."""

    call: str = ""
    entered_at: float = 0.0
    rendezvous: str = ""


NO_SETUP = Setup()


@dataclass(frozen=True)
class RaisedException:
    """An uncaught exception, as the hook recorded it at exit; frames are (function, file, line),
    innermost first, possibly with gaps (see `hook.exit_reason`)."""

    type: str
    message: str
    frames: tuple[tuple[str, str, int], ...] = ()

    def encode(self) -> bytes:
        import json  # here: every Python process under `watchdog run` imports this module

        return json.dumps({"type": self.type, "message": self.message,
                           "frames": [list(f) for f in self.frames]},
                          ensure_ascii=False, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> RaisedException | None:
        """The record, or None for anything that is not one: the bytes come from the rank."""
        import json

        try:
            data = json.loads(raw.decode())
            kind, message, frames = data["type"], data["message"], data["frames"]
            if not (isinstance(kind, str) and isinstance(message, str)
                    and isinstance(frames, list)):
                return None
            parsed = tuple((str(f[0]), str(f[1]), int(f[2])) for f in frames
                           if isinstance(f, list) and len(f) == 3 and isinstance(f[2], int))
        except (ValueError, KeyError, TypeError, IndexError, RecursionError):
            return None
        return cls(type=kind, message=message, frames=parsed)


# Pace and Fingerprint are slotted: the coordinator decodes one of each per rank state, 16k a
# second at scale (see model.RankState).
@dataclass(frozen=True, slots=True)
class Pace:
    """How fast a rank progresses by its hook's own clock: the steady p99 of its recent gaps
    between progress (from the first optimizer step on), and how many gaps it measured. A gap is
    a duration, so the record travels from the hook to the coordinator as it is; *when* the rank
    last progressed is a time stamp of the node's clock beside it in the beacon
    (`BeaconSnapshot.progress_at`), which the agent turns into an age for its report."""

    gap_p99: float = 0.0
    gaps: int = 0


NO_PACE = Pace()


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """A digest of one DDP module's parameters after optimizer step `step` (of "parameters"), of
    the batch its forward received after that step ("batch"), or of the parameters an optimizer
    stepped after their gradients were averaged over `group` by hand ("optimizer"): equal on
    every replica that is in sync."""

    of: str  # one of layout.FINGERPRINT_OF
    group: str  # the DDP module's process group, or the one the gradients were averaged over
    module: int  # which DDP module (or optimizer) of its process, in the order first seen
    step: int
    digest: int


@dataclass(frozen=True, slots=True)
class Environment:
    """What a rank runs and how it set its process group up, recorded by its hook at
    init_process_group (and again when DDP first wraps a CUDA module): the coordinator compares
    ranks (ENV_MISMATCH, SHARED_DEVICE). A version is "" where the rank has none (CUDA, NCCL on
    a CPU build of torch)."""

    torch: str = ""
    cuda: str = ""  # torch.version.cuda
    nccl: str = ""  # torch.cuda.nccl.version(), as "2.21.5"
    python: str = ""
    watchdog: str = ""
    backend: str = ""  # as init_process_group was asked ("nccl", "cpu:gloo,cuda:nccl"); "default"
    world_size: int = 0  # as init_process_group was asked
    group_device: int = -1  # the CUDA device (index) its process group uses; -1: none known
    module_device: int = -1  # the CUDA device of the first DDP module on CUDA; -1: none
    visible_devices: str = ""  # CUDA_VISIBLE_DEVICES; "": not set


NO_ENVIRONMENT = Environment()


@dataclass(frozen=True)
class CheckState:
    """What the silent-bug checks of one rank found so far (hook/checks.py), as its beacon holds
    it. Not `model.CheckEvidence`, which the agent makes of it for a report: that one leaves out
    `taken` (only the agent uses it, to know when the fingerprints are new) and carries the
    fingerprints only while they are new, where this holds the latest ones always."""

    enabled: tuple[str, ...] = ()  # of layout.CHECK_NAMES
    taken: int = 0  # fingerprints taken so far: changes whenever one is added
    fingerprints: tuple[Fingerprint, ...] = ()
    unsynced_steps: int = 0  # optimizer steps, while no gradient collective was ever seen
    sampler_reuses: int = 0  # shuffling DistributedSampler iterations that repeated an epoch
    sampler_reuse_step: int = 0  # the step of the first
    sampler_epoch: int = 0  # ...and its epoch
    ddp_change_step: int = 0  # when a DDP module's parameters were first seen changed; 0: never
    ddp_change_module: int = 0
    ddp_change_group: str = ""
    ddp_change: str = ""  # what changed: "dtype of weight: torch.float32 -> torch.float64"
    nonfinite_step: int = -1  # the step of the first loss found NaN or infinite; -1: none yet
    nonfinite_value: float = 0.0  # ...that loss


NO_CHECKS = CheckState()


@dataclass(frozen=True)
class BeaconGroup:
    name: str
    # A group of the whole world is a range: never a list of its members, whatever world size
    # the beacon claims. Any other group lists at most layout.MAX_LISTED_RANKS.
    ranks: tuple[int, ...] | range
    op: str
    entered_seq: int
    entered_at: float
    completed_seq: int


@dataclass(frozen=True)
class BeaconHead:
    """What a beacon says of its writer, decoded alone (`reader.read_head`): enough to verify
    that writer before the rest of the beacon is decoded. Times as in `BeaconSnapshot`."""

    identity: Identity
    heartbeat: float
    exited_at: float


@dataclass(frozen=True)
class BeaconSnapshot:
    """One consistent copy of a rank's beacon (`reader.read_beacon`). Its times are unix seconds
    by the node's clock; 0 means never."""

    identity: Identity
    heartbeat: float
    steps: int
    step_at: float
    exit_state: int  # one of layout.EXIT_RUNNING, EXIT_CLEAN, EXIT_EXCEPTION
    exit_code: int
    exited_at: float
    phase: str
    phase_started: float
    phase_timeout: float
    groups: tuple[BeaconGroup, ...]
    progress_at: float = 0.0  # when the publisher last saw the event count change
    pace: Pace = NO_PACE
    compiling_since: float = 0.0  # when the compile under way (torch.compile) began; 0: none
    setup: Setup = NO_SETUP
    raised: RaisedException | None = None  # what ended it, when an exception did
    checks: CheckState = NO_CHECKS
    environment: Environment = NO_ENVIRONMENT  # until the rank calls init_process_group
    waited: float = 0.0  # seconds spent inside collectives, by the rank's own clock
    waited_sq: float = 0.0  # the sum of each step's seconds there, squared

    @property
    def events(self) -> int:
        """Monotonic count of everything recorded: it changes exactly when the rank progressed.
        Joining a process group counts: start-up is progress too."""
        return self.steps + sum(g.entered_seq + g.completed_seq + 1 for g in self.groups)

    @property
    def last_event_at(self) -> float:
        return max([self.step_at, *(g.entered_at for g in self.groups)])
