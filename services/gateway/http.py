"""The OpenAI-compatible HTTP front door: a translation of the same Gateway the gRPC API drives.

    GET  /v1/models
    POST /v1/completions        {"model", "prompt": str | [int], "max_tokens", "temperature", "top_p",
                                 "top_k", "seed", "stop": str | [str], "stream", "ignore_eos", "user"}
                                (logprobs, echo, best_of, penalties, logit_bias, tools, ... : 400
                                 unless left at the value that changes nothing)
    POST /v1/chat/completions   {"model", "messages": [{"role", "content"}], ... as above}
    GET  /health                200 once a route exists, else 503 (readiness)
    /v2/...                     Triton / KServe-v2 health, metadata and generate routes (http_v2.py)

`stream: true` answers with server-sent events (`data: {...}` per delta, then `data: [DONE]`);
a client that disconnects cancels the request downstream. Errors are JSON
`{"error": {"message", "type", "code"}}` with 400 (bad value, too long), 404 (unknown model),
429 (queue full, with Retry-After), 503 (no route). A small HTTP/1.1 server on asyncio streams
(keep-alive for plain responses, connection closed after a stream) keeps the gateway free of
web-framework dependencies.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from contextlib import aclosing
from dataclasses import dataclass

from .errors import GatewayError, InvalidArgument, ResourceExhausted
from .generation import Chunk, Complete, collect, finish_reason
from .service import Gateway
from .validation import GenerateInput

log = logging.getLogger("shardline.gateway.http")

MAX_BODY_BYTES = 4 << 20
MAX_HEADER_BYTES = 64 << 10
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 413: "Payload Too Large",
           429: "Too Many Requests", 500: "Internal Server Error",
           503: "Service Unavailable"}


class HttpError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", headers=()) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, list(headers)
        self.v2 = False  # answered in the v2 protocol's form, {"error": message}


def http_error(e: GatewayError) -> HttpError:
    headers = []
    if isinstance(e, ResourceExhausted):
        headers.append(("Retry-After", str(max(1, math.ceil(e.retry_after_s)))))
    kind = "invalid_request_error" if e.http_status in (400, 404) else e.code.name.lower()
    return HttpError(e.http_status, e.message, kind, headers)


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def keep_alive(self) -> bool:
        """The client may send another request on this connection (it did not ask to close)."""
        return self.headers.get("connection", "").lower() != "close"


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """One HTTP/1.1 request, or None when the peer closed the connection between requests."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    except asyncio.LimitOverrunError:
        raise HttpError(413, f"request headers exceed {MAX_HEADER_BYTES} bytes")
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, _ = lines[0].split(" ", 2)
    except ValueError:
        raise HttpError(400, f"malformed request line {lines[0][:100]!r}")
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    else:
        try:
            length = int(headers.get("content-length") or 0)
        except ValueError:
            raise HttpError(400, f"Content-Length {headers['content-length'][:40]!r} is not a number")
        if length > MAX_BODY_BYTES:
            raise HttpError(413, f"request body of {length} bytes exceeds {MAX_BODY_BYTES}")
        body = await reader.readexactly(length) if length > 0 else b""
    return Request(method.upper(), target.split("?", 1)[0], headers, body)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    """A Transfer-Encoding: chunked body (sizes in hex, a zero-size chunk last, trailers ignored)."""
    parts, total = [], 0
    while True:
        try:
            line = await reader.readuntil(b"\r\n")
        except asyncio.LimitOverrunError:
            raise HttpError(400, "a chunk-size line is too long")
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise HttpError(400, f"malformed chunk size {line[:40]!r}")
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, up to the blank line
                pass
            return b"".join(parts)
        total += size
        if total > MAX_BODY_BYTES:
            raise HttpError(413, f"request body exceeds {MAX_BODY_BYTES} bytes")
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)  # the chunk's CRLF


