"""The listwise pruner: kept sets, the reply schema, every keep-everything path, and the JSON path
against a real vLLM CPU server with structured output (xgrammar, no free whitespace).

Hand-made replies travel through a real httpx client on `httpx.MockTransport` (our code end to
end, from the request body to the logged warning); the model's own replies come from a vLLM
server started once for this module with `PRUNER_SERVER_ARGS`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import typer
from typer.testing import CliRunner
from vllm_server import VllmServer, free_port

from residency.cli.eval_prune import prune as prune_command
from residency.context.pruner import (
    Passage,
    PruneResult,
    build_request,
    grade_schema,
    keep_ids,
    prune,
    prune_sync,
)
from residency.context.pruner_settings import PrunerSettings
from residency.errors import ConfigError, UpstreamError
from residency.eval.prune import (
    MEANINGLESS_GRADES_NOTE,
    PrunedQuestion,
    PruneEvalJob,
    kept_figures,
    run_prune_eval,
    sample_questions,
    served_model,
)
from residency.eval.prune_report import PruneEvalReport
from residency.eval.questions import Question
from residency.vllm_client import open_session

PASSAGES = (
    Passage(
        "梅雨-p1::c1",
        "梅雨は、北海道と小笠原諸島を除く日本、朝鮮半島南部、中国の南部から長江流域にかけての"
        "沿海部、および台湾など、東アジアの広範囲においてみられる特有の気象現象で、"
        "5月から7月にかけて来る曇りや雨の多い期間のこと。",
    ),
    Passage(
        "梅雨-p2::c1", "梅雨の時期が始まることを梅雨入りや入梅といい、各地の気象台が発表する。"
    ),
    Passage(
        "台風-p1::c1",
        "台風は北西太平洋に存在する熱帯低気圧のうち、最大風速が約17 m/s以上のものを指す。",
    ),
    Passage(
        "富士山-p1::c1",
        "富士山は静岡県と山梨県に跨る活火山である。標高3776.12 mで、日本最高峰の独立峰である。",
    ),
)
QUESTION = "日本で梅雨がないのは北海道とどこか。"
SETTINGS = PrunerSettings(url="http://pruner.test", model="tiny")


# --- keep_ids -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("grades", "order", "threshold", "keep_top_k", "expected"),
    [
        pytest.param({"a": 5, "b": 2, "c": 3}, "abc", 3, 0, "ac", id="threshold only"),
        pytest.param({"a": 1, "b": 1, "c": 5}, "abc", 3, 2, "abc", id="floor keeps low top-2"),
        pytest.param({"a": 1, "b": 1, "c": 1}, "abc", 3, 1, "a", id="floor alone"),
        pytest.param({"a": 3, "b": 3, "c": 2}, "abc", 3, 0, "ab", id="ties at threshold kept"),
        pytest.param({"a": 4, "b": 4, "c": 4}, "abc", 5, 0, "", id="nothing reaches 5"),
        pytest.param({"a": 1, "b": 2}, "ab", 1, 0, "ab", id="threshold 1 keeps all graded"),
        pytest.param({"a": 1, "b": 1}, "ab", 5, 10, "ab", id="floor larger than n"),
        pytest.param({"c": 5}, "cab", 4, 1, "c", id="floor and grade on the same id"),
        pytest.param({"b": 5}, "cab", 4, 1, "cb", id="input order, not grade order"),
        pytest.param({"a": 5}, "ab", 1, 0, "a", id="ungraded id is below any threshold"),
        pytest.param({}, "", 3, 2, "", id="empty"),
    ],
)
def test_keep_ids(
    grades: Mapping[str, int], order: str, threshold: int, keep_top_k: int, expected: str
) -> None:
    assert keep_ids(grades, list(order), threshold, keep_top_k) == tuple(expected)


# --- settings, schema, request ----------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["http://h:8001", "http://h:8001/", "http://h:8001/v1", "http://h:8001/v1/"],
    ids=["bare", "slash", "v1", "v1-slash"],
)
def test_chat_url(url: str) -> None:
    assert PrunerSettings(url=url, model="m").chat_url == "http://h:8001/v1/chat/completions"


@pytest.mark.parametrize(
    "bad",
    [
        {"threshold": 0},
        {"threshold": 6},
        {"keep_top_k": -1},
        {"timeout_s": 0},
        {"max_tokens": 8},
        {"url": "h:8001"},
        {"temperature": 0.5},
    ],
    ids=lambda d: next(iter(d)),
)
def test_settings_reject(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        PrunerSettings.model_validate({"url": "http://h", "model": "m", **bad})


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--prune-threshold", "6"),
        ("--prune-keep-top-k", "-1"),
        ("--chunks", "0"),
        ("--max-questions", "0"),
    ],
    ids=["threshold", "keep-top-k", "chunks", "max-questions"],
)
def test_eval_prune_refuses_a_flag_out_of_its_fields_bounds(flag: str, value: str) -> None:
    # Bound to PrunerSettings / PruneEvalSettings: refused in one line naming the flag and the
    # value, before any call to the (here absent) pruner.
    app = typer.Typer()
    app.command()(prune_command)
    out = CliRunner().invoke(app, ["--pruner-url", "http://127.0.0.1:9", flag, value])
    assert isinstance(out.exception, ConfigError), out.output
    message = str(out.exception)
    assert message.startswith(f"{flag}: "), message
    assert f"got {value}" in message, message


def test_api_key_sent_and_not_shown() -> None:
    settings = PrunerSettings(url="http://h", model="m", api_key="sk-secret")
    sent: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers.get("authorization"))
        return httpx.Response(500, content=b"")

    client = httpx.Client(transport=httpx.MockTransport(handler))
    for given in (settings, PrunerSettings(url="http://h", model="m")):
        prune_sync(given, "q", [Passage("a", "text")], client=client)
    assert sent == ["Bearer sk-secret", None]
    assert "sk-secret" not in repr(settings)


def _reply(n: int, grades: Sequence[int] | None = None) -> dict[str, Any]:
    grades = grades if grades is not None else [3] * n
    return {"grades": [{"passage": i, "grade": g} for i, g in enumerate(grades, start=1)]}


def test_schema_pins_every_passage_once() -> None:
    schema = grade_schema(3)
    array = schema["properties"]["grades"]
    assert (array["minItems"], array["maxItems"], array["items"]) == (3, 3, False)
    assert [item["properties"]["passage"]["enum"] for item in array["prefixItems"]] == [
        [1],
        [2],
        [3],
    ]
    assert all(
        item["properties"]["grade"]["enum"] == [1, 2, 3, 4, 5] for item in array["prefixItems"]
    )
    assert schema["additionalProperties"] is False
    assert all(item["additionalProperties"] is False for item in array["prefixItems"])


def test_schema_oracle_jsonschema() -> None:
    """The schema accepts exactly the replies our validation accepts (jsonschema as the oracle)."""
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(grade_schema(3))
    assert validator.is_valid(_reply(3, [5, 1, 3]))
    for bad in (
        _reply(2),
        _reply(4),
        {
            "grades": [
                {"passage": 2, "grade": 3},
                {"passage": 1, "grade": 3},
                {"passage": 3, "grade": 3},
            ]
        },
        _reply(3, [5, 6, 1]),
        {**_reply(3), "why": "x"},
        {"grades": [{"passage": 1, "grade": 3, "note": "x"}, *_reply(3)["grades"][1:]]},
    ):
        assert not validator.is_valid(bad)


def test_request_body() -> None:
    body = build_request(SETTINGS, QUESTION, PASSAGES)
    assert body["temperature"] == 0
    assert body["max_tokens"] == 16 + 48 * len(PASSAGES)
    assert (
        build_request(SETTINGS.model_copy(update={"max_tokens": 64}), QUESTION, PASSAGES)[
            "max_tokens"
        ]
        == 64
    )
    rf = body["response_format"]
    assert rf["type"] == "json_schema"
    assert rf["json_schema"]["strict"] is True
    assert rf["json_schema"]["schema"] == grade_schema(len(PASSAGES))
    system, user = (m["content"] for m in body["messages"])
    assert "5 必須 essential" in system
    assert "1 無関係 unrelated" in system
    assert QUESTION in user
    assert [f"[{i}]" in user for i in range(1, 6)] == [True, True, True, True, False]
    assert not any(p.id in user for p in PASSAGES)  # numbers, not chunk ids


# --- hand-made replies through a real client --------------------------------------------------


def _completion(content: str, finish_reason: str = "stop") -> bytes:
    message = {"role": "assistant", "content": content}
    return orjson.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "model": "tiny",
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        }
    )


def _client(status: int, body: bytes, seen: list[dict[str, Any]] | None = None) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(orjson.loads(request.content))
        return httpx.Response(status, content=body)

    return httpx.Client(transport=httpx.MockTransport(handler))


def test_valid_reply_keeps_by_grade_and_floor() -> None:
    settings = SETTINGS.model_copy(update={"threshold": 4, "keep_top_k": 1})
    seen: list[dict[str, Any]] = []
    body = _completion(orjson.dumps(_reply(4, [1, 2, 5, 4])).decode())
    result = prune_sync(settings, QUESTION, PASSAGES, client=_client(200, body, seen))
    ids = [p.id for p in PASSAGES]
    assert result.valid
    assert result.error is None
    assert result.failure is None
    assert result.grades == dict(zip(ids, [1, 2, 5, 4], strict=True))
    assert result.kept_ids == (ids[0], ids[2], ids[3])
    assert seen[0]["model"] == "tiny"


def test_reply_in_another_order_is_accepted() -> None:
    """An endpoint that ignores prefixItems may reorder; each passage graded once is enough."""
    items = [{"passage": 2, "grade": 5}, {"passage": 1, "grade": 1}]
    body = _completion(orjson.dumps({"grades": items}).decode())
    result = prune_sync(
        SETTINGS.model_copy(update={"keep_top_k": 0}),
        QUESTION,
        PASSAGES[:2],
        client=_client(200, body),
    )
    assert result.valid
    assert result.kept_ids == (PASSAGES[1].id,)


BAD_REPLIES = [
    pytest.param(orjson.dumps(_reply(3)).decode(), "ungraded", id="missing passage"),
    pytest.param(
        orjson.dumps({"grades": [*_reply(4)["grades"][:3], {"passage": 3, "grade": 2}]}).decode(),
        "twice",
        id="duplicate passage",
    ),
    pytest.param(
        orjson.dumps(_reply(4, [3, 3, 6, 3])).decode(), "less than or equal to 5", id="grade 6"
    ),
    pytest.param(
        orjson.dumps(_reply(4, [3, 0, 3, 3])).decode(), "greater than or equal to 1", id="grade 0"
    ),
    pytest.param(
        orjson.dumps(_reply(5)).decode(), "passage 5, only 1..4", id="passage out of range"
    ),
    pytest.param(
        '{"grades": [{"passage": 1, "grade": "5"}]}', "valid integer", id="grade as string"
    ),
    pytest.param(orjson.dumps({**_reply(4), "why": "x"}).decode(), "Extra inputs", id="extra key"),
    pytest.param("全部大事です" + "!" * 1000, "not JSON", id="not JSON"),
    pytest.param("", "not JSON", id="empty"),
]


@pytest.mark.parametrize(("content", "reason"), BAD_REPLIES)
def test_invalid_reply_keeps_everything(
    content: str, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="residency.pruner"):
        result = prune_sync(SETTINGS, QUESTION, PASSAGES, client=_client(200, _completion(content)))
    assert_kept_all(result, "invalid_output", reason)
    assert reason in caplog.text
    assert len(caplog.text) < 1000  # raw output is clipped in the log


def test_reply_cut_at_max_tokens_keeps_everything() -> None:
    content = '{"grades":[{"passage":1,"grade":3},' + "\r" * 500
    result = prune_sync(
        SETTINGS, QUESTION, PASSAGES, client=_client(200, _completion(content, "length"))
    )
    assert_kept_all(result, "invalid_output", "cut at max_tokens")
    assert "disable_any_whitespace" in (result.error or "")


@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        pytest.param(500, b'{"error": {"message": "boom"}}', "HTTP 500", id="500"),
        pytest.param(400, b'{"error": {"message": "bad schema"}}', "bad schema", id="400"),
    ],
)
def test_http_error_keeps_everything(status: int, body: bytes, reason: str) -> None:
    result = prune_sync(SETTINGS, QUESTION, PASSAGES, client=_client(status, body))
    assert_kept_all(result, "upstream", reason)


def test_not_a_completion_keeps_everything() -> None:
    result = prune_sync(SETTINGS, QUESTION, PASSAGES, client=_client(200, b'{"choices": []}'))
    assert_kept_all(result, "invalid_output", "not an OpenAI chat completion")


def test_timeout_keeps_everything() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    client = httpx.Client(transport=httpx.MockTransport(handler))
    assert_kept_all(
        prune_sync(SETTINGS, QUESTION, PASSAGES, client=client), "upstream", "ReadTimeout"
    )


def test_unreachable_url_keeps_everything() -> None:
    settings = PrunerSettings(url=f"http://127.0.0.1:{free_port()}", model="tiny", timeout_s=5)
    assert_kept_all(prune_sync(settings, QUESTION, PASSAGES), "upstream", "cannot reach")
    assert_kept_all(_prune_async(settings, PASSAGES), "upstream", "cannot reach")


def test_no_passages_no_call() -> None:
    result = prune_sync(SETTINGS, QUESTION, [], client=_client(500, b""))
    assert (result.kept_ids, result.valid, result.grades) == ((), True, {})


def test_duplicate_ids_are_a_caller_bug() -> None:
    with pytest.raises(ValueError, match="unique"):
        prune_sync(SETTINGS, QUESTION, [PASSAGES[0], PASSAGES[0]], client=_client(200, b""))


def assert_kept_all(result: PruneResult, failure: str, reason: str) -> None:
    """The keep-everything contract of every failure."""
    assert result.kept_ids == tuple(p.id for p in PASSAGES)
    assert (result.valid, result.grades, result.failure) == (False, {}, failure)
    assert result.error is not None
    assert reason in result.error
    assert len(result.error) < 600


def _prune_async(settings: PrunerSettings, passages: Sequence[Passage]) -> PruneResult:
    async def run() -> PruneResult:
        async with open_session(30.0) as client:
            return await prune(client, settings, QUESTION, passages)

    return asyncio.run(run())


# --- evaluation figures -----------------------------------------------------------------------


def test_sample_questions_stride() -> None:
    qs = [Question(query=f"q{i}", relevant_ids=(f"s{i}",) if i % 5 else ()) for i in range(20)]
    picked = sample_questions(qs, 4)
    assert [q.query for q in picked] == ["q1", "q6", "q11", "q16"]  # 16 answerable, stride 4
    assert len(sample_questions(qs, 100)) == 16


def test_kept_figures() -> None:
    chars = {"a": 100, "b": 50, "c": 50}
    asked = [
        PrunedQuestion(("a", "b", "c"), chars, frozenset({"c"}), PruneResult(("a", "c"))),
        PrunedQuestion(("a", "b", "c"), chars, frozenset({"b"}), PruneResult(("a",))),
        PrunedQuestion(("a", "b", "c"), chars, frozenset(), PruneResult(("a", "b", "c"))),
    ]
    row = kept_figures("pruner", asked, lambda a: a.result.kept_ids)
    assert (row.chunks_retrieved, row.chunks_kept) == (9, 6)
    assert row.removed_share == pytest.approx(1 / 3)
    assert row.removed_chars_share == pytest.approx(150 / 600)
    assert (row.gold_retrieved, row.gold_kept, row.gold_kept_share) == (2, 1, 0.5)


# --- real vLLM --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pruner_server(vllm_dense_server: VllmServer) -> VllmServer:
    """The session dense server: it runs with the pruner's structured-output flag."""
    return vllm_dense_server


