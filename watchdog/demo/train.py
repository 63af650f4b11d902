"""A tiny DDP training job (one process per rank, under torchrun) with one injectable fault.

`watchdog demo` runs it with a rank stuck in its data pipeline; the integration tests run every
fault (tests/jobs/spawn_job.py runs it under torch.multiprocessing.spawn). Done right:
DistributedSampler with set_epoch, DDP, gloo on CPU (num_workers=0 unless --num-workers). Each
`--mistake` gets that setup wrong: the job never hangs, it just learns wrong.
"""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import socket
import sys
import tempfile
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler, get_worker_info

FAULTS = ("none", "data_stall", "lock", "barrier", "early_exit", "subgroup", "slow_steps",
          "nccl_peer_closed", "lock_after_backward", "evaluate_all", "livelock", "init_stall",
          "crash", "killed", "pre_ddp_stall", "worker_stall", "slow_read")
EVERY_RANK = ("subgroup", "evaluate_all")  # faults every rank of the job takes part in
# Setup mistakes that never hang: rank 0 loads other weights after wrapping; no
# DistributedSampler; no DDP; no set_epoch; the model cast to float64 after wrapping.
MISTAKES = ("load_after_ddp", "no_sampler", "no_ddp", "no_set_epoch", "cast_after_ddp")
# Mistakes that raise on every rank alike, at one line: a DistributedSampler and shuffle=True.
RAISING_MISTAKES = ("sampler_shuffle",)
BATCH_SIZE = 4
# evaluate_for: this much CPU time of forward passes, then seven times as long waiting
EVALUATION_BURST_S = 0.005


class Progress:
    step = 0
    ready = False


