"""The tiny models' tokenizer, trained here on the project's own corpus: byte-level BPE with
Qwen2's NFC + regex pre-tokenizer, ChatML special tokens and chat template (no hub).

The pipeline is Qwen2's exactly: transformers 5 loads a model directory whose config says qwen2 /
qwen3_next as Qwen2Tokenizer, which rebuilds normalizer and pre-tokenizer itself and ignores
tokenizer.json's, so any other pipeline would make vLLM's ids differ from ours. Trained
tokenizers are cached by a hash of the corpus text (`ensure_tokenizer`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from residency.atomic import write_bytes_atomic
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
TOKENIZER_FILES: tuple[str, ...] = ("tokenizer.json", "tokenizer_config.json")


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
    write_bytes_atomic(out_dir / "tokenizer.json", tokenizer.to_str(pretty=True).encode())
    config_json = json.dumps(config, indent=2) + "\n"
    write_bytes_atomic(out_dir / "tokenizer_config.json", config_json.encode())
    return out_dir


def ensure_tokenizer(root: Path, cache_dir: Path) -> Path:
    """The tokenizer trained on `root`'s corpora/, cached under `cache_dir` by the text's hash."""
    texts = corpus_texts(root)
    digest = hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16]
    out_dir = cache_dir / f"tokenizer-{digest}"
    if not (out_dir / "tokenizer_config.json").is_file():
        train_tokenizer(texts, out_dir)
    return out_dir
