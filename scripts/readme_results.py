"""Regenerate the README's "Results" section from a pytest-benchmark JSON and a demo run.

    python scripts/readme_results.py --bench .benchmarks/latest.json --demo demo-out

(--bench repeats: later files replace same-named benchmarks.)
Replaces everything between `<!-- results:begin -->` and `<!-- results:end -->`; copies the
demo's picture to docs/demo-ttft.png. Figures are printed as measured, targets beside them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def _bench(data: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [b for b in data["benchmarks"] if b["name"].startswith(name)]


def _machine(data: dict[str, Any]) -> str:
    m = data.get("machine_info", {})
    cpu = m.get("cpu", {})
    brand = cpu.get("brand_raw") or m.get("processor") or "unknown CPU"
    cores = cpu.get("count", "?")
    python = m.get("python_version", "?")
    return f"{brand}, {cores} cores, no GPU; Python {python}; {data.get('datetime', '')[:10]}"


def ttft_table(data: dict[str, Any]) -> list[str]:
    rows = _bench(data, "test_ttft_cold_vs_warm_by_length")
    if not rows:
        return []
    out = [
        "TTFT, uncached (a never-seen salted prefix) vs cached, vLLM CPU build, tiny models "
        "(`benchmarks/test_bench_ttft.py`; medians; target warm/cold <= 0.10 at 16K+):",
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
            "BM25, non-streaming, max_tokens 1; overhead = router percentile − direct percentile:",
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
        "Every other benchmark of the run (median wall time; scalar figures from `extra_info`):",
        "",
        "| benchmark | median | figures |",
        "|---|---|---|",
    ]
    for b in data["benchmarks"]:
        if b["name"].startswith(skip):
            continue
        figures = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in b["extra_info"].items()
            if _scalar(v)
        )
        out.append(f"| `{b['name']}` | {b['stats']['median']:.4g} s | {figures[:400]} |")
    return [*out, ""]


def demo_section(demo_dir: Path) -> list[str]:
    report_path = demo_dir / "demo.json"
    if not report_path.is_file():
        return []
    demo = json.loads(report_path.read_text("utf-8"))
    out = ["`residency demo` (the run that drew the picture below):", ""]
    questions = demo.get("questions") or []
    if questions:
        out += [
            "| question | route | retrieved | prompt tokens | cached tokens | TTFT |",
            "|---|---|---|---|---|---|",
        ]
        for q in questions:
            retrieved = ", ".join(q.get("retrieved_ids") or q.get("retrieved") or []) or "—"
            out.append(
                f"| {q.get('question') or q.get('query')} | {q.get('route')} | {retrieved} | "
                f"{q.get('prompt_tokens')} | {q.get('cached_tokens')} | "
                f"{(q.get('ttft_s') or 0):.3f} s |"
            )
        out.append("")
    png = demo_dir / "ttft.png"
    if png.is_file():
        shutil.copyfile(png, REPO / "docs" / "demo-ttft.png")
        out += ["![TTFT vs prompt length, cached and uncached](docs/demo-ttft.png)", ""]
    total = demo.get("total_s") or demo.get("elapsed_s")
    if total:
        steps = ", ".join(
            f"{step['name']} {step.get('seconds', 0):.1f} s" for step in demo.get("steps", [])
        )
        out += [f"The demo took {total:.0f} s end to end ({steps}).", ""]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--bench",
        type=Path,
        action="append",
        help="pytest-benchmark JSON (repeatable; later files replace same-named benchmarks)",
    )
    parser.add_argument("--demo", type=Path, default=REPO / "demo-out")
    args = parser.parse_args(argv)
    args.bench = args.bench or [REPO / ".benchmarks/latest.json"]
    data = json.loads(args.bench[0].read_text("utf-8"))
    for extra in args.bench[1:]:  # later runs replace same-named benchmarks
        more = json.loads(extra.read_text("utf-8"))["benchmarks"]
        names = {b["fullname"] for b in more}
        data["benchmarks"] = [b for b in data["benchmarks"] if b["fullname"] not in names] + more
    lines = [
        BEGIN,
        f"Machine: {_machine(data)}. Regenerate with `make results`.",
        "",
        *demo_section(args.demo),
        *ttft_table(data),
        *router_table(data),
        *quality_tables(data),
        *other_table(data),
        END,
    ]
    text = README.read_text("utf-8")
    if BEGIN not in text or END not in text:
        print(f"{README}: no {BEGIN} ... {END} markers", file=sys.stderr)
        return 1
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    README.write_text(head + "\n".join(lines) + tail, "utf-8")
    print(f"README results regenerated from {', '.join(map(str, args.bench))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
