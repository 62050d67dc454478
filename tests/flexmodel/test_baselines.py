"""Baseline rules on hand-computed cases, a few properties, and bad parameters refused by name.

Most cases use one-hour intervals (24 a day), day 0 a Monday (days 5, 6, 12 and 13 the
weekend) and an event on day 14, a Monday, from 14:00 to 16:00 (intervals 14 and 15).
"""

from __future__ import annotations

import math
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from flexmodel.baselinerules import MatchDayRule, SameDayRule, XOfYRule
from flexmodel.baselines import PRESETS, baseline, is_preset, preset
from flexmodel.errors import FlexModelError, InvalidBaselineError, NoBaselineError
from flexmodel.localdays import INTERVAL_MINUTES, Calendar, local_days, meter_day
from flexmodel.matchday import match_day_baseline
from flexmodel.meterbefore import MeterBeforeRule, meter_before
from flexmodel.sameday import same_day_baseline
from flexmodel.xofy import x_of_y_baseline

NAN = math.nan
CALENDAR = Calendar(monday=0)
EVENT_DAY = 14
EVENT = {"start_min": 14 * 60, "end_min": 16 * 60}


def day(d, kw=100.0, at=None, estimated=(), missing=()):
    """Day `d` at `kw` every hour, but `at` ({hour: kW}), NaN in `missing`."""
    load = [kw] * 24
    for hour, value in (at or {}).items():
        load[hour] = value
    for hour in missing:
        load[hour] = NAN
    return meter_day(d, load, interval_min=60, estimated=[h in estimated for h in range(24)])


def rule(x, y, **changes):
    """An X-of-Y rule with no adjustment unless told."""
    params = {
        "x_days": x,
        "y_days": y,
        "lookback_days": 45,
        "adjustment": "none",
        "adjustment_hours": 0.0,
        "adjustment_lead_hours": 0.0,
        "cap_percent": None,
        "max_estimated_share": 0.1,
        **changes,
    }
    return XOfYRule(**params)


def x_of_y(r, event, history, calendar=CALENDAR, event_days=()):
    return x_of_y_baseline(
        r, event, history, **EVENT, calendar=calendar, event_days=frozenset(event_days)
    )


# --- X of Y: eligible days ---------------------------------------------------------------


def test_eligible_days_skip_event_days_holidays_and_the_other_day_type():
    # Day d draws 100 + d kW. Day 10 is a holiday, day 8 an event day, 12 and 13 the weekend:
    # the last three eligible weekdays before day 14 are 11, 9 and 7:
    # (111 + 109 + 107) / 3 = 109.
    history = [day(d, 100.0 + d) for d in range(EVENT_DAY)]
    calendar = Calendar(monday=0, holidays=frozenset({10}))
    result = x_of_y(rule(3, 3), day(EVENT_DAY), history, calendar, event_days={8})
    assert result.days_used == (11, 9, 7)
    np.testing.assert_allclose(result.baseline_kw, [109.0, 109.0])
    assert result.no_baseline_min == ()
    assert not result.capped


def test_a_weekend_event_is_matched_to_weekend_days_and_holidays():
    # Event on day 13 (a Sunday): days 12 (Saturday), 10 (a holiday), 6 (Sunday):
    # (112 + 110 + 106) / 3 = 109.333...
    history = [day(d, 100.0 + d) for d in range(13)]
    calendar = Calendar(monday=0, holidays=frozenset({10}))
    result = x_of_y(rule(3, 3), day(13), history, calendar)
    assert result.days_used == (12, 10, 6)
    np.testing.assert_allclose(result.baseline_kw, [328.0 / 3.0] * 2)


