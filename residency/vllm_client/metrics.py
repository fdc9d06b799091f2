"""Read the Prometheus text exposition that vLLM's `/metrics` serves (and the router's), with
prometheus_client's own parser; this module only gives its samples a typed shape."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Sample:
    """One metric sample: name (with its `_total`, `_bucket`, ... suffix), labels and value."""

    name: str
    labels: dict[str, str]
    value: float


def parse_prometheus(text: str) -> list[Sample]:
    """Every sample of a text exposition, in order; ValueError when the text is not one.

    >>> parse_prometheus('vllm:prefix_cache_hits_total{engine="0"} 12.0')
    [Sample(name='vllm:prefix_cache_hits_total', labels={'engine': '0'}, value=12.0)]
    """
    # Imported here: the prometheus_client package loads its exposition servers with the parser.
    from prometheus_client.parser import text_string_to_metric_families

    return [
        Sample(sample.name, dict(sample.labels), float(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def find_samples(samples: list[Sample], name: str) -> list[Sample]:
    """Samples of one metric name (exact match)."""
    return [s for s in samples if s.name == name]


def sum_samples(samples: list[Sample], name: str) -> float | None:
    """The sum over all label sets of one metric, or None when it is absent."""
    found = find_samples(samples, name)
    return sum(s.value for s in found) if found else None
