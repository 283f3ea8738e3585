"""Validation without servers: every bad value names its field and its limits, and maps to the
status the API promises (InvalidArgument for absolute ranges, OutOfRange for the model's context)."""

from __future__ import annotations

import grpc
import pytest

from shardline.gateway.errors import InvalidArgument, OutOfRange
from shardline.gateway.validation import GenerateInput, check_fields, fit_context, resolve_sampling


@pytest.mark.parametrize("req,message", [
    (GenerateInput(), "prompt is empty"),
    (GenerateInput(prompt_text=""), "prompt is empty"),
    (GenerateInput(chat=[]), "prompt is empty"),
    (GenerateInput(prompt_text="a", prompt_token_ids=[1]), "exactly one prompt form; got prompt_text, prompt_token_ids"),
    (GenerateInput(prompt_text="a", max_tokens=-3), "max_tokens -3 must be >= 1"),
    (GenerateInput(prompt_text="a", temperature=float("nan")), "temperature nan is out of range"),
    (GenerateInput(prompt_text="a", temperature=100.5), "use 0 (greedy) to 100"),
    (GenerateInput(prompt_text="a", top_k=-2), "top_k -2 is out of range"),
    (GenerateInput(prompt_text="a", top_p=0.0), "top_p 0.0 is out of range; use a value in (0, 1]"),
    (GenerateInput(prompt_text="a", seed=1 << 63), "seed 9223372036854775808 is out of range"),
    (GenerateInput(prompt_text="a", stop=["x"] * 17), "at most 16"),
    (GenerateInput(prompt_text="a", stop=[""]), "stop[0] must be 1..256 characters"),
    (GenerateInput(prompt_text="a", request_id="has space"), "request_id 'has space' must be"),
])
def test_field_errors_are_invalid_argument_and_name_the_field(req, message):
    with pytest.raises(InvalidArgument) as e:
        check_fields(req)
    assert message in e.value.message
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_good_fields_pass_and_defaults_resolve():
    req = GenerateInput(prompt_text="a")
    check_fields(req)
    sampling = resolve_sampling(req, max_tokens=5)
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_tokens) == (1.0, 1.0, 0, 5)
    assert resolve_sampling(GenerateInput(prompt_text="a", seed=42), 5).seed == 42


def test_context_fit():
    assert fit_context(GenerateInput(), 10, 64, default_max_tokens=16) == 16
    assert fit_context(GenerateInput(), 60, 64, default_max_tokens=16) == 4, "the default is capped by the room left"
    assert fit_context(GenerateInput(max_tokens=54), 10, 64, 16) == 54
    assert fit_context(GenerateInput(max_tokens=5000), 10, 0, 16) == 5000, "0 = unknown context: no check"
    for req, n, message in [(GenerateInput(max_tokens=55), 10, "prompt (10 tokens) + max_tokens (55) = 65 exceeds"),
                            (GenerateInput(max_tokens=65), 1, "max_tokens 65 exceeds the model's context of 64"),
                            (GenerateInput(), 64, "prompt has 64 tokens but the model's context is 64")]:
        with pytest.raises(OutOfRange) as e:
            fit_context(req, n, 64, 16)
        assert message in e.value.message and e.value.code == grpc.StatusCode.OUT_OF_RANGE
