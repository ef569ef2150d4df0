"""Reading a batch file as a stream (``cleveragents/batch/source.py``): no line is held whole
past ``MAX_LINE_CHARS``, and line numbers stay right around a line that is too long."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cleveragents.batch import source
from cleveragents.batch.source import read_jsonl
from cleveragents.cli.batch_cmd import _count_lines

LIMIT = 200


@pytest.fixture(autouse=True)
def _small_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source, "MAX_LINE_CHARS", LIMIT)


def _line(text: str) -> str:
    return json.dumps({"skill": "s/k", "tool": "s/t", "arguments": {"text": text}})


def _padded(length: int) -> str:
    """A request line of exactly ``length`` characters."""
    bare = _line("")
    return _line("x" * (length - len(bare)))


def test_a_line_longer_than_the_limit_is_a_bad_line_and_the_numbers_stay_right(
    tmp_path: Path,
) -> None:
    path = tmp_path / "batch.jsonl"
    lines = [_line("a"), _padded(LIMIT), "", _padded(LIMIT + 1), _line("b"), "y" * (LIMIT * 50)]
    path.write_text("\n".join(lines) + "\n" + _line("last"), encoding="utf-8")

    items = list(read_jsonl(path, allow_writes=False))

    assert [item.line for item in items] == [1, 2, 4, 5, 6, 7]
    assert [item.problem is None for item in items] == [True, True, False, True, False, True]
    for bad in (items[2], items[4]):
        assert bad.problem is not None
        assert f"line {bad.line}: longer than {LIMIT:,} characters" in bad.problem
        assert bad.request_id.startswith(f"line-{bad.line}-")
    assert items[-1].request is not None
    assert items[-1].request.arguments == {"text": "last"}
    assert _count_lines(path) == 6 + 0  # the blank line is not counted


def test_a_too_long_line_gets_the_same_id_on_every_read(tmp_path: Path) -> None:
    path = tmp_path / "batch.jsonl"
    path.write_text(_padded(LIMIT * 3) + "\n", encoding="utf-8")
    first = [item.request_id for item in read_jsonl(path, allow_writes=False)]
    again = [item.request_id for item in read_jsonl(path, allow_writes=False)]
    assert first == again


def test_counting_lines_reads_in_blocks(tmp_path: Path) -> None:
    path = tmp_path / "batch.jsonl"
    path.write_bytes(b"a\n\n  \n" + b"b" * (3 << 20) + b"\n c \n\t\nd")
    assert _count_lines(path) == 4
    path.write_bytes(b"")
    assert _count_lines(path) == 0


def test_a_file_that_starts_with_a_byte_order_mark_reads_its_first_line(tmp_path: Path) -> None:
    # Windows editors save UTF-8 with a BOM; json.loads refuses one ("Unexpected UTF-8 BOM")
    path = tmp_path / "batch.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + (_line("a") + "\r\n" + _line("b") + "\r\n").encode())

    items = list(read_jsonl(path, allow_writes=False))

    assert [item.problem for item in items] == [None, None]
    assert [item.request.arguments["text"] for item in items if item.request] == ["a", "b"]
