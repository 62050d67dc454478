"""The one job-mix reader: text in, a `JobMix` or one error naming the source and field."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexmodel.errors import FlexModelError, InvalidJobError
from flexmodel.jobmix import parse_job_mix, parse_job_mix_json

JOB = {"id": "a", "gpus": 8, "power_w": 600.0, "throughput": 20000.0, "pfi": 1.5}


def test_text_gives_the_mix_the_decoded_document_gives():
    doc = {"overhead_factor": 1.3, "jobs": [JOB]}
    assert parse_job_mix_json(json.dumps(doc), source="site.json") == parse_job_mix(doc)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"jobs": [', "site.json: invalid JSON at line 1 column 11"),
        ('{"jobs": [], "overhead_factor": NaN}', "site.json: NaN is not a number JSON allows"),
        ('{"jobs": [], "static_load_kw": Infinity}', "site.json: Infinity is not a number"),
        ('{"jobs": [], "static_load_kw": -Infinity}', "site.json: -Infinity is not a number"),
    ],
)
def test_text_that_is_not_json_is_refused_naming_the_source(text, message):
    with pytest.raises(FlexModelError, match=message):
        parse_job_mix_json(text, source="site.json")


def test_a_bad_field_is_named_after_the_source():
    doc = {"jobs": [{**JOB, "gpus": 0}]}
    with pytest.raises(InvalidJobError, match=r"^site.json: job 'a': 'gpus' must be a whole"):
        parse_job_mix_json(json.dumps(doc), source="site.json")


def _mix(**changes):
    return {"jobs": [{**JOB, **changes}]}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (_mix(power_w=0.662), r"'power_w' must be from 50 to 2000 W, got 0.662 \(.*kW: 662 W\?\)"),
        (_mix(power_w=2500.0, max_cap_w=2500.0), "'max_cap_w' must be from 50 to 2000 W, got 2500"),
        (_mix(max_cap_w=0.7), r"'max_cap_w' must be from 50 to 2000 W, got 0.7 \(.*700 W\?\)"),
        (_mix(min_cap_w=20.0), "'min_cap_w' must be from 50 to 2000 W, got 20"),
        (_mix(throughput=0.0), "'throughput' must be above 0 tokens/s, got 0"),
        (
            _mix(period_s=6200.0),
            r"'period_s' must be from 0.01 to 3600 s, got 6200 \(.*ms: 6.2 s\?\)",
        ),
        (_mix(period_s=0.001), "'period_s' must be from 0.01 to 3600 s, got 0.001"),
        (_mix(duty=80.0), r"'duty' must be above 0 and at most 1, got 80 \(.*percent: 0.8\?\)"),
        (_mix(comm_power_fraction=50), r"'comm_power_fraction' must be from 0 to 1, got 50"),
        (_mix(min_throughput_fraction=-0.1), "'min_throughput_fraction' must be from 0 to 1"),
        (_mix(gpus=1_000_000), "'gpus' must be a whole number from 1 to 100,000, got 1000000"),
        (_mix(remaining_s=-1.0), "'remaining_s' must be at least 0 s, got -1"),
        (_mix(pfi=135.0), "'pfi' must be from 0.5 to 10, got 135"),
        (_mix(pfi=0.2), "'pfi' must be from 0.5 to 10, got 0.2"),
        (_mix(static_share=15.0), "'static_share' must be from 0 to 0.6, got 15"),
        (_mix(exponent=0.1), "'exponent' must be from 0.5 to 5, got 0.1"),
        (_mix(pfi_grid_w=[0.2, 0.7]), "'pfi_grid_w' must be from 50 to 2000 W, got 0.2"),
        (
            _mix(sweep=[{"cap_w": 0.3, "power_w": 290.0, "throughput": 15000.0}]),
            r"sweep\[0\]: 'cap_w' must be from 50 to 2000 W",
        ),
        ({**_mix(), "overhead_factor": 130.0}, "'overhead_factor' must be from 1 to 3, got 130"),
        ({**_mix(), "static_load_kw": 8e7}, "'static_load_kw' must be from 0 to 1e\\+06 kW"),
    ],
)
def test_implausible_magnitudes_are_refused_with_the_unit(doc, message):
    with pytest.raises(InvalidJobError, match=message):
        parse_job_mix(doc)


@pytest.mark.parametrize(
    "changes",
    [
        {"power_w": 50.0, "min_cap_w": 50.0, "max_cap_w": 2000.0},
        {"power_w": 2000.0, "max_cap_w": 2000.0},
        {"period_s": 0.01},
        {"period_s": 3600.0},
        {"gpus": 100_000},
        {"remaining_s": 0.0},
        {"duty": 1.0, "comm_power_fraction": 0.0, "min_throughput_fraction": 1.0},
        {"pfi": 0.6},
        {"pfi": 10.0},
        {"static_share": 0.0, "exponent": 0.5},
        {"static_share": 0.6, "exponent": 5.0},
    ],
)
def test_values_at_the_edges_of_the_ranges_are_accepted(changes):
    job = parse_job_mix(_mix(**changes)).jobs[0]
    assert all(getattr(job, name) == value for name, value in changes.items())


def _placed(ident, node, gpus):
    return {**JOB, "id": ident, "gpus": len(gpus), "placement": [{"node": node, "gpus": gpus}]}


def test_two_jobs_on_one_gpu_are_refused_naming_both_the_node_and_the_gpus():
    doc = {
        "jobs": [
            _placed("a", "node-01", list(range(8))),
            _placed("b", "node-02", list(range(8))),
            _placed("c", "node-01", [6, 7]),
        ]
    }
    message = r"^job mix: jobs 'a' and 'c' are both placed on node 'node-01' GPU\(s\) 6, 7"
    with pytest.raises(InvalidJobError, match=message):
        parse_job_mix(doc)
    with pytest.raises(InvalidJobError, match=f"^site.json: {message[1:]}"):
        parse_job_mix_json(json.dumps(doc), source="site.json")


def test_jobs_sharing_a_node_on_different_gpus_are_accepted():
    doc = {"jobs": [_placed("a", "node-01", [0, 1, 2, 3]), _placed("b", "node-01", [4, 5, 6, 7])]}
    assert [j.id for j in parse_job_mix(doc).placed] == ["a", "b"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.sampled_from(["n1", "n2"]), st.integers(0, 3)), min_size=1),
        min_size=1,
        max_size=4,
    )
)
def test_a_mix_is_refused_exactly_when_some_gpu_holds_two_jobs(slots_per_job):
    jobs = []
    for i, slots in enumerate(slots_per_job):
        by_node: dict[str, list[int]] = {}
        for node, gpu in dict.fromkeys(slots):
            by_node.setdefault(node, []).append(gpu)
        placement = [{"node": n, "gpus": g} for n, g in by_node.items()]
        gpus = sum(len(g) for g in by_node.values())
        jobs.append({**JOB, "id": f"j{i}", "gpus": gpus, "placement": placement})
    held = [(p["node"], g) for j in jobs for p in j["placement"] for g in p["gpus"]]
    if len(set(held)) == len(held):
        assert len(parse_job_mix({"jobs": jobs}).placed) == len(jobs)
    else:
        with pytest.raises(InvalidJobError, match="are both placed on node"):
            parse_job_mix({"jobs": jobs})


RANGES = [("period_s", (0.01, 3600.0), "s"), ("power_w", (50.0, 2000.0), "W")]


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(RANGES).flatmap(
        lambda field: st.tuples(
            st.just(field),
            st.one_of(
                st.floats(*field[1]), st.floats(min_value=-1e7, max_value=1e7, allow_nan=False)
            ),
        )
    )
)
def test_a_field_is_accepted_exactly_inside_its_range_and_refused_naming_its_unit(case):
    (name, (low, high), unit), value = case
    doc = _mix(**{name: value, "min_cap_w": 50.0, "max_cap_w": 2000.0})
    if low <= value <= high:
        assert getattr(parse_job_mix(doc).jobs[0], name) == value
    else:
        with pytest.raises(
            InvalidJobError, match=f"'{name}' must be from {low:g} to {high:g} {unit}"
        ):
            parse_job_mix(doc)
