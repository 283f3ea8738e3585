"""What stage 0's scheduler hands every stage for one step: plain data, JSON- and proto-friendly.

A micro-batch is a list of sequence chunks. There is no prefill phase nor decode phase: a chunk
is `num_tokens` tokens of one sequence starting at `start_position`; a prompt is one chunk or
several (chunked prefill), a decode step is a chunk of one. `sample` marks chunks whose last
token's successor is drawn on the last stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardline.sampling import SamplingParams


@dataclass
class SequenceChunk:
    request_id: str
    start_position: int
    num_tokens: int
    sample: bool
    sampling: SamplingParams | None = None

    def to_dict(self) -> dict:
        return {"request_id": self.request_id, "start_position": self.start_position,
                "num_tokens": self.num_tokens, "sample": self.sample,
                "sampling": self.sampling.to_dict() if self.sampling else None}

    @classmethod
    def from_dict(cls, d: dict) -> "SequenceChunk":
        s = d.get("sampling")
        return cls(d["request_id"], d["start_position"], d["num_tokens"], d["sample"],
                   SamplingParams.from_dict(s) if s else None)


@dataclass
class StageBatch:
    chunks: list[SequenceChunk] = field(default_factory=list)
    # Sequences finished or cancelled since the last batch: their KV blocks are freed first.
    free_request_ids: list[str] = field(default_factory=list)
    # Inspection only (tests, `logits` in pipeline.py): the last stage returns the logits of every
    # token [T, V] instead of sampled ids.
    return_logits: bool = False

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def sampled(self) -> list[SequenceChunk]:
        return [c for c in self.chunks if c.sample]

    def to_dict(self) -> dict:
        return {"chunks": [c.to_dict() for c in self.chunks], "free_request_ids": self.free_request_ids,
                "return_logits": self.return_logits}

    @classmethod
    def from_dict(cls, d: dict) -> "StageBatch":
        return cls([SequenceChunk.from_dict(c) for c in d["chunks"]], list(d["free_request_ids"]),
                   bool(d.get("return_logits", False)))
