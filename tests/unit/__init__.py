"""Unit tests: logic in this process on real data (beacons written and read here, fixtures of
real logs and py-spy output); no daemon, no job. The loop after each edit: `pytest -m unit`."""
