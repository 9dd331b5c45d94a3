"""Make the test process look started as `python -m MODULE ARGV`: what scripts/results_page.command_line() reads for
a results section's provenance line (pytest-xdist workers run under `python -c`)."""

import sys


def as_module(monkeypatch, module: str, *argv: str) -> None:
    class Main:
        class __spec__:  # noqa: N801 - the attribute python -m sets
            name = module

    monkeypatch.setitem(sys.modules, "__main__", Main)
    monkeypatch.setattr(sys, "argv", [f"/abs/{module.replace('.', '/')}.py", *argv])
