"""residency never initialises JAX on an accelerator (issue #22): bm25s runs `jax.lax.top_k` at
import when jax is importable, and JAX then preallocates 75% of a GPU (107,926 MiB measured on an
H200 by `make gpu-check`, 0 MiB with the hold: docs/measurements/gpu-check-h200.json). CI
installs a CPU jax (dev extra) so these tests run there; on a CPU-only machine they check the
setting that keeps JAX off the GPU, which the measured run shows is what decides."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax", reason="jax is a dev dependency: make install brings it")

REPO_ROOT = Path(__file__).resolve().parent.parent
PROBE = """
import json, sys
{before}
import residency.cli
import residency.retrieval.sparse  # what every retrieval command imports (bm25s with it)
jax_before = "jax" in sys.modules
import bm25s.selection
import jax, os
print(json.dumps({{
    "bm25s_loaded": "bm25s" in sys.modules,
    "jax_imported_by_residency": jax_before,
    "bm25s_uses_jax": bm25s.selection.JAX_IS_AVAILABLE,
    "jax_platforms_config": jax.config.jax_platforms,
    "env": os.environ.get("JAX_PLATFORMS"),
    "prealloc": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
    "backend": jax.default_backend(),
}}))
"""


def probe(before: str = "", **env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(before=before)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO_ROOT,
        env={**clean, **env},
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize(
    ("before", "env"),
    [
        pytest.param("", {}, id="defaults"),
        # A user whose environment points JAX at the GPU: residency still keeps it off.
        pytest.param("", {"JAX_PLATFORMS": "cuda,cpu"}, id="env-asks-for-gpu"),
        # jax imported first (no computation yet): the hold reaches its config too.
        pytest.param("import jax", {}, id="jax-imported-first"),
    ],
)
def test_jax_is_held_to_the_cpu_after_importing_the_cli(before: str, env: dict[str, str]) -> None:
    result = probe(before, **env)
    assert result["bm25s_loaded"] is True
    # bm25s's import-time JAX probe is kept from starting JAX, unless jax was there first.
    assert result["jax_imported_by_residency"] is bool(before)
    assert result["bm25s_uses_jax"] is bool(before)
    # Any JAX in the process, now or later, runs on the CPU.
    assert result["jax_platforms_config"] == "cpu"
    assert result["env"] == "cpu"
    assert result["backend"] == "cpu"


def test_preallocation_is_off_unless_the_user_set_it() -> None:
    assert probe()["prealloc"] == "false"
    assert probe(XLA_PYTHON_CLIENT_PREALLOCATE="true")["prealloc"] == "true"


def test_bm25s_is_imported_in_one_place() -> None:
    """Every import of bm25s in the package goes through residency.retrieval.bm25s_cpu."""
    offenders = [
        str(path.relative_to(REPO_ROOT))
        for path in (REPO_ROOT / "residency").rglob("*.py")
        if path.name != "bm25s_cpu.py"
        and any(
            line.strip().startswith(("import bm25s", "from bm25s"))
            for line in path.read_text(encoding="utf-8").splitlines()
        )
    ]
    assert offenders == []
