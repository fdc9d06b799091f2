"""One real vLLM CPU server per configuration for the whole test run, shared by every test that
needs that configuration.

A configuration is a `ServerSpec`: the model directory, the server flags, max_model_len, the KV
space and the environment. `VllmServerPool.get(spec)` starts the server on first use and hands
the same one to every later caller; tests that need a fresh prefix cache reset it through vLLM's
`/reset_prefix_cache` (the servers run in dev mode) instead of restarting. At most `max_alive`
shared servers run at once (the least recently used is stopped first); a server a test means to
kill or restart comes from `private` and is stopped when the test ends. Every start-up is
counted, and the count is printed at the end of the run (tests/conftest.py).

Every server runs the `--dtype` this CPU computes fastest (`residency.cpu_dtype`: bfloat16 with
AMX-BF16 or AVX512-BF16, float32 elsewhere) unless its flags name one, and its KV space is
scaled by the dtype's bytes over bfloat16's, so a configuration holds the same number of KV
tokens on every CPU (SmolLM2 with 1 GiB in bf16 or 2 GiB in float32: 46,592 tokens).
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from vllm_server import VllmServer

from residency.cpu_dtype import DtypeChoice, same_tokens_gib, with_dtype


@dataclass(frozen=True)
class ServerSpec:
    """A server configuration; equal specs share one server."""

    model_dir: Path
    extra_args: tuple[str, ...] = ()
    max_model_len: int = 32768
    # GiB of KV cache in bfloat16; scaled to the dtype the server runs (see the module doc).
    kv_cache_space_gib: int | None = 1
    env: tuple[tuple[str, str], ...] = ()
    served_model_name: str = "tiny"
    name: str = field(default="", compare=False)


@dataclass(frozen=True)
class StartRecord:
    """One server start-up: what, how long, and whether it was shared."""

    name: str
    seconds: float
    shared: bool


def dtype_of(args: Sequence[str], default: str) -> str:
    """The `--dtype` value in server args, else `default`."""
    for i, arg in enumerate(args):
        if arg == "--dtype" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--dtype="):
            return arg.split("=", 1)[1]
    return default


class VllmServerPool:
    """Shared servers by configuration, plus private ones, every start-up counted."""

    def __init__(
        self,
        log_dir: Path,
        *,
        python: Path,
        dtype: DtypeChoice,
        max_alive: int = 3,
        before_start: Callable[[], None] | None = None,
        startup_timeout_s: float = 600.0,
    ) -> None:
        self.log_dir = log_dir
        self.python = python
        self.dtype = dtype
        self.max_alive = max_alive
        self.before_start = before_start
        self.startup_timeout_s = startup_timeout_s
        self.starts: list[StartRecord] = []
        self._shared: OrderedDict[ServerSpec, VllmServer] = OrderedDict()
        self._pinned: set[ServerSpec] = set()
        self._private: list[VllmServer] = []

    def args_of(self, spec: ServerSpec) -> tuple[str, ...]:
        """The server flags a spec runs with: its own, plus this CPU's `--dtype` if none."""
        return with_dtype(spec.extra_args, self.dtype)

    def kv_gib_of(self, spec: ServerSpec) -> int | None:
        """VLLM_CPU_KVCACHE_SPACE for a spec: its bf16 GiB times the dtype's bytes / 2."""
        if spec.kv_cache_space_gib is None:
            return None
        return same_tokens_gib(
            dtype_of(self.args_of(spec), self.dtype.dtype), spec.kv_cache_space_gib
        )

    def get(self, spec: ServerSpec, *, pin: bool = False) -> VllmServer:
        """The running server for `spec`, started if there is none; before a start, the least
        recently used unpinned servers beyond `max_alive` are stopped. A pinned server (one a
        session fixture hands out) runs until the pool closes."""
        if pin:
            self._pinned.add(spec)
        server = self._shared.get(spec)
        if server is not None and server.pid is not None:
            self._shared.move_to_end(spec)
            return server
        evictable = [s for s in self._shared if s not in self._pinned]
        while evictable and len(self._shared) >= self.max_alive:
            self._shared.pop(evictable.pop(0)).stop()
        server = self._start(spec, shared=True)
        self._shared[spec] = server
        return server

    def release(self, spec: ServerSpec) -> None:
        """Stop the shared server of `spec` now (a configuration one module uses: its memory,
        2-4 GB, goes back before the next module starts its own)."""
        server = self._shared.pop(spec, None)
        self._pinned.discard(spec)
        if server is not None:
            server.stop()

    def private(self, spec: ServerSpec, *, port: int | None = None) -> VllmServer:
        """A server of its own for a test that stops, kills or restarts it (stopped by
        `close_private`)."""
        server = self._start(spec, shared=False, port=port)
        self._private.append(server)
        return server

    def _start(self, spec: ServerSpec, *, shared: bool, port: int | None = None) -> VllmServer:
        if self.before_start is not None:
            self.before_start()
        label = re.sub(r"[^\w.-]", "_", spec.name or spec.model_dir.name)
        server = VllmServer(
            spec.model_dir,
            log_path=self.log_dir / f"{label}-{len(self.starts)}.log",
            served_model_name=spec.served_model_name,
            max_model_len=spec.max_model_len,
            extra_args=self.args_of(spec),
            env=dict(spec.env),
            kv_cache_space_gib=self.kv_gib_of(spec),
            python=self.python,
            startup_timeout_s=self.startup_timeout_s,
            port=port,
        )
        started = time.monotonic()
        try:
            server.start()
        finally:
            self.starts.append(StartRecord(label, time.monotonic() - started, shared))
        return server

    def close_private(self) -> None:
        """Stop every private server (newest first)."""
        while self._private:
            self._private.pop().stop()

    def close(self) -> None:
        """Stop every server of the pool."""
        self.close_private()
        while self._shared:
            _, server = self._shared.popitem()
            server.stop()

    def summary(self) -> str:
        """'vLLM server start-ups: 9 (shared 7, private 2), 241 s: dense 24 s, ...'."""
        shared = sum(1 for s in self.starts if s.shared)
        total = sum(s.seconds for s in self.starts)
        each = ", ".join(f"{s.name} {s.seconds:.0f} s" for s in self.starts)
        return (
            f"vLLM server start-ups: {len(self.starts)} (shared {shared}, private "
            f"{len(self.starts) - shared}), {total:.0f} s: {each or 'none'}"
        )


class Collected(Protocol):
    """What `group_by_server` reads of a collected test: its id and its fixtures' names."""

    nodeid: str
    fixturenames: list[str]


T = TypeVar("T", bound=Collected)


def group_by_server(items: Sequence[T], fixtures: Sequence[str]) -> list[T]:
    """`items` with the modules that use one of `fixtures` (a shared server the pool may stop,
    not pinned) moved up to run right after the first module using the same one; the order is
    otherwise kept. The pool keeps `max_alive` servers: in file order the hybrid server was
    stopped and started again twice, the KV-event one once, ~35 s each on 2 cores."""
    modules: dict[str, list[T]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    def server_of(module: str) -> str | None:
        used = {name for item in modules[module] for name in item.fixturenames}
        return next((f for f in fixtures if f in used), None)

    servers = {module: server_of(module) for module in modules}
    ordered: list[T] = []
    placed: set[str] = set()
    for module, server in servers.items():
        if module in placed:
            continue
        group = [module] if server is None else [m for m, s in servers.items() if s == server]
        for m in group:
            if m not in placed:
                placed.add(m)
                ordered.extend(modules[m])
    return ordered


def env_items(env: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    """A spec's environment as sorted pairs (hashable)."""
    return tuple(sorted((env or {}).items()))
