"""What each `watchdog explain` category means and how to fix it, for a user who can act on it.

Stdlib only; used wherever log lines are classified. The categories are the closed set of
docs/design.md; rules may give a more specific cause or fix than these defaults.
"""

from __future__ import annotations

import re

PEER_EXITED = "PEER_EXITED"
CONNECT_FAILED = "CONNECT_FAILED"
IB_ERROR = "IB_ERROR"
GPU_OOM = "GPU_OOM"
SHM = "SHM"
COLLECTIVE_TIMEOUT = "COLLECTIVE_TIMEOUT"
WATCHDOG_STUCK = "WATCHDOG_STUCK"
NCCL_ERROR = "NCCL_ERROR"
PORT_IN_USE = "PORT_IN_USE"
ENV_MISSING = "ENV_MISSING"
INVALID_RANK = "INVALID_RANK"
RENDEZVOUS = "RENDEZVOUS"
DESYNC = "DESYNC"
API_MISUSE = "API_MISUSE"
VERSION_MISMATCH = "VERSION_MISMATCH"

# What a user does about ranks that run different software (VERSION_MISMATCH here, the
# coordinator's ENV_MISMATCH) and about ranks on one GPU ("Duplicate GPU detected", the
# coordinator's SHARED_DEVICE): said alike wherever it is found.
SAME_ENVIRONMENT_FIX = (
    "run every rank from one environment: the same container image or virtual environment on "
    "every node (compare `python -c 'import torch; print(torch.__version__, torch.version.cuda, "
    "torch.cuda.nccl.version())'` on each node), and give init_process_group the same backend "
    "and world size on every rank (torchrun's WORLD_SIZE)")
ONE_GPU_PER_RANK_FIX = (
    "call torch.cuda.set_device(local_rank) (local_rank = int(os.environ['LOCAL_RANK'])) before "
    "init_process_group, move the model with model.to(local_rank), and wrap it as "
    "DDP(model, device_ids=[local_rank])")

