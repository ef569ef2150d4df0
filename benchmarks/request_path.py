"""How much of this project's code one warm request runs: functions and files, counted.

The ``skills.invoke`` task, applied in this process through Celery's tracer (on the
embedded default's stores, in a folder of its own) with the bundled examples, runs
one invocation of ``local/text-tools`` ``local/word-count`` to warm up, then one
more under ``sys.setprofile``: every function of ``cleveragents/`` (and of the top-level
``worker/`` and ``tasks/``) that this second one calls is counted once, with its file.
Celery's own code and the tool's are not counted: this measures what the project adds
to a request, the number a redesign should keep small.

    .venv/bin/python benchmarks/request_path.py [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OURS = tuple(str(ROOT / name) for name in ("cleveragents", "worker", "tasks"))


def _request(n: int) -> dict[str, Any]:
    return {
        "request_id": f"path-{n}",
        "skill": "local/text-tools",
        "tool": "local/word-count",
        "arguments": {"text": "one two three"},
    }


def count(deliver: Any) -> tuple[set[str], set[str]]:
    """The project's functions (``file:line name``) and files one call of ``deliver`` runs."""
    functions: set[str] = set()

    def seen(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call":
            return
        path = frame.f_code.co_filename
        if path.startswith(OURS):
            functions.add(f"{path}:{frame.f_code.co_firstlineno} {frame.f_code.co_name}")

    sys.setprofile(seen)
    try:
        deliver()
    finally:
        sys.setprofile(None)
    return functions, {f.split(":", 1)[0] for f in functions}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    home = tempfile.mkdtemp(prefix="request-path-")
    os.environ["CLEVERAGENTS_HOME"] = home
    for name in ("CLEVERAGENTS_BROKER_URL", "CLEVERAGENTS_RESULT_BACKEND"):
        os.environ.pop(name, None)
    # The task as a pool process runs it, through Celery's tracer (in this process: the
    # embedded default's server in a home of its own).
    from cleveragents.embedded.server import join_server, leave_server
    from cleveragents.settings import Settings

    join_server(Settings.from_env().home)
    import cleveragents.tasks.invoke  # noqa: F401  (registers skills.invoke)
    from cleveragents.worker.celery_app import app

    task = app.tasks["skills.invoke"]
    assert task.apply(args=[_request(0)], task_id="path-0").successful()
    functions, files = count(lambda: task.apply(args=[_request(1)], task_id="path-1"))
    leave_server(Settings.from_env().home)
    shutil.rmtree(home, ignore_errors=True)
    if args.json:
        print(json.dumps({"functions": len(functions), "files": len(files)}))
    else:
        print(f"one warm request runs {len(functions)} functions in {len(files)} files")
        for path in sorted(files):
            print(f"  {Path(path).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
