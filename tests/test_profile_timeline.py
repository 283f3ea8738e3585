"""benchmarks/profile_decode.py's critical-path split of a replay's kernels (CPU: synthetic spans)."""

from benchmarks.profile_decode import by_predecessor, critical_path


def test_critical_path_charges_overlap_to_the_kernel_ahead_and_counts_idle():
    spans = [
        ("gemm", 0.0, 10.0),
        ("attn", 8.0, 15.0),   # launched early (PDL): only 5 us past the gemm's end is its own
        ("norm", 17.0, 18.0),  # 2 us idle before it
        ("tiny", 15.5, 16.0),  # out of order on input; 0.5 idle before it, all its 0.5 its own
        ("gemm", 17.5, 30.0),  # overlaps the norm
    ]
    stats, idle, wall = critical_path(spans)
    assert wall == 30.0
    assert idle == 1.5  # 15 -> 15.5 and 16 -> 17
    assert stats["attn"] == [1, 7.0, 5.0]
    assert stats["tiny"] == [1, 0.5, 0.5]
    assert stats["norm"] == [1, 1.0, 1.0]
    assert stats["gemm"] == [2, 22.5, 10.0 + 12.0]
    assert sum(own for _, _, own in stats.values()) + idle == wall


def test_a_kernel_inside_another_costs_nothing():
    stats, idle, wall = critical_path([("a", 0.0, 10.0), ("b", 2.0, 5.0)])
    assert stats["b"][2] == 0.0 and idle == 0.0 and wall == 10.0
    assert critical_path([]) == ({}, 0.0, 0.0)


def test_by_predecessor_tells_one_kernels_uses_apart():
    spans = [("_ring_linear_kernel", 0.0, 1.0), ("_int8_linear_kernel", 1.0, 2.0), ("_int8_linear_kernel", 2.0, 3.0),
             ("void at::native::reduce_kernel<512>(float*)", 3.0, 4.0)]
    names = [n for n, _, _ in by_predecessor(spans)]
    assert names == ["_ring_linear_kernel < -", "_int8_linear_kernel < _ring_linear_kernel",
                     "_int8_linear_kernel < _int8_linear_kernel", "at::native::reduce_kernel < _int8_linear_kernel"]


def test_fit_line_recovers_a_line_and_its_intercept():
    """--contexts fits each kernel's critical time against the context: intercept and slope."""
    from benchmarks.profile_decode import fit_line
    a, b = fit_line([1.0, 128.0, 256.0], [2.0 + 0.5 * 1, 2.0 + 0.5 * 128, 2.0 + 0.5 * 256])
    assert abs(a - 2.0) < 1e-9 and abs(b - 0.5) < 1e-9
    a, b = fit_line([0.0, 1.0, 2.0, 3.0], [1.0, 3.0, 2.0, 4.0])  # least squares, not the end points
    assert abs(b - 0.8) < 1e-9 and abs(a - 1.3) < 1e-9
