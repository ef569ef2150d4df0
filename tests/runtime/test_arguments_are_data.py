"""A command's arguments are data: no probe of one as a path of the skill folder fails the
tool (issue 29, attack 13). An inline program or a JSON string longer than a file name may
be, or one holding a NUL byte, is passed as written."""

from __future__ import annotations

import json
from pathlib import Path

from cleveragents.runtime import invoke
from cleveragents.runtime.kinds.command import resolve_command
from cleveragents.skills import Catalogue

#: An inline program of more than 255 bytes, with no "/" in it.
PROGRAM = "import json, sys; json.dump({'ok': True, 'pad': '" + "x" * 300 + "'}, sys.stdout)"


def test_a_word_longer_than_a_file_name_is_passed_as_written(tmp_path: Path) -> None:
    (tmp_path / "reverse.py").write_text("")
    long_json = json.dumps({"text": "y" * 400})
    argv = ["python3", "-c", PROGRAM, long_json, "bad\0word", "reverse.py"]
    assert resolve_command(argv, tmp_path) == [*argv[:5], str(tmp_path / "reverse.py")]


def test_a_command_tool_with_a_long_inline_program_runs(tmp_path: Path) -> None:
    # Given a skill file whose command is an inline program longer than a file name
    skill = {
        "name": "t/inline",
        "tools": [{"name": "t/run", "source": "command", "command": ["python3", "-c", PROGRAM]}],
    }
    (tmp_path / "skill.json").write_text(json.dumps(skill))
    catalogue = Catalogue.from_paths(tmp_path)
    # When it is invoked
    result = invoke({"skill": "t/inline", "tool": "t/run", "arguments": {}}, catalogue)
    # Then it runs, and its output is the program's
    assert result.success, result.error
    assert result.output_data == {"ok": True, "pad": "x" * 300}
