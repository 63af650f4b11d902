"""Issue 37, finding 2: py-spy's output is read within a bound, and only so many dumps run at
once, on the node and for one job. Its whole output was read into the root agent's memory with
no bound on size or on dumps at once: one user's ranks, deep in functions with long names, made
the agent's peak memory hundreds of MB larger."""

from __future__ import annotations

from tests.helpers.attack import agent, coordinator, memory_mib, scratch_dir, verdict
from tests.security.test_oversized_input import nobodys_job

GROWTH_MIB = 120  # what the agent's peak may grow by: 8 dumps of at most 4 MiB, parsed


def test_deep_stacks_with_long_names_do_not_multiply_the_agents_memory() -> None:
    with scratch_dir() as scratch, coordinator(scratch) as coord, \
            agent(scratch, scratch / "beacons", "--coordinator", coord.address) as node:
        before = memory_mib(node.proc.pid, "VmHWM")
        with nobodys_job(scratch, "wide-stacks", [(900, "")] * 8, name="\x01" * 4095):
            verdict(coord.address, "wide-stacks", timeout=120)
            grown = memory_mib(node.proc.pid, "VmHWM") - before
        assert node.alive, node.output()
    assert grown < GROWTH_MIB, f"the agent's peak grew by {grown:.0f} MiB"
