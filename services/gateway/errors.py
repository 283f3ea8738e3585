"""Typed gateway errors. Each carries the gRPC status code it maps to and a message that names the
field (or resource) and what to do; the servicer and the HTTP front door only translate them."""

from __future__ import annotations

import grpc


class GatewayError(Exception):
    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    http_status: int = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(GatewayError):
    """A value outside its absolute valid range, an empty prompt, an unknown model."""
    code, http_status = grpc.StatusCode.INVALID_ARGUMENT, 400


class UnknownModel(InvalidArgument):
    """INVALID_ARGUMENT on gRPC (as the API promises); 404 on the OpenAI-compatible HTTP API."""
    http_status = 404


class OutOfRange(GatewayError):
    """A value valid in itself that does not fit this model: prompt + max_tokens beyond the context."""
    code, http_status = grpc.StatusCode.OUT_OF_RANGE, 400


class NotFound(GatewayError):
    code, http_status = grpc.StatusCode.NOT_FOUND, 404


class AlreadyExists(GatewayError):
    code, http_status = grpc.StatusCode.ALREADY_EXISTS, 409


class ResourceExhausted(GatewayError):
    """The admission queue is full. retry_after_s is the hint sent as `retry-after-ms` metadata."""
    code, http_status = grpc.StatusCode.RESOURCE_EXHAUSTED, 429

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Unavailable(GatewayError):
    """No complete route (or the tokenizer is down); retrying later may succeed."""
    code, http_status = grpc.StatusCode.UNAVAILABLE, 503


class Internal(GatewayError):
    code, http_status = grpc.StatusCode.INTERNAL, 500


async def abort(context: grpc.aio.ServicerContext, e: GatewayError) -> None:
    """End a gRPC call with `e`'s status code and message (both gRPC doors); RESOURCE_EXHAUSTED
    carries `retry-after-ms` in the trailing metadata."""
    if isinstance(e, ResourceExhausted):
        context.set_trailing_metadata((("retry-after-ms", str(int(e.retry_after_s * 1000))),))
    await context.abort(e.code, e.message)
