"""Refine a GEMM table in the captured decode step: `shardline tune-gemm --in-step`.

    shardline tune-gemm --shape llama3-8b --batches 16,64 --in-step --out gemm-h200.json

`tune()` (gemm_tuning.py) times each product alone, back to back with itself. In the decode step a
product follows a norm or the attention and, with programmatic dependent launch, overlaps their
tails and they its head, so the order alone can differ from the order in the step. Measured on an
H200 at Llama-3-8B shape (docs/benchmarks-history.md, 2026-11-30): alone, qkv and o ranked cuBLAS first at
batch 64, where the ring GEMM took 0.1 ms/step off in the step; the batch-64 ring tile for qkv ran
+0.9 ms/step at 16 rows, though alone it is as fast as at 64.

So this builds a one-stage engine on random weights of the model's shape and, for one batch bucket
and one linear at a time, replays the captured decode step (every row attending over `context`
tokens) with each candidate in that linear's entry: the table's choice, the default path (no
entry), cuBLAS, the split-K Triton tiles, the ring GEMM's tiles (Hopper) and, at one row, the GEMV
tiles. A candidate must first agree with the reference on the engine's own weights. Candidates are
timed in alternating rounds and ranked by their median; an entry changes only when a candidate
beats the current choice by more than `margin` of the step.
"""

from __future__ import annotations

import copy
import json
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F

from shardline.config import EngineConfig, ModelConfig
from shardline.gemm_tuning import (GemmTable, agrees, gemv_candidates, key, linear_shapes, ring_candidates,
                                   triton_candidates)

IN_STEP_MAX_M = 64  # above it the products are compute-bound and the default (cuBLAS) is the choice
LINEARS = ("qkv_proj", "o_proj", "up_proj", "down_proj", "lm_head")
DEFAULT = {"impl": "default", "config": None}  # no entry: the engine's own choice for the rows
IMPLS = {"default", "cublas", "triton", "ring", "gemv", "exp12"}  # what `refine(impls=...)` can keep to


def settings_error(rounds: int, margin: float) -> str | None:
    """What is wrong with a refinement's rounds and margin, or None: `refine` needs at least one
    round, and a margin that is a fraction of the step in [0, 1)."""
    if rounds < 1 or not 0 <= margin < 1:
        return (f"rounds {rounds} and margin {margin}: rounds must be >= 1 and the margin a fraction "
                "in [0, 1), e.g. 2 rounds and a margin of 0.003")
    return None


def label(choice: dict) -> str:
    if choice["impl"] == "default":
        return "no entry (the next larger batch's, else the default path)"
    cfg = choice.get("config") or {}
    return choice["impl"] + ("" if not cfg else " " + ",".join(f"{k}={v}" for k, v in cfg.items()))


def pick(times: list[list[float]], margin: float) -> tuple[int, list[float]]:
    """(index of the candidate to keep, medians) for per-candidate round times whose first entry is
    the current choice: the fastest median, if it beats the current one by more than `margin`
    (relative), else 0."""
    medians = [statistics.median(t) for t in times]
    best = min(range(len(medians)), key=medians.__getitem__)
    return (best if medians[best] < medians[0] * (1 - margin) else 0), medians


def with_choice(table: GemmTable, entry_key: str, m: int, choice: dict) -> GemmTable:
    """A copy of `table` whose entry (entry_key, m) is `choice` (removed for DEFAULT)."""
    trial = copy.deepcopy(table)
    by_m = trial.entries.setdefault(entry_key, {})
    if choice["impl"] == "default":
        by_m.pop(m, None)
        if not by_m:
            del trial.entries[entry_key]
    else:
        by_m[m] = {k: v for k, v in choice.items() if k in ("impl", "config")}
    return trial


def current_choice(table: GemmTable, entry_key: str, m: int) -> dict:
    """The entry tuned for exactly m rows, or DEFAULT: a batch bucket's own entry, not the next
    larger bucket's it would borrow (each bucket is refined on its own)."""
    entry = table.entries.get(entry_key, {}).get(m)
    return {"impl": entry["impl"], "config": entry.get("config")} if entry else dict(DEFAULT)


