"""``SkillClient`` keeps submit, wait, get and revoke; approvals and batches are façades.

``client.approvals`` (pending, show, approve, reject, audit) and ``client.batches``
(run_many, submit, status, results); the old names work for one release with a
``DeprecationWarning`` (issue 43). ``SkillClient.approve`` stays: SPEC section 12 names it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import pytest

from cleveragents.approvals.desk import ApprovalDesk
from cleveragents.approvals.model import ApprovalError
from cleveragents.batch.batches import Batches
from cleveragents.client import SkillClient
from cleveragents.settings import Settings


@pytest.fixture
def client(tmp_path: Path) -> SkillClient:
    return SkillClient(settings=Settings.from_env({"CLEVERAGENTS_HOME": str(tmp_path / "home")}))


def test_approvals_and_batches_are_facades_of_the_client(client: SkillClient) -> None:
    with client:
        assert isinstance(client.approvals, ApprovalDesk)
        assert isinstance(client.batches, Batches)
        assert client.approvals.pending() == []
        assert list(client.approvals.audit()) == []
        assert list(client.batches.run_many([])) == []


def _quietly(call: Callable[[], object]) -> None:
    """``call``, where an unknown id's refusal (as before) also shows the name worked."""
    with contextlib.suppress(ApprovalError):
        call()


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.approvals(),
        lambda c: _quietly(lambda: c.approval("nope")),
        lambda c: _quietly(lambda: c.reject("nope", reason="no")),
        lambda c: list(c.audit()),
        lambda c: list(c.run_many([])),
    ],
    ids=["approvals()", "approval", "reject", "audit", "run_many"],
)
def test_the_old_names_still_work_and_say_what_replaces_them(
    client: SkillClient, call: Callable[[SkillClient], object]
) -> None:
    with client, pytest.warns(DeprecationWarning, match="is deprecated: use SkillClient"):
        call(client)
