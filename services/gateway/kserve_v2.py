"""The KServe v2 gRPC door (inference.GRPCInferenceService, proto/shardline/v1/kserve_v2.proto) on
the gateway's gRPC port: a translation of the same Gateway, as http_v2.py is over HTTP.

ModelInfer takes the generate route's inputs (http_v2.INPUTS): text_input (BYTES), max_tokens,
temperature, top_k, top_p, seed or random_seed, stop or stop_words (BYTES, any count) and
ignore_eos, each as an input tensor (typed contents or its raw_input_contents entry) or as a
request parameter, and answers text_output (BYTES [1], in raw_output_contents as Triton sends it)
with finish_reason, prompt_tokens and completion_tokens as response parameters. Errors end the
call with the Gateway's status codes: INVALID_ARGUMENT naming the input, NOT_FOUND, RESOURCE_EXHAUSTED
(retry-after-ms in the trailers), UNAVAILABLE.

ModelStreamInfer runs each request of the stream in turn as a generation and answers each text
delta as a response (parameter triton_final_response false), then one with an empty text_output,
the finish reason and the counts (triton_final_response true). A request that fails answers
error_message instead, and the stream goes on with the next. A client that closes the stream
cancels its running generation downstream. The optional `stream` input TRT-LLM clients send is
taken here (true or false: this method streams) and refused by ModelInfer.
"""

from __future__ import annotations

import struct
from contextlib import aclosing
import numpy as np

from shardline.v1 import kserve_v2_pb2 as pb
from shardline.v1 import kserve_v2_pb2_grpc

from .errors import GatewayError, InvalidArgument, NotFound, UnknownModel, abort
from .generation import Chunk, Complete, collect
from .http_v2 import VERSION, end_fields, find_model, input_metadata, parse_generate, server_version
from .service import Gateway
from .validation import GenerateInput

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
# datatype -> (its field of InferTensorContents, the numpy dtype of its raw little-endian elements)
DATATYPES = {"BOOL": ("bool_contents", "?"), "INT8": ("int_contents", "<i1"), "INT16": ("int_contents", "<i2"),
             "INT32": ("int_contents", "<i4"), "INT64": ("int64_contents", "<i8"), "UINT8": ("uint_contents", "<u1"),
             "UINT16": ("uint_contents", "<u2"), "UINT32": ("uint_contents", "<u4"),
             "UINT64": ("uint64_contents", "<u8"), "FP16": (None, "<f2"), "FP32": ("fp32_contents", "<f4"),
             "FP64": ("fp64_contents", "<f8"), "BYTES": ("bytes_contents", None)}
# Request parameters of Triton's that ask for what this door does anyway.
TRITON_PARAMETERS = ("triton_enable_empty_final_response",)


def _bytes_elements(raw: bytes, name: str) -> list[bytes]:
    """A raw BYTES tensor: each element a 4-byte little-endian length, then that many bytes."""
    out, at = [], 0
    while at < len(raw):
        if at + 4 > len(raw):
            raise InvalidArgument(f"input {name}: raw BYTES contents end inside an element's 4-byte length")
        (n,) = struct.unpack_from("<I", raw, at)
        if at + 4 + n > len(raw):
            raise InvalidArgument(f"input {name}: a raw BYTES element of {n} bytes runs past the contents")
        out.append(raw[at + 4:at + 4 + n])
        at += 4 + n
    return out


def tensor_values(tensor, raw: bytes | None) -> list:
    """An input tensor's elements as Python values (BYTES as str), from `raw` if given."""
    if tensor.datatype not in DATATYPES:
        raise InvalidArgument(f"input {tensor.name}: datatype {tensor.datatype!r} is not one of {', '.join(DATATYPES)}")
    field, dtype = DATATYPES[tensor.datatype]
    if raw is not None:
        values = _bytes_elements(raw, tensor.name) if dtype is None else np.frombuffer(raw, dtype=dtype).tolist()
    elif field is None:
        raise InvalidArgument(f"input {tensor.name}: {tensor.datatype} comes in raw_input_contents only")
    else:
        values = list(getattr(tensor.contents, field))
    if tensor.datatype == "BYTES":
        try:
            values = [v.decode() for v in values]
        except UnicodeDecodeError as e:
            raise InvalidArgument(f"input {tensor.name}: not UTF-8 text ({e})") from None
    return values


def v2_error(e: GatewayError) -> GatewayError:
    """The error as this door reports it: an unknown model is NOT_FOUND here, as in ModelMetadata
    (the shardline API keeps INVALID_ARGUMENT, as it promises)."""
    return NotFound(e.message) if isinstance(e, UnknownModel) else e


def parameter_value(p: pb.InferParameter):
    kind = p.WhichOneof("parameter_choice")
    return getattr(p, kind) if kind else None


