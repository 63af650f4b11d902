"""Benchmarks: scripts that print numbers, run from the repository root as
`python -m tests.bench.NAME`; pytest collects none of them."""
