"""The query log through log rotation, while requests flow (issue 35, reproduction 3): a real
router (its only upstream a closed port, so each request is answered 503 and logged at once)
gets one request after another from a thread, each with its own question, while the test
rotates the log under it.

- rename (logrotate's default, with and without `create`): every line is in the old file or
  the new one, exactly once;
- delete: every request that started after the delete is in the new file;
- copytruncate: every request that started after the truncation is in the file, which holds no
  hole; what was appended between the copy and the truncation is lost, by copytruncate's design.

A path that vanished is one warning line; SIGUSR1 and SIGHUP reopen the file; lines written
are counted in residency_router_query_log_lines_total.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from offline_router import metric, offline_plan, wait_for
from router_server import RouterProcess

ARGS = ("--no-warm", "--retriever", "bm25")


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path) -> Path:
    return offline_plan(tmp_path_factory.mktemp("rotation"), tiny_tokenizer_dir)


@pytest.fixture
def router(plan: Path, dead_upstream: str, tmp_path: Path) -> Iterator[RouterProcess]:
    with RouterProcess(plan, [dead_upstream], tmp_path, ARGS).start(require_healthy=False) as r:
        yield r


def queries(path: Path) -> list[str]:
    """The questions logged in `path`, in order; every line must parse (no hole, no tear)."""
    data = path.read_bytes() if path.exists() else b""
    assert b"\0" not in data
    return [orjson.loads(line)["query"] for line in data.splitlines()]


class Flow:
    """One request after another from a thread, each asking its own question."""

    def __init__(self, router: RouterProcess) -> None:
        self.router = router
        self.sent: list[str] = []  # appended before the request goes out
        self.answered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                question = f"霧信号の質問 {len(self.sent)}"
                self.sent.append(question)
                body = {"messages": [{"role": "user", "content": question}], "max_tokens": 1}
                response = client.post(f"{self.router.base_url}/v1/chat/completions", json=body)
                assert response.status_code == 503, response.text
                self.answered += 1

    def __enter__(self) -> Flow:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def wait_answered(self, more_than: int) -> None:
        wait_for(lambda: self.answered > more_than, f"more than {more_than} answers")


def rename(log: Path) -> Path:
    rotated = log.with_suffix(".1")
    os.rename(log, rotated)
    return rotated


def rename_create(log: Path) -> Path:
    """The old file moved aside and a new one at the path, with no instant where the path is
    missing (a hard link, then an empty file renamed over the path): the case where it is
    missing for a moment is "rename"'s, and a request landing in that moment sees it vanish."""
    rotated = log.with_suffix(".1")
    os.link(log, rotated)
    fresh = log.with_suffix(".new")
    fresh.touch()
    os.rename(fresh, log)
    return rotated


def delete(log: Path) -> Path:
    log.unlink()
    return log.with_suffix(".gone")  # nothing there


def copytruncate(log: Path) -> Path:
    rotated = log.with_suffix(".1")
    shutil.copyfile(log, rotated)
    os.truncate(log, 0)
    return rotated


ROTATIONS: dict[str, Callable[[Path], Path]] = {
    "rename": rename,
    "rename-create": rename_create,
    "delete": delete,
    "copytruncate": copytruncate,
}


@pytest.mark.parametrize("how", list(ROTATIONS))
def test_no_line_is_lost_through_rotation_while_requests_flow(
    router: RouterProcess, how: str
) -> None:
    log = router.query_log
    with Flow(router) as flow:
        wait_for(lambda: len(queries(log)) >= 20, "20 lines before the rotation")
        rotated = ROTATIONS[how](log)
        after = len(flow.sent)  # requests from here on started after the rotation
        flow.wait_answered(after + 20)
    sent = flow.sent[: flow.answered]
    wait_for(
        lambda: metric(router.base_url, "residency_router_query_log_lines_total") == flow.answered,
        "every answered request's line",
    )
    new, old = queries(log), queries(rotated)
    assert not set(new) & set(old), "a line in both files"
    assert max(Counter(new + old).values()) == 1, "a line written twice"
    assert set(sent[after:]) <= set(new), "a line of a request after the rotation is missing"
    if how.startswith("rename"):  # nothing may be lost at all
        assert Counter(new + old) == Counter(sent)
    vanished = [x for x in router.log_text().splitlines() if "vanished" in x]
    if how in ("rename", "delete"):
        assert len(vanished) == 1, vanished
        assert "WARNING" in vanished[0]
        assert metric(router.base_url, "residency_router_query_log_reopens_total") == 1
    else:  # a new file at the path (replaced), or the same file truncated
        assert vanished == []
        assert metric(router.base_url, "residency_router_query_log_reopens_total") == (
            1 if how == "rename-create" else 0
        )
    assert "Traceback" not in router.log_text()


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGHUP], ids=["SIGUSR1", "SIGHUP"])
def test_a_signal_reopens_the_log(router: RouterProcess, sig: signal.Signals) -> None:
    """logrotate's postrotate: after a rename and a signal, the next line is in the new file
    (the signal reopened it; the path check found nothing left to do)."""
    log = router.query_log
    with Flow(router) as flow:
        wait_for(lambda: len(queries(log)) >= 5, "5 lines")
        held_open = log.with_suffix(".1")
        os.rename(log, held_open)
        log.touch()
        os.kill(router.pid or 0, sig)
        wait_for(
            lambda: f"reopened ({sig.name})" in router.log_text(), f"the {sig.name} reopen line"
        )
        after = len(flow.sent)
        flow.wait_answered(after + 5)
    wait_for(
        lambda: metric(router.base_url, "residency_router_query_log_lines_total") == flow.answered,
        "every answered request's line",
    )
    assert set(flow.sent[after : flow.answered]) <= set(queries(log))
    assert Counter(queries(log) + queries(held_open)) == Counter(flow.sent[: flow.answered])
    assert "Traceback" not in router.log_text()
