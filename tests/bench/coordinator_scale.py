"""How the coordinator scales (a script, not a test): `python -m tests.bench.coordinator_scale`.

For each job size (ranks, 8 per node) and each way of sending the world group's member list
("full": every rank lists all world_size members; "compact": the list left empty, which the
coordinator reads as range(world_size) for group "0"; a hook lists at most MAX_LISTED_RANKS):

live: a real coordinator process (Coordinator + start_server on loopback) and a load-generator
   process playing one agent per node, one Connect stream each, reporting at 1 Hz with DDP's
   all_reduce advancing (a report that says only that every rank progressed held back once,
   as the real agent does: agent/holdback.py). Measured over a steady window: what the coordinator
   ingested (reports/s and rank states/s), its CPU (cores) and RSS; then cProfile over a
   second window. Then the job hangs (one rank stops, the others wait in the next all_reduce;
   the agents answer stack requests) and the coordinator's own timestamps give: the cost of
   the evaluation tick that detected the stall, the stack round trip, detection -> incident,
   and hang -> incident.
in-process (CPU time of one process, so that other load on the machine does not count): the
   coordinator's decoding of node reports and its ingest, per rank state; one evaluation tick of
   a healthy job; then a JobView filled with every rank's state, stalled; timed: the detection
   (the evaluation tick that finds the job stalled and starts its diagnosis; and, for comparison
   only, `decide` on a snapshot without stacks, which a stalled job never gets), the diagnosis
   (the snapshot with every rank's stack, decoded as the agents send them, `decide`,
   `build_incident`), the store, and `watchdog status` for the job (job_status + json.dumps).
   Each stage has a cap; a stage past it is reported as '>cap' with an estimate from the
   smaller sizes. The stages run with the coordinator's own garbage-collection policy.

Everything it starts runs in child processes that are stopped on exit, error or not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import functools
import json
import math
import multiprocessing
import os
import pstats
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psutil

from tests.helpers.loadgen import (
    RANKS_PER_NODE,
    REPORT_INTERVAL_S,
    SimJob,
    ask,
    run_agents,
    serve_coordinator,
)
from watchdog.coordinator.garbage_collection import sparing_full_collections
from watchdog.coordinator.incident import build_incident
from watchdog.coordinator.service import Coordinator
from watchdog.coordinator.sqlite_store import SqliteStore
from watchdog.coordinator.stall import StallPolicy
from watchdog.coordinator.store import incident_json
from watchdog.coordinator.verdict import decide
from watchdog.model import Kind, NodeReport, RankStack, StackReply
from watchdog.transport import wire as _wire
from watchdog.transport.proto import watchdog_pb2 as pb

REPO = Path(__file__).resolve().parents[2]

STALL_TIMEOUT_S = 5.0
SETTLE_S = 2.0  # after every rank is known, before measuring
# Issue 23's targets: in-process at the largest size, live at the largest live size.
TARGET_CORES = 1.0  # decode and ingest at 1 Hz
TARGET_VERDICT_S = 1.0  # detect + diagnose
TARGET_INCIDENT_MIB = 10.0
TARGET_STORE_S = 0.5
TARGET_STATUS_S = 1.0
TARGET_LIVE_CORES = 0.3
STAGES = ("decode", "ingest", "tick", "detect", "diagnose", "store", "status")
DECODE_INTS = 2_000_000  # full lists: decode a sample of reports holding about this many members
MIB = 1 << 20
_spawn = multiprocessing.get_context("spawn")


class Child:
    """A spawned process with a command pipe; stopped (terminate, then kill) on exit."""

    def __init__(self, target: Callable[..., None], *args: Any) -> None:
        self.conn, child_end = _spawn.Pipe()
        self.process = _spawn.Process(target=target, args=(child_end, *args), daemon=True)

    def __enter__(self) -> Child:
        self.process.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)

    @property
    def ps(self) -> psutil.Process:
        assert self.process.pid is not None
        return psutil.Process(self.process.pid)


# --- live: coordinator process + load generator process ---------------------------------------


@dataclass
class Live:
    ranks: int
    variant: str
    known: int = 0
    ramp_s: float = math.nan
    sent: float = math.nan  # rank states/s the agents sent
    reports: float = math.nan  # reports/s the coordinator ingested
    states: float = math.nan  # rank states/s the coordinator ingested
    coord_cores: float = math.nan
    loop_cores: float = math.nan  # the coordinator's main thread: asyncio loop, all Python
    agent_cores: float = math.nan
    busy_cores: float = math.nan  # the whole machine
    rss_mib: float = math.nan
    detect_tick_s: float = math.nan
    stacks_s: float = math.nan
    detect_to_incident_s: float = math.nan
    hang_to_incident_s: float = math.nan
    verdict: str = "-"
    right: bool = False  # MISSING_RANKS naming the culprit alone
    note: str = ""


def run_live(ranks: int, compact: bool, args: argparse.Namespace, profile: str | None) -> Live:
    live = Live(ranks, "compact" if compact else "full")
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        coord = stack.enter_context(
            Child(serve_coordinator, os.path.join(tmp, "incidents.db"), STALL_TIMEOUT_S))
        if not coord.conn.poll(60):
            live.note = "coordinator did not start"
            return live
        address = f"127.0.0.1:{coord.conn.recv()}"
        agents = stack.enter_context(
            Child(run_agents, address, ranks, compact, args.nodes_per_channel))
        if _ramp(live, coord, args) and _window(live, coord, agents, args):
            if profile is not None:
                _profile(coord, profile, args)
            _hang(live, coord, agents, args)
        sent = ask(agents.conn, 10, "stats")
        if sent and sent["failed_streams"]:
            live.note += (f"{sent['failed_streams']} agent streams failed and were reopened "
                          f"({', '.join(sorted(set(sent['stream_errors'])))}); ")
    return live


def _ramp(live: Live, coord: Child, args: argparse.Namespace) -> bool:
    """Wait until the coordinator knows every rank (or the ramp cap passes); False to give up."""
    start = time.monotonic()
    while live.known < live.ranks and time.monotonic() - start < args.ramp_cap:
        stats = ask(coord.conn, 30, "stats")
        if stats is None:
            live.note += "coordinator unresponsive during ramp; "
            return False
        live.known = stats["ranks_known"]
        if not _sleep_watching(live, coord, 0.5, args):
            return False
    live.ramp_s = time.monotonic() - start
    live.note += f"{live.known}/{live.ranks} ranks known after {live.ramp_s:.0f} s; "
    return _sleep_watching(live, coord, SETTLE_S, args)


def _window(live: Live, coord: Child, agents: Child, args: argparse.Namespace) -> bool:
    cps, aps = coord.ps, agents.ps
    cps.cpu_percent(None)
    aps.cpu_percent(None)
    psutil.cpu_percent(None)
    c0, a0, t0 = ask(coord.conn, 30, "stats"), ask(agents.conn, 30, "stats"), time.monotonic()
    loop0 = _thread_seconds(cps, cps.pid)
    if not _sleep_watching(live, coord, args.window, args):
        return False
    c1, a1, t1 = ask(coord.conn, 30, "stats"), ask(agents.conn, 30, "stats"), time.monotonic()
    live.coord_cores, live.agent_cores = cps.cpu_percent(None) / 100, aps.cpu_percent(None) / 100
    live.loop_cores = (_thread_seconds(cps, cps.pid) - loop0) / (t1 - t0)
    live.busy_cores = psutil.cpu_percent(None) / 100 * (psutil.cpu_count() or 1)
    live.rss_mib = cps.memory_info().rss / MIB
    if None in (c0, a0, c1, a1):
        live.note += "unresponsive during the window; "
        return False
    live.reports = (c1["reports"] - c0["reports"]) / (t1 - t0)
    live.states = (c1["rank_states"] - c0["rank_states"]) / (t1 - t0)
    live.sent = (a1["reports"] - a0["reports"]) * RANKS_PER_NODE / (t1 - t0)
    live.known = c1["ranks_known"]
    return True


def _thread_seconds(process: psutil.Process, thread_id: int) -> float:
    return next(t.user_time + t.system_time for t in process.threads() if t.id == thread_id)


def _profile(coord: Child, path: str, args: argparse.Namespace) -> None:
    if ask(coord.conn, 30, "profile_on") is not None:
        time.sleep(args.profile_window)
        ask(coord.conn, 60, "profile_off", path)


def _hang(live: Live, coord: Child, agents: Child, args: argparse.Namespace) -> None:
    if live.known < live.ranks:
        live.note += "hang skipped: not every rank known; "
        return
    hung_at = ask(agents.conn, 30, "hang")
    if hung_at is None:
        live.note += "the load generator did not answer; "
        return
    deadline = time.monotonic() + STALL_TIMEOUT_S + REPORT_INTERVAL_S + args.verdict_cap
    stats: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        stats = ask(coord.conn, max(0.1, deadline - time.monotonic()), "stats")
        if stats is None or stats["incidents"]:
            break
        time.sleep(0.1)
    waited = STALL_TIMEOUT_S + REPORT_INTERVAL_S + args.verdict_cap
    if stats is None:
        live.note += f"coordinator busy (no answer) until {waited:.0f} s after the hang; "
        return
    if stats["detections"]:
        detected_at, live.detect_tick_s = stats["detections"][0]
    if stats["gathers"]:
        live.stacks_s = stats["gathers"][0]
    if not stats["incidents"]:
        live.note += f"no incident {waited:.0f} s after the hang; "
        return
    incident = stats["incidents"][0]
    live.hang_to_incident_s = incident["at"] - hung_at
    if stats["detections"]:
        live.detect_to_incident_s = incident["at"] - detected_at
    culprit = SimJob(live.ranks, compact=True, started_at=0.0).culprit
    right = live.right = (incident["kind"] == Kind.MISSING_RANKS
                          and incident["culprits"] == [culprit])
    live.verdict = (f"{incident['kind']} {'culprit ok' if right else incident['culprits']}, "
                    f"{incident['stacks']} stacks, {incident['json_bytes'] / MIB:.1f} MiB")


def _sleep_watching(live: Live, coord: Child, seconds: float, args: argparse.Namespace) -> bool:
    """Sleep, checking the coordinator's memory; False once it passed the cap."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        rss = coord.ps.memory_info().rss
        if rss > args.rss_cap_gib * (1 << 30):
            live.rss_mib = rss / MIB
            live.note += f"stopped: coordinator RSS passed {args.rss_cap_gib} GiB; "
            return False
        time.sleep(min(left, 0.5))
    return True