def test_x_of_y_averages_the_highest_load_days_interval_by_interval():
    # The last 4 eligible (day 10 a holiday, 8 an event day) are 11, 9, 7, 4. Their means
    # over the event (14:00, 15:00): 11: 100, 9: (130 + 140) / 2 = 135, 7: (120 + 110) / 2
    # = 115, 4: (90 + 200) / 2 = 145. The highest two, 4 and 9, give
    # 14:00 (90 + 130) / 2 = 110 and 15:00 (200 + 140) / 2 = 170. Day 3 (500) is not among
    # the last four.
    shapes = {9: {14: 130, 15: 140}, 7: {14: 120, 15: 110}, 4: {14: 90, 15: 200}}
    shapes[3] = {14: 500, 15: 500}
    history = [day(d, at=shapes.get(d)) for d in range(EVENT_DAY)]
    calendar = Calendar(monday=0, holidays=frozenset({10}))
    result = x_of_y(rule(2, 4), day(EVENT_DAY), history, calendar, event_days={8})
    assert result.days_used == (9, 4)
    np.testing.assert_allclose(result.baseline_kw, [110.0, 170.0])
    np.testing.assert_array_equal(result.interval_start_min, [840, 900])


def test_a_missing_reading_makes_a_day_ineligible():
    # Day 11 lacks 03:00: the last two eligible are 10 and 9: (110 + 109) / 2 = 109.5.
    history = [day(d, 100.0 + d, missing=(3,) if d == 11 else ()) for d in range(EVENT_DAY)]
    result = x_of_y(rule(2, 2), day(EVENT_DAY), history)
    assert result.days_used == (10, 9)
    np.testing.assert_allclose(result.baseline_kw, [109.5, 109.5])


@pytest.mark.parametrize(
    ("estimated", "used", "kw"),
    [
        # 3 of 24 estimated is 12.5%, over 10%: day 11 out, (110 + 109) / 2 = 109.5
        ((1, 2, 3), (10, 9), 109.5),
        # 2 of 24 is 8.3%: day 11 in, (111 + 110) / 2 = 110.5
        ((1, 2), (11, 10), 110.5),
    ],
)
def test_too_many_estimated_intervals_make_a_day_ineligible(estimated, used, kw):
    history = [day(d, 100.0 + d, estimated=estimated if d == 11 else ()) for d in range(14)]
    result = x_of_y(rule(2, 2, max_estimated_share=0.1), day(EVENT_DAY), history)
    assert result.days_used == used
    np.testing.assert_allclose(result.baseline_kw, [kw, kw])


def test_the_lookback_limits_where_days_are_found():
    # Day 10 is an event day. 5 days back (9..13) hold the weekdays 11 and 9: too few for 3.
    # 7 days back (7..13) add 8 and 7: the last three are 11, 9, 8: (111 + 109 + 108) / 3.
    history = [day(d, 100.0 + d) for d in range(EVENT_DAY)]
    with pytest.raises(NoBaselineError, match=r"2 eligible days, 3 needed .*1 event days"):
        x_of_y(rule(3, 3, lookback_days=5), day(EVENT_DAY), history, event_days={10})
    result = x_of_y(rule(3, 3, lookback_days=7), day(EVENT_DAY), history, event_days={10})
    assert result.days_used == (11, 9, 8)
    np.testing.assert_allclose(result.baseline_kw, [328.0 / 3.0] * 2)


# --- X of Y: the day-of adjustment ---------------------------------------------------------


def adjusted(adjustment, cap_percent, window_kw, history_at=None):
    """Two baseline days (11, 10) at 100 kW (but `history_at`); the adjustment over 2 h
    ending 1 h before 14:00, so 11:00 and 12:00, where the event day reads `window_kw`."""
    r = rule(
        2,
        2,
        adjustment=adjustment,
        adjustment_hours=2.0,
        adjustment_lead_hours=1.0,
        cap_percent=cap_percent,
    )
    history = [day(d, at=history_at) for d in range(EVENT_DAY)]
    event = day(EVENT_DAY, at={11: window_kw[0], 12: window_kw[1]})
    return x_of_y(r, event, history)


