"""Decode and prefill speed of the shardline engine on one GPU, beside its peers in the same run.

    python benchmarks/decode_bench.py --batches 1,16,64,256 --peers .peers --out $OUT/decode.json

Measures, on random bf16 weights of real model shapes (128-token prompts, 128 new tokens, the
method of ../shared/peers/hf_decode.py: decode ms/step = (t(128 new) - t(1 new)) / 127):
  - shardline engine (Triton kernels + CUDA graphs), Llama-3-8B shape, each batch size
  - shardline int8 and fp8 weight-only, batch 1; GPT-J-6B (KoGPT shape), batch 1
  - prefill of one 2,048-token prompt, as TFLOP/s of the linear layers against the GEMM ceiling
  - the ceilings (copy bandwidth, bf16 GEMM rate) and the roofline (weights / bandwidth)
  - peers, when --peers DIR holds them (a git-ignored folder; never committed): HF transformers
    eager (hf_decode.py) and gpt-fast (DIR/gpt-fast, through benchmarks/peer_gptfast.py)
Prints a table with ratios last. Each decode timing carries the GPU's state over its runs (SM
clock, power draw, the share of readings at the power cap; benchmarks/gpu_state.py): an H200 at
batch 64 runs at its 700 W limit, and the clock it holds there moves the step by a few percent.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

try:
    from benchmarks import gpu_state
except ImportError:  # run as `python benchmarks/decode_bench.py`: this folder is sys.path[0]
    import gpu_state
from shardline import step_tuning
from shardline.config import KV_CACHE_DTYPES, EngineConfig, ModelConfig
from shardline.gemm_tuning import GemmTable
from shardline.model.random_weights import SHAPES
from shardline.sampling import SamplingParams
from shardline.stage_worker.pipeline import LocalPipeline

HERE = Path(__file__).resolve().parent


GEMM_CONFIG: str | None = None  # --gemm-config
OVERLAP: bool | None = None  # --overlap / --no-overlap (None: EngineConfig's default)
BLOCK_SIZE: int | None = None  # --block-size (None: EngineConfig's default)
KV_CACHE_DTYPE = "auto"  # --kv-cache-dtype: every engine's KV cache (fp8: e4m3)
# The decode attention keys an A/B may change over the kernel's choice (--attention-configs, and
# step_tune's --attention-config).
ATTENTION_TILE_KEYS = {"BLOCK_N", "num_warps", "num_stages", "maxnreg", "splits", "EARLY_KV", "OPAQUE_BT", "LATE",
                       "FUSE_ROTARY", "NEW_FIRST"}


# What --skip may leave out: the Llama table (and its prefill), the quantized rows, GPT-J, prefill.
SKIPPABLE_ORDER = ("llama", "int8", "fp8", "gptj", "prefill")
SKIPPABLE = set(SKIPPABLE_ORDER)


def attention_config_problem(c) -> str | None:
    """What is wrong with one decode attention override (a JSON object of ATTENTION_TILE_KEYS), or
    None: checked here, before the GPU, rather than as a Triton compile error mid-run."""
    if not isinstance(c, dict) or not set(c) <= ATTENTION_TILE_KEYS:
        return f"keys from {sorted(ATTENTION_TILE_KEYS)}"
    splits = c.get("splits", 1)
    if not (isinstance(splits, int) and 1 <= splits <= 64 and splits & (splits - 1) == 0):
        return f"splits={splits!r}: a power of two from 1 to 64 (the context splits a row's keys take)"
    for key in ("EARLY_KV", "OPAQUE_BT", "FUSE_ROTARY", "LATE", "NEW_FIRST"):
        if not isinstance(c.get(key, False), bool):
            return f"{key}={c[key]!r}: true or false"
    return None


def parse_attention_config(ap: argparse.ArgumentParser, text: str) -> dict:
    """One decode attention override given as JSON text (step_tune's and profile_decode's
    --attention-config), or an ap.error naming what is wrong, before the GPU."""
    try:
        c = json.loads(text)
    except json.JSONDecodeError as e:
        c, problem = None, f"not JSON: {e}"
    else:
        problem = attention_config_problem(c)
    if problem:
        ap.error(f"--attention-config takes a JSON object ({problem}), e.g. '{{\"num_stages\": 1}}'; got {text!r}")
    return c


def use_attention_config(c: dict) -> None:
    """Every decode attention launch from now on takes the keys of `c` over the kernel's choice."""
    from shardline.kernels import triton_attention  # Triton: imported on the GPU only
    triton_attention.DECODE_OVERRIDE = dict(c)


