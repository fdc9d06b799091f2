"""Parse the Prometheus text exposition format that vLLM's `/metrics` serves (and the router's)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$"
)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class Sample:
    """One metric sample: name, labels and value."""

    name: str
    labels: dict[str, str]
    value: float


def _unescape(value: str) -> str:
    return value.replace(r"\"", '"').replace(r"\n", "\n").replace("\\\\", "\\")


def parse_prometheus(text: str) -> list[Sample]:
    """All samples of a text exposition; comments and malformed lines are skipped."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line.strip())
        if match is None:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        labels = {k: _unescape(v) for k, v in _LABEL.findall(match["labels"] or "")}
        samples.append(Sample(match["name"], labels, value))
    return samples


def find_samples(samples: list[Sample], name: str) -> list[Sample]:
    """Samples of one metric name (exact match)."""
    return [s for s in samples if s.name == name]


def sum_samples(samples: list[Sample], name: str) -> float | None:
    """The sum over all label sets of one metric, or None when it is absent."""
    found = find_samples(samples, name)
    return sum(s.value for s in found) if found else None
