"""The Triton / KServe-v2 routes of the HTTP front door: health, metadata and the generate extension.

    GET  /v2/health/live                    200 while the front door answers
    GET  /v2/health/ready                   200 once some model has a route, else 503
    GET  /v2                                {"name", "version", "extensions": ["generate"]}
    GET  /v2/models/{model}                 the model's inputs and outputs (the generate extension's)
    GET  /v2/models/{model}/ready           200 when the model has a route, else 503
    POST /v2/models/{model}/generate        {"text_input": str, "max_tokens", "temperature", "top_k",
                                             "top_p", "seed" (or "random_seed"), "stop" (or
                                             "stop_words"), "ignore_eos"} -> {"model_name",
                                             "model_version", "text_output", "finish_reason",
                                             "prompt_tokens", "completion_tokens"}
    POST /v2/models/{model}/generate_stream the same, as server-sent events: one `data: {...,
                                             "text_output": delta}` a delta, the last one with
                                             "finish_reason" (no [DONE], as Triton sends none)

A client written for a Triton LLM deployment (`curl .../v2/models/ensemble/generate -d
'{"text_input": ..., "max_tokens": 16}'`) works against shardline with the model's name. The
inputs may also come in a "parameters" object, as some clients send them; a key given in both,
or one shardline does not know, is refused naming the keys it takes. Errors are the v2 form,
{"error": message}, with the OpenAI routes' statuses: 400 (bad value), 404 (unknown model or
route), 429 (queue full, Retry-After), 503 (no route), 500 (a bug; the server keeps serving).
"""

from __future__ import annotations

import asyncio
import json
from contextlib import aclosing
from importlib import metadata

from .errors import InvalidArgument, NotFound
from .generation import Chunk, Complete, collect, finish_reason
from .http import HttpError, json_body
from .validation import GenerateInput

VERSION = "1"  # every model has one version
SUFFIXES = ("/generate_stream", "/generate", "/ready")
# input -> (GenerateInput field, JSON types, what the message calls them, the v2 datatype); the
# gRPC door (kserve_v2.py) takes the same inputs.
INPUTS = {
    "text_input": ("prompt_text", (str, list), "a string", "BYTES"),
    "max_tokens": ("max_tokens", (int,), "an integer", "INT32"),
    "temperature": ("temperature", (int, float), "a number", "FP32"),
    "top_k": ("top_k", (int,), "an integer", "INT32"),
    "top_p": ("top_p", (int, float), "a number", "FP32"),
    "seed": ("seed", (int,), "an integer", "UINT64"),
    "random_seed": ("seed", (int,), "an integer", "UINT64"),
    "stop": ("stop", (str, list), "a string or a list of strings", "BYTES"),
    "stop_words": ("stop", (str, list), "a string or a list of strings", "BYTES"),
    "ignore_eos": ("ignore_eos", (bool,), "true or false", "BOOL"),
}


def input_metadata() -> list[dict]:
    """The generate inputs as v2 model metadata lists them; text_input alone is required."""
    return [{"name": name, "datatype": spec[3], "shape": [-1] if name.startswith("stop") else [1],
             "optional": name != "text_input"} for name, spec in INPUTS.items()]


def server_version() -> str:
    try:
        return metadata.version("shardline")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


async def find_model(gateway, name: str):
    """The ModelInfo of `name`, or NotFound naming the models this gateway serves."""
    models = await gateway.list_models()
    for info in models:
        if info.name == name:
            return info
    raise NotFound(f"model {name!r} is unknown; this gateway serves {[m.name for m in models]}")


def end_fields(complete: Complete) -> dict:
    """What the last answer of a generation carries besides its text, in either v2 door."""
    return {"finish_reason": finish_reason(complete), "prompt_tokens": complete.usage.prompt_tokens,
            "completion_tokens": complete.usage.completion_tokens}


def split_path(path: str) -> tuple[str, str] | None:
    """(model, route) of /v2/models/{model}[/generate|/generate_stream|/ready]; route "" is the
    metadata. None for any other path."""
    prefix = "/v2/models/"
    if not path.startswith(prefix) or len(path) == len(prefix):
        return None
    rest = path[len(prefix):]
    for suffix in SUFFIXES:
        if rest.endswith(suffix) and len(rest) > len(suffix):
            return rest[:-len(suffix)], suffix[1:]
    return rest, ""


