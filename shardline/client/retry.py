"""When to try a call again: UNAVAILABLE before the first token only, bounded, with backoff.

After a token has reached the caller a retry would repeat it, so the error is raised instead (the
gateway already fails over between stage replicas on its own). Every other status is final.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from .errors import ShardlineError, Unavailable


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 4  # attempts in all, the first included; 1 = never retry
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.2  # each backoff is scaled by a random factor in [1 - jitter, 1 + jitter]

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts {self.max_attempts} must be >= 1 (1 = no retries)")
        if self.initial_backoff_s < 0 or self.max_backoff_s < self.initial_backoff_s or self.multiplier < 1:
            raise ValueError("need 0 <= initial_backoff_s <= max_backoff_s and multiplier >= 1")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter {self.jitter} must be in [0, 1)")

    def backoff_s(self, num_failed: int) -> float:
        """Sleep before attempt num_failed + 1."""
        base = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (num_failed - 1))
        return base * random.uniform(1 - self.jitter, 1 + self.jitter)


NO_RETRY = RetryPolicy(max_attempts=1)


class Deadline:
    """An overall time limit across attempts; None = no limit."""

    def __init__(self, timeout_s: float | None) -> None:
        self.at = None if timeout_s is None else time.monotonic() + timeout_s

    def remaining(self) -> float | None:
        return None if self.at is None else max(0.0, self.at - time.monotonic())


def retry_delay(error: ShardlineError, num_failed: int, has_token: bool, policy: RetryPolicy,
                deadline: Deadline) -> float | None:
    """Seconds to wait before trying again, or None to raise `error` now."""
    if not isinstance(error, Unavailable) or has_token or num_failed >= policy.max_attempts:
        return None
    delay = policy.backoff_s(num_failed)
    remaining = deadline.remaining()
    if remaining is not None and remaining <= delay:
        return None
    return delay
