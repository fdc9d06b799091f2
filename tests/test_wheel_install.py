"""`pip install` of a built wheel works outside the checkout (issue #23): profiles and sample
corpora come from package data, caches go to $RESIDENCY_CACHE, nothing reads the repository.

The wheel is built from this checkout and installed without its dependencies into a fresh venv
in a temporary folder; the dependencies come from the project's own venv through a `.pth` line
(its `.pth` files, the editable install's finder among them, are not run from there), so the
only `residency` the new venv can import is the wheel's. Every command runs from that folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from residency.capacity.report import build_capacity_report
from residency.capacity.request import CapacityRequest

REPO_ROOT = Path(__file__).resolve().parent.parent


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> str:
    out = subprocess.run(args, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)
    assert out.returncode == 0, f"{args}: {out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    return out.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], Path]:
    """(venv bin dir, environment, working folder) of a fresh venv holding only the wheel."""
    root = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RESIDENCY_CACHE")}
    env["RESIDENCY_CACHE"] = str(root / "cache")
    # Built from a copy: setuptools' build/ never deletes, so a stale one could smuggle a
    # removed module into the wheel, and the checkout stays untouched.
    source = root / "source"
    shutil.copytree(
        REPO_ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv",
            ".cache",
            "build",
            "dist",
            "*.egg-info",
            "__pycache__",
            ".*_cache",
            ".benchmarks",
            ".whl",
            "demo-out",
        ),
    )
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "-w",
            str(root / "dist"),
            str(source),
        ],
        cwd=root,
        env=env,
    )
    (wheel,) = (root / "dist").glob("residency-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "residency/data/profiles/models/qwen3.5-4b-fp8.toml" in names
    assert any(n.startswith("residency/data/corpora/harbor-lights-en/docs/") for n in names)
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=root, env=env)
    python = venv / "bin" / "python"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--quiet",
            str(wheel),
        ],
        cwd=root,
        env=env,
    )
    site = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            cwd=root,
            env=env,
        ).strip()
    )
    (site / "project-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", "utf-8")
    work = root / "work"
    work.mkdir()
    return venv / "bin", env, work


def test_the_wheel_is_what_gets_imported(installed: tuple[Path, dict[str, str], Path]) -> None:
    bin_dir, env, work = installed
    where = _run(
        [str(bin_dir / "python"), "-c", "import residency; print(residency.__file__)"], work, env
    )
    assert Path(where.strip()).is_relative_to(bin_dir.parent)
    assert not Path(where.strip()).is_relative_to(REPO_ROOT)


def test_profiles_from_package_data(installed: tuple[Path, dict[str, str], Path]) -> None:
    bin_dir, env, work = installed
    out = _run([str(bin_dir / "residency"), "profiles", "--json"], work, env)
    listed = json.dumps(json.loads(out))
    for name in ("qwen3.5-4b-fp8", "llama-3.1-8b-instruct", "rtx4070-12gb", "h200-141gb"):
        assert name in listed


def test_capacity_plan_matches_the_checkout(installed: tuple[Path, dict[str, str], Path]) -> None:
    bin_dir, env, work = installed
    out = _run([str(bin_dir / "residency"), "plan", "--capacity-only", "--json"], work, env)
    report = json.loads(out)
    here = build_capacity_report(CapacityRequest())
    assert report["kv_cache_tokens"] == here.kv_cache_tokens
    assert report["inputs"]["model"] == "qwen3.5-4b-fp8"


def test_index_the_packaged_english_sample(
    installed: tuple[Path, dict[str, str], Path],
) -> None:
    bin_dir, env, work = installed
    samples = json.loads(
        _run([str(bin_dir / "residency"), "corpus", "samples", "--json"], work, env)
    )
    (english,) = [s for s in samples if s["name"] == "harbor-lights-en"]
    docs = Path(english["docs"])
    assert docs.is_relative_to(bin_dir.parent), docs
    out = _run(
        [
            str(bin_dir / "residency"),
            "index",
            str(docs),
            "-o",
            str(work / "index"),
            "--no-dense",
            "--chunk-chars",
            "800",
            "--json",
        ],
        work,
        env,
    )
    manifest = json.loads(out)
    assert manifest["section_count"] > 10
    assert (work / "index").is_dir()