def parse_generate(model: str, body) -> GenerateInput:
    """A generate extension request body -> GenerateInput, or InvalidArgument naming the input."""
    if not isinstance(body, dict):
        raise InvalidArgument('the request body must be a JSON object, e.g. {"text_input": "Hello", "max_tokens": 16}')
    inputs = {k: v for k, v in body.items() if k != "parameters"}
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidArgument(f"parameters must be an object, got {json.dumps(parameters)[:100]}")
    both = sorted(set(inputs) & set(parameters))
    if both:
        raise InvalidArgument(f"{', '.join(both)} given both as an input and in parameters; give each once")
    inputs.update(parameters)
    unknown = sorted(set(inputs) - set(INPUTS))
    if unknown:
        raise InvalidArgument(f"unknown input(s) {', '.join(unknown)}; the generate route takes "
                              f"{', '.join(INPUTS)}")
    same = [(a, b) for a, b in (("seed", "random_seed"), ("stop", "stop_words")) if a in inputs and b in inputs]
    if same:
        raise InvalidArgument(f"{same[0][0]} and {same[0][1]} are one input; give one of them")
    req = GenerateInput(model=model)
    for name, value in inputs.items():
        field, types, what, _ = INPUTS[name]
        if value is None:
            continue
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise InvalidArgument(f"{name} must be {what}, got {json.dumps(value)[:100]}")
        if name == "text_input" and isinstance(value, list):  # a BYTES tensor of one element
            if len(value) != 1 or not isinstance(value[0], str):
                raise InvalidArgument(f"text_input must be a string (or a list of one), got {json.dumps(value)[:100]}")
            value = value[0]
        if field == "stop":
            value = [value] if isinstance(value, str) else value
            if not all(isinstance(s, str) for s in value):
                raise InvalidArgument(f"{name} must be {what}, got {json.dumps(value)[:100]}")
        setattr(req, field, value)
    if req.prompt_text is None:
        raise InvalidArgument('text_input is required, e.g. {"text_input": "Hello", "max_tokens": 16}')
    if not req.prompt_text:
        raise InvalidArgument('text_input is empty: send some text, e.g. {"text_input": "Hello", "max_tokens": 16}')
    return req


class V2Routes:
    """The /v2 routes of one HttpFrontDoor. Each handler writes its answer and returns whether the
    connection may serve another request; errors are raised (GatewayError or http.HttpError) and
    answered by the front door in the v2 form."""

    def __init__(self, front) -> None:
        self.front = front
        self.gateway = front.gateway

    async def dispatch(self, request, writer: asyncio.StreamWriter) -> bool:
        fixed = {"/v2": self._server, "/v2/health/live": self._live, "/v2/health/ready": self._ready}
        if request.path in fixed:
            self._allow(request, "GET")
            return await fixed[request.path](request, writer)
        parts = split_path(request.path)
        if parts is None:
            raise HttpError(404, f"no route {request.path}; the v2 routes are /v2/health/live, /v2/health/ready, "
                                 "/v2/models/{model}[/ready|/generate|/generate_stream]")
        model, route = parts
        if route in ("generate", "generate_stream"):
            self._allow(request, "POST")
            return await self._generate(request, writer, model, stream=route == "generate_stream")
        self._allow(request, "GET")
        info = await find_model(self.gateway, model)
        if route == "ready":
            writer.write(self.front.response(200 if info.num_routes else 503, {"name": model, "ready":
                                                                              bool(info.num_routes)}, request))
            return True
        writer.write(self.front.response(200, {
            "name": model, "versions": [VERSION], "platform": "shardline",
            "inputs": input_metadata(),
            "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [1]}],
            "max_model_len": info.max_model_len, "num_stages": info.num_stages, "tp_size": info.tp_size}, request))
        return True

    @staticmethod
    def _allow(request, method: str) -> None:
        if request.method != method:
            raise HttpError(405, f"{request.method} is not allowed on {request.path}; use {method}")

    async def _server(self, request, writer) -> bool:
        writer.write(self.front.response(200, {"name": "shardline", "version": server_version(),
                                               "extensions": ["generate"]}, request))
        return True

    async def _live(self, request, writer) -> bool:
        writer.write(self.front.response(200, {"live": True}, request))
        return True

    async def _ready(self, request, writer) -> bool:
        serving = self.gateway.is_serving
        writer.write(self.front.response(200 if serving else 503, {"ready": serving}, request))
        return True

    async def _generate(self, request, writer: asyncio.StreamWriter, model: str, stream: bool) -> bool:
        generation = await self.gateway.submit(parse_generate(model, json_body(request)))
        envelope = {"model_name": generation.model, "model_version": VERSION}
        async with aclosing(generation.events()) as events:
            if stream:
                def render(event) -> list[dict]:
                    if isinstance(event, Chunk):
                        return [{**envelope, "text_output": event.text}] if event.text else []
                    return [{**envelope, "text_output": "", **end_fields(event)}]

                await self.front.sse(events, writer, render, what=generation.request_id, v2=True)
                return False
            text, complete = await collect(events)
        writer.write(self.front.response(200, {**envelope, "text_output": text, **end_fields(complete)}, request))
        return True
