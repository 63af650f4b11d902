"""`watchdog status`: the jobs a coordinator follows, their ranks and current verdicts. Without
`--coordinator`, every job on this machine: each running `watchdog run` (`discover`) and the
service coordinator at the default address, merged into one list."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from watchdog.cli import options
from watchdog.cli.status_answers import checked_jobs, deduplicated
from watchdog.env import DEFAULT_ADDRESS
from watchdog.errors import CoordinatorUnreachableError, ExitCode, WatchdogError
from watchdog.model import EVERY_JOB, FULL_ROWS, MAX_FULL_ROWS, StatusQuery
from watchdog.report.terminal import render_status, use_color
from watchdog.schema import StatusJob
from watchdog.text import parse_ranks, printable
from watchdog.transport import ClientSecurity

SOURCE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Source:
    label: str
    address: str
    security: ClientSecurity | None = None
    query: StatusQuery = EVERY_JOB
    owner: int | None = None  # a `watchdog run`'s user: it may answer for that user's jobs only


@dataclass
class Answer:
    source: Source
    jobs: list[StatusJob]
    notes: list[str] = field(default_factory=list)


class StatusCommand:
    name = "status"
    help = "jobs, ranks and the current verdict"
    description = ("The jobs being watched, each rank's state and the current verdict: of every "
                   "`watchdog run` on this machine and the local coordinator, or of the one "
                   "--coordinator names.")
    example = "watchdog status --coordinator node0:29450 --token-file token --json"
    daemon = False

    def prepare_parser(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--coordinator", metavar="HOST:PORT", action="append",
                       help="ask this coordinator only; given again, each of them (the shards "
                            "of a fleet), merged (default: every `watchdog run` on this "
                            f"machine and the coordinator at {DEFAULT_ADDRESS})")
        options.add_client_security_options(p)
        p.add_argument("--json", action="store_true", help="machine-readable (the contract)")
        p.add_argument("--job", metavar="JOB_ID", default="", help="this job only")
        p.add_argument("--ranks", metavar="LIST", type=_ranks,
                       help="list these ranks in full too, e.g. 90000-90100,5 (a job of more "
                            f"than {FULL_ROWS} ranks lists its culprits and odd ranks in full and "
                            f"the others as groups of ranks alike; at most {MAX_FULL_ROWS})")

    def run(self, args: argparse.Namespace) -> int:
        query = StatusQuery(args.job, args.ranks or ())
        security = options.client_security_of(args)
        if args.coordinator is not None and len(args.coordinator) == 1:
            text = asyncio.run(_status_text(Source("", args.coordinator[0], security, query)))
            print(text if args.json
                  else render_status(json.loads(text), color=use_color(sys.stdout)))
            return _found(args.job, bool(json.loads(text).get("jobs")))
        if args.coordinator is not None:
            answers = _shards(args.coordinator, security, query)
        else:
            answers = _this_machine(security, query)
        merged = merge(answers)
        found = any(answer.jobs for answer in merged)
        if args.json:
            print(json.dumps({"jobs": [job for answer in merged for job in answer.jobs]}))
        elif merged and (found or not args.job):
            print(render_answers(merged, use_color(sys.stdout)))
        return _found(args.job, found)


def _found(job: str, shown: bool) -> int:
    """A job asked for by --job and not found is an error (exit 1), said on stderr."""
    if job and not shown:
        print(f"watchdog status: no job {printable(job)} here", file=sys.stderr)
        return ExitCode.ERROR
    return ExitCode.OK


def _shards(addresses: Sequence[str], security: ClientSecurity,
            query: StatusQuery) -> list[Answer]:
    """Every coordinator named: a fleet's shards, each following its own jobs."""
    sources = [Source(f"coordinator at {address}", address, security, query)
               for address in addresses]
    return _answers(sources, f"no coordinator answered of {', '.join(addresses)}",
                    "check each --coordinator address, and that its coordinator runs")


def _this_machine(security: ClientSecurity, query: StatusQuery) -> list[Answer]:
    """Every `watchdog run` on this machine and the service coordinator, where one listens."""
    from watchdog.supervise.runs_dir import open_runs

    service = Source(f"coordinator at {DEFAULT_ADDRESS}", DEFAULT_ADDRESS, security, query)
    with open_runs() as runs:
        sources = [Source(r.label, r.address, query=query, owner=r.uid) for r in runs]
        if _listening(DEFAULT_ADDRESS):  # nothing there is no news: most machines run none
            sources.append(service)
        if not sources:  # nothing runs here: an empty list, not a failure
            print("watchdog status: no job to show: no `watchdog run` found on this machine "
                  f"and no coordinator listens at {DEFAULT_ADDRESS}", file=sys.stderr)
            return []
        return _answers(
            sources, "no job to show: no `watchdog run` found on this machine and no "
                     f"coordinator answered at {DEFAULT_ADDRESS}",
            "start a job with `watchdog run -- CMD`, or pass --coordinator HOST:PORT")


def _answers(sources: Sequence[Source], nobody: str, hint: str) -> list[Answer]:
    """Every source's jobs; a note on stderr for each that did not answer, and
    CoordinatorUnreachableError (`nobody`, `hint`) when none did."""
    answers, notes = asyncio.run(ask_all(sources))
    notes += [f"{answer.source.label}: {note}" for answer in answers for note in answer.notes]
    for note in notes:
        print(f"watchdog status: skipped {note}", file=sys.stderr)
    if not answers:
        raise CoordinatorUnreachableError(nobody, hint=hint)
    return answers


async def ask_all(sources: Sequence[Source]) -> tuple[list[Answer], list[str]]:
    """Every source's jobs, asked at once; a note for each that did not answer."""
    results = await asyncio.gather(*(_ask(s) for s in sources))
    answers = [r for r in results if isinstance(r, Answer)]
    notes = [r for r in results if isinstance(r, str)]
    return answers, notes


async def _ask(source: Source) -> Answer | str:
    try:
        text = await _status_text(source, SOURCE_TIMEOUT_S)
        jobs, notes = checked_jobs(json.loads(text), source.owner)
    except WatchdogError as e:
        return f"{source.label}: {str(e).splitlines()[0]}"
    except (ValueError, RecursionError):
        return f"{source.label}: its answer is not status JSON"
    return Answer(source, jobs, notes)


async def _status_text(source: Source, timeout: float = 10.0) -> str:
    from watchdog.transport import CoordinatorClient

    client = CoordinatorClient(source.address, source.security)
    try:
        return await client.status_json(source.query, timeout=timeout)
    finally:
        await client.close()


def _ranks(spec: str) -> tuple[int, ...]:
    try:
        return parse_ranks(spec, MAX_FULL_ROWS)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def merge(answers: Sequence[Answer]) -> list[Answer]:
    """Each job once: a job that two coordinators follow (a service agent also sees the workers
    of a `watchdog run`) is shown as the first source, the run itself, sees it; a job id two
    sources answer for different processes is shown from both (status_answers.deduplicated)."""
    return [Answer(answer.source, jobs)
            for answer, jobs in zip(answers, deduplicated([a.jobs for a in answers]), strict=True)]


def render_answers(answers: Sequence[Answer], color: bool) -> str:
    return "\n\n".join(f"== {answer.source.label}\n{_rendered(answer, color)}"
                       for answer in answers)


def _rendered(answer: Answer, color: bool) -> str:
    """One source's jobs; a fault in what it sent costs that source alone."""
    try:
        return render_status({"jobs": answer.jobs}, color)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return "its answer could not be shown (not status JSON)"


def _listening(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return True
    except OSError:
        return False
