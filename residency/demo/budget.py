"""The demo's time budget: a measured prefill rate, and the prompt lengths that fit what is left.

Machines of one kind differ tenfold (vLLM CPU prefill of 30K tokens: 11 s on one 2-core host,
105 s on another), so the demo never assumes a rate. It times two salted cold prefills (512 and
2,048 tokens: a few seconds on the slowest host seen), fits ``t(n) = a·n + b·n²`` (linear work
per token plus attention over the tokens before it; both terms kept non-negative), and sizes
the TTFT comparison from that fit and the seconds the budget has left once the servers are up,
the prefix is warm and the questions are answered.

Worked example: probes 512 tokens in 0.40 s and 2,048 in 1.90 s give a = 7.3e-4 s/token and
b = 9.5e-8 s/token²; a 4,000-token cold send is then predicted at 4.46 s, and two cold plus four
warm sends of it (a warm send costs about a 256-token prefill) at 9.7 s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PROBE_TOKENS: tuple[int, int] = (512, 2048)
# Candidate lengths of the TTFT comparison, shortest first (the longest that fit are kept).
LENGTH_LADDER: tuple[int, ...] = (1000, 2000, 4000, 8000, 16000, 30000)
# The comparison always keeps this many of the shortest lengths, whatever the measured rate: the
# cold-vs-warm TTFT is the demo's headline (1,000 and 2,000 tokens: ~10 s of cold prefill at
# 250 tokens/s, the slowest 2-core host seen).
MIN_LENGTHS = 2
DEFAULT_TIME_BUDGET_S = 180.0
STOP_RESERVE_S = 5.0  # stopping vLLM and the router, writing demo.json and the picture
MIN_WARM_SEND_S = 0.05


@dataclass(frozen=True, slots=True)
class PrefillRate:
    """A cold-prefill time model fitted to probe sends: t(n) = a·n + b·n² seconds."""

    per_token_s: float  # a
    per_token_pair_s: float  # b
    probes: tuple[tuple[int, float], ...]  # (tokens, seconds) as measured

    def cold_s(self, tokens: int) -> float:
        """Predicted seconds to prefill `tokens` tokens with nothing cached."""
        return self.per_token_s * tokens + self.per_token_pair_s * tokens * tokens

    def tokens_per_s(self, tokens: int) -> float:
        """Predicted prefill throughput at that length."""
        return tokens / self.cold_s(tokens) if self.cold_s(tokens) > 0 else float("inf")


def fit_prefill_rate(probes: Sequence[tuple[int, float]]) -> PrefillRate:
    """Least squares of t = a·n + b·n² through the origin, a and b clipped at zero (then refit
    with the other term alone), from at least one (tokens, seconds) probe."""
    if not probes:
        raise ValueError("fit_prefill_rate needs at least one probe")
    s11 = sum(n * n for n, _ in probes)
    s12 = sum(n**3 for n, _ in probes)
    s22 = sum(n**4 for n, _ in probes)
    r1 = sum(n * t for n, t in probes)
    r2 = sum(n * n * t for n, t in probes)
    det = s11 * s22 - s12 * s12
    a = b = -1.0
    if len(probes) > 1 and det > 0:
        a = (r1 * s22 - r2 * s12) / det
        b = (s11 * r2 - s12 * r1) / det
    if a < 0 or b < 0:  # one probe, or noise made a term negative: keep the linear term alone
        a, b = max(r1 / s11, 0.0), 0.0
    return PrefillRate(a, b, tuple(probes))


@dataclass(frozen=True, slots=True)
class LengthChoice:
    """What the comparison measures within the budget, and what it left out and why."""

    lengths: tuple[int, ...]
    include_plan: bool
    predicted_s: float
    scaled_down: str | None  # one line, or None when nothing was dropped


def row_cost_s(rate: PrefillRate, tokens: int, cold_repeats: int, warm_sends: int) -> float:
    """Predicted seconds of one comparison row: salted cold sends, then warm ones."""
    warm = max(MIN_WARM_SEND_S, rate.cold_s(min(tokens, 256)))
    return cold_repeats * rate.cold_s(tokens) + warm_sends * warm


def choose_lengths(
    rate: PrefillRate,
    seconds_left: float,
    *,
    max_model_len: int,
    plan_tokens: int,
    cold_repeats: int,
    warm_sends: int,
    ladder: Sequence[int] = LENGTH_LADDER,
) -> LengthChoice:
    """The `MIN_LENGTHS` shortest ladder lengths always; then the plan's prefix row (the
    resident prefix at its real size) and longer ladder lengths while the predicted cost stays
    within `seconds_left`."""
    fitting = [n for n in ladder if n < max_model_len]
    chosen = fitting[:MIN_LENGTHS]
    spent = sum(row_cost_s(rate, n, cold_repeats, warm_sends) for n in chosen)
    plan_cost = row_cost_s(rate, plan_tokens, cold_repeats, warm_sends)
    include_plan = spent + plan_cost <= seconds_left
    if include_plan:
        spent += plan_cost
    for n in fitting[MIN_LENGTHS:]:
        cost = row_cost_s(rate, n, cold_repeats, warm_sends)
        if spent + cost > seconds_left:
            break
        chosen.append(n)
        spent += cost
    dropped = [n for n in fitting if n not in chosen]
    over_window = [n for n in ladder if n >= max_model_len]
    reasons: list[str] = []
    floor_s = sum(row_cost_s(rate, n, cold_repeats, warm_sends) for n in fitting[:MIN_LENGTHS])
    if floor_s > seconds_left:
        reasons.append(
            f"the {' and '.join(f'{n:,}' for n in fitting[:MIN_LENGTHS])}-token rows are measured "
            f"past the --time-budget (predicted {floor_s:.0f} s, {max(seconds_left, 0):.0f} s "
            "left): the comparison always shows them"
        )
    if dropped or not include_plan:
        what = ", ".join(f"{n:,}" for n in dropped)
        if not include_plan:
            what = f"the {plan_tokens:,}-token prefix row" + (f" and {what}" if what else "")
        reasons.append(
            f"left out {what} tokens: the measured prefill rate "
            f"({rate.tokens_per_s(2048):,.0f} tokens/s at 2K) leaves {seconds_left:.0f} s of "
            "the --time-budget for the comparison (raise --time-budget to measure them)"
        )
    if over_window:
        reasons.append(
            f"{', '.join(f'{n:,}' for n in over_window)} exceed max_model_len {max_model_len:,}"
        )
    return LengthChoice(
        lengths=tuple(chosen),
        include_plan=include_plan,
        predicted_s=spent,
        scaled_down="; ".join(reasons) or None,
    )
