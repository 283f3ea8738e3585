"""The gateway over real gRPC: streaming, status codes, admission, failover, cancel, records.

Stage 0 is a FakeStageWorker (see conftest) so that failures can be staged exactly; the tokenizer
service, Redis and every socket are real.
"""

from __future__ import annotations

import threading

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from shardline.client import (NO_RETRY, Client, InvalidArgument, OutOfRange, ResourceExhausted, ShardlineError,
                              Unavailable)
from shardline.gateway.admission import MIN_RETRY_AFTER_S
from shardline.gateway.config import AdmissionConfig
from shardline.gateway.records import generated_key, record_key

from gateway_bench import SCRIPT_TEXT, Bench


def test_stream_and_unary_agree_and_text_is_the_decode(bench, model_name, tokenizer_service):
    (fake,), _ = bench.route(model_name)
    gw = bench.start_gateway(model_names=(model_name,))
    _, tokenizer = tokenizer_service
    prompt = tokenizer.encode("hello world", add_special_tokens=True)
    expected = [fake.token_at(prompt, i) for i in range(20)]
    with Client(f"127.0.0.1:{gw.port}", timeout=30) as client:
        result = client.generate("hello world", max_tokens=20, temperature=0.0)
        stream = client.stream("hello world", max_tokens=20, temperature=0.0)
        deltas = list(stream)
    assert result.token_ids == expected, "the gateway must pass stage 0's tokens through unchanged"
    assert result.finish_reason == "length" and result.usage.completion_tokens == 20
    assert result.usage.prompt_tokens == len(prompt)
    assert result.text == tokenizer.decode(expected), "text must be the detokenized completion"
    assert [t for d in deltas for t in d.token_ids] == expected
    assert "".join(d.text for d in deltas) == result.text, "stream deltas must concatenate to the unary text"
    assert stream.finish_reason == "length" and stream.usage.total_tokens == len(prompt) + 20
    assert 0 < result.time_to_first_token_s <= result.total_s
    admitted = fake.admitted[-1]
    assert list(admitted.route) == [a for a, (f, i) in bench.replicas.items() if i.stage == 1], \
        "stage 0 must be told the downstream route"
    assert admitted.sampling.HasField("seed"), "the gateway must pin a seed so that a resume continues exactly"


def test_request_record_in_redis(bench, model_name, redis_server):
    (fake,), stage1 = bench.route(model_name)
    gw = bench.start_gateway(model_names=(model_name,), record_ttl_s=120.0)
    with Client(f"127.0.0.1:{gw.port}", timeout=30) as client:
        result = client.generate([5, 6, 7], max_tokens=6, temperature=0.5, top_k=3, seed=11, request_id="rec-1")
        info = client.get_request("rec-1")
    assert info.state == "finished" and info.finish_reason == "length"
    assert info.route == [fake.address, stage1.address]
    assert info.num_prompt_tokens == 3 and info.num_generated_tokens == 6 and info.num_resumes == 0
    assert 0 < info.queued_at <= info.first_token_at <= info.finished_at
    r = redis.Redis.from_url(redis_server, decode_responses=True)
    assert [int(t) for t in r.lrange(generated_key("rec-1"), 0, -1)] == result.token_ids, \
        "the record must hold the generated ids: they are what a resume elsewhere needs"
    ttl = r.ttl(record_key("rec-1"))
    assert 0 < ttl <= 120, f"a finished record must expire after record_ttl_s, ttl={ttl}"
    assert '"seed": 11' in r.hget(record_key("rec-1"), "params")
    with Client(f"127.0.0.1:{gw.port}", timeout=5) as client, pytest.raises(ShardlineError) as e:
        client.get_request("never-seen")
    assert e.value.code == "NOT_FOUND"
    with Client(f"127.0.0.1:{gw.port}", timeout=5) as client:
        for call, request_id, needle in [(client.get_request, "", "request_id is empty"),
                                         (client.cancel, "", "request_id is empty"),
                                         (client.cancel, "no spaces", "must be 1..128 characters")]:
            with pytest.raises(ShardlineError) as e:
                call(request_id)
            assert e.value.code == "INVALID_ARGUMENT" and needle in e.value.message, (request_id, e.value)
        assert client.get_request("rec-1").state == "finished", "the gateway keeps answering"


