"""The variants of one comparison: a 4/6 recipe, its bf16 and plain-NVFP4 twins, and named knob changes.

Why derived, not listed: twins written by hand drift from their recipe (a changed schedule in one file only).
From the 4/6 recipe: bf16 drops the four-over-six converters and their sections; plain NVFP4 sets
``scope = "none"`` and ``scale_bound = 448`` in every four-over-six section (docs/numerics.md). An extra
variant is ``NAME=BASE [knob=value ...] [--section.key value ...]``: the knobs go into every four-over-six
section of BASE's recipe, the ``--`` overrides to its trainer command line (shell quoting: a BASE with a space
is written ``'nvfp4 B256'``).
"""

import copy
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import tomli

from ..quant.recipe import PLAIN_NVFP4

SECTIONS = ("linear", "grouped_mm")  # [quantize.<kind>.four_over_six]
CONVERTERS = tuple(f"quantize.{kind}.four_over_six" for kind in SECTIONS)
BF16, NVFP4, FOUR_OVER_SIX = "bf16", "nvfp4", "4/6"
SET_BY_COMPARE = ("--training.steps", "--debug.seed")
"""Trainer keys every run gets from compare itself (--steps, --seeds/--seed-start)."""


def sets_compare_key(args: list[str]) -> str | None:
    """The first of args that sets a SET_BY_COMPARE key (`--key value` or `--key=value`), or None."""
    return next((a for a in args if a.split("=", 1)[0] in SET_BY_COMPARE), None)


@dataclass
class Variant:
    """One arm of the comparison: its recipe (a TOML document as a dict) and extra trainer overrides."""

    name: str
    recipe: dict
    overrides: list[str] = field(default_factory=list)

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "_", self.name.replace("/", "of")).strip("_")


def load_recipe(path: str | Path) -> dict:
    with open(path, "rb") as f:
        recipe = tomli.load(f)
    listed = recipe.get("model", {}).get("converters", [])
    if not any(c in CONVERTERS for c in listed):
        raise ValueError(f"{path}: model.converters = {listed} lists no four-over-six converter; compare takes a "
                         f"4/6 recipe (converters {list(CONVERTERS)}) and derives its bf16 and NVFP4 twins")
    return recipe


def _sections(recipe: dict) -> list[dict]:
    quantize = recipe.get("quantize", {})
    return [quantize[kind]["four_over_six"] for kind in SECTIONS if "four_over_six" in quantize.get(kind, {})]


def with_knobs(recipe: dict, knobs: dict, name: str) -> dict:
    """A copy of `recipe` with `knobs` set in every four-over-six section (each converter it lists has one)."""
    out = copy.deepcopy(recipe)
    quantize = out.setdefault("quantize", {})
    for kind, converter in zip(SECTIONS, CONVERTERS):
        if converter in out["model"].get("converters", []):
            quantize.setdefault(kind, {}).setdefault("four_over_six", {})
    sections = _sections(out)
    if not sections:
        raise ValueError(f"variant {name!r}: its base recipe has no four-over-six section to set {knobs} in")
    for section in sections:
        section.update(knobs)
    _describe(out, name)
    return out


def bf16_twin(recipe: dict) -> dict:
    out = copy.deepcopy(recipe)
    kept = [c for c in out["model"].pop("converters", []) if c not in CONVERTERS]
    if kept:
        out["model"]["converters"] = kept
    quantize = out.get("quantize", {})
    for kind in SECTIONS:
        quantize.get(kind, {}).pop("four_over_six", None)
        if kind in quantize and not quantize[kind]:
            del quantize[kind]
    if "quantize" in out and not out["quantize"]:
        del out["quantize"]
    _describe(out, BF16)
    return out


def _describe(recipe: dict, name: str) -> None:
    job = recipe.setdefault("job", {})
    job["description"] = f"{job.get('description', 'recipe')} [compare: {name}]"


