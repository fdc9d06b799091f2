"""bm25s, imported with JAX held to the CPU: the one place residency imports bm25s.

Why: when jax is importable, bm25s runs ``jax.lax.top_k`` at import time
(``bm25s/selection.py``), and JAX's first computation on a GPU host preallocates 75% of the
device's memory for as long as the process lives (JAX docs, "GPU memory allocation"). On an H200
``import residency.retrieval.sparse`` held 107,927 MiB that way (issue #22): a router started
before vLLM kept vLLM from starting, one started after it printed XLA out-of-memory errors.
residency never needs JAX (it ranks BM25 scores itself), so:

- bm25s is imported with ``jax`` marked unimportable for the length of that import, so its
  import-time probe finds no JAX and costs neither GPU memory nor JAX's start-up (about a second
  on 2 cores); a jax the process imported earlier is left in place, and bm25s uses it;

and, for any JAX this process (or a child) starts later, before bm25s is imported:

- ``JAX_PLATFORMS=cpu`` is set in this process's environment (overriding any other value: this
  process never runs JAX on an accelerator), and so inherited by the processes it starts;
- ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` is set unless the user set it, so that even a JAX that
  was already pointed at a GPU before residency was imported allocates on demand;
- if jax was already imported and has not started a backend yet, its ``jax_platforms`` setting is
  switched to ``cpu`` as well. A JAX that already runs on a GPU in this process (residency used as
  a library inside a JAX program) is left alone: it holds that memory already.

``make gpu-check`` (scripts/gpu_check.py) measures the process's GPU memory after the import on a
real GPU; tests/test_jax_hold.py checks the setting on every machine with jax installed.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys

JAX_PLATFORMS = "cpu"


def hold_jax_to_cpu() -> None:
    """Point JAX at the CPU for this process (and its children) before anything computes."""
    os.environ["JAX_PLATFORMS"] = JAX_PLATFORMS
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    jax = sys.modules.get("jax")
    if jax is None or not hasattr(jax, "config"):
        return
    try:
        from jax._src import xla_bridge

        if xla_bridge.backends_are_initialized():
            return  # too late to move it; see the module docstring
    except (ImportError, AttributeError):
        pass
    with contextlib.suppress(AttributeError, RuntimeError, ValueError):
        jax.config.update("jax_platforms", JAX_PLATFORMS)


def _import_bm25s_without_jax() -> None:
    if "jax" in sys.modules:  # already imported: bm25s will use it, held to the CPU above
        return
    # bm25s/selection.py: `try: import jax.lax` -> ImportError -> JAX_IS_AVAILABLE = False.
    sys.modules["jax"] = None  # type: ignore[assignment]
    try:
        importlib.import_module("bm25s")
    finally:
        if "jax" in sys.modules and sys.modules["jax"] is None:
            del sys.modules["jax"]


hold_jax_to_cpu()
_import_bm25s_without_jax()

import bm25s  # noqa: E402  (after the hold, by design)

__all__ = ["JAX_PLATFORMS", "bm25s", "hold_jax_to_cpu"]
