"""A light start: ``cleveragents --help`` loads none of the heavy libraries, yet lists
every subcommand with the help its own module gives it (``cli/app.py``'s table)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable

import click
import pytest
import redis

from cleveragents.cli.app import COMMANDS, LazyCommand, LazyGroup, cli
from cleveragents.cli.skills_cmd import IMPORT
from tests.support.procs import REPO, Worker

#: What no command that does not use them may load.
HEAVY = (
    *("amqp", "celery", "jsonschema", "kombu", "mcp"),
    *("opentelemetry", "pydantic", "redis", "rich"),
)


def _python(code: str, *, columns: int = 80) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
    env.update(PYTHONPATH=str(REPO), COLUMNS=str(columns))
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_importing_the_command_group_loads_no_heavy_library() -> None:
    code = (
        "import sys, cleveragents.cli.app\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {set(HEAVY)!r}))"
    )
    assert _python(code).strip() == "[]"


def test_help_loads_nothing_outside_the_standard_library_click_and_the_group() -> None:
    # Given `cleveragents --help` run as the console script runs it
    code = (
        "import sys\n"
        "from cleveragents.cli.app import main\n"
        "main(['--help'])\n"
        "ours = sorted(m for m in sys.modules if m.startswith('cleveragents'))\n"
        "other = sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names)"
        " - {'click', 'cleveragents'})\n"
        "print(ours, [m for m in other if not m.startswith('_')])"
    )
    # Then it loads only the group's own modules and click
    *_, last = _python(code).strip().splitlines()
    ours = ["cleveragents", "cleveragents.cli", "cleveragents.cli.app", "cleveragents.errors"]
    assert last == f"{ours!r} []"


def _eager_help(group: str, columns: int) -> str:
    """``--help`` of ``group`` once every lazy subcommand is imported (as before the table)."""
    return _python(
        "import click\n"
        "from cleveragents.cli.app import cli, main\n"
        f"group = cli if {group!r} == '' else cli.get_command(click.Context(cli), {group!r})\n"
        "for name in group.list_commands(click.Context(group)):\n"
        "    group.get_command(click.Context(group), name)\n"
        f"main([*{[group] if group else []!r}, '--help'])",
        columns=columns,
    )


@pytest.mark.parametrize("columns", [80, 50])
@pytest.mark.parametrize("group", ["", "skills"], ids=["cleveragents", "skills"])
def test_help_lists_every_subcommand_as_the_eager_group_did(group: str, columns: int) -> None:
    args = [group] if group else []
    code = f"from cleveragents.cli.app import main; main({[*args, '--help']!r})"
    lazy = _python(code, columns=columns)
    assert lazy == _eager_help(group, columns)
    for name in COMMANDS if not group else ["check", "export", "import", "list", "show"]:
        assert f"\n  {name} " in lazy


def _table() -> list[tuple[str, LazyCommand]]:
    return [*COMMANDS.items(), ("skills import", IMPORT)]


@pytest.mark.parametrize(("name", "where"), _table(), ids=[name for name, _ in _table()])
def test_the_table_says_what_each_command_says_of_itself(name: str, where: LazyCommand) -> None:
    command = getattr(importlib.import_module(where.module), where.attribute)
    assert isinstance(command, click.Command)
    assert command.name == name.split()[-1]
    assert where.help == (command.help or "").split("\n\n")[0]


def test_a_lazy_group_imports_a_subcommand_once_on_first_use() -> None:
    group = LazyGroup(lazy={"submit": COMMANDS["submit"]})
    context = click.Context(group)
    assert group.list_commands(context) == ["submit"]
    assert group.commands == {}
    first = group.get_command(context, "submit")
    assert first is not None
    assert group.get_command(context, "submit") is first
    assert cli.get_command(click.Context(cli), "no-such-command") is None


#: Runs the CLI as the console script does, then prints (on its last stdout line) every
#: TCP connection the process opened and every module it loaded.
_COUNTED = """
import atexit, json, socket, sys
opened = []
connect = socket.socket.connect
def counted(self, address):
    opened.append(str(address))
    return connect(self, address)
socket.socket.connect = counted
atexit.register(lambda: print(json.dumps({"opened": opened, "modules": sorted(sys.modules)})))
from cleveragents.cli.app import main
sys.exit(main(sys.argv[1:]))
"""


def _submit_wait(env: dict[str, str]) -> tuple[list[str], set[str]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
    args = ["submit", "local/text-tools", "local/word-count", "--args", '{"text": "a b"}']
    done = subprocess.run(
        [sys.executable, "-c", _COUNTED, *args, "--wait"],
        env={**base, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    *output, counted = done.stdout.strip().splitlines()
    assert output == ['{"words": 2}']
    found = json.loads(counted)
    return found["opened"], set(found["modules"])


def test_submit_wait_on_redis_opens_three_connections_and_loads_no_extras(
    redis_url: str, start_worker: Callable[..., Worker]
) -> None:
    # Given a running worker, settled: it has served one invocation already
    start_worker(redis_url, concurrency=1)
    env = {"CLEVERAGENTS_BROKER_URL": redis_url, "CLEVERAGENTS_RESULT_BACKEND": redis_url}
    _submit_wait(env)
    server = redis.Redis.from_url(redis_url)
    before = server.info("stats")["total_connections_received"]
    # When one `submit --wait` runs
    opened, modules = _submit_wait(env)
    # Then it opened three connections (the backend's, its result subscription's, the
    # broker channel's; the reach check pings on the backend's), as Redis counts too
    received = server.info("stats")["total_connections_received"] - before
    server.close()
    assert len(opened) == 3, opened
    assert received <= 3
    # And it loaded neither the MCP SDK nor rich (nothing printed a table)
    assert not {m for m in modules if m.split(".")[0] in ("mcp", "rich")}
    assert not {m for m in modules if m.startswith(("cleveragents.mcp", "cleveragents.cli.batch"))}
