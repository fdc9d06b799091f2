"""`make gpu-check`: the checks that need a real NVIDIA GPU, run where one exists.

1. NVML: every visible device, read through residency (`CUDA_VISIBLE_DEVICES` applied).
2. The JAX hold: a child process imports residency's CLI and its BM25 module (which imports
   bm25s, which runs JAX at import when jax is installed) and stays alive; the device's used
   memory is read through NVML while it lives. The same import without the hold (plain
   `import bm25s`, JAX left to its defaults) is measured beside it, so the check shows what
   the hold prevents. Needs jax with a GPU plugin; skipped (and said so) without jax.
3. Free memory: a child process holds part of the GPU through PyTorch (`--hold-gib`, default
   40% of the device); `residency plan --gpu auto` must refuse in one line naming both numbers
   and the largest utilization that would start, and plan at that utilization. Skipped without
   torch.
4. Device selection: `CUDA_VISIBLE_DEVICES` by index and by UUID, a device that does not exist,
   `--gpu-index` and a TP size beyond the visible devices each get one line, no traceback.

Prints one JSON object (also written to `--out`) and exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MiB = 1 << 20

_HOLD_CHILD = """
import sys, time
{setup}
sys.stdout.write("ready\\n"); sys.stdout.flush()
time.sleep(600)
"""

_WITH_HOLD = "import residency.cli, residency.retrieval.sparse"
# A process that imported jax before residency (residency used as a library): bm25s then uses
# that jax, and the hold must have switched it to the CPU before its first computation.
_JAX_FIRST = "import jax; " + _WITH_HOLD
# What residency did before the hold: bm25s imported with JAX's defaults.
_WITHOUT_HOLD = "import bm25s"
_TORCH_HOLD = "import torch; x = torch.empty({n}, dtype=torch.uint8, device='cuda'); x.fill_(1)"


def _used_bytes(index: int) -> int:
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    finally:
        pynvml.nvmlShutdown()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def _hold(setup: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """Start a child that runs `setup` and then sleeps; return once it says ready (the device
    run's own timeout bounds a child that never does)."""
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLD_CHILD.format(setup=setup)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    if line.strip() != "ready":
        child.kill()
        _, err = child.communicate()
        raise RuntimeError(f"child did not start: {err[-2000:]}")
    time.sleep(2)  # let allocations settle before NVML reads them
    return child


def _stop(child: subprocess.Popen[str]) -> str:
    child.kill()
    _, err = child.communicate()
    return err


def _cli(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "residency", *args],
        capture_output=True,
        text=True,
        env=env or _env(),
        cwd=REPO,
        timeout=300,
    )
    return {
        "args": list(args),
        "rc": out.returncode,
        "stderr": out.stderr.strip()[-1500:],
        "stdout_json": _maybe_json(out.stdout),
        "traceback": "Traceback" in out.stderr,
    }


def _maybe_json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text.strip()[-1500:] or None


def check_nvml() -> dict[str, Any]:
    from residency.capacity.gpu import read_visible_gpus

    gpus = read_visible_gpus()
    return {"ok": len(gpus) > 0, "devices": [g.model_dump() for g in gpus]}


def check_jax_hold(index: int) -> dict[str, Any]:
    try:
        import jax  # noqa: F401
    except ImportError:
        return {"ok": True, "skipped": "jax is not installed"}
    result: dict[str, Any] = {}
    cases = (
        ("with_hold", _WITH_HOLD),
        ("jax_imported_first_with_hold", _JAX_FIRST),
        ("without_hold", _WITHOUT_HOLD),
    )
    for name, setup in cases:
        before = _used_bytes(index)
        child = _hold(setup, _env())
        during = _used_bytes(index)
        err = _stop(child)
        result[name] = {
            "used_before_mib": before // MiB,
            "used_during_mib": during // MiB,
            "held_mib": (during - before) // MiB,
            "stderr_tail": err.strip()[-300:],
        }
        time.sleep(2)
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            _JAX_FIRST + "; print(jax.default_backend(), jax.devices()[0].platform)",
        ],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=REPO,
        timeout=180,
    )
    result["backend_after_import"] = probe.stdout.strip()
    result["ok"] = result["with_hold"]["held_mib"] < 64 and probe.stdout.strip().startswith("cpu")
    return result


