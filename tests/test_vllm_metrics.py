"""The `/metrics` reader (residency/vllm_client/metrics.py): samples as vLLM's exposition writes
them, read with prometheus_client's parser; the live servers' /metrics are read in the vLLM tests
(test_harness, test_warm_vllm, test_serve_vllm)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from residency.vllm_client.metrics import find_samples, parse_prometheus, sum_samples

# Lines in the shape vLLM 0.x serves (two engines, an info gauge, a counter, a histogram).
VLLM_TEXT = r"""# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",engine="0",num_gpu_blocks="4096",dir="a \"q\" b\\x"} 1.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 1024.0
vllm:prefix_cache_hits_total{engine="1",model_name="tiny"} 256.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="tiny"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 5.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny"} 5.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny"} 0.75
"""


@pytest.mark.parametrize(
    ("name", "total"),
    [
        ("vllm:prefix_cache_hits_total", 1280.0),  # summed over both engines
        ("vllm:time_to_first_token_seconds_count", 5.0),
        ("vllm:time_to_first_token_seconds_sum", 0.75),
        ("vllm:time_to_first_token_seconds_bucket", 8.0),
        ("vllm:num_requests_running", None),  # absent
    ],
    ids=["counter", "histogram-count", "histogram-sum", "buckets", "absent"],
)
def test_sums_a_metric_over_its_label_sets(name: str, total: float | None) -> None:
    assert sum_samples(parse_prometheus(VLLM_TEXT), name) == total


def test_reads_the_cache_config_labels_unescaped() -> None:
    (info,) = find_samples(parse_prometheus(VLLM_TEXT), "vllm:cache_config_info")
    assert info.labels["block_size"] == "128"
    assert info.labels["num_gpu_blocks"] == "4096"
    assert info.labels["dir"] == 'a "q" b\\x'


def test_reads_what_prometheus_client_writes() -> None:
    # The router's own /metrics is written by prometheus_client: read back what it wrote.
    registry = CollectorRegistry()
    Counter("residency_router_requests", "requests", ["route"], registry=registry).labels(
        route="resident"
    ).inc(3)
    Histogram("residency_router_retrieval_seconds", "s", registry=registry).observe(0.25)
    samples = parse_prometheus(generate_latest(registry).decode())
    assert sum_samples(samples, "residency_router_requests_total") == 3
    assert sum_samples(samples, "residency_router_retrieval_seconds_count") == 1
    assert sum_samples(samples, "residency_router_retrieval_seconds_sum") == 0.25


def test_text_that_is_not_an_exposition_is_refused() -> None:
    with pytest.raises(ValueError, match="could not convert"):
        parse_prometheus("<html>502 Bad Gateway {</html>\n")
