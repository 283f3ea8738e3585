"""Ports: a local cluster picks all its ports before its processes bind them, so the launcher never
hands one out twice, and a stage worker refuses a port another server already listens on (gRPC
would otherwise share it through SO_REUSEPORT and split its connections between two servers)."""

from __future__ import annotations

import socket
import subprocess
import sys

from shardline.converter import convert
from shardline.launcher import _ephemeral_ports, free_port, free_port_run


def test_free_port_never_hands_out_a_port_twice():
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)


def test_free_ports_lie_below_the_range_outgoing_connections_take_theirs_from():
    """An outgoing connection's local port comes from the ephemeral range; one handed out from it
    could be taken before its server binds it (a TP rendezvous failed so, EADDRINUSE)."""
    eph = _ephemeral_ports()
    assert 1024 <= eph.start < eph.stop <= 65536
    ports = [free_port() for _ in range(50)] + [free_port_run(3) + i for _ in range(10) for i in range(3)]
    assert all(p < eph.start for p in ports), (eph, sorted(ports)[-5:])
    for p in ports[:10]:  # nothing holds them: a server can bind each
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_stage_worker_refuses_a_port_in_use(tmp_path, tiny_hf):
    model = tmp_path / "model"
    convert(tiny_hf("llama"), model, tp=1, pp=1, dtype="fp32")
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as another gRPC server would hold it
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "shardline.stage_worker", "--model", str(model), "--stage", "0",
                            "--port", str(port), "--num-blocks", "16"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in r.stdout and "port in use" in r.stdout, r.stdout
