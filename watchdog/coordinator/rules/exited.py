"""Rule 1, RANK_EXITED, judged at any time: the first rank to exit while its peers still needed
it (a clean exit 0 counts only once a peer waits for it or the job stalled).

Ranks that raised the same exception type at the same place of the user's code are one bug,
blamed together ("all 4 ranks raised ..."); an exception that says a peer went away (explain's
PEER_EXITED) is never grouped: every victim of one death raises it alike. A rank interrupted
(KeyboardInterrupt, SIGINT) is never blamed: the user ended it.
"""

from __future__ import annotations

from collections.abc import Sequence

from watchdog.coordinator.evidence import DeadWorker, dead_worker, finished_cleanly, latest_pending
from watchdog.coordinator.membership import awaited_collective
from watchdog.explain.advice import PEER_EXITED
from watchdog.explain.scan import classify_line
from watchdog.frames import frame_site, stuck_frame
from watchdog.model import Advice, ExitReason, Frame, JobSnapshot, Kind, RankState, Verdict
from watchdog.text import clock, ranks_text

MESSAGE_CHARS = 200  # of an exception's message in a summary: its first line, cut here


def judge(snapshot: JobSnapshot) -> Verdict | None:
    exited = sorted((r for r in snapshot.ranks if not r.alive), key=_exit_order)
    if any(map(_interrupted, exited)):
        # Someone pressed Ctrl-C (torchrun passes SIGINT on to every worker): the ranks that
        # raised KeyboardInterrupt, and the peers that lost them, ended because they were asked.
        exited = [r for r in exited if not _interrupted(r) and not _lost_a_peer(r)]
    if not exited or not _still_needed(snapshot, exited[0]):
        return None
    first = exited[0]
    alike = _raised_alike(first, exited)
    blamed = {r.rank for r in alike}
    peers = [r for r in snapshot.ranks if r.rank not in blamed]
    # Peers that died after it (their connection dropped) still show where they waited.
    awaited = (awaited_collective(snapshot, peer, first) for peer in peers)
    if len(alike) > 1 and first.exit_reason is not None:
        culprits = sorted(blamed)
        summary = all_raised_text(first.exit_reason, culprits,
                                  max(snapshot.world_size, len(snapshot.ranks)))
        if peers:
            summary += f"; {ranks_text(r.rank for r in peers)} still needed them"
    else:
        culprits = [first.rank]
        summary = f"{exit_text(first)} while {ranks_text(r.rank for r in peers)} still needed it"
    return Verdict(
        Kind.RANK_EXITED,
        summary,
        tuple(culprits),
        tuple(r.rank for r in peers if latest_pending(r) is not None),
        next((ref for ref in awaited if ref is not None), None),
        advice=exit_advice(first),
    )


def _raised_alike(first: RankState, exited: Sequence[RankState]) -> list[RankState]:
    """The exited ranks that raised what `first` raised, at the same place of the user's code:
    one bug that every rank running that code hits, not a rank to blame. Only `first` when it
    raised nothing, lost a peer (every victim raises that alike), or its place is unknown."""
    key = _raise_site(first)
    if key is None:
        return [first]
    return [rank for rank in exited if _raise_site(rank) == key]


def _raise_site(rank: RankState) -> tuple[str, Frame] | None:
    """(exception type, innermost frame of the user's own code) of what the rank raised."""
    reason = rank.exit_reason
    if reason is None or not reason.exception or _lost_a_peer(rank):
        return None
    frame = stuck_frame(reason.frames)
    return None if frame is None else (reason.exception, frame)


def _exit_order(rank: RankState) -> tuple[bool, float, int]:
    """By time, except that a rank that raised because a peer closed its connection comes after
    the ranks that ended for reasons of their own. The kernel dates a killed process's exit when
    its last thread is gone, which can be after its sockets closed and a peer raised: 16 ms
    after, once, on a loaded machine."""
    return (_lost_a_peer(rank), rank.exited_at or 0.0, rank.rank)


def _interrupted(rank: RankState) -> bool:
    reason = rank.exit_reason
    return reason is not None and (reason.exception == "KeyboardInterrupt"
                                   or reason.signal == "SIGINT")


def _lost_a_peer(rank: RankState) -> bool:
    advice = exit_advice(rank)
    return advice is not None and advice.category == PEER_EXITED