@pytest.mark.parametrize(
    ("adjustment", "cap", "window_kw", "expected_kw", "factor", "offset_kw", "capped"),
    [
        # 110 / 100 = 1.1, inside +-20%: 100 * 1.1 = 110
        ("multiplicative", 20.0, (110, 110), 110.0, 1.1, 0.0, False),
        # 130 / 100 = 1.3, over +20%: held at 100 * 1.2 = 120
        ("multiplicative", 20.0, (130, 130), 120.0, 1.3, 0.0, True),
        # 70 / 100 = 0.7, under -20%: held at 100 * 0.8 = 80
        ("multiplicative", 20.0, (70, 70), 80.0, 0.7, 0.0, True),
        # no cap: 100 * 1.3 = 130
        ("multiplicative", None, (130, 130), 130.0, 1.3, 0.0, False),
        # (110 + 120) / 2 - 100 = +15 kW, inside +-20 kW: 115
        ("additive", 20.0, (110, 120), 115.0, 1.0, 15.0, False),
        # +15 kW over +-10% (10 kW): held at 110
        ("additive", 10.0, (110, 120), 110.0, 1.0, 15.0, True),
    ],
)
def test_each_adjustment_and_its_cap(
    adjustment, cap, window_kw, expected_kw, factor, offset_kw, capped
):
    result = adjusted(adjustment, cap, window_kw)
    np.testing.assert_allclose(result.baseline_kw, [expected_kw] * 2)
    np.testing.assert_allclose(result.unadjusted_kw, [100.0, 100.0])
    assert result.adjustment_factor == pytest.approx(factor)
    assert result.adjustment_kw == pytest.approx(offset_kw)
    assert result.capped is capped


def test_the_cap_holds_each_interval_to_its_own_unadjusted_baseline():
    # The baseline days draw 100 kW but 200 at 15:00. Additive: 130 - 100 = +30 kW gives
    # 130 and 230; +-20% holds 14:00 to 120 and leaves 230 (inside 160..240) as is.
    # Multiplicative: 1.3 gives 130 and 260, held to 120 and 240.
    result = adjusted("additive", 20.0, (130, 130), history_at={15: 200})
    np.testing.assert_allclose(result.baseline_kw, [120.0, 230.0])
    assert result.capped
    result = adjusted("multiplicative", 20.0, (130, 130), history_at={15: 200})
    np.testing.assert_allclose(result.baseline_kw, [120.0, 240.0])


def test_no_reading_in_the_adjustment_window_gives_no_baseline():
    with pytest.raises(NoBaselineError, match="adjustment window"):
        adjusted("multiplicative", 20.0, (110, NAN))


def test_presets_through_the_one_entry_point():
    # Day d draws 100 + d; weekdays 0..20 number 15, the last ten 18..14 and 11..7.
    # high5of10: the highest five are 18..14, mean 116; the event day reads 126 over
    # 11:00..13:00 (3 h ending 1 h before 14:00): +10 kW, 126.
    # 10of10: all ten, (114 + ... + 118 + 107 + ... + 111) / 10 = 1125 / 10 = 112.5; the
    # event day reads 123.75: 123.75 / 112.5 = 1.1 (inside 20%), 123.75.
    history = [day(d, 100.0 + d) for d in range(21)]
    for name, window_kw, expected_kw, used in [
        ("high5of10", 126.0, 126.0, (18, 17, 16, 15, 14)),
        ("10of10", 123.75, 123.75, (18, 17, 16, 15, 14, 11, 10, 9, 8, 7)),
    ]:
        event = day(21, at=dict.fromkeys((10, 11, 12), window_kw))
        result = baseline(
            preset(name), event, history, **EVENT, calendar=CALENDAR, event_days=frozenset()
        )
        assert result.days_used == used
        np.testing.assert_allclose(result.baseline_kw, [expected_kw] * 2)
        assert not result.capped


def test_the_presets_carry_the_programs_parameters():
    ten = PRESETS["10of10"]
    assert isinstance(ten, XOfYRule)
    assert (ten.x_days, ten.y_days, ten.adjustment) == (10, 10, "multiplicative")
    assert (ten.adjustment_hours, ten.adjustment_lead_hours, ten.cap_percent) == (3, 1, 20)
    assert PRESETS["10of10-40"] == XOfYRule(**{**vars(ten), "cap_percent": 40.0})
    high = PRESETS["high5of10"]
    assert isinstance(high, XOfYRule)
    assert (high.x_days, high.y_days, high.adjustment, high.cap_percent) == (
        5,
        10,
        "additive",
        None,
    )
    same = PRESETS["sameday-3+2"]
    assert isinstance(same, SameDayRule)
    assert (same.before_hours, same.after_hours, same.lead_hours) == (3, 2, 0)
    match = PRESETS["matchday-3"]
    assert isinstance(match, MatchDayRule)
    assert match.days == 3