@pytest.fixture
def live(pruner_server: VllmServer) -> PrunerSettings:
    return PrunerSettings(url=pruner_server.base_url, model="tiny", timeout_s=60)


@pytest.mark.vllm
@pytest.mark.parametrize("n", [1, 4, 12])
def test_live_structured_output_grades_every_passage(live: PrunerSettings, n: int) -> None:
    passages = [Passage(f"c{i}", PASSAGES[i % 4].text) for i in range(n)]
    result = _prune_async(live, passages)
    assert result.valid, result.error
    assert (result.error, result.failure) == (None, None)
    assert list(result.grades) == [p.id for p in passages]
    assert set(result.grades.values()) <= {1, 2, 3, 4, 5}
    assert result.kept_ids == keep_ids(result.grades, [p.id for p in passages], 3, 2)
    assert result.elapsed_s > 0


@pytest.mark.vllm
def test_live_sync_many_questions_all_valid(live: PrunerSettings) -> None:
    questions = [
        "梅雨入りは誰が発表する？",
        "台風の最大風速は？",
        "富士山の標高は何メートル？",
        "What is 梅雨?",
    ]
    with httpx.Client() as client:
        results = [prune_sync(live, q, PASSAGES, client=client) for q in questions]
    assert [r.error for r in results] == [None] * len(questions)
    assert all(len(r.grades) == len(PASSAGES) for r in results)


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("update", "reason"),
    [
        pytest.param({"model": "no-such-model"}, "HTTP 404", id="unknown model"),
    ],
)
def test_live_failures_keep_everything(
    live: PrunerSettings, update: dict[str, Any], reason: str
) -> None:
    assert_kept_all(_prune_async(live.model_copy(update=update), PASSAGES), "upstream", reason)


