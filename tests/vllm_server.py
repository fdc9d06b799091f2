"""A real vLLM OpenAI-compatible server in a child process group, for tests and experiments: the
library's launcher (`residency.launcher`, which the demo uses too) with the suite's defaults.

    with VllmServer(model_dir, log_path=tmp / "vllm.log", max_model_len=32768) as server:
        VllmClient(server.base_url).models()

The server gets a free loopback port, its own process group (vLLM forks an engine core and a
worker), a log file, and offline settings (HF_HUB_OFFLINE=1) with VLLM_SERVER_DEV_MODE=1.
`start()` waits for GET /health and raises `VllmServerError` with the root causes and last log
lines as soon as the process dies or the timeout passes; `stop()` sends SIGINT, then SIGTERM,
then SIGKILL to the whole group and waits, so no process outlives the block.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from residency.cpu_dtype import CpuDtypeFlag, choose_cpu_dtype, with_dtype
from residency.launcher import ManagedServer, ServerStartError, free_port, vllm_command, vllm_env
from residency.launcher import group_alive as process_group_alive

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PYTHON = Path(sys.executable)
# SIGINT first: vLLM's API server then shuts its engine core and worker down as on Ctrl-C.
STOP_SEQUENCE = ((signal.SIGINT, 15.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0))

__all__ = [
    "REPO_ROOT",
    "VllmServer",
    "VllmServerError",
    "free_port",
    "process_group_alive",
    "server_env",
]

VllmServerError = ServerStartError


def test_dtype_flag() -> CpuDtypeFlag:
    """RESIDENCY_TEST_DTYPE (auto, bfloat16 or float32; default auto): the suite's --dtype."""
    value = os.environ.get("RESIDENCY_TEST_DTYPE", "auto")
    if value not in ("auto", "bfloat16", "float32"):
        raise ValueError(f"RESIDENCY_TEST_DTYPE={value!r}: use auto, bfloat16 or float32")
    return value  # type: ignore[return-value]


def server_env(kv_cache_space_gib: int | None = 1, dev_mode: bool = True) -> dict[str, str]:
    """The environment a tiny-model CPU server runs with (offline, bounded KV cache, dev mode)."""
    return vllm_env(kv_cache_space_gib, dev_mode)


class VllmServer(ManagedServer):
    """`python -m vllm.entrypoints.openai.api_server` on a free port, as a context manager."""

    def __init__(
        self,
        model_dir: Path,
        *,
        log_path: Path,
        served_model_name: str = "tiny",
        max_model_len: int = 32768,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        kv_cache_space_gib: int | None = 1,
        dev_mode: bool = True,
        python: Path = DEFAULT_PYTHON,
        startup_timeout_s: float = 420.0,
        port: int | None = None,
    ) -> None:
        port = port if port is not None else free_port()
        # The dtype this CPU runs fastest unless the args name one (residency.cpu_dtype).
        extra_args = with_dtype(tuple(extra_args), choose_cpu_dtype(test_dtype_flag()))
        self.model_dir = model_dir
        self.served_model_name = served_model_name
        self.max_model_len = max_model_len
        self.startup_timeout_s = startup_timeout_s
        super().__init__(
            "vLLM server",
            vllm_command(python, model_dir, port, served_model_name, max_model_len, extra_args),
            port=port,
            log_path=log_path,
            env={**server_env(kv_cache_space_gib, dev_mode), **(env or {})},
            cwd=REPO_ROOT,
            stop_at_exit=True,
            stop_sequence=STOP_SEQUENCE,
        )

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:PORT (no trailing slash, no /v1)."""
        return self.url

    def start(self, timeout_s: float | None = None) -> VllmServer:
        """Launch the server and block until /health answers 200; raise if it dies or hangs."""
        super().start(timeout_s if timeout_s is not None else self.startup_timeout_s)
        return self

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
