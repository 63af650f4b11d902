"""Issue 20, finding 1: on a coordinator without a token, `nobody` cannot pass for root by
connecting from a local port that closed connections (TIME_WAIT, listed as uid 0) hold: neither
reading every job (Status) nor sending a forged agent report (Connect)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from tests.helpers.attack import (
    AS_NOBODY,
    NOBODY,
    clean_env,
    coordinator,
    job,
    rogue,
    scratch_dir,
    status,
)
from tests.helpers.everyone import attacker, python


@contextmanager
def spoofing_relay(address: str) -> Iterator[str]:
    """tests/security/spoofed_root.py as nobody, in front of `address`; yields its address."""
    proc = subprocess.Popen([*AS_NOBODY, python(), attacker("spoofed_root.py"),
                             address], stdout=subprocess.PIPE, text=True, env=clean_env(),
                            cwd="/")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[:1] == ["relay"], f"the relay did not start: {line}"
        yield line[1]
    finally:
        proc.kill()
        proc.wait()


def test_time_wait_entries_do_not_make_nobody_root() -> None:
    with scratch_dir() as scratch, coordinator(scratch) as coord, \
            spoofing_relay(coord.address) as relay:
        read = status(relay, as_user=AS_NOBODY)
        with rogue(relay, "-", "node-x", "injected") as answer:
            pass
        injected = job(coord.address, "injected")
        ours = status(coord.address)
        log = coord.output()
    assert read.returncode == 1, read.stdout
    assert f"not uid {NOBODY}: its operator must give it --token-file" in read.stderr
    assert answer.startswith("refused: PERMISSION_DENIED"), answer
    assert injected is None
    assert ours.returncode == 0, ours.stderr  # root, straight to it, is still served
    assert f"not uid {NOBODY}" in log
