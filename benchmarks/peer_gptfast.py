"""gpt-fast as a peer: Llama-3-8B shape, random bf16 weights, torch.compile + CUDA graphs.

Run with gpt-fast's source on PYTHONPATH (a git-ignored folder; its code is never committed):
    PYTHONPATH=.peers/gpt-fast python benchmarks/peer_gptfast.py --batches 1
Method of ../shared/peers/README.md: time generate() for 2 and 129 new tokens; ms/step is the
difference over 127. Prints one JSON line per batch size.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1")
    args = ap.parse_args()
    import generate as gf  # gpt-fast's generate.py
    from model import Transformer

    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Transformer.from_name("llama-3-8b")
    torch.set_default_dtype(torch.float32)
    model = model.eval()
    gf.decode_one_token = torch.compile(gf.decode_one_token, mode="reduce-overhead", fullgraph=True)
    # Ascending: gpt-fast sizes its KV cache on first use and only ever grows it.
    for b in sorted(int(x) for x in args.batches.split(",")):
        prompt = torch.randint(0, 128256, (128,), device="cuda")

        def run(new: int) -> float:
            torch.cuda.synchronize()
            t = time.perf_counter()
            with torch.no_grad():
                gf.generate(model, prompt, new, batch_size=b, interactive=False, draft_model=None,
                            temperature=0.8, top_k=200)
            torch.cuda.synchronize()
            return time.perf_counter() - t

        # Compile and capture at the largest KV cache first: gpt-fast sizes its cache from the
        # request (prompt + new tokens, rounded up to 8) and only grows it, and every new size
        # recompiles decode_one_token. (Warming up on 2 and 8 new tokens had compiled twice a
        # batch, the second time inside the timed runs: over 5 minutes a batch.)
        run(129)
        t_long = min(run(129) for _ in range(2))
        t_short = min(run(2) for _ in range(2))
        ms = (t_long - t_short) / 127 * 1e3
        print(json.dumps({"batch": b, "decode_ms_per_step": round(ms, 3), "tok_s": round(b * 1e3 / ms, 1)}), flush=True)


if __name__ == "__main__":
    main()
