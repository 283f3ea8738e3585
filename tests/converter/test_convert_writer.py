"""The streaming safetensors writer: files it writes load with the reference reader, bit for bit."""

from __future__ import annotations

import weakref

import pytest
import torch
from safetensors import safe_open

from shardline.converter.safetensors_writer import TensorSpec, write_safetensors
from shardline.manifest import sha256_file


def _tensors():
    g = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(7, 13, generator=g),
        "b.bias": torch.randn(5, generator=g).to(torch.float16),
        "c.weight": torch.randn(3, 11, generator=g).to(torch.bfloat16),
        "d.weight": torch.randint(-127, 128, (9, 3), generator=g, dtype=torch.int8),
        "e.empty": torch.zeros(0, 4),
    }


def test_roundtrip_odd_shapes_and_dtypes(tmp_path):
    tensors = _tensors()
    specs = [TensorSpec(k, v.dtype, tuple(v.shape)) for k, v in tensors.items()]
    path = tmp_path / "x.safetensors"
    written = write_safetensors(path, specs, iter(tensors.values()))

    assert written.bytes == path.stat().st_size
    assert written.sha256 == sha256_file(path), "the hash computed while streaming must be the file's hash"
    with safe_open(str(path), framework="pt") as f:
        assert list(f.keys()) == sorted(tensors)
        for name, want in tensors.items():
            got = f.get_tensor(name)
            assert got.dtype == want.dtype and torch.equal(got, want), name


def test_data_starts_8_byte_aligned(tmp_path):
    path = tmp_path / "x.safetensors"
    write_safetensors(path, [TensorSpec("w", torch.float32, (3,))], [torch.ones(3)])
    header_len = int.from_bytes(path.read_bytes()[:8], "little")
    assert header_len % 8 == 0


@pytest.mark.parametrize("bad", [torch.zeros(7, 12), torch.zeros(7, 13, dtype=torch.float16)])
def test_tensor_not_matching_its_spec_is_refused(tmp_path, bad):
    with pytest.raises(ValueError, match="a.weight"):
        write_safetensors(tmp_path / "x.safetensors", [TensorSpec("a.weight", torch.float32, (7, 13))], [bad])


def test_producer_yielding_too_few_or_too_many_is_refused(tmp_path):
    specs = [TensorSpec("a", torch.float32, (2,)), TensorSpec("b", torch.float32, (2,))]
    with pytest.raises(ValueError, match="stopped before tensor 'b'"):
        write_safetensors(tmp_path / "x.safetensors", specs, [torch.zeros(2)])
    with pytest.raises(ValueError, match="more tensors"):
        write_safetensors(tmp_path / "y.safetensors", specs, [torch.zeros(2)] * 3)


def test_holds_one_tensor_at_a_time(tmp_path):
    """Peak memory must be one tensor, not the file: every produced tensor is dead by the time
    the writer asks for the next one."""
    n = 6
    specs = [TensorSpec(f"t{i}", torch.float32, (64, 64)) for i in range(n)]
    alive_when_asked = []
    refs: list[weakref.ref] = []

    def produce():
        for _ in range(n):
            alive_when_asked.append(sum(r() is not None for r in refs))
            t = torch.randn(64, 64)
            refs.append(weakref.ref(t))
            yield t
            del t

    write_safetensors(tmp_path / "x.safetensors", specs, produce())
    assert alive_when_asked == [0] * n, f"tensors still referenced when the next was produced: {alive_when_asked}"