def response_bytes(status: int, body: dict, headers=(), keep_alive: bool = True) -> bytes:
    payload = json.dumps(body).encode()
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, '')}", "Content-Type: application/json",
             f"Content-Length: {len(payload)}", f"Connection: {'keep-alive' if keep_alive else 'close'}"]
    lines += [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


def error_body(e: HttpError) -> dict:
    if e.v2:
        return {"error": e.message}
    return {"error": {"message": e.message, "type": e.kind, "code": e.status}}


# OpenAI fields that would change the answer and that shardline does not implement, with the values
# that leave the answer as it is. A request that sets one to anything else is refused (400) rather
# than answered as if the field were absent: a client asking for logprobs must not get null (and a
# completions logprobs of 0 asks for the chosen tokens' logprobs, so only null and false are neutral).
NOT_IMPLEMENTED = {
    "logprobs": (None, False), "top_logprobs": (None, 0), "echo": (None, False), "best_of": (None, 1),
    "suffix": (None, ""), "presence_penalty": (None, 0), "frequency_penalty": (None, 0),
    "repetition_penalty": (None, 1), "logit_bias": (None, {}), "tools": (None, []), "functions": (None, []),
    "response_format": (None, {"type": "text"}),
}


def _refuse_not_implemented(body: dict) -> None:
    for name, neutral in NOT_IMPLEMENTED.items():
        value = body.get(name)
        # bool is an int: True must not pass as a best_of of 1, nor False as a penalty of 0
        if not any(value == v and isinstance(value, bool) == isinstance(v, bool) for v in neutral):
            shown = " or ".join(json.dumps(v) for v in neutral if v is not None)
            raise InvalidArgument(f"{name} is not supported (got {json.dumps(value)}); omit it or set it to {shown}")


def _typed(body: dict, name: str, types: tuple, default=None):
    """body[name] if it is one of `types` (a bool is not taken for an int), default if absent or null."""
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, types) or isinstance(value, bool) and bool not in types:
        raise InvalidArgument(f"{name} must be {' or '.join(t.__name__ for t in types)}, got {json.dumps(value)}")
    return value


def _list_of(body: dict, name: str, kind: type, what: str) -> list:
    values = _typed(body, name, (list,), [])
    if not all(isinstance(v, kind) and not isinstance(v, bool) for v in values):
        raise InvalidArgument(f"{name} must be a list of {what}, got {json.dumps(values)[:200]}")
    return values


def _parse_input(body: dict, chat: bool) -> GenerateInput:
    _refuse_not_implemented(body)
    if _typed(body, "n", (int,), 1) != 1:
        raise InvalidArgument("n must be 1: one completion per request")
    stop = _typed(body, "stop", (str, list), [])
    stop = [stop] if isinstance(stop, str) else _list_of(body, "stop", str, "strings")
    max_tokens = _typed(body, "max_tokens", (int,))
    if max_tokens is None:
        max_tokens = _typed(body, "max_completion_tokens", (int,))  # the newer chat name
    req = GenerateInput(
        model=_typed(body, "model", (str,), ""), max_tokens=max_tokens,
        temperature=_typed(body, "temperature", (int, float)), top_k=_typed(body, "top_k", (int,), 0),
        top_p=_typed(body, "top_p", (int, float)), seed=_typed(body, "seed", (int,)), stop=stop,
        stop_token_ids=_list_of(body, "stop_token_ids", int, "token ids"),
        ignore_eos=_typed(body, "ignore_eos", (bool,), False), request_id=_typed(body, "request_id", (str,), ""))
    if chat:
        messages = _typed(body, "messages", (list,), [])
        if not messages or not all(isinstance(m, dict) and isinstance(m.get("role"), str) and m["role"]
                                   for m in messages):
            hint = " (prompt is for /v1/completions)" if "prompt" in body else ""
            raise InvalidArgument('messages must be a non-empty list of {"role": ..., "content": ...} objects'
                                  + hint)
        req.chat = [{"role": m["role"], "content": _content_text(m.get("content"))} for m in messages]
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if prompt == "" or prompt == []:  # in this API's words, not the gRPC fields' (validation.py)
            raise InvalidArgument("prompt is empty: send some text or at least one token id")
        if isinstance(prompt, str):
            req.prompt_text = prompt
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            req.prompt_token_ids = prompt
        else:
            hint = " (messages are for /v1/chat/completions)" if prompt is None and "messages" in body else ""
            raise InvalidArgument("prompt must be a string or a list of token ids (one prompt per request)" + hint)
    return req


