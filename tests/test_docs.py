"""The docs cannot drift: every repository path, every dotted `titan_fp4six.*` / `scripts.*` / `tests.*` name and
every relative markdown link (with its `#anchor`) written in README.md and docs/**/*.md names something that
exists in this checkout.

What is checked, on every line of every page (code blocks included: their commands name recipes and modules):
- paths starting at the repository root (`titan_fp4six/...`, `scripts/...`, `configs/...`, `docs/...`,
  `tests/...`), or at the package (`numerics/reference.py`, `ops/grouped.py`, `integration/tt03/`), resolved
  against the root and against `titan_fp4six/`; `kernels/quantize.spec_flags` (a module, then a name in it) is
  the module file plus the name defined in it;
- bare file names (`setup.sh`, `export.py`, `qwen3_moe_debug_nvfp4.toml`): some file of that name exists;
- dotted names: the longest prefix that is a module or package, and the next part, if any, written in that
  module's source (a function, class, constant or re-export);
- relative links and images, resolved against the page's folder, and their anchors against the target page's
  headings (GitHub's slugs).
No path may climb out of the checkout (`../` past the root). Not checked: `outputs/` and `.venv*` (made by runs),
`<placeholders>`, and the short allow-list below."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "titan_fp4six"

# Paths the docs quote from other projects' repositories, with where they are quoted.
OTHER_REPOSITORIES = {
    "docs/features/low_precision_training/nvfp4/nvfp4.rst",  # TransformerEngine's docs (docs/numerics.md, 11)
    "run_train.sh",  # torchtitan's launcher (README, docs/integration.md, docs/troubleshooting.md)
}

_ROOT_DIRS = ("titan_fp4six", "scripts", "configs", "docs", "tests")
_PACKAGE_DIRS = tuple(sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("_")))
_LEAD = r"(?<![\w./<>*-])(?:\./)?"  # not inside a longer path, name or glob
_PATH = re.compile(_LEAD + r"((?:%s)/[\w./-]*)" % "|".join(_ROOT_DIRS + _PACKAGE_DIRS))
_BARE = re.compile(_LEAD + r"([\w-]+\.(?:py|toml|sh))\b(?![/\w*-])")
# `numerics/reference.py`, `formats.py`, `hadamard.py`: the later names of the first one's kind are in its folder
_LIST = re.compile(r"`((?:[\w.-]+/)+)[\w-]+(\.\w+)`((?:,\s*(?:and\s+|or\s+)?`[\w.-]+\.\w+`)+)")
_CODE_SPAN = re.compile(r"`[^`]*`")
_UP = re.compile(r"(?<![\w.])((?:\.\./)+[\w.-]*)")  # ../x: must stay inside the checkout
_DOTTED = re.compile(r"(?<![\w./-])((?:titan_fp4six|scripts|tests)(?:\.\w+)+)")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_SKIPPED = re.compile(r"^(?:outputs/|\.venv)")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@functools.cache
def _basenames() -> frozenset[str]:
    names = set()
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in ("outputs", "__pycache__", "build")]
        names.update(filenames)
    return frozenset(names)


@functools.cache
def _source(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _module_file(parts: tuple[str, ...]) -> Path | None:
    base = ROOT.joinpath(*parts)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _defines(source_file: Path, name: str) -> bool:
    return re.search(r"(?<![\w.])%s\b" % re.escape(name), _source(source_file)) is not None


def _path_exists(text: str) -> bool:
    """`text` (no trailing punctuation) under the root or the package: a file or folder, or `module.name`."""
    for base in (ROOT, PACKAGE):
        target = base / text
        if target.exists():
            return True
        # `quant/backends.resolve_backends`, `modules/fidelity/operands.quantized_backward_operands`
        stem, dot, attribute = text.rpartition(".")
        if dot and "/" not in attribute and (base / stem).with_suffix(".py").is_file():
            if _defines((base / stem).with_suffix(".py"), attribute):
                return True
    return False


def _dotted_exists(name: str) -> bool:
    parts = tuple(name.split("."))
    for n in range(len(parts), 0, -1):
        module = _module_file(parts[:n])
        if module is not None:
            return n == len(parts) or _defines(module, parts[n])
    return False


def _slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@functools.cache
def _anchors(page: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    anchors = set()
    in_code = False
    for line in _source(page).splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        slug = _slug(line.lstrip("#"))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return frozenset(anchors)


def _link_problem(page: Path, target: str) -> str | None:
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
        return None
    path, _, anchor = target.partition("#")
    resolved = (page.parent / path).resolve() if path else page
    if path and not resolved.exists():
        return "link to a missing file"
    if not resolved.is_relative_to(ROOT):
        return "link outside the repository"
    if anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
        return f"link to a missing heading #{anchor}"
    return None


def _clean(text: str) -> str:
    return text.rstrip(".,:;")


def problems_in(text: str, page: Path) -> list[str]:
    """Every name in `text` (a page of `page`'s folder) that does not exist, as 'line N: kind `name`'."""
    found = []
    in_code = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        for match in _UP.finditer(line):
            if not (page.parent / match.group(1)).resolve().is_relative_to(ROOT):
                found.append(f"line {number}: a path outside the repository `{match.group(1)}`")
        # links: not in code blocks or code spans (`kernel[grid](...)` is code)
        prose = "" if in_code else _CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        for match in _LINK.finditer(prose):
            problem = _link_problem(page, match.group(1))
            if problem:
                found.append(f"line {number}: {problem} `{match.group(1)}`")
        link_spans = [m.span(1) for m in _LINK.finditer(prose)]
        for match in _PATH.finditer(line):
            if any(a <= match.start(1) < b for a, b in link_spans):
                continue  # a link target: checked above, relative to the page
            path = _clean(match.group(1))
            if _SKIPPED.match(path) or path in OTHER_REPOSITORIES or "<" in line[match.end(1) : match.end(1) + 1]:
                continue
            if not _path_exists(path):
                found.append(f"line {number}: missing path `{path}`")
        for match in _BARE.finditer(line):
            name = match.group(1)
            if name in OTHER_REPOSITORIES or any(a <= match.start(1) < b for a, b in link_spans):
                continue
            if name.split(".")[0].isupper():  # RECIPE.toml: a placeholder
                continue
            if name not in _basenames():
                found.append(f"line {number}: no file named `{name}`")
        for match in _LIST.finditer(line):
            folder = match.group(1)
            if _SKIPPED.match(folder.removeprefix("./")):
                continue
            for name in re.findall(r"`([\w.-]+)`", match.group(3)):
                if name.endswith(match.group(2)) and not _path_exists(folder.removeprefix("./") + name):
                    found.append(f"line {number}: missing path `{folder}{name}` (a list after `{folder}`)")
        for match in _DOTTED.finditer(line):
            name = _clean(match.group(1))
            if not _dotted_exists(name):
                found.append(f"line {number}: missing module or name `{name}`")
    return found


def test_docs_name_only_what_exists():
    report = []
    for page in doc_files():
        for problem in problems_in(_source(page), page):
            report.append(f"{page.relative_to(ROOT)}: {problem}")
    assert not report, "the docs name things that do not exist:\n" + "\n".join(report)


def test_the_readme_links_every_page_of_docs():
    """The README's docs index: a new page under docs/ is linked from it (the README is where a reader starts)."""
    linked = {(ROOT / m.group(1).partition("#")[0]).resolve() for m in _LINK.finditer(_source(ROOT / "README.md"))}
    missing = [str(p.relative_to(ROOT)) for p in doc_files()[1:] if p.resolve() not in linked]
    assert not missing, f"README.md's docs index does not link {missing}"


# Guides state the current design; what was measured when, at which commit, lives in docs/results/ (one page per
# topic, headed by its date, commit, machine and command). Commits of other projects a guide cites as read:
OTHER_PROJECT_COMMITS = {
    "009bbb2a",  # TransformerEngine's grouped Hadamard cast fusion (docs/numerics.md, section 11)
    "1498424b",  # TransformerEngine's reference_nvfp4.py (docs/numerics.md, section 11)
    "41f6cbf1",  # TransformerEngine's nvfp4.rst (docs/numerics.md, section 11)
}
_HASH = re.compile(r"`([0-9a-f]{7,40})`|\b(?:at|commit|commits)\s+([0-9a-f]{7,40})\b")
_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
_DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b|\b(?:%s)\s+(?:\d{1,2},\s+)?20\d\d\b" % _MONTHS)
_HISTORY = re.compile(r"tuning history|before/after", re.IGNORECASE)


def guide_files() -> list[Path]:
    """README.md and the pages directly under docs/ (docs/results/ holds the dated measurements)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def dated_in(text: str) -> list[str]:
    """What in a guide's `text` belongs to a results page: a commit hash (7-40 hex digits with a digit and a letter,
    in backticks or after 'at' / 'commit'), a date, a tuning history, as 'line N: kind `text`'."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in _HASH.finditer(line):
            value = match.group(1) or match.group(2)
            if re.search(r"\d", value) and re.search(r"[a-f]", value) and value not in OTHER_PROJECT_COMMITS:
                found.append(f"line {number}: a commit `{match.group(0)}`")
        found += [f"line {number}: a date `{m.group(0)}`" for m in _DATE.finditer(line)]
        found += [f"line {number}: a history `{m.group(0)}`" for m in _HISTORY.finditer(line)]
    return found