def kv_bytes_for(shape: str, max_num_seqs: int, tokens: int = 320) -> int:
    """The KV pool for `max_num_seqs` sequences of `tokens` (a 128 + 128 run, rounded up to
    blocks, with room to spare) at bf16, and at least 24 GB: GPT-J's 16 heads of 256 take 0.46 MB
    a token over 28 layers, so 256 of its sequences need 30 GB where Llama's need 8.6."""
    cfg = ModelConfig(**SHAPES[shape])
    per_token = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 2
    return max(24 << 30, per_token * tokens * max_num_seqs)


def build(shape: str, dtype: str = "bf16", quantization: str = "none", max_num_seqs: int = 256,
          kv_bytes: int | None = None, max_model_len: int = 4096, device: str = "cuda",
          kv_cache_dtype: str | None = None) -> LocalPipeline:
    """An engine on random weights of `shape` (one stage, one rank) in a pipeline; its KV cache is
    `kv_cache_dtype`'s, else --kv-cache-dtype's."""
    kv_bytes = kv_bytes or kv_bytes_for(shape, max_num_seqs)
    engine = step_tuning.random_engine(ModelConfig(**SHAPES[shape]), dtype, quantization, max_num_seqs, device,
                                       gemm_config=GEMM_CONFIG, kv_bytes=kv_bytes, max_model_len=max_model_len,
                                       kv_cache_dtype=kv_cache_dtype or KV_CACHE_DTYPE,
                                       **({} if OVERLAP is None else {"overlap_decode": OVERLAP}),
                                       **({} if BLOCK_SIZE is None else {"block_size": BLOCK_SIZE}))
    return LocalPipeline(None, config=engine.config, engines=[engine])


def num_params(pipeline: LocalPipeline) -> tuple[int, int]:
    """(parameters streamed per decode step, bytes they occupy)."""
    model = pipeline.engines[0].model
    tensors = [model.lm_head.weight]
    for layer in model.layers:
        for lin in (layer.qkv_proj, layer.o_proj, layer.up_proj, layer.down_proj):
            tensors.append(lin.weight)
    return sum(t.numel() for t in tensors), sum(t.numel() * t.element_size() for t in tensors)


