"""Typed configuration, validated once where it is built and passed explicitly from there.

`ModelConfig` is the architecture, independent of parallelism and of where the weights came from:
the three supported HuggingFace families (Llama-style, GPT-J, GPT-2) are described by the same
fields, so one transformer implementation serves them all.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

ARCHITECTURES = ("llama", "gptj", "gpt2")
# HF `model_type` -> our architecture family.
HF_MODEL_TYPES = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "gptj": "gptj",
    "gpt2": "gpt2",
}
DTYPES = ("fp32", "fp16", "bf16")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the value and the valid choices."""


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # "llama" | "gptj" | "gpt2"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int  # < num_heads for grouped-query attention
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    norm: str  # "rms" | "layer"
    norm_eps: float
    activation: str  # "silu_glu" (SwiGLU, gate/up) | "gelu_tanh" (one up projection)
    position: str  # "rotary" | "learned"
    # Leading dims of each head that get rotary, in rotate-half (NeoX) layout. The converter
    # permutes GPT-J's interleaved q/k rows into this layout so one rotary path serves all.
    rotary_dim: int
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    parallel_residual: bool  # GPT-J: x + attn(ln(x)) + mlp(ln(x)), one norm per layer
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    lm_head_bias: bool
    tie_word_embeddings: bool
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ConfigError(f"architecture {self.architecture!r} is not one of {ARCHITECTURES}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise ConfigError(f"rotary_dim {self.rotary_dim} must be even and <= head_dim {self.head_dim}")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def padded_vocab_size(self, tp: int) -> int:
        """Vocabulary rounded up so that each of `tp` ranks holds an equal slice."""
        return -(-self.vocab_size // tp) * tp

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["eos_token_ids"] = list(self.eos_token_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        d = dict(d)
        d["eos_token_ids"] = tuple(d.get("eos_token_ids") or ())
        return cls(**d)

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "ModelConfig":
        """Map a HuggingFace `config.json` dict onto our fields."""
        model_type = hf.get("model_type")
        if model_type not in HF_MODEL_TYPES:
            raise ConfigError(
                f"unknown architecture model_type={model_type!r}; supported: "
                f"{', '.join(sorted(HF_MODEL_TYPES))}")
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        family = HF_MODEL_TYPES[model_type]
        if family == "llama":
            heads = hf["num_attention_heads"]
            head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
            rope_params = hf.get("rope_parameters") or {}
            theta = hf.get("rope_theta", rope_params.get("rope_theta", 10000.0))
            scaling = hf.get("rope_scaling") or None
            if scaling is None and rope_params.get("rope_type", "default") != "default":
                scaling = rope_params
            if scaling is not None and scaling.get("rope_type", scaling.get("type")) in (None, "default"):
                scaling = None
            return cls(
                architecture="llama",
                vocab_size=hf["vocab_size"],
                hidden_size=hf["hidden_size"],
                num_layers=hf["num_hidden_layers"],
                num_heads=heads,
                num_kv_heads=hf.get("num_key_value_heads") or heads,
                head_dim=head_dim,
                intermediate_size=hf["intermediate_size"],
                max_position_embeddings=hf.get("max_position_embeddings", 4096),
                norm="rms",
                norm_eps=hf.get("rms_norm_eps", 1e-6),
                activation="silu_glu",
                position="rotary",
                rotary_dim=head_dim,
                rope_theta=float(theta),
                rope_scaling=dict(scaling) if scaling else None,
                parallel_residual=False,
                qkv_bias=bool(hf.get("attention_bias", model_type == "qwen2")),
                o_bias=bool(hf.get("attention_bias", False)) and model_type != "qwen2",
                mlp_bias=bool(hf.get("mlp_bias", False)),
                lm_head_bias=False,
                tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
                bos_token_id=hf.get("bos_token_id"),
                eos_token_ids=eos_ids,
            )
        if family == "gptj":
            heads = hf["n_head"]
            head_dim = hf["n_embd"] // heads
            return cls(
                architecture="gptj",
                vocab_size=hf["vocab_size"],
                hidden_size=hf["n_embd"],
                num_layers=hf["n_layer"],
                num_heads=heads,
                num_kv_heads=heads,
                head_dim=head_dim,
                intermediate_size=hf.get("n_inner") or 4 * hf["n_embd"],
                max_position_embeddings=hf.get("n_positions", 2048),
                norm="layer",
                norm_eps=hf.get("layer_norm_epsilon", 1e-5),
                activation="gelu_tanh",
                position="rotary",
                rotary_dim=hf.get("rotary_dim") or head_dim,
                rope_theta=10000.0,
                rope_scaling=None,
                parallel_residual=True,
                qkv_bias=False,
                o_bias=False,
                mlp_bias=True,
                lm_head_bias=True,
                tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
                bos_token_id=hf.get("bos_token_id"),
                eos_token_ids=eos_ids,
            )
        heads = hf["n_head"]
        return cls(
            architecture="gpt2",
            vocab_size=hf["vocab_size"],
            hidden_size=hf["n_embd"],
            num_layers=hf["n_layer"],
            num_heads=heads,
            num_kv_heads=heads,
            head_dim=hf["n_embd"] // heads,
            intermediate_size=hf.get("n_inner") or 4 * hf["n_embd"],
            max_position_embeddings=hf.get("n_positions", 1024),
            norm="layer",
            norm_eps=hf.get("layer_norm_epsilon", 1e-5),
            activation="gelu_tanh",
            position="learned",
            rotary_dim=0,
            rope_theta=10000.0,
            rope_scaling=None,
            parallel_residual=False,
            qkv_bias=True,
            o_bias=True,
            mlp_bias=True,
            lm_head_bias=False,
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )


def divisors_up_to(n: int, limit: int = 64) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def check_tensor_parallel(model: ModelConfig, tp: int) -> None:
    """The one place that decides whether `tp` can shard `model` (heads, KV heads, MLP width)."""
    if tp < 1:
        raise ConfigError(f"--tp {tp} must be >= 1")
    for what, n in (("attention heads", model.num_heads), ("KV heads", model.num_kv_heads),
                    ("MLP width", model.intermediate_size)):
        if n % tp:
            valid = [d for d in divisors_up_to(model.num_heads) if model.num_kv_heads % d == 0
                     and model.intermediate_size % d == 0]
            raise ConfigError(
                f"--tp {tp} does not divide {n} {what}; use one of {', '.join(map(str, valid))}")


def split_layers(num_layers: int, pp: int, stage_layers: list[int] | None = None) -> list[tuple[int, int]]:
    """Layer ranges [start, end) for each of `pp` stages; uneven splits allowed via `stage_layers`."""
    if pp < 1:
        raise ConfigError(f"--pp {pp} must be >= 1")
    if pp > num_layers:
        raise ConfigError(f"--pp {pp} is larger than the model's {num_layers} layers; use 1..{num_layers}")
    if stage_layers is None:
        base, extra = divmod(num_layers, pp)
        stage_layers = [base + (1 if i < extra else 0) for i in range(pp)]
    if len(stage_layers) != pp:
        raise ConfigError(f"--stage-layers has {len(stage_layers)} entries but --pp is {pp}; give one count per stage")
    if any(n < 1 for n in stage_layers):
        raise ConfigError(f"--stage-layers {stage_layers}: every stage needs at least one layer")
    if sum(stage_layers) != num_layers:
        raise ConfigError(
            f"--stage-layers {','.join(map(str, stage_layers))} sums to {sum(stage_layers)}, "
            f"but the model has {num_layers} layers")
    ranges, start = [], 0
    for n in stage_layers:
        ranges.append((start, start + n))
        start += n
    return ranges


def check_port(flag: str, port: int | None) -> None:
    """A TCP port to listen on: 0..65535, 0 = any free one; None = not listening."""
    if port is not None and not 0 <= port <= 65535:
        raise ConfigError(f"{flag} {port} must be in 0..65535 (0 = any free port)")


def check_device(device: str, *, here: bool = False) -> None:
    """cpu, cuda or cuda:N; here: also a CUDA device visible on this machine (where a process is
    about to run on it; a config may describe another machine). Imports torch only when not cpu."""
    if device == "cpu":
        return
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"--device {device!r} is not a device; use cpu, cuda or cuda:N") from None
    if dev.type != "cuda":
        raise ConfigError(f"--device {device!r}: shardline runs on cpu or cuda (cuda:N)")
    if not here:
        return
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise ConfigError(f"--device {device} but no CUDA GPU is visible here (torch.cuda.is_available() is "
                          "False); use --device cpu, or check the driver and CUDA_VISIBLE_DEVICES")
    if dev.index is not None and dev.index >= count:
        raise ConfigError(f"--device {device} but {count} CUDA GPU(s) are visible: cuda:0..cuda:{count - 1}")


KV_CACHE_DTYPES = ("auto", "fp8")


@dataclass(frozen=True)
class EngineConfig:
    """How a stage runs: cache geometry, batch limits, device. Validated on construction."""

    block_size: int = 16  # tokens per KV-cache block
    # KV-cache size: an explicit block count wins; else `kv_cache_bytes`; else a fraction of free
    # GPU memory after the weights (GPU) or 256 MiB (CPU).
    num_blocks: int | None = None
    kv_cache_bytes: int | None = None
    gpu_memory_fraction: float = 0.9
    max_num_seqs: int = 256  # sequences in one step
    max_num_batched_tokens: int = 2048  # tokens in one step (prefill chunks + decodes)
    max_model_len: int | None = None  # defaults to the model's max positions
    device: str = "cpu"
    verify_checksums: bool = True
    use_cuda_graphs: bool = True  # GPU decode steps replay captured graphs
    # Capture every (batch, context) bucket's graph before the stage reports ready; False: each on
    # its first use, which stalls that step (seconds for the first, with Triton compiling).
    capture_graphs_at_start: bool = True
    # Launch decode step N+1 before reading step N's tokens (one-stage models; services/stage-worker/
    # overlap.py): on the H200 it took batch 64 from 5.88 to 5.38 ms/step (docs/benchmarks.md).
    overlap_decode: bool = True
    gemm_config: str | None = None  # file written by `shardline tune-gemm` (GPU only)
    # The KV cache's element type (KV_CACHE_DTYPES): "auto" keeps the model's; "fp8" stores e4m3,
    # half a bf16 cache's bytes, so twice the tokens fit and decode reads half the K/V. It keeps no
    # scale: values round to e4m3 and saturate at +-448 (shardline/kernels/attention.py).
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ConfigError(f"block_size {self.block_size} must be a power of two, e.g. 16")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ConfigError(f"num_blocks {self.num_blocks} must be >= 1")
        if not 0.05 <= self.gpu_memory_fraction <= 0.98:
            raise ConfigError(f"gpu_memory_fraction {self.gpu_memory_fraction} must be in [0.05, 0.98]")
        if self.max_num_seqs < 1:
            raise ConfigError(f"max_num_seqs {self.max_num_seqs} must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ConfigError(f"max_num_batched_tokens {self.max_num_batched_tokens} must be >= 1")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(f"--kv-cache-dtype {self.kv_cache_dtype!r} is not a KV-cache type; use auto (the "
                              f"model's dtype) or fp8 (e4m3, half the bytes)")
        check_device(self.device)
