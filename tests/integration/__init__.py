"""Integration tests: real torchrun jobs (gloo on CPU), agents and coordinators over real gRPC,
real py-spy, and Debian's Chromium for the report and the web view. `pytest -m integration`."""