def _stream_flags(body: dict) -> tuple[bool, bool]:
    """(stream, stream_options.include_usage), checked before the request is submitted."""
    options = _typed(body, "stream_options", (dict,), {})
    return _typed(body, "stream", (bool,), False), _typed(options, "include_usage", (bool,), False)


def _content_text(content) -> str:
    """OpenAI content is a string or a list of parts; text parts are joined, others refused."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise InvalidArgument("messages[].content must be a string or a list of {\"type\": \"text\"} parts")


class HttpFrontDoor:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        from .http_v2 import V2Routes  # it builds on this module's pieces
        self.v2 = V2Routes(self)

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._connection, host, port, limit=MAX_HEADER_BYTES)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    try:
                        request = await asyncio.wait_for(read_request(reader),
                                                         self.gateway.config.http_idle_timeout_s)
                    except asyncio.TimeoutError:
                        return  # idle, or trickling its head: closed without an answer, as servers do
                    if request is None:
                        return
                    keep_alive = await self._dispatch(request, writer) and request.keep_alive
                except HttpError as e:
                    writer.write(response_bytes(e.status, error_body(e), e.headers, keep_alive=False))
                    keep_alive = False
                await writer.drain()
                if not keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the peer went away; a running generation was closed (and cancelled) already
        finally:
            writer.close()

    async def _dispatch(self, request: Request, writer: asyncio.StreamWriter) -> bool:
        v2 = request.path == "/v2" or request.path.startswith("/v2/")
        try:
            return await (self.v2.dispatch(request, writer) if v2 else self._openai(request, writer))
        except GatewayError as e:
            error = http_error(e)
        except HttpError as e:
            error = e
        except (ConnectionError, asyncio.IncompleteReadError):
            raise
        except Exception as e:  # noqa: BLE001 - a bug answers 500 and leaves the server running
            log.exception("%s %s failed", request.method, request.path)
            error = HttpError(500, f"internal error ({type(e).__name__}: {e}); the gateway log has the traceback",
                              kind="internal_error")
        error.v2 = v2
        raise error

    async def _openai(self, request: Request, writer: asyncio.StreamWriter) -> bool:
        routes = {("GET", "/v1/models"): self._models, ("GET", "/health"): self._health,
                  ("POST", "/v1/completions"): self._completions, ("POST", "/v1/chat/completions"): self._chat}
        handler = routes.get((request.method, request.path))
        if handler is None:
            if any(path == request.path for _, path in routes):
                raise HttpError(405, f"{request.method} is not allowed on {request.path}")
            raise HttpError(404, f"no route {request.path}; try /v1/completions, /v1/chat/completions, /v1/models "
                                 "(or the v2 routes, /v2/models/{model}/generate)")
        return await handler(request, writer)

    @staticmethod
    def response(status: int, body: dict, request: Request) -> bytes:
        return response_bytes(status, body, keep_alive=request.keep_alive)

    async def _health(self, request: Request, writer) -> bool:
        status = 200 if self.gateway.is_serving else 503
        writer.write(response_bytes(status, {"serving": self.gateway.is_serving}, keep_alive=request.keep_alive))
        return True

    async def _models(self, request: Request, writer) -> bool:
        models = await self.gateway.list_models()
        writer.write(response_bytes(200, {"object": "list", "data": [
            {"id": m.name, "object": "model", "created": 0, "owned_by": "shardline", "max_model_len": m.max_model_len,
             "num_stages": m.num_stages, "tp_size": m.tp_size, "num_routes": m.num_routes} for m in models]},
            keep_alive=request.keep_alive))
        return True

    async def _completions(self, request: Request, writer) -> bool:
        return await self._generate(request, writer, chat=False)

    async def _chat(self, request: Request, writer) -> bool:
        return await self._generate(request, writer, chat=True)

    async def _generate(self, request: Request, writer: asyncio.StreamWriter, chat: bool) -> bool:
        body = json_body(request)
        if not isinstance(body, dict):
            raise HttpError(400, "the request body must be a JSON object")
        req, (stream, include_usage) = _parse_input(body, chat), _stream_flags(body)
        generation = await self.gateway.submit(req)
        envelope = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{generation.request_id}",
                    "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                    "model": generation.model}
        async with aclosing(generation.events()) as events:
            if stream:
                await self._stream(events, writer, envelope, chat, include_usage)
                return False
            text, complete = await collect(events)
        choice = {"index": 0, "finish_reason": finish_reason(complete), "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        writer.write(response_bytes(200, {**envelope, "choices": [choice], "usage": _usage(complete)},
                                    keep_alive=request.keep_alive))
        return True

    async def _stream(self, events, writer: asyncio.StreamWriter, envelope: dict, chat: bool,
                      include_usage: bool) -> None:
        if chat:
            envelope = {**envelope, "object": "chat.completion.chunk"}
        is_first = True

        def choice(text: str, reason) -> dict:
            if chat:
                delta = {"role": "assistant", "content": text} if is_first else {"content": text}
                return {"index": 0, "delta": delta, "finish_reason": reason}
            return {"index": 0, "text": text, "finish_reason": reason, "logprobs": None}

        def render(event) -> list[dict]:
            nonlocal is_first
            if isinstance(event, Chunk):
                if not (event.text or is_first):
                    return []
                out = [{**envelope, "choices": [choice(event.text, None)]}]
                is_first = False
                return out
            out = [{**envelope, "choices": [choice("", finish_reason(event))]}]
            return out + ([{**envelope, "choices": [], "usage": _usage(event)}] if include_usage else [])

        await self.sse(events, writer, render, what=envelope["id"], done=b"data: [DONE]\n\n")

    async def sse(self, events, writer: asyncio.StreamWriter, render, what: str, done: bytes = b"",
                  v2: bool = False) -> None:
        """A generation's `events` as server-sent events: the status line, then the objects
        `render(event)` makes of each Chunk and of the Complete, each `data: {...}`; an error, once
        the status line is sent, as an event of its own (in the v2 form if `v2`); `done` last."""
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                     b"Connection: close\r\n\r\n")

        async def send(obj: dict) -> None:
            writer.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            await writer.drain()  # raises ConnectionError once the client is gone: we stop and cancel

        try:
            async for event in events:
                for obj in render(event):
                    await send(obj)
        except GatewayError as e:  # the status line is sent: the error goes in the stream
            error = http_error(e)
            error.v2 = v2
            await send(error_body(error))
        except (ConnectionError, asyncio.IncompleteReadError):
            raise
        except Exception as e:  # noqa: BLE001 - as in _dispatch, but the status line is sent
            log.exception("stream %s failed", what)
            error = HttpError(500, f"internal error ({type(e).__name__}: {e})", kind="internal_error")
            error.v2 = v2
            await send(error_body(error))
        writer.write(done)


def json_body(request: Request):
    """The request's body as JSON (an empty body is {}), or a 400 naming the parse error."""
    try:
        return json.loads(request.body or b"{}")
    except ValueError as e:
        raise HttpError(400, f"the request body is not JSON: {e}")


def _usage(c: Complete) -> dict:
    return {"prompt_tokens": c.usage.prompt_tokens, "completion_tokens": c.usage.completion_tokens,
            "total_tokens": c.usage.total_tokens}


async def start_http(gateway: Gateway, host: str, port: int) -> HttpFrontDoor:
    front = HttpFrontDoor(gateway)
    await front.start(host, port)
    return front