def kv_capacity_2k(shape: str, kv_dtype: torch.dtype = torch.bfloat16) -> int:
    """2,048-token sequences whose KV (of `kv_dtype`) fits in the memory a stage worker plans for
    this model alone on this GPU (weights resident, gpu_memory_fraction 0.9): what `--num-blocks`
    defaults to."""
    from shardline.stage_worker.kv_cache import bytes_per_block

    cfg = ModelConfig(**SHAPES[shape])
    free, total = torch.cuda.mem_get_info()
    weights = 2 * (cfg.padded_vocab_size(1) * cfg.hidden_size * 2 + cfg.num_layers * (
        cfg.hidden_size * (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size * cfg.hidden_size
        + 3 * cfg.hidden_size * cfg.intermediate_size))
    budget = total * 0.9 - weights - (total - free)  # what another process already holds stays taken
    per_token = bytes_per_block(cfg.num_layers, 1, cfg.num_kv_heads, cfg.head_dim, kv_dtype)
    return int(budget // per_token // 2048)


def timed(pipeline: LocalPipeline, prompts: list[list[int]], new: int) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = pipeline.generate(prompts, SamplingParams(max_tokens=new, ignore_eos=True))
    torch.cuda.synchronize()
    assert all(len(o) == new for o in out)
    return time.perf_counter() - t


def decode_ms_per_step(pipeline: LocalPipeline, batch: int, prompt: int = 128, new: int = 128,
                       during: contextlib.AbstractContextManager | None = None) -> float:
    """ms a decode step, (t(new) - t(1)) / (new - 1), the best of two runs each; `during` (a
    gpu_state.Sampler) is held over the two full runs."""
    vocab = pipeline.manifest.model.vocab_size
    g = torch.Generator().manual_seed(batch)
    prompts = torch.randint(0, vocab, (batch, prompt), generator=g).tolist()
    timed(pipeline, prompts, 8)  # warm-up: Triton compiles, graphs are captured
    with during or contextlib.nullcontext():
        t_full = min(timed(pipeline, prompts, new) for _ in range(2))
    t_pref = min(timed(pipeline, prompts, 1) for _ in range(2))
    return (t_full - t_pref) / (new - 1) * 1e3


def decode_run(pipeline: LocalPipeline, batch: int, prompt: int = 128, new: int = 128) -> tuple[float, dict]:
    """decode_ms_per_step, and the GPU's state over its two full runs (gpu_state.summarize: SM
    clock, power, the share at the power cap), which moves a step by a few percent from machine
    to machine. The other benchmarks time without the sampling thread, as before session u."""
    state = gpu_state.Sampler()
    return decode_ms_per_step(pipeline, batch, prompt, new, during=state), state.summary()


def loaded_graph(pipeline: LocalPipeline, batch: int, context: int = 192,
                 capture: bool = False, needs_logits: bool = False) -> torch.cuda.CUDAGraph | None:
    """step_tuning.loaded_graph of the pipeline's engine: every row attends over `context` tokens
    (the mean of a 128 + 128 run)."""
    return step_tuning.loaded_graph(pipeline.engines[0], batch, context, capture, needs_logits)


def graph_replay_ms(pipeline: LocalPipeline, batch: int, context: int = 192) -> float | None:
    """GPU time of one captured decode step (no host work): what the step costs the device."""
    graph = loaded_graph(pipeline, batch, context)
    return step_tuning.replay_ms(graph) if graph is not None else None


def prefill_tflops(pipeline: LocalPipeline, n: int = 2048) -> tuple[float, float]:
    params, _ = num_params(pipeline)
    prompt = torch.randint(0, pipeline.manifest.model.vocab_size, (1, n)).tolist()
    timed(pipeline, prompt, 1)
    t = min(timed(pipeline, prompt, 1) for _ in range(3))
    return t * 1e3, 2 * params * n / t / 1e12


def batch_list(text: str) -> list[int]:
    """A comma-separated list of batch sizes, each >= 1."""
    try:
        batches = [int(b) for b in text.split(",")]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1:
        raise argparse.ArgumentTypeError(f"expected batch sizes >= 1 separated by commas, e.g. 1,16,64; got {text!r}")
    return batches


def table_paths(text: str) -> list[str]:
    """--gemm-configs' value: comma-separated paths of existing `tune-gemm` tables."""
    paths = [p for p in text.split(",") if p]
    missing = [p for p in paths if not Path(p).is_file()]
    if not paths or missing:
        raise argparse.ArgumentTypeError(f"expected tune-gemm tables separated by commas, e.g. "
                                         f"a.json,b.json; {'not found: ' + ', '.join(missing) if missing else 'got none'}")
    return paths


def env_variants(text: str) -> list[dict[str, str]]:
    """--env-variants' value: environments separated by ';', each NAME=VALUE pairs separated by
    ',' (e.g. 'SHARDLINE_FOLD_NORMS=1;SHARDLINE_FOLD_NORMS=0'); at least two."""
    variants = []
    for part in text.split(";"):
        pairs = [kv.split("=", 1) for kv in part.split(",") if kv]
        if not pairs or any(len(kv) != 2 or not kv[0] for kv in pairs):
            variants = []
            break
        variants.append(dict(pairs))
    if len(variants) < 2:
        raise argparse.ArgumentTypeError("expected two or more environments separated by ';', each NAME=VALUE "
                                         f"pairs separated by ',', e.g. 'SHARDLINE_FOLD_NORMS=1;SHARDLINE_FOLD_NORMS=0'; "
                                         f"got {text!r}")
    return variants


def without_option(argv: list[str], name: str) -> list[str]:
    """argv less `name` and its value (as `name value` or `name=value`)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == name:
            skip = True
        elif not a.startswith(name + "="):
            out.append(a)
    return out


def run_env_variants(variants: list[dict[str, str]], rounds: int, argv: list[str]) -> None:
    """The same run (argv, less the A/B options) in a fresh process under each environment in
    turn, `rounds` times: an A/B of what only the environment switches (the kernels' switches in
    shardline/kernels/_dispatch.py are read once, at import). Prints every run's rows, then each batch's
    ms/step under each environment, with the mean SM clock and power its runs read where they did."""
    child = [sys.executable, str(Path(__file__).resolve())] + without_option(without_option(argv, "--env-variants"),
                                                                             "--env-rounds")
    runs: dict[tuple[int, str], list[dict]] = {}
    for _ in range(rounds):
        for env in variants:
            tag = ",".join(f"{k}={v}" for k, v in env.items())
            for row in run_json_lines(child, env=env, timeout=900):
                if "batch" in row and "decode_ms_per_step" in row:
                    runs.setdefault((row["batch"], tag), []).append(row)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    print(f"\n{gpu}  {datetime.date.today().isoformat()}\n$ {' '.join(sys.argv)}")
    for (batch, tag), rows in sorted(runs.items()):
        ms = [r["decode_ms_per_step"] for r in rows]
        states = [r["gpu_state"] for r in rows if r.get("gpu_state")]
        state = (f"  {sum(s['sm_mhz'] for s in states) / len(states):,.0f} MHz "
                 f"{sum(s['power_w'] for s in states) / len(states):.0f} W" if states else "")
        print(f"batch {batch:>4}  {tag:<40} ms/step {' / '.join(f'{t:.3f}' for t in ms)}  "
              f"mean {sum(ms) / len(ms):.3f}{state}")


def run_json_lines(cmd: list[str], env: dict | None = None, timeout: int = 600) -> list[dict]:
    """A peer's JSON lines; a peer that fails or runs past `timeout` gives what it printed so far."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=timeout)
        out, failed = r.stdout, r.returncode != 0 and r.stderr[-2000:]
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        failed = f"timed out after {timeout} s"
    if failed:
        print(f"[peer failed] {' '.join(cmd)}\n{failed}", file=sys.stderr)
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    for row in rows:
        print(json.dumps(row), flush=True)
    return rows


def time_variants(pipeline: LocalPipeline, batches: list[int], variants: list[dict], rounds: int,
                  tables: dict, weight_bytes: int) -> list[dict]:
    """Each batch's decode step under each A/B variant in turn (`rounds` times when there are
    several; graphs recaptured for each): one row a timing, also printed as it comes."""
    rows = []
    for b in batches:
        for variant in variants * (rounds if len(variants) > 1 else 1):
            if len(variants) > 1:
                use_attention_config(variant.get("attention", {}))
                if "gemm_config" in variant:
                    pipeline.engines[0].model.configure_gemms(tables[variant["gemm_config"]])
                pipeline.engines[0].graphs.reset()
            ms, state = decode_run(pipeline, b)
            gpu_ms = graph_replay_ms(pipeline, b)
            rows.append({"batch": b, "decode_ms_per_step": round(ms, 3), "tok_s": round(b * 1e3 / ms, 1),
                         "weight_GBps": round(weight_bytes / ms / 1e6, 1),
                         "graph_replay_ms": round(gpu_ms, 3) if gpu_ms else None, "gpu_state": state, **variant})
            print(json.dumps(rows[-1]), flush=True)
    use_attention_config({})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=batch_list, default=[1, 16, 64, 256])
    ap.add_argument("--peers", help="folder with ceilings.py, hf_decode.py and gpt-fast/ (git-ignored)")
    ap.add_argument("--hf-batches", default="1,16,64,256")
    # gpt-fast compiles per batch size for minutes: at batches 1 and 64 it ran past 420 s on a fresh
    # H200 machine (2026-11-29), so it is opt-in and best run as its own call.
    ap.add_argument("--gptfast-batches", default="", help="e.g. 1,64 (minutes of compiling per batch)")
    ap.add_argument("--gptfast-timeout", type=int, default=420, help="seconds gpt-fast may take, all batches")
    ap.add_argument("--skip", default="", help="comma list of: llama (its decode table and prefill), int8, fp8, gptj, "
                    "prefill")
    ap.add_argument("--gptj-batches", type=batch_list, default=[1],
                    help="GPT-J-6B (KoGPT shape) batches, e.g. 1,16,64; with --peers HF eager runs the same ones")
    ap.add_argument("--gemm-config", help="use `shardline tune-gemm` choices (and report the gain)")
    ap.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=None,
                    help="launch step N+1 before reading step N's tokens (default: the engine's)")
    ap.add_argument("--block-size", type=int, help="tokens a KV-cache block (default: the engine's)")
    ap.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                    help="every engine's KV cache: auto (the model's dtype) or fp8 (e4m3; not what issue 4's bars "
                         "measure)")
    ap.add_argument("--attention-configs", type=json.loads,
                    help='A/B the decode attention tiles, e.g. \'[{}, {"num_stages": 3}]\': keys changed from the '
                         "kernel's choice for the batch ({} keeps it), each batch timed under each in turn, twice "
                         "(graphs recaptured each time); with --gemm-configs, paired: variant i is (table i, tile i)")
    ap.add_argument("--gemm-configs", type=table_paths,
                    help="A/B `tune-gemm` tables, comma separated: each batch is timed under each in turn, "
                         "--ab-rounds times (graphs recaptured each time); the first is also --gemm-config's if that "
                         "is not given")
    ap.add_argument("--ab-rounds", type=int, default=2,
                    help="rounds of a --gemm-configs or --attention-configs A/B (each variant once a round)")
    ap.add_argument("--env-variants", type=env_variants,
                    help="A/B environments, e.g. 'SHARDLINE_FOLD_NORMS=1;SHARDLINE_FOLD_NORMS=0': the whole run in a "
                         "fresh process under each in turn, --env-rounds times (switches read at import)")
    ap.add_argument("--env-rounds", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    if skip - SKIPPABLE:
        ap.error(f"--skip {args.skip}: unknown {sorted(skip - SKIPPABLE)}; a comma list of {','.join(SKIPPABLE_ORDER)}")
    if args.env_variants:
        if args.gemm_configs or args.attention_configs or args.peers or args.out:
            ap.error("--env-variants runs the whole benchmark once per environment: pass no --gemm-configs, "
                     "--attention-configs, --peers or --out with it")
        if args.env_rounds < 1:
            ap.error(f"--env-rounds must be >= 1, got {args.env_rounds}")
        run_env_variants(args.env_variants, args.env_rounds, sys.argv[1:])
        return
    if args.gemm_configs and args.attention_configs and len(args.gemm_configs) != len(args.attention_configs):
        ap.error(f"--gemm-configs ({len(args.gemm_configs)}) and --attention-configs ({len(args.attention_configs)}) "
                 "together pair up, the i-th table with the i-th tile: give as many of each")
    if args.attention_configs is not None:
        problems = ([attention_config_problem(c) for c in args.attention_configs]
                    if isinstance(args.attention_configs, list) else ["a list"])
        if any(problems):
            ap.error(f"--attention-configs takes a JSON list of objects ({next(p for p in problems if p)}), "
                     f'e.g. \'[{{"num_stages": 2}}, {{"num_stages": 3}}]\'; got {args.attention_configs!r}')
    if args.ab_rounds < 1:
        ap.error(f"--ab-rounds must be >= 1, got {args.ab_rounds}")
    if args.block_size is not None and (args.block_size < 1 or args.block_size & (args.block_size - 1)):
        ap.error(f"--block-size {args.block_size}: a power of two, e.g. 16 or 64")
    global GEMM_CONFIG, OVERLAP, BLOCK_SIZE, KV_CACHE_DTYPE
    GEMM_CONFIG, OVERLAP, BLOCK_SIZE = args.gemm_config or (args.gemm_configs or [None])[0], args.overlap, args.block_size
    KV_CACHE_DTYPE = args.kv_cache_dtype
    batches = args.batches
    res: dict = {"gpu": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                 "command": " ".join(sys.argv), "torch": torch.__version__,
                 "overlap": EngineConfig().overlap_decode if OVERLAP is None else OVERLAP,
                 "pdl": os.environ.get("SHARDLINE_PDL", "1") not in ("", "0"),
                 "block_size": BLOCK_SIZE or EngineConfig().block_size, "kv_cache_dtype": KV_CACHE_DTYPE}
    peers = Path(args.peers) if args.peers else None

    if peers is not None:  # peers first, each in its own process, so their memory is gone before ours
        res["ceilings"] = (run_json_lines([sys.executable, str(peers / "ceilings.py")]) or [{}])[0]
        res["hf"] = run_json_lines([sys.executable, str(peers / "hf_decode.py"), "llama8b", args.hf_batches])
        if "gptj" not in skip:
            res["hf_gptj"] = run_json_lines([sys.executable, str(peers / "hf_decode.py"), "gptj6b",
                                             ",".join(map(str, args.gptj_batches))])
        if (peers / "gpt-fast").is_dir() and args.gptfast_batches:
            res["gptfast"] = run_json_lines([sys.executable, str(HERE / "peer_gptfast.py"), "--batches",
                                             args.gptfast_batches], env={"PYTHONPATH": str(peers / "gpt-fast")},
                                            timeout=args.gptfast_timeout)
        print(json.dumps(res), flush=True)

    res["kv_2k_sequences_at_0.9_memory"] = kv_capacity_2k(  # before this process holds anything
        "llama3-8b", torch.float8_e4m3fn if KV_CACHE_DTYPE == "fp8" else torch.bfloat16)
    variants: list[dict] = [{}]  # what each A/B run changes; graphs are captured again for each
    if args.attention_configs or args.gemm_configs:  # together: paired, variant i = (table i, tile i)
        n = len(args.attention_configs or args.gemm_configs)
        variants = [{**({"gemm_config": args.gemm_configs[i]} if args.gemm_configs else {}),
                     **({"attention": args.attention_configs[i]} if args.attention_configs else {})} for i in range(n)]
    tables = {path: GemmTable.load(path, torch.device("cuda")) for path in args.gemm_configs or []}
    if None in tables.values():
        ap.error(f"--gemm-configs: {[p for p, t in tables.items() if t is None]} tuned on another GPU than "
                 f"{torch.cuda.get_device_name()}: an A/B needs tables of this one (run `shardline tune-gemm`)")
    weight_bytes = 0
    if "llama" not in skip:
        pipeline = build("llama3-8b", max_num_seqs=max(batches))
        params, weight_bytes = num_params(pipeline)
        res["llama_params_streamed"] = params
        res["shardline"] = time_variants(pipeline, batches, variants, args.ab_rounds, tables, weight_bytes)
        if "prefill" not in skip:
            ms, tf = prefill_tflops(pipeline)
            res["prefill_2048"] = {"ms": round(ms, 2), "linear_TFLOPs": round(tf, 1)}
        del pipeline
        torch.cuda.empty_cache()
    for q in ("int8", "fp8"):
        if q in skip:
            continue
        pipeline = build("llama3-8b", quantization=f"{q}-weight-only", max_num_seqs=16)
        res[f"{q}_b1_ms"] = round(decode_ms_per_step(pipeline, 1), 3)
        del pipeline
        torch.cuda.empty_cache()
    if "gptj" not in skip:
        pipeline = build("gptj-6b", max_num_seqs=max(16, *args.gptj_batches), max_model_len=2048)
        res["gptj"] = time_variants(pipeline, args.gptj_batches, variants, args.ab_rounds, tables,
                                    num_params(pipeline)[1])
        res["gptj_ms"] = {r["batch"]: r["decode_ms_per_step"] for r in res["gptj"]}  # an A/B's last round
        if 1 in res["gptj_ms"]:
            res["gptj_b1_ms"] = res["gptj_ms"][1]
        del pipeline
        torch.cuda.empty_cache()
    print(json.dumps(res), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2))
    print_table(res, weight_bytes)


