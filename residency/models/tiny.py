"""Tiny random-weight models for tests and demos: Qwen configs, no hub (`residency model build
tiny-dense` / `tiny-hybrid`).

A real vLLM server needs a real model directory. These are built here from nothing but the
project's own corpus text: the tokenizer trained on it (`models.tokenizer`) and a transformers
config whose weights are drawn at random with a fixed seed. Two architectures cover what the
capacity planner must agree with vLLM on:

* ``dense``  — ``Qwen2ForCausalLM``: every layer is full attention (GQA / MQA by kv heads).
* ``hybrid`` — ``Qwen3NextForCausalLM``: Gated DeltaNet (linear attention, a fixed-size state)
  with one full-attention layer every ``full_attention_interval`` layers, text-only. (Qwen3.5's
  multimodal class cannot load beside the CPU torch build; its GDN layers are the same.)

On vLLM's CPU backend the attention head size must be a supported kernel size: 32 fails
("Unexpected head dim size"), 64 and 128 work.

Build directories are content-addressed: ``residency-tiny-model.json`` holds a hash of the spec
and the tokenizer files, and an identical build is skipped; a build is assembled beside the
target and swapped in by one rename (`residency.atomic`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from residency.atomic import atomic_directory
from residency.models.stamp import stamp_hash, write_stamp
from residency.models.tokenizer import ENDOFTEXT, IM_END, SPECIAL_TOKENS, TOKENIZER_FILES

STAMP_FILE = "residency-tiny-model.json"
# Bump when the build itself changes, so cached directories are rebuilt.
BUILD_FORMAT_VERSION = 2


_Count = Annotated[int, Field(ge=1, le=128)]
_Width = Annotated[int, Field(ge=16, le=32768)]


class TinyModelSpec(BaseModel):
    """The shape of one tiny random-weight model; its JSON is part of the build hash."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    kind: Literal["dense", "hybrid"] = Field(
        default="dense",
        description="dense: Qwen2ForCausalLM (all full attention); "
        "hybrid: Qwen3NextForCausalLM (Gated DeltaNet + full attention).",
    )
    num_hidden_layers: _Count = Field(default=4, description="Decoder layers.")
    num_attention_heads: _Count = Field(default=4, description="Query heads.")
    num_key_value_heads: _Count = Field(default=2, description="KV heads (1: MQA, fewer: GQA).")
    head_dim: _Width = Field(default=64, description="Attention head size; CPU: 64/128, not 32.")
    hidden_size: _Width = Field(
        default=256, description="Residual width; dense Qwen2 needs num_attention_heads * head_dim."
    )
    intermediate_size: _Width = Field(default=512, description="MLP width.")
    max_position_embeddings: int = Field(
        default=65536, ge=128, le=1_048_576, description="Longest position the model accepts."
    )
    full_attention_interval: _Count = Field(
        default=4, description="Hybrid: every N-th layer is full attention, the others GDN."
    )
    linear_num_key_heads: _Count = Field(default=2, description="Hybrid: GDN key heads.")
    linear_num_value_heads: _Count = Field(
        default=4, description="Hybrid: GDN value heads (a multiple of the key heads)."
    )
    linear_key_head_dim: _Width = Field(default=64, description="Hybrid: GDN key head size.")
    linear_value_head_dim: _Width = Field(default=64, description="Hybrid: GDN value head size.")
    linear_conv_kernel_dim: int = Field(
        default=4, ge=2, le=8, description="Hybrid: GDN short-convolution kernel width."
    )
    num_experts: _Count = Field(
        default=4, description="Hybrid: routed experts per layer (vLLM's Qwen3-Next needs MoE)."
    )
    num_experts_per_tok: _Count = Field(default=2, description="Hybrid: experts per token.")
    moe_intermediate_size: _Width = Field(
        default=128, description="Hybrid: width of each expert and of the shared expert."
    )
    dtype: Literal["bfloat16", "float32"] = Field(
        default="bfloat16", description="Weight dtype written to model.safetensors and config."
    )
    rope_theta: float = Field(default=1_000_000.0, gt=0, description="RoPE base frequency.")
    seed: int = Field(default=0, ge=0, description="torch seed for the random weights.")

    @model_validator(mode="after")
    def _check_shapes(self) -> TinyModelSpec:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        if self.kind == "dense" and self.hidden_size != self.num_attention_heads * self.head_dim:
            # vLLM's qwen2.py derives head_dim = hidden_size // num_attention_heads.
            raise ValueError(
                f"dense Qwen2 needs hidden_size = num_attention_heads * head_dim = "
                f"{self.num_attention_heads * self.head_dim}, got {self.hidden_size}"
            )
        if self.kind == "hybrid" and self.num_experts_per_tok > self.num_experts:
            raise ValueError(
                f"num_experts_per_tok {self.num_experts_per_tok} exceeds num_experts "
                f"{self.num_experts}"
            )
        if self.kind == "hybrid" and self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(
                f"linear_num_value_heads {self.linear_num_value_heads} is not a multiple of "
                f"linear_num_key_heads {self.linear_num_key_heads}"
            )
        return self

    @property
    def layer_types(self) -> list[str]:
        """Per-layer kind as transformers names it ("full_attention" / "linear_attention")."""
        if self.kind == "dense":
            return ["full_attention"] * self.num_hidden_layers
        return [
            "full_attention" if (i + 1) % self.full_attention_interval == 0 else "linear_attention"
            for i in range(self.num_hidden_layers)
        ]


