"""The benchmarks' list options reject malformed values with the expected form (CPU)."""

import argparse

import pytest

from benchmarks.kernels_bench import decode_shapes


def test_decode_shapes_parses_pairs_and_names_the_form_on_bad_input():
    assert decode_shapes("64x192,1x2048") == [(64, 192), (1, 2048)]
    for bad in ("64by192", "64x", "0x192", "64x192x3", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="BATCHxCONTEXT pairs"):
            decode_shapes(bad)


def test_prefetch_depths_parse_and_name_the_form_on_bad_input():
    from benchmarks.arguments import depths
    assert depths("0,1,8") == [0, 1, 8]
    for bad in ("1,x", "-1", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="tile counts >= 0"):
            depths(bad)


def test_gemm_configs_takes_existing_tables_and_names_the_missing(tmp_path):
    from benchmarks.decode_bench import table_paths
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text("{}")
    b.write_text("{}")
    assert table_paths(f"{a},{b}") == [str(a), str(b)]
    with pytest.raises(argparse.ArgumentTypeError, match="not found: .*c.json"):
        table_paths(f"{a},{tmp_path / 'c.json'}")
    with pytest.raises(argparse.ArgumentTypeError, match="got none"):
        table_paths(",")
