"""The one backoff policy (`gateway.retries`): its waits, its stops, and its sleeps on the
injected clock (a stepped clock: nothing here waits in real time)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.clock import SteppedClock
from gateway.retries import SUBSCRIBE_BACKOFF, VTN_BACKOFF, Backoff, command_backoff


def test_waits_double_from_the_first_to_the_most():
    assert [command_backoff(3).wait_s(n) for n in (1, 2, 3, 4)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8]
    )
    assert [VTN_BACKOFF.wait_s(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert [SUBSCRIBE_BACKOFF.wait_s(n) for n in (9, 10)] == [256, 300]
    assert VTN_BACKOFF.wait_s(0) == 1  # before any failure: the first wait


class Flaky:
    """Fails `failures` times with `error`, then answers; counts its calls and when."""

    def __init__(self, clock: SteppedClock, failures: int, error: type[Exception]) -> None:
        self.clock, self.failures, self.error = clock, failures, error
        self.called_at: list[float] = []

    async def __call__(self) -> str:
        self.called_at.append(self.clock.monotonic())
        if len(self.called_at) <= self.failures:
            raise self.error(f"failure {len(self.called_at)}")
        return "answer"


async def stepping(clock: SteppedClock, task: asyncio.Task) -> None:
    """Steps the clock 50 ms at a time whenever the task sleeps on it, until it is done."""
    while not task.done():
        await asyncio.sleep(0)
        if clock.sleepers:
            clock.step(0.05)


def run_on_clock(backoff: Backoff, attempt, **options):
    clock = attempt.clock
    heard: list[tuple[str, float]] = []

    async def before_sleep(exc: BaseException, wait_s: float) -> None:
        heard.append((str(exc), wait_s))

    async def scenario():
        task = asyncio.ensure_future(
            backoff.call(clock, attempt, before_sleep=before_sleep, **options)
        )
        await stepping(clock, task)
        return task.result()

    return asyncio.run(scenario()), heard


def test_a_call_is_asked_again_after_its_waits_on_the_injected_clock():
    clock = SteppedClock()
    attempt = Flaky(clock, 2, ConnectionError)
    result, heard = run_on_clock(Backoff(1.0, 30.0, tries=5), attempt, on=(ConnectionError,))
    assert result == "answer"
    assert attempt.called_at == pytest.approx([0.0, 1.0, 3.0], abs=0.06)  # 1 s, then 2 s
    assert heard == [("failure 1", 1.0), ("failure 2", 2.0)]


def test_the_last_failure_is_raised_when_the_tries_run_out():
    clock = SteppedClock()
    attempt = Flaky(clock, 10, TimeoutError)
    with pytest.raises(TimeoutError, match="failure 3"):
        run_on_clock(command_backoff(2), attempt, on=(TimeoutError,))
    assert len(attempt.called_at) == 3  # the first and two retries


def test_a_failure_not_listed_is_raised_at_once():
    clock = SteppedClock()
    attempt = Flaky(clock, 1, ValueError)
    with pytest.raises(ValueError, match="failure 1"):
        run_on_clock(VTN_BACKOFF, attempt, on=(ConnectionError,))
    assert attempt.called_at == [0.0]
