"""A sequence as stage 0's scheduler sees it: tokens so far and how many the cache already holds."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from shardline.sampling import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.Enum):
    LENGTH = "length"
    STOP = "stop"
    CANCELLED = "cancelled"
    ERROR = "error"


def attempt_key(request_id: str, attempt: str) -> str:
    """What stage 0 names one attempt of a request by, in its scheduler, its KV cache and down the
    route. A request id alone is not unique there: the gateway resumes a request with the same id,
    perhaps through the same replicas, while the old attempt's micro-batches are still on their
    way. "#" is not in the gateway's request-id alphabet."""
    return f"{request_id}#{attempt}"


def client_id(key: str) -> str:
    """The request id of an attempt key (a plain request id is its own)."""
    return key.rsplit("#", 1)[0]


@dataclass
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    eos_token_ids: tuple[int, ...] = ()
    # Tokens generated before this sequence came here (resume after a replica failure): they are
    # recomputed like the prompt, and count against max_tokens.
    output_token_ids: list[int] = field(default_factory=list)
    # Replica addresses of stages 1..p-1 (empty with one stage): the sequence's KV cache lives
    # there, so every micro-batch holding it goes down this route.
    route: tuple[str, ...] = ()
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    error: str | None = None
    # Tokens whose k/v are in the cache, or scheduled into it by an in-flight micro-batch.
    num_computed_tokens: int = 0
    # Tokens sampled by launched steps whose values have not come back yet. More than one only
    # with lookahead (overlapped decode), where the next step reads them on the device.
    num_pending: int = 0

    def __post_init__(self) -> None:
        stops = set(self.sampling.stop_token_ids)
        if not self.sampling.ignore_eos:
            stops.update(self.eos_token_ids)
        self._stop_ids = frozenset(stops)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def in_flight(self) -> bool:
        """A step that samples this sequence's next token is still running."""
        return self.num_pending > 0

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        """Record a sampled token and decide whether the sequence is done."""
        self.output_token_ids.append(token_id)
        if token_id in self._stop_ids:
            self.finish(FinishReason.STOP)
        elif len(self.output_token_ids) >= self.sampling.max_tokens:
            self.finish(FinishReason.LENGTH)

    def finish(self, reason: FinishReason, error: str | None = None) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.error = error
