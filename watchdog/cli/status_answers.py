"""What `watchdog status` believes of an answer. Without --coordinator it asks every user's
`watchdog run` socket, and any user can put a socket there that answers anything: a job is
taken from a run's socket only when each rank it lists on this machine is a process of the
socket's owner (or gone), every job is checked to be status JSON before it is shown, and a job
id two sources answer is merged only where they list the same processes, so no answer can hide
another user's job."""

from __future__ import annotations

import os
import pwd
import socket
from collections.abc import Sequence
from typing import Any

from watchdog.schema import StatusJob

# The fields `watchdog status` shows, and the type each must have.
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "job_id": str, "state": str, "world_size": int, "nodes": list, "ranks": list,
    "rank_groups": list, "findings": list, "flagged": list, "verdict": (dict, type(None))}
_ROW_FIELDS: dict[str, type | tuple[type, ...]] = {"rank": int, "pid": int, "host": str,
                                                   "state": str}


def checked_jobs(answer: Any, owner: int | None) -> tuple[list[StatusJob], list[str]]:
    """The jobs of `answer` fit to show, and a note for each left out; `owner`: the uid of the
    run whose socket answered (None: a coordinator, trusted as its address and token are).
    Raises ValueError when the answer is not status JSON at all."""
    if not isinstance(answer, dict) or not isinstance(answer.get("jobs"), list):
        raise ValueError("not status JSON")
    jobs: list[StatusJob] = []
    notes: list[str] = []
    for job in answer["jobs"]:
        why = _malformed(job) or (None if owner is None else _foreign(job, owner))
        if why is None:
            jobs.append(job)
        else:
            notes.append(f"job {_job_id(job)!r}: {why}")
    return jobs, notes


def same_processes(a: StatusJob, b: StatusJob) -> bool:
    """Whether two answers for one job id list a process in common: the same job seen by two
    coordinators (a service agent also sees a `watchdog run`'s workers)."""
    return bool(_processes(a) & _processes(b))


def _malformed(job: Any) -> str | None:
    if not isinstance(job, dict):
        return "not a status job"
    for key, kind in _FIELDS.items():
        if not isinstance(job.get(key), kind) or isinstance(job.get(key), bool):
            return f"not a status job ({key!r} missing or of the wrong type)"
    for row in job["ranks"]:
        if not isinstance(row, dict) or any(not isinstance(row.get(key), kind)
                                            for key, kind in _ROW_FIELDS.items()):
            return "not a status job (a rank row without rank, pid, host or state)"
    return None


def _foreign(job: StatusJob, owner: int) -> str | None:
    """Why a run of `owner` may not answer for this job: a run watches its own ranks, on this
    machine, which are its user's processes."""
    here = socket.gethostname()
    for row in job["ranks"]:
        if row["host"] != here:
            return f"a `watchdog run` of user {_name(owner)} listed a rank of another host"
        uid = _pid_owner(row["pid"])
        if uid is not None and uid != owner:
            return f"its ranks are not the processes of user {_name(owner)}"
    return None


def _processes(job: StatusJob) -> set[tuple[str, int]]:
    return {(row["host"], row["pid"]) for row in job["ranks"]}


def _pid_owner(pid: int) -> int | None:
    if pid <= 0:
        return None
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None  # gone: an exited rank


def _job_id(job: Any) -> str:
    job_id = job.get("job_id") if isinstance(job, dict) else None
    return job_id[:64] if isinstance(job_id, str) else "?"


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def deduplicated(answers: Sequence[list[StatusJob]]) -> list[list[StatusJob]]:
    """Each answer's jobs less those an earlier answer showed (the same id and a process in
    common)."""
    shown: dict[str, list[StatusJob]] = {}
    out = []
    for jobs in answers:
        kept = [job for job in jobs
                if not any(same_processes(job, seen) for seen in shown.get(job["job_id"], ()))]
        for job in kept:
            shown.setdefault(job["job_id"], []).append(job)
        out.append(kept)
    return out
