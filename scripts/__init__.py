"""Benchmarks, reports and run drivers; run from the repository root as `python3 -m scripts.<name>`."""
