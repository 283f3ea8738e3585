"""What the SDK returns: plain dataclasses, no protobuf. Shared by Client and AsyncClient, along
with the request building and response conversion both need."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from shardline.v1 import common_pb2, gateway_pb2

from .errors import error_from_code

FINISH_REASONS = {common_pb2.FINISH_REASON_UNSPECIFIED: "", common_pb2.FINISH_REASON_LENGTH: "length",
                  common_pb2.FINISH_REASON_STOP: "stop", common_pb2.FINISH_REASON_CANCELLED: "cancelled",
                  common_pb2.FINISH_REASON_ERROR: "error"}
STATES = {gateway_pb2.REQUEST_STATE_UNSPECIFIED: "", gateway_pb2.REQUEST_STATE_QUEUED: "queued",
          gateway_pb2.REQUEST_STATE_RUNNING: "running", gateway_pb2.REQUEST_STATE_FINISHED: "finished",
          gateway_pb2.REQUEST_STATE_CANCELLED: "cancelled", gateway_pb2.REQUEST_STATE_FAILED: "failed"}


@dataclass(frozen=True)
class Delta:
    """New text and the token ids it came from (text may be empty while text is held back)."""
    text: str
    token_ids: list[int]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


@dataclass(frozen=True)
class Timings:
    """As measured by the gateway, from the moment it accepted the request."""
    queue_s: float = 0.0
    time_to_first_token_s: float = 0.0
    total_s: float = 0.0
    decode_tokens_per_s: float = 0.0


@dataclass(frozen=True)
class GenerateResult:
    request_id: str
    model: str
    text: str
    token_ids: list[int]  # generated only, not the prompt
    finish_reason: str  # "length" | "stop" | "cancelled"
    matched_stop: str = ""
    usage: Usage = field(default_factory=Usage)
    timings: Timings = field(default_factory=Timings)
    client_total_s: float = 0.0  # wall time seen by this client, retries included

    @property
    def time_to_first_token_s(self) -> float:
        return self.timings.time_to_first_token_s

    @property
    def total_s(self) -> float:
        return self.timings.total_s


@dataclass(frozen=True)
class RequestInfo:
    request_id: str
    model: str
    state: str  # "queued" | "running" | "finished" | "cancelled" | "failed"
    route: list[str]
    num_prompt_tokens: int
    num_generated_tokens: int
    num_resumes: int
    queued_at: float
    first_token_at: float
    finished_at: float
    finish_reason: str
    error: str


@dataclass(frozen=True)
class ModelInfo:
    name: str
    architecture: str
    max_model_len: int
    num_stages: int
    tp_size: int
    num_routes: int


def build_request(prompt: str | Sequence[int] | Sequence[dict], *, model: str = "", max_tokens: int | None = None,
                  temperature: float | None = None, top_k: int = 0, top_p: float | None = None,
                  seed: int | None = None, stop: Sequence[str] = (), stop_token_ids: Sequence[int] = (),
                  ignore_eos: bool = False, request_id: str | None = None) -> gateway_pb2.GenerateRequest:
    """prompt: text, token ids, or chat messages ([{"role": ..., "content": ...}]). The request id is
    chosen here when not given, so that retries reuse it. A value the wire cannot carry (a negative
    seed, an id past int32, a string for a number) raises ValueError naming the parameter; the
    gateway checks the rest and answers INVALID_ARGUMENT."""
    r = gateway_pb2.GenerateRequest(request_id=request_id or uuid.uuid4().hex)
    for name, value in (("model", model), ("top_k", top_k), ("ignore_eos", ignore_eos), ("max_tokens", max_tokens),
                        ("temperature", temperature), ("top_p", top_p), ("seed", seed)):
        if value is not None:
            _on_wire(name, value, lambda: setattr(r, name, value))
    _on_wire("stop", stop, lambda: r.stop.extend(stop))
    _on_wire("stop_token_ids", stop_token_ids, lambda: r.stop_token_ids.extend(stop_token_ids))
    if isinstance(prompt, str):
        r.prompt_text = prompt
    elif prompt and all(isinstance(m, dict) for m in prompt):
        r.chat.messages.extend(common_pb2.ChatMessage(role=m["role"], content=m.get("content", "")) for m in prompt)
    elif all(isinstance(t, int) for t in prompt):
        _on_wire("prompt token ids", prompt, lambda: r.prompt_token_ids.ids.extend(prompt))
        if not prompt:
            r.prompt_token_ids.SetInParent()  # an empty id list is still "this form": the server names it
    else:
        raise TypeError("prompt must be a str, a list of token ids, or a list of {'role', 'content'} messages")
    return r


_WIRE_FORMS = {"model": "a str", "top_k": "an int (0 = off)", "ignore_eos": "a bool", "max_tokens": "a positive int",
               "temperature": "a number", "top_p": "a number in (0, 1]", "seed": "an int in 0..2**63-1",
               "stop": "a list of str", "stop_token_ids": "a list of token ids (int32)",
               "prompt token ids": "a list of token ids (int32)"}


def _on_wire(name: str, value, put) -> None:
    """Run put(), which writes `value` into a protobuf field, turning protobuf's range and type
    errors (which do not say which field) into a ValueError that does."""
    try:
        put()
    except (ValueError, TypeError) as e:
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        raise ValueError(f"{name} must be {_WIRE_FORMS[name]}; got {shown} ({e})") from None


def usage_from_wire(u: common_pb2.Usage) -> Usage:
    return Usage(u.prompt_tokens, u.completion_tokens, u.total_tokens)


def timings_from_wire(t: common_pb2.Timings) -> Timings:
    return Timings(t.queue_seconds, t.time_to_first_token_seconds, t.total_seconds, t.decode_tokens_per_second)


def result_from_wire(r: gateway_pb2.GenerateResponse, client_total_s: float) -> GenerateResult:
    return GenerateResult(request_id=r.request_id, model=r.model, text=r.text, token_ids=list(r.token_ids),
                          finish_reason=FINISH_REASONS.get(r.finish_reason, ""), matched_stop=r.matched_stop,
                          usage=usage_from_wire(r.usage), timings=timings_from_wire(r.timings),
                          client_total_s=client_total_s)


def request_info_from_wire(s: gateway_pb2.RequestStatus) -> RequestInfo:
    return RequestInfo(request_id=s.request_id, model=s.model, state=STATES.get(s.state, ""), route=list(s.route),
                       num_prompt_tokens=s.num_prompt_tokens, num_generated_tokens=s.num_generated_tokens,
                       num_resumes=s.num_resumes, queued_at=s.queued_at, first_token_at=s.first_token_at,
                       finished_at=s.finished_at, finish_reason=FINISH_REASONS.get(s.finish_reason, ""),
                       error=s.error)


def models_from_wire(r: gateway_pb2.ListModelsResponse) -> list[ModelInfo]:
    return [ModelInfo(m.name, m.architecture, m.max_model_len, m.num_stages, m.tp_size, m.num_routes)
            for m in r.models]


class StreamState:
    """What a stream has received so far, and how one GenerateStream message updates it: shared by
    the sync and asyncio streams, which differ only in how they wait."""

    def __init__(self, request) -> None:
        self._request = request
        self.request_id = request.request_id
        self.text, self.token_ids = "", []
        self.finish_reason, self.matched_stop = "", ""
        self.usage, self.timings = Usage(), Timings()

    def _apply(self, message) -> Delta | None:
        """A chunk -> its Delta; a complete -> None (the stream is done); an error -> raised."""
        event = message.WhichOneof("event")
        if event == "chunk":
            self.text += message.chunk.text
            self.token_ids.extend(message.chunk.token_ids)
            return Delta(message.chunk.text, list(message.chunk.token_ids))
        if event == "complete":
            c = message.complete
            self.finish_reason = FINISH_REASONS.get(c.finish_reason, "")
            self.matched_stop = c.matched_stop
            self.usage, self.timings = usage_from_wire(c.usage), timings_from_wire(c.timings)
            return None
        raise error_from_code(message.error.code, message.error.message, self.request_id)

    def _result(self) -> GenerateResult:
        return GenerateResult(self.request_id, self._request.model, self.text, list(self.token_ids),
                              self.finish_reason, self.matched_stop, self.usage, self.timings)
