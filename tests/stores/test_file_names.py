"""Files named by request ids: one to one, and within the file system's limit for any id."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest
from celery import Celery

from cleveragents.broker.embedded.result_backend import SafeFilesystemBackend
from cleveragents.runtime.request import SkillInvocationRequest
from cleveragents.stores.files import FileGuardStore, file_name

#: The longest ids the request model accepts, and ones that encode to the same length.
LONG_IDS = ["/" * 200, "/" * 199 + "%", "%" * 200, "." + "/" * 199]


def test_the_longest_ids_are_valid_request_ids() -> None:
    for request_id in LONG_IDS[:1]:
        assert SkillInvocationRequest(skill="s/x", tool="t", request_id=request_id)


@pytest.mark.parametrize(
    "pair", [("p/q", "p%2Fq"), ("p/q", "p_q"), (".", "%2E"), *pairwise(LONG_IDS)]
)
def test_no_two_ids_share_a_name(pair: tuple[str, str]) -> None:
    assert file_name(pair[0]) != file_name(pair[1])


@pytest.mark.parametrize("request_id", LONG_IDS)
def test_a_guard_record_is_kept_for_the_longest_ids(tmp_path: Path, request_id: str) -> None:
    store = FileGuardStore(tmp_path)
    assert store.attempt(request_id) == 1
    assert store.attempt(request_id) == 2
    assert store.attempt(request_id[:-1] + "x") == 1


def test_a_result_is_stored_for_the_longest_ids(tmp_path: Path) -> None:
    backend = SafeFilesystemBackend(app=Celery(set_as_current=False), url=f"file://{tmp_path}")
    for number, request_id in enumerate(LONG_IDS):
        backend.set(f"celery-task-meta-{request_id}", str(number).encode())
    for number, request_id in enumerate(LONG_IDS):
        assert backend.get(f"celery-task-meta-{request_id}") == str(number).encode()
