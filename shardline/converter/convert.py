"""HF checkpoint directory -> converted model directory (docs/shard-format.md).

Everything that can be wrong with the input is checked before anything is written: config,
parallelism, output directory, and every source tensor's presence and shape. The output is then
built in `OUT.tmp-<pid>` beside OUT and renamed into place only when complete, so an interrupted
or failed conversion leaves nothing behind. Tensors are streamed: one output tensor (and the
checkpoint slices it is made of) is in memory at a time.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from shardline.config import DTYPES, ConfigError, ModelConfig, check_tensor_parallel, split_layers
from shardline.converter.checkpoint import HFCheckpoint
from shardline.converter.families import FAMILY_NAMES, kv_scale_candidates, plan_shard
from shardline.converter.plan import OutTensor, check_sources, materialize
from shardline.converter.safetensors_writer import TensorSpec, WrittenFile, write_safetensors
from shardline.kernels.attention import KVScales
from shardline.kernels.quant import WEIGHT_ONLY
from shardline.manifest import Manifest, ShardSpec, StageSpec, shard_file
from shardline.wire import MODEL_DTYPES

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "tokenizer.model", "generation_config.json", "chat_template.jinja")


def convert(hf_dir: str | Path, out_dir: str | Path, tp: int, pp: int, dtype: str,
            quantization: str = "none", stage_layers: list[int] | None = None,
            overwrite: bool = False) -> Manifest:
    """Convert the checkpoint in `hf_dir` into `out_dir`; raises ConfigError on bad input.
    `quantization`: "none", or a weight-only scheme of `kernels.quant.WEIGHT_ONLY`."""
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    hf_config = read_hf_config(hf_dir)
    cfg = model_config(hf_config)
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype} is not one of {', '.join(DTYPES)}")
    if quantization != "none" and quantization not in WEIGHT_ONLY:
        raise ConfigError(f"quantization {quantization!r} is not one of none, {', '.join(WEIGHT_ONLY)}")
    check_tensor_parallel(cfg, tp)
    ranges = split_layers(cfg.num_layers, pp, stage_layers)
    _check_out_dir(hf_dir, out_dir, overwrite)

    with HFCheckpoint(hf_dir) as ckpt:
        kv_scales = find_kv_scales(ckpt, cfg)
        for s in range(pp):
            for r in range(tp):
                check_sources(plan_shard(cfg, ranges[s], tp, r, kv_scales), ckpt)
        tmp = out_dir.parent / f"{out_dir.name}.tmp-{os.getpid()}"
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            tmp.mkdir()
            shards = []
            for s in range(pp):
                (tmp / f"stage-{s}").mkdir()
                for r in range(tp):
                    written = write_shard(tmp / shard_file(s, r), plan_shard(cfg, ranges[s], tp, r, kv_scales), ckpt,
                                          MODEL_DTYPES[dtype], quantization)
                    shards.append(ShardSpec(stage=s, rank=r, file=shard_file(s, r),
                                            sha256=written.sha256, bytes=written.bytes))
            manifest = Manifest(
                model=cfg, dtype=dtype, quantization=quantization,
                tp=tp, pp=pp, stages=tuple(StageSpec(s, a, b) for s, (a, b) in enumerate(ranges)),
                shards=tuple(shards), tokenizer_files=copy_tokenizer_files(hf_dir, tmp),
                source={"hf_dir": str(hf_dir.resolve()), "model_type": hf_config.get("model_type"),
                        "weights": [f.name for f in ckpt.files],
                        **({"kv_scales": {"layers": len(kv_scales), "layer_0": list(kv_scales[0])}}
                           if kv_scales else {})})
            manifest.write(tmp)
            _publish(tmp, out_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return manifest


def find_kv_scales(ckpt: HFCheckpoint, cfg: ModelConfig) -> dict[int, tuple[str, str]] | None:
    """Each layer's (k, v) scale sources for an fp8 KV cache, where the checkpoint has them
    (families.kv_scale_candidates); None where no layer has any. Every layer must have them once
    one does, and each must be one positive, finite value; raises ConfigError naming the tensor."""
    names = FAMILY_NAMES[cfg.architecture]
    found: dict[int, tuple[str, str]] = {}
    for i in range(cfg.num_layers):
        pair = next(((k, v) for k, v in kv_scale_candidates(names, i) if ckpt.has(k) and ckpt.has(v)), None)
        if pair is not None:
            try:
                KVScales.check(ckpt.value(pair[0]), ckpt.value(pair[1]), f"checkpoint tensors {pair[0]!r}, {pair[1]!r}")
            except ValueError as e:
                raise ConfigError(str(e)) from None
            found[i] = pair
    if found and len(found) < cfg.num_layers:
        missing = next(i for i in range(cfg.num_layers) if i not in found)
        k, v = kv_scale_candidates(names, missing)[0]
        raise ConfigError(f"checkpoint {ckpt.dir} has KV-cache scales for {len(found)} of {cfg.num_layers} layers "
                          f"but none for layer {missing} (looked for {k} and {v}, and the other namings); give "
                          f"a checkpoint quantized whole, or remove the scales")
    return found or None


def read_hf_config(hf_dir: Path) -> dict[str, Any]:
    if not hf_dir.is_dir():
        raise ConfigError(f"--hf {hf_dir} is not a directory; give a HuggingFace checkpoint directory "
                          f"(config.json and weights)")
    path = hf_dir / "config.json"
    if not path.is_file():
        raise ConfigError(f"--hf {hf_dir} has no config.json; give a HuggingFace checkpoint directory")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from e


def model_config(hf_config: dict[str, Any]) -> ModelConfig:
    try:
        return ModelConfig.from_hf(hf_config)
    except KeyError as e:
        raise ConfigError(f"config.json lacks {e.args[0]!r}, which model_type="
                          f"{hf_config.get('model_type')!r} needs") from e


def write_shard(path: Path, plan: list[OutTensor], ckpt: HFCheckpoint, dtype: torch.dtype,
                quantization: str = "none") -> WrittenFile:
    q_dtype, quantize = WEIGHT_ONLY.get(quantization, (None, None))
    quantized = {out.name for out in plan if quantize is not None and out.is_projection}
    specs = []
    for out in plan:
        if out.name in quantized:
            specs += [TensorSpec(out.name, q_dtype, out.shape),
                      TensorSpec(out.name + "_scale", dtype, out.shape[:1])]
        else:
            specs.append(TensorSpec(out.name, out.dtype or dtype, out.shape))

    def tensors() -> Iterator[torch.Tensor]:
        # `del` after each yield: the generator must not keep the previous tensor alive while
        # the next one is being built.
        for out in plan:
            if out.name in quantized:
                q, scale = quantize(materialize(ckpt, out, torch.float32), dtype)
                yield q
                del q
                yield scale
                del scale
            else:
                t = materialize(ckpt, out, out.dtype or dtype)
                yield t
                del t

    return write_safetensors(path, specs, tensors())


def copy_tokenizer_files(hf_dir: Path, out_dir: Path) -> tuple[str, ...]:
    copied = []
    for name in TOKENIZER_FILES:
        if (hf_dir / name).is_file():
            shutil.copyfile(hf_dir / name, out_dir / name)
            copied.append(name)
    return tuple(copied)


def _check_out_dir(hf_dir: Path, out_dir: Path, overwrite: bool) -> None:
    out, hf = out_dir.resolve(), hf_dir.resolve()
    if out == hf or out in hf.parents:
        raise ConfigError(f"--out {out_dir} would replace the checkpoint --hf {hf_dir}; choose another --out")
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir} exists and is not a directory; choose another --out")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise ConfigError(f"--out {out_dir} exists and is not empty; pass --overwrite to replace it")


def _publish(tmp: Path, out_dir: Path) -> None:
    """Move the finished `tmp` to `out_dir`, replacing whatever is there only at the very end."""
    if out_dir.is_dir() and any(out_dir.iterdir()):
        old = out_dir.parent / f"{out_dir.name}.old-{os.getpid()}"
        os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out_dir)  # rename(2) replaces an empty directory
