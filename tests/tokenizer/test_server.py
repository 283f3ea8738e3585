"""The tokenizer as a real process on a real localhost socket, driven through the generated stubs."""

import re
import select
import signal
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from shardline.v1 import common_pb2, tokenizer_pb2, tokenizer_pb2_grpc

TEXT = "Hello, world! 안녕하세요 😀🚀"


@pytest.fixture(scope="module")
def server(model_dir):
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardline.tokenizer", "--model", str(model_dir), "--address", "127.0.0.1:0",
         "--grace-seconds", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, line = time.monotonic() + 60, ""
    while "serving" not in line:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready or proc.poll() is not None:
            proc.kill()
            pytest.fail(f"tokenizer did not start: {proc.stderr.read()}")
        line = proc.stdout.readline()
    port = int(re.search(r":(\d+)$", line.strip()).group(1))
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    grpc.channel_ready_future(channel).result(timeout=30)
    yield proc, channel
    channel.close()
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def stub(server):
    return tokenizer_pb2_grpc.TokenizerStub(server[1])


def test_health_and_reflection(server):
    _, channel = server
    health = health_pb2_grpc.HealthStub(channel)
    for name in ("", "shardline.v1.Tokenizer"):
        assert health.Check(health_pb2.HealthCheckRequest(service=name)).status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    reply = next(reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
    assert "shardline.v1.Tokenizer" in {s.name for s in reply.list_services_response.service}


def test_encode_info_and_chat_template(stub, tokenizer):
    assert list(stub.Encode(tokenizer_pb2.EncodeRequest(text=TEXT)).token_ids) == tokenizer.encode(TEXT).ids
    plain = stub.Encode(tokenizer_pb2.EncodeRequest(text=TEXT, add_special_tokens=False)).token_ids
    assert list(plain) == tokenizer.encode(TEXT, add_special_tokens=False).ids
    info = stub.GetInfo(tokenizer_pb2.GetInfoRequest())
    assert info.vocab_size == tokenizer.get_vocab_size() and info.bos_token_id == tokenizer.token_to_id("<s>")
    chat = stub.ApplyChatTemplate(tokenizer_pb2.ApplyChatTemplateRequest(
        messages=[common_pb2.ChatMessage(role="user", content="안녕")]))
    assert chat.text == "<s><|user|>\n안녕</s>\n<|assistant|>\n", "add_generation_prompt defaults to true"


def test_detokenize_stream_token_by_token_with_stop(stub, tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False).ids
    requests = [tokenizer_pb2.DetokenizeRequest(token_ids=[ids[0]], stop=["😀"])]
    requests += [tokenizer_pb2.DetokenizeRequest(token_ids=[i]) for i in ids[1:]]
    responses = list(stub.DetokenizeStream(iter(requests)))
    assert "".join(r.text for r in responses) == "Hello, world! 안녕하세요 "
    assert all("\ufffd" not in r.text for r in responses)
    assert responses[-1].finished and responses[-1].matched_stop == "😀"
    assert not any(r.finished for r in responses[:-1])
    assert len(responses) == responses[-1].num_tokens < len(ids), "one response per message until the stop"


def test_detokenize_stream_without_stop_flushes_on_half_close(stub, tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False).ids
    responses = list(stub.DetokenizeStream(iter(
        [tokenizer_pb2.DetokenizeRequest(token_ids=ids[i:i + 3]) for i in range(0, len(ids), 3)])))
    assert "".join(r.text for r in responses) == tokenizer.decode(ids) == TEXT
    assert responses[-1].finished and responses[-1].matched_stop == ""
    assert responses[-1].num_tokens == len(ids)


def test_detokenize_many_interleaves_sequences_exactly_as_their_own_streams(stub, tokenizer):
    """Three sequences on one DetokenizeMany stream, their items in varying batches, one of them
    stopping on a stop string, one cancelled, one bad: each answer is what the sequence's own
    DetokenizeStream gives, and the bad one does not end the stream."""
    ids = tokenizer.encode(TEXT, add_special_tokens=False).ids
    first = {"stop": ["😀"]}
    alone = {
        1: list(stub.DetokenizeStream(iter([tokenizer_pb2.DetokenizeRequest(token_ids=[ids[0]], **first)]
                                           + [tokenizer_pb2.DetokenizeRequest(token_ids=[i]) for i in ids[1:]]))),
        2: list(stub.DetokenizeStream(iter([tokenizer_pb2.DetokenizeRequest(token_ids=ids[i:i + 2])
                                            for i in range(0, len(ids), 2)]))),
    }

    def item(seq, token_ids=(), close=False, cancel=False, **config):
        return tokenizer_pb2.DetokenizeItem(sequence=seq, close=close, cancel=cancel,
                                            request=tokenizer_pb2.DetokenizeRequest(token_ids=token_ids, **config))

    batches = [[item(1, [ids[0]], **first), item(2, ids[0:2]), item(3, [ids[0]])]]
    batches.append([item(3, cancel=True), item(9, [tokenizer.get_vocab_size() + 5])])
    stopped_at = alone[1][-1].num_tokens  # sequence 1 stops here; its later ids are never sent
    for k in range(1, len(ids)):
        batch = [item(1, [ids[k]])] if k < stopped_at else []
        if 2 * k < len(ids):
            batch.append(item(2, ids[2 * k:2 * k + 2]))
        batches.append(batch)
    batches.append([item(2, close=True)])
    responses = list(stub.DetokenizeMany(iter(tokenizer_pb2.DetokenizeManyRequest(items=b) for b in batches)))

    assert len(responses) == len(batches), "one response message a request message"
    got: dict[int, list] = {1: [], 2: [], 3: []}
    for batch, response in zip(batches, responses):
        answered = [i.sequence for i in batch if not i.cancel]
        assert [a.sequence for a in response.items] == answered, "an item per item that is not a cancel, in order"
        for a in response.items:
            if a.sequence == 9:
                assert f"{tokenizer.get_vocab_size() + 5}" in a.error, a.error
            else:
                got[a.sequence].append(a.response)
    assert got[1] == alone[1], "sequence 1 (a stop string) as on its own stream"
    assert got[2] == alone[2], "sequence 2 (pairs of ids, then the flush) as on its own stream"
    assert len(got[3]) == 1, "sequence 3 was answered once, then cancelled"



def test_detokenize_many_refuses_an_item_of_a_sequence_that_is_no_longer_open(stub, tokenizer):
    """A sequence that finished is not started afresh by a late item (that would lose its stop
    strings): the item gets an error, and a new number works."""
    ids = tokenizer.encode("Hello, world!", add_special_tokens=False).ids
    push = lambda seq, token_ids: tokenizer_pb2.DetokenizeItem(  # noqa: E731
        sequence=seq, request=tokenizer_pb2.DetokenizeRequest(token_ids=token_ids))
    batches = [[push(1, ids[:2])], [tokenizer_pb2.DetokenizeItem(sequence=1, close=True)], [push(1, ids[2:3])],
               [push(2, ids[:2])]]
    responses = list(stub.DetokenizeMany(iter(tokenizer_pb2.DetokenizeManyRequest(items=b) for b in batches)))
    assert responses[1].items[0].response.finished
    assert "sequence 1 is not open" in responses[2].items[0].error
    assert responses[3].items[0].error == "" and responses[3].items[0].response.text == tokenizer.decode(ids[:2])

def test_bad_input_is_invalid_argument_and_the_server_stays_up(stub, tokenizer):
    vocab_size = tokenizer.get_vocab_size()
    with pytest.raises(grpc.RpcError) as bad_decode:
        stub.Decode(tokenizer_pb2.DecodeRequest(token_ids=[3, vocab_size + 7]))
    assert bad_decode.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"token_ids[1] = {vocab_size + 7}" in bad_decode.value.details()

    with pytest.raises(grpc.RpcError) as bad_stream:
        list(stub.DetokenizeStream(iter([tokenizer_pb2.DetokenizeRequest(token_ids=[5]),
                                         tokenizer_pb2.DetokenizeRequest(token_ids=[-2])])))
    assert bad_stream.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "token_ids: token id -2" in bad_stream.value.details()

    with pytest.raises(grpc.RpcError) as bad_stop:
        list(stub.DetokenizeStream(iter([tokenizer_pb2.DetokenizeRequest(token_ids=[5], stop=[""])])))
    assert bad_stop.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "stop[0]" in bad_stop.value.details()

    with pytest.raises(grpc.RpcError) as bad_chat:
        stub.ApplyChatTemplate(tokenizer_pb2.ApplyChatTemplateRequest(
            messages=[common_pb2.ChatMessage(role="robot", content="x")]))
    assert bad_chat.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "messages" in bad_chat.value.details()

    ids = tokenizer.encode(TEXT, add_special_tokens=False).ids
    assert stub.Decode(tokenizer_pb2.DecodeRequest(token_ids=ids)).text == TEXT, "still serving after bad input"


def test_sigterm_drains_and_exits_cleanly(server, stub):
    proc, _ = server
    stub.GetInfo(tokenizer_pb2.GetInfoRequest())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, proc.stderr.read()

