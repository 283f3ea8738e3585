"""gRPC front of the tokenizer service: translates the wire to `TokenizerService` and back.

Runs on grpc.aio, so that an open DetokenizeStream (one per generating request) costs a
coroutine, not a thread. Encode and ApplyChatTemplate, which can take milliseconds on a long
prompt, run in a worker thread so that they do not stall the streams. A ValueError from the
service (bad input) becomes INVALID_ARGUMENT with its message; the server keeps serving.
Standard gRPC health (serving once the tokenizer is loaded, not serving while draining) and
server reflection are registered.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from shardline.v1 import tokenizer_pb2, tokenizer_pb2_grpc

from .detokenizer import IncrementalDetokenizer
from .service import TokenizerService

logger = logging.getLogger(__name__)

SERVICE_NAME = tokenizer_pb2.DESCRIPTOR.services_by_name["Tokenizer"].full_name


@dataclass(frozen=True)
class TokenizerServerConfig:
    model_dir: Path  # a HuggingFace model (or converted model) directory with tokenizer.json
    address: str = "0.0.0.0:50052"  # host:port to listen on; port 0 picks a free one
    grace_seconds: float = 5.0  # on SIGTERM, how long open streams may take to finish (>= 0)

    def __post_init__(self) -> None:
        if self.grace_seconds < 0:
            raise ValueError(f"grace_seconds {self.grace_seconds} is negative; use 0 or more")
        if ":" not in self.address:
            raise ValueError(f"address {self.address!r} has no port; use host:port, e.g. 0.0.0.0:50052")


class TokenizerServicer(tokenizer_pb2_grpc.TokenizerServicer):
    def __init__(self, service: TokenizerService) -> None:
        self._service = service

    async def Encode(self, request, context):
        add_special = request.add_special_tokens if request.HasField("add_special_tokens") else True
        token_ids = await _call(context, self._service.encode, request.text, add_special, in_thread=True)
        return tokenizer_pb2.EncodeResponse(token_ids=token_ids)

    async def ApplyChatTemplate(self, request, context):
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        add_prompt = request.add_generation_prompt if request.HasField("add_generation_prompt") else True
        prompt = await _call(context, self._service.apply_chat_template, messages, add_prompt, in_thread=True)
        return tokenizer_pb2.ApplyChatTemplateResponse(text=prompt.text, token_ids=prompt.token_ids)

    async def Decode(self, request, context):
        skip = request.skip_special_tokens if request.HasField("skip_special_tokens") else True
        text = await _call(context, self._service.decode, request.token_ids, skip)
        return tokenizer_pb2.DecodeResponse(text=text)

    async def DetokenizeStream(self, request_iterator: AsyncIterator, context) -> AsyncIterator:
        detokenizer = None
        async for request in request_iterator:
            if detokenizer is None:  # the first message configures the stream
                detokenizer = await _call(context, self._new_detokenizer, request)
            text = await _call(context, detokenizer.feed, request.token_ids)
            yield _detokenize_response(detokenizer, text)
            if detokenizer.is_finished:
                return  # a stop string matched; ids still in flight from the client are moot
        if detokenizer is None:  # the client half-closed without sending anything
            yield tokenizer_pb2.DetokenizeResponse(finished=True)
            return
        yield _detokenize_response(detokenizer, detokenizer.finish())

    async def DetokenizeMany(self, request_iterator: AsyncIterator, context) -> AsyncIterator:
        sequences: dict[int, IncrementalDetokenizer] = {}
        opened = [0]  # the highest sequence number seen: numbers only grow on a stream
        async for request in request_iterator:
            response = tokenizer_pb2.DetokenizeManyResponse()
            for item in request.items:
                if item.cancel:
                    sequences.pop(item.sequence, None)
                    continue
                answer = response.items.add(sequence=item.sequence)
                try:
                    answer.response.CopyFrom(self._detokenize_item(sequences, opened, item))
                except ValueError as e:  # this sequence's bad input, not the stream's
                    sequences.pop(item.sequence, None)
                    answer.error = str(e)
            yield response

    def _new_detokenizer(self, request) -> IncrementalDetokenizer:
        """A sequence's detokenizer, configured by its first message."""
        skip = request.skip_special_tokens if request.HasField("skip_special_tokens") else True
        return self._service.new_detokenizer(stop=list(request.stop), prefix_token_ids=list(request.prefix_token_ids),
                                             skip_special_tokens=skip)

    def _detokenize_item(self, sequences: dict[int, IncrementalDetokenizer], opened: list[int],
                         item) -> tokenizer_pb2.DetokenizeResponse:
        """One DetokenizeMany item, as the DetokenizeStream message it stands for."""
        detokenizer = sequences.get(item.sequence)
        if detokenizer is None and item.sequence <= opened[0]:
            # Not a new sequence (its number is not above every one seen): it finished, was
            # cancelled or refused. Starting it afresh would lose its stop strings.
            raise ValueError(f"sequence {item.sequence} is not open on this stream (it finished, was cancelled "
                             "or refused); start a new sequence with a new number")
        if item.close:
            sequences.pop(item.sequence, None)
            if detokenizer is None:  # closed without sending anything
                opened[0] = item.sequence
                return tokenizer_pb2.DetokenizeResponse(finished=True)
            return _detokenize_response(detokenizer, detokenizer.finish())
        if detokenizer is None:
            detokenizer = sequences[item.sequence] = self._new_detokenizer(item.request)
            opened[0] = item.sequence
        text = detokenizer.feed(item.request.token_ids)
        if detokenizer.is_finished:  # a stop string matched: the sequence is done
            del sequences[item.sequence]
        return _detokenize_response(detokenizer, text)

    async def GetInfo(self, request, context):
        info = self._service.info
        return tokenizer_pb2.TokenizerInfo(
            vocab_size=info.vocab_size, bos_token_id=info.bos_token_id,
            eos_token_ids=info.eos_token_ids, model_max_length=info.model_max_length,
            has_chat_template=info.has_chat_template)


