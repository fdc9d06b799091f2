"""Tiny random-weight models for tests and demos: a local BPE tokenizer and Qwen configs, no hub.

A real vLLM server needs a real model directory. These are built here from nothing but the
project's own corpus text: a byte-level BPE tokenizer (HF `tokenizers`, Qwen2's NFC + regex
pre-tokenizer) with ChatML special tokens and chat template, and a transformers config whose
weights are drawn at random with a fixed seed. Two architectures cover what the capacity
planner must agree with vLLM on:

* ``dense``  — ``Qwen2ForCausalLM``: every layer is full attention (GQA / MQA by kv heads).
* ``hybrid`` — ``Qwen3NextForCausalLM``: Gated DeltaNet (linear attention, a fixed-size state)
  with one full-attention layer every ``full_attention_interval`` layers, text-only. (Qwen3.5's
  multimodal class cannot load beside the CPU torch build; its GDN layers are the same.)

On vLLM's CPU backend the attention head size must be a supported kernel size: 32 fails
("Unexpected head dim size"), 64 and 128 work.

Build directories are content-addressed: ``residency-tiny-model.json`` holds a hash of the spec
and the tokenizer files, and an identical build is skipped.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from residency.errors import CorpusError

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (ENDOFTEXT, IM_START, IM_END)

# ChatML, as Qwen models use it; a message's content may also arrive as OpenAI text parts.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# transformers/models/qwen2/tokenization_qwen2.py: PRETOKENIZE_REGEX
QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CORPUS_SUFFIXES: tuple[str, ...] = (".md", ".txt", ".jsonl")
STAMP_FILE = "residency-tiny-model.json"
TOKENIZER_FILES: tuple[str, ...] = ("tokenizer.json", "tokenizer_config.json")
# Bump when the build itself changes, so cached directories are rebuilt.
BUILD_FORMAT_VERSION = 2


_Count = Annotated[int, Field(ge=1, le=128)]
_Width = Annotated[int, Field(ge=16, le=32768)]


class TinyModelSpec(BaseModel):
    """The shape of one tiny random-weight model; its JSON is part of the build hash."""

    model_config = ConfigDict(frozen=True, extra="forbid")

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


# The Japanese sample corpus only: the English twin (corpora/harbor-lights-en) is served by the
# real model, and leaving it out keeps the tiny tokenizer (and every cached tiny model) as built.
TOKENIZER_CORPUS = Path("corpora") / "harbor-lights"


def corpus_texts(root: Path) -> list[str]:
    """Return the text of every .md, .txt and .jsonl (text, title) file under
    root/corpora/harbor-lights."""
    corpora = root / TOKENIZER_CORPUS
    files = sorted(
        p for p in corpora.rglob("*") if p.is_file() and p.suffix.lower() in CORPUS_SUFFIXES
    )
    texts: list[str] = []
    for path in files:
        try:
            raw = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CorpusError(f"cannot read corpus file {path}: {exc}") from exc
        if path.suffix.lower() != ".jsonl":
            if raw.strip():
                texts.append(raw)
            continue
        for line_no, line in enumerate(raw.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                # A file being appended right now may end in a partial line: skip it.
                continue
            if not isinstance(record, dict):
                raise CorpusError(f"{path}:{line_no}: expected a JSON object per line")
            texts.extend(
                value
                for key in ("title", "text")
                if isinstance(value := record.get(key), str) and value.strip()
            )
    if not texts:
        raise CorpusError(
            f"no corpus text under {corpora} (looked for {', '.join(CORPUS_SUFFIXES)} files); "
            "add the sample corpus there before building a tiny model"
        )
    return texts


def train_tokenizer(texts: Iterable[str], out_dir: Path, vocab_size: int = 8000) -> Path:
    """Train a byte-level BPE tokenizer with ChatML special tokens; save it transformers-style."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    # Qwen2's own pipeline, exactly: transformers 5 loads a model dir whose config says qwen2 /
    # qwen3_next as Qwen2Tokenizer, which rebuilds normalizer and pre-tokenizer itself and
    # ignores tokenizer.json's. Any other pipeline would make vLLM's ids differ from ours.
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        # All 256 byte symbols: any UTF-8 text (Japanese included) encodes and round-trips.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(texts), trainer=trainer)

    special_ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "additional_special_tokens": [IM_START, IM_END],
        "added_tokens_decoder": {
            str(token_id): {
                "content": token,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for token, token_id in special_ids.items()
        },
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1_048_576,
        "chat_template": CHAT_TEMPLATE,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_atomic(out_dir / "tokenizer.json", tokenizer.to_str(pretty=True))
    _write_atomic(out_dir / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")
    return out_dir


def build_tiny_model(spec: TinyModelSpec, out_dir: Path, tokenizer_dir: Path) -> Path:
    """Write a random-weight model dir (config, safetensors, tokenizer); skip if already built."""
    build_hash = _build_hash(spec, tokenizer_dir)
    if _stamp_hash(out_dir) == build_hash:
        return out_dir

    import torch
    from transformers import AutoModelForCausalLM

    special_ids = _special_token_ids(tokenizer_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.build-", dir=out_dir.parent))
    try:
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
        stamp = {"build_hash": build_hash, "spec": spec.model_dump(mode="json")}
        (staging / STAMP_FILE).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
        _replace_dir(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
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


def _stamp_hash(out_dir: Path) -> str | None:
    """The build hash recorded in out_dir, or None when there is no complete build."""
    try:
        stamp = json.loads((out_dir / STAMP_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    value = stamp.get("build_hash") if isinstance(stamp, dict) else None
    return value if isinstance(value, str) else None


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


def _write_atomic(path: Path, text: str) -> None:
    """Write text to path through a temp file in the same folder and a rename."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def _replace_dir(staging: Path, out_dir: Path) -> None:
    """Move staging to out_dir, swapping out any older build (a dir cannot be os.replace'd)."""
    old: Path | None = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        out_dir.rename(old)
    try:
        staging.rename(out_dir)
    except OSError:
        # Another process finished the same build first: keep its directory.
        if _stamp_hash(out_dir) is None:
            raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Build a tokenizer from the repository corpus and a tiny model into OUT_DIR."""
    parser = argparse.ArgumentParser(prog="python -m residency.tiny_model", description=__doc__)
    parser.add_argument("out_dir", type=Path, help="model directory to write")
    parser.add_argument("--kind", choices=["dense", "hybrid"], default="dense")
    parser.add_argument("--spec-json", help="TinyModelSpec fields as JSON (overrides --kind)")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="repository root")
    args = parser.parse_args(argv)
    if args.spec_json:
        spec = TinyModelSpec.model_validate_json(args.spec_json)
    else:
        spec = DENSE_SPEC if args.kind == "dense" else HYBRID_SPEC
    out_dir: Path = args.out_dir
    tokenizer_dir = out_dir.with_name(f"{out_dir.name}.tokenizer")
    try:
        train_tokenizer(corpus_texts(args.root), tokenizer_dir)
    except CorpusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(build_tiny_model(spec, out_dir, tokenizer_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def ensure_tokenizer(root: Path, cache_dir: Path) -> Path:
    """The tokenizer trained on `root`'s corpora/, cached under `cache_dir` by the text's hash."""
    texts = corpus_texts(root)
    digest = hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16]
    out_dir = cache_dir / f"tokenizer-{digest}"
    if not (out_dir / "tokenizer_config.json").is_file():
        train_tokenizer(texts, out_dir)
    return out_dir
