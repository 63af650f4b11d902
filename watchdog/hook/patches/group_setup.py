"""The wrappers of the calls that set process groups up and tear them down (runs inside every
training rank): init_process_group, new_group, destroy_process_group."""

from __future__ import annotations

import functools
import inspect
import os
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from watchdog.beacon import Setup
from watchdog.hook.environment import EnvironmentRecord
from watchdog.hook.recorder import Recorder

SHUTDOWN_GRACE_S = 60.0

BecomeRank = Callable[[int, int], None]  # an armed process's rank and world size, at init
Joined = Callable[[Any], object]  # gets what the set-up call returned
Entering = Callable[[tuple[Any, ...], dict[str, Any]], Setup | None]


def wrap_init_process_group(original: Callable[..., Any], rec: Recorder,
                            become_rank: BecomeRank | None, joined: Joined,
                            environment: EnvironmentRecord) -> Callable[..., Any]:
    """init_process_group: an armed process becomes the rank it names (its arguments, the
    init method's query, or the environment), before it waits for its peers; the wait
    shows in the beacon as a set-up call, with where the peers meet, and the rank's
    environment is recorded (peers that disagree may never get past the call)."""
    signature = inspect.signature(original)

    def entering(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Setup | None:
        try:
            bound = signature.bind_partial(*args, **kwargs).arguments
        except TypeError:
            return None  # torch raises its own error for these arguments
        rank, world_size = rank_and_world(bound, os.environ)
        if rec.writer is None and become_rank is not None and rank >= 0:
            become_rank(rank, world_size)
        environment.at_init(bound, max(world_size, 0))
        return Setup("init_process_group", time.time(), rendezvous(bound, os.environ))

    return _setting_up(original, rec, joined, entering)


def wrap_new_group(original: Callable[..., Any], rec: Recorder,
                   joined: Joined) -> Callable[..., Any]:
    """new_group: waits for its members, declared as a set-up call; `joined` gets the group."""
    return _setting_up(original, rec, joined)


def wrap_destroy_process_group(original: Callable[..., Any], rec: Recorder) -> Callable[..., Any]:
    """Teardown and interpreter exit record nothing for a while: a declared phase keeps
    that silence from looking like a stall."""

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        rec.set_phase(("shutdown", time.time(), SHUTDOWN_GRACE_S))
        return original(*args, **kwargs)

    return wrapper


def _setting_up(original: Callable[..., Any], rec: Recorder, then: Joined,
                entering: Entering | None = None) -> Callable[..., Any]:
    """A call that sets a process group up, which waits for every member: declared in the
    beacon while it runs; `then` gets its result."""
    name = original.__name__

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        declared = False
        if not rec.failed:
            try:
                setup = entering(args, kwargs) if entering else Setup(name, time.time())
                if setup is not None and rec.enabled:
                    rec.set_setup(setup)
                    declared = True
            except Exception as e:
                rec.fail(e)
        try:
            result = original(*args, **kwargs)
        finally:
            if declared:
                rec.set_setup()
        # an armed process may start at `then`; a forked child of a rank never records
        if not rec.failed and (rec.enabled or rec.writer is None):
            try:
                then(result)
            except Exception as e:
                rec.fail(e)
        return result

    return wrapper


def _int(value: object) -> int:
    """`value` as a whole number (a numpy integer or a numeric string too), else -1."""
    try:
        return int(str(value))
    except Exception:
        return -1


def rank_and_world(arguments: Mapping[str, Any], env: Mapping[str, str]) -> tuple[int, int]:
    """The rank and world size init_process_group was given: its arguments, else the query of
    a tcp:// or file:// init method (`?rank=0&world_size=2`), else RANK and WORLD_SIZE (env://);
    -1 for what none of them says."""
    rank, world = _int(arguments.get("rank", -1)), _int(arguments.get("world_size", -1))
    method = arguments.get("init_method")
    if isinstance(method, str) and "?" in method:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(method).query)
        rank = rank if rank >= 0 else _int(query.get("rank", [-1])[0])
        world = world if world >= 0 else _int(query.get("world_size", [-1])[0])
    rank = rank if rank >= 0 else _int(env.get("RANK"))
    world = world if world >= 0 else _int(env.get("WORLD_SIZE"))
    return (rank, world) if rank >= 0 and world > 0 else (-1, -1)


def rendezvous(arguments: Mapping[str, Any], env: Mapping[str, str]) -> str:
    """Where the members meet: the init method without its query, env:// with the address it
    reads, or a store given by the program."""
    if arguments.get("store") is not None:
        return "a store the program created"
    method = arguments.get("init_method")
    if isinstance(method, str) and method and not method.startswith("env://"):
        return method.split("?", 1)[0]
    return f"env://{env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')}"