def test_running_requests_progress_reaches_redis_in_batched_writes(bench, model_name, redis_server):
    """While streams run, their new ids reach the record within record_interval_s, for every
    running request at once; the first id is written as soon as it comes."""
    (fake,), _ = bench.route(model_name)
    fake.token_delay_s = 0.05  # 100 tokens take 5 s: the streams outlast the checks below
    gw = bench.start_gateway(model_names=(model_name,), record_interval_s=0.2)
    r = redis.Redis.from_url(redis_server, decode_responses=True)
    with Client(f"127.0.0.1:{gw.port}", timeout=30) as client:
        streams = [client.stream([5, 6, 7 + i], max_tokens=100, temperature=0.0, request_id=f"prog-{i}")
                   for i in range(3)]
        firsts = [next(iter(s)) for s in streams]  # each stream has its first token
        lengths = [r.llen(generated_key(f"prog-{i}")) for i in range(3)]
        assert all(n >= 1 for n in lengths), f"the first id is recorded before the client gets it: {lengths}"
        seen = [len(f.token_ids) for f in firsts]
        for _ in range(10):
            for i, s in enumerate(streams):
                seen[i] += len(next(iter(s)).token_ids)
        bench.wait_until(lambda: all(r.llen(generated_key(f"prog-{i}")) >= seen[i] for i in range(3)),
                         timeout_s=1.0, what="the batched writes to catch up with the streams")
        recorded = [[int(t) for t in r.lrange(generated_key(f"prog-{i}"), 0, -1)] for i in range(3)]
        prompts = [[5, 6, 7 + i] for i in range(3)]
        assert all(rec == [fake.token_at(p, j) for j in range(len(rec))] for rec, p in zip(recorded, prompts)), \
            "the record holds each request's ids in order, without gaps or repeats"
        for s in streams:
            s.cancel()


BAD_REQUESTS = [
    (dict(prompt=""), InvalidArgument, "prompt is empty"),
    (dict(prompt=[]), InvalidArgument, "prompt is empty"),
    (dict(prompt="hi", max_tokens=0), InvalidArgument, "max_tokens 0 must be >= 1"),
    (dict(prompt="hi", temperature=-0.5), InvalidArgument, "temperature -0.5 is out of range; use 0 (greedy) to 100"),
    (dict(prompt="hi", temperature=101.0), InvalidArgument, "temperature 101"),
    (dict(prompt="hi", top_k=-1), InvalidArgument, "top_k -1 is out of range"),
    (dict(prompt="hi", top_p=0.0), InvalidArgument, "top_p 0.0 is out of range; use a value in (0, 1]"),
    (dict(prompt="hi", top_p=1.5), InvalidArgument, "top_p 1.5"),
    (dict(prompt=[1, 2, 999]), InvalidArgument, "prompt_token_ids[2] = 999 is outside the vocabulary"),
    (dict(prompt="hi", model="no-such-model"), InvalidArgument, "model 'no-such-model' is unknown"),
    (dict(prompt="hi", max_tokens=300), OutOfRange, "max_tokens 300 exceeds the model's context of 256"),
    (dict(prompt=[7] * 250, max_tokens=10), OutOfRange, "prompt (250 tokens) + max_tokens (10) = 260 exceeds"),
    (dict(prompt=[7] * 256), OutOfRange, "prompt has 256 tokens but the model's context is 256"),
]


@pytest.mark.parametrize("kwargs,error,message", BAD_REQUESTS, ids=[m[:24] for _, _, m in BAD_REQUESTS])
def test_bad_requests_get_their_status_and_the_gateway_stays_up(bench, model_name, kwargs, error, message):
    bench.route(model_name)
    gw = bench.start_gateway(model_names=(model_name,))  # context 256: the tokenizer's model_max_length
    with Client(f"127.0.0.1:{gw.port}", timeout=10) as client:
        with pytest.raises(error) as e:
            client.generate(**{"model": model_name, **kwargs})
        assert message in e.value.message, f"the message must name the field and its limits: {e.value.message!r}"
        with pytest.raises(error):
            list(client.stream(**{"model": model_name, **kwargs}))
        assert client.generate("ok", max_tokens=2).usage.completion_tokens == 2, "the gateway must stay up"


