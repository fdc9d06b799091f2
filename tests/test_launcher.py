"""The shared launcher (demo and test harness) on real child processes, no vLLM: a stdlib HTTP
server that answers /health, one that dies while starting, and the stop of a whole group."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from residency.launcher import (
    ManagedServer,
    ServerStartError,
    free_port,
    group_alive,
    vllm_command,
    vllm_env,
)

# A server that answers GET /health with `status` and forks a child into its group (as vLLM
# forks its engine core), so stopping must take the whole group down.
HEALTH_SERVER = """
import http.server, subprocess, sys
status = int(sys.argv[2])
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(status if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def _server(tmp_path: Path, status: int = 200, code: str = HEALTH_SERVER) -> ManagedServer:
    port = free_port()
    command = [sys.executable, "-c", code, str(port), str(status)]
    return ManagedServer("toy", command, port=port, log_path=tmp_path / "toy.log")


def test_start_waits_for_health_and_stop_ends_the_whole_group(tmp_path: Path) -> None:
    server = _server(tmp_path).start(timeout_s=60)
    pgid = server.pid
    assert pgid is not None
    assert server.startup_s is not None
    assert server.log_text().startswith(f"$ {sys.executable} -c")
    assert group_alive(pgid)
    server.stop()
    assert not group_alive(pgid)  # the forked child went with its leader
    assert server.pid is None
    server.stop()  # idempotent


@pytest.mark.parametrize(("accept", "up"), [(True, True), (False, False)], ids=["503-ok", "503"])
def test_unavailable_counts_as_up_only_when_asked(tmp_path: Path, accept: bool, up: bool) -> None:
    server = _server(tmp_path, status=503)
    try:
        if up:
            server.start(timeout_s=60, accept_unavailable=accept)
        else:
            with pytest.raises(ServerStartError, match="not healthy after 2 s"):
                server.start(timeout_s=2, accept_unavailable=accept)
    finally:
        server.stop()


def test_a_server_that_dies_fails_fast_with_its_root_cause(tmp_path: Path) -> None:
    dying = "import sys; print('loading', flush=True); raise ValueError('no config.json in /m')"
    server = _server(tmp_path, code=dying)
    with pytest.raises(ServerStartError, match="exited with code 1") as excinfo:
        server.start(timeout_s=60)
    message = str(excinfo.value)
    assert "root cause(s):\nValueError: no config.json in /m" in message
    assert "loading" in message  # the log's last lines follow
    assert server.pid is None  # a failed start is stopped


def test_vllm_command_and_env() -> None:
    command = vllm_command(Path("/py"), Path("/m"), 8123, "tiny", 4096, ("--enforce-eager",))
    assert command[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    assert command[command.index("--port") + 1] == "8123"
    assert command[-1] == "--enforce-eager"
    env = vllm_env(2, dev_mode=True)
    assert (env["VLLM_CPU_KVCACHE_SPACE"], env["VLLM_SERVER_DEV_MODE"]) == ("2", "1")
    assert env["HF_HUB_OFFLINE"] == "1"
    plain = vllm_env(None)  # nothing added beyond this process's own environment
    for name in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_SERVER_DEV_MODE"):
        assert plain.get(name) == os.environ.get(name)


@pytest.mark.parametrize(
    ("cores", "preset", "expected"),
    [
        pytest.param({0, 1}, None, "0", id="2-cores-reserve-none"),
        pytest.param({0, 1}, "1", "1", id="2-cores-user-setting-kept"),
        pytest.param(set(range(8)), None, None, id="8-cores-vllm-default"),
    ],
)
def test_few_cores_give_the_model_every_core(
    monkeypatch: pytest.MonkeyPatch, cores: set[int], preset: str | None, expected: str | None
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: cores)
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    if preset is not None:
        monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", preset)
    assert vllm_env(1).get("VLLM_CPU_NUM_OF_RESERVED_CPU") == expected
