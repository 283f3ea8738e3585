"""The stage worker's wire <-> plain-object conversions (proto messages to the engine's dataclasses)."""

from __future__ import annotations

from dataclasses import dataclass

from shardline.sampling import SamplingParams
from shardline.stage_worker.batch import SequenceChunk, StageBatch
from shardline.stage_worker.sequence import FinishReason
from shardline.v1 import common_pb2, stage_pb2

FINISH_TO_PROTO = {
    FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH,
    FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
    FinishReason.CANCELLED: common_pb2.FINISH_REASON_CANCELLED,
    FinishReason.ERROR: common_pb2.FINISH_REASON_ERROR,
}


@dataclass
class TokenEvent:
    request_id: str
    token_id: int | None
    index: int
    finish_reason: FinishReason | None = None
    error: str = ""

    def to_proto(self) -> stage_pb2.TokenEvent:
        msg = stage_pb2.TokenEvent(request_id=self.request_id, index=self.index, error=self.error)
        if self.token_id is not None:
            msg.token_id = self.token_id
        if self.finish_reason is not None:
            msg.finish_reason = FINISH_TO_PROTO[self.finish_reason]
        return msg


def sampling_from_proto(p: common_pb2.SamplingParams) -> SamplingParams:
    return SamplingParams(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p or 1.0, seed=p.seed,
                          max_tokens=p.max_tokens, stop_token_ids=tuple(p.stop_token_ids), ignore_eos=p.ignore_eos)


def sampling_to_proto(s: SamplingParams) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, seed=s.seed,
                                     max_tokens=s.max_tokens, stop_token_ids=list(s.stop_token_ids),
                                     ignore_eos=s.ignore_eos)


def batch_to_proto(batch: StageBatch) -> list[stage_pb2.SequenceChunk]:
    return [stage_pb2.SequenceChunk(request_id=c.request_id, start_position=c.start_position,
                                    num_tokens=c.num_tokens, sample=c.sample,
                                    sampling=sampling_to_proto(c.sampling) if c.sampling else None)
            for c in batch.chunks]


def batch_from_proto(chunks) -> StageBatch:
    return StageBatch([SequenceChunk(c.request_id, c.start_position, c.num_tokens, c.sample,
                                     sampling_from_proto(c.sampling) if c.sample else None) for c in chunks])