class Samples(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    first_step = 0  # the step the current epoch starts at: each epoch's workers fork with it

    def __init__(self, size: int, stall_from_step: int | None,
                 stall_seconds: float | None = None) -> None:
        self.size = size
        self.stall_from_step = stall_from_step
        self.stall_seconds = stall_seconds  # None: the read never returns

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.stall_from_step is not None and Progress.step >= self.stall_from_step:
            read_sample_from_storage(index, self.stall_seconds)
            if self.stall_seconds is not None:
                self.stall_from_step = None  # slow once, then the filesystem came back
        return torch.full((8,), float(index % 7)), torch.ones(1)


def read_sample_from_storage(index: int, seconds: float | None = None) -> None:
    """Stands for a read from a network filesystem that never returns (data_stall), or that
    returns after `seconds` (slow_read)."""
    announce("data_stall" if seconds is None else "slow_read")
    time.sleep(3600 if seconds is None else seconds)


class StallingWorkerSamples(Samples):
    """worker_stall: DataLoader worker 1 blocks in read_record from the fault step on. Batches
    go to the workers in turn, so a worker knows the step of each batch it makes; it runs
    ahead of the training loop (prefetching), so it blocks, and says so, a little before the
    loop reaches that step."""

    def __init__(self, size: int, fault_step: int, batch_size: int) -> None:
        super().__init__(size, None)
        self.fault_step, self.batch_size, self.served = fault_step, batch_size, 0

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        info = get_worker_info()
        if info is not None and info.id == 1:
            batch = self.served // self.batch_size
            self.served += 1
            step = self.first_step + batch * info.num_workers + info.id
            if step >= self.fault_step:
                read_record(index, step)
        return super().__getitem__(index)


def read_record(index: int, step: int) -> None:
    """Stands for a worker's read from a network filesystem that never returns."""
    Progress.step = step  # this worker's own copy: the step its batch is for
    announce("worker_stall")
    time.sleep(3600)


def announce(fault: str) -> None:
    """When the fault began, for the tests that time its diagnosis."""
    print(f"fault {fault} at step {Progress.step}, time {time.time():.3f}", file=sys.stderr,
          flush=True)


_metrics_lock = threading.Lock()


def update_metrics() -> None:
    """A deadlock: the lock is not reentrant and this thread already holds it."""
    with _metrics_lock:
        _metrics_lock.acquire()


def save_checkpoint() -> None:
    """A barrier only this rank calls: its peers are in DDP's all-reduce instead."""
    dist.barrier()


def load_shard() -> None:
    """Stands for a rank that never gets to its subgroup's collective."""
    time.sleep(3600)


def evaluate() -> None:
    """A legitimately slow step that every rank takes at the same time."""
    time.sleep(1.5)


def evaluate_for(model: torch.nn.Module, seconds: float) -> None:
    """A long evaluation: forward passes on the CPU, no collective, for `seconds`. Like an
    evaluation on a GPU, whose CPU waits for the device most of the time, it computes an eighth
    of the time. Each burst is counted in CPU time, not wall time: on a loaded node (the tests
    run several jobs on two cores) a burst waits for the CPU instead of being cut short, so the
    rank still uses well over the 5% of a core that shows it busy, and never much more."""
    batch = torch.randn(256, 8)
    end = time.monotonic() + seconds
    with torch.no_grad():
        while time.monotonic() < end:
            burst_end = time.thread_time() + EVALUATION_BURST_S
            while time.thread_time() < burst_end:
                model(batch).sum().item()
            time.sleep(7 * EVALUATION_BURST_S)


def write_checkpoint(seconds: float) -> None:
    """A long checkpoint: steady, synced writes of 1 MB chunks for `seconds`."""
    chunk = os.urandom(1 << 20)
    end = time.monotonic() + seconds
    with tempfile.TemporaryFile() as out:
        while time.monotonic() < end:
            out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
            if out.tell() > 256 << 20:
                out.seek(0)


def checkpoint(writer: bool, seconds: float) -> None:
    """One rank writes a checkpoint; the others wait for it in a barrier."""
    announce("checkpoint")
    if writer:
        write_checkpoint(seconds)
    dist.barrier()


def prepare_dataset() -> None:
    """Stands for a rank that prepares its data before joining the job, and never finishes."""
    announce("init_stall")
    time.sleep(3600)


def load_pretrained() -> None:
    """Stands for a rank that loads pretrained weights after joining and before wrapping its
    model in DDP, and never finishes: idle (no CPU, no I/O) while its peers wait in DDP's
    constructor."""
    announce("pre_ddp_stall")
    time.sleep(3600)


def read_shard(index: int) -> None:
    """A crash: the rank raises, the others are left waiting for it."""
    announce("crash")
    raise RuntimeError(f"shard {index} is corrupt: expected 4096 records, found 17")


def spin_until_ready() -> None:
    """A livelock: waits, burning a core, for a flag that nothing will set."""
    while not Progress.ready:
        pass


def write_nccl_debug_lines(local_rank: int, peer_closed: bool) -> None:
    """Lines in NCCL's own debug format where NCCL would write them: to the file NCCL_DEBUG_FILE
    names (%h, %p expanded), else to stdout when NCCL_DEBUG is set. Gloo on CPU writes none, so
    this stands in for NCCL where the job asks for it."""
    pattern = os.environ.get("NCCL_DEBUG_FILE")
    if not pattern and not os.environ.get("NCCL_DEBUG"):
        return
    host, pid, tid = socket.gethostname().split(".")[0], os.getpid(), threading.get_native_id()
    prefix = f"{host}:{pid}:{tid} [{local_rank}]"
    if not peer_closed:
        text = (f"{prefix} NCCL INFO Bootstrap : Using eth0:10.0.0.{local_rank + 1}<0>\n"
                f"{prefix} NCCL INFO NCCL version 2.21.5+cuda12.4\n")
    else:
        text = (f"{prefix} NCCL INFO Channel 00/0 : 1[1] -> 2[2] via P2P/IPC\n"
                f"\n{prefix} misc/socket.cc:521 NCCL WARN Net : Connection closed by remote "
                "peer 10.0.0.3<37877>\n"
                f"{prefix} NCCL INFO transport/net.cc:1298 -> 6\n")
    if pattern:
        with open(pattern.replace("%h", host).replace("%p", str(pid)), "a") as log:
            log.write(text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()


def shuffle_with_sampler(dataset: Samples, sampler: DistributedSampler[int] | None) -> None:
    """The guide's example: DataLoader raises ValueError ("sampler option is mutually exclusive
    with shuffle"), on every rank at this line."""
    DataLoader(dataset, batch_size=4, sampler=sampler, shuffle=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fault", choices=FAULTS, default="none")
    parser.add_argument("--mistake", choices=MISTAKES + RAISING_MISTAKES, action="append",
                        default=[], help="a setup mistake (repeatable): the job never hangs, "
                        "or every rank raises (sampler_shuffle)")
    parser.add_argument("--fault-rank", type=int, default=1)
    parser.add_argument("--fault-step", type=int, default=6)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--exit-code", type=int, default=0, help="what early_exit exits with")
    parser.add_argument("--exit-seconds", type=float, default=0.0,
                        help="how long early_exit's or crash's exit handlers take")
    parser.add_argument("--fault-seconds", type=float, default=30.0,
                        help="how long evaluate_all, slow_read and --checkpoint-at take")
    parser.add_argument("--checkpoint-at", type=int, default=-1, metavar="STEP",
                        help="at STEP, the --checkpoint-rank writes a checkpoint for "
                             "--fault-seconds while the others wait in a barrier (besides any "
                             "--fault)")
    parser.add_argument("--checkpoint-rank", type=int, default=None, metavar="RANK",
                        help="the rank that writes it (default: --fault-rank)")
    parser.add_argument("--evaluate-every", type=int, default=0, metavar="STEPS",
                        help="every STEPS steps, every rank evaluates for --fault-seconds "
                             "(besides any --fault)")
    parser.add_argument("--slow-start", type=float, default=0.0, metavar="S",
                        help="every rank computes for S seconds before its first step, as a "
                             "compiling or warming-up job does")
    parser.add_argument("--num-workers", type=int, default=0,
                        help="DataLoader worker processes of each rank (worker_stall needs 2)")
    parser.add_argument("--restart-fault", choices=FAULTS, default=None,
                        help="the fault of the attempts torchrun restarts (default: --fault)")
    parser.add_argument("--restart-fault-rank", type=int, default=None)
    args = parser.parse_args(argv)
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        if args.restart_fault is not None:
            args.fault = args.restart_fault
        if args.restart_fault_rank is not None:
            args.fault_rank = args.restart_fault_rank
    return args


def inject(args: argparse.Namespace, rank: int, model: torch.nn.Module,
           subgroup: dist.ProcessGroup | None) -> None:
    fault, step = args.fault, args.fault_step
    if fault in ("evaluate_all", "livelock"):
        announce(fault)
    if fault == "evaluate_all":
        evaluate_for(model, args.fault_seconds)
    elif fault == "livelock":
        spin_until_ready()
    elif fault == "lock":
        update_metrics()
    elif fault == "barrier":
        save_checkpoint()
    elif fault == "early_exit":
        print(f"rank {rank}: leaving early at step {step}", flush=True)
        atexit.register(time.sleep, args.exit_seconds)  # runs before the hook's: LIFO
        sys.exit(args.exit_code)
    elif fault == "crash":
        atexit.register(time.sleep, args.exit_seconds)
        read_shard(7)
    elif fault == "killed":
        announce("killed")
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault == "subgroup" and rank == 0:
        dist.all_reduce(torch.ones(1), group=subgroup)
    elif fault == "subgroup" and rank == 1:
        load_shard()
    elif fault == "nccl_peer_closed":
        write_nccl_debug_lines(int(os.environ.get("LOCAL_RANK", "0")), peer_closed=True)
        load_shard()


def load_checkpoint(model: torch.nn.Module) -> None:
    """Stands for loading a checkpoint on rank 0 only, after DDP broadcast the weights."""
    torch.manual_seed(1234)
    model.load_state_dict(torch.nn.Linear(8, 1).state_dict())


def build_model(mistakes: list[str], rank: int) -> tuple[torch.nn.Module, torch.dtype]:
    """The model and the dtype its inputs need."""
    if "no_ddp" in mistakes:
        return torch.nn.Linear(8, 1), torch.float32
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    if "load_after_ddp" in mistakes and rank == 0:
        load_checkpoint(model.module)
    if "cast_after_ddp" in mistakes:
        return model.double(), torch.float64
    return model, torch.float32


def join(rank: int, world_size: int, init_method: str | None) -> None:
    """init_process_group. torch 2.13's torchrun hands every attempt it restarts the same
    store, which still holds the keys the previous attempt's ranks wrote: a restarted gloo rank
    may read a dead peer's address ("Gloo connectFullMesh failed"). A prefix per attempt keeps
    the attempts apart."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt and rank < 0:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              is_master=False)
        dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{attempt}", store),
                                rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                init_method=init_method)


def main(argv: list[str], rank: int = -1, world_size: int = -1, init_method: str | None = None
         ) -> int:
    """Train as the rank torchrun's environment names, or as `rank` of `world_size`."""
    args = parse_args(argv)
    if args.fault == "init_stall" and args.fault_rank == (
            rank if rank >= 0 else int(os.environ["RANK"])):
        prepare_dataset()
    join(rank, world_size, init_method)
    rank, world = dist.get_rank(), dist.get_world_size()
    write_nccl_debug_lines(int(os.environ.get("LOCAL_RANK", "0")), peer_closed=False)
    subgroup = dist.new_group([0, 1]) if args.fault == "subgroup" else None
    stall = args.fault in ("data_stall", "slow_read") and rank == args.fault_rank
    dataset = (StallingWorkerSamples(64 * world, args.fault_step, BATCH_SIZE)
               if args.fault == "worker_stall" and rank == args.fault_rank
               else Samples(64 * world, args.fault_step if stall else None,
                            args.fault_seconds if args.fault == "slow_read" else None))
    sampler = None if "no_sampler" in args.mistake else DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler,
                        num_workers=args.num_workers)
    if args.fault == "pre_ddp_stall" and rank == args.fault_rank:
        load_pretrained()
    if "sampler_shuffle" in args.mistake:
        shuffle_with_sampler(dataset, sampler)
    model, dtype = build_model(args.mistake, rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    evaluate_for(model, args.slow_start)
    step, epoch = 0, 0
    while step < args.steps:
        if sampler is not None and "no_set_epoch" not in args.mistake:
            sampler.set_epoch(epoch)
        dataset.first_step = step
        for x, y in loader:
            x, y = x.to(dtype), y.to(dtype)
            Progress.step = step
            if args.fault == "slow_steps" and step % 3 == 1:
                evaluate()
            if step == args.fault_step and (rank == args.fault_rank or args.fault in EVERY_RANK):
                inject(args, rank, model, subgroup)
            if step == args.checkpoint_at:
                writer = args.fault_rank if args.checkpoint_rank is None else args.checkpoint_rank
                checkpoint(rank == writer, args.fault_seconds)
            if args.evaluate_every and step and step % args.evaluate_every == 0:
                announce("evaluation")
                evaluate_for(model, args.fault_seconds)
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            if args.fault == "lock_after_backward" and step == args.fault_step and (
                    rank == args.fault_rank):
                update_metrics()  # DDP's all-reduce is done; the optimizer step never comes
            optimizer.step()
            time.sleep(0.05)
            step += 1
            if step >= args.steps:
                break
        epoch += 1
    dist.destroy_process_group()
    if rank == 0:
        print(f"finished {step} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
