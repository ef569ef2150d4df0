"""A failed invocation says why and what to do: stderr's last lines, and the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cleveragents.cli.failure_text import failure_lines, fix_for
from cleveragents.errors import SkillErrorType
from cleveragents.runtime.outcomes import failed_result
from tests.support.procs import EXAMPLE_SKILLS, REPO, free_port

pytestmark = pytest.mark.timeout(180)

FAILING = """
name: me/broken
description: A command tool that fails
tools:
  - name: me/fail
    source: command
    command: [python3, -m, tests.fixtures.cmd_fail]
"""


def _submit(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "skills").mkdir(exist_ok=True)
    (tmp_path / "skills" / "broken.yaml").write_text(FAILING, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
    env["PYTHONPATH"] = str(REPO)
    env["CLEVERAGENTS_CATALOGUE"] = os.pathsep.join([str(tmp_path / "skills"), str(EXAMPLE_SKILLS)])
    return subprocess.run(
        [sys.executable, "-m", "cleveragents", "submit", *args, "--wait"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )


def test_a_failing_command_tool_shows_the_end_of_its_stderr(tmp_path: Path) -> None:
    done = _submit(tmp_path, "me/broken", "me/fail")

    assert done.returncode == 1
    assert "tool_execution_failure" in done.stderr
    assert "fatal: the widget is broken" in done.stderr


def test_a_refused_write_names_its_fix(tmp_path: Path) -> None:
    done = _submit(tmp_path, "local/notes", "local/write-note", "--args",
                   '{"name": "n", "text": "t"}')

    assert done.returncode == 1
    assert "permission_denied" in done.stderr
    assert "fix: the tool writes: add --allow-writes" in done.stderr


def test_a_request_id_reused_for_other_arguments_runs_nothing_and_names_its_fix(
    tmp_path: Path,
) -> None:
    # Given a finished request under a chosen id (embedded default: no broker to set up)
    first = _submit(tmp_path, "local/text-tools", "local/word-count", "--args",
                    '{"text": "a b"}', "--request-id", "mine-1")
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == '{"words": 2}'

    # When the same id is sent with other arguments
    again = _submit(tmp_path, "local/text-tools", "local/word-count", "--args",
                    '{"text": "a b c"}', "--request-id", "mine-1", "--json")

    # Then it is refused, nothing ran, and the id still answers the first request
    assert again.returncode == 1
    payload = json.loads(again.stdout)
    assert payload["error"]["error_type"] == "validation_error"
    assert payload["error"]["details"]["reason"] == "request_id_reused"
    same = _submit(tmp_path, "local/text-tools", "local/word-count", "--args",
                   '{"text": "a b"}', "--request-id", "mine-1")
    assert same.stdout.strip() == '{"words": 2}'
    human = _submit(tmp_path, "local/text-tools", "local/word-count", "--args",
                    '{"text": "x"}', "--request-id", "mine-1")
    assert "fix: give this request a request id of its own" in human.stderr


@pytest.mark.parametrize("depth", [300, 20_000])
def test_arguments_nested_too_deeply_get_one_line_that_names_the_limit(
    tmp_path: Path, depth: int
) -> None:
    # 300: valid JSON past the limit; 20,000: past what the JSON parser's stack takes.
    deep = '{"a": ' + "[" * depth + "]" * depth + "}"

    done = _submit(tmp_path, "local/text-tools", "local/word-count", "--args", deep)

    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "RecursionError" not in done.stderr
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert "nested" in done.stderr
    assert "128" in done.stderr


def test_every_refusal_gate_and_limit_has_a_fix() -> None:
    for details in ({"gate": "request_disallows_writes"}, {"gate": "worker_read_only"},
                    {"gate": "skill_read_only"}, {"reason": "timeout"},
                    {"reason": "output_too_large"}, {"reason": "poison_message"},
                    {"reason": "request_id_reused"}):
        result = failed_result("s/k", "t/t", SkillErrorType.PERMISSION_DENIED, "no", details)
        assert result.error is not None
        assert fix_for(result.error), details
    lines = failure_lines(
        failed_result("s/k", "t/t", SkillErrorType.TOOL_EXECUTION_FAILURE, "exit 2",
                      {"stderr_tail": "\n".join(f"line {i}" for i in range(20))}),
        "r-1",
    )
    assert lines[0] == "r-1 failed (tool_execution_failure): exit 2"
    assert lines[1:] == ["stderr (last lines):", *(f"  line {i}" for i in range(15, 20))]


def test_a_failure_after_retries_says_how_many_attempts_ran() -> None:
    # Given a transient failure that used up its tool's three attempts (issue 48, item 10)
    result = failed_result("s/k", "t/t", SkillErrorType.TOOL_EXECUTION_FAILURE, "exit 75",
                           {"transient": True, "attempts": 3})  # fmt: skip
    assert failure_lines(result, "r-1")[0] == (
        "r-1 failed after 3 attempts (tool_execution_failure): exit 75"
    )
    # A failure with one attempt says nothing of attempts
    once = failed_result("s/k", "t/t", SkillErrorType.TOOL_EXECUTION_FAILURE, "x", {"attempts": 1})
    assert failure_lines(once, "r-1")[0] == "r-1 failed (tool_execution_failure): x"


def _cli(tmp_path: Path, *args: str, **env_extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
    env["PYTHONPATH"] = str(REPO)
    env["CLEVERAGENTS_CATALOGUE"] = str(EXAMPLE_SKILLS)
    env.update(env_extra)
    return subprocess.run(
        [sys.executable, "-m", "cleveragents", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )


@pytest.mark.parametrize(
    "args",
    [
        ("submit", "local/text-tools", "local/word-count", "--args", '{"text": "a"}', "--wait"),
        ("result", "some-id"),
        ("batch", "status", "some-batch"),
        ("batch", "run", "requests.jsonl", "--out", "out.jsonl"),
        ("mcp", "serve"),
    ],
    ids=["submit", "result", "batch-status", "batch-run", "mcp-serve"],
)
def test_an_unreachable_redis_is_one_line_that_names_the_setting_within_seconds(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    # Nothing listens on the port: the command used to retry silently for two minutes
    (tmp_path / "requests.jsonl").write_text(
        '{"skill": "local/text-tools", "tool": "local/word-count", "arguments": {}}\n'
    )
    url = f"redis://:hunter2-secret@127.0.0.1:{free_port()}/0"

    done = _cli(tmp_path, *args, CLEVERAGENTS_BROKER_URL=url)

    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: cannot reach Redis at redis://:**@127.0.0.1:"), line
    assert "CLEVERAGENTS_BROKER_URL" in line
    assert "hunter2-secret" not in done.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_a_redis_that_refuses_the_password_says_so(tmp_path: Path, redis_url: str) -> None:
    host = redis_url.split("://", 1)[1].split("/", 1)[0].rsplit("@", 1)[-1]
    url = f"redis://nobody-{os.getpid()}:wrong-password@{host}/0"

    done = _cli(tmp_path, "result", "some-id", CLEVERAGENTS_BROKER_URL=url)

    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "refused" in line, line
    assert "CLEVERAGENTS_BROKER_URL" in line
    assert "wrong-password" not in done.stderr


def test_a_tool_that_is_not_part_of_its_skill_names_where_to_look() -> None:
    result = failed_result(
        "local/text-tools",
        "nope",
        SkillErrorType.RESOLUTION_FAILURE,
        "tool 'nope' is not part of skill 'local/text-tools'",
    )
    assert result.error is not None
    assert fix_for(result.error) == (
        "`cleveragents skills show local/text-tools` lists its tools; "
        "`cleveragents skills check` finds broken includes"
    )


@pytest.mark.parametrize(
    ("args", "fix"),
    [
        (("skills", "show", "nope/x"), "`cleveragents skills list` shows the skills"),
        (("batch", "status", "nope"), "use the id `cleveragents batch submit` printed"),
        (("skills", "show", "text-tools"), "did you mean 'local/text-tools'?"),
    ],
)
def test_a_name_that_is_not_known_says_where_to_find_the_right_one(
    tmp_path: Path, args: tuple[str, ...], fix: str
) -> None:
    done = _cli(tmp_path, *args)

    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert fix in line


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("amqp://guest:guest-secret@127.0.0.1:{free}//", "error: cannot reach RabbitMQ at"),
        ("amqp://guest:guest-secret@127.0.0.1:5672//", "refused this client"),
        ("amqp://guest:guest@127.0.0.1:5672/no-such-vhost-secret", "refused this client"),
    ],
    ids=["nothing-listens", "wrong-password", "no-such-vhost"],
)
def test_a_rabbitmq_broker_that_cannot_be_used_is_one_line_naming_the_setting(
    tmp_path: Path, url: str, said: str
) -> None:
    url = url.replace("{free}", str(free_port()))

    done = _cli(tmp_path, "result", "some-id", CLEVERAGENTS_BROKER_URL=url)

    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert said in line, line
    assert "CLEVERAGENTS_BROKER_URL" in line
    assert "guest-secret" not in line


def test_a_redis_database_number_that_does_not_exist_is_named_as_such(
    tmp_path: Path, redis_url: str
) -> None:
    # Given a URL naming database 99 of a Redis with the default 16 (issue 48, item 10)
    url = redis_url.rsplit("/", 1)[0] + "/99" if redis_url.count("/") > 2 else redis_url + "/99"

    done = _cli(tmp_path, "result", "some-id", CLEVERAGENTS_BROKER_URL=url)

    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "has no database 99" in line, line
    assert "CLEVERAGENTS_BROKER_URL is the database" in line, line
    assert "password" not in line


def test_an_args_file_saved_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    (tmp_path / "args.json").write_bytes(b'\xef\xbb\xbf{"text": "a b"}\r\n')

    done = _cli(tmp_path, "submit", "local/text-tools", "local/word-count", "--args-file",
                "args.json")

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()  # the request id


def test_the_reach_check_reads_celerys_tls_spelling_and_leaves_other_urls_to_the_command(
    redis_url: str,
) -> None:
    from cleveragents.cli.broker_check import _ping
    from cleveragents.stores.redis_capacity import redis_py_url as _redis_py_url

    url = "rediss://:pw@redis.example:6380/0?ssl_cert_reqs=CERT_REQUIRED"
    assert _redis_py_url(url) == "rediss://:pw@redis.example:6380/0?ssl_cert_reqs=required"
    assert _redis_py_url(url.replace("REQUIRED", "NONE")).endswith("ssl_cert_reqs=none")
    # An option redis-py does not know (Celery's own): no verdict, the command goes on
    _ping(f"{redis_url}?celery_only_option=1", "CLEVERAGENTS_BROKER_URL")


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("redis//user:s3cret@127.0.0.1:6427", "is not a URL (no scheme://)"),
        ("http://127.0.0.1:6427/0", "no broker speaks http://"),
    ],
)
@pytest.mark.parametrize("command", [("submit", "local/common", "local/echo"), ("worker",)])
def test_a_mistyped_broker_url_names_the_setting_and_its_forms(
    tmp_path: Path, url: str, said: str, command: tuple[str, ...]
) -> None:
    done = _cli(tmp_path, *command, CLEVERAGENTS_BROKER_URL=url)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: CLEVERAGENTS_BROKER_URL=")
    assert said in line
    assert "redis://[user:password@]host:6379/0" in line
    assert "amqp://user:password@host:5672/vhost" in line
    assert "s3cret" not in line
    assert "Traceback" not in done.stderr
