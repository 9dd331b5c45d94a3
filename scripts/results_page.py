"""The results pages' tables are written by the scripts that measure them, so a re-run replaces a table instead of a
hand edit. A page in docs/results/ is either written whole by one script (`write_page`) or is prose around marked
sections, each written by one command (`write_section`):

    <!-- begin NAME (scripts.bench) -->
    Written by `python -m scripts.bench quantize --docs` on 2026-12-05 at commit abc1234. Machine: ...

    | table | ... |
    <!-- end NAME -->

A section whose figures predate its writer starts "Copied by hand from ..." and names the command whose `--docs`
run rewrites it. tests/test_results_pages.py checks that every table of every results page lies in such a section
or page, and that the script named in the marker writes it.
"""

from __future__ import annotations

import datetime
import json
import re
import shlex
import sys
from pathlib import Path

from scripts.provenance import REPO, commit, machine

RESULTS = REPO / "docs" / "results"
DOCS_HELP = "write the tables into their sections of the results page in docs/results/"
_BEGIN = re.compile(r"^<!-- begin (?P<name>[\w.-]+) \((?P<writer>scripts\.\w+)\) -->$", re.M)


def command_line() -> str:
    """How this process was started, as a user would type it (`python -m scripts.bench quantize --docs`)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    start = f"python -m {spec.name}" if spec is not None else f"python {Path(sys.argv[0]).name}"
    return " ".join([start, *map(shlex.quote, sys.argv[1:])])


def provenance(command: str | None = None) -> str:
    """The line that heads a written table: command, date, commit, machine."""
    return (f"Written by `{command or command_line()}` on {datetime.date.today()} at commit {commit()}. "
            f"Machine: {machine()}.")


def _relative(text: str) -> str:
    """Paths inside the checkout as a reader's checkout has them: relative to its root, not this machine's."""
    return text.replace(f"{REPO}/", "").replace(str(REPO), ".")


def _path(page: str | Path) -> Path:
    path = Path(page)
    return path if path.is_absolute() else RESULTS / path


def sections(text: str) -> dict[str, tuple[str, str]]:
    """{name: (writer module, body)} of every marked section; a section without its end marker is an error."""
    found = {}
    for match in _BEGIN.finditer(text):
        name = match["name"]
        end = f"<!-- end {name} -->"
        stop = text.find(end, match.end())
        if stop < 0:
            raise ValueError(f"section {name!r} has no closing {end!r}")
        if name in found:
            raise ValueError(f"section {name!r} is marked twice")
        found[name] = (match["writer"], text[match.end():stop].strip("\n"))
    return found


def read_records(paths: list[Path], file_name: str, writer: str) -> list[dict]:
    """The JSON record `file_name` of each run folder in `paths` (or the file itself), in order: what a table is
    built from. A missing one stops the command, naming the command `writer` that makes it."""
    records = []
    for path in paths:
        file = path / file_name if path.is_dir() else path
        if not file.is_file():
            raise SystemExit(f"{file}: no {file_name} (`{writer}` writes it)")
        records.append(json.loads(file.read_text()))
    return records


def write_section(page: str | Path, name: str, body: str, command: str | None = None) -> Path:
    """Replace section `name` of `page` (a file name in docs/results/, or a path) with the provenance line and `body`.

    The section's markers must exist already: where a table goes on a page is the page's prose, decided by hand.
    """
    path = _path(page)
    text = path.read_text()
    marked = sections(text)
    if name not in marked:
        raise SystemExit(f"{path} has no section {name!r}; add `<!-- begin {name} (scripts.MODULE) -->` and "
                         f"`<!-- end {name} -->` where its table belongs (sections there: {sorted(marked) or 'none'})")
    start = next(m for m in _BEGIN.finditer(text) if m["name"] == name)
    stop = text.index(f"<!-- end {name} -->", start.end())
    path.write_text(f"{text[:start.end()]}\n{_relative(provenance(command))}\n\n{_relative(body.strip())}\n"
                    f"{text[stop:]}")
    print(f"wrote section {name!r} of {path}", file=sys.stderr)
    return path


def write_page(page: str | Path, writer: str, text: str) -> Path:
    """Write a whole page, marked as `writer`'s (a `scripts.*` module) so no one edits it by hand."""
    path = _path(page)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"<!-- page written by {writer}; edit the script, not this page -->\n{_relative(text.lstrip())}")
    print(f"wrote {path}", file=sys.stderr)
    return path