DENSE_SPEC = TinyModelSpec()
HYBRID_SPEC = TinyModelSpec(kind="hybrid")


def build_tiny_model(spec: TinyModelSpec, out_dir: Path, tokenizer_dir: Path) -> Path:
    """Write a random-weight model dir (config, safetensors, tokenizer); skip if already built."""
    build_hash = _build_hash(spec, tokenizer_dir)
    if stamp_hash(out_dir, STAMP_FILE) == build_hash:
        return out_dir

    import torch
    from transformers import AutoModelForCausalLM

    special_ids = _special_token_ids(tokenizer_dir)
    with atomic_directory(out_dir) as staging:
        config = _hf_config(spec, vocab_size=_vocab_size(tokenizer_dir), special_ids=special_ids)
        torch.manual_seed(spec.seed)
        # transformers leaves from_config unannotated.
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
        model = model.to(getattr(torch, spec.dtype))
        model.save_pretrained(staging, safe_serialization=True)
        for name in TOKENIZER_FILES:
            shutil.copyfile(tokenizer_dir / name, staging / name)
        generation = {
            "eos_token_id": [special_ids[IM_END], special_ids[ENDOFTEXT]],
            "pad_token_id": special_ids[ENDOFTEXT],
        }
        (staging / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        staging.chmod(0o755)
        write_stamp(
            staging, STAMP_FILE, {"build_hash": build_hash, "spec": spec.model_dump(mode="json")}
        )
    return out_dir


def _hf_config(spec: TinyModelSpec, vocab_size: int, special_ids: dict[str, int]) -> Any:
    """The transformers config object for spec (Qwen2Config or Qwen3NextConfig)."""
    common: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "max_position_embeddings": spec.max_position_embeddings,
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta},
        "tie_word_embeddings": True,
        "bos_token_id": special_ids[ENDOFTEXT],
        "eos_token_id": special_ids[IM_END],
        "pad_token_id": special_ids[ENDOFTEXT],
        "dtype": spec.dtype,
    }
    if spec.kind == "dense":
        from transformers import Qwen2Config

        return Qwen2Config(**common, layer_types=spec.layer_types)

    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(
        **common,
        head_dim=spec.head_dim,
        layer_types=spec.layer_types,
        linear_num_key_heads=spec.linear_num_key_heads,
        linear_num_value_heads=spec.linear_num_value_heads,
        linear_key_head_dim=spec.linear_key_head_dim,
        linear_value_head_dim=spec.linear_value_head_dim,
        linear_conv_kernel_dim=spec.linear_conv_kernel_dim,
        # vLLM's Qwen3NextForCausalLM refuses a model without MoE layers
        # ("No Qwen3Next layer found in the model.layers."): every layer gets a small MoE.
        mlp_only_layers=[],
        decoder_sparse_step=1,
        num_experts=spec.num_experts,
        num_experts_per_tok=spec.num_experts_per_tok,
        moe_intermediate_size=spec.moe_intermediate_size,
        shared_expert_intermediate_size=spec.moe_intermediate_size,
    )


def _build_hash(spec: TinyModelSpec, tokenizer_dir: Path) -> str:
    """sha256 over the build format, the spec's JSON and the tokenizer files' bytes."""
    digest = hashlib.sha256(f"residency-tiny-model/{BUILD_FORMAT_VERSION}\n".encode())
    digest.update(spec.model_dump_json().encode())
    for name in TOKENIZER_FILES:
        digest.update(f"\n{name}\n".encode())
        digest.update((tokenizer_dir / name).read_bytes())
    return digest.hexdigest()


def _special_token_ids(tokenizer_dir: Path) -> dict[str, int]:
    """Ids of the ChatML special tokens in the saved tokenizer."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    ids: dict[str, int] = {}
    for token in SPECIAL_TOKENS:
        token_id = tokenizer.token_to_id(token)
        if token_id is None:
            raise ValueError(f"tokenizer in {tokenizer_dir} lacks the special token {token}")
        ids[token] = token_id
    return ids


def _vocab_size(tokenizer_dir: Path) -> int:
    """The tokenizer's full vocabulary (added tokens included): the model's embedding rows."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    return int(tokenizer.get_vocab_size(with_added_tokens=True))