def check_free_memory(index: int, hold_gib: float | None) -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"ok": True, "skipped": "torch is not installed"}
    total = torch.cuda.get_device_properties(index).total_memory
    hold = int((hold_gib or total / (1 << 30) * 0.4) * (1 << 30))
    env = _env(CUDA_VISIBLE_DEVICES=str(index))
    child = _hold(_TORCH_HOLD.format(n=hold), env)
    try:
        model = ("--model", "llama-3.1-8b-instruct")
        refused = _cli("plan", "--capacity-only", "--gpu", "auto", *model, "--json", env=env)
        hint = refused["stderr"].split("--gpu-memory-utilization ")[-1].split(" ")[0]
        planned = (
            _cli(
                "plan",
                "--capacity-only",
                "--gpu",
                "auto",
                *model,
                "--gpu-memory-utilization",
                hint,
                "--json",
                env=env,
            )
            if hint.replace(".", "", 1).isdigit()
            else {"rc": None, "stderr": f"no utilization in the refusal: {refused['stderr']}"}
        )
    finally:
        _stop(child)
    one_line = refused["rc"] == 1 and len(refused["stderr"].splitlines()) == 1
    return {
        "ok": one_line and not refused["traceback"] and planned["rc"] == 0,
        "held_gib": round(hold / (1 << 30), 2),
        "refused": refused,
        "suggested_utilization": hint,
        "planned_at_suggestion": {k: planned.get(k) for k in ("rc", "stderr")}
        | {
            "kv_cache_tokens": planned.get("stdout_json", {}).get("kv_cache_tokens")
            if isinstance(planned.get("stdout_json"), dict)
            else None
        },
    }


def check_selection() -> dict[str, Any]:
    from residency.capacity.gpu import read_visible_gpus

    gpus = read_visible_gpus()
    n = len(gpus)
    base = ("plan", "--capacity-only", "--gpu", "auto", "--model", "llama-3.1-8b-instruct")
    cases = {
        "by_index": _cli(*base, "--json", env=_env(CUDA_VISIBLE_DEVICES="0")),
        "by_uuid": _cli(*base, "--json", env=_env(CUDA_VISIBLE_DEVICES=gpus[0].uuid)),
        "missing_device": _cli(*base, env=_env(CUDA_VISIBLE_DEVICES=str(n + 3))),
        "gpu_index_past_end": _cli(*base, "--gpu-index", str(n)),
        "tp_past_end": _cli(*base, "--tensor-parallel-size", str(2 * n)),
    }
    ok = (
        cases["by_index"]["rc"] == 0
        and cases["by_uuid"]["rc"] == 0
        and all(
            c["rc"] == 1 and not c["traceback"] and len(c["stderr"].splitlines()) == 1
            for k, c in cases.items()
            if k not in ("by_index", "by_uuid")
        )
    )
    for c in cases.values():
        if isinstance(c["stdout_json"], dict):
            c["stdout_json"] = {
                k: c["stdout_json"][k] for k in ("kv_cache_tokens", "num_blocks", "block_size")
            } | {"devices": c["stdout_json"]["inputs"]["devices"]}
    return {"ok": ok, "cases": cases}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=int, default=0, help="NVML index to measure on.")
    parser.add_argument(
        "--hold-gib", type=float, default=None, help="Memory held by another process."
    )
    parser.add_argument("--out", type=Path, default=None, help="Also write the JSON here.")
    args = parser.parse_args()
    report: dict[str, Any] = {}
    for name, run in (
        ("nvml", check_nvml),
        ("jax_hold", lambda: check_jax_hold(args.index)),
        ("free_memory", lambda: check_free_memory(args.index, args.hold_gib)),
        ("selection", check_selection),
    ):
        started = time.monotonic()
        try:
            report[name] = run()
        except Exception as exc:  # a check that breaks is a failed check, with its reason
            report[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        report[name]["seconds"] = round(time.monotonic() - started, 1)
    report["ok"] = all(v.get("ok") for v in report.values() if isinstance(v, dict))
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