def candidates(current: dict, m: int, x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None,
               glu: bool = False, exp12: bool = False) -> list[dict]:
    """The current choice first, then its twin with the other LATE (where the kernel after it may
    launch: the split-K and ring kernels take the key), the default path, cuBLAS, the split-K TMA
    tiles and the ring tiles (and at one row the GEMV tiles), each once; where the 12-bit form may
    run the product (`exp12`: a layer's bf16 linear, not the head) on Hopper, also its tiles
    (kernels/exp12.py: exp12_tiles, K split where its tiles are few). `glu`: the product is the
    fused [gate; up] projection."""
    from shardline.kernels import gemv
    from shardline.kernels._dispatch import hopper_or_later, sm_count
    from shardline.kernels.exp12 import exp12_tiles, split_fits

    out = [current]
    if current["impl"] in ("triton", "ring") and current.get("config"):
        late = current["config"].get("LATE", 0)
        out.append({"impl": current["impl"], "config": {**current["config"], "LATE": 0 if late else 1}})
    out += [dict(DEFAULT), {"impl": "cublas", "config": None}]
    if m == 1 and gemv.fits(x, w):
        out += [{"impl": "gemv", "config": c} for c in gemv_candidates(x, w, scale)]
    elif m > 1:
        tma = hopper_or_later(x)  # on Hopper only the TMA twins, as every split-K choice of the H200 table is
        out += [{"impl": "triton", "config": c} for c in triton_candidates(m, tma=tma) if c.get("TMA") or not tma]
        out += [{"impl": "ring", "config": c} for c in ring_candidates(m, x, w, scale)]
        if exp12 and tma and scale is None and w.dtype == torch.bfloat16 and x.dtype == torch.bfloat16:
            out += [{"impl": "exp12", "config": c} for c in exp12_tiles(w.shape[0], sm_count(x))
                    if split_fits(w.shape[1], c["BLOCK_K"], c.get("SPLIT_K", 1)) is None]
    seen, unique = set(), []
    for c in out:
        tag = json.dumps({"impl": c["impl"], "config": c.get("config")}, sort_keys=True)
        if tag not in seen:
            seen.add(tag)
            unique.append(c)
    return unique


def random_engine(cfg: ModelConfig, dtype: str, quantization: str, max_num_seqs: int, device: str = "cuda",
                  gemm_config: str | None = None, kv_bytes: int = 24 << 30, max_model_len: int = 4096,
                  **engine_options):
    """A one-stage, one-rank engine on random weights of `cfg`'s shape (graphs captured on demand)."""
    from shardline.model.random_weights import random_manifest, random_stage_weights
    from shardline.parallel import single_rank
    from shardline.stage_worker.engine import StageEngine

    manifest = random_manifest(cfg, dtype, quantization=quantization)
    config = EngineConfig(device=device, kv_cache_bytes=kv_bytes, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=8192, max_model_len=max_model_len, verify_checksums=False,
                          gemm_config=gemm_config, capture_graphs_at_start=False, **engine_options)
    weights = random_stage_weights(manifest, 0, 0, device)
    return StageEngine(None, 0, single_rank(), config, manifest=manifest, weights=weights)


def loaded_graph(engine, batch: int, context: int = 192, capture: bool = False,
                 needs_logits: bool = False) -> torch.cuda.CUDAGraph | None:
    """The engine's captured decode graph of `batch` rows, its inputs loaded so that every row
    attends over `context` tokens in blocks of its own and writes nothing (slot -1); None when not
    captured yet (with `capture`, it is captured now). `needs_logits`: the step says a row reads
    its logits, as a step with a row drawn at a temperature does (else the head may skip them)."""
    graphs = engine.graphs
    key_ = graphs.buckets(batch, context) if graphs else None
    if key_ is None or (key_ not in graphs.graphs and not capture):
        return None
    graph, _ = graphs.captured(key_)
    graphs.load(*key_, loaded_step(engine, batch, context, needs_logits))
    return graph


