"""`residency profiles`: list the shipped GPU and model profiles."""

from __future__ import annotations

import orjson
import typer
from pydantic import BaseModel, ConfigDict
from rich.console import Console
from rich.table import Table

from planner.units import GiB
from residency.capacity.profiles import (
    gpu_profile_names,
    load_gpu_profile,
    model_profile_names,
    resolve_model,
)
from residency.cli.spec import command
from residency.flags import JsonOutput


class ProfilesArgs(BaseModel):
    """`residency profiles`'s options."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    json_output: JsonOutput = False


@command(ProfilesArgs)
def profiles(args: ProfilesArgs) -> None:
    """List GPU profiles (--profile) and model profiles (--model)."""
    json = args.json_output
    gpus = [load_gpu_profile(n) for n in gpu_profile_names()]
    models = [resolve_model(n) for n in model_profile_names()]
    if json:
        typer.echo(
            orjson.dumps(
                {
                    "gpus": [g.model_dump(mode="json") for g in gpus],
                    "models": [
                        {
                            "name": m.name,
                            "weights_bytes": m.weights_bytes,
                            "architecture": m.spec.architecture,
                            "layers": m.spec.num_hidden_layers,
                            "attention_layers": m.spec.count("full_attention")
                            + m.spec.count("sliding_attention"),
                        }
                        for m in models
                    ],
                },
                option=orjson.OPT_INDENT_2,
            )
        )
        return
    console = Console()
    gt = Table(title="GPU profiles (--profile)", title_justify="left")
    # Names are what users type: never cut (no_wrap), the other columns wrap instead.
    gt.add_column("name", no_wrap=True)
    for col in ("device", "memory", "fp8"):
        gt.add_column(col)
    for g in gpus:
        gt.add_row(
            g.name,
            g.display_name,
            f"{g.total_memory_bytes / GiB:.2f} GiB",
            "yes" if g.fp8_native else "no",
        )
    console.print(gt)
    mt = Table(title="Model profiles (--model)", title_justify="left")
    mt.add_column("name", no_wrap=True)
    for col in ("architecture", "layers (attention)", "KV heads × head_dim", "weights"):
        mt.add_column(col, overflow="fold")
    for m in models:
        s = m.spec
        attn = s.count("full_attention") + s.count("sliding_attention")
        mt.add_row(
            m.name,
            s.architecture,
            f"{s.num_hidden_layers} ({attn})",
            f"{s.num_kv_heads} × {s.head_size}",
            f"{(m.weights_bytes or 0) / GiB:.2f} GiB",
        )
    console.print(mt)
