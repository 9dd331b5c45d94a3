"""Every table on a results page is written by the script that measures it (scripts/results_page.py): it lies in a
page a script writes whole, or in a marked section whose writer module exists and writes that section."""

import re

import pytest

from scripts import results_page
from scripts.results_page import RESULTS, sections, write_page, write_section
from tests.helpers.as_module import as_module

ROOT = RESULTS.parents[1]
PAGES = sorted(RESULTS.glob("*.md"))
_WHOLE = re.compile(r"^<!-- page written by (scripts\.\w+); edit the script, not this page -->$")


def _writer_source(module: str) -> str:
    path = ROOT / (module.replace(".", "/") + ".py")
    assert path.is_file(), f"{module} (named as a writer) does not exist"
    return path.read_text()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_table_is_written_by_a_script(page):
    text = page.read_text()
    whole = _WHOLE.match(text.splitlines()[0])
    if whole:
        source = _writer_source(whole[1])
        assert "write_page(" in source and page.name in source, f"{whole[1]} does not write {page.name}"
        return
    marked = sections(text)
    inside = set()
    for name, (writer, body) in marked.items():
        source = _writer_source(writer)
        quoted = rf"[\"']{re.escape(name)}[\"']"
        named = [ln for ln in source.splitlines() if re.search(quoted, ln)
                 and not re.search(r"\badd(?:_parser)?\(\s*" + quoted, ln)]  # a subcommand of that name is no writer
        assert "write_section(" in source and named and page.name in source, (
            f"{page.name}: section {name!r} names {writer}, which does not write it (or not on this page)")
        first = body.lstrip().splitlines()[0] if body.strip() else ""
        copied = body.split("\n\n")[0]  # the paragraph that heads a copied section
        assert first.startswith("Written by `") or (first.startswith("Copied by hand from") and "--docs" in copied
                                                    and writer in copied), (
            f"{page.name}: section {name!r} must start with its provenance (\"Written by `COMMAND`\" or \"Copied by "
            f"hand from ...\" naming the `python -m {writer} ... --docs` run that rewrites it), not {first[:60]!r}")
        inside.update(line for line in body.splitlines() if line.startswith("|"))
    loose = [line for line in text.splitlines() if line.startswith("|") and line not in inside]
    assert not loose, f"{page.name}: tables outside any written section, first: {loose[0][:80]!r}"


def _page(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\nProse.\n\n<!-- begin speed (scripts.bench) -->\nold\n<!-- end speed -->\n\n"
                    "<!-- begin other (scripts.runs) -->\nkept\n<!-- end other -->\nTail.\n")
    return page


def test_write_section_replaces_only_its_section(tmp_path):
    page = _page(tmp_path)
    for _ in range(2):  # a re-run replaces, it does not stack
        write_section(page, "speed", "| a |\n| --- |\n| 1 |\n", command="python -m scripts.bench x --docs")
    text = page.read_text()
    assert text.startswith("# Title\n\nProse.\n\n<!-- begin speed (scripts.bench) -->\nWritten by "
                           "`python -m scripts.bench x --docs` on ")
    assert text.count("Written by") == 1 and "old" not in text
    assert text.endswith("| 1 |\n<!-- end speed -->\n\n<!-- begin other (scripts.runs) -->\nkept\n"
                         "<!-- end other -->\nTail.\n")
    assert sections(text)["other"] == ("scripts.runs", "kept")


def test_write_section_names_the_page_and_the_missing_section(tmp_path):
    page = _page(tmp_path)
    with pytest.raises(SystemExit, match=r"page.md has no section 'gemm'.*sections there: \['other', 'speed'\]"):
        write_section(page, "gemm", "x")
    page.write_text("<!-- begin speed (scripts.bench) -->\nno end\n")
    with pytest.raises(ValueError, match="section 'speed' has no closing '<!-- end speed -->'"):
        write_section(page, "speed", "x")


def test_written_paths_are_relative_to_the_checkout(tmp_path):
    page = _page(tmp_path)
    write_section(page, "speed", f"| {results_page.REPO}/outputs/x |", command=f"python -m scripts.bench --out "
                  f"{results_page.REPO}/outputs/run")
    body = sections(page.read_text())["speed"][1]
    assert str(results_page.REPO) not in body and "--out outputs/run`" in body and "| outputs/x |" in body


def test_write_page_marks_the_writer(tmp_path):
    page = write_page(tmp_path / "whole.md", "scripts.rl_sync", "# Whole\n\nbody\n")
    first, *rest = page.read_text().splitlines()
    assert _WHOLE.match(first)[1] == "scripts.rl_sync" and rest[0] == "# Whole"


def test_command_line_is_what_a_user_types(monkeypatch):
    as_module(monkeypatch, "scripts.bench", "quantize", "--out", "a b", "--docs")
    assert results_page.command_line() == "python -m scripts.bench quantize --out 'a b' --docs"
