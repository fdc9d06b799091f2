"""Regenerate docs/results.md (every measured table) from pytest-benchmark JSON, a demo run and
the real-model answer evaluation.

    python scripts/readme_results.py --bench .benchmarks/latest.json --demo demo-out \
        --answers .benchmarks/answers-en.json --answers-single .benchmarks/answers-en-single.json \
        --prune .benchmarks/prune-en.json

(--bench repeats: later files replace same-named benchmarks; each table names the machine of
the file its figures came from.)
Replaces everything between `<!-- results:begin -->` and `<!-- results:end -->` in docs/results.md;
copies the demo's picture to docs/demo-ttft.png (the README shows it too). Figures are printed as
measured, targets beside them; the README's short headline tables are picked from this page by
hand.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results.md"


def _shown_path(path: str) -> str:
    """A report's file path as the results page shows it: relative to the repository when inside it
    (the checkout's absolute path says nothing to a reader)."""
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return path


BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def _bench(data: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [b for b in data["benchmarks"] if b["name"].startswith(name)]


def _machine(data: dict[str, Any]) -> str:
    """A pytest-benchmark file's machine: CPU, cores, Python, date."""
    m = data.get("machine_info", {})
    cpu = m.get("cpu", {})
    brand = cpu.get("brand_raw") or m.get("processor") or "unknown CPU"
    cores = cpu.get("count", "?")
    python = m.get("python_version", "?")
    return f"{brand}, {cores} cores, no GPU; Python {python}; {data.get('datetime', '')[:10]}"


def _report_machine(report: dict[str, Any]) -> str:
    """A residency report's `machine` (MachineInfo) as one phrase."""
    m = report.get("machine") or {}
    if not m:
        return "machine not recorded"
    ram = f", {m['memory_gib']:.0f} GiB RAM" if m.get("memory_gib") else ""
    isa = f" ({m['vector_isa']})" if m.get("vector_isa") else ""
    return f"{m.get('cpu_model', '?')}{isa}, {m.get('cores', '?')} cores{ram}, no GPU"


def _tag(data: dict[str, Any], b: dict[str, Any]) -> str:
    """The machine a benchmark row was measured on (files can come from several runs)."""
    return str(b.get("_machine") or _machine(data))


def ttft_table(data: dict[str, Any]) -> list[str]:
    rows = _bench(data, "test_ttft_cold_vs_warm_by_length")
    if not rows:
        return []
    out = [
        "TTFT, uncached (a never-seen salted prefix) vs cached, vLLM CPU build, tiny models "
        f"(`benchmarks/test_bench_ttft.py`; medians; target warm/cold <= 0.10 at 16K+; "
        f"measured on {_tag(data, rows[0])}):",
        "",
        "| model | prompt tokens | uncached TTFT | cached TTFT | cached / uncached |",
        "|---|---|---|---|---|",
    ]
    for b in rows:
        info = b["extra_info"]
        for label, r in info["lengths"].items():
            out.append(
                f"| {info['model']} | {label} | {r['median_cold_ttft_s']:.3f} s | "
                f"{r['median_warm_ttft_s']:.3f} s | {r['warm_over_cold']:.3f} |"
            )
    return [*out, ""]


def router_table(data: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for b in _bench(data, "test_router_overhead"):
        i = b["extra_info"]
        out += [
            "Router (`benchmarks/test_bench_router.py`): the same prompt sent to vLLM directly "
            f"and through `residency serve`, {i['pairs']} interleaved pairs, resident route, "
            "BM25, non-streaming, max_tokens 1; overhead = router percentile − direct percentile "
            f"(measured on {_tag(data, b)}):",
            "",
            "| figure | measured | target |",
            "|---|---|---|",
            f"| latency direct / router p50 | {i['direct_p50_ms']:.1f} / "
            f"{i['router_p50_ms']:.1f} ms | — |",
            f"| overhead p50 | {i['overhead_p50_ms']:.2f} ms | <= 2 ms |",
            f"| overhead p95 | {i['overhead_p95_ms']:.2f} ms | <= 5 ms |",
        ]
        if "paired_p50_ms" in i:
            out += [
                f"| per-pair difference p50 / p95 | {i['paired_p50_ms']:.2f} / "
                f"{i['paired_p95_ms']:.2f} ms | — |",
                f"| noise floor, vLLM vs itself, p50 / p95 | {i['noise_p50_ms']:.2f} / "
                f"{i['noise_p95_ms']:.2f} ms | — |",
                f"| router's own work before forwarding p50 / p95 | {i['forward_p50_ms']:.2f} / "
                f"{i['forward_p95_ms']:.2f} ms | — |",
            ]
        out.append(f"| retrieval + routing p50 | {i['retrieval_p50_ms']:.2f} ms | — |")
    for b in _bench(data, "test_ttft_through_the_router"):
        i = b["extra_info"]
        out.append(
            f"| TTFT through router (cached) / uncached, {i['prefix_tokens']:,}-token prefix | "
            f"{i['router_warm_ttft_s']:.3f} s / {i['uncached_ttft_s']:.2f} s = "
            f"{i['ratio']:.3f} | <= 0.10 |"
        )
    for b in _bench(data, "test_64_concurrent"):
        i = b["extra_info"]
        out.append(
            f"| {i['clients']} streaming clients for {i['seconds']:.0f} s | {i['ok']} streams, "
            f"{i['dropped']} dropped, {i['corrupted']} corrupted, {i['5xx']} 5xx | 0 / 0 / 0 |"
        )
    return [*out, ""] if out else []


def quality_tables(data: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for b in _bench(data, "test_jsquad_quality"):
        i = b["extra_info"]
        out += [
            f"Retrieval on {i['dataset']} ({i['passages']:,} passages, {i['questions']:,} "
            f"questions; `benchmarks/test_bench_retrieval.py`; targets BM25 R@3 >= .93, "
            "fused MRR >= BM25's):",
            "",
            "| retriever | R@1 | R@3 | R@5 | R@10 | MRR@10 |",
            "|---|---|---|---|---|---|",
        ]
        for name, m in i["metrics"].items():
            out.append(
                f"| {name} | {m['R@1']:.3f} | {m['R@3']:.3f} | {m['R@5']:.3f} | "
                f"{m['R@10']:.3f} | {m['MRR@10']:.3f} |"
            )
        out.append("")
    for b in _bench(data, "test_jsquad_coverage_comparison"):
        out += [
            "Evidence coverage on JSQuAD with Zipf traffic (`benchmarks/test_bench_coverage.py`; "
            "targets: planner >= .985, >= RAG top-3 + 4 points, fewer tokens than RAG top-5):",
            "",
            "| strategy | coverage | evidence in prefix | tokens added per question |",
            "|---|---|---|---|",
        ]
        for row in b["extra_info"]["table"]:
            out.append(
                f"| {row['strategy']} | {row['coverage']:.2%} | {row['in_prefix']:.1%} | "
                f"{row['mean_added_tokens']:.0f} |"
            )
        out.append("")
    return out


def _scalar(v: Any) -> bool:
    return isinstance(v, (int, float, str, bool)) and not (isinstance(v, str) and len(v) > 40)


def other_table(data: dict[str, Any]) -> list[str]:
    skip = (
        "test_ttft_cold_vs_warm",
        "test_router_overhead",
        "test_ttft_through",
        "test_64_",
        "test_jsquad_quality",
        "test_jsquad_coverage_comparison",
    )
    out = [
        "Every other benchmark (median wall time; scalar figures from `extra_info`; the machine "
        "column says where each was measured):",
        "",
        "| benchmark | median | figures | machine |",
        "|---|---|---|---|",
    ]
    for b in data["benchmarks"]:
        if b["name"].startswith(skip):
            continue
        figures = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in b["extra_info"].items()
            if _scalar(v)
        )
        where = _tag(data, b).split(";")[0]
        out.append(f"| `{b['name']}` | {b['stats']['median']:.4g} s | {figures[:400]} | {where} |")
    return [*out, ""]


def demo_section(demo_dir: Path) -> list[str]:
    report_path = demo_dir / "demo.json"
    if not report_path.is_file():
        return []
    demo = json.loads(report_path.read_text("utf-8"))
    model = demo.get("served_model") or "tiny"
    out = [
        f"`residency demo` (the run that drew the picture below; {model}, sample "
        f"{demo.get('sample', 'harbor-lights')}; measured on {_report_machine(demo)}):",
        "",
    ]
    questions = demo.get("questions") or []
    if questions:
        out += [
            "| question | route | retrieved | answer (real, greedy, 64 tokens) | prompt tokens "
            "| cached tokens | TTFT |",
            "|---|---|---|---|---|---|---|",
        ]
        for q in questions:
            retrieved = ", ".join(q.get("retrieved_ids") or q.get("retrieved") or []) or "—"
            answer = " ".join((q.get("answer") or "—").split()).replace("|", "/")
            out.append(
                f"| {q.get('question') or q.get('query')} | {q.get('route')} | {retrieved} | "
                f"{answer} | {q.get('prompt_tokens')} | {q.get('cached_tokens')} | "
                f"{(q.get('ttft_s') or 0):.3f} s |"
            )
        out.append("")
    png = demo_dir / "ttft.png"
    if png.is_file():
        shutil.copyfile(png, REPO / "docs" / "demo-ttft.png")
        out += ["![TTFT vs prompt length, cached and uncached](demo-ttft.png)", ""]
    total = demo.get("total_s") or demo.get("elapsed_s")
    if total:
        steps = ", ".join(
            f"{step['name']} {step.get('seconds', 0):.1f} s" for step in demo.get("steps", [])
        )
        budget = demo.get("time_budget_s")
        within = f" of a {budget:.0f} s --time-budget" if budget else ""
        out += [f"The demo took {total:.0f} s end to end{within} ({steps}).", ""]
        prefill = demo.get("prefill")
        if prefill:
            probes = ", ".join(f"{n:,} tokens {t:.2f} s" for n, t in prefill["probes"])
            scaled = "; ".join(demo.get("scaled_down") or ["nothing"])
            out += [
                f"Its prefill probe: {probes} cold ({prefill['tokens_per_s_at_2k']:,.0f} "
                f"tokens/s at 2K); scaled down: {scaled}.",
                "",
            ]
    return out


def _f(value: float | None, fmt: str = ".2f") -> str:
    return "—" if value is None else format(value, fmt)


def _answer_rows(path: Path, single: Path | None) -> tuple[dict[str, Any], list[Any]]:
    """The report and its strategies (skipped ones included), baselines first, with the
    single-prefix router's `residency` (a second `eval answers --json` report) added last as
    `single-prefix`."""
    report = json.loads(path.read_text("utf-8"))
    rows = list(report["strategies"])
    if single is not None and single.is_file():
        rows += [
            r | {"strategy": "single-prefix"}
            for r in json.loads(single.read_text("utf-8"))["strategies"]
            if r["strategy"] == "residency"
        ]
    order = ["echo", "rag", "whole", "residency"]  # baselines first; single-prefix stays last
    rows.sort(key=lambda r: order.index(r["kind"]) if r["kind"] in order else len(order))
    return report, rows


def _per_type_table(ran: list[Any], key: str, by_type: str) -> list[str]:
    """Score /2 per question type and strategy, from each row's `key` (all questions) and
    `by_type` (per type) scores, with the scorer's F1 in brackets."""
    out = [
        "| type | n | " + " | ".join(r["strategy"] for r in ran) + " |",
        "|---|---|" + "---|" * len(ran),
    ]
    types = list(dict.fromkeys(t for r in ran for t in r[by_type]))
    for t in [*types, "overall"]:
        cells = []
        n = 0
        for r in ran:
            g = r[key] if t == "overall" else r[by_type].get(t)
            if g is None:
                cells.append("—")
                continue
            n = max(n, g["questions"])
            f1 = f" ({g['mean_f1']:.2f})" if g.get("mean_f1") is not None else ""
            cells.append(f"{_f(g['mean_score'])}{f1}")
        label = "**overall**" if t == "overall" else t
        out.append(f"| {label} | {n} | " + " | ".join(cells) + " |")
    return out


def answers_section(path: Path | None, single: Path | None = None) -> list[str]:
    """The answer-quality tables of an `eval answers --json` report (key facts, token F1, judge),
    with a single-prefix router's report as one more column when given."""
    if path is None or not path.is_file():
        return []
    report, rows = _answer_rows(path, single)
    s = report["settings"]
    ran = [r for r in rows if not r.get("skipped")]
    skipped = [r for r in rows if r.get("skipped")]
    out = [
        f"Answer quality with a real generator (`residency eval answers`, "
        f"{report['evaluated']} questions of `{_shown_path(s['questions'])}`, generator "
        f"{s['generator_model']}, greedy, max_tokens {s['max_tokens']}; judge "
        f"{s['judge_model'] or 'none'}; measured on {_report_machine(report)}; `residency` "
        "through the planner's several-prefix router, `single-prefix` through a `--prefixes 1` "
        "plan's router). Key facts: score /2 from the reference's tokens that are not in the "
        "question (their F1 in brackets; `echo`, the question as its answer, scores 0; "
        "`unknown`: abstention rate as score/2):",
        "",
        *_per_type_table(ran, "facts_overall", "facts_by_type"),
        "",
        "Token F1 (SQuAD's, restating the question earns credit): score /2 (F1 in brackets):",
        "",
        *_per_type_table(ran, "overall", "by_type"),
        "",
        "| strategy | evidence visible | F1 score with / without evidence | LLM judge /2 | "
        "prompt tokens | cached tokens | TTFT | routes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in ran:
        share = r.get("evidence_visible_share")
        judge = (r.get("judge_overall") or {}).get("mean_score")
        routes = ", ".join(f"{k} {v}" for k, v in sorted(r["route_counts"].items()))
        out.append(
            f"| {r['strategy']} | {_f(share * 100 if share is not None else None, '.0f')}% | "
            f"{_f(r.get('score_evidence_visible'))} / {_f(r.get('score_evidence_missing'))} | "
            f"{_f(judge)} | "
            f"{_f(r['mean_prompt_tokens'], ',.0f')} | {_f(r['mean_cached_tokens'], ',.0f')} | "
            f"{_f(r['mean_ttft_s'], '.3f')} s | {routes} |"
        )
    for r in skipped:
        out += ["", f"`{r['strategy']}` did not run: {r['skipped']}."]
    return [*out, ""]


def prune_section(path: Path | None) -> list[str]:
    """The pruner's rows of an `eval prune --json` report."""
    if path is None or not path.is_file():
        return []
    report = json.loads(path.read_text("utf-8"))
    s = report["settings"]
    lat = report["latency"]
    out = [
        f"The listwise pruner with {s['model']} as grader (`residency eval prune`, "
        f"{report['questions']} questions of `{_shown_path(s['source'])}`, top-{s['k']} "
        f"chunks, threshold {s['threshold']}, keep-top-k {s['keep_top_k']}; measured on "
        f"{_report_machine(report)}; added latency p50 {lat['median_s']:.2f} s, p95 "
        f"{lat['p95_s']:.2f} s; {report['invalid_outputs']} invalid replies, "
        f"{report['upstream_errors']} upstream errors):",
        "",
        "| kept set | chunks removed | characters removed | gold kept |",
        "|---|---|---|---|",
    ]
    for row in report["rows"]:
        out.append(
            f"| {row['name']} | {row['removed_share']:.1%} | {row['removed_chars_share']:.1%} | "
            f"{row['gold_kept']} of {row['gold_retrieved']} |"
        )
    return [*out, ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--bench",
        type=Path,
        action="append",
        help="pytest-benchmark JSON (repeatable; later files replace same-named benchmarks)",
    )
    parser.add_argument("--demo", type=Path, default=REPO / "demo-out")
    parser.add_argument("--answers", type=Path, help="`eval answers --json` report")
    parser.add_argument(
        "--answers-single", type=Path, help="the single-prefix router's `eval answers --json`"
    )
    parser.add_argument("--prune", type=Path, help="`eval prune --json` report")
    args = parser.parse_args(argv)
    args.bench = args.bench or [REPO / ".benchmarks/latest.json"]
    data = json.loads(args.bench[0].read_text("utf-8"))
    for b in data["benchmarks"]:
        b["_machine"] = _machine(data)
    for extra in args.bench[1:]:  # later runs replace same-named benchmarks
        file = json.loads(extra.read_text("utf-8"))
        more = file["benchmarks"]
        for b in more:
            b["_machine"] = _machine(file)
        names = {b["fullname"] for b in more}
        data["benchmarks"] = [b for b in data["benchmarks"] if b["fullname"] not in names] + more
    lines = [
        BEGIN,
        "Every figure names the machine it was measured on. Regenerate with `make results` "
        "(and `make answers` for the real-model answer evaluation).",
        "",
        *demo_section(args.demo),
        *answers_section(args.answers, args.answers_single),
        *prune_section(args.prune),
        *ttft_table(data),
        *router_table(data),
        *quality_tables(data),
        *other_table(data),
        END,
    ]
    text = RESULTS.read_text("utf-8")
    if BEGIN not in text or END not in text:
        print(f"{RESULTS}: no {BEGIN} ... {END} markers", file=sys.stderr)
        return 1
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    RESULTS.write_text(head + "\n".join(lines) + tail, "utf-8")
    print(f"{RESULTS.relative_to(REPO)} regenerated from {', '.join(map(str, args.bench))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
