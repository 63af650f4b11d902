"""Issue 20, findings 2 and 9: the web view serves whom gRPC Status would (a token that may read
when the coordinator has any token, else root and its own user only), and idle connections,
which anyone may open, never keep a reader out."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.helpers.attack import (
    AS_NOBODY,
    NOBODY,
    Daemon,
    clean_env,
    coordinator,
    scratch_dir,
    token_file,
    wait_for,
)
from tests.helpers.everyone import attacker, python
from watchdog.cli.demo import free_port
from watchdog.web.server import MAX_CONNECTIONS

REFUSED = f"not uid {NOBODY}: its operator must give it --token-file"


@contextmanager
def web_coordinator(scratch: Path, *flags: str) -> Iterator[tuple[Daemon, str]]:
    """A coordinator with its web view on; yields it and the view's URL."""
    web = f"127.0.0.1:{free_port()}"
    with coordinator(scratch, "--web-listen", web, *flags) as coord:
        wait_for(lambda: "web view on" in coord.output() or not coord.alive, "the web view")
        assert coord.alive, coord.output()
        yield coord, f"http://{web}"


def nobody_gets(url: str, token: str | None = None) -> dict[str, Any]:
    out = subprocess.run([*AS_NOBODY, python(), attacker("web_client.py"), "get",
                          url, *([token] if token else [])], capture_output=True, text=True,
                         timeout=60, env=clean_env(), cwd="/")
    assert out.returncode == 0, out.stderr
    answer: dict[str, Any] = json.loads(out.stdout)
    return answer


def get(url: str, token: str | None = None) -> int:
    """The status code of a GET from this process (root)."""
    headers = {}
    if token is not None:
        headers["Authorization"] = f"Bearer {Path(token).read_text().strip()}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_without_a_token_the_web_view_serves_only_root_and_its_own_user() -> None:
    with scratch_dir() as scratch, web_coordinator(scratch) as (coord, url):
        jobs = nobody_gets(f"{url}/")
        incident = nobody_gets(f"{url}/incidents/1")
        ours = get(f"{url}/")
        log = coord.output()
    assert jobs["code"] == 403 and REFUSED in jobs["body"], jobs
    assert incident["code"] == 403 and REFUSED in incident["body"], incident
    assert ours == 200
    assert "web view: refused 127.0.0.1:" in log and f"not uid {NOBODY}" in log


def test_with_agent_and_control_tokens_the_web_view_takes_the_control_token() -> None:
    with scratch_dir() as scratch:
        agent = token_file(scratch, "agent", NOBODY)
        control = token_file(scratch, "control", NOBODY)
        with web_coordinator(scratch, "--agent-token-file", agent,
                             "--control-token-file", control) as (_, url):
            bare = nobody_gets(f"{url}/")
            with_agent = nobody_gets(f"{url}/", agent)
            with_control = nobody_gets(f"{url}/", control)
            root_bare = get(f"{url}/")
            root_with_control = get(f"{url}/", control)
    assert bare["code"] == 401 and 'name="token"' in bare["body"], bare
    assert with_agent["code"] == 401
    assert with_control["code"] == 200 and "<h1>Jobs</h1>" in with_control["body"], with_control
    assert (root_bare, root_with_control) == (401, 200)


def test_idle_connections_do_not_keep_a_reader_out() -> None:
    with scratch_dir() as scratch:
        reader = token_file(scratch, "reader")
        with web_coordinator(scratch, "--reader-token-file", reader) as (_, url):
            holder = subprocess.Popen(
                [*AS_NOBODY, python(), attacker("web_client.py"), "hold", url,
                 str(3 * MAX_CONNECTIONS)], stdout=subprocess.PIPE, text=True, env=clean_env(),
                cwd="/")
            try:
                assert holder.stdout is not None
                assert holder.stdout.readline().strip() == f"holding {3 * MAX_CONNECTIONS}"
                code = get(f"{url}/", reader)
                assert holder.poll() is None  # it still holds every connection open
            finally:
                holder.kill()
                holder.wait()
    assert code == 200
