"""The campaign's site model (`flexgate.lab.realsite`): its cooling steps where it says they do."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from flexgate.lab.realsite import Cooling


@given(
    now_s=st.floats(0.0, 1e6),
    cycle_s=st.floats(60.0, 7200.0),
    on_share=st.floats(0.05, 0.95),
    phase_s=st.floats(0.0, 7200.0),
)
def test_the_cooling_holds_between_its_last_and_next_steps_and_changes_at_each(
    now_s, cycle_s, on_share, phase_s
):
    cooling = Cooling(
        base_kw=2.0, step_kw=1.5, cycle_s=cycle_s, on_s=on_share * cycle_s, phase_s=phase_s
    )
    last, following = cooling.last_step_s(now_s), cooling.next_step_s(now_s)
    assert last <= now_s < following
    assert following - last <= max(cooling.on_s, cycle_s - cooling.on_s) * (1 + 1e-9) + 1e-6
    margin = 1e-6 * max(1.0, now_s)
    inside = [last + margin, 0.5 * (last + following), following - margin]
    assert len({cooling.kw(t) for t in inside if last < t < following}) == 1
    assert cooling.kw(last - margin) != cooling.kw(last + margin)


def test_a_cooling_that_never_steps_has_no_steps():
    cooling = Cooling(base_kw=2.0)
    assert cooling.last_step_s(100.0) == float("-inf")
    assert cooling.next_step_s(100.0) == float("inf")
