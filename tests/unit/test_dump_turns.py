"""Dumps take turns on a node (agent/stacks.py): DUMPS_AT_ONCE in all, of which one user holds
at most USER_DUMPS_AT_ONCE, so another user's dump never waits behind a user who keeps every
turn busy (issue 37: many verified job ids of one user). Each "dump" here is a real
subprocess that takes a while, run the way py-spy is."""

from __future__ import annotations

import asyncio

from agent import stacks
from agent.stacks import DUMPS_AT_ONCE, USER_DUMPS_AT_ONCE

HOLD_S = 0.8


async def dump_as(uid: int, done: list[int]) -> None:
    stacks._DUMPING_FOR.set(uid)
    await stacks._run_py_spy(["sleep", str(HOLD_S)], timeout=60.0)
    done.append(uid)


async def busy_user_then_another() -> list[int]:
    done: list[int] = []
    busy = [asyncio.create_task(dump_as(1000, done)) for _ in range(DUMPS_AT_ONCE)]
    await asyncio.sleep(0.2)  # the busy user's dumps have all asked for their turns
    other = asyncio.create_task(dump_as(0, done))
    await asyncio.gather(*busy, other)
    return done


def test_another_users_dump_runs_beside_a_user_who_asks_for_every_turn() -> None:
    assert USER_DUMPS_AT_ONCE < DUMPS_AT_ONCE
    done = asyncio.run(busy_user_then_another())
    # the busy user's last dump waited for one of its own; the other user's did not wait
    assert done.index(0) < len(done) - 1, done
    assert done[-1] == 1000