def _value(text: str):
    """A knob value as TOML reads it (`448` is an int, `true` a bool), else the bare word as a string."""
    try:
        return tomli.loads(f"v = {text}")["v"]
    except tomli.TOMLDecodeError:
        return text


def parse_variant(spec: str, known: dict[str, Variant]) -> Variant:
    """'NAME=BASE [knob=value ...] [--section.key value ...]' against the variants defined so far."""
    name, sep, rest = spec.partition("=")
    name, parts = name.strip(), shlex.split(rest)
    if not sep or not name or not parts:
        raise ValueError(f"--variant {spec!r}: expected 'NAME=BASE [knob=value ...] [--section.key value ...]'")
    if name in known:
        raise ValueError(f"--variant {spec!r}: the name {name!r} is taken (variants so far: {list(known)})")
    base = known.get(parts[0])
    if base is None:
        raise ValueError(f"--variant {spec!r}: base {parts[0]!r} is not a variant; valid: {list(known)}")
    knobs, overrides = {}, []
    for i, part in enumerate(parts[1:], 1):
        if part.startswith("--"):
            overrides = parts[i:]
            break
        key, eq, value = part.partition("=")
        if not eq:
            raise ValueError(f"--variant {spec!r}: {part!r} is neither knob=value nor a --section.key override")
        knobs[key] = _value(value)
    taken = sets_compare_key(overrides)
    if taken:
        raise ValueError(f"--variant {spec!r}: {taken!r} is set by compare for every run: use --steps and "
                         "--seeds/--seed-start")
    recipe = with_knobs(base.recipe, knobs, name) if knobs else copy.deepcopy(base.recipe)
    return Variant(name, recipe, [*base.overrides, *overrides])


def derive(recipe: dict, extra: list[str] = (), only: list[str] | None = None) -> list[Variant]:
    """bf16, NVFP4, 4/6 and the extra variants, in that order (`only` keeps the named ones)."""
    variants = {BF16: Variant(BF16, bf16_twin(recipe)),
                NVFP4: Variant(NVFP4, with_knobs(recipe, PLAIN_NVFP4, NVFP4)),
                FOUR_OVER_SIX: Variant(FOUR_OVER_SIX, with_knobs(recipe, {}, FOUR_OVER_SIX))}
    for spec in extra:
        v = parse_variant(spec, variants)
        same = [u.name for u in variants.values() if u.slug == v.slug]
        if same:
            raise ValueError(f"--variant {spec!r}: its files would be named {v.slug!r}, as variant {same[0]!r}'s "
                             "(names are written with '/' as 'of' and other characters as '_'); pick another name")
        variants[v.name] = v
    if only:
        unknown = [n for n in only if n not in variants]
        if unknown or BF16 not in only:
            raise ValueError(f"--only {only}: every gap is taken to bf16, so it must list {BF16!r}; unknown: "
                             f"{unknown}; valid: {list(variants)}")
        return [variants[n] for n in variants if n in only]
    return list(variants.values())


def dumps(doc: dict) -> str:
    """TOML text for a recipe (tables, strings, numbers, booleans and lists of them: what recipes hold)."""
    lines: list[str] = []

    def scalar(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list):
            return "[" + ", ".join(scalar(x) for x in v) + "]"
        raise TypeError(f"cannot write {type(v).__name__} {v!r} to a recipe")

    def table(prefix: str, t: dict) -> None:
        plain = {k: v for k, v in t.items() if not isinstance(v, dict)}
        if prefix and (plain or not any(isinstance(v, dict) for v in t.values())):
            lines.extend(["", f"[{prefix}]"])
        lines.extend(f"{k} = {scalar(v)}" for k, v in plain.items())
        for k, v in t.items():
            if isinstance(v, dict):
                table(f"{prefix}.{k}" if prefix else k, v)

    table("", doc)
    return "\n".join(lines).lstrip("\n") + "\n"
