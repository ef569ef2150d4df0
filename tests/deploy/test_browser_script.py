"""scripts/browser: chromium is installed in CI, and never unasked on a developer's machine."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.procs import REPO


def _run(tmp_path: Path, **env: str) -> tuple[str, bool]:
    """Run the script where no chromium is on PATH and apt-get only records that it ran."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    marker = tmp_path / "apt-get-ran"
    apt = bin_dir / "apt-get"
    apt.write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\n")
    apt.chmod(0o755)
    for tool in ("id", "sh"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).unlink(missing_ok=True)
        (bin_dir / tool).symlink_to(found)
    done = subprocess.run(
        ["/bin/bash", str(REPO / "scripts" / "browser")],
        env={"PATH": str(bin_dir), **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stderr, marker.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="the script installs as root only")
def test_a_developer_machine_is_not_changed_unasked_and_told_how(tmp_path: Path) -> None:
    said, installed = _run(tmp_path)
    assert not installed
    assert "the Flower browser test skips" in said
    assert "INSTALL_BROWSER=1 ./scripts/test installs it" in said


@pytest.mark.skipif(os.geteuid() != 0, reason="the script installs as root only")
def test_ci_and_an_explicit_yes_install_it_and_a_no_never(tmp_path: Path) -> None:
    said, installed = _run(tmp_path, CI="true")
    assert installed
    assert "installing chromium (apt-get)" in said
    (tmp_path / "apt-get-ran").unlink()
    assert _run(tmp_path, INSTALL_BROWSER="1")[1]
    (tmp_path / "apt-get-ran").unlink()
    assert not _run(tmp_path, CI="true", INSTALL_BROWSER="0")[1]
