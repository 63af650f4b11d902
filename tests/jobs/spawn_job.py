"""The demo training job (watchdog/demo/train.py) started the way PyTorch's DDP tutorial starts
one: `torch.multiprocessing.spawn`, each process calling init_process_group(rank=r,
world_size=n) with no RANK in its environment. Options not listed here go to train.py.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile

import torch.multiprocessing as mp

from watchdog.demo import train


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run_rank(rank: int, world: int, init_method: str, train_args: list[str]) -> None:
    code = train.main(train_args, rank=rank, world_size=world, init_method=init_method)
    if code:
        sys.exit(code)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--init-method", choices=("env", "tcp", "file"), default="env")
    args, train_args = parser.parse_known_args()
    port = free_port()
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    with tempfile.TemporaryDirectory() as tmp:
        init_method = {"env": "env://", "tcp": f"tcp://127.0.0.1:{port}",
                       "file": f"file://{tmp}/rendezvous"}[args.init_method]
        mp.spawn(run_rank, args=(args.nproc, init_method, train_args), nprocs=args.nproc)


if __name__ == "__main__":
    main()
