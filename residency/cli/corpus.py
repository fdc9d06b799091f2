"""`residency corpus`: corpus tools (import-squad, samples)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.console import Console
from rich.markup import escape

from residency.cli.options import JsonOption

app = typer.Typer(name="corpus", help="Corpus tools.", no_args_is_help=True)


@app.command("import-squad")
def import_squad(
    file: Annotated[Path, typer.Argument(help="SQuAD-format JSON, e.g. JSQuAD valid-v1.3.json.")],
    outdir: Annotated[Path, typer.Argument(help="Writes OUTDIR/docs/*.jsonl and OUTDIR/qa.jsonl.")],
    force: Annotated[
        bool, typer.Option("--force", help="Replace OUTDIR even when it is not empty.")
    ] = False,
    json: JsonOption = False,
) -> None:
    """Turn a SQuAD-style file into a corpus (a section per paragraph) and a questions file."""
    from residency.corpus.squad import import_squad as run_import

    report = run_import(file, outdir, force=force)
    if json:
        typer.echo(orjson.dumps(report.model_dump(mode="json"), option=orjson.OPT_INDENT_2))
        return
    qa = escape(str(outdir / "qa.jsonl"))
    Console().print(
        f"{report.articles} articles, {report.paragraphs} paragraphs → "
        f"{escape(str(outdir / 'docs'))}/; {report.questions} questions "
        f"({report.unanswerable} without an answer) → {qa}\n"
        f"next: residency index {escape(str(outdir / 'docs'))} -o INDEX_DIR, then "
        f"residency eval retrieval --index INDEX_DIR --questions {qa}",
        highlight=False,
    )


@app.command("samples")
def samples(json: JsonOption = False) -> None:
    """List the sample corpora residency ships (package data): docs, query log, questions."""
    from residency.corpus.samples import SAMPLES

    rows = [
        {
            "name": s.name,
            "docs": str(s.docs),
            "queries": str(s.queries),
            "questions": str(s.questions),
            "chunk_chars": s.chunk_chars,
        }
        for s in SAMPLES.values()
    ]
    if json:
        typer.echo(orjson.dumps(rows, option=orjson.OPT_INDENT_2))
        return
    console = Console()
    for row in rows:
        console.print(f"[bold]{row['name']}[/]  {escape(str(row['docs']))}", highlight=False)
    console.print(
        "index one: residency index DOCS -o INDEX_DIR (harbor-lights-en: --chunk-chars 800)",
        highlight=False,
    )
