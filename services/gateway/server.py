"""The public gRPC API (shardline.v1.Gateway): a thin translation between the wire and Gateway.

Errors found before the first chunk of a stream (validation, a full queue, no route) end the call
with their status code; RESOURCE_EXHAUSTED carries `retry-after-ms` in the trailing metadata.
Errors after the first chunk arrive as a final StreamError message. Every call gets the request id
in its initial metadata (`request-id`), so a client can Cancel or GetRequest it from elsewhere
before any token arrives. Health (grpc.health.v1) is SERVING once a complete route exists for
some served model; reflection lists the services. The same port serves the KServe v2 protocol
(inference.GRPCInferenceService, kserve_v2.py).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from contextlib import aclosing
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from shardline.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

from .config import GatewayConfig
from . import kserve_v2
from .errors import GatewayError, abort
from .generation import Chunk, Complete
from .records import RequestRecord
from .service import Gateway, new_request_id
from .validation import GenerateInput

log = logging.getLogger("shardline.gateway")

SERVICE_NAME = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name
FINISH_REASON_WIRE = {"LENGTH": common_pb2.FINISH_REASON_LENGTH, "STOP": common_pb2.FINISH_REASON_STOP,
                      "CANCELLED": common_pb2.FINISH_REASON_CANCELLED, "ERROR": common_pb2.FINISH_REASON_ERROR,
                      "": common_pb2.FINISH_REASON_UNSPECIFIED}
STATE_WIRE = {"QUEUED": gateway_pb2.REQUEST_STATE_QUEUED, "RUNNING": gateway_pb2.REQUEST_STATE_RUNNING,
              "FINISHED": gateway_pb2.REQUEST_STATE_FINISHED, "CANCELLED": gateway_pb2.REQUEST_STATE_CANCELLED,
              "FAILED": gateway_pb2.REQUEST_STATE_FAILED, "": gateway_pb2.REQUEST_STATE_UNSPECIFIED}


def input_from_wire(r: gateway_pb2.GenerateRequest) -> GenerateInput:
    form = r.WhichOneof("prompt")
    return GenerateInput(
        model=r.model,
        prompt_text=r.prompt_text if form == "prompt_text" else None,
        prompt_token_ids=list(r.prompt_token_ids.ids) if form == "prompt_token_ids" else None,
        chat=[{"role": m.role, "content": m.content} for m in r.chat.messages] if form == "chat" else None,
        max_tokens=r.max_tokens if r.HasField("max_tokens") else None,
        temperature=r.temperature if r.HasField("temperature") else None,
        top_k=r.top_k, top_p=r.top_p if r.HasField("top_p") else None,
        seed=r.seed if r.HasField("seed") else None,
        stop=list(r.stop), stop_token_ids=list(r.stop_token_ids), ignore_eos=r.ignore_eos,
        request_id=r.request_id)


def complete_to_wire(c: Complete) -> tuple[common_pb2.Usage, common_pb2.Timings]:
    usage = common_pb2.Usage(prompt_tokens=c.usage.prompt_tokens, completion_tokens=c.usage.completion_tokens,
                             total_tokens=c.usage.total_tokens)
    timings = common_pb2.Timings(queue_seconds=c.timings.queue_s,
                                 time_to_first_token_seconds=c.timings.time_to_first_token_s,
                                 total_seconds=c.timings.total_s,
                                 decode_tokens_per_second=c.timings.decode_tokens_per_s)
    return usage, timings


def status_to_wire(r: RequestRecord) -> gateway_pb2.RequestStatus:
    return gateway_pb2.RequestStatus(
        request_id=r.request_id, model=r.model, state=STATE_WIRE.get(r.state, 0), route=r.route,
        num_prompt_tokens=r.num_prompt_tokens, num_generated_tokens=r.num_generated_tokens,
        num_resumes=r.num_resumes, queued_at=r.queued_at, first_token_at=r.first_token_at,
        finished_at=r.finished_at, finish_reason=FINISH_REASON_WIRE.get(r.finish_reason, 0), error=r.error)


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def _submit(self, request, context):
        req = input_from_wire(request)
        req.request_id = req.request_id or new_request_id()
        # Sent first: between submit() and iterating events() nothing may await, or a client gone
        # in between would leave an accepted request that never runs.
        await context.send_initial_metadata((("request-id", req.request_id),))
        try:
            return await self.gateway.submit(req)
        except GatewayError as e:
            await abort(context, e)

    async def Generate(self, request, context):
        generation = await self._submit(request, context)
        text, token_ids = [], []
        try:
            async with aclosing(generation.events()) as events:
                async for event in events:
                    if isinstance(event, Chunk):
                        text.append(event.text)
                        token_ids.extend(event.token_ids)
                    else:
                        complete = event
        except GatewayError as e:
            await abort(context, e)
        usage, timings = complete_to_wire(complete)
        return gateway_pb2.GenerateResponse(
            request_id=generation.request_id, model=generation.model, text="".join(text),
            token_ids=token_ids[:complete.usage.completion_tokens],
            finish_reason=FINISH_REASON_WIRE[complete.finish_reason], matched_stop=complete.matched_stop,
            usage=usage, timings=timings)

    async def GenerateStream(self, request, context):
        generation = await self._submit(request, context)
        request_id, has_sent = generation.request_id, False
        try:
            async with aclosing(generation.events()) as events:
                async for event in events:
                    if isinstance(event, Chunk):
                        has_sent = True
                        yield gateway_pb2.GenerateStreamResponse(
                            request_id=request_id,
                            chunk=gateway_pb2.StreamChunk(text=event.text, token_ids=event.token_ids))
                    else:
                        usage, timings = complete_to_wire(event)
                        yield gateway_pb2.GenerateStreamResponse(request_id=request_id, complete=gateway_pb2.StreamComplete(
                            finish_reason=FINISH_REASON_WIRE[event.finish_reason],
                            matched_stop=event.matched_stop, usage=usage, timings=timings))
        except GatewayError as e:
            if not has_sent:
                await abort(context, e)
            yield gateway_pb2.GenerateStreamResponse(
                request_id=request_id, error=gateway_pb2.StreamError(code=e.code.name, message=e.message))

    async def Cancel(self, request, context):
        try:
            cancelled, state = await self.gateway.cancel(request.request_id)
        except GatewayError as e:
            await abort(context, e)
        return gateway_pb2.CancelResponse(cancelled=cancelled, state=STATE_WIRE.get(state, 0))

    async def GetRequest(self, request, context):
        try:
            record = await self.gateway.get_request(request.request_id)
        except GatewayError as e:
            await abort(context, e)
        return status_to_wire(record)

    async def ListModels(self, request, context):
        models = await self.gateway.list_models()
        return gateway_pb2.ListModelsResponse(models=[
            gateway_pb2.ModelInfo(name=m.name, architecture=m.architecture, max_model_len=m.max_model_len,
                                  num_stages=m.num_stages, tp_size=m.tp_size, num_routes=m.num_routes)
            for m in models])


@dataclass
class RunningGateway:
    gateway: Gateway
    server: grpc.aio.Server
    health: health.aio.HealthServicer
    port: int
    http_port: int | None = None
    http_server: object | None = None
    metrics_port: int | None = None

    async def stop(self, grace_s: float = 5.0) -> None:
        """Not ready at once (load balancers stop sending), then let running calls finish for up
        to grace_s; what still runs after that is cancelled downstream."""
        await self.health.enter_graceful_shutdown()
        if self.http_server is not None:
            await self.http_server.stop()
        await self.server.stop(grace_s)
        await self.gateway.close()


async def start(config: GatewayConfig) -> RunningGateway:
    """Start the gateway's gRPC (and, with http_port set, HTTP) servers; returns once listening."""
    gateway = Gateway(config)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    gateway_pb2_grpc.add_GatewayServicer_to_server(GatewayServicer(gateway), server)
    kserve_v2.add_to_server(gateway, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, not_serving)

    async def on_serving_changed(is_serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if is_serving else not_serving
        for name in ("", SERVICE_NAME):
            await health_servicer.set(name, status)

    gateway.on_serving_changed = on_serving_changed
    reflection.enable_server_reflection((SERVICE_NAME, kserve_v2.SERVICE_NAME, health.SERVICE_NAME,
                                         reflection.SERVICE_NAME), server)
    port = server.add_insecure_port(f"{config.host}:{config.port}")
    if port == 0:
        raise RuntimeError(f"could not bind the gateway's gRPC port {config.host}:{config.port}")
    await gateway.start()
    await server.start()
    running = RunningGateway(gateway, server, health_servicer, port)
    flag, bind_port = "--http-port", config.http_port
    try:
        if config.http_port is not None:
            from .http import start_http
            running.http_server = await start_http(gateway, config.host, config.http_port)
            running.http_port = running.http_server.port
        if config.metrics_port is not None:
            flag, bind_port = "--metrics-port", config.metrics_port
            running.metrics_port = gateway.metrics.serve(config.metrics_port, config.host)
    except OSError as e:  # a port in use: stop what already listens, then say which flag to change
        await running.stop(grace_s=0)
        raise OSError(f"cannot listen on {config.host}:{bind_port} ({e.strerror or e}); pick another {flag}") from e
    log.info("gateway listening on %s:%d (gRPC)%s%s", config.host, port,
             f", {config.host}:{running.http_port} (HTTP)" if running.http_port else "",
             f", {config.host}:{running.metrics_port} (metrics)" if running.metrics_port else "")
    return running


def serve(config: GatewayConfig, ready=None) -> None:
    """Run the gateway until SIGTERM or SIGINT, then drain for a few seconds. `ready(running)` is
    called once it listens (a launcher learns the ports bound for port 0 there)."""

    async def main() -> None:
        running = await start(config)
        if ready is not None:
            ready(running)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("gateway shutting down")
        await running.stop(grace_s=5.0)

    asyncio.run(main())
