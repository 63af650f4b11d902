"""`watchdog incidents [list|show ID]`: incidents stored in the database, newest first."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import TYPE_CHECKING

from watchdog.cli import options
from watchdog.errors import UsageError, WatchdogError
from watchdog.report.terminal import render_incident, render_incident_list, use_color
from watchdog.schema import Incident

if TYPE_CHECKING:
    from watchdog.coordinator import IncidentStore


class IncidentsCommand:
    name = "incidents"
    help = "stored incidents"
    description = ("The incidents stored in the database, newest first (list), or one in full "
                   "(show ID).")
    example = "watchdog incidents show 3f2a9c1e --html hang.html"
    daemon = False

    def prepare_parser(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("action", nargs="?", choices=("list", "show"), default="list",
                       metavar="list|show",
                       help="list every incident, or show one")
        p.add_argument("id", nargs="?", help="incident id (for show)")
        p.add_argument("--json", action="store_true",
                       help="list: one JSON array of incidents, newest first; show: the incident's "
                            "JSON (the contract)")
        p.add_argument("--html", type=options.file_to_write, metavar="PATH",
                       help="show: write the incident to PATH as one self-contained HTML page")
        options.add_db_option(p)

    def run(self, args: argparse.Namespace) -> int:
        from watchdog.coordinator import store_for
        from watchdog.coordinator.database import database_of

        database = database_of(args.db)
        if args.html and args.action != "show":
            raise UsageError("--html goes with `incidents show ID`",
                             hint="watchdog incidents show ID --html report.html")
        if args.action == "show" and not args.id:
            raise UsageError("incidents show needs an incident id",
                             hint="`watchdog incidents list` shows them")
        with contextlib.closing(store_for(database)) as store:
            if args.action == "show":
                _show(store, args)
            elif args.json:
                print("[" + ", ".join(stored.text for stored in store.listed()) + "]")
            else:
                print(render_incident_list([(json.loads(stored.text), stored.coordinator)
                                            for stored in store.listed()]))
        return 0


def _show(store: IncidentStore, args: argparse.Namespace) -> None:
    body = store.get_json(args.id)
    if body is None:
        raise WatchdogError(f"no incident {args.id} in {store.where}",
                            hint="`watchdog incidents list` shows the ids; --db names another "
                                 "database")
    if args.html:
        _write_html(args.html, json.loads(body))
    else:
        print(body if args.json else render_incident(json.loads(body), use_color(sys.stdout)))


def _write_html(path: str, incident: Incident) -> None:
    from watchdog.report import write_html

    try:
        write_html(path, incident)
    except OSError as e:
        raise WatchdogError(f"cannot write {path}: {e.strerror}",
                            hint="give --html a file path in a directory you can write") from e
    print(f"wrote incident {incident['id']} to {path}", file=sys.stderr)
