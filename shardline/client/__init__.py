"""The shardline client SDK: `from shardline.client import Client, AsyncClient`.

Deadlines (`timeout=` seconds, retries included), retries on UNAVAILABLE before the first token
(bounded, exponential backoff with jitter), and typed errors subclassing ShardlineError.
"""

from .aio import AsyncClient, AsyncStream
from .errors import (AlreadyExists, Cancelled, DeadlineExceeded, Internal, InvalidArgument, NotFound, OutOfRange,
                     ResourceExhausted, ShardlineError, Unavailable)
from .retry import NO_RETRY, RetryPolicy
from .sync import Client, Stream
from .types import Delta, GenerateResult, ModelInfo, RequestInfo, Timings, Usage

__all__ = ["Client", "AsyncClient", "Stream", "AsyncStream", "RetryPolicy", "NO_RETRY", "Delta", "GenerateResult",
           "ModelInfo", "RequestInfo", "Timings", "Usage", "ShardlineError", "InvalidArgument", "OutOfRange",
           "NotFound", "AlreadyExists", "ResourceExhausted", "Unavailable", "DeadlineExceeded", "Cancelled",
           "Internal"]
