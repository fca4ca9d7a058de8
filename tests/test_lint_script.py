"""``scripts/lint.sh`` fails when either style check fails (CI relies on its exit status), with stand-in tools."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run_with_tools(tmp_path: Path, ruff_status: int, clang_format_status: int) -> subprocess.CompletedProcess:
    """Run lint.sh with stand-ins for ruff and clang-format in BIN that exit with the given statuses."""
    for name, status in (("ruff", ruff_status), ("clang-format", clang_format_status)):
        tool = tmp_path / name
        tool.write_text(f"#!/bin/sh\nexit {status}\n")
        tool.chmod(0o755)
    env = {**os.environ, "BIN": str(tmp_path)}
    return subprocess.run(["bash", str(ROOT / "scripts" / "lint.sh")], capture_output=True, text=True, env=env)


@pytest.mark.parametrize("ruff_status, clang_format_status, verdicts", [
    (0, 0, ["ruff: ok", "clang-format: ok"]),
    (1, 0, ["ruff: failed", "clang-format: ok"]),
    (0, 1, ["ruff: ok", "clang-format: failed"]),
    (1, 1, ["ruff: failed", "clang-format: failed"]),
])
def test_exit_status_follows_both_checks(tmp_path, ruff_status, clang_format_status, verdicts):
    result = _run_with_tools(tmp_path, ruff_status, clang_format_status)
    assert result.stdout.split("\n")[:2] == verdicts
    assert (result.returncode != 0) == (ruff_status != 0 or clang_format_status != 0)
