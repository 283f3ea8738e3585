"""The converted-model manifest: what the converter writes and every stage worker reads first.

A converted model is a directory:

    manifest.json
    stage-{s}/rank-{r}.safetensors     one shard per (pipeline stage, tensor-parallel rank)
    tokenizer.json ...                 the tokenizer files, copied beside

The tensor names inside a shard and how each is split are specified in docs/shard-format.md.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardline.config import ConfigError, ModelConfig

FORMAT = "shardline.v1"
MANIFEST_NAME = "manifest.json"
QUANTIZATIONS = ("none", "int8-weight-only", "fp8-weight-only")


def shard_file(stage: int, rank: int) -> str:
    return f"stage-{stage}/rank-{rank}.safetensors"


@dataclass(frozen=True)
class StageSpec:
    stage: int
    layer_start: int  # first layer this stage runs (global index)
    layer_end: int  # one past the last

    @property
    def num_layers(self) -> int:
        return self.layer_end - self.layer_start


@dataclass(frozen=True)
class ShardSpec:
    stage: int
    rank: int
    file: str
    sha256: str
    bytes: int


@dataclass(frozen=True)
class Manifest:
    model: ModelConfig
    dtype: str  # "fp32" | "fp16" | "bf16": activations and unquantised weights
    quantization: str  # "none" | "int8-weight-only" | "fp8-weight-only"
    tp: int
    pp: int
    stages: tuple[StageSpec, ...]
    shards: tuple[ShardSpec, ...]
    tokenizer_files: tuple[str, ...] = ()
    source: dict[str, Any] = field(default_factory=dict)

    def stage(self, index: int) -> StageSpec:
        if not 0 <= index < self.pp:
            raise ConfigError(f"stage {index} does not exist; this model has stages 0..{self.pp - 1}")
        return self.stages[index]

    def shard(self, stage: int, rank: int) -> ShardSpec:
        for s in self.shards:
            if s.stage == stage and s.rank == rank:
                return s
        raise ConfigError(f"no shard for stage {stage} rank {rank}; the model has tp={self.tp}, pp={self.pp}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "model": self.model.to_dict(),
            "dtype": self.dtype,
            "quantization": self.quantization,
            "tp": self.tp,
            "pp": self.pp,
            "stages": [vars(s) for s in self.stages],
            "shards": [vars(s) for s in self.shards],
            "tokenizer_files": list(self.tokenizer_files),
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Manifest":
        if d.get("format") != FORMAT:
            raise ConfigError(f"manifest format {d.get('format')!r} is not {FORMAT!r}; re-run `shardline convert`")
        return cls(
            model=ModelConfig.from_dict(d["model"]),
            dtype=d["dtype"],
            quantization=d.get("quantization", "none"),
            tp=d["tp"],
            pp=d["pp"],
            stages=tuple(StageSpec(**s) for s in d["stages"]),
            shards=tuple(ShardSpec(**s) for s in d["shards"]),
            tokenizer_files=tuple(d.get("tokenizer_files", ())),
            source=d.get("source", {}),
        )

    def write(self, directory: Path) -> None:
        (Path(directory) / MANIFEST_NAME).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def read(cls, directory: str | Path) -> "Manifest":
        path = Path(directory) / MANIFEST_NAME
        if not path.is_file():
            raise ConfigError(f"{path} not found: --model must be a directory made by `shardline convert`")
        return cls.from_dict(json.loads(path.read_text()))


def is_converted(directory: str | Path) -> bool:
    return (Path(directory) / MANIFEST_NAME).is_file()


def sha256_file(path: Path, chunk: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