def test_context_length_comes_from_config_over_tokenizer(bench, model_name):
    bench.route(model_name)
    gw = bench.start_gateway(model_names=(model_name,), max_model_len={model_name: 32})
    with Client(f"127.0.0.1:{gw.port}", timeout=10) as client:
        with pytest.raises(OutOfRange, match="context of 32"):
            client.generate([3] * 30, max_tokens=5)
        assert client.list_models()[0].max_model_len == 32


def test_full_queue_is_resource_exhausted_with_a_retry_hint(bench, model_name):
    bench.route(model_name, token_delay_s=0.05)
    gw = bench.start_gateway(model_names=(model_name,), admission=AdmissionConfig(max_running=1, max_queued=1))
    address = f"127.0.0.1:{gw.port}"
    results = []

    def slow():
        with Client(address, timeout=30) as c:
            results.append(c.generate("hi", max_tokens=20))

    threads = [threading.Thread(target=slow) for _ in range(2)]
    for t in threads:
        t.start()
    bench.wait_until(lambda: gw.gateway.admission.num_running == 1 and gw.gateway.admission.num_queued == 1,
               what="one running and one queued request")
    with Client(address, timeout=10, retry=NO_RETRY) as client, pytest.raises(ResourceExhausted) as e:
        client.generate("hi", max_tokens=2)
    assert "max_running 1" in e.value.message and "max_queued 1" in e.value.message
    assert e.value.retry_after_s is not None and e.value.retry_after_s >= MIN_RETRY_AFTER_S, \
        "RESOURCE_EXHAUSTED must carry the retry-after-ms hint"
    for t in threads:
        t.join()
    assert len(results) == 2 and all(r.usage.completion_tokens == 20 for r in results), \
        "queued requests must run once a slot frees up"


