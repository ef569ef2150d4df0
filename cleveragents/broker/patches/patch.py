"""What a patch is: the change, the release series it fits, what skipping it costs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cleveragents.broker.internals import PARTS
from cleveragents.errors import ConfigurationError

__all__ = ["Patch", "PatchRefused", "written_for"]


class PatchRefused(ConfigurationError):
    """Raised when a patch the worker cannot do without does not fit the installed library."""


@dataclass(frozen=True)
class Patch:
    """One patch: what it changes, the release series it fits, what skipping it costs."""

    #: The module that holds it (``cleveragents.broker.patches.…``).
    name: str
    #: The distribution it patches, and the release series (major.minor) it fits.
    distribution: str
    series: str
    #: Applies the patch; idempotent.
    install: Callable[[], None]
    #: What the worker loses without it (said in the warning or the refusal).
    without_it: str
    #: True: a worker whose library is of another series does not start.
    required: bool = False

    @classmethod
    def for_part(cls, name: str, part: str, install: Callable[[], None]) -> Patch:
        """The patch of ``part`` in the table of internals (``broker/internals.py``)."""
        spec = PARTS[part]
        return cls(
            name=name,
            distribution=spec.distribution,
            series=spec.series,
            install=install,
            without_it=spec.consequence,
            required=spec.outside == "refuse",
        )


def written_for(patch: Patch, installed: str) -> bool:
    """True when ``installed`` (a version string) is of the series ``patch`` was written for."""
    return installed.split(".")[:2] == patch.series.split(".")