def test_a_pruner_that_never_answers_times_out_and_keeps_everything() -> None:
    # A listening socket nobody accepts from: the connection opens, no byte ever comes back,
    # so the read must time out (a real server under load could still beat a tiny timeout).
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        settings = PrunerSettings(url=url, model="tiny", timeout_s=0.3)
        assert_kept_all(_prune_async(settings, PASSAGES), "upstream", "Timeout")


@pytest.mark.vllm
def test_served_model(pruner_server: VllmServer) -> None:
    assert served_model(pruner_server.base_url, None) == ("tiny", True)
    with pytest.raises(ConfigError, match="serves tiny"):
        served_model(pruner_server.base_url, "gpt-4o")
    with pytest.raises(UpstreamError, match="--pruner-url"):
        served_model(f"http://127.0.0.1:{free_port()}", None)


SQUAD = {
    "data": [
        {
            "title": title,
            "paragraphs": [
                {
                    "context": f"{title} [SEP] {text}",
                    "qas": [
                        {"id": f"{title}-{i}", "question": q, "answers": [{"text": a}]}
                        for i, (q, a) in enumerate(qas)
                    ],
                }
                for text, qas in paragraphs
            ],
        }
        for title, paragraphs in [
            (
                "梅雨",
                [
                    (PASSAGES[0].text, [("梅雨がないのは北海道とどこか。", "小笠原諸島")]),
                    (PASSAGES[1].text, [("梅雨入りは誰が発表する？", "気象台")]),
                ],
            ),
            ("台風", [(PASSAGES[2].text, [("台風の最大風速は約何m/s以上か。", "17 m/s")])]),
            ("富士山", [(PASSAGES[3].text, [("富士山の標高は？", "3776.12 m")])]),
        ]
    ]
}