def test_a_meter_before_rule_is_named_by_its_seconds():
    """`meterbefore-<S>s`: S seconds, at most a quarter of them (and at most 10 s) unread."""
    assert preset("meterbefore-60s") == MeterBeforeRule(window_s=60.0, max_gap_s=10.0)
    assert preset("meterbefore-20s") == MeterBeforeRule(window_s=20.0, max_gap_s=5.0)
    assert preset("meterbefore-3600s").window_s == 3600.0
    for name in ("meterbefore-0s", "meterbefore-3601s", "meterbefore-60", "meterbefore-1.5s"):
        assert not is_preset(name)
        with pytest.raises(InvalidBaselineError, match=r"is not one of 10of10, .*meterbefore-<S>s"):
            preset(name)
    with pytest.raises(InvalidBaselineError, match="meter-before rule reads the samples"):
        baseline(
            preset("meterbefore-60s"),
            day(EVENT_DAY),
            [],
            **EVENT,
            calendar=CALENDAR,
            event_days=frozenset(),
        )


# --- Same day, match day, meter before -----------------------------------------------------

AROUND = {10: 130, 11: 100, 12: 110, 13: 120, 16: 90, 17: 80}


def test_same_day_pools_the_hours_before_and_after():
    # 3 h before 14:00 (11, 12, 13) and 2 h after 16:00 (16, 17):
    # (100 + 110 + 120 + 90 + 80) / 5 = 100.
    result = same_day_baseline(preset("sameday-3+2"), day(EVENT_DAY, at=AROUND), **EVENT)
    np.testing.assert_allclose(result.baseline_kw, [100.0, 100.0])
    assert result.days_used == (EVENT_DAY,)


def test_same_day_with_a_lead():
    # Ending 1 h before 14:00: 10, 11, 12 and 16, 17: (130 + 100 + 110 + 90 + 80) / 5 = 102.
    r = SameDayRule(before_hours=3.0, after_hours=2.0, lead_hours=1.0, max_estimated_share=0.0)
    result = same_day_baseline(r, day(EVENT_DAY, at=AROUND), **EVENT)
    np.testing.assert_allclose(result.baseline_kw, [102.0, 102.0])


def test_same_day_needs_its_readings():
    r = preset("sameday-3+2")
    with pytest.raises(NoBaselineError, match="no reading"):
        same_day_baseline(r, day(EVENT_DAY, at=AROUND, missing=(17,)), **EVENT)
    # one of the five estimated: over 10%, within 20%
    estimated = day(EVENT_DAY, at=AROUND, estimated=(16,))
    with pytest.raises(NoBaselineError, match="estimated"):
        same_day_baseline(r, estimated, **EVENT)
    lenient = SameDayRule(
        before_hours=3.0, after_hours=2.0, lead_hours=0.0, max_estimated_share=0.2
    )
    np.testing.assert_allclose(same_day_baseline(lenient, estimated, **EVENT).baseline_kw, 100.0)


def test_match_day_takes_the_days_closest_before_the_event():
    # matchday-3: the window is 3 h ending 1 h before 14:00 (10, 11, 12), where the event day
    # reads 100 each hour. Mean absolute differences: day 11 (100, 104, 100): 4/3; day 9
    # (90 x3): 10; day 7 (101, 99, 100): 2/3; day 4 (120 x3): 20; day 3 (100 x3): 0.
    # Closest three: 3, 7, 11, drawing 50, 60, 70 at the event: 60.
    window = {
        11: (100, 104, 100, 70),
        9: (90, 90, 90, 500),
        7: (101, 99, 100, 60),
        4: (120, 120, 120, 500),
        3: (100, 100, 100, 50),
    }
    history = [day(d, at={10: a, 11: b, 12: c, 14: e, 15: e}) for d, (a, b, c, e) in window.items()]
    r = preset("matchday-3")
    result = match_day_baseline(
        r, day(EVENT_DAY), history, **EVENT, calendar=CALENDAR, event_days=frozenset()
    )
    assert result.days_used == (11, 7, 3)
    np.testing.assert_allclose(result.baseline_kw, [60.0, 60.0])
    with pytest.raises(NoBaselineError, match="2 eligible days, 3 needed"):
        match_day_baseline(
            r, day(EVENT_DAY), history, **EVENT, calendar=CALENDAR, event_days={3, 7, 11}
        )


