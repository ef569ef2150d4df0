"""An installed wheel claims one top-level name, ``cleveragents``, and runs on its own.

The wheel is built from the tree, unpacked into a folder of its own and run from
another folder: none of the checkout's ``worker``, ``tasks``, ``examples`` or
``celeryconfig`` is importable there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.procs import REPO

#: What a wheel is not built from.
NOT_BUILT = (".git", ".venv", ".cleveragents", "build", "dist", "*.egg-info", "__pycache__")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # From a copy of the tree: setuptools leaves a build/ folder where it builds.
    tree = tmp_path_factory.mktemp("tree") / "cleveragents"
    shutil.copytree(REPO, tree, ignore=shutil.ignore_patterns(*NOT_BUILT))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(tree)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("cleveragents-*.whl")
    return built


def test_the_wheel_holds_only_the_cleveragents_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top == {"cleveragents"}
    # The bundled examples (the default catalogue) come along, as cleveragents.examples.
    assert "cleveragents/examples/tools.py" in names
    assert "cleveragents/examples/skills/text-tools.yaml" in names
    assert "cleveragents/broker/redis/transport.py" in names


@pytest.mark.slow
def test_the_unpacked_wheel_runs_an_invocation_on_the_embedded_default(
    wheel: Path, tmp_path: Path
) -> None:
    # Given the wheel's files alone (its dependencies from this environment), in a
    # folder away from the checkout, and an empty embedded home
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEVERAGENTS_")}
    env.update(PYTHONPATH=str(site), CLEVERAGENTS_HOME=str(work / ".cleveragents"))
    probe = "import cleveragents, worker"
    missing = subprocess.run(
        [sys.executable, "-c", probe], cwd=work, env=env, capture_output=True, text=True
    )
    assert "No module named 'worker'" in missing.stderr
    # When it submits an invocation of a bundled example and waits (a local worker
    # of `celery -A cleveragents.worker worker` starts for it)
    done = subprocess.run(
        [sys.executable, "-m", "cleveragents", "submit", "local/text-tools", "local/word-count",
         "--args", '{"text": "one two three"}', "--wait", "--json"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    # Then the answer comes from the wheel's own code
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["output_data"] == {"words": 3}
    where = subprocess.run(
        [sys.executable, "-c", "import cleveragents; print(cleveragents.__file__)"],
        cwd=work, env=env, capture_output=True, text=True, check=True,
    )
    assert where.stdout.startswith(str(site))
