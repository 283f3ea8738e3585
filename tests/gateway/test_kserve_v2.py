"""The KServe v2 gRPC door (inference.GRPCInferenceService) on the gateway's gRPC port, called as a
Triton client calls it (raw little-endian contents, or typed ones), over a real socket."""

from __future__ import annotations

import struct
import threading

import grpc
import numpy as np
import pytest

from shardline.client import Client
from shardline.gateway.config import AdmissionConfig
from shardline.v1 import kserve_v2_pb2 as pb
from shardline.v1 import kserve_v2_pb2_grpc

Tensor = pb.ModelInferRequest.InferInputTensor


def raw_bytes(*texts: str) -> bytes:
    return b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)


def raw_request(model: str, text: str, **numbers) -> pb.ModelInferRequest:
    """As tritonclient builds one: every input in raw_input_contents."""
    inputs, raw = [Tensor(name="text_input", datatype="BYTES", shape=[1, 1])], [raw_bytes(text)]
    for name, (datatype, value) in numbers.items():
        inputs.append(Tensor(name=name, datatype=datatype, shape=[1, 1]))
        raw.append(np.array([value], dtype={"INT32": "<i4", "FP32": "<f4", "BOOL": "?", "UINT64": "<u8"}[datatype])
                   .tobytes())
    return pb.ModelInferRequest(model_name=model, id="req-1", inputs=inputs, raw_input_contents=raw)


def text_output(response: pb.ModelInferResponse) -> str:
    assert [o.name for o in response.outputs] == ["text_output"] and response.outputs[0].datatype == "BYTES"
    raw = response.raw_output_contents[0]
    (n,) = struct.unpack_from("<I", raw)
    assert len(raw) == 4 + n
    return raw[4:].decode()


def params(response) -> dict:
    return {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in response.parameters.items()}


@pytest.fixture
def stub_for():
    channels = []

    def make(gw):
        channel = grpc.insecure_channel(f"127.0.0.1:{gw.port}")
        channels.append(channel)
        return kserve_v2_pb2_grpc.GRPCInferenceServiceStub(channel)

    yield make
    for channel in channels:
        channel.close()


def serving_with_sdk_answer(bench, model_name, stub_for):
    """A routed gateway's v2 stub, and the SDK's greedy answer to "hello world" in 12 tokens."""
    bench.route(model_name)
    gw = bench.start_gateway(model_names=(model_name,))
    with Client(f"127.0.0.1:{gw.port}", timeout=30) as client:
        return stub_for(gw), client.generate("hello world", max_tokens=12, temperature=0.0)


def test_model_infer_answers_what_the_sdk_gets(bench, model_name, stub_for):
    stub, want = serving_with_sdk_answer(bench, model_name, stub_for)
    reply = stub.ModelInfer(raw_request(model_name, "hello world", max_tokens=("INT32", 12), temperature=("FP32", 0.0)),
                            timeout=30)
    assert (reply.model_name, reply.model_version, reply.id) == (model_name, "1", "req-1")
    assert text_output(reply) == want.text
    assert params(reply) == {"finish_reason": "length", "prompt_tokens": want.usage.prompt_tokens,
                             "completion_tokens": 12}
    # typed contents and request parameters, as other v2 clients send them
    typed = pb.ModelInferRequest(model_name=model_name, inputs=[
        Tensor(name="text_input", datatype="BYTES", shape=[1], contents=pb.InferTensorContents(bytes_contents=[b"hello world"])),
        Tensor(name="max_tokens", datatype="INT32", shape=[1], contents=pb.InferTensorContents(int_contents=[12]))],
        parameters={"temperature": pb.InferParameter(double_param=0.0)})
    assert text_output(stub.ModelInfer(typed, timeout=30)) == want.text


def test_model_stream_infer_streams_each_request_and_goes_on_after_an_error(bench, model_name, stub_for):
    stub, want = serving_with_sdk_answer(bench, model_name, stub_for)
    requests = [raw_request(model_name, "hello world", max_tokens=("INT32", 12), temperature=("FP32", 0.0),
                            stream=("BOOL", True)),
                raw_request(model_name, "hello world", max_tokens=("INT32", 0)),
                raw_request(model_name, "hello world", max_tokens=("INT32", 3), temperature=("FP32", 0.0))]
    replies = list(stub.ModelStreamInfer(iter(requests), timeout=30))
    errors = [i for i, r in enumerate(replies) if r.error_message]
    assert len(errors) == 1 and replies[errors[0]].error_message.startswith("INVALID_ARGUMENT: max_tokens 0")
    first, second = replies[:errors[0]], replies[errors[0] + 1:]
    assert "".join(text_output(r.infer_response) for r in first) == want.text
    assert [params(r.infer_response)["triton_final_response"] for r in first] == [False] * (len(first) - 1) + [True]
    assert params(first[-1].infer_response)["finish_reason"] == "length"
    assert params(second[-1].infer_response)["completion_tokens"] == 3


