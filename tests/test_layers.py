"""The package's imports run one way: numerics and kernels at the bottom (kernels may use only the formats),
then quant, ops, modules, integration, and the entry points on top. Checked on the source: static imports
(lazy ones inside functions too) and importlib calls, which must name their module as a literal below the top
layer (an entry point may import what a user's knob names: it may import every layer anyway). No module of the
package imports scripts/ or tests/ (the lab and the suite sit outside what is installed)."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "titan_fp4six"
LAYERS = {"numerics": 0, "kernels": 0, "quant": 1, "ops": 2, "modules": 3, "integration": 4}
TOP = 5  # the package root's modules (__init__, train) and any other subpackage (entry points)


def _layer(parts: tuple[str, ...]) -> int:
    return LAYERS.get(parts[0], TOP)


def _is_dynamic_import(func: ast.expr) -> bool:
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in ("import_module", "__import__")


def _imports(path: Path) -> list[tuple[str, ...]]:
    """Every titan_fp4six module path this file imports, as tuples of parts below the package."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    found = []
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = parts[:len(parts) - node.level]
                mod = base + tuple((node.module or "").split(".")) if node.module else base
                found += [mod + (a.name,) for a in node.names] if not node.module else [mod]
            elif node.module and node.module.startswith("titan_fp4six"):
                found.append(tuple(node.module.split(".")[1:]))
        elif isinstance(node, ast.Import):
            found += [tuple(a.name.split(".")[1:]) for a in node.names if a.name.startswith("titan_fp4six")]
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func):
            arg = node.args[0] if node.args else None
            if not isinstance(arg, ast.Constant) and _layer(parts) == TOP:
                continue
            assert isinstance(arg, ast.Constant), f"{path}: importlib with a computed module name"
            if arg.value.startswith("titan_fp4six."):
                found.append(tuple(arg.value.split(".")[1:]))
    return [f for f in found if f and f[0]]


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_a_layer_above_its_own(path):
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    own = _layer(parts)
    for target in _imports(path):
        assert _layer(target) <= own, f"{'.'.join(parts)} imports titan_fp4six.{'.'.join(target)} from a layer above"


def _outside_names(path: Path) -> list[str]:
    """Every module outside the package's layers that this file imports by name: static imports (lazy ones too),
    importlib calls with a literal, and strings that are a dotted module name (what a subprocess or torchtitan's
    `--experimental.custom_import` would import)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"\w+(\.\w+)+", node.value):
            found.append(node.value)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func) and node.args \
                and isinstance(node.args[0], ast.Constant):
            found.append(node.args[0].value)
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_package_never_imports_the_lab_or_the_tests(path):
    """scripts/ (studies, benchmarks, reports, the parity loaders) and tests/ use the package, never the reverse:
    the package is what users install, and neither folder is installed with it."""
    lab = [name for name in _outside_names(path) if name.split(".")[0] in ("scripts", "tests")]
    assert not lab, f"{path.relative_to(PACKAGE)} imports {lab}"


@pytest.mark.parametrize("path", sorted((PACKAGE / "kernels").glob("*.py")), ids=lambda p: p.name)
def test_kernels_import_only_the_formats(path):
    """Never the reference: the kernels are an independent implementation (the validation module lends the
    amax check's error messages)."""
    for target in _imports(path):
        assert target[0] == "kernels" or target[:2] in {("numerics", "formats"), ("numerics", "validation")}, target


@pytest.mark.parametrize("path", sorted((PACKAGE / "numerics").glob("*.py")), ids=lambda p: p.name)
def test_numerics_imports_nothing_above_it(path):
    for target in _imports(path):
        assert target[0] == "numerics", target


def test_only_the_quant_backends_name_the_kernels():
    """The kernels are imported in one place (quant.backends.kernels) and chosen in one (quant.primitives.pick)."""
    users = {p.relative_to(PACKAGE) for p in MODULES if any(t[0] == "kernels" for t in _imports(p))}
    assert {u for u in users if u.parts[0] != "kernels"} == {Path("quant/backends.py")}, users
    pickers = {p.relative_to(PACKAGE) for p in MODULES if "kernels()" in p.read_text()}
    assert pickers == {Path("quant/backends.py"), Path("quant/primitives.py")}, pickers


def test_the_dense_backward_walk_stays_short():
    """scripts.walk (docs/architecture.md): a new key's dense quantized backward goes op -> role quantizer -> pick ->
    leaf, 56 package functions on the CPU path; a detour through the layers (a plan rebuilt from its key, a second
    choice of kernel) shows here first."""
    from scripts import walk

    stops = walk.walk("reference", 32)
    assert stops[0] == ("ops/dense.py", "dense_bwd") and ("quant/primitives.py", "pick") in stops
    assert len(stops) <= 60, stops
