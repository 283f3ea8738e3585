"""Bad input fails before anything is written; a failed or interrupted conversion leaves nothing;
conversion streams one tensor at a time."""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import weakref

import pytest
from safetensors.torch import load_file, save_file

from shardline.cli import main
from shardline.converter import convert
from shardline.converter.checkpoint import HFCheckpoint
from shardline.manifest import Manifest

# The package re-exports the function `convert`, which shadows its module of the same name.
convert_module = importlib.import_module("shardline.converter.convert")


def _copy(tiny_hf, tmp_path, family="llama"):
    hf = tmp_path / "hf"
    shutil.copytree(tiny_hf(family), hf)
    return hf


def _edit_config(hf, **changes):
    config = json.loads((hf / "config.json").read_text())
    config.update(changes)
    (hf / "config.json").write_text(json.dumps(config))


def _drop_tensor(hf, name):
    state = load_file(hf / "model.safetensors")
    del state[name]
    save_file(state, hf / "model.safetensors")


# (case id, setup(tiny_hf, tmp_path) -> hf dir, extra args, what the message must say)
BAD_INPUTS = [
    ("missing-dir", lambda t, p: p / "nope", [], "is not a directory"),
    ("no-config", lambda t, p: (p / "empty").mkdir() or p / "empty", [], "has no config.json"),
    ("no-weights", lambda t, p: [(p / "cfg").mkdir(), shutil.copy(t() / "config.json", p / "cfg")] and p / "cfg",
     [], "no weights in"),
    ("unknown-arch", lambda t, p: _edit_config(_copy(t, p), model_type="bert") or p / "hf", [],
     "unknown architecture model_type='bert'; supported: gpt2, gptj, llama, mistral, qwen2"),
    ("tp-heads", lambda t, p: t(), ["--tp", "4"], "--tp 4 does not divide 6 attention heads; use one of 1, 2"),
    ("tp-kv-heads", lambda t, p: t(), ["--tp", "3"], "--tp 3 does not divide 2 KV heads; use one of 1, 2"),
    ("pp-too-large", lambda t, p: t(), ["--pp", "7"], "--pp 7 is larger than the model's 6 layers; use 1..6"),
    ("stage-layers-sum", lambda t, p: t(), ["--pp", "2", "--stage-layers", "3,2"],
     "--stage-layers 3,2 sums to 5, but the model has 6 layers"),
    ("stage-layers-count", lambda t, p: t(), ["--pp", "2", "--stage-layers", "2,2,2"],
     "--stage-layers has 3 entries but --pp is 2"),
    ("stage-layers-text", lambda t, p: t(), ["--pp", "2", "--stage-layers", "3,x"],
     "must be comma-separated layer counts"),
    ("dtype", lambda t, p: t(), ["--dtype", "fp8"], "--dtype fp8 is not one of fp32, fp16, bf16"),
    ("missing-tensor", lambda t, p: _drop_tensor(_copy(t, p), "model.layers.3.mlp.up_proj.weight") or p / "hf",
     [], "has no tensor 'model.layers.3.mlp.up_proj.weight'"),
    ("shape-mismatch", lambda t, p: _edit_config(_copy(t, p), intermediate_size=202) or p / "hf", [],
     "has shape [200, 96], but config.json implies [202, 96]"),
]


@pytest.mark.parametrize("setup,extra,message", [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tiny_hf, tmp_path, capsys, setup, extra, message):
    hf = setup(tiny_hf, tmp_path)
    capsys.readouterr()  # only the conversion's own output counts
    out_parent = tmp_path / "converted"
    out_parent.mkdir()
    rc = main(["convert", "--hf", str(hf), "--out", str(out_parent / "out"), "--dtype", "fp32", *extra])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("shardline convert: error: ") and err.count("\n") == 1, f"want one line, got {err!r}"
    assert message in err
    assert list(out_parent.iterdir()) == [], "nothing may be written for bad input"


def test_refuses_non_empty_out_without_overwrite(tiny_hf, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    rc = main(["convert", "--hf", str(tiny_hf()), "--out", str(out)])
    assert rc == 2
    assert "exists and is not empty; pass --overwrite" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (out / "keep.txt").read_text() == "mine"


def test_refuses_out_that_would_replace_the_checkpoint(tiny_hf, tmp_path, capsys):
    hf = _copy(tiny_hf, tmp_path)
    assert main(["convert", "--hf", str(hf), "--out", str(hf), "--overwrite"]) == 2
    assert "would replace the checkpoint" in capsys.readouterr().err
    assert (hf / "model.safetensors").is_file()


def test_overwrite_replaces_and_empty_out_is_fine(tiny_hf, tmp_path):
    out = tmp_path / "out"
    out.mkdir()  # empty: no --overwrite needed
    convert(tiny_hf(), out, tp=1, pp=1, dtype="fp32")
    (out / "stale.txt").write_text("old")
    m = convert(tiny_hf(), out, tp=2, pp=2, dtype="bf16", overwrite=True)
    assert Manifest.read(out) == m and m.tp == 2
    assert not (out / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], "no temp or old dirs left behind"


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize("existing", [False, True])
def test_interrupted_conversion_leaves_nothing(tiny_hf, tmp_path, monkeypatch, exc, existing):
    """A failure mid-file (here: inside the writer, while shard 2 of 4 is being written) must
    remove the partial output and leave an existing OUT untouched."""
    out = tmp_path / "out"
    if existing:
        out.mkdir()
        (out / "previous.txt").write_text("previous conversion")
    real, calls = convert_module.materialize, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 40:
            raise exc("interrupted")
        return real(*args, **kwargs)

    monkeypatch.setattr(convert_module, "materialize", failing)
    with pytest.raises(exc):
        convert(tiny_hf(), out, tp=2, pp=2, dtype="fp32", overwrite=existing)
    assert len(calls) == 40
    assert sorted(p.name for p in tmp_path.iterdir()) == (["out"] if existing else [])
    if existing:
        assert [p.name for p in out.iterdir()] == ["previous.txt"]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_conversion_streams_one_tensor_at_a_time(tiny_hf, tmp_path, monkeypatch, family):
    """Peak memory is one output tensor and the checkpoint slices it is made of (at most q, k, v),
    never the model: when a slice is read, at most two earlier slices may still be alive."""
    real_load, refs, alive_at_load = HFCheckpoint.load, [], []

    def counting_load(self, *args, **kwargs):
        alive_at_load.append(sum(r() is not None for r in refs))
        t = real_load(self, *args, **kwargs)
        refs.append(weakref.ref(t))
        return t

    monkeypatch.setattr(HFCheckpoint, "load", counting_load)
    convert(tiny_hf(family), tmp_path / "out", tp=2, pp=1, dtype="fp32")
    assert len(alive_at_load) > 50, "the hook must see the conversion's reads"
    assert max(alive_at_load) <= 2, f"checkpoint slices kept alive: up to {max(alive_at_load)}"


def test_console_script_reports_bad_tp(tiny_hf, tmp_path):
    shardline = shutil.which("shardline") or pytest.skip("the shardline console script is not installed")
    proc = subprocess.run([shardline, "convert", "--hf", str(tiny_hf()), "--out", str(tmp_path / "out"),
                           "--tp", "4"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("shardline convert: error: --tp 4 does not divide 6 attention heads; "
                                   "use one of 1, 2")
    assert not (tmp_path / "out").exists()
