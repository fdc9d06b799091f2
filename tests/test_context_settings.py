"""The question-to-context pipeline is built from its own settings: `ContextSettings` holds what a
`ContextBuilder` needs and nothing of the router (no upstreams, host or port); `residency serve`
derives one from its flags, field for field; the retriever is chosen by name through one public
function (a real BM25 index, no dense vectors)."""

from __future__ import annotations

from pathlib import Path

import pytest
from section_index import section_index
from test_top_sections import SECTIONS

from residency.context.pruner_settings import PrunerSettings
from residency.context.retriever import chunk_retriever
from residency.context.routing import RoutingSettings
from residency.context.settings import ContextSettings
from residency.errors import ConfigError
from residency.index import open_index
from residency.serve.settings import ServeSettings


def test_context_settings_hold_no_router_knob() -> None:
    assert set(ContextSettings.model_fields) == {"routing", "retriever", "pruner"}
    assert not set(ContextSettings.model_fields) & {"upstreams", "host", "port", "plan", "log"}


def test_each_context_field_is_the_serve_flag_with_one_default_and_one_help_text() -> None:
    for name, field in ContextSettings.model_fields.items():
        served = ServeSettings.model_fields[name]
        assert served.description == field.description, name
        assert served.get_default(call_default_factory=True) == field.get_default(
            call_default_factory=True
        ), name
    assert ServeSettings(plan=Path("plan.json")).context == ContextSettings()


def test_serve_settings_derive_every_context_knob() -> None:
    routing = RoutingSettings(k=3, margin=2, hedge=0, hops=2)
    pruner = PrunerSettings(url="http://127.0.0.1:8001", threshold=4, keep_top_k=1)
    served = ServeSettings(plan=Path("plan.json"), retriever="bm25", routing=routing, pruner=pruner)
    assert served.context == ContextSettings(retriever="bm25", routing=routing, pruner=pruner)


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("context-settings")
    section_index(root, SECTIONS, tokenizer_dir)
    return root / "index"


def test_chunk_retriever_searches_by_name_and_refuses_dense_without_vectors(
    index_dir: Path,
) -> None:
    index = open_index(index_dir)
    bm25 = chunk_retriever(index, "bm25")
    hits = bm25.search("fog horn", 3)
    assert 0 < len(hits) <= 3
    assert all(index.chunk(h.id).text for h in hits)  # chunk ids of this index
    with pytest.raises(ConfigError, match=r"--retriever dense: index .* without dense vectors"):
        chunk_retriever(index, "dense")