def print_table(res: dict, weight_bytes: int) -> None:
    bw = res.get("ceilings", {}).get("copy_GBps")
    hf = {r["batch"]: r["decode_ms_per_step"] for r in res.get("hf", [])}
    gf = {r["batch"]: r["decode_ms_per_step"] for r in res.get("gptfast", [])}
    print(f"\n{res['gpu']}  {res['date']}  torch {res['torch']}\n$ {res['command']}")
    if bw:
        roofline = f"; roofline batch-1 {weight_bytes / bw / 1e6:.2f} ms/step (weights only)" if weight_bytes else ""
        print(f"ceilings: copy {bw} GB/s, bf16 GEMM {res['ceilings'].get('bf16_gemm_TFLOPs')} TFLOP/s{roofline}")
    print(f"{'batch':>5} {'shardline ms':>12} {'(GPU ms)':>8} {'tok/s':>9} {'HF ms':>8} {'xHF':>6} "
          f"{'gpt-fast ms':>11} {'xGF':>5}  {'SM MHz':>6} {'W':>5} {'capped':>6}")
    nan = float("nan")
    for r in res.get("shardline", []):
        b, ms = r["batch"], r["decode_ms_per_step"]
        h, g, st = hf.get(b), gf.get(b), r.get("gpu_state") or {}
        print(f"{b:>5} {ms:>12.3f} {r.get('graph_replay_ms') or nan:>8.3f} {r['tok_s']:>9.1f} {h or nan:>8.2f} "
              f"{(h / ms) if h else nan:>6.2f} {g or nan:>11.2f} {(g / ms) if g else nan:>5.2f}  "
              f"{st.get('sm_mhz', nan):>6.0f} {st.get('power_w', nan):>5.0f} {st.get('power_capped', nan):>6.0%}")
    if "kv_2k_sequences_at_0.9_memory" in res:
        kv = " in an fp8 (e4m3) cache" if res.get("kv_cache_dtype") == "fp8" else ""
        print(f"KV capacity for Llama-3-8B alone on this GPU: {res['kv_2k_sequences_at_0.9_memory']} sequences of "
              f"2,048 tokens{kv}")
    for q in ("int8", "fp8"):
        if f"{q}_b1_ms" in res:
            print(f"{q} weight-only batch 1: {res[f'{q}_b1_ms']} ms/step")
    hf_gptj = {r["batch"]: r["decode_ms_per_step"] for r in res.get("hf_gptj", [])}
    for r in res.get("gptj", []):
        b, ms = r["batch"], r["decode_ms_per_step"]
        hj = hf_gptj.get(int(b))
        ratio = f"  HF eager {hj} ms -> {hj / ms:.1f}x" if hj else ""
        variant = f"  {r['attention']}" if "attention" in r else f"  {r['gemm_config']}" if "gemm_config" in r else ""
        print(f"GPT-J-6B batch {b}: {ms} ms/step, {int(b) * 1e3 / ms:.0f} tok/s{ratio}{variant}")
    if "prefill_2048" in res:
        p = res["prefill_2048"]
        gemm = res.get("ceilings", {}).get("bf16_gemm_TFLOPs")
        frac = f" = {p['linear_TFLOPs'] / gemm:.0%} of the GEMM rate" if gemm else ""
        print(f"prefill 2048 tokens: {p['ms']} ms, {p['linear_TFLOPs']} TFLOP/s{frac}")


if __name__ == "__main__":
    main()
