"""The stage worker's gRPC face and process entry: `python -m shardline.stage_worker`.

TP rank 0 serves gRPC and drives; ranks 1..N-1 join its process group and follow. The servicer
is thin: it translates the wire into calls on `StageWorker` and errors into status codes.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import logging
import os
import queue
import signal
import socket
import threading
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from shardline.config import ConfigError, EngineConfig, check_device
from shardline.kernels._dispatch import log_compiles
from shardline.parallel import init_tp_group, leave_tp_group, rank_device
from shardline.registry import Registry, ReplicaInfo
from shardline.stage_worker.engine import StageEngine, follow
from shardline.stage_worker.convert import TokenEvent, sampling_from_proto
from shardline.stage_worker.worker import AdmissionError, StageWorker
from shardline.v1 import stage_pb2, stage_pb2_grpc

log = logging.getLogger("shardline.stage_worker")
SERVICE_NAME = "shardline.v1.StageWorker"
WAKE_S = 0.2  # the longest a SIGTERM waits for the main thread to notice it (run_stage_worker_process)


@dataclass
class StageWorkerConfig:
    model_dir: str | None
    stage: int
    host: str = "127.0.0.1"
    port: int = 0  # 0 = any free port
    advertise_host: str | None = None  # how others reach this replica (pod IP); defaults to host
    model_name: str | None = None  # defaults to the model directory's name
    replica_id: str | None = None  # defaults to hostname-pid
    redis_url: str | None = None  # None = no registry (tests wiring routes by hand)
    heartbeat_s: float = 1.0
    registry_ttl_s: float = 5.0
    drain_timeout_s: float = 30.0
    orphan_timeout_s: float = 300.0  # stages > 0: free sequences no micro-batch touched this long
    metrics_port: int | None = None  # Prometheus /metrics (metrics.py); None = off
    # Benchmarks: random weights of a built-in shape (model/random_weights.py) split into
    # `random_pp` stages, instead of a converted model directory.
    random_shape: str | None = None
    random_pp: int = 1
    random_dtype: str = "bf16"
    tp_size: int = 1
    tp_rank: int = 0
    tp_init: str | None = None  # tcp://host:port of rank 0's rendezvous, when tp_size > 1
    engine: EngineConfig = field(default_factory=EngineConfig)

    def __post_init__(self) -> None:
        if (self.model_dir is None) == (self.random_shape is None):
            raise ConfigError("give exactly one of --model DIR or --random-shape NAME")
        if self.tp_size > 1 and not self.tp_init:
            raise ConfigError(f"--tp-size {self.tp_size} needs --tp-init tcp://HOST:PORT (rank 0's rendezvous)")
        if not 0 <= self.tp_rank < self.tp_size:
            raise ConfigError(f"--tp-rank {self.tp_rank} must be in 0..{self.tp_size - 1}")


class StageWorkerServicer(stage_pb2_grpc.StageWorkerServicer):
    def __init__(self, worker: StageWorker) -> None:
        self.worker = worker

    def Generate(self, request, context):
        try:
            sampling = sampling_from_proto(request.sampling)
            events = self.worker.admit(request.request_id, list(request.prompt_token_ids), sampling,
                                       list(request.route), list(request.generated_token_ids))
        except AdmissionError as e:
            context.abort(e.code, str(e))
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        rid = request.request_id
        # The call ended (client gone, or done): end this attempt, not a later one of the same id.
        context.add_callback(lambda: self.worker.cancel(rid, events))
        while True:
            try:
                event = events.get(timeout=1.0)
            except queue.Empty:
                if not context.is_active():
                    return
                continue
            yield event.to_proto()
            if event.finish_reason is not None:
                return

    def GenerateMany(self, request_iterator, context):
        """Generate for every admission on one stream. A thread reads the items (admit, cancel);
        this one sends whatever events have come since its last message, all sequences in one."""
        out: queue.Queue = queue.Queue()
        open_: dict[int, _Admission] = {}  # sequence -> admission not yet finished
        lock = threading.Lock()

        def end_all() -> None:
            with lock:
                admissions = list(open_.values())
                open_.clear()
            for admission in admissions:
                self.worker.cancel(admission.request_id, admission)

        def read() -> None:
            try:
                for message in request_iterator:
                    for item in message.items:
                        self._admit_item(item, out, open_, lock)
            except grpc.RpcError:
                pass  # the call ended; its callback ends the admissions
            finally:
                out.put(None)

        context.add_callback(end_all)
        threading.Thread(target=read, name="generate-many-reader", daemon=True).start()
        while True:
            try:
                items = [out.get(timeout=1.0)]
            except queue.Empty:
                if not context.is_active():
                    return
                continue
            while True:
                try:
                    items.append(out.get_nowait())
                except queue.Empty:
                    break
            ended = any(i is None for i in items)  # the client closed its side: end what it left running
            # The events' protos are built here, not in the engine's loop thread, which put them.
            items = [i if isinstance(i, stage_pb2.TokenItem) else
                     stage_pb2.TokenItem(sequence=i[0], event=i[1].to_proto()) for i in items if i is not None]
            if items:
                with lock:  # (a refused admission never entered open_, or left it in _admit_item)
                    for item in items:
                        if item.event.finish_reason:
                            open_.pop(item.sequence, None)
                yield stage_pb2.GenerateManyResponse(items=items)
            if ended:
                end_all()
                return

    def _admit_item(self, item, out: queue.Queue, open_: dict, lock: threading.Lock) -> None:
        if item.cancel:
            with lock:
                admission = open_.pop(item.sequence, None)
            if admission is not None:
                self.worker.cancel(admission.request_id, admission)
            return
        request = item.admit
        admission = _Admission(out, item.sequence, request.request_id)
        try:
            sampling = sampling_from_proto(request.sampling)
            with lock:  # before its first event can come
                if item.sequence in open_:
                    out.put(stage_pb2.TokenItem(
                        sequence=item.sequence, code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
                        message=f"sequence {item.sequence} is already running on this stream; number each "
                                f"admission anew"))
                    return
                open_[item.sequence] = admission
            self.worker.admit(request.request_id, list(request.prompt_token_ids), sampling, list(request.route),
                              list(request.generated_token_ids), events=admission)
        except (AdmissionError, ValueError) as e:
            with lock:
                open_.pop(item.sequence, None)
            code = e.code if isinstance(e, AdmissionError) else grpc.StatusCode.INVALID_ARGUMENT
            out.put(stage_pb2.TokenItem(sequence=item.sequence, code=code.value[0], message=str(e)))

    def Forward(self, request, context):
        try:
            depth = self.worker.forward(request)
        except AdmissionError as e:
            context.abort(e.code, str(e))
        return stage_pb2.ForwardAck(num_queued_micro_batches=depth)

    def ReturnTokens(self, request, context):
        if not self.worker.is_first:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "ReturnTokens goes to the stage-0 replica (origin)")
        self.worker.return_tokens(request)
        return stage_pb2.Ack()

    def Free(self, request, context):
        self.worker.free(list(request.request_ids), list(request.route))
        return stage_pb2.Ack()

    def GetStatus(self, request, context):
        s = self.worker.status()
        return stage_pb2.StageStatus(
            stage_index=s["stage"], num_stages=self.worker.num_stages, layer_start=s["layer_start"],
            layer_end=s["layer_end"], tp_size=s["tp"], replica_id=self.worker.replica_id,
            address=self.worker.address, model=self.worker.model_name, num_total_blocks=s["num_blocks"],
            num_free_blocks=s["free_blocks"], block_size=s["block_size"], running_request_ids=s["running"],
            counters=stage_pb2.StageCounters(num_steps=s["steps"], num_tokens=s["tokens"],
                                             busy_seconds=s["busy_seconds"],
                                             max_micro_batches_in_flight=s["max_micro_batches_in_flight"]),
            is_draining=s["is_draining"])


class _Admission:
    """One admission of a GenerateMany stream: the worker's events queue for it, tagging each event
    with the admission's sequence number on the way into the stream's one outgoing queue (the
    sender builds the proto)."""

    def __init__(self, out: queue.Queue, sequence: int, request_id: str) -> None:
        self.out, self.sequence, self.request_id = out, sequence, request_id

    def put(self, event: TokenEvent) -> None:
        self.out.put((self.sequence, event))


def replica_info(worker: StageWorker) -> ReplicaInfo:
    s = worker.status()
    return ReplicaInfo(replica_id=worker.replica_id, address=worker.address, model=worker.model_name,
                       stage=worker.stage, num_stages=worker.num_stages, layer_start=s["layer_start"],
                       layer_end=s["layer_end"], tp=s["tp"], num_total_blocks=s["num_blocks"],
                       num_free_blocks=s["free_blocks"], block_size=s["block_size"],
                       num_running=s["num_running"], is_draining=s["is_draining"])


class StageWorkerProcess:
    """Rank 0 of one replica: engine, worker, gRPC server, registry heartbeat."""

    def __init__(self, config: StageWorkerConfig) -> None:
        self.config = config
        self.tp = tp = init_tp_group(0, config.tp_size, config.tp_init, config.engine.device)
        engine = build_engine(config, tp)
        # so_reuseport off: a port another server holds is an error here, not a shared listener
        # that hands this replica's connections to a stranger.
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=512), options=[
            ("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1), ("grpc.so_reuseport", 0)])
        try:
            self.port = self.server.add_insecure_port(f"{config.host}:{config.port}")
        except RuntimeError as e:  # grpc raises where older versions returned 0
            raise OSError(f"cannot listen on {config.host}:{config.port} ({e}); is the port in use? pick another --port") from e
        if self.port == 0:
            raise OSError(f"cannot listen on {config.host}:{config.port}; is the port in use? pick another --port")
        address = f"{config.advertise_host or config.host}:{self.port}"
        model_name = config.model_name or config.random_shape or Path(config.model_dir).resolve().name
        replica_id = config.replica_id or f"{socket.gethostname()}-{os.getpid()}"
        self.worker = StageWorker(engine, address, replica_id, model_name, config.orphan_timeout_s)
        stage_pb2_grpc.add_StageWorkerServicer_to_server(StageWorkerServicer(self.worker), self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection((SERVICE_NAME, reflection.SERVICE_NAME, health.SERVICE_NAME), self.server)
        self.registry = Registry.from_url(config.redis_url, config.registry_ttl_s) if config.redis_url else None
        self._stop = threading.Event()

    def start(self) -> None:
        self.server.start()
        # Weights are loaded and the engine ran its first step at construction: ready now.
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if self.registry is not None:
            self.registry.heartbeat(replica_info(self.worker))
            threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True).start()
        if self.config.metrics_port is not None:
            from shardline.stage_worker.metrics import serve_metrics  # prometheus_client only when asked

            serve_metrics(self.worker, self.config.metrics_port, self.config.host)
        log.info("stage %d replica %s serving at %s", self.worker.stage, self.worker.replica_id, self.worker.address)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.config.heartbeat_s):
            try:
                self.registry.heartbeat(replica_info(self.worker))
            except Exception as e:  # noqa: BLE001 - Redis blips must not kill the replica
                log.warning("heartbeat failed: %s", e)

    def _tell_registry(self, what: str) -> None:
        """A Redis that does not answer must not stop the drain: its key expires after the TTL."""
        if self.registry is None:
            return
        try:
            getattr(self.registry, what)(replica_info(self.worker))
        except Exception as e:  # noqa: BLE001 - redis errors and timeouts alike
            log.warning("registry %s failed during shutdown (%s); the key expires after its TTL", what, e)

    def shutdown(self) -> None:
        """SIGTERM: stop taking sequences, finish or hand back what runs, deregister, exit."""
        log.info("stage %d replica %s draining: %d sequences running, %.1f s to finish them, then the "
                 "rest go back to the gateway", self.worker.stage, self.worker.replica_id,
                 self.worker.status()["num_running"], self.config.drain_timeout_s)
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.worker.is_draining = True
        self._tell_registry("heartbeat")  # routes avoid a draining replica
        self.worker.drain(self.config.drain_timeout_s)
        self._stop.set()
        self._tell_registry("deregister")
        self.worker.stop()
        self.server.stop(grace=2).wait()


def build_engine(config: StageWorkerConfig, tp) -> StageEngine:
    if config.random_shape is None:
        return StageEngine(config.model_dir, config.stage, tp, config.engine)
    from shardline.config import ModelConfig
    from shardline.model.random_weights import SHAPES, random_manifest, random_stage_weights

    if config.random_shape not in SHAPES:
        raise ConfigError(f"--random-shape {config.random_shape!r} is not one of {sorted(SHAPES)}")
    manifest = random_manifest(ModelConfig(**SHAPES[config.random_shape]), config.random_dtype, tp.size,
                               config.random_pp)
    weights = random_stage_weights(manifest, config.stage, tp.rank, config.engine.device)
    return StageEngine(None, config.stage, tp, config.engine, manifest=manifest, weights=weights)


def run_stage_worker_process(config: StageWorkerConfig) -> None:
    """Blocks until SIGTERM/SIGINT. Followers (tp_rank > 0) only compute, and stop when rank 0
    says so."""
    config.engine = dataclasses.replace(config.engine, device=rank_device(config.engine.device, config.tp_rank))
    if config.tp_rank > 0:
        # A follower must outlive its rank 0's drain, which needs it for every step: Kubernetes
        # sends SIGTERM to all the containers of a pod at once, and Ctrl-C reaches a whole process
        # group. So it ignores both and returns when rank 0 broadcasts "stop"; if rank 0 dies
        # instead, the next collective fails and the follower exits with it.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        tp = init_tp_group(config.tp_rank, config.tp_size, config.tp_init, config.engine.device)
        engine = build_engine(config, tp)
        follow(tp, {config.stage: engine})
        leave_tp_group(tp)
        return
    proc = StageWorkerProcess(config)
    proc.start()
    if proc.tp.device.type == "cuda":
        log_compiles(log)  # from here on a compile stalls the replica: say so, with its kernel
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    print(f"READY {proc.worker.address}", flush=True)  # launchers wait for this line
    # Python runs signal handlers in the main thread only, and a SIGTERM the kernel hands to
    # another thread (gRPC's, the engine loop's) does not wake a main thread blocked in an
    # unbounded wait: the drain would never start and Kubernetes' SIGKILL would lose the running
    # sequences (CI saw a replica run its sequences to the end after SIGTERM). A bounded wait
    # runs the handler within WAKE_S whichever thread took the signal.
    while not done.wait(WAKE_S):
        pass
    proc.shutdown()
    leave_tp_group(proc.tp)


def parse_args(argv: list[str] | None = None) -> StageWorkerConfig:
    p = argparse.ArgumentParser(prog="python -m shardline.stage_worker", description=__doc__)
    p.add_argument("--model", help="converted model directory (manifest.json)")
    p.add_argument("--random-shape", help="benchmarks: random weights of a built-in shape (e.g. llama3-8b)")
    p.add_argument("--random-pp", type=int, default=1, help="with --random-shape: number of stages")
    p.add_argument("--random-dtype", default="bf16", choices=["fp32", "fp16", "bf16"])
    p.add_argument("--stage", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--advertise-host")
    p.add_argument("--model-name")
    p.add_argument("--replica-id")
    p.add_argument("--redis-url")
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--tp-rank", type=int, default=0)
    p.add_argument("--tp-init")
    p.add_argument("--device", default="cpu")
    p.add_argument("--num-blocks", type=int, help="KV blocks (default: from memory: --gpu-memory-fraction)")
    p.add_argument("--gpu-memory-fraction", type=float, default=0.9)
    p.add_argument("--max-model-len", type=int, help="default: the model's max positions")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--drain-timeout", type=float, default=30.0)
    p.add_argument("--lazy-graphs", action="store_true",
                   help="capture each decode CUDA graph on first use, not all before reporting ready")
    p.add_argument("--gemm-config", help="GEMM choices from `shardline tune-gemm` (GPU)")
    p.add_argument("--kv-cache-dtype", default="auto",
                   help="auto: the model's dtype; fp8: e4m3, twice the tokens in the same memory (no scale: "
                        "values saturate at +-448)")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port")
    p.add_argument("--orphan-timeout", type=float, default=300.0,
                   help="stages > 0: free the KV of sequences untouched this many seconds (stage 0 died)")
    a = p.parse_args(argv)
    check_device(a.device)  # the string; whether such a GPU is visible here is main()'s check
    engine = EngineConfig(device=a.device, num_blocks=a.num_blocks, block_size=a.block_size,
                          gpu_memory_fraction=a.gpu_memory_fraction, max_model_len=a.max_model_len,
                          max_num_seqs=a.max_num_seqs, max_num_batched_tokens=a.max_num_batched_tokens, gemm_config=a.gemm_config,
                          capture_graphs_at_start=not a.lazy_graphs, kv_cache_dtype=a.kv_cache_dtype)
    return StageWorkerConfig(model_dir=a.model, random_shape=a.random_shape, random_pp=a.random_pp,
                             random_dtype=a.random_dtype, stage=a.stage, host=a.host, port=a.port,
                             advertise_host=a.advertise_host, model_name=a.model_name, replica_id=a.replica_id,
                             redis_url=a.redis_url, tp_size=a.tp_size, tp_rank=a.tp_rank, tp_init=a.tp_init,
                             drain_timeout_s=a.drain_timeout, orphan_timeout_s=a.orphan_timeout, metrics_port=a.metrics_port,
                             engine=engine)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("SHARDLINE_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # `kill -USR1 <pid>` writes every thread's Python stack to the log: how to see where a
    # stuck rank waits (a collective, the GPU, a lock) without stopping it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        config = parse_args(argv)
        check_device(config.engine.device, here=True)
        run_stage_worker_process(config)
    except ConfigError as e:
        print(f"shardline stage-worker: error: {e}", flush=True)
        return 2
    except OSError as e:  # a port in use, a model directory that is not there
        print(f"shardline stage-worker: error: {e}", flush=True)
        return 1
    return 0