def test_meter_before_is_the_mean_of_the_seconds_before_the_trigger():
    # Readings each second; the 5 s before t = 10 are t = 5..9: (10 + 20 + 30 + 40 + 50) / 5
    # = 30. The reading at the trigger (1000) is not before it.
    times = list(range(11))
    loads = [0, 0, 0, 0, 0, 10, 20, 30, 40, 50, 1000]
    result = meter_before(times, loads, trigger_s=10.0, window_s=5.0, max_gap_s=1.0)
    assert result.baseline_kw == pytest.approx(30.0)
    assert result.samples == 5
    del times[7], loads[7]  # 2 s from t = 6 to t = 8 with no reading
    with pytest.raises(NoBaselineError, match="2 s without a reading"):
        meter_before(times, loads, trigger_s=10.0, window_s=5.0, max_gap_s=1.5)
    with pytest.raises(NoBaselineError, match="no reading"):
        meter_before(times, loads, trigger_s=30.0, window_s=5.0, max_gap_s=10.0)


# --- Daylight saving -----------------------------------------------------------------------


def local_grid(zone, first, days, load_at):
    """Hourly UTC intervals over `days` local days from `first`, their offsets from the zone
    database, and `load_at(local datetime)` for each."""
    tz = ZoneInfo(zone)
    start = datetime(first.year, first.month, first.day, tzinfo=tz)
    end = start + timedelta(days=days)  # wall-clock arithmetic: local midnight
    starts = list(range(int(start.timestamp()), int(end.timestamp()), 3600))
    local = [datetime.fromtimestamp(t, tz) for t in starts]
    offsets = [int(moment.utcoffset().total_seconds()) for moment in local]
    return local_days(starts, offsets, [load_at(m) for m in local], interval_min=60)


def day_index(d):
    return d.toordinal() - date(1970, 1, 1).toordinal()


EVERY_DAY_ALIKE = Calendar(weekend=frozenset())


@pytest.mark.parametrize(
    ("zone", "spring_forward", "skipped_hour"),
    [("America/New_York", date(2026, 3, 8), 2), ("Europe/London", date(2026, 3, 29), 1)],
)
def test_the_hour_skipped_at_spring_forward_has_no_baseline(zone, spring_forward, skipped_hour):
    # Every hour draws 100 + its local hour. The event covers the skipped hour and the ones
    # either side; the three days before give 100 + h for those that happened.
    first = spring_forward - timedelta(days=3)
    days = local_grid(zone, first, 4, lambda moment: 100.0 + moment.hour)
    event = days[-1]
    assert event.day == day_index(spring_forward)
    assert event.occurrences.sum() == 23
    assert event.occurrences[skipped_hour] == 0
    h = skipped_hour
    result = x_of_y_baseline(
        rule(3, 3),
        event,
        days[:-1],
        start_min=(h - 1) * 60,
        end_min=(h + 2) * 60,
        calendar=EVERY_DAY_ALIKE,
        event_days=(),
    )
    np.testing.assert_allclose(result.baseline_kw, [99.0 + h, NAN, 101.0 + h])
    assert result.no_baseline_min == (h * 60,)


def fall_back_load(moment):
    """100 + the local hour, but 140 and 160 in the first and second 01:00 of 1 Nov 2026."""
    if (moment.month, moment.day, moment.hour) == (11, 1, 1):
        return 160.0 if moment.fold else 140.0
    return 100.0 + moment.hour