# category -> (cause, fix): the defaults a rule uses unless it knows something more specific
ADVICE: dict[str, tuple[str, str]] = {
    PEER_EXITED: (
        "a peer closed or reset its connection: that process died, was killed or left the job, "
        "and this rank only noticed",
        "find the first rank that failed (see 'first failure'): its own error, its exit code, or "
        "the kernel OOM killer in `dmesg`; every rank that reports this line is a victim",
    ),
    CONNECT_FAILED: (
        "could not connect to a peer or to the master (MASTER_ADDR:MASTER_PORT): wrong address "
        "or interface, a firewall, or the peer was not up",
        "check that MASTER_ADDR resolves to a reachable address of the rank-0 node from every "
        "node, that the port range is open, and pin the interface with NCCL_SOCKET_IFNAME / "
        "GLOO_SOCKET_IFNAME (e.g. =eth0)",
    ),
    IB_ERROR: (
        "an InfiniBand/RoCE operation failed: a link, an adapter or the peer went away",
        "check the ports on both nodes (`ibstat`, `ibv_devinfo`, link flaps in `dmesg`); for RoCE "
        "set NCCL_IB_GID_INDEX; NCCL_IB_DISABLE=1 tells a network fault from a code fault",
    ),
    GPU_OOM: (
        "the GPU ran out of memory",
        "lower the batch size or sequence length, enable activation checkpointing, and check "
        "`nvidia-smi` for other processes on that GPU; NCCL needs free memory for its buffers too",
    ),
    SHM: (
        "a shared memory segment under /dev/shm could not be created or grown: /dev/shm is too "
        "small (Docker's default is 64 MB) or full of segments left by dead jobs",
        "raise /dev/shm: `docker run --shm-size=16g` (or --ipc=host); in Kubernetes mount an "
        "emptyDir with `medium: Memory` at /dev/shm; delete stale /dev/shm/nccl-* and torch_* "
        "files; NCCL_SHM_DISABLE=1 works around it at some speed cost",
    ),
    COLLECTIVE_TIMEOUT: (
        "a collective did not finish within the process group's timeout: some rank never "
        "entered it, or stopped making progress inside it",
        "this rank only waited: find the rank that did not arrive (`watchdog run` names it; "
        "TORCH_NCCL_DESYNC_DEBUG=1 or the flight recorder shows it); raise `timeout=` in "
        "init_process_group only for steps that are legitimately that slow",
    ),
    WATCHDOG_STUCK: (
        "PyTorch's NCCL watchdog thread itself stopped making progress: a CUDA or NCCL call hung "
        "(a GPU or driver fault, or a deadlock around the GIL)",
        "check the GPU (`nvidia-smi`, Xid errors in `dmesg`) and take native stacks of that "
        "process (`py-spy dump --native`); TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC sets the grace period",
    ),
    NCCL_ERROR: (
        "NCCL reported an internal, system or invalid-usage error",
        "read the NCCL WARN line printed just before (rerun with NCCL_DEBUG=WARN, or "
        "NCCL_DEBUG=INFO NCCL_DEBUG_FILE=/tmp/nccl.%h.%p.log); invalid usage usually means ranks "
        "passed different sizes or used the wrong device",
    ),
    PORT_IN_USE: (
        "the rendezvous port is already taken on this host: another job, or a stale process from "
        "an earlier run, still listens on it",
        "pick another --master_port (MASTER_PORT), or find and kill the stale job "
        "(`ss -ltnp | grep :PORT`)",
    ),
    ENV_MISSING: (
        "a variable the env:// rendezvous needs (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, "
        "LOCAL_RANK) is not set",
        "launch with torchrun, which sets them for each worker, or export them yourself; a script "
        "started with plain `python` has none of them",
    ),
    INVALID_RANK: (
        "a rank or device index does not fit the job: rank >= world size, two ranks on one GPU, "
        "or LOCAL_RANK beyond the visible GPUs",
        "make --nproc_per_node match the GPUs per node, call torch.cuda.set_device(LOCAL_RANK) in "
        "each process, and check RANK/WORLD_SIZE when launching by hand",
    ),
    RENDEZVOUS: (
        "the ranks did not all meet at rendezvous: some never arrived in time, two claimed the "
        "same rank, or the rendezvous was closed",
        "start every node with the same --nnodes, --rdzv_endpoint (MASTER_ADDR:MASTER_PORT) and "
        "--rdzv_id, check that the missing nodes started at all, and that no stale job uses the "
        "same endpoint",
    ),
    DESYNC: (
        "the ranks are out of step: the named ranks are in another collective than the others, "
        "or in none",
        "see what the named ranks were doing (py-spy dump, flight recorder): usually a "
        "data-dependent branch, an uneven number of batches per rank, or code that only some "
        "ranks run",
    ),
    VERSION_MISMATCH: (
        "the ranks' logs show different NCCL, CUDA or torch versions: ranks built against "
        "different versions may hang or fail in their first collective",
        SAME_ENVIRONMENT_FIX,
    ),
    API_MISUSE: (
        "PyTorch refused how the training code uses it: a bug in the script, which every rank "
        "that runs the same code hits alike, not a fault of the machine or of a peer",
        "fix the call the message names (the same on every rank); the last frames of the "
        "traceback point at it",
    ),
}

_IB_STATUS = {  # ibv_wc_status values NCCL prints as "with error N"
    4: "IBV_WC_LOC_PROT_ERR: memory registration failed, often GPUDirect RDMA "
    "(nvidia-peermem) or ulimit -l",
    5: "IBV_WC_WR_FLUSH_ERR: flushed because the connection had already failed; look for the "
    "first IB error",
    10: "IBV_WC_REM_ACCESS_ERR: the peer rejected the access",
    12: "IBV_WC_RETRY_EXC_ERR: the peer stopped answering (dead process or node, down link, "
    "wrong GID or route)",
    13: "IBV_WC_RNR_RETRY_EXC_ERR: the receiver was not ready in time",
}


def ib_cause(match: re.Match[str]) -> str:
    status = match.group(1)
    if status is None:
        return ADVICE[IB_ERROR][0]
    meaning = _IB_STATUS.get(int(status), "see `man ibv_poll_cq` for the status code")
    return f"an InfiniBand/RoCE transfer completed with error {status} ({meaning})"
