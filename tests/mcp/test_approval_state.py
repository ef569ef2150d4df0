"""The sealed ``requestState`` of an approval question: only this server's, for this call.

The state comes back through the MCP client with the answer that decides a parked
invocation (MCP 2026-07-28, ``input_required``): a state the client changed, moved to
another call, kept past its expiry, or that another server sealed, is refused.
"""

from __future__ import annotations

import base64
import json

import pytest
from mcp import types

from cleveragents.mcp.approval_prompt import INPUT_KEY, answer_of, question_result
from cleveragents.mcp.approval_state import StateRefused, StateSeal
from cleveragents.mcp.naming import ToolRoute
from cleveragents.runtime.request import SkillInvocationRequest

SECRET = b"k" * 32
DIGEST = "a" * 64
TOOL = "test_approvals__test_send-payment"


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _sealed(seal: StateSeal) -> str:
    return seal.seal(request_id="r-1", digest=DIGEST, tool=TOOL)


def test_a_sealed_state_opens_for_its_own_call() -> None:
    seal = StateSeal(SECRET)

    state = seal.open(_sealed(seal), digest=DIGEST, tool=TOOL)

    assert (state.request_id, state.digest, state.tool) == ("r-1", DIGEST, TOOL)


def test_every_changed_character_is_refused() -> None:
    seal = StateSeal(SECRET)
    token = _sealed(seal)

    for at in range(len(token)):
        changed = token[:at] + ("B" if token[at] != "B" else "C") + token[at + 1 :]
        with pytest.raises(StateRefused):
            seal.open(changed, digest=DIGEST, tool=TOOL)


def test_a_state_with_a_forged_request_id_is_refused() -> None:
    # Given a state whose claims are rewritten to name another invocation, tag kept
    seal = StateSeal(SECRET)
    version, body, tag = _sealed(seal).split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    claims["r"] = "someone-elses-request"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")

    with pytest.raises(StateRefused, match="seal"):
        seal.open(f"{version}.{forged}.{tag}", digest=DIGEST, tool=TOOL)


def test_a_state_moved_to_another_call_is_refused() -> None:
    seal = StateSeal(SECRET)
    token = _sealed(seal)

    with pytest.raises(StateRefused, match="another call"):
        seal.open(token, digest="b" * 64, tool=TOOL)
    with pytest.raises(StateRefused, match="another call"):
        seal.open(token, digest=DIGEST, tool="other_tool")


def test_a_state_of_another_server_or_past_its_expiry_is_refused() -> None:
    clock = _Clock()
    seal = StateSeal(SECRET, ttl_s=60, clock=clock)
    token = _sealed(seal)

    with pytest.raises(StateRefused, match="seal"):
        StateSeal(b"x" * 32).open(token, digest=DIGEST, tool=TOOL)
    with pytest.raises(StateRefused, match="seal"):
        StateSeal().open(token, digest=DIGEST, tool=TOOL)  # a restarted server's secret
    clock.now += 61
    with pytest.raises(StateRefused, match="expired"):
        seal.open(token, digest=DIGEST, tool=TOOL)


@pytest.mark.parametrize("token", ["", "v1", "v1..", "v2.e30.AAAA", "v1.!!.??", "x" * 500])
def test_a_malformed_state_is_refused(token: str) -> None:
    with pytest.raises(StateRefused):
        StateSeal(SECRET).open(token, digest=DIGEST, tool=TOOL)


def test_a_short_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        StateSeal(b"short")


def test_the_question_result_is_an_elicitation_form_with_the_state() -> None:
    route = ToolRoute(
        name=TOOL, skill="test/approvals", tool="test/send-payment", write_capable=True
    )
    request = SkillInvocationRequest(
        skill=route.skill, tool=route.tool, arguments={"key": "pay-1"}
    )

    result = question_result(route, request, "v1.state.tag")

    wire = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert wire["resultType"] == "input_required"
    assert wire["requestState"] == "v1.state.tag"
    asked = wire["inputRequests"][INPUT_KEY]
    assert asked["method"] == "elicitation/create"
    assert asked["params"]["mode"] == "form"
    assert '"key": "pay-1"' in asked["params"]["message"]
    assert request.request_id in asked["params"]["message"]
    # The answer is read back from the retried call's inputResponses, however it is typed
    accepted = types.ElicitResult(action="accept", content={"reason": "ok"})
    assert answer_of({INPUT_KEY: accepted}) == accepted
    assert answer_of({INPUT_KEY: {"action": "decline"}}) == types.ElicitResult(action="decline")
    assert answer_of({"other": accepted}) is None
    assert answer_of(None) is None
