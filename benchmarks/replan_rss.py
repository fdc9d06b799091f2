"""One re-plan decision in a fresh process: ``python benchmarks/replan_rss.py LOG INDEX PLAN
WINDOW MODE`` prints one JSON line: seconds (read_s of them reading the window, the rest making
and judging the new plan), the RSS before it (index open, plan read) and the peak RSS during
it. MODE ``tail`` is the router's reader (`read_window`: the log's end only); ``whole`` is the
reader before issue 42 (every line parsed, the last WINDOW kept), for the side-by-side ratio."""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

import orjson

from residency.context.retriever import chunk_retriever
from residency.index import open_index
from residency.planning.plan_model import read_plan
from residency.query_log import LogRead, read_query_log
from residency.serve.replan import encoder_of, read_window, replan


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def main(log: Path, index_dir: Path, plan_path: Path, window: int, mode: str) -> None:
    index = open_index(index_dir)
    plan = read_plan(plan_path)
    chunk_retriever(index, "bm25").search("warm up", 1)  # loaded before the baseline, as served
    before = rss_mb()
    started = time.perf_counter()
    if mode == "tail":
        read = read_window(log, window, source_share=0.1)
    else:
        whole = read_query_log(log)
        read = LogRead(entries=whole.entries[-window:], skipped=())
    read_s = time.perf_counter() - started
    judged = replan(plan, index, "bm25", encoder_of(plan, None), read, log)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {
        "seconds": seconds,
        "read_s": read_s,
        "rss_before_mb": before,
        "peak_rss_mb": peak,
        "questions": judged.questions,
        "gain": judged.gain,
    }
    print(orjson.dumps(out).decode())


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