def loaded_step(engine, batch: int, context: int = 192, needs_logits: bool = False):
    """The step `loaded_graph` loads: `batch` rows, each attending over `context` tokens in blocks
    of its own, writing nothing (slot -1)."""
    from shardline.stage_worker.staging import HostStep

    per_row = -(-context // engine.block_manager.block_size)
    num_blocks = engine.block_manager.num_blocks
    return HostStep(positions=[context - 1] * batch, slots=[-1] * batch, seq_lens=[context] * batch,
                    tables=[[(r * per_row + j) % num_blocks for j in range(per_row)] for r in range(batch)],
                    needs_logits=needs_logits)


def replay_ms(graph: torch.cuda.CUDAGraph, replays: int = 20) -> float:
    """GPU time of one replay of `graph` (no host work between replays): what the step costs the device."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays


def step_ms(engine, table: GemmTable, batch: int, reps: int = 2, context: int = 192) -> float:
    """The step's replay time (the best of `reps` 20-replay timings) with `table`'s choices."""
    engine.model.configure_gemms(table)
    engine.graphs.reset()
    graph = loaded_graph(engine, batch, context, capture=True)
    return min(replay_ms(graph) for _ in range(reps))


def _linears(engine) -> dict[str, object]:
    """One Linear per name (the first layer's; the head): the weights candidates are checked on."""
    model = engine.model
    layer = model.layers[0]
    return {"qkv_proj": layer.qkv_proj, "o_proj": layer.o_proj, "up_proj": layer.up_proj,
            "down_proj": layer.down_proj, "lm_head": model.lm_head}


def _agrees(lin, choice: dict, m: int, x_dtype: torch.dtype, glu: bool) -> bool:
    """The candidate's product of m random rows and the linear's weights against the reference, in
    the form the engine runs it (`glu`: the gated MLP's silu(gate) * up, fused where it can be)."""
    from shardline.kernels import activation, quant
    n, k = lin.weight.shape
    x = torch.randn(m, k, device=lin.weight.device, dtype=x_dtype) * 0.5
    ref = (F.linear(x, lin.weight) if lin.scale is None else quant.quantized_linear(x, lin.weight, lin.scale))
    saved = lin.gemms
    try:
        lin.gemms = with_choice(GemmTable("this"), key(n, k, lin.weight.dtype, x.dtype), m, choice)
        if choice["impl"] == "exp12":
            lin.prepare_exp12(glu)  # the 12-bit form the choice runs
            if lin._choice(x) is None:
                return False  # the form does not take this weight or config: the default path would run
        if glu:  # Linear.glu adds the bias, where the model has one
            return agrees(lin.glu(x), activation.silu_and_mul_ref(ref if lin.bias is None else ref + lin.bias))
        return agrees(lin(x, add_bias=False), ref)
    except Exception:  # noqa: BLE001 - a tile that does not compile or take these operands is no candidate
        return False
    finally:
        lin.gemms = saved
        if choice["impl"] == "exp12":
            lin.prepare_exp12(glu)  # as the saved table has it


def refine(engine, table: GemmTable, batches: list[int], cfg: ModelConfig, x_dtype: torch.dtype,
           linears: tuple[str, ...] = LINEARS, rounds: int = 2, margin: float = 0.003,
           report: Callable[[dict], None] = lambda row: print(json.dumps(row), flush=True),
           impls: set[str] | None = None) -> GemmTable:
    """`table` with each (linear, batch) entry replaced by the fastest candidate in the step. Batches
    above IN_STEP_MAX_M are left as they are; the others go largest first, so that a batch whose
    best is no entry of its own borrows a larger batch's final choice. `impls`: only candidates of
    these implementations (of IMPLS), besides the current one."""
    table = copy.deepcopy(table)
    shapes = linear_shapes(cfg)
    lins = _linears(engine)
    for b in sorted((b for b in batches if b <= IN_STEP_MAX_M), reverse=True):
        for name in linears:
            n, k = shapes[name]
            lin = lins[name]
            entry_key = key(n, k, lin.weight.dtype, x_dtype)
            current = current_choice(table, entry_key, b)
            x = torch.empty(b, k, device=lin.weight.device, dtype=x_dtype)
            glu = name == "up_proj" and cfg.activation == "silu_glu"
            cands = [c for c in candidates(current, b, x, lin.weight, lin.scale, glu, exp12=name != "lm_head")
                     if c is current or ((impls is None or c["impl"] in impls) and _agrees(lin, c, b, x_dtype, glu))]
            times: list[list[float]] = [[] for _ in cands]
            for _ in range(rounds):
                for i, c in enumerate(cands):
                    try:
                        times[i].append(step_ms(engine, with_choice(table, entry_key, b, c), b))
                    except Exception as exc:  # noqa: BLE001 - a tile that does not compile or fit is no candidate
                        times[i].append(float("inf"))
                        report({"linear": name, "batch": b, "candidate": label(c), "error": str(exc)[:200]})
            chosen, medians = pick(times, margin)
            for c, med, t in zip(cands, medians, times):
                report({"linear": name, "batch": b, "candidate": label(c), "step_ms": round(med, 4),
                        "rounds": [round(x, 4) for x in t], "current": c is current})
            if chosen:
                table = with_choice(table, entry_key, b, cands[chosen])
                if cands[chosen]["impl"] != "default":
                    table.entries[entry_key][b].update(step_ms=round(medians[chosen], 4), replaced=label(current),
                                                       replaced_step_ms=round(medians[0], 4))
            report({"linear": name, "batch": b, "kept" if not chosen else "chose": label(cands[chosen]),
                    "step_ms": round(medians[chosen], 4), "was_ms": round(medians[0], 4)})
    engine.model.configure_gemms(table)
    engine.graphs.reset()
    return table