# --- in-process: ingest, the evaluation tick and the verdict path on a full JobView ------------


def inproc_stages(conn: Connection, ranks: int, compact: bool, profile: str | None) -> None:
    """Child process: send (stage, seconds, *detail) as each stage completes."""
    with tempfile.TemporaryDirectory() as tmp, sparing_full_collections():
        store = SqliteStore(os.path.join(tmp, "incidents.db"))
        coordinator = Coordinator(store, StallPolicy(fixed=STALL_TIMEOUT_S))
        sim = SimJob(ranks, compact, started_at=time.time() - 600)
        _time_ingest(conn, coordinator, sim)
        _time_diagnosis(conn, coordinator, sim, profile)
        store.close()


def _time_ingest(conn: Connection, coordinator: Coordinator, sim: SimJob) -> None:
    now = time.time()
    reports = [sim.report(node, now) for node in range(sim.nodes)]
    conn.send(("decode", *_decode_cost(reports, sim.compact)))
    start = time.process_time()
    for report in reports:
        coordinator.ingest(report, now)
    conn.send(("ingest", (time.process_time() - start) / sim.world_size))
    ticks = []
    for _ in range(5):  # each right after fresh reports: silent nodes skip the evaluation
        for report in reports:
            coordinator.ingest(report, now)
        ticks.append(_seconds(lambda: coordinator.evaluate_all(now)))
    conn.send(("tick", min(ticks), coordinator.tick))


