"""GPU and model profiles (TOML files, package data under `residency/data/profiles/`) and local
model directories."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from planner.errors import ModelConfigError
from planner.model_spec import ModelSpec, model_spec_from_hf_config
from residency.capacity.defaults import DEFAULT_MODEL as DEFAULT_MODEL  # re-exported
from residency.capacity.defaults import DEFAULT_PROFILE as DEFAULT_PROFILE  # re-exported
from residency.errors import ProfileError
from residency.paths import data_root

PROFILES_ENV = "RESIDENCY_PROFILES_DIR"


def profiles_dir() -> Path:
    """`$RESIDENCY_PROFILES_DIR`, else the profiles the package ships."""
    override = os.environ.get(PROFILES_ENV)
    return Path(override) if override else data_root() / "profiles"


class GpuProfile(BaseModel):
    """Facts of one GPU model (profiles/gpus/*.toml)."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    name: str = Field(description="Profile name, the file stem.")
    display_name: str = Field(description="Marketing name.")
    total_memory_bytes: int = Field(ge=1, description="Device memory as CUDA reports it.")
    compute_capability: str | None = Field(default=None, description="e.g. 8.9.")
    fp8_native: bool = Field(default=False, description="Hardware FP8 support.")
    source: str = Field(default="", description="Where the facts come from.")


class ModelProfile(BaseModel):
    """A model's config facts and weights size (profiles/models/*.toml)."""

    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)

    name: str = Field(description="Profile name, the file stem.")
    hf_repo: str = Field(description="Hugging Face repository id.")
    weights_bytes: int = Field(ge=1, description="Size of the safetensors weights, bytes.")
    weights_source: str = Field(default="", description="Where weights_bytes comes from.")
    config_source: str = Field(default="", description="Where the config facts come from.")
    config: dict[str, Any] = Field(description="Verbatim subset of the repo's config.json.")


class ResolvedModel(BaseModel):
    """A model as the planner sees it, with where each fact came from."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    name: str = Field(description="Profile name or local path.")
    spec: ModelSpec = Field(description="Facts from config.json.")
    weights_bytes: int | None = Field(default=None, ge=1, description="Weights size, bytes.")
    weights_source: str = Field(description="Where the weights size comes from.")
    config_source: str = Field(description="Where the config facts come from.")


def _names(kind: str) -> list[str]:
    return sorted(p.stem for p in (profiles_dir() / kind).glob("*.toml"))


def _load_toml(kind: str, name: str) -> dict[str, Any]:
    path = profiles_dir() / kind / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(_names(kind)) or "none"
        flag = "--profile" if kind == "gpus" else "--model"
        raise ProfileError(f"unknown {kind[:-1]} profile {name!r} for {flag}; known: {known}")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: not valid TOML ({exc})") from None


def load_gpu_profile(name: str) -> GpuProfile:
    """Read profiles/gpus/NAME.toml."""
    try:
        return GpuProfile.model_validate(_load_toml("gpus", name))
    except ValidationError as exc:
        raise ProfileError(f"GPU profile {name!r} is malformed: {_first_error(exc)}") from None


def gpu_profile_names() -> list[str]:
    """Names of the shipped GPU profiles."""
    return _names("gpus")


def model_profile_names() -> list[str]:
    """Names of the shipped model profiles."""
    return _names("models")


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "value"
    return f"{where}: {err['msg']}"


def _spec(config: dict[str, Any], where: str) -> ModelSpec:
    try:
        return model_spec_from_hf_config(config)
    except ModelConfigError as exc:
        raise ProfileError(f"{where}: {exc}") from None
    except ValidationError as exc:
        raise ProfileError(f"{where}: {_first_error(exc)}") from None


def read_config_json(path: Path) -> dict[str, Any]:
    """Parse a config.json; `ProfileError` with the file name when it is not a JSON object."""
    try:
        data = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise ProfileError(f"cannot read {path}: {exc.strerror}") from None
    except orjson.JSONDecodeError as exc:
        raise ProfileError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def safetensors_bytes(model_dir: Path) -> int | None:
    """Total size of the *.safetensors files in a model directory (None when there are none)."""
    files = list(model_dir.glob("*.safetensors"))
    return sum(f.stat().st_size for f in files) if files else None


def resolve_model(ref: str) -> ResolvedModel:
    """`--model`: a local HF model directory, a config.json file, or a profile name."""
    path = Path(ref).expanduser()
    if path.is_dir() or path.suffix == ".json" or os.sep in ref:
        config_path = path / "config.json" if path.is_dir() else path
        if not config_path.is_file():
            raise ProfileError(f"--model {ref}: no config.json at {config_path}")
        config = read_config_json(config_path)
        weights = safetensors_bytes(config_path.parent)
        return ResolvedModel(
            name=str(path),
            spec=_spec(config, str(config_path)),
            weights_bytes=weights,
            weights_source=f"safetensors files in {config_path.parent}"
            if weights
            else "none: no *.safetensors beside config.json",
            config_source=str(config_path),
        )
    raw = _load_toml("models", ref)
    try:
        profile = ModelProfile.model_validate(raw)
    except ValidationError as exc:
        raise ProfileError(f"model profile {ref!r} is malformed: {_first_error(exc)}") from None
    return ResolvedModel(
        name=profile.name,
        spec=_spec(profile.config, f"model profile {ref!r}"),
        weights_bytes=profile.weights_bytes,
        weights_source=f"profile {profile.name}: {profile.weights_source}".rstrip(": "),
        config_source=profile.config_source or f"profile {profile.name}",
    )
