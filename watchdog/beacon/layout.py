"""Where each field of a beacon lies: magic, version, sizes, the structs and their offsets.

One fixed, little-endian layout; docs/design.md draws it as a table. How it grew (a layout
change bumps VERSION, and a reader refuses any other version: a beacon lives only as long as its
rank, so there is nothing to migrate):
  1. header, seqlock, liveness stamp, identity, progress, 16 group slots;
  2. the pace (OFF_PACE), in the gap left before the group slots;
  3. the start-up region after the group slots (attempt, set-up call, exit record), and the
     silent-bug checks with their fingerprints after it;
  4. the first non-finite loss in the checks, room for 32 fingerprints, and fingerprints of
     the parameters an optimizer steps once their gradients were averaged by hand;
  5. when the compile under way began (torch.compile), after the pace (OFF_COMPILING);
  6. the rank's environment (versions, how it set its process group up, its CUDA devices),
     written once at init_process_group and once when DDP wraps a CUDA module, at the end
     (OFF_ENVIRONMENT);
  7. the seconds the rank has waited inside collectives, in all, by its own clock, and the sum
     of each step's, squared (straggler detection), after the environment (OFF_WAITED).
"""

from __future__ import annotations

import struct

MAGIC = b"THWBEACN"
VERSION = 7
MAX_GROUPS = 16
MAX_LISTED_RANKS = 256
ALL_WORLD = -1  # n_listed for a group that spans the whole world, at any size
# The largest job the project is built for (an incident stays bounded at that size): a larger
# world in a beacon is a forgery or corruption, not a job. Bounds readers only: not in the bytes.
MAX_WORLD = 1 << 17
MAX_EXIT_REASON = 2048  # bytes of UTF-8 JSON: an uncaught exception's type, message and frames
# 4 DDP modules x (parameters, batch) x the last 3 of each, and the last 3 of 2 process groups
# over which an optimizer's gradients were averaged by hand
MAX_FINGERPRINTS = 32

EXIT_RUNNING, EXIT_CLEAN, EXIT_EXCEPTION = 0, 1, 2

# The silent-bug checks a hook can run (`WATCHDOG_CHECKS`); bit i of the beacon's mask is the
# i-th name. Each is the lower-case name of the finding it feeds.
CHECK_NAMES = ("replica_desync", "no_grad_sync", "duplicate_data", "sampler_epoch_reused",
               "ddp_module_changed", "nonfinite_loss")
# What a fingerprint is of (stored as index + 1): a DDP module's parameters, the batch its
# forward got, the parameters an optimizer steps whose gradients were averaged over a group.
FINGERPRINT_OF = ("parameters", "batch", "optimizer")

HEADER = struct.Struct("<8sII")  # magic, version, total size
HEARTBEAT = struct.Struct("<d")
IDENTITY = struct.Struct("<iiiid64s64s")  # pid, rank, local_rank, world, created_at, job, host
# steps, step_at, n_groups, exit_state, exit_code, exited_at, phase, phase_started, phase_timeout
PROGRESS = struct.Struct("<QdIIid32sdd")
N_GROUPS = struct.Struct("<I")
EXIT = struct.Struct("<Iid")  # exit_state, exit_code, exited_at (n_groups left alone)
PHASE = struct.Struct("<32sdd")
PACE = struct.Struct("<ddQ")  # progress_at, gap_p99, gaps
COMPILING = struct.Struct("<d")  # when the compile under way began; 0: none
GROUP_META = struct.Struct("<32sii")  # name, size, n_listed
GROUP_HOT = struct.Struct("<24sQdQ")  # op, entered_seq, entered_at, completed_seq
RANKS = struct.Struct(f"<{MAX_LISTED_RANKS}i")
# attempt (torchrun restart count), exit reason length, the process-group set-up call the rank
# is inside (init_process_group, new_group) since when, and where it meets its peers
START = struct.Struct("<II24sd128s")
ATTEMPT = struct.Struct("<I")
REASON_LEN = struct.Struct("<I")
SETUP = struct.Struct("<24sd128s")
# enabled (mask), n_fingerprints, taken, unsynced_steps, sampler_reuses, sampler_reuse_step,
# sampler_epoch, ddp_change_step, ddp_change_module, ddp_change_group, ddp_change, 1 + the step
# of the first non-finite loss (0, as a new beacon holds: none) and its value
CHECKS = struct.Struct("<IIQQQQqQI32s64s4xQd")
FINGERPRINT = struct.Struct("<IIQQ32s")  # of, module, step, digest, group
# world size and backend init_process_group was asked for, 1 + the CUDA device (index) its
# process group and the first DDP module on CUDA use (0, as a new beacon holds: none), the
# torch, CUDA, NCCL, Python and watchdog versions, CUDA_VISIBLE_DEVICES
ENVIRONMENT = struct.Struct("<iii4x32s32s16s16s16s16s256s")
WAITED = struct.Struct("<dd")  # seconds spent inside collectives since the rank began; the
# sum of each step's seconds there, squared (how evenly the steps wait)
MAX_VISIBLE_DEVICES = 256  # bytes of CUDA_VISIBLE_DEVICES kept: 6 GPU UUIDs, or 64 indexes

OFF_SEQ = 16
OFF_HEARTBEAT = 24
OFF_IDENTITY = 32
OFF_PROGRESS = OFF_IDENTITY + IDENTITY.size
OFF_N_GROUPS = OFF_PROGRESS + 16
OFF_EXIT = OFF_N_GROUPS + 4
OFF_PHASE = OFF_EXIT + EXIT.size
OFF_PACE = 272
OFF_COMPILING = OFF_PACE + PACE.size
OFF_GROUPS = 512
GROUP_SLOT_SIZE = GROUP_META.size + GROUP_HOT.size + RANKS.size
# Inside a slot: the hot fields that publish() stores one by one, then the member ranks.
OFF_OP = GROUP_META.size
OFF_ENTERED_SEQ = OFF_OP + 24
OFF_ENTERED_AT = OFF_OP + 32
OFF_COMPLETED = OFF_OP + 40
OFF_RANKS = GROUP_META.size + GROUP_HOT.size
OFF_START = OFF_GROUPS + MAX_GROUPS * GROUP_SLOT_SIZE
OFF_REASON_LEN = OFF_START + ATTEMPT.size
OFF_SETUP = OFF_START + 8
OFF_REASON = OFF_START + START.size
START_REGION = 4096  # reserved; the checks begin after it
OFF_CHECKS = OFF_START + START_REGION
OFF_FINGERPRINTS = OFF_CHECKS + CHECKS.size
OFF_ENVIRONMENT = OFF_FINGERPRINTS + MAX_FINGERPRINTS * FINGERPRINT.size
OFF_WAITED = OFF_ENVIRONMENT + ENVIRONMENT.size
SIZE = OFF_WAITED + WAITED.size

assert OFF_PROGRESS + PROGRESS.size <= OFF_PACE and OFF_COMPILING + COMPILING.size <= OFF_GROUPS
assert OFF_CHECKS % 8 == OFF_COMPILING % 8 == OFF_ENVIRONMENT % 8 == OFF_WAITED % 8 == 0
assert OFF_PROGRESS % 8 == OFF_PACE % 8 == OFF_GROUPS % 8 == GROUP_SLOT_SIZE % 8 == 0
assert OFF_ENTERED_SEQ % 8 == 0 and OFF_START % 8 == 0
assert START.size + MAX_EXIT_REASON <= START_REGION


def group_base(slot: int) -> int:
    """Where group slot `slot` begins."""
    return OFF_GROUPS + slot * GROUP_SLOT_SIZE
