"""How long after a rank stops a hang is named, at the defaults a user gets (a script, not a
test): `python -m tests.bench.detection_latency [--runs 3] [--steps 6 60] [--hogs 0]
[--evaluation 0]`.

Each run is `watchdog run --on-hang kill` over a 4-rank torchrun job (gloo, CPU) in which
rank 1 blocks in data loading at the given step; the latency is the incident's `detected_at`
minus the time the rank printed as its fault began. The target is the stall floor (10 s) plus
2 s. `--hogs N` keeps N processes spinning on the CPU meanwhile, as a shared CI machine does;
`--evaluation S` has every rank evaluate for S seconds every 40 steps before the stall (a long
phase, which must not slow the verdict after it: use steps past 40).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.helpers.harness import fault_time, job_env, run_command, watched_run
from watchdog.cli.demo import torchrun_command

FLOOR_S = 10.0  # --stall-floor's default
HOG = "while True: pass"


def latency(step: int, evaluation: float, workdir: Path) -> float:
    """Seconds from the fault to the incident of one run."""
    report = workdir / "incident.json"
    phases = ("--evaluate-every", "40", "--fault-seconds", str(evaluation)) if evaluation else ()
    job = torchrun_command(4, "--fault", "data_stall", "--fault-rank", "1",
                           "--fault-step", str(step), *phases)
    done = subprocess.run(run_command(report, job, ("--on-hang", "kill")), env=job_env(workdir),
                          capture_output=True, text=True, timeout=300)
    run = watched_run(done.returncode, done.stdout + done.stderr, report)
    if run.incident is None:
        raise SystemExit(f"no incident (exit {done.returncode}):\n{run.output}")
    return float(run.incident["detected_at"]) - fault_time(run.output, "data_stall")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, nargs="+", default=[6, 60])
    parser.add_argument("--hogs", type=int, default=0)
    parser.add_argument("--evaluation", type=float, default=0.0, metavar="S")
    args = parser.parse_args()
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
    try:
        for step in args.steps:
            seen = []
            for _ in range(args.runs):
                with tempfile.TemporaryDirectory() as workdir:
                    seen.append(latency(step, args.evaluation, Path(workdir)))
            after = f" after {args.evaluation:.0f} s evaluations" if args.evaluation else ""
            print(f"stall at step {step}{after}, {args.hogs} CPU hogs: "
                  f"{', '.join(f'{s:.2f}' for s in seen)} s; median {statistics.median(seen):.2f}"
                  f" s, max {max(seen):.2f} s (target {FLOOR_S + 2:.0f} s)", flush=True)
    finally:
        for hog in hogs:
            hog.kill()


if __name__ == "__main__":
    main()
