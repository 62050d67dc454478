"""The agents' clocks on the gateway's: each agent's offset, and its jobs' phases on one time base.

An agent stamps its phases (`phase_at`) and its telemetry answer (`agent_time_s`) on its own
monotonic clock. The gateway notes when it asked and when the answer came; the agent's clock
then reads `offset = agent_time - (asked + answered) / 2`, wrong by at most half the round
trip. Of the last `ANSWERS_KEPT` answers the one with the shortest round trip gives the offset
(queueing delays only ever lengthen a round trip), so a busy round does not move it.

Over NATS nobody asks: an agent publishes its summary stamped on its clock, and the gateway
notes when it arrived. That stamp bounds the offset from one side only: the agent's clock was
at least `agent_time - arrived` ahead, by the summary's unknown way through the broker. Of the
last `ANSWERS_KEPT` summaries the quickest, the one with the largest such bound, gives the
offset; its error has no bound (`error_s` None).

With the offsets, each job's phase is carried to one instant on the gateway's clock at its own
measured (capped) period: `phi(now) = phi + 2 pi (now - (phase_at - offset)) / T`. For the m-th
harmonic an offset error `e` turns into `2 pi m e / T` of phase: 30 ms at m = 3, T = 2 s is
0.28 rad, the most the harmonic's order parameter tolerates.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from dataclasses import dataclass

from agents.protocol import JobTelemetry

#: The answers (or published summaries) per agent whose quickest gives its offset.
ANSWERS_KEPT = 16


@dataclass(frozen=True)
class Offset:
    offset_s: float  #: the agent's clock less the gateway's [s]
    #: at most this wrong: half the round trip it came from [s]; None from one-way stamps
    error_s: float | None


class AgentClocks:
    def __init__(self) -> None:
        #: each agent's answers: (round trip, offset)
        self._answers: dict[str, deque[tuple[float, float]]] = defaultdict(
            lambda: deque(maxlen=ANSWERS_KEPT)
        )
        #: each agent's published summaries: (arrived, the least its offset can be)
        self._published: dict[str, deque[tuple[float, float]]] = defaultdict(
            lambda: deque(maxlen=ANSWERS_KEPT)
        )

    def observe(self, node: str, asked_s: float, agent_s: float, answered_s: float) -> None:
        """One answer: asked and answered on the gateway's monotonic clock, stamped by the
        agent on its own."""
        rtt = answered_s - asked_s
        if rtt < 0 or not all(math.isfinite(v) for v in (asked_s, agent_s, answered_s)):
            return
        self._answers[node].append((rtt, agent_s - (asked_s + answered_s) / 2))

    def observe_published(self, node: str, agent_s: float, arrived_s: float) -> None:
        """One summary the agent published, stamped on its own clock, that arrived here at
        `arrived_s` (the gateway's monotonic clock). A summary read again is counted once."""
        if not (math.isfinite(agent_s) and math.isfinite(arrived_s)):
            return
        kept = self._published[node]
        if not kept or kept[-1][0] != arrived_s:
            kept.append((arrived_s, agent_s - arrived_s))

    def offset(self, node: str) -> Offset | None:
        answers = self._answers.get(node)
        if answers:
            rtt, offset = min(answers)
            return Offset(offset, rtt / 2)
        published = self._published.get(node)
        if published:
            return Offset(max(least for _, least in published), None)
        return None

    def phase_now(self, node: str, job: JobTelemetry, now_s: float) -> float | None:
        """`job`'s phase [rad, 0 to 2 pi] at `now_s` on the gateway's clock, None when the
        agent's clock, the phase or the period is unknown."""
        offset = self.offset(node)
        if offset is None or job.phase_rad is None or job.phase_at is None or not job.period_s:
            return None
        at_s = job.phase_at - offset.offset_s
        return (job.phase_rad + 2 * math.pi * (now_s - at_s) / job.period_s) % (2 * math.pi)
