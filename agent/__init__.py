"""The per-node agent (its own process, or embedded in `watchdog run`): finds torchrun workers,
reads their beacons, takes py-spy stacks on request and streams node reports to a coordinator."""
