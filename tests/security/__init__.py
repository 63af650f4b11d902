"""Security tests: each attack of the threat model run as `nobody` against real daemons running
as root, and fuzzing of beacon files and RPC messages. `pytest -m security` (as root)."""