def test_the_hour_repeated_at_fall_back_is_the_mean_of_both():
    days = local_grid("America/New_York", date(2026, 10, 29), 5, fall_back_load)
    fall_back = days[3]
    assert fall_back.day == day_index(date(2026, 11, 1))
    assert fall_back.occurrences[1] == 2
    assert fall_back.load_kw[1] == pytest.approx(150.0)  # (140 + 160) / 2
    # An event at 01:00 on the fall-back day: the days before drew 101 then.
    at_fall_back = x_of_y_baseline(
        rule(3, 3),
        fall_back,
        days[:3],
        start_min=60,
        end_min=120,
        calendar=EVERY_DAY_ALIKE,
        event_days=(),
    )
    np.testing.assert_allclose(at_fall_back.baseline_kw, [101.0])
    assert at_fall_back.occurrences.tolist() == [2]
    # The day after counts the fall-back day's 01:00 as 150: (101 * 3 + 150) / 4 = 113.25.
    after = x_of_y_baseline(
        rule(4, 4),
        days[4],
        days[:4],
        start_min=60,
        end_min=180,
        calendar=EVERY_DAY_ALIKE,
        event_days=(),
    )
    np.testing.assert_allclose(after.baseline_kw, [113.25, 102.0])


def test_a_repeated_hour_with_one_reading_missing_is_missing():
    def load(moment):
        missing = (moment.month, moment.day, moment.hour, moment.fold) == (11, 1, 1, 1)
        return NAN if missing else 100.0

    fall_back = local_grid("America/New_York", date(2026, 11, 1), 1, load)[0]
    assert math.isnan(fall_back.load_kw[1])
    assert not fall_back.is_complete(max_estimated_share=1.0)


# --- Properties ----------------------------------------------------------------------------


@given(
    interval_min=st.sampled_from(INTERVAL_MINUTES),
    load_kw=st.floats(0.0, 1e5),
    y_days=st.integers(1, 5),
    event_days=st.sets(st.integers(0, 9), max_size=4),
    start_hour=st.integers(4, 20),
)
def test_all_of_constant_days_without_adjustment_give_the_constant(
    interval_min, load_kw, y_days, event_days, start_hour
):
    size = 1440 // interval_min
    history = [meter_day(d, [load_kw] * size, interval_min=interval_min) for d in range(10)]
    event = meter_day(10, [0.0] * size, interval_min=interval_min)
    assume(10 - len(event_days) >= y_days)
    r = rule(y_days, y_days, lookback_days=10)
    result = x_of_y_baseline(
        r,
        event,
        history,
        start_min=start_hour * 60,
        end_min=start_hour * 60 + 3 * interval_min,
        calendar=EVERY_DAY_ALIKE,
        event_days=event_days,
    )
    np.testing.assert_allclose(result.baseline_kw, load_kw)
    assert not set(result.days_used) & event_days


@given(
    loads=st.lists(st.lists(st.floats(1.0, 1e4), min_size=24, max_size=24), min_size=3, max_size=3),
    window_kw=st.tuples(st.floats(0.0, 1e5), st.floats(0.0, 1e5)),
    adjustment=st.sampled_from(("multiplicative", "additive")),
    cap_percent=st.floats(0.0, 100.0),
)
def test_an_adjusted_baseline_stays_within_its_cap(loads, window_kw, adjustment, cap_percent):
    history = [meter_day(d, shape, interval_min=60) for d, shape in enumerate(loads)]
    event = meter_day(3, [100.0] * 11 + list(window_kw) + [100.0] * 11, interval_min=60)
    r = rule(
        3,
        3,
        adjustment=adjustment,
        adjustment_hours=2.0,
        adjustment_lead_hours=1.0,
        cap_percent=cap_percent,
    )
    result = x_of_y(r, event, history, EVERY_DAY_ALIKE)
    share = cap_percent / 100.0
    tolerance = 1e-9 * result.unadjusted_kw
    assert (result.baseline_kw >= result.unadjusted_kw * (1 - share) - tolerance).all()
    assert (result.baseline_kw <= result.unadjusted_kw * (1 + share) + tolerance).all()


# --- Bad parameters, refused by name -------------------------------------------------------

X_OF_Y = vars(rule(3, 5))


