"""The `residency bench --plot` picture: TTFT vs prompt length (cold and warm, log y axis), and
with a plan, coverage vs resident budget for the planner and the baselines. PNG, written
atomically; matplotlib (Agg, no display) is imported only here, only when drawing."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from residency.atomic import write_bytes_atomic
from residency.bench.report import BenchReport, CoverageCurve, LengthResult
from residency.errors import ConfigError

_INSTALL = "pip install matplotlib"


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend; a clean error naming the install command."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError(f"--plot needs matplotlib: {_INSTALL}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _spread(rows: list[LengthResult], warm: bool) -> tuple[list[float], list[list[float]]]:
    """Medians and asymmetric p10/p90 error bars of the cold or warm stats."""
    stats = [r.warm if warm else r.cold for r in rows]
    medians = [s.median_s for s in stats]
    below = [s.median_s - s.p10_s for s in stats]
    above = [s.p90_s - s.median_s for s in stats]
    return medians, [below, above]


def _ttft_panel(ax: Any, report: BenchReport) -> None:
    rows = sorted(report.results, key=lambda r: r.prompt_tokens)
    xs = [r.prompt_tokens for r in rows]
    for warm, name, marker in ((False, "uncached (cold)", "o"), (True, "cached (warm)", "s")):
        medians, err = _spread(rows, warm)
        ax.errorbar(xs, medians, yerr=err, marker=marker, capsize=3, label=name)
    for r in rows:
        if r.label == "plan":
            ax.annotate("plan prefix", (r.prompt_tokens, r.cold.median_s), fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("TTFT, s (median, p10-p90)")
    ax.set_title(f"TTFT on {report.served_model}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()


def _coverage_panel(ax: Any, curve: CoverageCurve) -> None:
    names = list(dict.fromkeys(p.strategy for p in curve.points))
    for name in names:
        pts = sorted((p for p in curve.points if p.strategy == name), key=lambda p: p.budget_tokens)
        style = "--" if name.startswith("rag") else "-"
        ax.plot(
            [p.budget_tokens for p in pts],
            [p.coverage for p in pts],
            style,
            marker="o" if name == "planner" else ".",
            linewidth=2.5 if name == "planner" else 1.2,
            label=name,
        )
    ax.axvline(curve.plan_budget_tokens, color="grey", linestyle=":", label="plan budget")
    ax.set_xlabel("resident budget, tokens")
    ax.set_ylabel(f"coverage ({curve.questions} questions)")
    ax.set_ylim(0, 1.02)
    ax.set_title("coverage vs budget")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def render_png(report: BenchReport) -> bytes:
    """The figure as PNG bytes: one panel, or two with a coverage curve."""
    plt = _pyplot()
    panels = 2 if report.coverage is not None else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.5), squeeze=False)
    try:
        _ttft_panel(axes[0][0], report)
        if report.coverage is not None:
            _coverage_panel(axes[0][1], report.coverage)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=110)
    finally:
        plt.close(fig)
    return buffer.getvalue()


def plot_bench(report: BenchReport, path: Path) -> None:
    """Draw the report to a PNG at `path` (temp file + rename)."""
    data = render_png(report)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, data)
