"""`residency eval prune`: how much retrieved context the listwise pruner removes on a
SQuAD-style file or a question set with gold section ids (a sample corpus's qa.jsonl), and how
much gold evidence survives it (docs/design/routing.md).

Per question (a stride sample of the file's answerable questions, spread over all articles):
retrieve the top-k chunks from the index, send them to the pruner, and compare the chunks kept
with the question's gold paragraph (its section). Three kept sets come from the same grades:
the pruner as configured (grades >= threshold, plus the keep-top-k floor), the floor alone (the
first keep_top_k chunks: what you get without a model), and the grades alone (no floor). A
failed call keeps every chunk in the pruner's rows, as it does in the router. The index is the
one `eval coverage --squad` builds under ``CACHE/coverage`` (BM25-only), reused when present;
with a question set, the index given (or the sample corpus's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from residency.context.pruner import (
    Passage,
    PruneResult,
    keep_ids,
    prune_sync,
)
from residency.context.pruner_settings import PRUNER_FLAG, PrunerSettings
from residency.corpus.samples import JA_SAMPLE, SampleCorpus
from residency.corpus.squad import questions_file
from residency.errors import ConfigError, CorpusError
from residency.eval.coverage_runs import squad_corpus, squad_index
from residency.eval.defaults import COVERAGE_CACHE, DEFAULT_PRUNE_K, DEFAULT_PRUNE_LIMIT
from residency.eval.prune_report import (
    KeptFigures,
    PruneEvalReport,
    PruneEvalSettings,
)
from residency.eval.questions import Question, load_questions
from residency.index import BuildProgress, Index, open_index
from residency.machine import machine_info
from residency.models.tiny import STAMP_FILE
from residency.models.tokenizer import ensure_tokenizer
from residency.planning.run import CACHE_DIR, DATA_ROOT, sample_index
from residency.stats import TimingStats
from residency.tokenizer import LocalTokenizer
from residency.vllm_client import VllmClient

MEANINGLESS_GRADES_NOTE = (
    "the grading model serves random weights (tiny test model): its grades carry no meaning, so "
    "these figures measure the plumbing and the keep-top-k floor, not pruning quality"
)


@dataclass(frozen=True, slots=True)
class PrunedQuestion:
    """One question's retrieved chunk ids (rank order), their lengths, gold ids, and the result."""

    order: tuple[str, ...]
    chars: dict[str, int]
    gold_ids: frozenset[str]
    result: PruneResult


