"""User tools: benchmarks (`scripts.bench`), run drivers (`scripts.runs`) and reports (`scripts.report`); run from
the repository root as `python3 -m scripts.<name> <subcommand>`."""
