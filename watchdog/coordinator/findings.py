"""Findings: bugs that never hang, from what each rank's checks gathered (coordinator process).

A hook sees one rank; comparing ranks happens here. The fingerprints of one DDP module (its
parameters after optimizer step S, or the batch its forward got after step S) are compared once
every member of the module's process group sent the one for step S: replicas in sync are
bitwise equal, so any difference is a desync, and ranks of one group that receive equal batches
share their data. Per-rank evidence (steps without a gradient collective, a sampler's repeated
epoch, a DDP module changed after wrapping) is reported once every rank that runs the check
shows it, or SETTLE_S after the first one did, whichever comes first.

Each finding is reported once per job and key. Findings live apart from the job's hang
incident: a job with a warning is still judged for hangs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from watchdog.coordinator.evidence import group_members
from watchdog.coordinator.wording import group_text
from watchdog.model import JobSnapshot, Kind, RankState
from watchdog.text import ranks_text

NO_SYNC_STEPS = 20  # optimizer steps without any gradient collective before NO_GRAD_SYNC
SETTLE_S = 3.0  # how long a per-rank finding waits for the other ranks to show it too
KEEP_STEPS = 8  # fingerprinted steps kept per DDP module and kind

CAUSES = {
    Kind.REPLICA_DESYNC: (
        "DDP broadcasts the parameters once, when it wraps the module, and then applies the "
        "same averaged gradients everywhere: replicas that differ now stay different. Weights "
        "were loaded or changed on some ranks after wrapping (or a parameter is updated outside "
        "backward and the optimizer, or DDP stopped synchronizing it).",
        "Load checkpoints and change parameters before wrapping the model in DDP, on every "
        "rank; or broadcast them from rank 0 afterwards (dist.broadcast of each parameter)."),
    Kind.NO_GRAD_SYNC: (
        "The ranks step their optimizers but no collective combines their gradients: no DDP "
        "or FSDP forward, no all_reduce or reduce_scatter. Each rank trains its own model on "
        "its share of the data.",
        "Wrap the model in DistributedDataParallel (or FSDP) before training; if the ranks "
        "average parameters on purpose every few hundred steps (local SGD), switch this check "
        "off with WATCHDOG_CHECKS=-no_grad_sync."),
    Kind.DUPLICATE_DATA: (
        "Ranks of one data-parallel group receive the same batches: the DataLoader has no "
        "DistributedSampler (or gives every rank the same rank or seed), so the job does "
        "the same work several times.",
        "Give the DataLoader a DistributedSampler(dataset) (it reads the rank and world size "
        "of the process group) and no shuffle=True of its own; call sampler.set_epoch(epoch) "
        "every epoch."),
    Kind.SAMPLER_EPOCH_REUSED: (
        "A shuffling DistributedSampler was iterated again with the epoch it had: its order "
        "depends only on the seed and the epoch, so every epoch repeats the first order.",
        "Call sampler.set_epoch(epoch) at the start of every epoch, before iterating the "
        "DataLoader."),
    Kind.DDP_MODULE_CHANGED: (
        "The parameters of a DDP module changed device, dtype or identity after it was "
        "wrapped (model.cuda(), model.half(), load_state_dict(assign=True) after DDP): DDP "
        "keeps synchronizing the tensors it found at construction, so the gradients of the "
        "new ones are no longer averaged.",
        "Move, cast or replace the model's parameters before wrapping it in "
        "DistributedDataParallel."),
}


@dataclass(frozen=True)
class Finding:
    kind: Kind
    key: str  # what it is about, within its job: each is reported once
    culprit_ranks: tuple[int, ...]
    step: int  # the first step it was seen at
    summary: str

    @property
    def cause(self) -> str:
        return CAUSES[self.kind][0]

    @property
    def fix(self) -> str:
        return CAUSES[self.kind][1]


def replica_culprits(digests: Mapping[int, int]) -> tuple[int, ...]:
    """The ranks whose replica differs from the most common one. Ties: the side that holds the
    lowest rank, where rank-0-only code lives; when no two ranks agree, every rank."""
    sides: dict[int, list[int]] = {}
    for rank in sorted(digests):
        sides.setdefault(digests[rank], []).append(rank)
    if len(sides) < 2:
        return ()
    if all(len(side) == 1 for side in sides.values()):
        return tuple(sorted(digests))
    lowest = min(digests)
    reference = max(sides.values(), key=lambda side: (len(side), lowest not in side))
    return tuple(rank for rank in sorted(digests) if rank not in reference)


def duplicated(digests: Mapping[int, int]) -> frozenset[int]:
    """The ranks whose digest another rank shares."""
    counts: dict[int, int] = {}
    for digest in digests.values():
        counts[digest] = counts.get(digest, 0) + 1
    return frozenset(rank for rank, digest in digests.items() if counts[digest] > 1)


PrintKey = tuple[str, str, int]  # of, group, module


@dataclass
class FindingTracker:
    """The findings of one job: evidence merged from its rank states, compared on demand."""

    reported: set[str] = field(default_factory=set)
    incidents: list[dict[str, object]] = field(default_factory=list)  # the warnings, in order
    # (of, group, module) -> step -> rank -> digest, the newest KEEP_STEPS steps
    _prints: dict[PrintKey, dict[int, dict[int, int]]] = field(default_factory=dict)
    _compared: dict[PrintKey, int] = field(default_factory=dict)  # the last step compared
    _duplicates: dict[PrintKey, tuple[int, frozenset[int]]] = field(default_factory=dict)
    _suspects: set[int] = field(default_factory=set)  # ranks with per-rank evidence
    _first_seen: dict[str, float] = field(default_factory=dict)
    _fresh: bool = False

    def observe(self, state: RankState) -> None:
        """Take one rank state's evidence; cheap when nothing new arrived."""
        evidence, rank = state.evidence, state.rank
        if evidence.fingerprints:  # sent in the few reports after the rank took a new one
            for fp in evidence.fingerprints:
                steps = self._prints.setdefault((fp.of, fp.group, fp.module), {})
                steps.setdefault(fp.step, {})[rank] = fp.digest
                if len(steps) > KEEP_STEPS:
                    del steps[min(steps)]
            self._fresh = True
        if (evidence.unsynced_steps >= NO_SYNC_STEPS or evidence.sampler_reuses
                or evidence.ddp_change_step):
            self._suspects.add(rank)
        else:
            self._suspects.discard(rank)

    @property
    def pending(self) -> bool:
        """Whether there is anything to evaluate."""
        return self._fresh or self._suspected

    @property
    def _suspected(self) -> bool:
        return bool(self._suspects) and any(kind.check not in self.reported
                                            for kind, *_ in _PER_RANK)

    def evaluate(self, snapshot: JobSnapshot, now: float) -> list[Finding]:
        """The findings not reported yet, as of `now`; each is marked reported."""
        found: list[Finding] = []
        if self._fresh:
            self._fresh = False
            found += self._compare(snapshot)
        if self._suspected:
            found += self._per_rank(snapshot, now)
        new = [f for f in found if f.key not in self.reported]
        self.reported.update(f.key for f in new)
        return new

    # -- fingerprints --
    def _compare(self, snapshot: JobSnapshot) -> list[Finding]:
        found = []
        for key, by_step in self._prints.items():
            of, group, _ = key
            kind = Kind.REPLICA_DESYNC if of == "parameters" else Kind.DUPLICATE_DATA
            members = _checking(snapshot, group_members(snapshot, group), kind.check)
            if len(members) < 2:
                continue
            for step in sorted(s for s in by_step if s > self._compared.get(key, -1)):
                digests = by_step[step]
                if all(m in digests for m in members):
                    self._compared[key] = step
                    compared = {m: digests[m] for m in members}
                    finding = (self._desync if of == "parameters" else self._duplicate)(
                        key, step, compared, members)
                    if finding is not None:
                        found.append(finding)
        return found

    @staticmethod
    def _desync(key: PrintKey, step: int, digests: Mapping[int, int],
                members: tuple[int, ...]) -> Finding | None:
        culprits = replica_culprits(digests)
        if not culprits:
            return None
        _, group, module = key
        others = [m for m in members if m not in culprits]
        differ = f"differ from {ranks_text(others)}'s" if others else "all differ"
        return Finding(Kind.REPLICA_DESYNC, f"{Kind.REPLICA_DESYNC}:{group}:{module}", culprits,
                       step, f"{ranks_text(culprits)}: the parameters of DDP module {module} "
                       f"{differ} at step {step}; the replicas of {group_text(group, members)} "
                       "are out of sync")

    def _duplicate(self, key: PrintKey, step: int, digests: Mapping[int, int],
                   members: tuple[int, ...]) -> Finding | None:
        """Equal batches at two checks in a row: once may be chance in a small dataset."""
        previous = self._duplicates.get(key)
        now = duplicated(digests)
        self._duplicates[key] = (step, now)
        if previous is None or not previous[1] & now:
            return None
        _, group, module = key
        culprits = tuple(sorted(previous[1] & now))
        return Finding(Kind.DUPLICATE_DATA, f"{Kind.DUPLICATE_DATA}:{group}:{module}", culprits,
                       previous[0], f"{ranks_text(culprits)} of {group_text(group, members)} "
                       f"received identical batches in DDP module {module}'s forward after "
                       f"steps {previous[0]} and {step}")

    # -- per-rank evidence --
    def _per_rank(self, snapshot: JobSnapshot, now: float) -> list[Finding]:
        found = []
        ranks = {r.rank: r for r in snapshot.ranks}
        everyone_reported = len(ranks) >= snapshot.world_size
        for kind, shows, step_of, say in _PER_RANK:
            if kind.check in self.reported or (kind is Kind.NO_GRAD_SYNC
                                               and snapshot.world_size < 2):
                continue
            eligible = _checking(snapshot, sorted(ranks), kind.check)
            culprits = tuple(r for r in eligible if shows(ranks[r]))
            if not culprits:
                self._first_seen.pop(kind.check, None)
                continue
            first = self._first_seen.setdefault(kind.check, now)
            settled = culprits == eligible and everyone_reported
            if not settled and now - first < SETTLE_S:
                continue
            step = min(step_of(ranks[r]) for r in culprits)
            found.append(Finding(kind, kind.check, culprits, step,
                                 say(culprits, step, ranks[culprits[0]])))
        return found


