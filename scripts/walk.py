"""Count the package functions one dense quantized backward walks through (docs/architecture.md).

    python -m scripts.walk [--quantizer reference] [--rows 64]

Runs one small dense_bwd (backward 'quantized': every backward operand), as the first call of its recipe
(the package's stored resolutions cleared: the backends and role quantizers are built as a new key's are; the
plan is kept, a pure function of the key string, recipe.plan_of_key) under
sys.setprofile and reports every titan_fp4six function entered, in order: the stops, the files they
are in, and the climbs (a stop in a higher layer than the stop before it: numerics / kernels < quant < ops <
modules < integration). Counting starts at the op body (dense_bwd) and ends at the leaves, the first numerics or
kernels function of each call chain (the reference or a kernel launcher; its own helpers are not counted): the
path a reader follows from the recipe's key to the arithmetic.
"""

import argparse
import sys
from pathlib import Path

import torch

LAYERS = {"numerics": 0, "kernels": 0, "dispatch": 1, "quant": 1, "ops": 2, "modules": 3, "integration": 4}


def _layer(relative: Path) -> int:
    return LAYERS.get(relative.parts[0], 5)


def walk(quantizer: str, rows: int, warm: bool = False) -> list[tuple[str, str]]:
    import titan_fp4six
    from titan_fp4six import FourOverSixRecipe, four_over_six_linear

    root = Path(titan_fp4six.__file__).parent
    device = "cuda" if torch.cuda.is_available() and quantizer != "reference" else "cpu"
    recipe = FourOverSixRecipe(quantizer=quantizer, backward="quantized")
    x = torch.randn(rows, 128, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(64, 128, device=device, dtype=torch.bfloat16, requires_grad=True)
    out = four_over_six_linear(x, w, recipe=recipe)
    dy = torch.randn_like(out)
    for module in [m for name, m in sys.modules.items() if name.startswith("titan_fp4six.") and not warm]:
        for value in list(vars(module).values()):  # a first call of a new key: every stored resolution redone
            if callable(getattr(value, "cache_clear", None)) and getattr(value, "__module__", "") == module.__name__:
                if getattr(value, "__name__", "") != "plan_of_key":
                    value.cache_clear()
    stops, inside = [], [False]

    def profile(frame, event, arg):
        if event != "call":
            return
        path = Path(frame.f_code.co_filename)
        if root not in path.parents:
            return
        name = frame.f_code.co_name
        if name == "dense_bwd":
            inside[0] = True
        caller = Path(frame.f_back.f_code.co_filename)
        below = root in caller.parents and _layer(caller.relative_to(root)) == 0
        if inside[0] and not name.startswith("<") and not below:  # a leaf's own helpers are not stops
            stops.append((str(path.relative_to(root)), name))

    sys.setprofile(profile)
    try:
        out.backward(dy)
    finally:
        sys.setprofile(None)
    return stops


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quantizer", default="reference", choices=("reference", "auto"))
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--warm", action="store_true", help="keep what the forward resolved (a later call's walk)")
    args = parser.parse_args(argv)
    stops = walk(args.quantizer, args.rows, args.warm)
    layers = [_layer(Path(f)) for f, _ in stops]
    climbs = sum(b > a for a, b in zip(layers, layers[1:]))
    for f, name in stops:
        print(f"  {f}:{name}")
    print(f"{len(stops)} stops ({len(set(stops))} distinct functions) in {len({f for f, _ in stops})} files, "
          f"{climbs} climbs back up a layer")


if __name__ == "__main__":
    main()
