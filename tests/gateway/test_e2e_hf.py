"""Through the whole served path — gateway, tokenizer, PP=2 x TP=2 (gloo) stage-worker processes,
Redis — greedy outputs are token-identical to HuggingFace `generate()`, for a Llama-style and a
GPT-J-style model, for text prompts (tokenized by the tokenizer service) as well as token ids."""

from __future__ import annotations

import json

import pytest
import redis
import torch

from shardline.client import Client
from shardline.gateway.records import record_key
from shardline.launcher import ClusterConfig, LocalCluster, free_port
from shardline.tiny import make_tiny_hf_model

pytestmark = pytest.mark.slow

TEXTS = ["Hello, world! How are you", "안녕하세요, 만나서", "def forward(self, x):"]
NEW_TOKENS = 16


def hf_greedy(hf_dir, prompts: list[list[int]]) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            tokens = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                    do_sample=False)[0, len(prompt):].tolist()
            for i, t in enumerate(tokens):  # HF pads after EOS; the server stops at it
                if t in eos:
                    tokens = tokens[:i + 1]
                    break
            out.append(tokens)
    return out


@pytest.mark.parametrize("family", ["llama", "gptj"])
def test_greedy_through_the_gateway_equals_hf_generate(family, tmp_path):
    hf_dir = make_tiny_hf_model(tmp_path / f"hf-{family}", family)
    config = ClusterConfig(model=str(hf_dir), tp=2, pp=2, num_blocks=64, grpc_port=free_port(),
                           workdir=str(tmp_path / "cluster"))
    id_prompt = [1, 17, 42, 99, 7, 250, 3, 64]
    with LocalCluster(config) as cluster, Client(cluster.gateway_address, timeout=120) as client:
        results = [client.generate(p, max_tokens=NEW_TOKENS, temperature=0.0) for p in [*TEXTS, id_prompt]]
        # The prompt ids the gateway sent to stage 0 (text tokenized by the tokenizer service),
        # from each request's record in Redis.
        records = redis.Redis.from_url(cluster.redis_url, decode_responses=True)
        prompts = [json.loads(records.hget(record_key(r.request_id), "prompt_token_ids")) for r in results]
    assert prompts[-1] == id_prompt
    got = [r.token_ids for r in results]
    assert got == hf_greedy(hf_dir, prompts), f"{family}: tokens through the gateway diverge from HF generate()"
