"""Channels to stage-0 replicas: the Generate stream that admits a sequence, and a liveness probe."""

from __future__ import annotations

import grpc

from shardline.sampling import SamplingParams
from shardline.v1 import common_pb2, stage_pb2, stage_pb2_grpc


def sampling_to_wire(p: SamplingParams) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, seed=p.seed,
                                     max_tokens=p.max_tokens, stop_token_ids=list(p.stop_token_ids),
                                     ignore_eos=p.ignore_eos)


class StageChannels:
    """One channel per replica address, reused by every request routed there."""

    def __init__(self) -> None:
        self._stubs: dict[str, tuple[grpc.aio.Channel, stage_pb2_grpc.StageWorkerStub]] = {}

    def stub(self, address: str) -> stage_pb2_grpc.StageWorkerStub:
        if address not in self._stubs:
            channel = grpc.aio.insecure_channel(address)
            self._stubs[address] = (channel, stage_pb2_grpc.StageWorkerStub(channel))
        return self._stubs[address][1]

    def generate(self, address: str, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams,
                 downstream: list[str], generated_token_ids: list[int]):
        """Admit one sequence on stage 0 at `address`; returns the TokenEvent stream (a call object:
        iterate it, cancel() it to cancel the sequence along its route)."""
        return self.stub(address).Generate(stage_pb2.AdmitRequest(
            request_id=request_id, prompt_token_ids=prompt_token_ids, sampling=sampling_to_wire(sampling),
            route=downstream, generated_token_ids=generated_token_ids))

    async def is_alive(self, address: str, timeout_s: float) -> bool:
        try:
            status = await self.stub(address).GetStatus(stage_pb2.StatusRequest(), timeout=timeout_s)
        except grpc.aio.AioRpcError:
            return False
        return not status.is_draining

    async def forget(self, keep: set[str]) -> None:
        """Close the channels of replicas no longer in the registry."""
        for address in [a for a in self._stubs if a not in keep]:
            channel, _ = self._stubs.pop(address)
            await channel.close()

    async def close(self) -> None:
        await self.forget(set())