def test_guides_hold_nothing_dated():
    """Commit hashes, dates and tuning histories are a results page's header, not a guide's text."""
    report = []
    for page in guide_files():
        report += [f"{page.relative_to(ROOT)}: {problem}" for problem in dated_in(_source(page))]
    assert not report, "move these to a page of docs/results/ and link it:\n" + "\n".join(report)


def test_the_dated_check_catches_what_it_should():
    for line in ["table at commit `5f5b01d`", "package at 8596b1f, two calls", "commit 1e70012 and ce1826c",
                 "Recorded 2026-12-04 on one H200", "in December 2026", "### Tuning history",
                 "the before/after pair"]:
        assert dated_in(line), line
    for line in ["`0123456789`", "`16384x7168` in 0.138 ms", "seed 99999999999", "a deadline", "`e2m1_magic`",
                 "at commit 1498424b (TransformerEngine)", "`deadbeef` is all letters"]:
        assert dated_in(line) == [], line


def test_the_check_catches_drift():
    """Each kind of stale name is found (the drift this test was written for included)."""
    page = ROOT / "docs" / "numerics.md"
    stale = [
        "`numerics/quantize.py`",  # a package-relative path that moved to quant/
        "`ops/backward_operands.py`",
        "`tests/test_kernels_library.py`",
        "`titan_fp4six/quant/nope.py`",
        "`configs/nope.toml`",
        "`quant/backends.no_such_function`",
        "`python -m titan_fp4six.no_such_tool`",
        "`titan_fp4six.quant.recipe.NoSuchRecipe`",
        "`python -m scripts.no_such_script`",
        "`tests.helpers.no_such_helper`",
        "`no_such_setup.sh`",
        "(`titan_fp4six/numerics/reference.py`, `formats.py`, `quantize.py`, `hadamard.py`)",
        "[a page](no_such_page.md)",
        "[a section](fidelity.md#no-such-heading)",
        "[up](../../elsewhere.md)",
        "`../../elsewhere/x`",
    ]
    for line in stale:
        assert problems_in(line, page), line
    fine = [
        "`numerics/reference.py`, `ops/grouped.py`, `integration/tt03/`, `./titan_fp4six/integration/embedded`",
        "`quant/backends.resolve_backends`, `modules/fidelity/operands.quantized_backward_operands`",
        "`python -m titan_fp4six.dry_run`, `titan_fp4six.modules.invalidate_weight_caches`",
        "`scripts.runs.kernel_kind`, `tests.helpers.<name>`, `configs/<recipe>.toml`, `setup.sh`, `export.py`",
        "[the contract](numerics.md#7-nan-and-inf), [records](results/hardware.txt), ./outputs/rl_cpu",
        "(`titan_fp4six/numerics/reference.py`, `formats.py`, `hadamard.py`), `RECIPE.toml`, `*_full.toml`",
        "`kernel[grid](...)`, `OUT/compare.md`, `configs/qwen3_moe_debug_bf16.toml`, `ds_fp32_fsdp.txt`",
    ]
    for line in fine:
        assert problems_in(line, page) == [], line
