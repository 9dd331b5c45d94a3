"""The user tools have one shape: `python -m titan_fp4six.<tool>` runs a `main(argv=None) -> int` (a module of the
package's top or its package's `__main__`), and pyproject.toml's [project.scripts] names the same function as
`titan-fp4six-<tool>`. Lab tools (studies, benchmarks, reports) are `python -m scripts.<name>`, never entry points."""

import importlib
import inspect
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = {"train": "titan_fp4six.train", "rl": "titan_fp4six.rl.__main__", "export": "titan_fp4six.export",
         "compare": "titan_fp4six.compare.__main__", "fidelity": "titan_fp4six.fidelity",
         "dry-run": "titan_fp4six.dry_run"}
TRAINING_LAUNCHERS = {"train", "rl"}  # they end a finished run with train.exit_after_run, not Python's exit


def test_every_tool_is_an_entry_point_and_nothing_else_is():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {f"titan-fp4six-{tool}": f"{module}:main" for tool, module in TOOLS.items()}


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_each_tool_is_python_m_of_its_name_with_main_argv_none_returning_int(tool):
    module = TOOLS[tool]
    assert module.removesuffix(".__main__") == "titan_fp4six." + tool.replace("-", "_")
    source = (ROOT / (module.replace(".", "/") + ".py")).read_text()
    ending = "exit_after_run(main())" if tool in TRAINING_LAUNCHERS else "sys.exit(main())"
    assert re.search(r'if __name__ == "__main__":\n(    .*\n\n)?    ' + re.escape(ending) + "\n", source), module
    main = importlib.import_module(module).main
    params = list(inspect.signature(main).parameters.values())
    assert [(p.name, p.default) for p in params] == [("argv", None)], module
    assert inspect.signature(main).return_annotation is int, module
