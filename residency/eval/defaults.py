"""What the eval commands use unless told otherwise: the retrieval metrics' names and history
file, the traffic model's sizes, the coverage cache and prefetch, the prune eval's sizes.

Plain constants, no models: `residency eval ... --help` reads them without building the report
models (about 90 ms of pydantic class building on 2 shared cores).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field

from residency.context.routing import DEFAULT_K
from residency.flags import Flag
from residency.paths import cache_root

# Budget / display name -> MetricSet field (residency/eval/retrieval.py).
METRICS: dict[str, str] = {
    "R@1": "recall_at_1",
    "R@3": "recall_at_3",
    "R@5": "recall_at_5",
    "R@10": "recall_at_10",
    "MRR@10": "mrr_at_10",
    "nDCG@10": "ndcg_at_10",
}
HISTORY_FILE = "eval-history.jsonl"  # appended to under the index directory

DEFAULT_ZIPF_S = 1.1  # paragraph popularity of simulated traffic
DEFAULT_LOG_SIZE = 4000
DEFAULT_EVAL_SIZE = 2000

DEFAULT_PREFETCH = 40  # chunks each retriever fetches before fusion
# Where `eval coverage --squad` (and `eval prune`) keep the SQuAD index and its tokenizer.
COVERAGE_CACHE = cache_root() / "coverage"

DEFAULT_PRUNE_K = DEFAULT_K  # the router's long-tail k
DEFAULT_PRUNE_LIMIT = 200
CoverageCacheDir = Annotated[
    Path,
    Flag(show_default="CACHE/coverage"),
    Field(
        description="--squad: where the imported corpus and its index are kept (shared by "
        "`eval coverage` and `eval prune`).",
    ),
]
