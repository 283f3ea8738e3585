"""Prometheus metrics of one stage replica, read from the worker at scrape time.

    python -m shardline.stage_worker ... --metrics-port 9400   # GET :9400/metrics

Busy seconds per stage over wall time is each stage's utilisation: with PP stages and micro-batches
in flight, every stage's rate rises together (the pipeline is full); one stage near 1 and the
others low marks the bottleneck stage.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from shardline.stage_worker.worker import StageWorker

LABELS = ["model", "stage", "replica"]


class StageCollector:
    def __init__(self, worker: StageWorker) -> None:
        self.worker = worker

    def collect(self):
        w = self.worker
        s = w.status()
        values = [w.model_name, str(w.stage), w.replica_id]

        def family(cls, name, doc, value):
            f = cls(name, doc, labels=LABELS)
            f.add_metric(values, value)
            return f

        yield family(CounterMetricFamily, "shardline_stage_steps", "micro-batches computed", s["steps"])
        yield family(CounterMetricFamily, "shardline_stage_tokens", "token rows computed", s["tokens"])
        yield family(CounterMetricFamily, "shardline_stage_busy_seconds", "time spent computing micro-batches",
                     s["busy_seconds"])
        yield family(GaugeMetricFamily, "shardline_kv_blocks_free", "free KV-cache blocks", s["free_blocks"])
        yield family(GaugeMetricFamily, "shardline_kv_blocks_total", "KV-cache blocks", s["num_blocks"])
        yield family(GaugeMetricFamily, "shardline_sequences_running", "sequences held", s["num_running"])
        yield family(GaugeMetricFamily, "shardline_micro_batches_in_flight_max",
                     "most micro-batches stage 0 has had in flight", s["max_micro_batches_in_flight"])
        yield family(GaugeMetricFamily, "shardline_replica_draining", "1 after SIGTERM", int(s["is_draining"]))


def serve_metrics(worker: StageWorker, port: int, host: str = "0.0.0.0"):
    """Start the /metrics endpoint; returns (server, thread) so tests can stop it."""
    registry = CollectorRegistry()
    registry.register(StageCollector(worker))
    return start_http_server(port, addr=host, registry=registry)
