"""Approvals: a person says yes or no to one write before it runs (docs/approvals.md).

``model.py`` holds what a parked invocation and a decision are, and the rules
between them; ``stores/approvals.py`` and ``stores/approvals_redis.py`` where they are kept;
``gate.py`` the worker's side (park, then act on the decision); ``desk.py`` the
approver's (list, show, approve, reject).
"""

from cleveragents.approvals.model import ApprovalError, AwaitingApproval, Decision, Parked

__all__ = ["ApprovalError", "AwaitingApproval", "Decision", "Parked"]