def _time_diagnosis(conn: Connection, coordinator: Coordinator, sim: SimJob,
                    profile: str | None) -> None:
    # The job hangs now, after the progress the ingest stage reported, and is judged later.
    sim.hung_at = time.time()
    now = sim.hung_at + STALL_TIMEOUT_S + 3
    for node in range(sim.nodes):
        coordinator.ingest(sim.report(node, now), now)
    job = coordinator.jobs[sim.job_id]
    job.observe(now - STALL_TIMEOUT_S - 2)  # the last change seen: stalled at `now`
    tick = asyncio.run(_detection_tick(coordinator, now))
    conn.send(("detect", tick, _seconds(lambda: decide(job.snapshot(now)))))

    stacks = {stack.rank: stack for node in range(sim.nodes) for stack in _sent_stacks(sim, node)}
    profiler = cProfile.Profile()
    if profile:
        profiler.enable()
    start = time.process_time()
    snapshot = job.snapshot(now, stacks)
    verdict = decide(snapshot)
    decided = time.process_time()
    assert verdict is not None and verdict.culprit_ranks == (sim.culprit,), verdict
    incident = build_incident(snapshot, verdict, "bench", now)
    built = time.process_time()
    profiler.disable()
    if profile:
        profiler.dump_stats(profile)
    conn.send(("diagnose", built - start, decided - start, built - decided))
    conn.send(("store", _seconds(lambda: coordinator.store.add(incident)),
               len(incident_json(incident))))
    conn.send(("status", _seconds(lambda: json.dumps(coordinator.job_status(job, now)))))


