"""The exception tree: every error a user can cause or meet, and nothing else.

    ResidencyError                      anything the CLI turns into one clean line (exit 1)
    ├── ConfigError                     a flag or setting out of range, or contradicting another
    ├── ProfileError                    unknown / malformed GPU or model profile, config.json
    ├── CorpusError                     unreadable corpus files, bad lines, duplicate ids
    ├── GpuError                        no NVIDIA driver / pynvml, too little free GPU memory,
    │                                   devices CUDA_VISIBLE_DEVICES does not show
    ├── BackendError                    a retrieval backend (Qdrant) that cannot be reached
    ├── JudgeError                      the LLM judge cannot be asked (eval/answers/judge.py)
    └── UpstreamError                   a vLLM server that cannot be reached or answers badly
        ├── UpstreamMismatchError       the server serves another model / tokenizer / length
        ├── RefusedError                vLLM answered 4xx/5xx (vllm_client/wire.py)
        └── ServerStartError            a server residency started did not come up (launcher.py)

    planner.errors.PlannerError         raised by the pure planner (which cannot import us)
    ├── ModelConfigError                a config.json lacks a field, or TP/PP cannot split it
    ├── CapacityError                   the model does not fit, or leaves no KV cache
    └── InfeasiblePlanError             a resident budget at or below zero, pins over the budget

Internal signals, caught where they are raised and never shown to a user as such:

    vllm_client.async_client.TransportError   the router's upstream call failed in transport
    ├── UnreachedError                        no connection (the upstream leaves rotation)
    └── AnswerTimeoutError                    connected, but no answer in time
    serve.validation.RequestError             a client request the router refuses (4xx body)
    serve.upstreams.NoUpstreamError           every upstream is out of rotation (503)
    serve.guard.ClientGoneError               the client left mid-body (logged, no traceback)
    context.pruner.InvalidReplyError          the pruner model's reply is not the JSON asked for
    warm.watch._ServerDownError               `warm --watch` waits the restart out
    vllm_client.kv_wire.KvEventsError         a payload that is not a KV event batch (the
                                              subscriber counts, logs and skips it)
    serve.drain.DrainExpiredError             --shutdown-timeout passed mid-request (a 503)

`USER_ERRORS` is the tuple of both roots: what the CLI reports as one line.
Messages say what failed, the numbers on both sides, the best feasible value where there is one,
and the flag to change. Bugs are not ResidencyErrors: they keep their tracebacks.
"""

from __future__ import annotations

from planner.errors import CapacityError, InfeasiblePlanError, PlannerError


class ResidencyError(Exception):
    """Base of every error the CLI reports as one line."""


class ConfigError(ResidencyError):
    """A flag or setting is out of range or contradicts another one."""


class ProfileError(ResidencyError):
    """A GPU or model profile, or a model's config.json, is unknown or malformed."""


class CorpusError(ResidencyError):
    """Corpus files cannot be read or hold invalid records."""


class GpuError(ResidencyError):
    """The live GPU cannot be read (no NVIDIA driver, no pynvml)."""


class BackendError(ResidencyError):
    """A retrieval backend (a Qdrant server or local path) cannot be reached or opened."""


class UpstreamError(ResidencyError):
    """A vLLM server cannot be reached or answers something unexpected."""


class UpstreamMismatchError(UpstreamError):
    """The server serves another model, tokenizer or max_model_len than expected."""


USER_ERRORS: tuple[type[Exception], ...] = (ResidencyError, PlannerError)

__all__ = [
    "USER_ERRORS",
    "BackendError",
    "CapacityError",
    "ConfigError",
    "CorpusError",
    "GpuError",
    "InfeasiblePlanError",
    "PlannerError",
    "ProfileError",
    "ResidencyError",
    "UpstreamError",
    "UpstreamMismatchError",
]
