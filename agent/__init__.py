"""The per-node agent (its own process, or embedded in `watchdog run`): finds training ranks by
their beacons and in /proc, reads their progress, takes py-spy stacks and log tails on request,
and streams node reports to a coordinator.

From `watchdog` it uses only the modules shared by design: `beacon`, `beacondir`, `env`, `errors`,
`frames` (native or Python), `model`, `explain` (to pick relevant log lines), `text`, `transport`
and `metrics`.
"""

from agent.daemon import Agent

__all__ = ["Agent"]