async def _detection_tick(coordinator: Coordinator, now: float) -> float:
    """CPU seconds of the evaluation tick that finds the job stalled; the diagnosis it starts
    is cancelled (the next stages time it)."""
    start = time.process_time()
    diagnoses = coordinator.evaluate_all(now)
    seconds = time.process_time() - start
    assert diagnoses, "the tick did not find the job stalled"
    for task in diagnoses:
        task.cancel()
    await asyncio.gather(*diagnoses, return_exceptions=True)
    return seconds


def _sent_stacks(sim: SimJob, node: int) -> tuple[RankStack, ...]:
    """A node's stacks as the coordinator reads its agent's reply to a stack request."""
    first = node * RANKS_PER_NODE
    reply = StackReply(1, sim.node_name(node),
                       tuple(sim.stack(rank) for rank in range(first, first + RANKS_PER_NODE)))
    decoded = _wire.agent_message_from_pb(_wire.stacks_to_pb(reply))
    assert isinstance(decoded, StackReply)
    return decoded.stacks


def _decode_cost(reports: list[NodeReport], compact: bool) -> tuple[float, int]:
    """Seconds per rank state to parse and convert node reports as the coordinator does (on a
    sample of them), and the bytes of one report."""
    world_size = len(reports) * RANKS_PER_NODE
    sample = len(reports) if compact else max(4, DECODE_INTS // (RANKS_PER_NODE * world_size))
    raws = [_wire.report_to_pb(report).SerializeToString() for report in reports[:sample]]
    start = time.process_time()
    for raw in raws:
        _wire.agent_message_from_pb(pb.AgentMessage.FromString(raw))
    return (time.process_time() - start) / (len(raws) * RANKS_PER_NODE), len(raws[0])


def _seconds(call: Callable[[], object]) -> float:
    start = time.process_time()
    call()
    return time.process_time() - start


def inproc_costs(ranks: int, compact: bool, cap: float,
                 profile: str | None = None) -> dict[str, list[Any]]:
    """Stage -> its values, for the stages done within `cap` seconds each."""
    done: dict[str, list[Any]] = {}
    with Child(inproc_stages, ranks, compact, profile) as child:
        for _ in STAGES:
            if not child.conn.poll(cap):
                break
            stage, *values = child.conn.recv()
            done[stage] = values
    return done


# --- report -----------------------------------------------------------------------------------


def _num(value: float, digits: int = 2) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [[cell.rjust(w) for cell, w in zip(row, widths, strict=True)] for row in rows]
    head = "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))
    return "\n".join([head, "-" * len(head), *("  ".join(line) for line in lines)])


def live_table(results: list[Live]) -> str:
    header = ["ranks", "lists", "sent st/s", "in rep/s", "in st/s", "coord cores",
              "of which loop", "agents cores", "busy cores", "coord RSS MiB", "detect tick s",
              "stacks s", "detect->incident s", "hang->incident s"]
    rows = [[str(r.ranks), r.variant, _num(r.sent, 0), _num(r.reports, 0), _num(r.states, 0),
             _num(r.coord_cores), _num(r.loop_cores), _num(r.agent_cores), _num(r.busy_cores),
             _num(r.rss_mib, 0), _num(r.detect_tick_s, 3), _num(r.stacks_s, 3),
             _num(r.detect_to_incident_s, 3), _num(r.hang_to_incident_s, 2)] for r in results]
    notes = [f"  {r.ranks} {r.variant}: {r.verdict}; {r.note}".rstrip("; ") for r in results]
    return _table(header, rows) + "\n" + "\n".join(notes)


def _stage_seconds(costs: dict[int, dict[str, list[Any]]], ranks: int, stage: str,
                   cap: float) -> tuple[str, float]:
    """'0.123'; for a stage past the cap '>15 (~130 est., n^2.0)', with an estimate from the
    two nearest smaller sizes' growth; for a stage never reached (an earlier one was past the
    cap) 'n/r (~0.21 est., n^1.0)'."""
    if stage in costs[ranks]:
        seconds = float(costs[ranks][stage][0])
        return f"{seconds:.3f}", seconds
    first_missing = next(s for s in STAGES if s not in costs[ranks])
    text = f">{cap:.0f}" if stage == first_missing else "n/r"
    smaller = sorted(n for n in costs if n < ranks and stage in costs[n])[-2:]
    if len(smaller) < 2:
        return text, math.inf
    (n1, n2), (t1, t2) = smaller, (costs[n][stage][0] for n in smaller)
    power = math.log(t2 / t1) / math.log(n2 / n1)
    estimate = t2 * (ranks / n2) ** power
    return f"{text} (~{estimate:.2g} est., n^{power:.1f})", estimate


def _cell(done: dict[str, list[Any]], stage: str, index: int, scale: float, digits: int) -> str:
    values = done.get(stage)
    return f"{values[index] * scale:.{digits}f}" if values else "-"


def _cores(done: dict[str, list[Any]], ranks: int) -> float:
    """Cores to decode and ingest every rank's report at 1 Hz, with the healthy ticks."""
    if not {"decode", "ingest", "tick"} <= done.keys():
        return math.nan
    per_state = done["decode"][0] + done["ingest"][0]
    return float(ranks * per_state + done["tick"][0] / done["tick"][1])


def inproc_table(costs: dict[tuple[str, int], dict[str, list[Any]]], cap: float) -> str:
    header = ["ranks", "lists", "report KiB", "decode us/st", "ingest us/st", "tick ms",
              "est. cores", "detect s", "(w/o stacks s)", "diagnose s", "(decide s", "build s)",
              "store s", "incident MiB", "status s"]
    rows = []
    for variant, ranks in sorted(costs):
        done = costs[variant, ranks]
        same = {n: c for (v, n), c in costs.items() if v == variant}
        timed = {stage: _stage_seconds(same, ranks, stage, cap)[0] for stage in STAGES}
        value = functools.partial(_cell, done)
        rows.append([str(ranks), variant, value("decode", 1, 1 / 1024, 1),
                     value("decode", 0, 1e6, 1), value("ingest", 0, 1e6, 1),
                     value("tick", 0, 1e3, 1), _num(_cores(done, ranks)), timed["detect"],
                     value("detect", 1, 1, 3), timed["diagnose"],
                     value("diagnose", 1, 1, 3), value("diagnose", 2, 1, 3), timed["store"],
                     value("store", 1, 1 / MIB, 1), timed["status"]])
    return _table(header, rows)


def profile_lines(path: str, top: int) -> list[str]:
    """The top functions by own time, as shares of the time not spent idle in epoll."""
    stats = pstats.Stats(path)
    entries = stats.stats  # type: ignore[attr-defined]
    idle = sum(v[2] for k, v in entries.items() if "epoll" in k[2])
    busy = stats.total_tt - idle  # type: ignore[attr-defined]
    ordered = sorted(entries.items(), key=lambda item: item[1][2], reverse=True)
    lines = [f"  busy {busy:.3f} s (idle in epoll {idle:.3f} s); own s, share of busy, "
             "cumulative s, calls, function"]
    for (file, line, function), (_, calls, tottime, cumtime, _) in ordered[:top + 1]:
        if "epoll" not in function:
            lines.append(f"  {tottime:7.3f} {100 * tottime / busy:5.1f}% {cumtime:8.3f} "
                         f"{calls:9d}  {_where(file, line, function)}")
    return lines[:top + 1]


def _where(file: str, line: int, function: str) -> str:
    if file == "~":
        return function
    for root in (str(REPO) + os.sep, "site-packages" + os.sep):
        if root in file:
            file = file.split(root, 1)[1]
    return f"{file}:{line}({function})"


def inproc_targets(costs: dict[tuple[str, int], dict[str, list[Any]]], cap: float) -> list[str]:
    """Issue 23's targets for one coordinator, at the largest size run in-process."""
    lines = []
    for variant in sorted({v for v, _ in costs}):
        same = {n: c for (v, n), c in costs.items() if v == variant}
        biggest = max(same)
        done = same[biggest]
        detect = _stage_seconds(same, biggest, "detect", cap)[1]
        diagnose = _stage_seconds(same, biggest, "diagnose", cap)[1]
        store = _stage_seconds(same, biggest, "store", cap)[1]
        status = _stage_seconds(same, biggest, "status", cap)[1]
        incident = done["store"][1] / MIB if "store" in done else math.nan
        checks = [
            (f"ingest at 1 Hz <= {TARGET_CORES:g} core", _cores(done, biggest), TARGET_CORES,
             "cores"),
            (f"detect + diagnose <= {TARGET_VERDICT_S:g} s", detect + diagnose,
             TARGET_VERDICT_S, "s"),
            (f"incident <= {TARGET_INCIDENT_MIB:g} MiB", incident, TARGET_INCIDENT_MIB, "MiB"),
            (f"store <= {TARGET_STORE_S:g} s", store, TARGET_STORE_S, "s"),
            (f"status <= {TARGET_STATUS_S:g} s", status, TARGET_STATUS_S, "s"),
        ]
        lines += [f"{what} at {biggest} ranks ({variant}): {_num(value, 3)} {unit}: "
                  f"{'PASS' if value <= target else 'FAIL'}"
                  for what, value, target, unit in checks]
    return lines


def live_targets(results: list[Live]) -> list[str]:
    """Issue 23's targets for the live coordinator, at the largest size run live."""
    biggest = max(r.ranks for r in results)
    lines = []
    for r in (r for r in results if r.ranks == biggest):
        keeps_up = r.known == biggest and r.states >= 0.95 * r.sent
        ok = r.right and keeps_up and r.coord_cores <= TARGET_LIVE_CORES
        lines.append(
            f"live at {biggest} ranks ({r.variant}): {r.verdict}; {r.known} ranks known, "
            f"ingested {_num(r.states, 0)} rank states/s of the {_num(r.sent, 0)} sent on "
            f"{_num(r.coord_cores)} cores (<= {TARGET_LIVE_CORES:g}): "
            f"{'PASS' if ok else 'FAIL'}")
    return lines


# --- main -------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="16384,65536,131072",
                        help="ranks in-process, comma-separated")
    parser.add_argument("--live-sizes", default="4096,16384", help="ranks live, comma-separated")
    parser.add_argument("--variants", default="compact", help="compact and/or full")
    parser.add_argument("--window", type=float, default=10.0, help="steady CPU window (s)")
    parser.add_argument("--profile-window", type=float, default=5.0)
    parser.add_argument("--ramp-cap", type=float, default=20.0)
    parser.add_argument("--verdict-cap", type=float, default=30.0,
                        help="seconds past stall timeout + one report to wait for the incident")
    parser.add_argument("--stage-cap", type=float, default=15.0,
                        help="cap on each in-process stage (s)")
    parser.add_argument("--rss-cap-gib", type=float, default=4.0)
    parser.add_argument("--nodes-per-channel", type=int, default=16)
    parser.add_argument("--profile-verdict-ranks", type=int, default=2048)
    parser.add_argument("--top", type=int, default=14, help="profile lines shown")
    parser.add_argument("--profile-dir", default="", help="keep .prof files here")
    parser.add_argument("--skip-live", action="store_true")
    parser.add_argument("--skip-inproc", action="store_true")
    return parser.parse_args()


