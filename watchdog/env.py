"""Names and defaults every process agrees on (stdlib only): the environment contract between
`watchdog run/launch`, the hook and the agent, the host name, the coordinator's port, and how a
HOST:PORT address splits.

The hook reads these in the training process; the agent reads the same variables from
`/proc/PID/environ` of workers it finds without a hook, so both derive the same job id.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from watchdog.errors import UsageError
from watchdog.text import bounded

BEACON_DIR = "WATCHDOG_BEACON_DIR"
JOB_ID = "WATCHDOG_JOB_ID"
AUTOINSTALL = "WATCHDOG_AUTOINSTALL"  # "1": the boot sitecustomize installs the hook
HOOK_PID = "WATCHDOG_HOOK_PID"  # set by the installed hook: its children are not ranks
ATTEMPT = "TORCHELASTIC_RESTART_COUNT"  # torchrun's: how many times it restarted the workers
MAX_JOB_ID = 64  # bytes a beacon keeps of it
CHECKS = "WATCHDOG_CHECKS"  # the silent-bug checks the hook runs: "-duplicate_data", "none"
CHECK_EVERY = "WATCHDOG_CHECK_EVERY"  # optimizer steps between checks, after the early ones
# For the project's tests only: what one rank's hook records of its environment, overridden
# ("1:nccl=2.21.5"), since a test machine has one torch and no NCCL (hook/environment.py)
TEST_ENVIRONMENT = "WATCHDOG_TEST_ENVIRONMENT"

DEFAULT_BEACON_DIR = "/dev/shm/torch-hang-watchdog"
DEFAULT_PORT = 29450  # the coordinator's
DEFAULT_ADDRESS = f"127.0.0.1:{DEFAULT_PORT}"


def beacon_dir(env: Mapping[str, str] = os.environ) -> str:
    return env.get(BEACON_DIR) or DEFAULT_BEACON_DIR


def is_torchrun_worker(env: Mapping[str, str]) -> bool:
    """torchrun sets these for its workers, never for itself."""
    return "RANK" in env and "LOCAL_RANK" in env and "WORLD_SIZE" in env


def job_id(env: Mapping[str, str] = os.environ) -> str:
    """WATCHDOG_JOB_ID, else torchrun's run id joined with the rendezvous endpoint; and for
    the workers torchrun restarted, `/attempt<N>`: each attempt is a job of its own, so that an
    earlier attempt's ranks and exits never count in a later one's verdict. At most MAX_JOB_ID
    bytes, a longer one cut with a mark (`text.bounded`)."""
    base = env.get(JOB_ID)
    if not base:
        run_id = env.get("TORCHELASTIC_RUN_ID", "none")
        master = f"{env.get('MASTER_ADDR', socket.gethostname())}:{env.get('MASTER_PORT', '0')}"
        base = f"{run_id}@{master}"
    attempt = int_env(env, ATTEMPT, 0)
    suffix = f"/attempt{attempt}" if attempt > 0 else ""
    # Cut as a beacon keeps it: a worker without the hook, which the agent names from this
    # environment, is then one job with its hooked peers, and no id is longer than a beacon's.
    return bounded(base, MAX_JOB_ID - len(suffix)) + suffix


def short_hostname() -> str:
    """This host's name up to its first dot: how ranks, nodes and NCCL's %h name a host."""
    return socket.gethostname().split(".", 1)[0]


def int_env(env: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(env.get(name, default))
    except ValueError:
        return default


def split_address(address: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets) as (host, port); UsageError when it is not one."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"not a HOST:PORT address: {address!r}",
                         hint="e.g. 0.0.0.0:29451, 127.0.0.1:0 or [::1]:29451")
    return host, int(port)
