"""Stage workers as real processes over real gRPC: PP=2 x TP=2, routes wired by hand. On CPU the
ranks talk over gloo; with two or more GPUs the same tests run again on CUDA, where the ranks talk
over NCCL (rank r on GPU r) and decode steps replay CUDA graphs with the all-reduces inside.

This is the per-token loop of the design without the gateway: stage 0 schedules, activations go
to stage 1 as raw bytes, stage 1 samples and returns tokens to stage 0, which streams them.
"""

from __future__ import annotations

import concurrent.futures as cf
import time

import grpc
import pytest
import torch

from shardline.config import EngineConfig
from shardline.launcher import ClusterConfig, LocalCluster
from shardline.registry import Registry
from shardline.sampling import SamplingParams
from shardline.stage_worker.pipeline import generate_local
from shardline.stage_worker.convert import sampling_to_proto
from shardline.v1 import common_pb2, stage_pb2, stage_pb2_grpc

pytestmark = pytest.mark.slow

PROMPTS = [[1, 5, 9, 13], [1] + list(range(20, 45)), [2, 3], [7] * 9]


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def cluster(request, tmp_path_factory):
    if request.param == "cuda" and torch.cuda.device_count() < 2:
        pytest.skip("NCCL tensor parallelism needs two GPUs (one per rank); the CPU run covers the logic over gloo")
    config = ClusterConfig(tp=2, pp=2, with_gateway=False, num_blocks=64, device=request.param,
                           workdir=str(tmp_path_factory.mktemp("cluster")))
    with LocalCluster(config) as c:
        yield c


def stub(address: str) -> stage_pb2_grpc.StageWorkerStub:
    return stage_pb2_grpc.StageWorkerStub(grpc.insecure_channel(address))


def generate(cluster, rid: str, prompt: list[int], sampling: SamplingParams) -> list[int]:
    req = stage_pb2.AdmitRequest(request_id=rid, prompt_token_ids=prompt, sampling=sampling_to_proto(sampling),
                                 route=[cluster.stage_addresses[1][0]])
    events = list(stub(cluster.stage_addresses[0][0]).Generate(req, timeout=120))
    assert [e.index for e in events] == list(range(len(events))), "token indices must have no gap or duplicate"
    assert events[-1].finish_reason != common_pb2.FINISH_REASON_ERROR, events[-1].error
    return [e.token_id for e in events if e.HasField("token_id")]


def wait_all_free(cluster, timeout_s: float = 20.0) -> list[stage_pb2.StageStatus]:
    deadline = time.monotonic() + timeout_s
    while True:
        statuses = [stub(a[0]).GetStatus(stage_pb2.StatusRequest(), timeout=5) for a in cluster.stage_addresses]
        if all(s.num_free_blocks == s.num_total_blocks and not s.running_request_ids for s in statuses):
            return statuses
        if time.monotonic() > deadline:
            raise AssertionError(f"KV blocks not freed on every stage: {statuses}")
        time.sleep(0.1)


def test_matches_the_local_engine(cluster):
    sampling = SamplingParams(max_tokens=12, ignore_eos=True)
    # The reference is the in-process engine on the CPU, in fp32 like the cluster (on the GPU
    # run too: the GPU's fp32 greedy tokens match it on this model).
    want = generate_local(cluster.model_dir, PROMPTS, sampling, EngineConfig(num_blocks=64))
    got = [generate(cluster, f"m{i}", p, sampling) for i, p in enumerate(PROMPTS)]
    assert got == want, "the distributed pipeline must produce the engine's tokens"
    wait_all_free(cluster)


def test_32_concurrent_streams_equal_one_at_a_time(cluster):
    sampling = SamplingParams(max_tokens=10, temperature=0.8, seed=11, ignore_eos=True)
    prompts = [PROMPTS[i % len(PROMPTS)] + [i + 3] for i in range(32)]
    alone = [generate(cluster, f"a{i}", p, sampling) for i, p in enumerate(prompts[:4])]
    with cf.ThreadPoolExecutor(32) as pool:
        together = list(pool.map(lambda ip: generate(cluster, f"c{ip[0]}", ip[1], sampling), enumerate(prompts)))
    assert together[:4] == alone
    again = [generate(cluster, f"b{i}", p, sampling) for i, p in enumerate(prompts[4:12], start=4)]
    assert together[4:12] == again
    statuses = wait_all_free(cluster)
    assert statuses[0].counters.num_steps > 0 and statuses[1].counters.num_steps > 0
    assert statuses[0].counters.max_micro_batches_in_flight == 2, \
        "with PP=2, stage 0 should keep two micro-batches in flight so both stages work at once"


def test_cancel_mid_stream_frees_kv_on_every_stage(cluster):
    req = stage_pb2.AdmitRequest(request_id="cancel-me", prompt_token_ids=PROMPTS[1],
                                 sampling=sampling_to_proto(SamplingParams(max_tokens=200, ignore_eos=True)),
                                 route=[cluster.stage_addresses[1][0]])
    call = stub(cluster.stage_addresses[0][0]).Generate(req, timeout=120)
    for i, _ in zip(range(3), call):
        pass
    busy = [stub(a[0]).GetStatus(stage_pb2.StatusRequest()) for a in cluster.stage_addresses]
    assert all("cancel-me" in s.running_request_ids for s in busy), "both stages should hold the sequence"
    call.cancel()
    wait_all_free(cluster)


