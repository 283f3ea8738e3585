"""The gateway's configuration: typed, validated once at startup, passed explicitly from there."""

from __future__ import annotations

from dataclasses import dataclass, field

from shardline.config import ConfigError, check_port


@dataclass(frozen=True)
class AdmissionConfig:
    max_running: int = 256  # requests streaming from a stage-0 replica at once (this gateway)
    max_queued: int = 1024  # requests waiting for a running slot; beyond it: RESOURCE_EXHAUSTED

    def __post_init__(self) -> None:
        if self.max_running < 1:
            raise ConfigError(f"max_running {self.max_running} must be >= 1")
        if self.max_queued < 0:
            raise ConfigError(f"max_queued {self.max_queued} must be >= 0 (0 = no queue)")


@dataclass(frozen=True)
class GatewayConfig:
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Tokenizer service address for every model, and per-model overrides (model name -> host:port).
    tokenizer: str = ""
    model_tokenizers: dict[str, str] = field(default_factory=dict)
    # Models this gateway serves; empty = every model in the registry.
    model_names: tuple[str, ...] = ()
    # Context length per model, overriding what the registry or the model's manifest says.
    max_model_len: dict[str, int] = field(default_factory=dict)
    # Converted model directories (model name -> dir): their manifest gives context length and
    # architecture when the registry does not.
    model_dirs: dict[str, str] = field(default_factory=dict)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    host: str = "0.0.0.0"
    port: int = 50051  # 0 = any free port (serve() reports the one bound)
    http_port: int | None = None  # OpenAI-compatible HTTP; None = off
    metrics_port: int | None = None  # Prometheus /metrics; None = off, 0 = any free port
    default_max_tokens: int = 16  # when a request sets none (capped by the context left)
    record_ttl_s: float = 3600.0  # a request record lives this long after it finishes
    # A running request's new generated ids reach its Redis record at most this late.
    record_interval_s: float = 0.05
    # A running request's record expires after this even if the gateway dies mid-request.
    active_record_ttl_s: float = 6 * 3600.0
    registry_ttl_s: float = 5.0  # heartbeat TTL the stage workers use; a replica gone this long is dead
    registry_poll_s: float = 0.5  # how often health and vanished-replica checks refresh
    route_wait_s: float = 5.0  # wait this long for a complete route before UNAVAILABLE
    max_resumes: int = 3  # failovers per request before it fails
    probe_timeout_s: float = 1.0  # GetStatus probe of a route's replicas after a broken stream
    # A Redis command (or connect) that takes longer fails: the request gets UNAVAILABLE instead of
    # hanging on a Redis that stopped answering (the cancel subscription alone waits as long as it must).
    redis_timeout_s: float = 2.0
    # A tokenizer call (or one detokenize message) that takes longer fails the request: UNAVAILABLE.
    tokenizer_timeout_s: float = 10.0
    # An HTTP connection that sends no complete request head for this long is closed (an idle
    # keep-alive connection, or a client that trickles its headers).
    http_idle_timeout_s: float = 60.0
    # Last prompt tokens sent to the detokenizer as context (leading-space handling).
    detokenize_prefix_tokens: int = 4

    def __post_init__(self) -> None:
        if not self.tokenizer and not self.model_tokenizers:
            raise ConfigError("no tokenizer service: give --tokenizer HOST:PORT (or MODEL=HOST:PORT per model)")
        for flag, port in (("--port", self.port), ("--http-port", self.http_port), ("--metrics-port", self.metrics_port)):
            check_port(flag, port)
        if self.default_max_tokens < 1:
            raise ConfigError(f"default_max_tokens {self.default_max_tokens} must be >= 1")
        for name, n in self.max_model_len.items():
            if n < 2:
                raise ConfigError(f"--max-model-len {name}={n} must be >= 2 tokens")
        for what, v in (("record_ttl_s", self.record_ttl_s), ("record_interval_s", self.record_interval_s), ("registry_ttl_s", self.registry_ttl_s),
                        ("registry_poll_s", self.registry_poll_s), ("probe_timeout_s", self.probe_timeout_s),
                        ("redis_timeout_s", self.redis_timeout_s), ("http_idle_timeout_s", self.http_idle_timeout_s),
                        ("tokenizer_timeout_s", self.tokenizer_timeout_s)):
            if v <= 0:
                raise ConfigError(f"{what} {v} must be > 0")
        if self.route_wait_s < 0 or self.max_resumes < 0:
            raise ConfigError("route_wait_s and max_resumes must be >= 0")

    def tokenizer_for(self, model: str) -> str:
        return self.model_tokenizers.get(model, self.tokenizer)