def event_baseline(**changes):
    """The X-of-Y baseline of a day of flat history, with `changes` to rule or event."""
    rule_changes = {k: v for k, v in changes.items() if k in X_OF_Y}
    window = {**EVENT, **{k: v for k, v in changes.items() if k in EVENT}}
    history = [day(d) for d in range(EVENT_DAY)]
    return x_of_y_baseline(
        rule(3, 5, **rule_changes),
        day(EVENT_DAY),
        history,
        **window,
        calendar=CALENDAR,
        event_days=(),
    )


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda: rule(11, 10), "x_days"),
        (lambda: rule(0, 10), "x_days"),
        (lambda: rule(3, 10, lookback_days=9), "lookback_days"),
        (lambda: rule(3, 10, adjustment="ratio"), "adjustment"),
        (lambda: rule(3, 10, adjustment_hours=-1.0), "adjustment_hours"),
        (lambda: rule(3, 10, adjustment="additive"), "adjustment_hours"),
        (lambda: rule(3, 10, adjustment_lead_hours=math.nan), "adjustment_lead_hours"),
        (lambda: rule(3, 10, cap_percent=-5.0), "cap_percent"),
        (lambda: rule(3, 10, max_estimated_share=1.5), "max_estimated_share"),
        (lambda: preset("10of11"), "preset"),
        (lambda: SameDayRule(0.0, 0.0, 0.0, 0.1), "before_hours"),
        (lambda: SameDayRule(-3.0, 2.0, 0.0, 0.1), "before_hours"),
        (lambda: MatchDayRule(0, 3.0, 1.0, 45, 0.1), "days"),
        (lambda: MatchDayRule(3, 0.0, 1.0, 45, 0.1), "match_hours"),
        (lambda: meter_day(0, [1.0] * 24, interval_min=7), "interval_min"),
        (lambda: meter_day(0, [1.0] * 23, interval_min=60), "load_kw"),
        (lambda: event_baseline(start_min=845), "start_min"),
        (lambda: event_baseline(start_min=840.5), "start_min"),
        (lambda: event_baseline(end_min=1500), "end_min"),
        (lambda: event_baseline(end_min=840), "end_min"),
        (
            lambda: event_baseline(adjustment="additive", adjustment_hours=0.25),
            "adjustment_hours",
        ),
        (
            lambda: local_days([0, 3600], [19800, 19800], [1.0, 1.0], interval_min=60),
            "utc_offset_s",
        ),
        (lambda: local_days([0, 7200], [0, 0], [1.0, 1.0], interval_min=60), "start_utc_s"),
        (
            lambda: meter_before([0.0], [1.0], trigger_s=1.0, window_s=0.0, max_gap_s=1.0),
            "window_s",
        ),
        (lambda: Calendar(weekend=frozenset({7})), "weekend"),
        (lambda: MeterBeforeRule(0.0, 1.0), "window_s"),
        (lambda: MeterBeforeRule(10.0, 11.0), "max_gap_s"),
    ],
)
def test_bad_parameters_are_refused_by_name(make, name):
    with pytest.raises(InvalidBaselineError, match=rf"\b{name}\b") as caught:
        make()
    assert isinstance(caught.value, FlexModelError)


def test_days_of_another_interval_length_are_refused():
    history = [meter_day(d, [1.0] * 96, interval_min=15) for d in range(EVENT_DAY)]
    with pytest.raises(InvalidBaselineError, match="interval_min 15"):
        x_of_y(rule(3, 3), day(EVENT_DAY), history)


def test_an_adjustment_window_before_midnight_gives_no_baseline():
    r = rule(2, 2, adjustment="multiplicative", adjustment_hours=3.0, adjustment_lead_hours=1.0)
    history = [day(d) for d in range(EVENT_DAY)]
    with pytest.raises(NoBaselineError, match="midnight"):
        x_of_y_baseline(
            r, day(EVENT_DAY), history, start_min=120, end_min=240, calendar=CALENDAR, event_days=()
        )


def test_a_day_the_grid_covers_in_part_is_incomplete():
    # UTC, hourly from 06:00 on day 0 to 17:00 on day 1: day 0 lacks 00:00..05:00, day 1
    # 18:00..23:00; both count those hours once, with no reading.
    starts = list(range(6 * 3600, 42 * 3600, 3600))
    first, last = local_days(starts, [0] * len(starts), [1.0] * len(starts), interval_min=60)
    assert (first.day, last.day) == (0, 1)
    assert first.occurrences.tolist() == [1] * 24
    np.testing.assert_array_equal(np.isnan(first.load_kw), [True] * 6 + [False] * 18)
    np.testing.assert_array_equal(np.isnan(last.load_kw), [False] * 18 + [True] * 6)
    assert not first.is_complete(1.0)
    assert not last.is_complete(1.0)


