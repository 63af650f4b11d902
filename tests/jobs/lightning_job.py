"""A PyTorch Lightning job on CPU: a tiny model trained with the "ddp" strategy (gloo) on 4
processes, a validation at --val-step that computes for --val-seconds on every rank, then rank
--fault-rank blocks reading a sample from --fault-step on (its dataset's __getitem__ never
returns). `--fault-rank -1` trains --steps steps and ends. With --slow-rank R, rank R decodes
each batch --slow-s longer than the others (a straggler).

`python lightning_job.py` starts the other ranks itself (Lightning's launcher runs this script
again with LOCAL_RANK set); under `torchrun --nproc_per_node=4` each rank is torchrun's. The
dataset, its read and the validation's computing are the demo job's (watchdog/demo/train.py),
which announces the fault on stderr as the tests expect.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings

import lightning as L
import torch
from lightning.fabric.utilities.warnings import PossibleUserWarning
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader

from watchdog.demo import train

WORLD = 4
BATCH = 4
VAL_BATCHES = 10  # the validation's length is spread over these


def decode_batch(seconds: float) -> None:
    """Stands for a shard that decodes slowly on one rank."""
    time.sleep(seconds)


class TinyModule(L.LightningModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        x, y = batch
        time.sleep(0.05)  # the demo job's pace
        if self.global_rank == self.args.slow_rank:
            decode_batch(self.args.slow_s)
        return torch.nn.functional.mse_loss(self.net(x), y)

    def on_train_batch_start(self, batch: object, batch_idx: int) -> None:
        train.Progress.step = self.global_step  # what the dataset's fault is timed by

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> None:
        train.evaluate_for(self.net, self.args.val_seconds / VAL_BATCHES)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, torch.Tensor]]:
        stall = self.global_rank == self.args.fault_rank
        # Lightning adds the DistributedSampler: each rank gets a quarter of the samples.
        samples = train.Samples(WORLD * BATCH * (self.args.steps + 1),
                                self.args.fault_step if stall else None)
        return DataLoader(samples, batch_size=BATCH, num_workers=0)

    def val_dataloader(self) -> DataLoader[tuple[torch.Tensor, torch.Tensor]]:
        return DataLoader(train.Samples(WORLD * BATCH * VAL_BATCHES, None), batch_size=BATCH)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--val-step", type=int, default=40, help="validate every N steps")
    parser.add_argument("--val-seconds", type=float, default=30.0,
                        help="how long each validation computes, on every rank")
    parser.add_argument("--fault-rank", type=int, default=1, help="-1: no fault")
    parser.add_argument("--fault-step", type=int, default=46)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-s", type=float, default=0.4)
    return parser.parse_args(argv)


def quiet() -> None:
    """Lightning's banners and tips, and warnings about this job being small, on every rank."""
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=PossibleUserWarning)  # few workers, few batches
    warnings.filterwarnings("ignore", message=".*LeafSpec")  # Lightning 2.6 on torch 2.13


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    quiet()
    trainer = L.Trainer(
        accelerator="cpu", devices=WORLD, strategy=DDPStrategy(process_group_backend="gloo"),
        max_steps=args.steps, val_check_interval=args.val_step, limit_val_batches=VAL_BATCHES,
        num_sanity_val_steps=0, check_val_every_n_epoch=None, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(TinyModule(args))
    if trainer.global_rank == 0:
        print(f"finished {trainer.global_step} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