def _detokenize_response(detokenizer, text: str) -> tokenizer_pb2.DetokenizeResponse:
    return tokenizer_pb2.DetokenizeResponse(
        text=text, num_tokens=detokenizer.num_tokens, finished=detokenizer.is_finished,
        matched_stop=detokenizer.matched_stop or "")


async def _call(context, fn, *args, in_thread: bool = False, **kwargs):
    """Call the service; bad input (ValueError) ends the RPC with INVALID_ARGUMENT, not the server."""
    try:
        if in_thread:
            return await asyncio.to_thread(fn, *args, **kwargs)
        return fn(*args, **kwargs)
    except ValueError as e:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))


async def start_server(config: TokenizerServerConfig) -> tuple[grpc.aio.Server, health.aio.HealthServicer, int]:
    """Load the tokenizer, bind, start; returns the server, its health servicer and the bound port."""
    service = TokenizerService(config.model_dir)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])  # a port in use is an error, not a shared listener
    tokenizer_pb2_grpc.add_TokenizerServicer_to_server(TokenizerServicer(service), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server)
    try:
        port = server.add_insecure_port(config.address)
    except RuntimeError:  # grpc raises where older versions returned 0
        port = 0
    if port == 0:
        raise OSError(f"cannot listen on {config.address}; is the port in use? pick another --address")
    await server.start()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, health_servicer, port


async def _serve(config: TokenizerServerConfig) -> None:
    server, health_servicer, port = await start_server(config)
    host = config.address.rsplit(":", 1)[0]
    # Printed (not only logged) so that a parent process started with port 0 can read the port.
    print(f"tokenizer serving {config.model_dir} on {host}:{port}", flush=True)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    stop_waiter = asyncio.ensure_future(stopping.wait())
    done_waiter = asyncio.ensure_future(server.wait_for_termination())
    await asyncio.wait((stop_waiter, done_waiter), return_when=asyncio.FIRST_COMPLETED)
    if stopping.is_set():
        logger.info("draining for up to %.1fs", config.grace_seconds)
        await health_servicer.enter_graceful_shutdown()  # readiness goes NOT_SERVING first
        await server.stop(config.grace_seconds)
    done_waiter.cancel()


def run_tokenizer_process(config: TokenizerServerConfig) -> None:
    """Process entry: serve until SIGTERM/SIGINT, then drain for config.grace_seconds."""
    asyncio.run(_serve(config))


def serve(model_dir: str | Path, address: str) -> None:
    run_tokenizer_process(TokenizerServerConfig(model_dir=Path(model_dir), address=address))
