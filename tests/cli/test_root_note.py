"""The note that a root local worker runs command tools as another user is said once per
home, not by every command that starts the worker (issue 48, item 10)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cleveragents.cli.submit_cmd import ROOT_NOTE_MARKER, _say_tool_user
from cleveragents.settings import Settings

NOTE = "note: the local worker runs as root"


def test_the_root_note_is_said_once_per_home(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given two embedded homes (as root, command tools run as 'nobody')
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    root = os.geteuid() == 0
    # When three commands start the first home's worker, and one the second's
    for home in (first, first, first, second):
        _say_tool_user(Settings.from_env({"CLEVERAGENTS_HOME": str(home)}))
    # Then each home heard it once (as root; nothing otherwise)
    assert capsys.readouterr().err.count(NOTE) == (2 if root else 0)
    assert (first / ROOT_NOTE_MARKER).exists() == root
