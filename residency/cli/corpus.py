"""`residency corpus`: corpus tools (import-squad, samples)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import orjson
import typer
from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.markup import escape

from residency.cli.spec import command
from residency.flags import Flag, JsonOutput

app = typer.Typer(name="corpus", help="Corpus tools.", no_args_is_help=True)


class ImportSquadArgs(BaseModel):
    """`residency corpus import-squad`'s arguments and options."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    file: Annotated[Path, Flag(argument=True)] = Field(
        description="SQuAD-format JSON, e.g. JSQuAD valid-v1.3.json."
    )
    outdir: Annotated[Path, Flag(argument=True)] = Field(
        description="The corpus directory it writes (OUTDIR/*.jsonl); the questions and the "
        "provenance go beside it (OUTDIR.qa.jsonl, OUTDIR.import.json)."
    )
    force: bool = Field(default=False, description="Replace OUTDIR even when it is not empty.")
    json_output: JsonOutput = False


class SamplesArgs(BaseModel):
    """`residency corpus samples`'s options."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    json_output: JsonOutput = False


@app.command("import-squad")
@command(ImportSquadArgs)
def import_squad(args: ImportSquadArgs) -> None:
    """Turn a SQuAD-style file into a corpus (a section per paragraph) and a questions file."""
    from residency.corpus.squad import import_squad as run_import
    from residency.corpus.squad import questions_file

    outdir, json = args.outdir, args.json_output
    report = run_import(args.file, outdir, force=args.force)
    if json:
        typer.echo(orjson.dumps(report.model_dump(mode="json"), option=orjson.OPT_INDENT_2))
        return
    qa = escape(str(questions_file(outdir)))
    Console().print(
        f"{report.articles} articles, {report.paragraphs} paragraphs → "
        f"{escape(str(outdir))}/; {report.questions} questions "
        f"({report.unanswerable} without an answer) → {qa}\n"
        f"next: residency index {escape(str(outdir))} -o INDEX_DIR, then "
        f"residency eval retrieval --index INDEX_DIR --questions {qa}",
        highlight=False,
    )


@app.command("samples")
@command(SamplesArgs)
def samples(args: SamplesArgs) -> None:
    """List the sample corpora residency ships (package data): docs, query log, questions."""
    from residency.corpus.samples import SAMPLES

    json = args.json_output
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
