"""Tensor-parallel group state, passed explicitly to everything that communicates.

Nothing in shardline calls a collective on the default process group: a `TPGroup` carries its
own `ProcessGroup` and every collective names it. With size 1 every op is the identity and no
process group exists at all, so the single-rank path needs no torch.distributed.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class TPGroup:
    rank: int
    size: int
    group: dist.ProcessGroup | None = None
    # Device that collectives move tensors through (gloo: cpu, nccl: the rank's cuda device).
    device: torch.device = torch.device("cpu")

    @property
    def is_driver(self) -> bool:
        """Rank 0 talks to the outside world (gRPC) and drives its followers."""
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place; the row-parallel linears' partial outputs."""
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """[..., n] on each rank -> [..., n * size], rank order (the vocab-parallel logits)."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)

    def min_int(self, value: int) -> int:
        """The smallest of the ranks' values: sizes every rank must agree on (KV blocks)."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())

    def broadcast_tensor(self, x: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Rank 0's `x` to every rank; followers pass None and the expected shape/dtype."""
        if self.size == 1:
            assert x is not None
            return x
        if x is None:
            x = torch.empty(shape, dtype=dtype, device=self.device)
        dist.broadcast(x, src=self.group_src(), group=self.group)
        return x

    def broadcast_json(self, obj: object | None) -> object:
        """A small control message from rank 0 (the step's batch description) to every rank.

        JSON, not pickle: followers never execute what arrives, they read fields.
        """
        if self.size == 1:
            return obj
        if self.is_driver:
            payload = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
            length = torch.tensor([payload.numel()], dtype=torch.int64)
        else:
            length = torch.zeros(1, dtype=torch.int64)
        length = length.to(self.device)
        dist.broadcast(length, src=self.group_src(), group=self.group)
        if not self.is_driver:
            payload = torch.empty(int(length.item()), dtype=torch.uint8)
        payload = payload.to(self.device)
        dist.broadcast(payload, src=self.group_src(), group=self.group)
        return json.loads(bytes(payload.cpu().numpy()).decode()) if not self.is_driver else obj

    def group_src(self) -> int:
        """Global rank of this group's rank 0 (collectives take global ranks)."""
        return dist.get_global_rank(self.group, 0) if self.group is not None else 0


def single_rank() -> TPGroup:
    return TPGroup(rank=0, size=1)


def rank_device(device: str, rank: int) -> str:
    """`cuda` means one GPU per TP rank: rank r takes cuda:(r mod visible GPUs), as in a pod
    with one GPU per rank. `cpu` and an explicit `cuda:N` are kept."""
    if device == "cuda" and torch.cuda.is_available():
        return f"cuda:{rank % torch.cuda.device_count()}"
    return device


def init_tp_group(rank: int, size: int, init_method: str | None, device: str = "cpu") -> TPGroup:
    """Join a TP group of `size` ranks at `init_method` (e.g. tcp://127.0.0.1:29500) with the
    engine's `device` (use rank_device): NCCL between GPUs, gloo between CPU ranks."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if size == 1:
        return TPGroup(rank=0, size=1, device=dev)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size)
    group = dist.new_group(list(range(size)), backend=backend)
    return TPGroup(rank=rank, size=size, group=group, device=dev)


def leave_tp_group(tp: TPGroup, ok: bool = True) -> None:
    """Tear down a TP rank's process group as its process ends; with a GPU, end the process here.

    Left to the interpreter's exit, gloo's threads can abort the process ("terminate called
    without an active exception"), so on CPU the group is destroyed first. On CUDA,
    destroy_process_group hangs once NCCL collectives were captured in CUDA graphs
    (pytorch/pytorch#115388; seen here on two H200s, torch 2.11, NCCL 2.28.9), so the process
    leaves with os._exit (status 0 if `ok`, else 1) without tearing the communicators down."""
    if tp.size == 1:
        return
    if tp.device.type != "cuda":
        dist.destroy_process_group()
        return
    torch.cuda.synchronize()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if ok else 1)
