"""Prometheus metrics of one gateway replica: what its clients saw.

    python -m shardline.gateway ... --metrics-port 9300   # GET :9300/metrics

Counters and histograms are updated as each request ends (or is refused); the gauges are read
from the gateway at scrape time. Time to first token and request duration are measured from the
moment the gateway accepted the request, so they include its queueing; `queue_seconds` is that
part alone. The stage replicas' own metrics (steps, busy seconds, KV blocks) are theirs
(`shardline.stage_worker --metrics-port`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

if TYPE_CHECKING:
    from .generation import Generation
    from .service import Gateway

# Seconds: a token at a few ms up to minutes-long generations.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class GatewayMetrics:
    def __init__(self, gateway: "Gateway") -> None:
        self.gateway = gateway
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("shardline_gateway_requests", "requests that ended, by final state "
                                "(finished, cancelled, failed)", ["model", "state"], registry=r)
        self.refused = Counter("shardline_gateway_refused_requests", "requests refused before they ran, "
                               "by gRPC status code", ["code"], registry=r)
        self.prompt_tokens = Counter("shardline_gateway_prompt_tokens", "prompt tokens of ended requests",
                                     ["model"], registry=r)
        self.generated_tokens = Counter("shardline_gateway_generated_tokens", "tokens generated for ended "
                                        "requests", ["model"], registry=r)
        self.resumes = Counter("shardline_gateway_resumes", "failovers: sequences resumed on another route",
                               ["model"], registry=r)
        self.ttft = Histogram("shardline_gateway_time_to_first_token_seconds", "acceptance to first token",
                              ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.duration = Histogram("shardline_gateway_request_duration_seconds", "acceptance to end",
                                  ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Histogram("shardline_gateway_queue_seconds", "acceptance to a route (admission queue and "
                               "route wait)", ["model"], buckets=LATENCY_BUCKETS, registry=r)
        r.register(_GatewayGauges(gateway))
        self._http = None

    def refused_request(self, code_name: str) -> None:
        self.refused.labels(code_name).inc()

    def request_ended(self, g: "Generation", state: str, admitted_at: float) -> None:
        self.requests.labels(g.model, state.lower()).inc()
        self.prompt_tokens.labels(g.model).inc(len(g.prompt_token_ids))
        self.generated_tokens.labels(g.model).inc(len(g.generated))
        if g.num_resumes:
            self.resumes.labels(g.model).inc(g.num_resumes)
        if g.first_token_at:
            self.ttft.labels(g.model).observe(g.time_to_first_token_s)
        if admitted_at:
            self.queue.labels(g.model).observe(max(0.0, admitted_at - g.queued_at))
        self.duration.labels(g.model).observe(g.elapsed_s)

    def serve(self, port: int, host: str) -> int:
        """Start the /metrics endpoint on its own thread; returns the port bound (port 0: any)."""
        self._http, _ = start_http_server(port, addr=host, registry=self.registry)
        return self._http.server_port

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


class _GatewayGauges:
    """Read at scrape time from the gateway (another thread: plain reads of counts)."""

    def __init__(self, gateway: "Gateway") -> None:
        self.gateway = gateway

    def collect(self):
        gw = self.gateway
        for name, doc, value in (
                ("shardline_gateway_requests_running", "requests holding an admission slot",
                 gw.admission.num_running),
                ("shardline_gateway_requests_queued", "requests waiting for a slot", gw.admission.num_queued),
                ("shardline_gateway_serving", "1 while a complete route exists for a served model",
                 int(gw.is_serving))):
            yield GaugeMetricFamily(name, doc, value=value)
        routes = GaugeMetricFamily("shardline_gateway_routes", "complete routes per model (min over stages of "
                                   "routable replicas)", labels=["model"])
        for name, view in sorted(gw.served_models().items()):
            routes.add_metric([name], view.num_routes if view is not None else 0)
        yield routes