@contextlib.contextmanager
def profile_dir(path: str) -> Iterator[str]:
    if path:
        os.makedirs(path, exist_ok=True)
        yield path
    else:
        with tempfile.TemporaryDirectory() as tmp:
            yield tmp


def main() -> None:
    args = parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    live_sizes = [int(s) for s in args.live_sizes.split(",")]
    variants = args.variants.split(",")
    started = time.monotonic()
    results: list[Live] = []
    costs: dict[tuple[str, int], dict[str, list[Any]]] = {}
    profiles: list[tuple[str, str]] = []
    with profile_dir(args.profile_dir) as prof:
        if not args.skip_live:
            for variant in variants:
                for ranks in live_sizes:
                    path = os.path.join(prof, f"live-{variant}-{ranks}.prof")
                    result = run_live(ranks, variant == "compact", args,
                                      path if ranks == max(live_sizes) else None)
                    print(f"[{time.monotonic() - started:5.0f} s] live {ranks} {variant} done",
                          file=sys.stderr, flush=True)
                    results.append(result)
                    if os.path.exists(path):
                        profiles.append((f"coordinator, live, {ranks} ranks {variant}, "
                                         f"{args.profile_window:.0f} s steady ingest", path))
        if not args.skip_inproc:
            for variant in variants:
                for ranks in sizes:
                    costs[variant, ranks] = inproc_costs(ranks, variant == "compact",
                                                          args.stage_cap)
                    print(f"[{time.monotonic() - started:5.0f} s] in-process {ranks} {variant} "
                          "done", file=sys.stderr, flush=True)
            path = os.path.join(prof, f"verdict-{args.profile_verdict_ranks}.prof")
            inproc_costs(args.profile_verdict_ranks, True, 120, path)
            if os.path.exists(path):
                profiles.append((f"diagnosis (decide with stacks + build_incident), in-process, "
                                 f"{args.profile_verdict_ranks} ranks compact", path))
        if results:
            print("\nLIVE (coordinator process; 'st' = rank states; stall timeout "
                  f"{STALL_TIMEOUT_S:.0f} s)\n" + live_table(results))
        if costs:
            print(f"\nIN-PROCESS (cap {args.stage_cap:.0f} s per stage; est. cores: decode and "
                  "ingest at 1 Hz, plus the healthy evaluation ticks)\n"
                  + inproc_table(costs, args.stage_cap))
        if results or costs:
            print("\nTARGETS\n" + "\n".join(
                (live_targets(results) if results else [])
                + (inproc_targets(costs, args.stage_cap) if costs else [])))
        for title, path in profiles:
            print(f"\nPROFILE {title} (cProfile, by tottime)")
            print("\n".join(profile_lines(path, args.top)))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\n(total {time.monotonic() - started:.0f} s on {psutil.cpu_count()} cores; "
          f"load average at the end {load})")


if __name__ == "__main__":
    main()
