"""The gateway's Prometheus endpoint, scraped over HTTP after real requests through gRPC."""

from __future__ import annotations

import asyncio
import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shardline.client import NO_RETRY, Client, InvalidArgument, ResourceExhausted
from shardline.gateway.config import AdmissionConfig


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of one scrape."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_count_what_clients_saw(bench, model_name):
    bench.route(model_name, token_delay_s=0.01)
    gw = bench.start_gateway(model_names=(model_name,), metrics_port=0,
                             admission=AdmissionConfig(max_running=1, max_queued=0))
    m = (("model", model_name),)
    with Client(f"127.0.0.1:{gw.port}", timeout=30, retry=NO_RETRY) as client:
        before = scrape(gw.metrics_port)
        assert before[("shardline_gateway_serving", ())] == 1
        assert before[("shardline_gateway_routes", m)] == 1
        results = [client.generate([5, 6, 7], max_tokens=n, ignore_eos=True) for n in (4, 6)]
        with pytest.raises(InvalidArgument):
            client.generate("hi", max_tokens=0)
        with client.stream([5, 6], max_tokens=50, ignore_eos=True) as stream:  # holds the only slot
            next(iter(stream))
            with pytest.raises(ResourceExhausted):
                client.generate("hi", max_tokens=2)
            during = scrape(gw.metrics_port)
            stream.cancel()
            list(stream)
        bench.wait_until(lambda: scrape(gw.metrics_port).get(("shardline_gateway_requests_total", m + (
            ("state", "cancelled"),))) == 1, what="the cancelled stream to be counted")
        after = scrape(gw.metrics_port)
        bench.wait_until(lambda: client.get_request(stream.request_id).state == "cancelled",
                         what="the cancelled stream's final record")  # written after the metrics
        cancelled = client.get_request(stream.request_id)
    assert cancelled.num_generated_tokens >= len(stream.token_ids) >= 1
    assert during[("shardline_gateway_requests_running", ())] == 1
    assert after[("shardline_gateway_requests_running", ())] == 0
    assert after[("shardline_gateway_requests_total", m + (("state", "finished"),))] == 2
    assert after[("shardline_gateway_refused_requests_total", (("code", "INVALID_ARGUMENT"),))] == 1
    assert after[("shardline_gateway_refused_requests_total", (("code", "RESOURCE_EXHAUSTED"),))] == 1
    assert after[("shardline_gateway_prompt_tokens_total", m)] == 3 + 3 + 2
    # the cancelled stream's tokens as the gateway counted them: one may have been on its way
    assert after[("shardline_gateway_generated_tokens_total", m)] == \
        sum(len(r.token_ids) for r in results) + cancelled.num_generated_tokens
    assert after[("shardline_gateway_time_to_first_token_seconds_count", m)] == 3
    assert after[("shardline_gateway_request_duration_seconds_count", m)] == 3
    slowest = max(r.total_s for r in results)
    assert after[("shardline_gateway_request_duration_seconds_sum", m)] >= slowest, \
        "durations are the gateway's own, which the responses report"


def test_a_metrics_port_in_use_names_the_flag_and_leaves_nothing_listening(bench, model_name):
    bench.route(model_name)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(OSError, match=r"cannot listen on 127\.0\.0\.1:\d+ .*; pick another --metrics-port"):
            bench.start_gateway(model_names=(model_name,), metrics_port=busy.getsockname()[1])
    gw = bench.start_gateway(model_names=(model_name,), metrics_port=0)  # and a gateway starts fine after
    assert scrape(gw.metrics_port)[("shardline_gateway_serving", ())] == 1


def test_a_gateway_stopped_right_after_it_started_stops(bench, loop_thread, model_name):
    """The cancel subscription was still connecting; its task once swallowed the cancel and the
    stop waited forever."""
    from shardline.gateway.config import GatewayConfig
    from shardline.gateway.server import start

    bench.route(model_name)
    for _ in range(3):
        running = loop_thread.run(start(GatewayConfig(redis_url=bench.redis_url, tokenizer=bench.tokenizer_address,
                                                      port=0, host="127.0.0.1")))
        loop_thread.run(asyncio.wait_for(running.stop(0), 10))
