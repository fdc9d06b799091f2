"""`residency index`: build (or rebuild) an index directory from a corpus directory."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from pydantic import BaseModel, ConfigDict, Field, model_validator
from rich.console import Console
from rich.markup import escape

from residency.atomic import check_output_dir
from residency.cli.spec import command
from residency.errors import ConfigError
from residency.flags import Flag, JsonOutput, Output, Section, TokenizerDir, VllmServer
from residency.index.options import IndexOptions, UploadOptions
from residency.retrieval.qdrant_schema import QdrantCollectionRef, QdrantOptions

if TYPE_CHECKING:
    from residency.index import IndexManifest
    from residency.index.qdrant_upload import UploadReport
    from residency.tokenizer import ModelTokenizer

_COUNT = "Token counts (pick one; neither: approximate, labelled 'approx')"
_UPLOAD = "Upload (--to qdrant)"


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """`kill` (SIGTERM) unwinds like Ctrl-C, so the temp build dir is removed on the way out."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class IndexArgs(BaseModel):
    """`residency index`'s argument and options."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    corpus_dir: Annotated[Path, Flag(argument=True)] = Field(
        description="Corpus root: .md, .pdf, .html, .docx (sections by heading), .txt "
        "(paragraphs), .jsonl (records)."
    )
    output: Output = None
    tokenizer_dir: Annotated[TokenizerDir, Flag(panel=_COUNT)] = None
    server: Annotated[VllmServer, Flag(panel=_COUNT)] = None
    options: IndexOptions = Field(default_factory=IndexOptions, description="What to build.")
    json_output: JsonOutput = False
    to: Annotated[
        tuple[Literal["qdrant"], str] | None, Flag(metavar="qdrant URL|PATH", panel=_UPLOAD)
    ] = Field(
        default=None,
        description="Then upload the index into a Qdrant collection (server URL or local "
        "directory); re-running uploads only what changed.",
    )
    collection: Annotated[
        QdrantCollectionRef,
        Section(
            panel=_UPLOAD,
            flags={"api_key": Flag("--qdrant-api-key", envvar="QDRANT_API_KEY")},
        ),
    ] = Field(default_factory=QdrantCollectionRef, description="The collection uploaded into.")
    upload: Annotated[UploadOptions, Section(panel=_UPLOAD)] = Field(
        default_factory=UploadOptions, description="How the upload writes."
    )

    @model_validator(mode="after")
    def _watch_is_local(self) -> IndexArgs:
        if self.output is None:
            raise ValueError("index writes an index directory: give --output (-o) DIR")
        if self.options.watch and self.to is not None:
            raise ValueError(
                "--watch re-indexes locally; upload with --to qdrant in a separate run"
            )
        return self


@command(IndexArgs)
def index(args: IndexArgs) -> None:
    """Index a corpus: sections, chunks, BM25 and dense vectors, with a manifest; optionally
    upload it into Qdrant (--to qdrant URL|PATH)."""
    from residency.cli.progress import build_progress
    from residency.index import build_index
    from residency.index.qdrant_source import source_from_index
    from residency.index.qdrant_upload import upload
    from residency.tokenizer import ServerTokenizer, open_tokenizer

    uploading, options, output, json = args.upload, args.options, args.output, args.json_output
    assert output is not None  # IndexArgs refuses a run without one
    corpus_dir = args.corpus_dir
    check_output_dir(output)
    ref = args.collection
    target = _upload_target(args.to, ref.collection, uploading.vector_name, ref.api_key, output)
    counter = open_tokenizer(args.tokenizer_dir, args.server)
    try:
        with _sigterm_as_interrupt(), build_progress(json) as progress:
            manifest = build_index(corpus_dir, output, options, counter, progress)
        if options.watch:
            _report(manifest, output, None, json)
            _watch(corpus_dir, output, options, counter, json)
            return
    finally:
        if isinstance(counter, ServerTokenizer):
            counter.close()
    uploaded = None
    if target is not None:
        qdrant, name = target
        with build_progress(json) as progress:
            source = source_from_index(output)
            uploaded = upload(
                source, qdrant, name, uploading.vector_name, uploading.batch_size, progress
            )
    _report(manifest, output, uploaded, json)


def _report(
    manifest: IndexManifest, output: Path, uploaded: UploadReport | None, json: bool
) -> None:
    """The manifest as JSON (--json) or as the summary tables."""
    import orjson

    if json:
        payload = {"index_dir": str(output.resolve()), **manifest.model_dump(mode="json")}
        if uploaded is not None:
            payload["qdrant"] = uploaded.model_dump(mode="json")
        typer.echo(orjson.dumps(payload, option=orjson.OPT_INDENT_2))
    else:
        render(manifest, output, Console())
        if uploaded is not None:
            render_upload(uploaded, Console())


def _watch(
    corpus_dir: Path, output: Path, options: IndexOptions, counter: ModelTokenizer, json: bool
) -> None:
    """Re-index on every settled change until Ctrl-C; a failed build is one line, then on."""
    from residency.errors import ResidencyError
    from residency.index import build_index
    from residency.index.watch import watch_corpus

    console = Console(stderr=json)
    console.print(f"watching {escape(str(corpus_dir))} for changes (Ctrl-C stops)")

    def rebuild() -> None:
        try:
            with _sigterm_as_interrupt():
                manifest = build_index(corpus_dir, output, options, counter)
        except ResidencyError as exc:
            console.print(f"[red]re-index failed:[/] {escape(str(exc))}; still watching")
            return
        if json:
            typer.echo(orjson_line(output, manifest))
        console.print(describe_rebuild(manifest))

    try:
        with _sigterm_as_interrupt():
            watch_corpus(corpus_dir, output, rebuild)
    except KeyboardInterrupt:
        console.print("stopped watching")


def orjson_line(output: Path, manifest: IndexManifest) -> str:
    """One JSON line per re-index (--watch --json)."""
    import orjson

    payload = {"index_dir": str(output.resolve()), **manifest.model_dump(mode="json")}
    return orjson.dumps(payload).decode()


def describe_rebuild(manifest: IndexManifest) -> str:
    """'re-indexed in 0.8 s: 1 file read, 13 unchanged, 0 removed; 3 chunks embedded, ...'."""
    b = manifest.build
    return (
        f"re-indexed in {b.seconds:.1f} s: {b.parsed_files} file(s) read, {b.reused_files} "
        f"unchanged, {b.removed_files} removed; {b.embedded_chunks} chunk(s) embedded, "
        f"{b.reused_chunks} reused; {manifest.section_count} sections, "
        f"{len(manifest.skipped)} skipped input(s)"
    )


def _upload_target(
    to: tuple[str, str] | None,
    collection: str | None,
    vector_name: str,
    api_key: str | None,
    output: Path,
) -> tuple[QdrantOptions, str] | None:
    """(options, collection) for --to qdrant LOCATION, checked before the build starts."""
    from residency.retrieval.qdrant_schema import check_name, default_collection

    if to is None:
        return None
    kind, location = to
    if kind != "qdrant":
        raise ConfigError(f"--to {kind} {location}: the only target is qdrant (--to qdrant URL)")
    check_name(vector_name, "--vector-name")
    name = check_name(collection or default_collection(output), "--collection")
    return QdrantOptions(location=location, collection=name, api_key=api_key), name


def render_upload(report: UploadReport, console: Console) -> None:
    """What the upload wrote, and the BM25 avgdl drift when the corpus has moved."""
    from rich.table import Table

    table = Table(
        title=f"Qdrant {report.collection} at {report.location} ({report.seconds:.1f} s)",
        title_justify="left",
        show_header=False,
    )
    table.add_column("what")
    table.add_column("value", justify="right")
    created = " (created)" if report.created_collection or report.created_vector else ""
    table.add_row("dense vector", report.vector_name + created)
    rows = {
        "chunks": report.chunks,
        "uploaded": report.uploaded,
        "backfilled (vector only)": report.backfilled,
        "payload updated": report.payload_updated,
        "deleted": report.deleted,
        "unchanged": report.unchanged,
    }
    for label, value in rows.items():
        table.add_row(label, f"{value:,}")
    console.print(table)
    drift = report.avgdl_index / report.avgdl_collection - 1
    if abs(drift) > 0.01:
        console.print(
            f"[yellow]BM25 avgdl drift:[/] the collection keeps {report.avgdl_collection:.1f} "
            f"(fixed at creation), this index has {report.avgdl_index:.1f} ({drift:+.1%}); "
            "length normalisation differs from in-process BM25 by that much: upload into a new "
            "--collection to refresh it"
        )


def render(manifest: IndexManifest, output: Path, console: Console) -> None:
    """Summary table, then every skipped input with its location and reason."""
    from rich.table import Table

    table = Table(
        title=f"Index {output} (built in {manifest.build.seconds:.1f} s)",
        title_justify="left",
        show_header=False,
    )
    table.add_column("what")
    table.add_column("value", justify="right")
    chunker = manifest.chunker
    how = f"{chunker.kind}, {chunker.chunk_chars} chars"
    if chunker.kind == "fixed":
        how += f", overlap {chunker.chunk_overlap}"
    table.add_row("files", f"{len(manifest.files):,}")
    table.add_row("sections", f"{manifest.section_count:,}")
    table.add_row("chunks", f"{manifest.chunk_count:,} ({how})")
    build = manifest.build
    if build.reused_files or build.removed_files:
        files = f"{build.parsed_files:,} read, {build.reused_files:,} unchanged"
        table.add_row("files re-read", files + f", {build.removed_files:,} removed")
    table.add_row("embedded", f"{manifest.build.embedded_chunks:,}")
    table.add_row("reused", f"{manifest.build.reused_chunks:,}")
    if manifest.build.embedded_sentences:
        table.add_row("sentences embedded (chunker)", f"{manifest.build.embedded_sentences:,}")
    table.add_row("skipped inputs", f"{len(manifest.skipped):,}")
    table.add_row("tokens", f"{manifest.total_tokens:,} ({manifest.token_count.method})")
    table.add_row("embedder", manifest.describe_embedder())
    table.add_row("BM25 tokenizer", manifest.sparse_tokenizer)
    console.print(table)
    if manifest.token_count.method == "approx":
        console.print(
            f"[yellow]token counts are approximate[/] ({escape(manifest.token_count.name)}); "
            "pass --tokenizer-dir or --server for the model's own counts"
        )
    if manifest.skipped:
        # One line each, never cut to the terminal's width (a pipe or a log keeps it whole).
        console.print(f"[bold]Skipped inputs[/] ({len(manifest.skipped):,}, not indexed):")
        for s in manifest.skipped:
            console.print(
                f"  {escape(s.location())}: {escape(s.reason)}", soft_wrap=True, highlight=False
            )
