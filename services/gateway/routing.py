"""Route choice: one live, non-draining replica per stage of a model, least loaded first.

The registry's load figures (running sequences, free KV blocks) are as fresh as each replica's
last heartbeat. Between heartbeats the gateway adds what it has itself admitted since then, so
that a burst of requests spreads over the replicas instead of all landing on the one that looked
idlest a second ago.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

from shardline.registry import ReplicaInfo


@dataclass(frozen=True)
class Route:
    model: str
    replicas: tuple[ReplicaInfo, ...]  # stage order, stage 0 first

    @property
    def addresses(self) -> list[str]:
        return [r.address for r in self.replicas]

    @property
    def downstream(self) -> list[str]:
        """Addresses of stages 1..p-1: what stage 0's AdmitRequest.route carries."""
        return self.addresses[1:]


@dataclass(frozen=True)
class ModelView:
    """What the registry says about one model right now."""
    name: str
    num_stages: int
    tp_size: int
    max_model_len: int  # 0 = the registry does not say
    architecture: str  # "" = the registry does not say
    num_routes: int  # complete routes: min over stages of routable replicas


def is_routable(r: ReplicaInfo, excluded: set[str]) -> bool:
    return not r.is_draining and r.address not in excluded


def models_view(replicas: list[ReplicaInfo]) -> dict[str, ModelView]:
    by_model: dict[str, list[ReplicaInfo]] = defaultdict(list)
    for r in replicas:
        by_model[r.model].append(r)
    views = {}
    for name, rs in by_model.items():
        num_stages = max(r.num_stages for r in rs)
        per_stage = [sum(1 for r in rs if r.stage == s and is_routable(r, set())) for s in range(num_stages)]
        views[name] = ModelView(
            name=name, num_stages=num_stages, tp_size=rs[0].tp,
            max_model_len=max((getattr(r, "max_model_len", 0) or 0) for r in rs),
            architecture=next((a for r in rs if (a := getattr(r, "architecture", ""))), ""),
            num_routes=min(per_stage) if per_stage else 0)
    return views


class RouteChooser:
    """Picks routes from registry snapshots and remembers what it admitted since each heartbeat."""

    def __init__(self) -> None:
        # replica address -> {request_id: time admitted}; entries leave when the request ends.
        self._admitted: dict[str, dict[str, float]] = defaultdict(dict)

    def choose(self, model: str, replicas: list[ReplicaInfo], excluded: set[str] = frozenset()) -> Route | None:
        """The least-loaded complete route of `model`, or None if some stage has no routable replica."""
        candidates = [r for r in replicas if r.model == model and is_routable(r, excluded)]
        if not candidates:
            return None
        num_stages = max(r.num_stages for r in candidates)
        chosen = []
        for stage in range(num_stages):
            at_stage = [r for r in candidates if r.stage == stage and r.num_stages == num_stages]
            if not at_stage:
                return None
            chosen.append(min(at_stage, key=self._load_key))
        return Route(model, tuple(chosen))

    def _load_key(self, r: ReplicaInfo) -> tuple:
        # Admitted here after the replica's last heartbeat: not yet in its reported figures.
        pending = sum(1 for t in self._admitted.get(r.address, {}).values() if t > r.updated_at)
        # Fewest running first (it sets the step's batch size and so everyone's latency), then the
        # most free KV blocks; the replica id breaks ties so that choice is deterministic.
        return (r.num_running + pending, -r.num_free_blocks, r.replica_id)

    def admitted(self, route: Route, request_id: str) -> None:
        now = time.time()
        for address in route.addresses:
            self._admitted[address][request_id] = now

    def finished(self, route: Route, request_id: str) -> None:
        for address in route.addresses:
            entries = self._admitted.get(address)
            if entries is not None:
                entries.pop(request_id, None)
                if not entries:
                    del self._admitted[address]