def _still_needed(snapshot: JobSnapshot, first: RankState) -> bool:
    others = [r for r in snapshot.ranks if r.rank != first.rank]
    if any(not r.alive and not finished_cleanly(r) for r in others):
        return True
    alive = [r for r in others if r.alive]
    if not alive:
        return False  # every rank is gone and the others finished: a normal end
    if not finished_cleanly(first):
        return True
    # A clean early finish is normal while peers keep running; it hurts once they wait for it.
    return snapshot.stalled or any(awaited_collective(snapshot, peer, first) for peer in alive)


def exit_text(rank: RankState) -> str:
    """How a rank left: 'rank 1 raised RuntimeError: shard 7 is corrupt at train.py:88 and
    exited first at 12:00:03 (exit code 1, no clean shutdown)', 'rank 2 was killed by SIGKILL
    (the kernel's OOM killer) at 12:00:03, the first to exit,' or, without a known reason,
    'rank 3 exited first at 12:00:03 (exit code 0, clean shutdown)'."""
    reason, at = rank.exit_reason, clock(rank.exited_at or 0.0)
    code = "killed/unknown exit code" if rank.exit_code is None else f"exit code {rank.exit_code}"
    how = f"({code}, {'clean shutdown' if rank.clean_exit else 'no clean shutdown'})"
    dead = dead_worker(reason)
    if reason is not None and dead is not None:
        frame = stuck_frame(reason.frames)
        where = f" at {frame_site(frame)}" if frame is not None else ""
        return (f"rank {rank.rank}'s {dead_worker_text(dead)}; rank {rank.rank} raised "
                f"{reason.exception}{where} and exited first at {at} {how}")
    if reason is not None and reason.exception:
        return f"rank {rank.rank} raised {raised_text(reason)} and exited first at {at} {how}"
    if reason is not None and reason.signal:
        killer = " (the kernel's OOM killer)" if reason.oom_killed else ""
        return f"rank {rank.rank} was killed by {reason.signal}{killer} at {at}, the first to exit,"
    return f"rank {rank.rank} exited first at {at} {how}"


def all_raised_text(reason: ExitReason, ranks: Sequence[int], world_size: int) -> str:
    """Ranks that raised the same exception at the same place: 'all 4 ranks raised ValueError:
    sampler option is mutually exclusive with shuffle at train.py:262: a bug in the code, not a
    rank to blame', or 'ranks 1-3 all raised ...' when some rank of the job did not."""
    who = f"all {len(ranks)} ranks" if len(ranks) >= world_size else f"{ranks_text(ranks)} all"
    return f"{who} raised {raised_text(reason)}: a bug in the code, not a rank to blame"


def raised_text(reason: ExitReason) -> str:
    """'RuntimeError: shard 7 is corrupt at train.py:88': the type, the message's first line
    (cut at MESSAGE_CHARS) and the innermost frame of the user's own code."""
    message = reason.message.strip().split("\n", 1)[0]
    if len(message) > MESSAGE_CHARS:
        message = message[:MESSAGE_CHARS] + "..."
    frame = stuck_frame(reason.frames)
    where = f" at {frame_site(frame)}" if frame is not None else ""
    return f"{reason.exception}: {message}{where}"


def dead_worker_text(dead: DeadWorker) -> str:
    """'DataLoader worker (pid 4242) was killed by SIGKILL (the kernel's OOM killer)',
    'DataLoader worker (pid 4242) died (exit code 1)'. The OOM killer is named where the rank's
    memory cgroup counted a kill while it ran."""
    if dead.signal:
        killer = " (the kernel's OOM killer)" if dead.oom_killed else ""
        return f"DataLoader worker (pid {dead.pid}) was killed by {dead.signal}{killer}"
    code = "" if dead.exit_code is None else f" (exit code {dead.exit_code})"
    oom = ", the kernel's OOM killer killed a process of its memory cgroup" if (
        dead.oom_killed) else ""
    return f"DataLoader worker (pid {dead.pid}) died{code}{oom}"


def exit_advice(rank: RankState) -> Advice | None:
    """What `watchdog explain` says of the exception the rank raised, if it knows it."""
    reason = rank.exit_reason
    if reason is None or not reason.exception:
        return None
    finding = classify_line(0, f"{reason.exception}: {reason.message}"[:4096])
    return None if finding is None else Advice(finding.category, finding.cause, finding.fix)