def test_route_choice_spreads_load_over_stage0_replicas(bench, model_name):
    fakes, _ = bench.route(model_name, num_stage0=2, token_delay_s=0.05)
    gw = bench.start_gateway(model_names=(model_name,))
    address = f"127.0.0.1:{gw.port}"
    threads = [threading.Thread(target=lambda: Client(address, timeout=30).generate("x", max_tokens=20))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(len(f.admitted) for f in fakes) == [2, 2], \
        "concurrent requests must spread over stage-0 replicas, not pile onto one between heartbeats"


def generate_concurrently(port: int, prompts: list[list[int]], **params) -> list[list[int]]:
    """Each prompt from its own client thread, all at once; the token ids of each."""
    results: list = [None] * len(prompts)

    def one(i: int) -> None:
        with Client(f"127.0.0.1:{port}", timeout=30) as client:
            results[i] = client.generate(prompts[i], **params).token_ids

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_requests_on_one_stage0_share_one_stream_and_its_messages(bench, model_name):
    """The gateway keeps one GenerateMany stream a stage-0 replica: 24 concurrent requests ride it,
    admissions handed in together go in one message, each request gets its own tokens."""
    (stage0,), _ = bench.route(model_name, token_delay_s=0.01)
    gw = bench.start_gateway(model_names=(model_name,))
    prompts = [[7, i % 50 + 3, 9] for i in range(24)]
    results = generate_concurrently(gw.port, prompts, max_tokens=12, ignore_eos=True)
    assert results == [[stage0.token_at(p, j) for j in range(12)] for p in prompts]
    assert stage0.many_calls == 1 and stage0.many_probes == 1, "one stream to the replica, shared (after one question)"
    assert sum(stage0.many_messages) == 24 and len(stage0.many_messages) < 24, \
        f"admissions that come together share messages: {stage0.many_messages}"


def test_a_stage0_of_an_older_version_serves_on_a_generate_stream_a_sequence(bench, model_name):
    """Mid-rollout, a stage-0 replica from before GenerateMany answers it UNIMPLEMENTED: the gateway
    asks once, before its first stream there, and then sends each sequence on a Generate stream of
    its own (no resume: none failed), later ones too; a cancel still reaches the replica."""
    (stage0,), _ = bench.route(model_name, token_delay_s=0.01)
    stage0.older_version = True
    gw = bench.start_gateway(model_names=(model_name,))
    prompts = [[3, i + 4, 8] for i in range(6)]
    results = generate_concurrently(gw.port, prompts, max_tokens=10, ignore_eos=True)
    assert results == [[stage0.token_at(p, j) for j in range(10)] for p in prompts]
    assert len(stage0.admitted) == 6 and not any(r.generated_token_ids for r in stage0.admitted), \
        "each sequence is admitted once by Generate, from the start"
    with Client(f"127.0.0.1:{gw.port}", timeout=30) as client:
        assert client.generate([5, 6], max_tokens=4, ignore_eos=True).token_ids == \
            [stage0.token_at([5, 6], j) for j in range(4)]
        stream = client.stream([5, 7], max_tokens=200, ignore_eos=True, request_id="old-cancel")
        next(iter(stream))
        assert client.cancel("old-cancel") is True
        bench.wait_until(lambda: "old-cancel" in stage0.cancelled, what="the Generate stream closed after Cancel")
    assert stage0.many_probes == 1 and stage0.many_calls == 0, \
        "the gateway asks once, and does not try GenerateMany on that replica again"


def test_a_broken_stage0_stream_fails_over_every_sequence_on_it(bench, model_name):
    """Stage 0 aborts the stream after 5 tokens of one request: the 6 requests on it all resume
    (on a new stream, to whichever replica the route choice picks), with no gap and no duplicate.
    The requests were admitted a few milliseconds apart, so at the break each has had 5 tokens or
    fewer; each resumes from exactly the ones it had."""
    a = bench.add_replica(model_name, 0, token_delay_s=0.01)
    b = bench.add_replica(model_name, 0, num_running=50)  # busier: a takes them all first
    bench.add_replica(model_name, 1)
    a.fail_after = 5
    gw = bench.start_gateway(model_names=(model_name,))
    prompts = [[4, i + 5, 6] for i in range(6)]
    results = generate_concurrently(gw.port, prompts, max_tokens=30, ignore_eos=True)
    assert results == [[a.token_at(p, j) for j in range(30)] for p in prompts]
    admissions: dict[str, list] = {}
    for r in a.admitted + b.admitted:
        admissions.setdefault(r.request_id, []).append(r)
    assert len(admissions) == 6 and all(len(v) == 2 for v in admissions.values()), \
        "each sequence on the broken stream is admitted once, then resumed once"
    had = []
    for first, resume in (sorted(v, key=lambda r: len(r.generated_token_ids)) for v in admissions.values()):
        assert not first.generated_token_ids
        prompt = list(first.prompt_token_ids)
        assert list(resume.prompt_token_ids) == prompt
        had.append(len(resume.generated_token_ids))
        assert list(resume.generated_token_ids) == [a.token_at(prompt, j) for j in range(had[-1])], \
            "a resume carries exactly the tokens its sequence had"
    assert max(had) == 5, f"the stream broke after one request's 5th token: the resumes had {had}"


def test_tokens_that_arrive_with_the_failure_reach_the_client(bench, model_name):
    """Stage 0 sends 40 ids back to back, then fails: the gateway handles what has arrived in
    batches, so the last ids and the failure come in one batch. They must reach the client
    before the resume, which does not send them again."""
    a = bench.add_replica(model_name, 0)
    b = bench.add_replica(model_name, 0, num_running=5)  # busier: a is chosen first
    bench.add_replica(model_name, 1)
    a.fail_after = 40
    gw = bench.start_gateway(model_names=(model_name,))
    prompt = [4, 5, 6]
    with Client(f"127.0.0.1:{gw.port}", timeout=30) as client:
        got = client.generate(prompt, max_tokens=60, request_id="burst").token_ids
    resumed = [r for r in a.admitted + b.admitted if r.request_id == "burst" and r.generated_token_ids]
    assert len(resumed) == 1 and list(resumed[0].generated_token_ids) == got[:40], "one resume, after 40 ids"
    assert got == [a.token_at(prompt, i) for i in range(60)], "every id once, in order, across the failover"


@pytest.mark.parametrize("how", ["killed", "vanished", "aborted"])
def test_failover_resumes_without_gap_or_duplicate(bench, model_name, how):
    a = bench.add_replica(model_name, 0, token_delay_s=0.01)
    b = bench.add_replica(model_name, 0, num_running=5, token_delay_s=0.01)  # busier: a is chosen first
    bench.add_replica(model_name, 1)
    gw = bench.start_gateway(model_names=(model_name,))
    prompt = [9, 8, 7]
    expected = [a.token_at(prompt, i) for i in range(24)]
    a.resend = b.resend = 2  # a resumed stream repeats delivered tokens: the gateway must drop them
    if how == "aborted":
        a.fail_after = 6  # UNAVAILABLE mid-stream, replica still alive
    else:
        a.stall_after = 6
    got = []
    with Client(f"127.0.0.1:{gw.port}", timeout=30) as client:
        stream = client.stream(prompt, max_tokens=24, request_id=f"fo-{how}")
        for delta in stream:
            got.extend(delta.token_ids)
            if len(got) == 6 and how == "killed":
                bench.kill(a)  # connection drops; its registry key stays until the TTL
            elif len(got) == 6 and how == "vanished":
                bench.deregister(a)  # heartbeat key gone while the stream hangs: the watchdog must act
        info = client.get_request(f"fo-{how}")
    assert got == expected, "after failover the client must see every token once, in order"
    assert stream.finish_reason == "length" and stream.usage.completion_tokens == 24
    assert info.state == "finished" and info.num_resumes == 1
    survivor = a if how == "aborted" else b  # an aborted stream's replica still answers GetStatus
    assert info.route[0] == survivor.address
    resumed = survivor.admitted[-1]
    assert list(resumed.generated_token_ids) == expected[:6], "the resume must carry the tokens so far"
    assert resumed.sampling.seed == a.admitted[0].sampling.seed, "the resume must keep the seed"


def test_cancel_rpc_and_client_disconnect_cancel_downstream(bench, model_name):
    (fake,), _ = bench.route(model_name, token_delay_s=0.02)
    gw = bench.start_gateway(model_names=(model_name,))
    with Client(f"127.0.0.1:{gw.port}", timeout=30) as client:
        # Cancel RPC (it could come from another connection or gateway replica).
        stream = client.stream("hello", max_tokens=200, request_id="cancel-rpc")
        it = iter(stream)
        next(it)
        assert client.cancel("cancel-rpc") is True
        rest = list(it)
        assert stream.finish_reason == "cancelled" and len(rest) < 199
        bench.wait_until(lambda: "cancel-rpc" in fake.cancelled, what="stage 0 stream closed after Cancel")
        bench.wait_until(lambda: client.get_request("cancel-rpc").state == "cancelled", what="record CANCELLED")
        assert client.cancel("cancel-rpc") is False, "cancelling a finished request reports False"

        # The client goes away mid-stream.
        stream = client.stream("hello", max_tokens=200, request_id="disconnect")
        it = iter(stream)
        next(it)
        next(it)
        stream.cancel()
        bench.wait_until(lambda: "disconnect" in fake.cancelled, what="stage 0 stream closed after the client left")
        bench.wait_until(lambda: client.get_request("disconnect").state == "cancelled", what="record CANCELLED")
        assert not gw.gateway._active and gw.gateway.admission.num_running == 0, "slots must be given back"


def test_cancel_while_queued(bench, model_name):
    bench.route(model_name, token_delay_s=0.05)
    gw = bench.start_gateway(model_names=(model_name,), admission=AdmissionConfig(max_running=1, max_queued=4))
    address = f"127.0.0.1:{gw.port}"
    blocker = threading.Thread(target=lambda: Client(address, timeout=30).generate("x", max_tokens=20))
    blocker.start()
    bench.wait_until(lambda: gw.gateway.admission.num_running == 1, what="the blocker running")
    with Client(address, timeout=30) as client:
        stream = client.stream("y", max_tokens=5, request_id="queued-cancel")
        done = threading.Event()
        threading.Thread(target=lambda: (list(stream), done.set())).start()
        bench.wait_until(lambda: gw.gateway.admission.num_queued == 1, what="the request queued")
        assert client.get_request("queued-cancel").state == "queued"
        assert client.cancel("queued-cancel") is True
        assert done.wait(10) and stream.finish_reason == "cancelled" and stream.token_ids == []
    blocker.join()
    assert gw.gateway.admission.num_queued == 0 and gw.gateway.admission.num_running == 0


def test_stop_string_and_stop_token(bench, model_name, tokenizer_service):
    _, tokenizer = tokenizer_service
    bench.route(model_name)
    gw = bench.start_gateway(model_names=(model_name,))
    prompt = [1, 2]  # the fake then replays SCRIPT_TEXT from index len(prompt)
    with Client(f"127.0.0.1:{gw.port}", timeout=30) as client:
        full = client.generate(prompt, max_tokens=40)
        assert "dog" in full.text
        result = client.generate(prompt, max_tokens=40, stop=["dog"])
        assert result.finish_reason == "stop" and result.matched_stop == "dog"
        assert result.text == full.text[:full.text.index("dog")], "text must be cut before the stop string"
        assert tokenizer.decode(result.token_ids).startswith(result.text)
        stream = client.stream(prompt, max_tokens=40, stop=["dog"])
        assert "".join(d.text for d in stream) == result.text and stream.matched_stop == "dog"
        stop_id = full.token_ids[5]
        r = client.generate(prompt, max_tokens=40, stop_token_ids=[stop_id])
        assert r.finish_reason == "stop" and r.token_ids == full.token_ids[:full.token_ids.index(stop_id) + 1]


def test_health_and_list_models_follow_the_registry(bench, model_name):
    gw = bench.start_gateway(model_names=(model_name,), route_wait_s=0.2)
    address = f"127.0.0.1:{gw.port}"
    health = health_pb2_grpc.HealthStub(grpc.insecure_channel(address))

    def status():
        return health.Check(health_pb2.HealthCheckRequest(service="shardline.v1.Gateway"), timeout=5).status

    assert status() == health_pb2.HealthCheckResponse.NOT_SERVING, "no route yet: not ready"
    with Client(address, timeout=10, retry=NO_RETRY) as client:
        with pytest.raises(Unavailable, match="no replica of model"):
            client.generate("hi", max_tokens=1)
        bench.add_replica(model_name, 0)
        bench.add_replica(model_name, 1)
        bench.wait_until(lambda: status() == health_pb2.HealthCheckResponse.SERVING, what="SERVING once a route exists")
        [m] = client.list_models()
        assert (m.name, m.num_stages, m.tp_size, m.num_routes, m.max_model_len) == (model_name, 2, 1, 1, 256)
        assert client.generate("hi", max_tokens=1).usage.completion_tokens == 1


def test_unavailable_when_a_stage_has_no_replica(bench, model_name):
    bench.add_replica(model_name, 0)  # stage 1 missing
    gw = bench.start_gateway(model_names=(model_name,), route_wait_s=0.2)
    with Client(f"127.0.0.1:{gw.port}", timeout=10, retry=NO_RETRY) as client:
        with pytest.raises(Unavailable, match=r"no live, non-draining replica of stage \[1\]"):
            client.generate("hi", max_tokens=1)


def test_korean_and_emoji_stream_never_splits_a_character(bench, model_name, tokenizer_service):
    _, tokenizer = tokenizer_service
    text = "안녕하세요, 만나서 반갑습니다. Emoji time 😀 🚀 🎉 👍 ❤️ 🤖 한국어 토크나이저"
    script = tokenizer.encode(text, add_special_tokens=False)
    assert len(script) > len(text) // 3, "byte-level BPE should split these characters over several tokens"
    bench.add_replica(model_name, 0, script=script)
    bench.add_replica(model_name, 1)
    gw = bench.start_gateway(model_names=(model_name,))
    prompt = [1] * len(script)  # the fake plays its script from index len(prompt) mod len(script) = 0
    with Client(f"127.0.0.1:{gw.port}", timeout=30) as client:
        stream = client.stream(prompt, max_tokens=len(script))
        deltas = list(stream)
    ids = [t for d in deltas for t in d.token_ids]
    assert ids == script
    assert "".join(d.text for d in deltas) == tokenizer.decode(ids) == text, \
        "deltas must concatenate to the one-shot decode"
    assert not any("\ufffd" in d.text for d in deltas), "no delta may carry half a character"


def test_cancel_reaches_the_gateway_replica_that_runs_the_request(bench, model_name):
    (fake,), _ = bench.route(model_name, token_delay_s=0.02)
    runs_it = bench.start_gateway(model_names=(model_name,))
    other = bench.start_gateway(model_names=(model_name,))
    with Client(f"127.0.0.1:{runs_it.port}", timeout=30) as a, Client(f"127.0.0.1:{other.port}", timeout=30) as b:
        stream = a.stream("hello", max_tokens=200, request_id="cross-gw")
        it = iter(stream)
        next(it)
        assert b.get_request("cross-gw").state == "running", "records are shared through Redis"
        assert b.cancel("cross-gw") is True
        list(it)
        assert stream.finish_reason == "cancelled"
        bench.wait_until(lambda: "cross-gw" in fake.cancelled, what="stage 0 stream closed")


def test_command_line_errors_exit_2_with_a_message():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "shardline.gateway", "--redis-url", "redis://127.0.0.1:1/0",
                           "--tokenizer", "127.0.0.1:1", "--max-model-len", "m=lots"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--max-model-len 'm=lots': 'lots' is not a valid int" in proc.stderr


def test_chat_prompt_is_rendered_with_the_template(bench, model_name, tokenizer_service):
    (fake,), _ = bench.route(model_name)
    gw = bench.start_gateway(model_names=(model_name,))
    _, tokenizer = tokenizer_service
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    with Client(f"127.0.0.1:{gw.port}", timeout=30) as client:
        result = client.generate(messages, max_tokens=3)
    assert list(fake.admitted[-1].prompt_token_ids) == tokenizer.apply_chat_template(messages).token_ids
    assert result.usage.completion_tokens == 3



def test_redis_going_away_does_not_break_running_streams(loop_thread, tokenizer_service, model_name):
    import shutil
    import socket
    import subprocess

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    redis_proc = subprocess.Popen([shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1",
                                   "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    address, tokenizer = tokenizer_service
    own = Bench(loop_thread, f"redis://127.0.0.1:{port}/0", address, tokenizer.encode(SCRIPT_TEXT))
    try:
        own.wait_until(lambda: _pings(own.registry), what="the private redis-server up")
        own.route(model_name, token_delay_s=0.02)
        gw = own.start_gateway(model_names=(model_name,))
        with Client(f"127.0.0.1:{gw.port}", timeout=30, retry=NO_RETRY) as client:
            stream = client.stream("hello", max_tokens=40)
            it = iter(stream)
            next(it)
            redis_proc.terminate()
            redis_proc.wait(10)
            assert len([d for d in it]) == 39 and stream.finish_reason == "length", \
                "a stream in flight must finish without Redis: the record is best effort"
            with pytest.raises(Unavailable, match="Redis"):
                client.generate("hello", max_tokens=2)
            assert client.list_models()[0].num_routes == 1, "the last registry snapshot keeps serving reads"
    finally:
        redis_proc.kill()
        for running in own.gateways:
            loop_thread.run(running.stop(0))
        for fake, _ in own.replicas.values():
            loop_thread.run(fake.server.stop(0))


def _pings(registry) -> bool:
    try:
        return registry.redis.ping()
    except Exception:
        return False
