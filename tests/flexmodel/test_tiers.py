"""Flexibility tiers: tolerated slowdown -> throughput floor and protection, in the allocator."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flexmodel.allocate import allocate_mix
from flexmodel.errors import InvalidJobError
from flexmodel.jobmix import parse_job_mix
from flexmodel.tiers import DEFAULT_TIERS, TierTable

slowdowns = st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6).map(lambda s: tuple(sorted(s)))


def test_the_default_tiers_by_hand():
    assert [DEFAULT_TIERS.floor(t) for t in range(4)] == pytest.approx([1.0, 0.9, 0.75, 0.5])
    assert [DEFAULT_TIERS.protected(t) for t in range(4)] == [True, False, False, False]
    duration = TierTable(reading="duration")
    assert [duration.floor(t) for t in range(4)] == pytest.approx([1.0, 1 / 1.1, 0.8, 2 / 3])


@given(slowdowns, st.sampled_from(["throughput", "duration"]))
def test_a_tier_that_tolerates_more_keeps_no_more(values, reading):
    table = TierTable(values, reading)
    floors = [table.floor(t) for t in range(table.count)]
    assert all(0.0 <= f <= 1.0 for f in floors)
    assert floors == sorted(floors, reverse=True)
    for t, s in enumerate(values):
        assert table.protected(t) == (s == 0.0)
        # 1 / (1 + s) >= 1 - s: the duration reading is never the harsher one
        assert TierTable(values, "duration").floor(t) >= TierTable(values).floor(t) - 1e-12
        assert table.floor(t) == pytest.approx(1 - s if reading == "throughput" else 1 / (1 + s))


@pytest.mark.parametrize(
    ("slowdowns", "reading", "words"),
    [
        ((), "throughput", "at least one tier"),
        ((0.0, 25.0), "throughput", "0.25 for 25 %"),
        ((0.0, 0.5, 0.25), "throughput", "at least the slowdown"),
        ((0.0, -0.1), "throughput", "from 0 to 1"),
        ((0.0, 0.1), "time", "throughput, duration"),
    ],
)
def test_bad_tier_tables_are_refused_naming_the_problem(slowdowns, reading, words):
    with pytest.raises(InvalidJobError, match=words):
        TierTable(slowdowns, reading)


def job(ident, node, tier=None, **extra):
    doc = {
        "id": ident,
        "gpus": 8,
        "power_w": 650.0,
        "throughput": 8000.0,
        "placement": [{"node": node, "gpus": list(range(8))}],
        **extra,
    }
    return doc if tier is None else {**doc, "tier": tier}


@given(
    tiers=st.lists(st.integers(0, 3), min_size=1, max_size=5),
    share=st.floats(0.0, 1.0),
    reading=st.sampled_from(["throughput", "duration"]),
)
def test_the_allocator_keeps_every_job_at_or_above_its_tiers_floor(tiers, share, reading):
    table = TierTable(reading=reading)
    mix = parse_job_mix(
        {"jobs": [job(f"j{i}", f"n{i}", t) for i, t in enumerate(tiers)]}, tiers=table
    )
    most_kw = mix.problem.max_cut_w.sum() / 1000.0
    doc = allocate_mix(mix, share * most_kw)
    for t, answer, parsed in zip(tiers, doc["jobs"], mix.jobs, strict=True):
        assert parsed.tier == t
        assert answer["throughput_fraction"] >= table.floor(t) - 1e-6
        if t == 0:
            assert answer["cap_w"] == pytest.approx(parsed.max_cap_w)  # tier 0: never capped


def test_a_jobs_own_bounds_count_when_stricter_than_its_tier():
    mix = parse_job_mix(
        {
            "jobs": [
                job("strict", "n1", 3, min_throughput_fraction=0.8),
                job("loose", "n2", 1, min_throughput_fraction=0.2),
                job("kept", "n3", 3, protected=True),
                job("untagged", "n4", min_throughput_fraction=0.3),
            ]
        }
    )
    got = {j.id: (j.min_throughput_fraction, j.protected, j.tier) for j in mix.jobs}
    assert got == {
        "strict": (0.8, False, 3),
        "loose": (pytest.approx(0.9), False, 1),
        "kept": (0.5, True, 3),
        "untagged": (0.3, False, None),
    }


@pytest.mark.parametrize("bad", [4, -1, 1.5, "2", True])
def test_a_tier_outside_the_table_is_refused_naming_the_job(bad):
    words = "job 'a': 'tier' must be a whole number from 0 to 3"
    with pytest.raises(InvalidJobError, match=words):
        parse_job_mix({"jobs": [job("a", "n1", bad)]})
    two = TierTable((0.0, 0.5))
    with pytest.raises(InvalidJobError, match="from 0 to 1"):
        parse_job_mix({"jobs": [job("a", "n1", 2)]}, tiers=two)
