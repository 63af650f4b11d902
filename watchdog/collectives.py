"""The names of the torch.distributed calls in which a rank waits for its peers (stdlib only).

The hook wraps each of these and records its name as the op; the coordinator looks for the same
names in a rank's stack to tell a rank waiting for its peers. One list, so that every op the
hook can record is one the coordinator recognises.
"""

from __future__ import annotations

from collections.abc import Mapping

COLLECTIVES = (
    "all_reduce", "broadcast", "barrier", "all_gather", "all_gather_into_tensor",
    "all_gather_object", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "gather", "scatter", "broadcast_object_list", "monitored_barrier",
    "gather_object", "scatter_object_list", "all_gather_coalesced", "all_reduce_coalesced",
    # torch 2.13's names for the two `_tensor` ones above, which FSDP2 calls from its hooks
    "all_gather_single", "reduce_scatter_single",
)  # fmt: skip
# Point-to-point transfers: name -> its peer's parameters (global rank, rank in the group), and
# whether it returns before the transfer ends.
POINT_TO_POINT: Mapping[str, tuple[str, str, bool]] = {
    "send": ("dst", "group_dst", False), "recv": ("src", "group_src", False),
    "isend": ("dst", "group_dst", True), "irecv": ("src", "group_src", True),
}
# Collectives that mean the ranks train one model (for NO_GRAD_SYNC): they reduce gradients, or
# the model is split across ranks (FSDP's and tensor parallelism's gathers, experts' all-to-all).
# Point-to-point transfers (pipeline stages) count too. A barrier or an object gather does not.
SHARES_MODEL = frozenset({
    "all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter", "reduce_scatter_tensor",
    "reduce_scatter_single", "all_gather_into_tensor", "all_gather_single", "all_to_all",
    "all_to_all_single",
})  # fmt: skip
# The op recorded for DDP's constructor's shape check and parameter broadcast, which torch
# issues from C++ (the hook's patches/ddp.py); the coordinator words it as DDP's broadcast.
DDP_INIT_OP = "ddp_init"
# The functions a stack shows while its rank waits for its peers: every call above, and
# autograd's backward, inside which DDP's gradient all-reduce waits.
WAITS_FOR_PEERS = frozenset(
    {*COLLECTIVES, *POINT_TO_POINT, "run_backward", "_engine_run_backward"})