def test_health_and_metadata(bench, model_name, stub_for):
    bench.route(model_name)
    gw = bench.start_gateway(model_names=(model_name,))
    stub = stub_for(gw)
    assert stub.ServerLive(pb.ServerLiveRequest()).live
    assert stub.ServerReady(pb.ServerReadyRequest()).ready
    meta = stub.ServerMetadata(pb.ServerMetadataRequest())
    assert meta.name == "shardline" and list(meta.extensions) == ["generate"]
    assert stub.ModelReady(pb.ModelReadyRequest(name=model_name)).ready
    assert not stub.ModelReady(pb.ModelReadyRequest(name=model_name, version="2")).ready
    model = stub.ModelMetadata(pb.ModelMetadataRequest(name=model_name))
    assert (model.name, list(model.versions), model.platform) == (model_name, ["1"], "shardline")
    assert {i.name: i.datatype for i in model.inputs}["text_input"] == "BYTES"
    assert [(o.name, o.datatype) for o in model.outputs] == [("text_output", "BYTES")]
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelMetadata(pb.ModelMetadataRequest(name="nope"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and "model 'nope' is unknown" in e.value.details()


def test_bad_requests_get_status_codes_naming_the_fix(bench, model_name, stub_for):
    bench.route(model_name, token_delay_s=0.05)
    gw = bench.start_gateway(model_names=(model_name,), admission=AdmissionConfig(max_running=1, max_queued=0))
    stub = stub_for(gw)
    good = raw_request(model_name, "hi", max_tokens=("INT32", 2))
    cases = [
        (raw_request(model_name, "hi", max_new_tokens=("INT32", 4)), grpc.StatusCode.INVALID_ARGUMENT,
         "unknown input(s) max_new_tokens; the generate route takes text_input"),
        (raw_request(model_name, "hi", max_tokens=("FP32", 4.0)), grpc.StatusCode.INVALID_ARGUMENT,
         "max_tokens must be an integer, got 4.0"),
        (raw_request(model_name, "hi", stream=("BOOL", True)), grpc.StatusCode.INVALID_ARGUMENT,
         "stream is true: call ModelStreamInfer"),
        (raw_request(model_name, "hi", stream=("INT32", 1)), grpc.StatusCode.INVALID_ARGUMENT,
         "stream must be true or false (BOOL), got 1"),
        (pb.ModelInferRequest(model_name=model_name, inputs=good.inputs, raw_input_contents=good.raw_input_contents[:1]),
         grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents has 1 entries for 2 inputs"),
        (pb.ModelInferRequest(model_name=model_name, inputs=good.inputs, raw_input_contents=[b"\x09\x00", b"\x02\x00\x00\x00"]),
         grpc.StatusCode.INVALID_ARGUMENT, "input text_input: raw BYTES contents end inside"),
        (pb.ModelInferRequest(model_name=model_name, inputs=[Tensor(name="text_input", datatype="STRING", shape=[1])]),
         grpc.StatusCode.INVALID_ARGUMENT, "datatype 'STRING' is not one of BOOL"),
        (pb.ModelInferRequest(model_name=model_name, inputs=good.inputs, raw_input_contents=good.raw_input_contents,
                              outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="output_ids")]),
         grpc.StatusCode.INVALID_ARGUMENT, "unknown output(s) output_ids; the model has text_output only"),
        (pb.ModelInferRequest(model_name=model_name, model_version="3", inputs=good.inputs,
                              raw_input_contents=good.raw_input_contents),
         grpc.StatusCode.NOT_FOUND, "has version 1 only"),
        (raw_request("nope", "hi"), grpc.StatusCode.NOT_FOUND, "model 'nope' is unknown"),
    ]
    for request, code, needle in cases:
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(request, timeout=10)
        assert e.value.code() == code and needle in e.value.details(), (needle, e.value.details())

    threading.Thread(target=lambda: stub.ModelInfer(raw_request(model_name, "x", max_tokens=("INT32", 20)))).start()
    bench.wait_until(lambda: gw.gateway.admission.num_running == 1, what="a running request")
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(good, timeout=10)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert int(dict(e.value.trailing_metadata())["retry-after-ms"]) > 0
    bench.wait_until(lambda: gw.gateway.admission.num_running == 0, what="the running request to finish")
    assert params(stub.ModelInfer(good, timeout=10))["completion_tokens"] == 2, "the door keeps serving"


def test_a_client_that_closes_the_stream_cancels_downstream(bench, model_name, stub_for):
    (fake,), _ = bench.route(model_name, token_delay_s=0.02)
    gw = bench.start_gateway(model_names=(model_name,))
    call = stub_for(gw).ModelStreamInfer(iter([raw_request(model_name, "hi", max_tokens=("INT32", 200))]))
    for n, _ in enumerate(call):
        if n == 2:
            break
    call.cancel()
    bench.wait_until(lambda: len(fake.cancelled) == 1, what="stage 0 stream closed after the v2 client left")
