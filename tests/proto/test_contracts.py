"""The contracts behave as their comments promise: raw tensor bytes, explicit presence where
0 is a meaningful value, and one-of prompt/event forms."""

import numpy as np

from shardline.v1 import common_pb2, gateway_pb2, kserve_v2_pb2, stage_pb2, tokenizer_pb2


def test_micro_batch_round_trips_hidden_states_as_raw_bytes():
    hidden = np.arange(3 * 5, dtype=np.float32).reshape(3, 5)  # (num_tokens_total, hidden)
    batch = stage_pb2.MicroBatch(
        micro_batch_id=7, origin="10.0.0.1:7000", route=["10.0.0.2:7000"],
        sequences=[stage_pb2.SequenceChunk(request_id="a", start_position=0, num_tokens=2, sample=True,
                                           sampling=common_pb2.SamplingParams(temperature=0.0, seed=1)),
                   stage_pb2.SequenceChunk(request_id="b", start_position=9, num_tokens=1, sample=True)],
        hidden=common_pb2.Tensor(data=hidden.tobytes(), shape=hidden.shape, dtype="float32"),
        free_request_ids=["c"])
    decoded = stage_pb2.MicroBatch.FromString(batch.SerializeToString())
    restored = np.frombuffer(decoded.hidden.data, dtype="<f4").reshape(tuple(decoded.hidden.shape))
    np.testing.assert_array_equal(restored, hidden)
    assert sum(c.num_tokens for c in decoded.sequences) == decoded.hidden.shape[0]
    assert decoded.sequences[0].sampling.HasField("seed") and not decoded.sequences[1].sampling.HasField("seed")


def test_token_event_distinguishes_token_zero_from_no_token():
    # Token id 0 is a real token; a cancelled stream's final event carries none.
    with_zero = stage_pb2.TokenEvent.FromString(stage_pb2.TokenEvent(token_id=0).SerializeToString())
    final = stage_pb2.TokenEvent(finish_reason=common_pb2.FINISH_REASON_CANCELLED)
    assert with_zero.HasField("token_id")
    assert not final.HasField("token_id")


def test_generate_request_prompt_is_one_of_three_forms():
    request = gateway_pb2.GenerateRequest(prompt_text="hi", temperature=0.0)
    assert request.WhichOneof("prompt") == "prompt_text"
    assert request.HasField("temperature"), "temperature 0 (greedy) must be distinguishable from unset"
    request.chat.messages.add(role="user", content="hi")
    assert request.WhichOneof("prompt") == "chat", "setting another prompt form replaces the first"
    assert not gateway_pb2.GenerateRequest().HasField("max_tokens")


def test_stream_response_is_a_oneof_of_chunk_complete_error():
    events = [gateway_pb2.GenerateStreamResponse(chunk=gateway_pb2.StreamChunk(text="안", token_ids=[1, 2])),
              gateway_pb2.GenerateStreamResponse(complete=gateway_pb2.StreamComplete(
                  finish_reason=common_pb2.FINISH_REASON_STOP, usage=common_pb2.Usage(prompt_tokens=3))),
              gateway_pb2.GenerateStreamResponse(error=gateway_pb2.StreamError(code="UNAVAILABLE"))]
    assert [e.WhichOneof("event") for e in events] == ["chunk", "complete", "error"]


def test_services_expose_the_documented_methods():
    methods = {s.name: [m.name for m in s.methods] for f in (stage_pb2, gateway_pb2, tokenizer_pb2, kserve_v2_pb2)
               for s in f.DESCRIPTOR.services_by_name.values()}
    assert methods == {
        "StageWorker": ["Generate", "GenerateMany", "Forward", "ReturnTokens", "Free", "GetStatus"],
        "Gateway": ["Generate", "GenerateStream", "Cancel", "GetRequest", "ListModels"],
        "Tokenizer": ["Encode", "ApplyChatTemplate", "Decode", "DetokenizeStream", "DetokenizeMany", "GetInfo"],
        "GRPCInferenceService": ["ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
                                 "ModelInfer", "ModelStreamInfer"],
    }
    # the v2 protocol's names, which its clients call: package inference, not shardline.v1
    assert kserve_v2_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name == "inference.GRPCInferenceService"
