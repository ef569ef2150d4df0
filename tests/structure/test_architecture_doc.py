"""docs/architecture.md names every module of ``cleveragents/``, and only modules that exist.

Its "Every module" table lists each ``.py`` file by its path under
``cleveragents/`` (``broker/redis/transport.py``), a package by its folder
(``broker/`` for ``broker/__init__.py``) and the top package's own files as they
are (``__init__.py``, ``__main__.py``). A module added, moved or removed without
its row fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "cleveragents"
DOC = REPO / "docs" / "architecture.md"
#: The heading of the section whose table lists every module.
SECTION = "## Every module"
_FIRST_CELL = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*(.*?)\s*\|\s*$")


def table_rows(markdown: str) -> list[tuple[str, str]]:
    """The (path, job) rows of the table under ``SECTION``, in order.

    Raises:
        AssertionError: no such section, no table in it, or a row whose first cell
            is not one path in backticks.
    """
    lines = markdown.splitlines()
    assert SECTION in lines, f"no {SECTION!r} section"
    rows: list[tuple[str, str]] = []
    in_table = False
    for line in lines[lines.index(SECTION) + 1 :]:
        if line.startswith("## "):
            break
        if not line.startswith("|"):
            if in_table:
                break  # the table ended: the rest of the section is prose
            continue
        in_table = True
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if all(set(c) <= set("-: ") for c in cells):
            continue  # the separator
        if not rows and "`" not in cells[0]:
            continue  # the header
        row = _FIRST_CELL.match(line)
        assert row is not None, f"a row that names no module: {line!r}"
        rows.append((row.group(1), row.group(2)))
    assert rows, f"no table under {SECTION!r}"
    return rows


def module_names(package: Path) -> set[str]:
    """Every module of ``package`` as the table names it."""
    names: set[str] = set()
    for path in package.rglob("*.py"):
        relative = path.relative_to(package)
        if relative.name == "__init__.py" and relative.parent != Path("."):
            names.add(f"{relative.parent.as_posix()}/")
        else:
            names.add(relative.as_posix())
    return names


def test_the_architecture_table_names_every_module_of_the_package() -> None:
    named = {path for path, _ in table_rows(DOC.read_text(encoding="utf-8"))}
    missing = sorted(module_names(PACKAGE) - named)
    assert missing == [], f"docs/architecture.md, {SECTION!r}: add a row for {missing}"


def test_the_architecture_table_names_no_module_that_is_gone() -> None:
    named = {path for path, _ in table_rows(DOC.read_text(encoding="utf-8"))}
    gone = sorted(named - module_names(PACKAGE))
    assert gone == [], f"docs/architecture.md, {SECTION!r}: no such module {gone}"


def test_each_module_is_named_once_with_its_job() -> None:
    rows = table_rows(DOC.read_text(encoding="utf-8"))
    paths = [path for path, _ in rows]
    assert sorted({p for p in paths if paths.count(p) > 1}) == []
    assert [path for path, job in rows if not job] == []


def test_the_check_sees_a_missing_and_a_stale_row(tmp_path: Path) -> None:
    # The checks above would pass on nothing: they find what they are there to find.
    package = tmp_path / "pkg"
    (package / "broker" / "redis").mkdir(parents=True)
    for name in ("__init__.py", "client.py", "broker/__init__.py", "broker/redis/transport.py"):
        (package / name).write_text("")
    doc = (
        "# Architecture\n\n## Every module\n\n| module | its job |\n|---|---|\n"
        "| `__init__.py` | the package |\n| `broker/` | the broker |\n"
        "| `broker/redis_transport.py` | a name from before |\n\nProse.\n\n"
        "## Next\n\n| `client.py` | not in the section's table |\n"
    )
    named = {path for path, _ in table_rows(doc)}
    assert module_names(package) - named == {"client.py", "broker/redis/transport.py"}
    assert named - module_names(package) == {"broker/redis_transport.py"}
