"""Benchmarks, each runnable as `python -m bench.<name>`; results go to docs/bench/."""