def test_a_resume_onto_the_same_replica_supersedes_the_running_attempt(cluster):
    """The gateway resumes a broken request with the same id, and the route it picks may have
    the same stage 0, where the first attempt still runs (its stream's close not yet seen) with
    micro-batches downstream. The new attempt supersedes it: the first ends CANCELLED, its late
    tokens reach nobody, and its close does not cancel the new one; the new attempt streams
    exactly the undisturbed tokens from where the first stopped, and every block comes back."""
    sampling = SamplingParams(max_tokens=40, ignore_eos=True)
    want = generate_local(cluster.model_dir, [PROMPTS[0]], sampling, EngineConfig(num_blocks=64))[0]
    s0 = stub(cluster.stage_addresses[0][0])
    admit = dict(request_id="twice", prompt_token_ids=PROMPTS[0], sampling=sampling_to_proto(sampling),
                 route=[cluster.stage_addresses[1][0]])
    first = s0.Generate(stage_pb2.AdmitRequest(**admit), timeout=120)
    seen = [e.token_id for _, e in zip(range(3), first)]
    second = s0.Generate(stage_pb2.AdmitRequest(**admit, generated_token_ids=seen), timeout=120)
    rest = list(first)  # its call ends here, while the second runs: its close must not cancel that
    assert rest and rest[-1].finish_reason == common_pb2.FINISH_REASON_CANCELLED, "the first attempt is superseded"
    events = list(second)
    assert [e.index for e in events] == list(range(len(seen), len(want))), "no gap, no duplicate, no stray token"
    assert seen + [e.token_id for e in events if e.HasField("token_id")] == want
    assert events[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    wait_all_free(cluster)


def test_bad_requests_get_status_codes_and_the_worker_stays_up(cluster):
    s0 = stub(cluster.stage_addresses[0][0])
    route = [cluster.stage_addresses[1][0]]
    ok = sampling_to_proto(SamplingParams(max_tokens=4))
    cases = [
        (stage_pb2.AdmitRequest(request_id="e1", prompt_token_ids=[], sampling=ok, route=route),
         grpc.StatusCode.INVALID_ARGUMENT, "empty"),
        (stage_pb2.AdmitRequest(request_id="e2", prompt_token_ids=[1, 10**6], sampling=ok, route=route),
         grpc.StatusCode.INVALID_ARGUMENT, "vocabulary"),
        (stage_pb2.AdmitRequest(request_id="e3", prompt_token_ids=[1], sampling=ok, route=[]),
         grpc.StatusCode.INVALID_ARGUMENT, "route"),
        (stage_pb2.AdmitRequest(request_id="e4", prompt_token_ids=[1] * 250,
                                sampling=sampling_to_proto(SamplingParams(max_tokens=100)), route=route),
         grpc.StatusCode.OUT_OF_RANGE, "context"),
        (stage_pb2.AdmitRequest(request_id="e5", prompt_token_ids=[1],
                                sampling=common_pb2.SamplingParams(max_tokens=4, temperature=-1), route=route),
         grpc.StatusCode.INVALID_ARGUMENT, "temperature"),
    ]
    for req, code, needle in cases:
        with pytest.raises(grpc.RpcError) as e:
            list(s0.Generate(req, timeout=30))
        assert e.value.code() == code and needle in e.value.details(), (req.request_id, e.value.details())
    bad_mb = stage_pb2.MicroBatch(micro_batch_id=1, origin=cluster.stage_addresses[0][0],
                                  sequences=[stage_pb2.SequenceChunk(request_id="x", num_tokens=2, sample=True)],
                                  hidden=common_pb2.Tensor(data=b"\0" * 12, shape=[2, 3], dtype="float32"))
    with pytest.raises(grpc.RpcError) as e:
        stub(cluster.stage_addresses[1][0]).Forward(bad_mb, timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "hidden shape" in e.value.details()
    assert generate(cluster, "after-errors", [1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True))


def test_replicas_register_in_redis(cluster):
    replicas = Registry.from_url(cluster.redis_url).replicas(cluster.model_name)
    assert sorted((r.stage, r.address) for r in replicas) == [(0, cluster.stage_addresses[0][0]),
                                                              (1, cluster.stage_addresses[1][0])]
    assert all(r.tp == 2 and r.num_total_blocks == 64 for r in replicas)


class ManyStream:
    """One GenerateMany call, driven from the test: send() items, next_message() the replies."""

    def __init__(self, cluster) -> None:
        import queue

        self.route = [cluster.stage_addresses[1][0]]
        self.requests: queue.Queue = queue.Queue()
        self.call = stub(cluster.stage_addresses[0][0]).GenerateMany(iter(self.requests.get, None), timeout=120)
        self.replies = iter(self.call)

    def admit(self, *admissions: tuple[int, str, list[int], SamplingParams]) -> None:
        self.requests.put(stage_pb2.GenerateManyRequest(items=[
            stage_pb2.AdmitItem(sequence=seq, admit=stage_pb2.AdmitRequest(
                request_id=rid, prompt_token_ids=prompt, sampling=sampling_to_proto(sampling), route=self.route))
            for seq, rid, prompt, sampling in admissions]))

    def cancel(self, sequence: int) -> None:
        self.requests.put(stage_pb2.GenerateManyRequest(items=[stage_pb2.AdmitItem(sequence=sequence, cancel=True)]))

    def until_done(self, sequences: set[int], seen=()) -> tuple[dict[int, list], int]:
        """Items by sequence (`seen`: those already read) until each of `sequences` ended (finish
        or refusal); and the messages it took."""
        got: dict[int, list] = {s: [] for s in sequences}
        for item in seen:
            got[item.sequence].append(item)
        open_, messages = set(sequences), 0
        while open_:
            message = next(self.replies)
            messages += 1
            for item in message.items:
                got.setdefault(item.sequence, []).append(item)
                if item.code or item.event.finish_reason:
                    open_.discard(item.sequence)
        return got, messages

    def close(self) -> None:
        self.requests.put(None)


def tokens_of(items) -> list[int]:
    events = [i.event for i in items]
    assert [e.index for e in events] == list(range(len(events))), "no gap or duplicate within a sequence"
    assert events[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH, events[-1]
    return [e.token_id for e in events if e.HasField("token_id")]


def test_generate_many_streams_each_sequence_as_its_own_generate_does(cluster):
    """The gateway's one stream to a stage 0: 24 sequences interleaved in it get the tokens their
    own Generate streams get, a decode step's tokens sharing messages; refusals are per item."""
    sampling = SamplingParams(max_tokens=10, temperature=0.8, seed=7, ignore_eos=True)
    prompts = [PROMPTS[i % len(PROMPTS)] + [i + 5] for i in range(24)]
    alone = [generate(cluster, f"alone{i}", p, sampling) for i, p in enumerate(prompts[:6])]
    many = ManyStream(cluster)
    many.admit(*[(100 + i, f"many{i}", p, sampling) for i, p in enumerate(prompts[:12])])
    many.admit((7, "empty", [], sampling),
               (8, "too-long", PROMPTS[0], SamplingParams(max_tokens=100_000)),
               *[(100 + i, f"many{i}", p, sampling) for i, p in enumerate(prompts[12:], start=12)])
    got, messages = many.until_done({7, 8, *range(100, 124)})
    assert got[7][0].code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "prompt_token_ids is empty" in got[7][0].message
    assert got[8][0].code == grpc.StatusCode.OUT_OF_RANGE.value[0] and "exceeds the context" in got[8][0].message
    tokens = [tokens_of(got[100 + i]) for i in range(24)]
    assert tokens[:6] == alone, "a sequence on the shared stream gets what its own stream got"
    again = [generate(cluster, f"again{i}", p, sampling) for i, p in enumerate(prompts[6:], start=6)]
    assert tokens[6:] == again
    assert messages < sum(len(v) for v in got.values()) / 3, f"{messages} messages: a step's tokens should share them"
    many.close()
    wait_all_free(cluster)


def test_generate_many_cancels_one_sequence_or_all(cluster):
    long = SamplingParams(max_tokens=200, ignore_eos=True)
    many = ManyStream(cluster)
    many.admit((1, "keep", PROMPTS[0], SamplingParams(max_tokens=40, ignore_eos=True)), (2, "drop", PROMPTS[1], long))
    first = next(many.replies)
    assert first.items
    many.cancel(2)
    many.admit((1, "reused-number", PROMPTS[3], long))  # sequence 1 is still running
    got, _ = many.until_done({1, 2}, seen=first.items)
    if not any(i.event.finish_reason for i in got[1]):  # it stopped at the refusal: read on to the end
        got[1] += many.until_done({1})[0][1]
    assert got[2][-1].event.finish_reason == common_pb2.FINISH_REASON_CANCELLED
    refused = [i for i in got[1] if i.code]
    assert len(refused) == 1 and refused[0].code == grpc.StatusCode.INVALID_ARGUMENT.value[0] \
        and "already running on this stream" in refused[0].message
    assert len(tokens_of([i for i in got[1] if not i.code])) == 40, \
        "the other sequence goes on, and so does the one whose number was reused"
    # A sequence left running when the client goes away is cancelled along its route.
    many.admit((3, "left", PROMPTS[2], long))
    next(many.replies)
    many.call.cancel()
    wait_all_free(cluster)


def test_generate_many_closed_with_nothing_admitted_ends_ok(cluster):
    """The gateway asks a replica whether it has GenerateMany with a stream it closes at once
    (stage_client.GenerateMux): this stage 0 must end it OK, and promptly; one of an older version
    answers UNIMPLEMENTED."""
    call = stub(cluster.stage_addresses[0][0]).GenerateMany(iter([]), timeout=10)
    assert list(call) == [] and call.code() == grpc.StatusCode.OK
