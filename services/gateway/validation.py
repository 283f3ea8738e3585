"""Request validation, in two steps: field ranges before any work, context fit once the prompt is
tokenized. Absolute ranges (temperature, top_k, ...) are INVALID_ARGUMENT; limits that depend on
the model (prompt + max_tokens beyond its context) are OUT_OF_RANGE. Every message names the field
and its limits. The sampling ranges themselves live in shardline.sampling.SamplingParams.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from shardline.sampling import SamplingParams

from .errors import InvalidArgument, OutOfRange

MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_SEED = (1 << 63) - 1
REQUEST_ID_PATTERN = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


@dataclass
class GenerateInput:
    """A generate request as the gateway's plain object sees it (no protobuf, no HTTP)."""
    model: str = ""
    prompt_text: str | None = None
    prompt_token_ids: list[int] | None = None
    chat: list[dict] | None = None  # [{"role": ..., "content": ...}]
    max_tokens: int | None = None
    temperature: float | None = None
    top_k: int = 0
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    request_id: str = ""


def check_fields(req: GenerateInput) -> None:
    """Everything that can be checked without the model: raises InvalidArgument."""
    forms = [f for f, v in (("prompt_text", req.prompt_text), ("prompt_token_ids", req.prompt_token_ids),
                            ("chat", req.chat)) if v is not None]
    if len(forms) > 1:
        raise InvalidArgument(f"give exactly one prompt form; got {', '.join(forms)}")
    if not forms or (req.prompt_text is not None and req.prompt_text == "") \
            or (req.prompt_token_ids is not None and not req.prompt_token_ids) \
            or (req.chat is not None and not req.chat):
        raise InvalidArgument("prompt is empty: set prompt_text, prompt_token_ids or chat (at least one token)")
    if req.max_tokens is not None and req.max_tokens < 1:
        raise InvalidArgument(f"max_tokens {req.max_tokens} must be >= 1 (and prompt + max_tokens "
                              "within the model's context)")
    if req.seed is not None and not 0 <= req.seed <= MAX_SEED:
        raise InvalidArgument(f"seed {req.seed} is out of range; use 0..{MAX_SEED}")
    if len(req.stop) > MAX_STOP_STRINGS:
        raise InvalidArgument(f"stop has {len(req.stop)} strings; at most {MAX_STOP_STRINGS} are allowed")
    for i, s in enumerate(req.stop):
        if not s or len(s) > MAX_STOP_STRING_CHARS:
            raise InvalidArgument(f"stop[{i}] must be 1..{MAX_STOP_STRING_CHARS} characters long")
    if req.request_id:
        check_request_id(req.request_id)
    sampling_params(req, max_tokens=1)  # the sampling ranges, before any work is done


def check_request_id(request_id: str) -> None:
    if not request_id:
        raise InvalidArgument("request_id is empty; give the id that Generate returned (or that you chose)")
    if not REQUEST_ID_PATTERN.match(request_id):
        raise InvalidArgument(f"request_id {request_id[:200]!r} must be 1..128 characters of letters, digits "
                              "and ._:-")


def sampling_params(req: GenerateInput, max_tokens: int, seed: int | None = None) -> SamplingParams:
    """Resolve defaults (temperature 1, top_p 1) and check ranges through SamplingParams."""
    try:
        return SamplingParams(
            temperature=1.0 if req.temperature is None else float(req.temperature), top_k=req.top_k,
            top_p=1.0 if req.top_p is None else float(req.top_p),
            seed=0 if seed is None else seed, max_tokens=max_tokens,
            stop_token_ids=tuple(req.stop_token_ids), ignore_eos=req.ignore_eos)
    except ValueError as e:
        raise InvalidArgument(str(e)) from e


def check_token_ids(ids: list[int], vocab_size: int, what: str) -> None:
    for i, t in enumerate(ids):
        if not 0 <= t < vocab_size:
            raise InvalidArgument(f"{what}[{i}] = {t} is outside the vocabulary; ids must be in 0..{vocab_size - 1}")


def fit_context(req: GenerateInput, num_prompt_tokens: int, max_model_len: int, default_max_tokens: int) -> int:
    """max_tokens for this request, checked against the context (0 = unknown: no context check)."""
    if max_model_len <= 0:
        return req.max_tokens if req.max_tokens is not None else default_max_tokens
    room = max_model_len - num_prompt_tokens
    if room < 1:
        raise OutOfRange(f"prompt has {num_prompt_tokens} tokens but the model's context is {max_model_len}; "
                         f"shorten the prompt to at most {max_model_len - 1} tokens")
    if req.max_tokens is None:
        return min(default_max_tokens, room)
    if req.max_tokens > max_model_len:
        raise OutOfRange(f"max_tokens {req.max_tokens} exceeds the model's context of {max_model_len} "
                         f"tokens; use 1..{room} with this {num_prompt_tokens}-token prompt")
    if req.max_tokens > room:
        raise OutOfRange(f"prompt ({num_prompt_tokens} tokens) + max_tokens ({req.max_tokens}) = "
                         f"{num_prompt_tokens + req.max_tokens} exceeds the model's context of "
                         f"{max_model_len}; use max_tokens <= {room} or a shorter prompt")
    return req.max_tokens


def resolve_sampling(req: GenerateInput, max_tokens: int) -> SamplingParams:
    """The final SamplingParams; a request without a seed gets one now, so that a resume after a
    failover draws exactly what the first route would have drawn."""
    seed = req.seed if req.seed is not None else random.getrandbits(31)
    return sampling_params(req, max_tokens, seed)
