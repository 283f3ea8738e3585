"""The locustfile users run must drive a real cluster without errors and report its numbers."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from shardline.launcher import ClusterConfig, LocalCluster, free_port

pytestmark = pytest.mark.slow
LOCUSTFILE = Path(__file__).resolve().parents[2] / "loadtest" / "locustfile.py"


def test_locust_headless_run_against_a_local_cluster(tmp_path):
    # Only look for it: importing locust here would gevent-patch this threaded process and hang it.
    if importlib.util.find_spec("locust") is None:
        pytest.skip("locust is in the test extra; pip install -e '.[test]'")
    with LocalCluster(ClusterConfig(pp=1, grpc_port=free_port(), workdir=str(tmp_path))) as cluster:
        r = subprocess.run([sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--host", cluster.gateway_address,
                            "--headless", "-u", "4", "-r", "4", "-t", "5s", "--max-tokens", "8",
                            "--csv", str(tmp_path / "run"), "--exit-code-on-error", "1"],
                           capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    stats = (tmp_path / "run_stats.csv").read_text().splitlines()
    rows = {line.split(",")[1]: line.split(",") for line in stats[1:]}
    assert int(rows["stream"][2]) > 0 and int(rows["stream"][3]) == 0, "streams must complete without failures"
    assert int(rows["ttft"][2]) > 0, "time to first token must be recorded"
