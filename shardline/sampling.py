"""Sampling parameters: what a request asks for, validated where it enters (gateway, stage 0).

The sampler that draws with them runs on the last stage (shardline/sampler.py, torch); this
module imports no torch, so the gateway and the SDK need none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_TOP_K = 1 << 20


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = whole vocabulary
    top_p: float = 1.0
    seed: int = 0
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature {self.temperature} is out of range; use 0 (greedy) to 100")
        if not 0 <= self.top_k <= MAX_TOP_K:
            raise ValueError(f"top_k {self.top_k} is out of range; use 0 (off) or a positive count")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p {self.top_p} is out of range; use a value in (0, 1]")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens {self.max_tokens} must be >= 1")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    def to_dict(self) -> dict:
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
                "seed": self.seed, "max_tokens": self.max_tokens,
                "stop_token_ids": list(self.stop_token_ids), "ignore_eos": self.ignore_eos}

    @classmethod
    def from_dict(cls, d: dict) -> "SamplingParams":
        d = dict(d)
        d["stop_token_ids"] = tuple(d.get("stop_token_ids", ()))
        return cls(**d)
