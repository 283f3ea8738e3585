"""Route choice from a registry populated in a real redis-server."""

from __future__ import annotations

import time
import uuid

from shardline.gateway.routing import RouteChooser, models_view
from shardline.registry import Registry, ReplicaInfo


def replica(model, stage, name, num_stages=2, running=0, free=64, draining=False):
    return ReplicaInfo(replica_id=name, address=f"{name}:1", model=model, stage=stage, num_stages=num_stages,
                       layer_start=stage, layer_end=stage + 1, tp=1, num_total_blocks=64, num_free_blocks=free,
                       block_size=16, num_running=running, is_draining=draining)


def test_least_loaded_live_non_draining_replica_per_stage(redis_server):
    model = f"route-{uuid.uuid4().hex[:6]}"
    registry = Registry.from_url(redis_server, ttl_s=30)
    for r in [replica(model, 0, "a", running=3), replica(model, 0, "b", running=1),
              replica(model, 0, "c", running=0, draining=True),
              replica(model, 1, "d", running=2, free=10), replica(model, 1, "e", running=2, free=50),
              replica("other-model", 0, "x", num_stages=1)]:
        registry.heartbeat(r)
    replicas = registry.replicas()
    route = RouteChooser().choose(model, replicas)
    assert route.addresses == ["b:1", "e:1"], "fewest running first, then most free KV blocks; never draining"
    assert route.downstream == ["e:1"]
    assert RouteChooser().choose(model, replicas, excluded={"b:1"}).addresses == ["a:1", "e:1"]
    assert RouteChooser().choose(model, replicas, excluded={"d:1", "e:1"}) is None, "a stage without replicas: no route"
    view = models_view(replicas)[model]
    assert (view.num_stages, view.num_routes) == (2, 2)


def test_admissions_since_the_last_heartbeat_count_as_load(redis_server):
    model = f"route-{uuid.uuid4().hex[:6]}"
    registry = Registry.from_url(redis_server, ttl_s=30)
    for r in [replica(model, 0, "a"), replica(model, 0, "b"), replica(model, 1, "s1")]:
        registry.heartbeat(r)
    time.sleep(0.01)
    chooser, replicas = RouteChooser(), registry.replicas(model)
    picks = []
    for i in range(4):
        route = chooser.choose(model, replicas)
        chooser.admitted(route, f"r{i}")
        picks.append(route.addresses[0])
    assert sorted(picks) == ["a:1", "a:1", "b:1", "b:1"], "a burst must spread before the next heartbeat"
    # a's next heartbeat reports the 2 we sent it; they must not be counted twice. b has not
    # heartbeated since, so its 2 still count as pending: a tie at 2, broken by replica id.
    registry.heartbeat(replica(model, 0, "a", running=2))
    assert chooser.choose(model, registry.replicas(model)).addresses[0] == "a:1"
    registry.heartbeat(replica(model, 0, "a", running=3))
    assert chooser.choose(model, registry.replicas(model)).addresses[0] == "b:1"


def test_expired_heartbeat_removes_the_replica(redis_server):
    model = f"route-{uuid.uuid4().hex[:6]}"
    registry = Registry.from_url(redis_server, ttl_s=0.2)
    registry.heartbeat(replica(model, 0, "a", num_stages=1))
    assert RouteChooser().choose(model, registry.replicas(model)) is not None
    time.sleep(0.4)
    assert RouteChooser().choose(model, registry.replicas(model)) is None, "a dead replica must vanish after its TTL"


def test_a_replica_of_a_later_version_reporting_more_is_still_routed_to(redis_server):
    """Mid-rollout a newer stage worker may write keys this version does not know: the registry
    reads the entry without them (it used to raise TypeError, and the gateway could route nowhere)."""
    import json
    model = f"route-{uuid.uuid4().hex[:6]}"
    registry = Registry.from_url(redis_server, ttl_s=30)
    for r in [replica(model, 0, "a"), replica(model, 1, "b")]:
        registry.heartbeat(r)
    newer = json.loads(registry.redis.get(replica(model, 0, "a").key))
    registry.redis.set(replica(model, 0, "a").key, json.dumps({**newer, "rpcs": ["GenerateMany"], "gpu": "H200"}), px=30_000)
    replicas = registry.replicas(model)
    assert sorted(r.replica_id for r in replicas) == ["a", "b"]
    assert RouteChooser().choose(model, replicas).addresses == ["a:1", "b:1"]
