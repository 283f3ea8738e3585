"""The gateway as a plain object: what the gRPC servicer and the HTTP front door both drive.

    gateway = Gateway(config); await gateway.start()
    generation = await gateway.submit(GenerateInput(prompt_text="hi", max_tokens=8))  # validated, queued
    async for event in generation.events(): ...   # Chunk..., then one Complete
    await gateway.cancel(request_id); await gateway.get_request(request_id); await gateway.list_models()

It knows nothing of protobuf or HTTP. State worth keeping lives in Redis (request records, the
replica registry), so gateway replicas are interchangeable; the in-memory part is only what this
replica is running right now.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import replace

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from shardline.client.types import ModelInfo  # what ListModels reports, as the SDK reads it
from shardline.manifest import Manifest
from shardline.registry import Registry, ReplicaInfo

from . import records
from .admission import AdmissionQueue
from .config import GatewayConfig
from .errors import AlreadyExists, GatewayError, InvalidArgument, NotFound, Unavailable, UnknownModel
from .generation import Generation
from .metrics import GatewayMetrics
from .records import RecordStore, RequestRecord
from .routing import ModelView, Route, RouteChooser, models_view
from .stage_client import StageChannels
from .tokenizer_client import TokenizerClient
from .validation import GenerateInput, check_fields, check_request_id, check_token_ids, fit_context, resolve_sampling

log = logging.getLogger("shardline.gateway")


def new_request_id() -> str:
    return uuid.uuid4().hex


class Gateway:
    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.gateway_id = uuid.uuid4().hex[:12]
        self.registry = Registry.from_url(config.redis_url, ttl_s=config.registry_ttl_s,
                                          timeout_s=config.redis_timeout_s)
        self.redis = aioredis.Redis.from_url(config.redis_url, decode_responses=True,
                                             socket_timeout=config.redis_timeout_s,
                                             socket_connect_timeout=config.redis_timeout_s)
        # The cancel subscription waits for messages as long as it must: no read timeout.
        self._pubsub_redis = aioredis.Redis.from_url(config.redis_url, decode_responses=True,
                                                     socket_connect_timeout=config.redis_timeout_s)
        self.records = RecordStore(self.redis, config.record_ttl_s, config.active_record_ttl_s)
        self.admission = AdmissionQueue(config.admission)
        self.stages = StageChannels()
        self.chooser = RouteChooser()
        self.admitted_at: dict[str, float] = {}  # request id -> unix time it first got a route
        self._tokenizers: dict[str, TokenizerClient] = {}
        self._active: dict[str, Generation] = {}
        # Requests with generated ids not yet in Redis, written together every record_interval_s;
        # the lock keeps one request's writes in order (Generation.flush_record takes it too).
        self.unrecorded: dict[str, Generation] = {}
        self.record_lock = asyncio.Lock()
        self._replicas: list[ReplicaInfo] = []  # registry snapshot, refreshed every registry_poll_s
        self._last_views: dict[str, ModelView] = {}  # every model seen since start, as last seen
        self._suspects: dict[str, float] = {}  # replica address -> until when routes avoid it
        self._tasks: list[asyncio.Task] = []
        self._closing = False
        self._manifests = {name: Manifest.read(d) for name, d in config.model_dirs.items()}
        self.is_serving = False  # a complete route exists for some served model
        self.on_serving_changed = None  # async callable(bool), e.g. the gRPC health servicer
        self.metrics = GatewayMetrics(self)  # served on a port only with --metrics-port

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.refresh_replicas()
        self._tasks = [asyncio.create_task(self._watch_registry(), name="gateway-registry"),
                       asyncio.create_task(self._flush_records(), name="gateway-records"),
                       asyncio.create_task(self._watch_cancels(), name="gateway-cancels")]

    async def close(self) -> None:
        self._closing = True
        for generation in list(self._active.values()):
            generation.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for client in self._tokenizers.values():
            await client.close()
        await self.stages.close()
        self.metrics.stop()
        await self.redis.aclose()
        await self._pubsub_redis.aclose()
        self.registry.redis.close()

    def tokenizer(self, model: str) -> TokenizerClient:
        address = self.config.tokenizer_for(model)
        if address not in self._tokenizers:
            self._tokenizers[address] = TokenizerClient(address, self.config.tokenizer_timeout_s)
        return self._tokenizers[address]

    # -- requests -----------------------------------------------------------------------------------

    async def submit(self, req: GenerateInput) -> Generation:
        """Validate, tokenize, check admission and record the request as QUEUED.

        Raises InvalidArgument / OutOfRange / ResourceExhausted / AlreadyExists / Unavailable. The
        returned Generation runs when its events() is iterated.
        """
        try:
            return await self._submit(req)
        except GatewayError as e:
            self.metrics.refused_request(e.code.name)
            raise

    async def _submit(self, req: GenerateInput) -> Generation:
        check_fields(req)
        model = self.resolve_model(req.model)
        request_id = req.request_id or new_request_id()
        if request_id in self._active:
            raise AlreadyExists(f"request_id {request_id!r} is already running; pick a new id or Cancel it first")
        self.admission.check()
        tokenizer = self.tokenizer(model)
        info = await tokenizer.info()
        if req.prompt_text is not None:
            prompt = await tokenizer.encode(req.prompt_text)
        elif req.chat is not None:
            prompt = await tokenizer.apply_chat_template(req.chat)
        else:
            prompt = list(req.prompt_token_ids)
            check_token_ids(prompt, info.vocab_size, "prompt_token_ids")
        if not prompt:
            raise InvalidArgument("prompt is empty after tokenization; send at least one token of text")
        check_token_ids(req.stop_token_ids, info.vocab_size, "stop_token_ids")
        max_tokens = fit_context(req, len(prompt), self.max_model_len(model, info.model_max_length),
                                 self.config.default_max_tokens)
        sampling = resolve_sampling(req, max_tokens)
        self.admission.check()  # again: tokenizing took a while
        params = {**sampling.to_dict(), "stop": list(req.stop)}
        generation = Generation(self, request_id, model, prompt, sampling, list(req.stop),
                                tuple(info.eos_token_ids), queued_at=time.time())
        self._active[request_id] = generation
        try:
            await self.records.create(request_id, model, params, prompt, self.gateway_id, generation.queued_at)
        except BaseException as e:
            del self._active[request_id]
            if isinstance(e, RedisError):
                raise Unavailable(f"cannot record the request in Redis ({e}); retry later") from e
            raise
        return generation  # no await from here until the caller iterates events()

    async def _finished(self, generation: Generation, state: str, reason: str, error: str) -> None:
        """Called once by every Generation as it ends, whatever the way."""
        self._active.pop(generation.request_id, None)
        self.unrecorded.pop(generation.request_id, None)  # the flush below writes the rest
        self.metrics.request_ended(generation, state, self.admitted_at.pop(generation.request_id, 0.0))
        g = generation
        log.info("request %s %s%s: model %s, %d prompt + %d generated tokens, first token %.3fs, total %.3fs, "
                 "%d resumes, route %s%s", g.request_id, state.lower(), f" ({reason.lower()})" if reason else "",
                 g.model, len(g.prompt_token_ids), len(g.generated),
                 g.time_to_first_token_s if g.first_token_at else float("nan"), g.elapsed_s,
                 g.num_resumes, g.route.addresses if g.route else "none", f"; {error}" if error else "")
        if generation.route is not None:
            self.chooser.finished(generation.route, generation.request_id)
        try:
            await asyncio.shield(generation.flush_record())
            await asyncio.shield(self.records.finish(generation.request_id, state, reason, error,
                                                     len(generation.generated)))
        except Exception:  # the client already has its answer; a lost record is only logged
            log.exception("could not record the end of request %s", generation.request_id)

    async def cancel(self, request_id: str) -> tuple[bool, str]:
        """(cancelled, state as recorded before the cancel). Works for requests another gateway
        replica runs: the cancel is published to every replica through Redis."""
        check_request_id(request_id)
        generation = self._active.get(request_id)
        if generation is not None:
            generation.cancel()
            return True, records.RUNNING if generation.route else records.QUEUED
        try:
            record = await self.records.get(request_id)
            if record is None:
                return False, ""
            if record.state in records.ACTIVE_STATES:
                await self.records.publish_cancel(request_id)
                return True, record.state
        except RedisError as e:
            raise Unavailable(f"cannot reach Redis to cancel {request_id!r} on another gateway ({e}); retry") from e
        return False, record.state

    async def get_request(self, request_id: str) -> RequestRecord:
        check_request_id(request_id)
        try:
            record = await self.records.get(request_id)
        except RedisError as e:
            raise Unavailable(f"cannot read request records from Redis ({e}); retry later") from e
        if record is None:
            raise NotFound(f"request {request_id!r} is unknown (never seen, or its record expired after "
                           f"{self.config.record_ttl_s:.0f}s)")
        return record

    # -- models and routes --------------------------------------------------------------------------

    def served_models(self) -> dict[str, ModelView | None]:
        """Model name -> registry view. A model seen before keeps its last view with num_routes = 0
        while none of its replicas is registered, so that it reads as unavailable, not unknown;
        a configured model never seen maps to None."""
        views = {name: replace(view, num_routes=0) for name, view in self._last_views.items()}
        views.update(models_view(self._replicas))
        if self.config.model_names:
            return {name: views.get(name) for name in self.config.model_names}
        return views

    def resolve_model(self, name: str) -> str:
        served = self.served_models()
        if not name:
            if len(served) == 1:
                return next(iter(served))
            if not served:
                raise Unavailable("no model is being served yet (no stage worker has registered); retry later")
            raise InvalidArgument(f"model is required: this gateway serves {', '.join(sorted(served))}")
        if name not in served:
            known = ", ".join(sorted(served)) or "none yet"
            raise UnknownModel(f"model {name!r} is unknown; served models: {known}")
        return name

    def max_model_len(self, model: str, tokenizer_max_length: int = 0) -> int:
        """Context length: configured > registry > manifest > tokenizer's model_max_length > 0 (unknown)."""
        if model in self.config.max_model_len:
            return self.config.max_model_len[model]
        view = self.served_models().get(model)
        if view is not None and view.max_model_len:
            return view.max_model_len
        if model in self._manifests:
            return self._manifests[model].model.max_position_embeddings
        return tokenizer_max_length

    async def list_models(self) -> list[ModelInfo]:
        out = []
        for name, view in sorted(self.served_models().items()):
            tokenizer_max = 0
            if not (view and view.max_model_len) and name not in self.config.max_model_len:
                try:
                    tokenizer_max = (await self.tokenizer(name).info()).model_max_length
                except Exception:
                    pass  # listing stays up when the tokenizer is down
            manifest = self._manifests.get(name)
            architecture = (view.architecture if view else "") or (manifest.model.architecture if manifest else "")
            out.append(ModelInfo(name=name, architecture=architecture,
                                 max_model_len=self.max_model_len(name, tokenizer_max),
                                 num_stages=view.num_stages if view else 0, tp_size=view.tp_size if view else 0,
                                 num_routes=view.num_routes if view else 0))
        return out

    def _excluded(self) -> set[str]:
        now = time.monotonic()
        for address in [a for a, until in self._suspects.items() if until <= now]:
            del self._suspects[address]
        return set(self._suspects)

    async def wait_for_route(self, model: str, request_id: str) -> Route:
        """A complete route for `model`, waiting up to route_wait_s for one to appear."""
        deadline = time.monotonic() + self.config.route_wait_s
        while True:
            route = self.chooser.choose(model, self._replicas, self._excluded())
            if route is not None:
                self.chooser.admitted(route, request_id)
                self.admitted_at.setdefault(request_id, time.time())
                return route
            if time.monotonic() >= deadline:
                raise Unavailable(self._why_no_route(model))
            await asyncio.sleep(min(0.1, self.config.registry_poll_s))
            await self.refresh_replicas()

    def _why_no_route(self, model: str) -> str:
        view = models_view(self._replicas).get(model)
        wait = f"after waiting {self.config.route_wait_s:.1f}s; retry later or scale the stage up"
        if view is None:
            return f"no replica of model {model!r} is registered {wait}"
        excluded = self._excluded()
        missing = [s for s in range(view.num_stages)
                   if not any(r.model == model and r.stage == s and not r.is_draining and r.address not in excluded
                              for r in self._replicas)]
        return f"model {model!r} has no live, non-draining replica of stage {missing} {wait}"

    async def route_broke(self, route: Route, request_id: str) -> None:
        """Forget the broken route's load and keep dead replicas out of new routes until their
        heartbeat key expires."""
        self.chooser.finished(route, request_id)
        alive = await asyncio.gather(*(self.stages.is_alive(a, self.config.probe_timeout_s)
                                       for a in route.addresses))
        until = time.monotonic() + self.config.registry_ttl_s + self.config.registry_poll_s
        for address, ok in zip(route.addresses, alive):
            if not ok:
                self._suspects[address] = until
        await self.refresh_replicas()

    async def refresh_replicas(self) -> None:
        self._replicas = await asyncio.to_thread(self.registry.replicas)
        self._last_views.update(models_view(self._replicas))
        is_serving = any(v is not None and v.num_routes > 0 for v in self.served_models().values())
        if is_serving != self.is_serving:
            self.is_serving = is_serving
            log.info("gateway %s serving", "is" if is_serving else "is NOT")
            if self.on_serving_changed is not None:
                await self.on_serving_changed(is_serving)

    async def _watch_registry(self) -> None:
        """Keep the snapshot fresh; break the streams of requests whose route lost a replica."""
        while True:
            try:
                await self.refresh_replicas()
                live = {r.address for r in self._replicas}
                for generation in list(self._active.values()):
                    route = generation.route
                    for address in route.addresses if route is not None else ():
                        if address not in live:
                            generation.route_vanished(address)
                            break
                await self.stages.forget(live | {a for g in self._active.values() if g.route
                                                 for a in g.route.addresses})
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("registry poll failed; keeping the last snapshot")
            await asyncio.sleep(self.config.registry_poll_s)

    async def _flush_records(self) -> None:
        """Every record_interval_s: the ids generated since the last write, of every running
        request, in one Redis transaction."""
        while True:
            await asyncio.sleep(self.config.record_interval_s)
            if not self.unrecorded:
                continue
            pending, self.unrecorded = self.unrecorded, {}
            try:
                async with self.record_lock:
                    appends = [a for g in pending.values() if (a := g.take_unrecorded()) is not None]
                    if appends:
                        await self.records.append_tokens_many(appends)
            except RedisError as e:  # the records fall behind; the streams go on
                log.warning("could not record the progress of %d requests in Redis: %s", len(pending), e)
            except Exception:  # noqa: BLE001 - a dead flusher would stop every record
                log.exception("recording the progress of %d requests failed", len(pending))

    async def _watch_cancels(self) -> None:
        """Cancel requests this replica runs when another replica received their Cancel."""
        # Messages are polled a second at a time, and the loop also ends on _closing: a task
        # cancelled while redis-py connects or blocks in a read could swallow the cancel, and
        # close() then waited for it forever (a gateway stopped right after it started hung).
        while not self._closing:
            try:
                async with self._pubsub_redis.pubsub() as pubsub:
                    await pubsub.subscribe(records.CANCEL_CHANNEL)
                    while not self._closing:
                        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                        if message is not None and message.get("type") == "message":
                            generation = self._active.get(message["data"])
                            if generation is not None:
                                generation.cancel()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("cancel subscription failed; resubscribing")
                await asyncio.sleep(1.0)

