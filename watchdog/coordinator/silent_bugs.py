"""Findings: bugs that never hang, from what each rank's checks gathered (coordinator process).

A hook sees one rank; comparing ranks happens here. The fingerprints of one DDP module (its
parameters after optimizer step S, or the batch its forward got after step S), or of the
parameters an optimizer stepped after their gradients were averaged over a group by hand, are
compared once every member of the process group sent the one for step S: replicas in sync are
bitwise equal, so any difference is a desync, and ranks of one group that receive equal batches
share their data. A non-finite loss is named once every other rank's loss of that step was
read finite (their step count went past it), or SETTLE_S after it was first seen. Per-rank
evidence (steps before any gradient collective, a sampler's repeated epoch, a DDP module
changed after wrapping) is reported once every rank that runs the check shows it, or SETTLE_S
after the first one did, whichever comes first. So are the ranks' environments, recorded once
at start (`environment`): compared once every rank sent one, or SETTLE_S after the first did,
and again whenever another arrives.

Each finding is reported once per job and key. Findings live apart from the job's hang
incident: a job with a warning is still judged for hangs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from watchdog.coordinator import environment
from watchdog.coordinator.environment import Noted
from watchdog.coordinator.membership import group_members
from watchdog.coordinator.sides import replica_culprits
from watchdog.coordinator.wording import group_text
from watchdog.model import JobSnapshot, Kind, RankState
from watchdog.schema import Incident
from watchdog.text import ranks_text

NO_SYNC_STEPS = 20  # optimizer steps before any gradient collective, for NO_GRAD_SYNC
SETTLE_S = 3.0  # how long a per-rank finding waits for the other ranks to show it too
KEEP_STEPS = 8  # fingerprinted steps kept per DDP module (or averaging group) and kind

CAUSES = {
    Kind.REPLICA_DESYNC: (
        "Replicas whose gradients are averaged (by DDP, by FSDP's replicate dimension, by an "
        "all_reduce of each gradient) apply the same update everywhere: replicas that differ "
        "now stay different. They started from different weights (each rank seeded its own, "
        "and nothing broadcast rank 0's: DDP does once, when it wraps the module), or weights "
        "were loaded or changed on some ranks after wrapping (or a parameter is updated "
        "outside backward and the optimizer, or DDP stopped synchronizing it).",
        "Start every rank from the same weights: seed the model alike on every rank, or "
        "broadcast rank 0's parameters (dist.broadcast of each) before the first step; load "
        "checkpoints and change parameters before wrapping the model in DDP, on every rank."),
    Kind.NO_GRAD_SYNC: (
        "The ranks step their optimizers but no collective combines their gradients: no DDP "
        "or FSDP forward, no all_reduce or reduce_scatter. Each rank trains its own model on "
        "its share of the data.",
        "Wrap the model in DistributedDataParallel (or FSDP) before training; if the ranks "
        "average parameters on purpose (local SGD) but only after their first 20 steps, "
        "switch this check off with WATCHDOG_CHECKS=-no_grad_sync."),
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
    Kind.NONFINITE_LOSS: (
        "The loss of one rank turned NaN or infinite while its peers' were finite: its batch "
        "(a corrupt sample, a label out of range, an empty mask), or its own state, made it so. "
        "Once its gradients are averaged, every rank's weights turn non-finite at the next "
        "step, so only the first rank and step say where it came from.",
        "Look at that rank's batch at that step (log the sample indices of the batch it got); "
        "guard the loss (torch.isfinite) or clip gradients only once the cause is known."),
    **environment.CAUSES,
    Kind.STRAGGLER: (
        "Every rank waits for the slowest at each collective, so one slow rank makes every "
        "step as long as its own: its data (a shard that decodes slowly, a slow disk), its "
        "compute (a throttled or shared GPU, a noisy neighbour on its CPUs) or its network. "
        "The summary says where it spends the time the others wait.",
        "Look at the slow rank where the summary says: its data (more DataLoader workers, a "
        "local copy of its shard), its device (clocks, temperature, other processes on it) or "
        "its host. A notice, never acted on: the job is not hung."),
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
    incidents: list[Incident] = field(default_factory=list)  # the warnings, in order
    # (of, group, module) -> step -> rank -> digest, the newest KEEP_STEPS steps
    _prints: dict[PrintKey, dict[int, dict[int, int]]] = field(default_factory=dict)
    _compared: dict[PrintKey, int] = field(default_factory=dict)  # the last step compared
    _duplicates: dict[PrintKey, tuple[int, frozenset[int]]] = field(default_factory=dict)
    _suspects: set[int] = field(default_factory=set)  # ranks with per-rank evidence
    _first_seen: dict[str, float] = field(default_factory=dict)
    _fresh: bool = False
    _nonfinite: bool = False  # a rank's loss turned non-finite, and that is not decided yet
    _nonfinite_decided: bool = False
    _environments: dict[int, Noted] = field(default_factory=dict)  # rank -> as last sent
    _environments_new: bool = False  # some arrived since they were last compared

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
        if state.environment is not None:
            noted = Noted(state.host, state.local_rank, state.environment)
            if self._environments.get(rank) != noted:
                self._environments[rank] = noted
                self._environments_new = True
        if evidence.nonfinite_step >= 0 and not self._nonfinite_decided:
            self._nonfinite = True
        if (evidence.unsynced_steps >= NO_SYNC_STEPS or evidence.sampler_reuses
                or evidence.ddp_change_step):
            self._suspects.add(rank)
        else:
            self._suspects.discard(rank)

    @property
    def pending(self) -> bool:
        """Whether there is anything to evaluate."""
        return self._fresh or self._suspected or self._nonfinite or self._environments_new

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
        if self._nonfinite:
            found += self._first_nonfinite(snapshot, now)
        if self._environments_new:
            found += self._set_up(snapshot, now)
        new = []
        for finding in found:  # two checks read at once may find one thing twice: the first counts
            if finding.key not in self.reported:
                self.reported.add(finding.key)
                new.append(finding)
        return new

    # -- fingerprints --
    def _compare(self, snapshot: JobSnapshot) -> list[Finding]:
        found = []
        for key, by_step in self._prints.items():
            of, group, _ = key
            kind = Kind.DUPLICATE_DATA if of == "batch" else Kind.REPLICA_DESYNC
            members = _checking(snapshot, group_members(snapshot, group), kind.check)
            if len(members) < 2:
                continue
            for step in sorted(s for s in by_step if s > self._compared.get(key, -1)):
                digests = by_step[step]
                if all(m in digests for m in members):
                    self._compared[key] = step
                    compared = {m: digests[m] for m in members}
                    finding = (self._duplicate if of == "batch" else self._desync)(
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
        of, group, module = key
        others = [m for m in members if m not in culprits]
        differ = f"differ from {ranks_text(others)}'s" if others else "all differ"
        what, key_text = f"the parameters of DDP module {module}", str(module)
        if of == "optimizer":
            what = f"the parameters optimizer {module} steps (gradients averaged by hand)"
            key_text = f"optimizer{module}"
        return Finding(Kind.REPLICA_DESYNC, f"{Kind.REPLICA_DESYNC}:{group}:{key_text}",
                       culprits, step, f"{ranks_text(culprits)}: {what} {differ} at step "
                       f"{step}; the replicas of {group_text(group, members)} are out of sync")

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

    # -- environments --
    def _set_up(self, snapshot: JobSnapshot, now: float) -> list[Finding]:
        """The set-up findings, once every rank's environment arrived or SETTLE_S after the
        first did: compared sooner, a few early ranks could make the wrong side the majority."""
        first = self._first_seen.setdefault("environment", now)
        if len(self._environments) < snapshot.world_size and now - first < SETTLE_S:
            return []
        self._environments_new = False
        mismatch = environment.env_mismatch(self._environments)
        found = [*([mismatch] if mismatch else []),
                 *environment.shared_devices(self._environments)]
        return [Finding(f.kind, f.key, f.culprit_ranks, 0, f.summary) for f in found]

    # -- losses --
    def _first_nonfinite(self, snapshot: JobSnapshot, now: float) -> list[Finding]:
        """The ranks whose loss turned non-finite first, once the others' loss of that step was
        read finite (a rank's published step count past a step says its loss was read) or
        SETTLE_S after it was first seen; none when it turned so on every rank at once."""
        kind = Kind.NONFINITE_LOSS
        ranks = [r for r in snapshot.ranks if kind.check in r.evidence.checks]
        bad = [r for r in ranks if r.evidence.nonfinite_step >= 0]
        if not bad:
            return []
        step = min(r.evidence.nonfinite_step for r in bad)
        culprits = tuple(sorted(r.rank for r in bad if r.evidence.nonfinite_step == step))
        finite = [r.rank for r in ranks if r.rank not in culprits and r.steps > step]
        first = self._first_seen.setdefault(kind.check, now)
        if len(finite) + len(culprits) < snapshot.world_size and now - first < SETTLE_S:
            return []
        self._nonfinite, self._nonfinite_decided = False, True
        if not finite:
            return []
        value = next(r for r in bad if r.rank == culprits[0]).evidence.nonfinite_value
        return [Finding(kind, kind.check, culprits, step,
                        f"{ranks_text(culprits)}: the loss was {_number(value)} at step {step} "
                        f"while {ranks_text(sorted(finite))}'s were finite (the job's first "
                        "non-finite loss)")]

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


def _number(value: float) -> str:
    return "NaN" if math.isnan(value) else str(value)  # inf, -inf


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
