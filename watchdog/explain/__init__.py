"""`watchdog explain`: classifies NCCL, PyTorch and torchrun log lines into findings with a
cause and a fix. Stdlib only: it runs in the CLI, and in the agent and the coordinator wherever
log tails become evidence."""

from watchdog.explain.findings import (
    CulpritLedger,
    FirstFailure,
    InferredFinding,
    LogFinding,
    SummaryFinding,
)
from watchdog.explain.scan import classify_line, explain_lines, explain_main

__all__ = [
    "CulpritLedger",
    "FirstFailure",
    "InferredFinding",
    "LogFinding",
    "SummaryFinding",
    "classify_line",
    "explain_lines",
    "explain_main",
]