@pytest.mark.vllm
def test_live_eval_report_and_cli(pruner_server: VllmServer, tmp_path: Path) -> None:
    squad = tmp_path / "squad.json"
    squad.write_bytes(orjson.dumps(SQUAD))
    pruner = PrunerSettings(url=pruner_server.base_url)
    job = PruneEvalJob(squad, pruner, k=3, limit=10, cache_dir=tmp_path / "cache")
    report = run_prune_eval(job, _Quiet())
    assert report.questions == 4
    assert [r.name for r in report.rows] == ["pruner", "floor only", "grades only"]
    assert (report.invalid_outputs, report.upstream_errors, report.first_error) == (0, 0, None)
    pruner, floor, _ = report.rows
    assert floor.chunks_kept == 4 * 2
    assert floor.chunks_retrieved == 4 * 3
    assert pruner.chunks_kept >= floor.chunks_kept  # the floor is inside the pruner's kept set
    assert pruner.gold_retrieved == 4
    assert pruner.gold_kept >= floor.gold_kept
    assert MEANINGLESS_GRADES_NOTE in report.notes

    app = typer.Typer()
    app.command()(prune_command)
    args = ["--squad", str(squad), "--pruner-url", pruner_server.base_url, "--chunks", "3"]
    out = CliRunner().invoke(app, [*args, "--cache-dir", str(tmp_path / "cache"), "--json"])
    assert out.exit_code == 0, out.output
    assert PruneEvalReport.model_validate_json(out.stdout).questions == 4


class _Quiet:
    def start(self, description: str, total: int) -> None:
        """Nothing to show."""

    def advance(self, steps: int) -> None:
        """Nothing to show."""
