"""Typed errors of the client SDK: one ShardlineError family, one subclass per status code."""

from __future__ import annotations

import grpc


class ShardlineError(Exception):
    """Base of every error the SDK raises. `code` is the gRPC status code name."""

    code = "UNKNOWN"

    def __init__(self, message: str, request_id: str = "") -> None:
        super().__init__(message)
        self.message, self.request_id = message, request_id

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class InvalidArgument(ShardlineError):
    code = "INVALID_ARGUMENT"


class OutOfRange(ShardlineError):
    code = "OUT_OF_RANGE"


class NotFound(ShardlineError):
    code = "NOT_FOUND"


class AlreadyExists(ShardlineError):
    code = "ALREADY_EXISTS"


class ResourceExhausted(ShardlineError):
    """The gateway's queue is full; retry after `retry_after_s` seconds (the server's hint)."""

    code = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, request_id: str = "", retry_after_s: float | None = None) -> None:
        super().__init__(message, request_id)
        self.retry_after_s = retry_after_s


class Unavailable(ShardlineError):
    code = "UNAVAILABLE"


class DeadlineExceeded(ShardlineError):
    code = "DEADLINE_EXCEEDED"


class Cancelled(ShardlineError):
    code = "CANCELLED"


class Internal(ShardlineError):
    code = "INTERNAL"


_BY_CODE = {cls.code: cls for cls in (InvalidArgument, OutOfRange, NotFound, AlreadyExists, ResourceExhausted,
                                      Unavailable, DeadlineExceeded, Cancelled, Internal)}


def error_from_code(code: str, message: str, request_id: str = "", retry_after_s: float | None = None) -> ShardlineError:
    cls = _BY_CODE.get(code)
    if cls is None:
        error = ShardlineError(message, request_id)
        error.code = code
        return error
    if cls is ResourceExhausted:
        return ResourceExhausted(message, request_id, retry_after_s)
    return cls(message, request_id)


def error_from_rpc(e: grpc.RpcError, request_id: str = "") -> ShardlineError:
    """Works for sync and asyncio call errors alike (both have code/details/trailing_metadata)."""
    retry_after_s = None
    for key, value in e.trailing_metadata() or ():
        if key == "retry-after-ms":
            try:
                retry_after_s = int(value) / 1000.0
            except ValueError:
                pass
    code = e.code()
    return error_from_code(code.name if code is not None else "UNKNOWN", e.details() or "", request_id, retry_after_s)