def _checking(snapshot: JobSnapshot, ranks: Iterable[int], check: str) -> tuple[int, ...]:
    """Those of `ranks` whose hook runs `check`, or that did not report yet."""
    idle = {r.rank for r in snapshot.ranks if check not in r.evidence.checks}
    return tuple(r for r in ranks if r not in idle)


def _no_sync_text(culprits: tuple[int, ...], step: int, _: RankState) -> str:
    return (f"{ranks_text(culprits)} stepped their optimizers from step {step} on with no "
            f"gradient collective for {NO_SYNC_STEPS} steps or more: each rank trains its own "
            "model")


def _sampler_text(culprits: tuple[int, ...], step: int, rank: RankState) -> str:
    return (f"{ranks_text(culprits)} iterated a shuffling DistributedSampler again with epoch "
            f"{rank.evidence.sampler_epoch} at step {step}: every epoch repeats one order")


def _change_text(culprits: tuple[int, ...], step: int, rank: RankState) -> str:
    e = rank.evidence
    return (f"DDP module {e.ddp_change_module} on {ranks_text(culprits)} changed after "
            f"wrapping ({e.ddp_change}), seen at step {step}: its gradients are no longer "
            "averaged")


_PER_RANK: tuple[tuple[Kind, Callable[[RankState], bool], Callable[[RankState], int],
                       Callable[[tuple[int, ...], int, RankState], str]], ...] = (
    (Kind.NO_GRAD_SYNC, lambda r: r.evidence.unsynced_steps >= NO_SYNC_STEPS,
     lambda r: r.steps - r.evidence.unsynced_steps + 1, _no_sync_text),
    (Kind.SAMPLER_EPOCH_REUSED, lambda r: r.evidence.sampler_reuses > 0,
     lambda r: r.evidence.sampler_reuse_step, _sampler_text),
    (Kind.DDP_MODULE_CHANGED, lambda r: r.evidence.ddp_change_step > 0,
     lambda r: r.evidence.ddp_change_step, _change_text),
)