def sample_questions(questions: Sequence[Question], limit: int) -> list[Question]:
    """Up to `limit` answerable questions at an even stride (the file is grouped by article)."""
    answerable = [q for q in questions if q.relevant_ids]
    if limit >= len(answerable):
        return answerable
    return [answerable[i * len(answerable) // limit] for i in range(limit)]


def kept_figures(
    name: str, asked: Sequence[PrunedQuestion], choose: Callable[[PrunedQuestion], Sequence[str]]
) -> KeptFigures:
    """Removed shares and gold kept when `choose` picks each question's kept chunks."""
    retrieved = kept = chars_retrieved = chars_kept = gold_retrieved = gold_kept = 0
    for a in asked:
        chosen = set(choose(a))
        retrieved += len(a.order)
        kept += len(chosen)
        chars_retrieved += sum(a.chars.values())
        chars_kept += sum(a.chars[i] for i in chosen)
        if a.gold_ids & set(a.order):
            gold_retrieved += 1
            gold_kept += bool(a.gold_ids & chosen)
    return KeptFigures(
        name=name,
        chunks_retrieved=retrieved,
        chunks_kept=kept,
        removed_share=1 - kept / retrieved if retrieved else 0.0,
        removed_chars_share=1 - chars_kept / chars_retrieved if chars_retrieved else 0.0,
        gold_retrieved=gold_retrieved,
        gold_kept=gold_kept,
        gold_kept_share=gold_kept / gold_retrieved if gold_retrieved else None,
    )


def evaluate_pruning(
    index: Index,
    questions: Sequence[Question],
    settings: PrunerSettings,
    measured: PruneEvalSettings,
    *,
    notes: Sequence[str] = (),
    progress: Callable[[int], None] | None = None,
) -> PruneEvalReport:
    """Retrieve top-k, prune, and compare kept chunks with each question's gold sections."""
    k = measured.k
    chunks = {c.id: c for c in index.chunks}
    asked: list[PrunedQuestion] = []
    with httpx.Client() as client:
        for q in questions:
            hits = index.search_chunks(q.query, k)
            passages = [Passage(h.id, chunks[h.id].index_text) for h in hits]
            result = prune_sync(settings, q.query, passages, client=client)
            gold = frozenset(h.id for h in hits if index.section_of(h.id) in q.relevant_ids)
            order = tuple(p.id for p in passages)
            asked.append(PrunedQuestion(order, {p.id: len(p.text) for p in passages}, gold, result))
            if progress is not None:
                progress(1)
    rows = (
        kept_figures("pruner", asked, lambda a: a.result.kept_ids),
        kept_figures("floor only", asked, lambda a: a.order[: settings.keep_top_k]),
        kept_figures(
            "grades only",
            asked,
            lambda a: (
                keep_ids(a.result.grades, a.order, settings.threshold, 0)
                if a.result.valid
                else a.order
            ),
        ),
    )
    failed = [a.result for a in asked if not a.result.valid]
    return PruneEvalReport(
        settings=measured,
        machine=machine_info(),
        questions=len(asked),
        rows=rows,
        latency=TimingStats.of([a.result.elapsed_s for a in asked]),
        invalid_outputs=sum(r.failure == "invalid_output" for r in failed),
        upstream_errors=sum(r.failure == "upstream" for r in failed),
        first_error=(failed[0].error or "")[:2000] if failed else None,
        notes=tuple(notes),
    )


def served_model(url: str, wanted: str | None, api_key: str | None = None) -> tuple[str, bool]:
    """The model to grade with (`wanted`, else the first served); True if it has random weights.

    Random weights: the server loaded a local directory stamped by `residency.models.tiny`.
    Raises `UpstreamError` when the endpoint cannot be reached and `ConfigError` when it does
    not serve `wanted`: a run that would only measure failures stops before it starts.
    """
    with VllmClient(url, api_key=api_key, flag=PRUNER_FLAG) as client:
        models = client.models()
    ids = [m.id for m in models]
    name = wanted or ids[0]
    if name not in ids:
        raise ConfigError(f"--pruner-model {name!r}: {url} serves {', '.join(ids)}")
    root = next((m.root for m in models if m.id == name), None)
    return name, root is not None and (Path(root) / STAMP_FILE).is_file()


@dataclass(frozen=True)
class PruneEvalJob:
    """What `residency eval prune` was asked: a SQuAD file, or questions over an index."""

    squad_file: Path | None
    pruner: PrunerSettings  # model "": the first one the server lists
    k: int = DEFAULT_PRUNE_K  # bounds: PruneEvalSettings.k (the CLI checks them as it parses)
    limit: int = DEFAULT_PRUNE_LIMIT
    cache_dir: Path = COVERAGE_CACHE
    questions_file: Path | None = None  # without squad_file: qa.jsonl with gold section ids
    index_dir: Path | None = None  # without squad_file: the index (default: the sample's)
    sample: SampleCorpus = JA_SAMPLE


def _squad_questions(
    job: PruneEvalJob, progress: BuildProgress
) -> tuple[Index, list[Question], str]:
    """The SQuAD file imported and indexed (cached, BM25-only), and its questions."""
    assert job.squad_file is not None
    corpus = squad_corpus(job.squad_file, job.cache_dir)
    tokenizer_dir = ensure_tokenizer(DATA_ROOT, CACHE_DIR / "tiny-models")
    index, reused = squad_index(
        corpus,
        corpus.parent / "index-bm25",
        False,
        LocalTokenizer(tokenizer_dir),
        progress,
    )
    note = f"index {'reused' if reused else 'built'}: {index.directory} (BM25-only)"
    return index, load_questions(questions_file(corpus)), note


def _set_questions(job: PruneEvalJob, progress: BuildProgress) -> tuple[Index, list[Question], str]:
    """The question set and its index (the sample corpus's unless --index is given)."""
    path = job.questions_file or job.sample.questions
    index = (
        open_index(job.index_dir)
        if job.index_dir is not None
        else sample_index(progress, job.sample)
    )
    return index, load_questions(path), f"index: {index.directory}"


def run_prune_eval(job: PruneEvalJob, progress: BuildProgress) -> PruneEvalReport:
    """Index the questions' corpus (cached), then measure the pruner on `limit` questions."""
    model, tiny = served_model(job.pruner.url, job.pruner.model or None, job.pruner.api_key)
    if job.squad_file is not None:
        index, all_questions, note = _squad_questions(job, progress)
        source = str(job.squad_file)
    else:
        index, all_questions, note = _set_questions(job, progress)
        source = str(job.questions_file or job.sample.questions)
    settings = job.pruner.model_copy(update={"model": model, "language": index.language.code})
    # The pruner's settings the report records: url, model, threshold, keep_top_k (no api_key).
    recorded = PruneEvalSettings.model_fields.keys() & PrunerSettings.model_fields.keys()
    measured = PruneEvalSettings(
        source=source,
        index_dir=str(index.directory),
        k=job.k,
        limit=job.limit,
        **settings.model_dump(include=recorded),
    )
    questions = sample_questions(all_questions, job.limit)
    if not questions:
        raise CorpusError(f"{source}: no answerable questions")
    notes = [note]
    if tiny:
        notes.append(MEANINGLESS_GRADES_NOTE)
    progress.start("pruning", len(questions))
    return evaluate_pruning(
        index, questions, settings, measured, notes=notes, progress=progress.advance
    )
