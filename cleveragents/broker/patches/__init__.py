"""Patches of third-party private APIs: one module each, applied when a worker starts.

Nothing here changes anything at import. ``apply_all`` runs in the worker's start-up
(``cleveragents/worker/startup.py``), so Flower, ``celery inspect`` and producers run the libraries
as shipped. Each patch names the release series of the distribution it was written
and tested for. On another series it is skipped with a warning: a change to private
code it was not written for could break more than it mends. A patch whose absence
would break a guarantee (tool output kept out of logs) refuses the worker instead.
Each has a test that fails once upstream changes what it works around
(tests/broker/test_patches.py): then re-check the patch and move its series.
"""

from __future__ import annotations

import logging

from cleveragents.broker import internals
from cleveragents.broker.patches.patch import Patch, PatchRefused, written_for

__all__ = ["Patch", "PatchRefused", "all_patches", "apply_all", "written_for"]


def all_patches() -> tuple[Patch, ...]:
    """Every patch the worker applies, in order."""
    from cleveragents.broker.patches import (
        hard_limit_pauses,
        kombu_connparams,
        result_repr,
        success_log,
    )

    return (kombu_connparams.PATCH, success_log.PATCH, result_repr.PATCH, hard_limit_pauses.PATCH)


def apply_all(patches: tuple[Patch, ...] | None = None) -> list[tuple[int, str]]:
    """Apply each patch that fits its installed library; what to log, as (level, message).

    The worker logs these once its logging is set up, which is after it applies them.

    Raises:
        PatchRefused: a required patch does not fit the installed library.
    """
    notes = []
    for patch in all_patches() if patches is None else patches:
        installed = internals.installed_version(patch.distribution)
        if written_for(patch, installed):
            patch.install()
            notes.append((logging.INFO, f"applied {patch.name} ({patch.distribution} {installed})"))
            continue
        why = (
            f"{patch.name} was written for {patch.distribution} {patch.series}.x, "
            f"{installed} is installed; without it {patch.without_it}"
        )
        if patch.required:
            raise PatchRefused(f"{why}: re-check the patch before running this version")
        notes.append((logging.WARNING, f"skipped {why}"))
    return notes
