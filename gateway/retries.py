"""Retries: the one backoff policy of every transport that asks again (the agents' commands
over HTTP and NATS, the 2.0b registration, the 3.1 VEN's polls and subscriptions).

The waits and stops are tenacity's (`wait_exponential`, `stop_after_attempt`); the sleeps are
the injected clock's (`gateway.clock`), so a stepped clock steps through them and no test
waits in real time for a backoff.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    stop_never,
    wait_exponential,
)

from gateway.clock import Clock

T = TypeVar("T")


def command_backoff(retries: int) -> Backoff:
    """A cap command to the agents: `retries` more after the first (`FLEXGATE_DISPATCH_RETRIES`),
    0.1 s, 0.2 s, 0.4 s ... apart."""
    return Backoff(0.1, 60.0, tries=retries + 1)


@dataclass(frozen=True)
class Backoff:
    """Waits between attempts: `first_s`, doubling each time, at most `most_s` [s]; `tries`
    attempts in all (None: until one succeeds)."""

    first_s: float
    most_s: float
    tries: int | None = None

    def wait_s(self, failures: int) -> float:
        """The wait after `failures` failures in a row (1 or more) [s]: for callers that
        schedule the next attempt rather than wait for it."""
        state = RetryCallState(None, None, (), {})  # type: ignore[arg-type]
        state.attempt_number = max(failures, 1)
        return float(self._wait()(state))

    async def call(
        self,
        clock: Clock,
        attempt: Callable[[], Awaitable[T]],
        *,
        on: tuple[type[BaseException], ...],
        before_sleep: Callable[[BaseException, float], Awaitable[None]] | None = None,
    ) -> T:
        """`attempt()`'s result, asked again after each of the exceptions `on` (any other is
        raised at once); the last one is raised when the tries run out. `before_sleep` hears
        each failure and the wait that follows it [s]."""

        async def hear(state: RetryCallState) -> None:
            if before_sleep is not None and state.outcome is not None:
                failure = state.outcome.exception()
                if failure is not None:
                    await before_sleep(failure, state.upcoming_sleep)

        retrying: AsyncRetrying = AsyncRetrying(
            sleep=clock.sleep,
            stop=stop_never if self.tries is None else stop_after_attempt(self.tries),
            wait=self._wait(),
            retry=retry_if_exception_type(on),
            before_sleep=hear,
            reraise=True,
        )
        result: Any = await retrying(attempt)
        return result  # type: ignore[no-any-return]

    def _wait(self) -> wait_exponential:
        return wait_exponential(multiplier=self.first_s, max=self.most_s)


#: The VTN's polls and registration after a failure: 1 s doubling to 30 s.
VTN_BACKOFF = Backoff(1.0, 30.0)
#: Subscriptions a VTN refuses (each may leave one stored there): 1 s doubling to 5 minutes.
SUBSCRIBE_BACKOFF = Backoff(1.0, 300.0)
