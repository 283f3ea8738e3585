"""The TMA descriptors' L2 promotion: the size in which L2 fills a descriptor's misses from DRAM.

    python -m benchmarks.tma_l2_promotion [--gemm-config T] [--batch 64] [--rounds 3]
                                          [--decode-rounds 3] [--shape llama3-8b]

Every tensor descriptor of the split-K and ring GEMMs is filled by Triton's driver
(`fillTMADescriptor` in backends/nvidia/driver.c), which always asks for 128-byte promotion; the
GEMMs read weight rows in 256-byte runs (BLOCK_K 128), as two 128-byte boxes. This script copies
the installed Triton into a temporary folder, has its driver read the promotion from the
environment (`SL_TMA_L2`: 0 none, 1 64 B, 2 128 B, Triton's own, 3 256 B), and runs itself again
on that copy to time, in alternated rounds:

* each linear of the model at `--batch` rows alone, on its table entry (as tune-gemm times them:
  one CUDA graph of 24 calls over >= 256 MB of weight copies), under each promotion;
* the decode loop (decode_bench, a fresh process a variant) under 128 and 256 bytes.

The engine cannot choose the promotion without its own copy of Triton's driver, so this is a
probe, not a switch: it says whether such a copy would pay.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from shardline.model.random_weights import SHAPES

ENV = "SL_TMA_L2"
_REEXEC = "SL_TMA_L2_PATCHED_COPY"  # set in the run on the patched copy: never copy twice
PROMOTIONS = {"0": "none", "1": "64 B", "2": "128 B", "3": "256 B"}
_TRITON_FILL = "swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, fill);"
_PATCHED_FILL = (f'swizzle, (CUtensorMapL2promotion)(getenv("{ENV}") ? atoi(getenv("{ENV}")) : '
                 "CU_TENSOR_MAP_L2_PROMOTION_L2_128B), fill);")


def patch_driver_source(src: str) -> str:
    """Triton's driver.c with the descriptor fill's L2 promotion read from $SL_TMA_L2 (unset: 128 B,
    as before). Raises if the fill is not there once (another Triton than the one this was read on)."""
    if src.count(_TRITON_FILL) != 1:
        raise RuntimeError(f"Triton's driver.c holds {src.count(_TRITON_FILL)} descriptor fills of the form "
                           f"{_TRITON_FILL!r}, not 1: this probe knows Triton 3.6's driver; read the fill there "
                           "and update _TRITON_FILL")
    return src.replace(_TRITON_FILL, _PATCHED_FILL)


def patched_triton(dest: Path) -> Path:
    """A copy of the installed Triton under dest/triton whose driver reads $SL_TMA_L2; returns dest
    (to put first on PYTHONPATH). Triton rebuilds its driver module from the changed source on import."""
    import triton
    shutil.copytree(Path(triton.__file__).parent, dest / "triton")
    driver = dest / "triton" / "backends" / "nvidia" / "driver.c"
    driver.write_text(patch_driver_source(driver.read_text()))
    return dest


def driver_is_patched() -> bool:
    import triton
    return ENV in (Path(triton.__file__).parent / "backends" / "nvidia" / "driver.c").read_text()


def time_linears(shape: str, batch: int, gemm_config: str, rounds: int) -> list[str]:
    """Each linear alone on its table entry at `batch` rows, under each promotion in turn, `rounds`
    times; the best of each, in µs and GB/s of weights."""
    import torch

    from shardline.config import ModelConfig
    from shardline.gemm_tuning import GemmTable, _time_graph_us, linear_shapes
    from shardline.kernels import quant

    table = GemmTable.checked(gemm_config)
    runs = []
    for name, (n, k) in linear_shapes(ModelConfig(**SHAPES[shape])).items():
        entry = table.choice(n, k, torch.bfloat16, torch.bfloat16, batch)
        if entry is None or entry["impl"] not in ("ring", "triton"):
            continue  # no descriptor to promote (cuBLAS, the GEMV)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        copies = max(1, -(-(256 << 20) // (w.numel() * 2)))
        ws = [w] + [w.clone() for _ in range(copies - 1)]
        x = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)
        if entry["impl"] == "ring":
            fn = lambda i, x=x, ws=ws, c=entry["config"]: quant.ring_linear(x, ws[i], None, c)  # noqa: E731
        else:
            fn = lambda i, x=x, ws=ws, c=entry["config"]: quant.small_m_linear(x, ws[i], None, None, c)  # noqa: E731
        runs.append((name, n * k * 2, copies, fn, entry))
    best: dict[tuple[str, str], float] = {}
    for _ in range(rounds):
        for promo in PROMOTIONS:
            os.environ[ENV] = promo  # read at each descriptor fill: at each graph's capture
            for name, _, copies, fn, _ in runs:
                us = _time_graph_us(fn, copies)
                best[name, promo] = min(us, best.get((name, promo), us))
    lines = [f"each linear alone at {batch} rows, its table entry; µs (GB/s of weights), best of {rounds}"]
    lines.append(f"{'linear':<10}{'entry':<10}" + "".join(f"{PROMOTIONS[p]:>18}" for p in PROMOTIONS))
    for name, nbytes, _, _, entry in runs:
        lines.append(f"{name:<10}{entry['impl']:<10}" + "".join(
            f"{best[name, p]:>9.2f} ({nbytes / best[name, p] / 1e3:5.0f})" for p in PROMOTIONS))
    return lines


def time_decode(batch: int, gemm_config: str, rounds: int) -> list[str]:
    """decode_bench's loop under 128 and 256 bytes, a fresh process a variant, alternated."""
    cmd = [sys.executable, str(Path(__file__).with_name("decode_bench.py")), "--batches", str(batch),
           "--skip", "int8,fp8,gptj,prefill", "--gemm-config", gemm_config,
           "--env-variants", f"{ENV}=2;{ENV}=3", "--env-rounds", str(rounds)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    except subprocess.TimeoutExpired:
        return [f"the decode loop: decode_bench ran past 1200 s ({' '.join(cmd)})"]
    if done.returncode != 0:
        return [f"the decode loop: decode_bench exited {done.returncode}: {done.stderr.strip()[-1500:]}"]
    out = done.stdout.splitlines()
    rows = [json.loads(line) for line in out if line.startswith("{")]
    replays = [row["graph_replay_ms"] for row in rows if "graph_replay_ms" in row]  # the runs' rows, not their summaries
    return ([f"the decode loop (decode_bench, {ENV}=2 then =3 each round)"] + [line for line in out if line.startswith("batch")]
            + [f"GPU step alone, in run order: {' / '.join(f'{r:.3f}' for r in replays)}"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gemm-config", default="benchmarks/results/gemm-h200-decode.json")
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the linears alone")
    ap.add_argument("--decode-rounds", type=int, default=3, help="rounds of the decode loop (0: none)")
    args = ap.parse_args()
    if args.batch < 1 or args.rounds < 1 or args.decode_rounds < 0:
        ap.error(f"--batch {args.batch}, --rounds {args.rounds}, --decode-rounds {args.decode_rounds}: "
                 "batch and rounds at least 1, decode rounds 0 or more")
    if not Path(args.gemm_config).is_file():
        ap.error(f"--gemm-config {args.gemm_config}: no such file; pass a `shardline tune-gemm` table, "
                 "e.g. benchmarks/results/gemm-h200-decode.json")
    import torch
    if not torch.cuda.is_available():
        ap.error("no CUDA GPU is visible: this probe times TMA loads, which need a Hopper GPU (sm_90 or later)")
    if not driver_is_patched():
        if os.environ.get(_REEXEC):
            raise SystemExit(f"the run on the patched copy of Triton imported an unpatched one "
                             f"({os.environ.get('PYTHONPATH')!r} first on PYTHONPATH): is another Triton installed "
                             "ahead of it?")
        with tempfile.TemporaryDirectory() as tmp:
            site = patched_triton(Path(tmp))
            env = {**os.environ, _REEXEC: "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
            return subprocess.run([sys.executable, "-m", "benchmarks.tma_l2_promotion", *sys.argv[1:]], env=env).returncode
    lines = [f"{torch.cuda.get_device_name()}  {datetime.date.today().isoformat()}", f"$ {' '.join(sys.argv)}"]
    lines += time_linears(args.shape, args.batch, args.gemm_config, args.rounds)
    print("\n".join(lines), flush=True)
    if args.decode_rounds:
        print("\n".join(time_decode(args.batch, args.gemm_config, args.decode_rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
