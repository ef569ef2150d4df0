"""Validation messages are built from the schema, never from the value (a planted secret).

Arguments can hold secrets; a validation error's message and details end up in the
stored result, the worker's log and Flower (through the task's failure). Every JSON
Schema keyword that can fail is tried with a secret in the failing place.
"""

from __future__ import annotations

import json
import logging
import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from cleveragents.client import SkillClient
from cleveragents.errors import SchemaValidationError
from cleveragents.runtime import invoke
from cleveragents.runtime.validation import validate
from cleveragents.skills import Catalogue, SkillErrorType
from tests.support.procs import FIXTURE_SKILLS, Worker

StartWorker = Callable[..., Worker]
STRICT = FIXTURE_SKILLS / "strict.yaml"
#: One invalid value per keyword (the property of test/strict-echo with that name).
INVALID: dict[str, Callable[[str], Any]] = {
    "type": lambda s: s,
    "enum": lambda s: s,
    "const": lambda s: s,
    "not": lambda s: s,
    "false": lambda s: s,
    "contains": lambda s: [s],
    "propertyNames": lambda s: {s: 1},
    "pattern": lambda s: s,
    "minLength": lambda s: s,
    "maxLength": lambda s: s,
    "minItems": lambda s: [s],
    "maxItems": lambda s: [s],
    "uniqueItems": lambda s: [s, s],
    "ifThenElse": lambda s: s,
    "oneOf": lambda s: s,
    "anyOf": lambda s: s,
    "allOf": lambda s: s,
    "dependentSchemas": lambda s: {"a": s},
    "dependentRequired": lambda s: {"a": s},
    "additionalProperties": lambda s: {s: s},
    "unevaluatedProperties": lambda s: {s: s},
}
#: Secrets; the prefix keeps them apart from every name the schema itself uses.
secrets = st.text(alphabet=string.ascii_letters + string.digits, min_size=12, max_size=40).map(
    lambda text: f"sk9{text}"
)


def _schema() -> dict[str, Any]:
    spec = yaml.safe_load(STRICT.read_text())
    schema: dict[str, Any] = spec["tools"][0]["input_schema"]
    return schema


def test_every_keyword_of_the_fixture_schema_is_tried() -> None:
    assert set(INVALID) == set(_schema()["properties"])


@pytest.mark.parametrize("keyword", sorted(INVALID))
@settings(max_examples=20, deadline=None)
@given(secret=secrets)
def test_a_failing_keyword_never_quotes_the_value(keyword: str, secret: str) -> None:
    # Given an argument that fails exactly one keyword, with a secret in the failing place
    arguments = {keyword: INVALID[keyword](secret)}

    # When it is validated
    with pytest.raises(SchemaValidationError) as caught:
        validate(_schema(), arguments, root="arguments", source="tool input_schema")

    # Then the message and details say where and what, and never the secret
    text = str(caught.value) + json.dumps(caught.value.details)
    assert secret not in text
    assert caught.value.details["errors"], text
    assert all(e["path"].startswith("arguments") for e in caught.value.details["errors"])


def test_messages_name_the_place_and_the_expectation() -> None:
    schema = _schema()
    cases = {
        "type": "arguments.type: a string is not of type 'integer'",
        "maxLength": "arguments.maxLength: is longer than 2 characters",
        "pattern": 'arguments.pattern: does not match the pattern "^[0-9]+$"',
        "enum": 'arguments.enum: must be one of ["red","green"]',
        "dependentRequired": 'arguments.dependentRequired: "b" is a required property',
    }
    for keyword, expected in cases.items():
        with pytest.raises(SchemaValidationError) as caught:
            validate(schema, {keyword: INVALID[keyword]("k3y-v4lue")}, root="arguments", source="t")
        assert str(caught.value) == expected


def test_a_key_the_schema_does_not_name_is_not_shown_in_the_path() -> None:
    with pytest.raises(SchemaValidationError) as caught:
        validate(_schema(), {"additionalProperties": {"hunter2-key": "x"}}, root="a", source="t")
    assert "hunter2" not in str(caught.value)
    assert "a.additionalProperties.*" in str(caught.value)


def test_the_runtime_result_and_log_line_hold_no_secret(caplog: pytest.LogCaptureFixture) -> None:
    catalogue = Catalogue.from_paths(STRICT)
    secret = "sk-runtime-planted-91c2"
    caplog.set_level(logging.DEBUG)
    for keyword, make in INVALID.items():
        request = {"skill": "test/strict", "tool": "test/strict-echo",
                   "arguments": {keyword: make(secret)}}
        result = invoke(request, catalogue)
        assert result.error is not None
        assert result.error.error_type == SkillErrorType.VALIDATION_ERROR, keyword
        assert secret not in result.model_dump_json(), keyword
    assert secret not in caplog.text


def test_a_worker_stores_logs_and_reports_no_secret_of_a_failing_argument(
    redis_url: str, start_worker: StartWorker, client: SkillClient, tmp_path: Path
) -> None:
    # Given a real worker and one invalid invocation per keyword, each with a secret
    secret = "sk-live-planted-in-schema-4e1d"
    worker = start_worker(redis_url)
    handles = [
        client.submit("test/strict", "test/strict-echo", {keyword: make(secret)})
        for keyword, make in INVALID.items()
    ]
    results = [h.result(timeout=60) for h in handles]

    # Then each is a validation_error, and the secret is in no stored value and no log line
    assert all(r.error is not None and r.error.error_type == "validation_error" for r in results)
    stored = redis.Redis.from_url(redis_url)
    for key in stored.scan_iter(count=1000):
        if stored.type(key) == b"string":
            assert secret.encode() not in (stored.get(key) or b""), key
    assert secret not in worker.log_text()


def test_an_extra_argument_is_named_when_it_is_a_word_or_a_near_miss() -> None:
    schema = {
        "type": "object",
        "properties": {"text": {"type": "string"}, "limit": {"type": "integer"}},
        "additionalProperties": False,
    }
    with pytest.raises(SchemaValidationError) as caught:
        validate(schema, {"text": "a", "extra": 1}, root="arguments", source="t")
    assert str(caught.value) == (
        "arguments: has the property 'extra', which it does not allow; allowed: text, limit"
    )
    with pytest.raises(SchemaValidationError) as caught:
        validate(schema, {"txt": "a", "sk9Tq4ZrX81mWv0p": 1}, root="arguments", source="t")
    # A misspelt one gets the property meant; one that may be a token stays unnamed
    assert str(caught.value) == (
        "arguments: has the property 'txt' (did you mean 'text'?) and 1 more, which it does "
        "not allow; allowed: text, limit"
    )
    assert "sk9" not in json.dumps(caught.value.details)