def input_from_wire(request: pb.ModelInferRequest, streaming: bool) -> GenerateInput:
    """A ModelInfer request -> GenerateInput (through the generate route's checks)."""
    if request.model_version not in ("", VERSION):
        raise NotFound(f"model {request.model_name!r} has version {VERSION} only, not {request.model_version!r}")
    if request.raw_input_contents and len(request.raw_input_contents) != len(request.inputs):
        raise InvalidArgument(f"raw_input_contents has {len(request.raw_input_contents)} entries for "
                              f"{len(request.inputs)} inputs; give one for each input, in their order")
    wanted = sorted({o.name for o in request.outputs} - {"text_output"})
    if wanted:
        raise InvalidArgument(f"unknown output(s) {', '.join(wanted)}; the model has text_output only")
    inputs = {}
    for i, tensor in enumerate(request.inputs):
        values = tensor_values(tensor, request.raw_input_contents[i] if request.raw_input_contents else None)
        if tensor.name in ("text_input", "stop", "stop_words"):
            inputs[tensor.name] = values
        elif len(values) == 1:
            inputs[tensor.name] = values[0]
        else:
            raise InvalidArgument(f"input {tensor.name} must hold one element, got {len(values)} "
                                  f"(shape {list(tensor.shape)})")
    parameters = {k: parameter_value(v) for k, v in request.parameters.items() if k not in TRITON_PARAMETERS}
    stream = inputs.pop("stream", parameters.pop("stream", False))
    if not isinstance(stream, bool):
        raise InvalidArgument(f"stream must be true or false (BOOL), got {stream!r}")
    if stream and not streaming:
        raise InvalidArgument("stream is true: call ModelStreamInfer for a stream of responses, or drop stream")
    # The request's `id` is the client's to echo, often the same for every call: the gateway's
    # request gets an id of its own.
    return parse_generate(request.model_name, {**inputs, "parameters": parameters})


def response(request_id: str, model: str, text: str, complete: Complete | None = None,
             final: bool | None = None) -> pb.ModelInferResponse:
    parameters = {}
    if complete is not None:  # the HTTP door's end fields: a string and two counts
        parameters = {k: pb.InferParameter(**{"string_param" if isinstance(v, str) else "int64_param": v})
                      for k, v in end_fields(complete).items()}
    if final is not None:
        parameters["triton_final_response"] = pb.InferParameter(bool_param=final)
    data = text.encode()
    return pb.ModelInferResponse(
        model_name=model, model_version=VERSION, id=request_id, parameters=parameters,
        outputs=[pb.ModelInferResponse.InferOutputTensor(name="text_output", datatype="BYTES", shape=[1])],
        raw_output_contents=[struct.pack("<I", len(data)) + data])


class KServeV2Servicer(kserve_v2_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self.gateway.is_serving)

    async def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(name="shardline", version=server_version(), extensions=["generate"])

    async def _model(self, name: str, context):
        try:
            return await find_model(self.gateway, name)
        except NotFound as e:
            await abort(context, e)

    async def ModelReady(self, request, context):
        info = await self._model(request.name, context)
        return pb.ModelReadyResponse(ready=info.num_routes > 0 and request.version in ("", VERSION))

    async def ModelMetadata(self, request, context):
        await self._model(request.name, context)
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=request.name, versions=[VERSION], platform="shardline",
            inputs=[tensor(name=i["name"], datatype=i["datatype"], shape=i["shape"]) for i in input_metadata()],
            outputs=[tensor(name="text_output", datatype="BYTES", shape=[1])])

    async def ModelInfer(self, request, context):
        try:
            generation = await self.gateway.submit(input_from_wire(request, streaming=False))
            async with aclosing(generation.events()) as events:
                text, complete = await collect(events)
        except GatewayError as e:
            await abort(context, v2_error(e))
        return response(request.id, generation.model, text, complete)

    async def ModelStreamInfer(self, request_iterator, context):
        async for request in request_iterator:
            try:
                generation = await self.gateway.submit(input_from_wire(request, streaming=True))
                async with aclosing(generation.events()) as events:
                    async for event in events:
                        if isinstance(event, Chunk):
                            if event.text:
                                yield pb.ModelStreamInferResponse(
                                    infer_response=response(request.id, generation.model, event.text, final=False))
                        else:
                            yield pb.ModelStreamInferResponse(
                                infer_response=response(request.id, generation.model, "", event, final=True))
            except GatewayError as e:
                e = v2_error(e)
                yield pb.ModelStreamInferResponse(error_message=f"{e.code.name}: {e.message}")


def add_to_server(gateway: Gateway, server) -> None:
    kserve_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(KServeV2Servicer(gateway), server)