# --- An event across midnight: day 14 from 22:00 to day 15 (a Tuesday) at 02:00 ----------


def test_a_later_day_takes_the_first_days_adjustment_capped_on_its_own():
    # Day 14's part, 22:00-24:00: three weekdays at 100; the window 18:00-21:00 reads 130: a
    # factor 1.3, capped at 20%: 120. Day 15's part, 00:00-02:00, on its own eligible days
    # (14 is the event's, so 11, 10, 9 at 50 kW): 50 x 1.3 = 65, capped at 60.
    adjusted = rule(3, 3, adjustment="multiplicative", adjustment_hours=3.0)
    adjusted = XOfYRule(**{**vars(adjusted), "adjustment_lead_hours": 1.0, "cap_percent": 20.0})
    history = [day(d, 100.0) for d in range(EVENT_DAY)]
    first_day = day(EVENT_DAY, at=dict.fromkeys((18, 19, 20), 130.0))
    first = x_of_y_baseline(
        adjusted,
        first_day,
        history,
        start_min=22 * 60,
        end_min=1440,
        calendar=CALENDAR,
        event_days=frozenset({EVENT_DAY, 15}),
    )
    assert first.adjustment_factor == pytest.approx(1.3)
    np.testing.assert_allclose(first.baseline_kw, [120.0, 120.0])
    later_history = [day(d, 50.0) for d in range(EVENT_DAY)] + [first_day]
    later = x_of_y_baseline(
        adjusted,
        day(15, 40.0),
        later_history,
        start_min=0,
        end_min=120,
        calendar=CALENDAR,
        event_days=frozenset({EVENT_DAY, 15}),
        adjusted_as=first,
    )
    assert later.days_used == (11, 10, 9)
    assert later.adjustment_factor == pytest.approx(1.3)
    np.testing.assert_allclose(later.unadjusted_kw, [50.0, 50.0])
    np.testing.assert_allclose(later.baseline_kw, [60.0, 60.0])
    assert later.capped


def test_a_same_day_level_reads_the_start_days_hours_before_and_the_end_days_after():
    # 3 h before 22:00 on day 14 (19, 20, 21 at 120, 110, 100) and 2 h from 02:00 on day 15
    # (02, 03 at 90, 80): (120 + 110 + 100 + 90 + 80) / 5 = 100, for each day's part.
    first_day = day(EVENT_DAY, at={19: 120.0, 20: 110.0, 21: 100.0})
    last_day = day(15, at={2: 90.0, 3: 80.0})
    bounds = {"starts_on": (first_day, 22 * 60), "ends_on": (last_day, 120)}
    rule_3_2 = preset("sameday-3+2")
    for part, start_min, end_min in ((first_day, 22 * 60, 1440), (last_day, 0, 120)):
        result = same_day_baseline(rule_3_2, part, start_min=start_min, end_min=end_min, **bounds)
        np.testing.assert_allclose(result.baseline_kw, [100.0, 100.0])
        assert result.days_used == (15, EVENT_DAY)
    # An event ending at midnight reads its hours after on the next day: 00, 01 at 70, 50.
    ends_at_midnight = {"ends_on": (day(15, at={0: 70.0, 1: 50.0}), 0)}
    result = same_day_baseline(
        rule_3_2, first_day, start_min=22 * 60, end_min=1440, **ends_at_midnight
    )
    np.testing.assert_allclose(result.baseline_kw, [90.0, 90.0])  # (330 + 120) / 5


def test_a_match_day_gives_no_baseline_for_a_later_day():
    history = [day(d) for d in range(EVENT_DAY)]
    first = baseline(
        preset("matchday-3"),
        day(EVENT_DAY),
        history,
        start_min=22 * 60,
        end_min=1440,
        calendar=CALENDAR,
        event_days=frozenset(),
    )
    with pytest.raises(NoBaselineError, match="matched on the hours before the event's start"):
        baseline(
            preset("matchday-3"),
            day(15),
            history,
            start_min=0,
            end_min=120,
            calendar=CALENDAR,
            event_days=frozenset(),
            adjusted_as=first,
        )
