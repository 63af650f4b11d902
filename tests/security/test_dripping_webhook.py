"""Issue 20, finding 8, a webhook receiver that drips its answer: `nobody` runs the receiver a
root coordinator posts its hangs to, and answers each post one byte a second. The coordinator
abandons each post at its deadline (5 s for the whole post, not for each read: the old
coordinator waited for the whole answer, 38 s), and meanwhile answers status and diagnoses
another job's hang."""

from __future__ import annotations

import select
import subprocess

from tests.helpers.attack import (
    AS_NOBODY,
    agent,
    clean_env,
    coordinator,
    hung_job,
    scratch_dir,
    shared_base,
    verdict,
    worker,
)
from tests.helpers.everyone import attacker, python

ANSWER_BYTES = 38  # of dripping_receiver.py's answer: 38 s at a byte a second


def next_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"the receiver said nothing in {timeout:.0f} s"
    return proc.stdout.readline().strip()


def test_a_dripping_receiver_holds_a_post_no_longer_than_its_deadline() -> None:
    receiver = subprocess.Popen(
        [*AS_NOBODY, python(), attacker("dripping_receiver.py")],
        stdout=subprocess.PIPE, text=True, env=clean_env(), cwd="/")
    try:
        port = int(next_line(receiver, 30).split()[1])
        with scratch_dir() as scratch:
            beacons = shared_base(scratch)
            with coordinator(scratch, "--notify-webhook", f"http://127.0.0.1:{port}/hook") as hub, \
                    agent(scratch, beacons, "--coordinator", hub.address):
                first, first_peer = hung_job(beacons, "first")
                with worker(first), worker(first_peer):
                    verdict(hub.address, "first")
                    # The first post is dripped to now; the coordinator still judges a hang.
                    second, second_peer = hung_job(beacons, "second")
                    with worker(second), worker(second_peer):
                        judged = verdict(hub.address, "second")
                    post = next_line(receiver, ANSWER_BYTES + 20)
            log = hub.output()
    finally:
        receiver.kill()
        receiver.wait()
    assert judged["verdict"]["kind"] == "MISSING_RANKS"
    assert post.startswith("closed after "), f"the coordinator waited out the drip: {post}"
    assert int(post.split()[2]) < 15, post  # about 5: a byte a second for 5 s
    assert "no whole answer within 5 s; trying again (attempt 2)" in log
