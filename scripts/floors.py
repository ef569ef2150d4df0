"""Print pip constraints that pin every direct dependency to the lowest version its bound allows.

pip has no ``--resolution lowest-direct`` (uv's): this reads the ``>=`` floors of
pyproject.toml's dependencies and the extras named on the command line (by default
``dev`` and ``otel``, what ``pip install -e '.[dev]'`` installs) and prints one
constraint each, for ``pip install -c``: the floor's release series at its newest patch
(``>=2.6`` gives ``==2.6.*``, ``>=13`` gives ``==13.0.*``), a floor of three parts
exactly (``>=5.7.1`` gives ``==5.7.1``). Not the floor to the letter: a floor's ``.0``
may be yanked or have no wheel for this Python (pytest-timeout 2.3.0 is yanked, PyYAML
6.0 has no wheel for 3.11), and patch releases only fix. A dependency without a floor
is left to the resolver; what the direct dependencies need comes in at its newest
allowed (uv's ``--resolution lowest-direct``, which pip lacks).

Usage: python3 scripts/floors.py [EXTRA ...] > floors.txt
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
#: A requirement's name, its extras, and its specifiers: "celery[redis]>=5.7,<5.8".
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;]*)")


def floors(pyproject: Path, extras: list[str]) -> dict[str, str]:
    """Each direct dependency's lowest allowed version, by name (those with a ``>=``)."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    own = project["name"].lower()
    requirements = list(project.get("dependencies", []))
    for extra in extras:
        requirements += project.get("optional-dependencies", {})[extra]
    found: dict[str, str] = {}
    for requirement in requirements:
        match = REQUIREMENT.match(requirement)
        if match is None:
            raise SystemExit(f"floors.py: cannot read the requirement {requirement!r}")
        name, specifiers = match.group(1), match.group(2)
        if name.lower() == own:  # "cleveragents[otel]": the extra's own lines are read too
            continue
        for specifier in specifiers.split(","):
            specifier = specifier.strip()
            if specifier.startswith(">="):
                found[name] = specifier[2:].strip()
    return found


def constraint(name: str, floor: str) -> str:
    """``name`` held to the release series of ``floor`` (see the module's docstring)."""
    parts = floor.split(".")
    if len(parts) >= 3:
        return f"{name}=={floor}"
    return f"{name}=={'.'.join([*parts, '0'][:2])}.*"


def main(argv: list[str]) -> int:
    extras = argv or ["dev", "otel"]
    for name, floor in sorted(floors(PYPROJECT, extras).items(), key=lambda kv: kv[0].lower()):
        print(constraint(name, floor))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
