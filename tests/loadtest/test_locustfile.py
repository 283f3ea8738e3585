"""The locustfile users run must drive a real cluster without errors and report its numbers."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from shardline.launcher import ClusterConfig, LocalCluster, free_port

pytestmark = pytest.mark.slow
LOADTEST = Path(__file__).resolve().parents[2] / "loadtest"


def test_locust_headless_runs_against_a_local_cluster(tmp_path):
    """Both locustfiles, the gRPC SDK's and the OpenAI HTTP front door's, against one cluster."""
    # Only look for it: importing locust here would gevent-patch this threaded process and hang it.
    if importlib.util.find_spec("locust") is None:
        pytest.skip("locust is in the test extra; pip install -e '.[test]'")
    config = ClusterConfig(pp=1, grpc_port=free_port(), http_port=free_port(), workdir=str(tmp_path))
    with LocalCluster(config) as cluster:
        for name, host, kind in (("locustfile.py", cluster.gateway_address, "grpc"),
                                 ("http_locustfile.py", f"http://127.0.0.1:{config.http_port}", "http")):
            r = subprocess.run([sys.executable, "-m", "locust", "-f", str(LOADTEST / name), "--host", host,
                                "--headless", "-u", "4", "-r", "4", "-t", "5s", "--max-tokens", "8",
                                "--csv", str(tmp_path / kind), "--exit-code-on-error", "1"],
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
            stats = (tmp_path / f"{kind}_stats.csv").read_text().splitlines()
            header = stats[0].split(",")
            rows = {tuple(line.split(",")[:2]): dict(zip(header, line.split(","))) for line in stats[1:]}
            stream, ttft = rows[(kind, "stream")], rows[(kind, "ttft")]
            assert int(stream["Request Count"]) > 0 and int(stream["Failure Count"]) == 0, \
                f"{name}: streams must complete without failures"
            assert int(ttft["Request Count"]) >= int(stream["Request Count"]), \
                f"{name}: every finished stream recorded its time to first token"
            assert 0 < float(stream["Average Content Size"]) <= 8, f"{name}: tokens a stream (max_tokens 8)"
