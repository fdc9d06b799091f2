"""Every file a command reads or writes, missing, empty, torn or of the wrong shape, is one line
on stderr (`error: ...`, exit 1) naming the path, never a traceback, and the command's own output
is left as it was. The real CLI's entry point (`residency.cli.main`: its error mapping included)
runs in this process, with stdout and stderr captured, so the matrix costs no interpreter start
per case; the plan fixture and the relative-path case run as subprocesses, as a user runs them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from residency_cli import run_main

from residency.corpus.samples import EN_SAMPLE
from residency.index import build_index
from residency.planning.run import sample_index_options
from residency.tokenizer import ApproxTokenizer

pytestmark = pytest.mark.cli

REPO_ROOT = Path(__file__).resolve().parent.parent
# A SmolLM2-shaped config: planning needs one, no weights.
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 30,
    "hidden_size": 576,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}
PLAN_FLAGS = (
    "--platform",
    "cpu",
    "--kv-cache-memory-bytes",
    str(1 << 30),
    "--max-model-len",
    "4096",
)


def subprocess_cli(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    """`python -m residency ARGS` in a child process."""
    return subprocess.run(
        [sys.executable, "-m", "residency", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`residency ARGS` through `residency.cli.main` in this process."""
    return run_main(*args)


def assert_one_line(done: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Exit 1, no traceback, exactly one `error:` line that holds every fragment."""
    assert done.returncode == 1, (done.returncode, done.stdout[-500:], done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A BM25 index of the English sample, a model config and a plan made from them."""
    root = tmp_path_factory.mktemp("fuzz")
    index = root / "index"
    build_index(
        EN_SAMPLE.docs, index, sample_index_options(EN_SAMPLE, dense=False), ApproxTokenizer()
    )
    config = root / "config.json"
    config.write_text(json.dumps(MODEL_CONFIG))
    plan = root / "plan.json"
    done = cli(
        "plan",
        "--model",
        str(config),
        *PLAN_FLAGS,
        "--index",
        str(index),
        "--log",
        str(EN_SAMPLE.queries),
        "--prefixes",
        "1",
        "-o",
        str(plan),
    )
    assert done.returncode == 0, done.stderr
    return {"index": index, "config": config, "plan": plan, "root": root}


def _copy_index(good: dict[str, Path], tmp_path: Path) -> Path:
    copy = tmp_path / "index"
    shutil.copytree(good["index"], copy)
    return copy


# How a file goes wrong: the bytes written over it (None: the file is removed).
DAMAGE: dict[str, Callable[[bytes], bytes | None]] = {
    "missing": lambda data: None,
    "empty": lambda data: b"",
    "torn": lambda data: data[: len(data) // 2],
    "wrong-shape": lambda data: b'[{"unrelated": true}]\n',
}


def _damage(path: Path, how: str) -> None:
    data = DAMAGE[how](path.read_bytes())
    if data is None:
        path.unlink()
    else:
        path.write_bytes(data)


@pytest.mark.parametrize("how", list(DAMAGE))
def test_a_damaged_plan_is_one_line_for_every_command_that_reads_one(
    good: dict[str, Path], tmp_path: Path, how: str
) -> None:
    plan = tmp_path / "plan.json"
    shutil.copy(good["plan"], plan)
    _damage(plan, how)
    commands = [
        ("warm", "--plan", str(plan), "--server", "http://127.0.0.1:9"),
        ("serve", "--plan", str(plan), "--port", "0", "--no-log", "--retriever", "bm25"),
        ("bench", "--server", "http://127.0.0.1:9", "--plan", str(plan)),
        ("eval", "coverage", "--plan", str(plan), "--questions", str(EN_SAMPLE.questions)),
    ]
    for command in commands:
        assert_one_line(cli(*command), str(plan))


INDEX_FILES = ("manifest.json", "sections.jsonl", "chunks.jsonl")


@pytest.mark.parametrize("how", list(DAMAGE))
@pytest.mark.parametrize("name", [*INDEX_FILES, "bm25"])
def test_a_damaged_index_is_one_line_naming_what_to_rebuild(
    good: dict[str, Path], tmp_path: Path, name: str, how: str
) -> None:
    index = _copy_index(good, tmp_path)
    if name == "bm25":  # every file of the BM25 part, damaged alike
        for part in sorted((index / "bm25").iterdir()):
            _damage(part, how)
    else:
        _damage(index / name, how)
    out = tmp_path / "plan.json"
    out.write_text("previous\n")
    done = cli(
        "plan",
        "--model",
        str(good["config"]),
        *PLAN_FLAGS,
        "--index",
        str(index),
        "--log",
        str(EN_SAMPLE.queries),
        "-o",
        str(out),
    )
    line = assert_one_line(done, str(index))
    assert "rebuild" in line or "residency index" in line, line
    assert out.read_text() == "previous\n"  # the previous plan is intact
    retrieval = cli(
        "eval", "retrieval", "--index", str(index), "--questions", str(EN_SAMPLE.questions)
    )
    assert_one_line(retrieval, str(index))
    serve = cli(
        "serve",
        "--plan",
        str(good["plan"]),
        "--index",
        str(index),
        "--port",
        "0",
        "--no-log",
        "--retriever",
        "bm25",
    )
    assert_one_line(serve, str(index))


@pytest.mark.parametrize("how", ["missing", "empty", "torn", "wrong-shape"])
def test_a_damaged_questions_or_log_file_is_one_line(
    good: dict[str, Path], tmp_path: Path, how: str
) -> None:
    questions = tmp_path / "qa.jsonl"
    shutil.copy(EN_SAMPLE.questions, questions)
    _damage(questions, how)
    if how == "torn":  # half a line: the last record is cut
        questions.write_bytes(questions.read_bytes().rstrip(b"\n")[:-7] + b"\n")
    done = cli("eval", "retrieval", "--index", str(good["index"]), "--questions", str(questions))
    assert_one_line(done, str(questions))
    log = tmp_path / "queries.jsonl"
    shutil.copy(EN_SAMPLE.queries, log)
    _damage(log, how)
    if how == "torn":
        log.write_bytes(log.read_bytes().rstrip(b"\n")[:-7] + b"\n")
    out = tmp_path / "plan.json"
    done = cli(
        "plan",
        "--model",
        str(good["config"]),
        *PLAN_FLAGS,
        "--index",
        str(good["index"]),
        "--log",
        str(log),
        "-o",
        str(out),
    )
    if how in ("empty", "torn"):
        # An empty log has no questions yet (density-only planning); a torn last line is what a
        # router killed mid-write leaves: skipped, said in a warning, the rest planned.
        assert done.returncode == 0, done.stderr
        if how == "torn":
            assert f"{log}:" in done.stderr, done.stderr
        return
    assert_one_line(done, str(log))
    assert not out.exists()


@pytest.mark.parametrize("how", ["missing", "empty", "torn", "wrong-shape"])
def test_a_damaged_squad_file_is_one_line(tmp_path: Path, how: str) -> None:
    squad = tmp_path / "squad.json"
    squad.write_text(json.dumps({"version": "v1", "data": [{"title": "t", "paragraphs": []}]}))
    _damage(squad, how)
    out = tmp_path / "corpus"
    assert_one_line(cli("corpus", "import-squad", str(squad), str(out)), str(squad))
    assert not out.exists()


def test_output_paths_that_cannot_be_written_are_one_line_and_nothing_is_planned(
    good: dict[str, Path], tmp_path: Path
) -> None:
    args = ("plan", "--model", str(good["config"]), *PLAN_FLAGS, "--index", str(good["index"]))
    missing = tmp_path / "no" / "such" / "plan.json"
    assert_one_line(cli(*args, "-o", str(missing)), str(missing), "does not exist", "mkdir -p")
    assert_one_line(cli(*args, "-o", str(tmp_path)), str(tmp_path), "is a directory")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    out = a_file / "plan.json"
    assert_one_line(cli(*args, "-o", str(out)), "not a directory")
    # A directory no one can create files in, root included (permission bits are not enough).
    assert_one_line(cli(*args, "-o", "/proc/plan.json"), "/proc/plan.json", "cannot write in /proc")
    # residency index onto a file; a corpus directory that is not one.
    assert_one_line(cli("index", str(EN_SAMPLE.docs), "-o", str(a_file)), "is a file")
    assert a_file.read_text() == "x"
    assert_one_line(cli("index", str(tmp_path / "nothing"), "-o", str(tmp_path / "i")), "nothing")


def test_plan_stores_the_index_absolute_and_serve_reads_it_from_anywhere(
    good: dict[str, Path], tmp_path: Path
) -> None:
    # Planned with a relative --index from the index's parent, read from another directory.
    done = subprocess_cli(
        "plan",
        "--model",
        str(good["config"]),
        *PLAN_FLAGS,
        "--index",
        "index",
        "--log",
        str(EN_SAMPLE.queries),
        "--prefixes",
        "1",
        "-o",
        str(tmp_path / "plan.json"),
        cwd=good["root"],
    )
    assert done.returncode == 0, done.stderr
    recorded = json.loads((tmp_path / "plan.json").read_text())["index_dir"]
    assert Path(recorded).is_absolute()
    assert Path(recorded) == good["index"].resolve()
    coverage = subprocess_cli(
        "eval",
        "coverage",
        "--plan",
        str(tmp_path / "plan.json"),
        "--questions",
        str(EN_SAMPLE.questions),
        "--json",
        cwd=tmp_path,
    )
    assert coverage.returncode == 0, coverage.stderr


@pytest.fixture(scope="module")
def dense_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small index with dense vectors (the default embedder), built by `residency index`."""
    root = tmp_path_factory.mktemp("fuzz-dense")
    docs = root / "docs"
    docs.mkdir()
    (docs / "ferry.md").write_text("# Ferry\n\nThe ferry leaves the north pier at seven.\n")
    (docs / "lamp.md").write_text("# Lamp\n\nThe harbor lamp is lit at dusk by the keeper.\n")
    done = cli("index", str(docs), "-o", str(root / "index"))
    assert done.returncode == 0, done.stderr
    assert (root / "index" / "dense" / "dense.faiss").exists()
    return root / "index"


@pytest.mark.parametrize(
    ("name", "how", "said"),
    [
        ("dense.faiss", "missing", "dense/dense.faiss is missing"),
        ("dense.faiss", "torn", "dense/dense.faiss is torn or foreign"),
        ("dense.meta.json", "wrong-shape", "a dense/ metadata file is torn or foreign"),
    ],
)
def test_a_damaged_dense_part_is_one_line_naming_the_file(
    dense_index: Path, tmp_path: Path, name: str, how: str, said: str
) -> None:
    index = tmp_path / "index"
    shutil.copytree(dense_index, index)
    _damage(index / "dense" / name, how)
    questions = tmp_path / "qa.jsonl"
    questions.write_text('{"query": "When does the ferry leave?", "relevant_ids": ["x"]}\n')
    done = cli("eval", "retrieval", "--index", str(index), "--questions", str(questions))
    line = assert_one_line(done, str(index), said, "residency index")
    assert "faiss::" not in line  # faiss's C++ text stays out of the answer
    assert "DenseMeta" not in line  # no internal class name
