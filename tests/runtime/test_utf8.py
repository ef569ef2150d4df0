"""Text UTF-8 can hold: lone surrogates found, replaced, escaped (``runtime/text.py``)."""

from __future__ import annotations

import json

import pytest

from cleveragents.runtime.text import (
    holds_lone_surrogate,
    json_text,
    lone_surrogate,
    writable,
    writable_value,
)

HALF = "\ud800"
PAIR = json.loads('"\\ud83d\\ude00"')  # decoded into one character


def test_only_half_a_pair_is_a_lone_surrogate() -> None:
    assert lone_surrogate(f"a {HALF} b")
    assert lone_surrogate("\udfff")
    assert not lone_surrogate("plain")
    assert not lone_surrogate(f"déjà vu {PAIR}")


@pytest.mark.parametrize(
    "value",
    [HALF, [1, [2, {"k": HALF}]], {HALF: 1}, ("x", {"y": [HALF]}), {"a": {"b": {"c": HALF}}}],
)
def test_a_lone_surrogate_is_found_anywhere(value: object) -> None:
    assert holds_lone_surrogate(value)


def test_a_lone_surrogate_is_found_at_any_depth_without_recursion() -> None:
    value: object = HALF
    for _ in range(100_000):
        value = [value]
    assert holds_lone_surrogate(value)


def test_text_that_is_unicode_is_not_flagged() -> None:
    assert not holds_lone_surrogate({"é": [PAIR, 1, None, 2.5, {"k": "v"}]})


def test_writable_replaces_each_lone_surrogate_and_keeps_the_rest() -> None:
    assert writable(f"a{HALF}b\udc00") == "a\ufffdb\ufffd"
    assert writable(f"ok {PAIR}") == f"ok {PAIR}"
    assert writable_value({HALF: [HALF, 1], "k": (HALF,)}) == {
        "\ufffd": ["\ufffd", 1],
        "k": ["\ufffd"],
    }


def test_json_text_falls_back_to_ascii_escapes_of_the_same_value() -> None:
    value = {"text": f"é {HALF}"}
    text = json_text(value)
    text.encode("utf-8")  # writable
    assert text.isascii()
    assert json.loads(text) == value
    assert json_text({"text": "é"}) == '{"text": "é"}'  # UTF-8 where it can
