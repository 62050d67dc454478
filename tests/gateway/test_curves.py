"""Measured curves: the fit recovers a known curve within its stated error, and planners and
quotes given measured curves do better than on the fleet's default PFI."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.irregularity import Irregularity
from flexgate.lab.probesim import run_probe
from flexmodel.allocate import allocate_mix
from flexmodel.curves import FamilyShape, family_point, operating_point, throughput_at_power
from flexmodel.jobmix import parse_job_mix
from flexmodel.pfi import grid_matrix, pfi_of_sweep, solve_insensitive_share
from flexmodel.pficarry import pfi_on_own_grid
from flexmodel.quote import quote
from gateway.services.curvefit import fit_points, fit_probe_levels
from gateway.services.curveinforce import fields_in_force, verdict
from gateway.services.curves import points_of
from gateway.services.probecaps import probe_caps
from gateway.settings import GatewaySettings


def job_doc(job_id: str, pfi: float, period_s: float, power_w: float = 640.0) -> dict:
    return {
        "id": job_id,
        "gpus": 8,
        "power_w": power_w,
        "throughput": 20000.0,
        "pfi": pfi,
        "period_s": period_s,
        "duty": 0.8,
        "comm_power_fraction": 0.5,
        "min_throughput_fraction": 0.5,
        "placement": [{"node": f"node-{job_id}", "gpus": list(range(8))}],
    }


def measure(doc: dict, *, seed: int = 0, periods: float = 20.0, levels: int = 3):
    """Probe the job (as the gateway would, on its true curve) and fit what the agent saw."""
    truth_mix = parse_job_mix({"jobs": [doc]})
    caps = probe_caps(truth_mix, 0, 0.75, levels)
    run = run_probe(doc, caps, periods=periods, seed=seed)
    points = points_of(run.reading, truth_mix.jobs[0], "probe", "now")
    return run, points, fit_points(points, name=doc["id"])


def true_pfi(run, grid_w) -> float:
    rows = [(c, *run.truth[c]) for c in grid_w]
    return pfi_of_sweep(rows).pfi


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
@given(
    pfi=st.floats(1.1, 2.6),
    period_s=st.floats(0.8, 3.0),
    seed=st.integers(0, 10_000),
)
def test_the_fit_recovers_a_known_curve_within_its_stated_error(pfi, period_s, seed):
    run, points, fit = measure(job_doc("j", pfi, period_s), seed=seed)
    # Every level measured but one that clips the job's power flat (no period: no point).
    assert len(points) >= 3
    assert points[-1]["cap_w"] == 700.0
    assert fit["pfi"] is not None, fit
    truth = true_pfi(run, fit["grid_w"])  # the PFI on the measured grid: nothing extrapolated
    assert abs(fit["pfi"] - truth) <= 3.0 * fit["pfi_stderr"] + 0.01, (fit, truth)
    # The uncapped level's own error, which firm kW carries once the curve is in force.
    assert fit["power_stderr_w"] == points[-1]["power_stderr_w"]


@pytest.mark.parametrize("rate_per_s", [-4e-4, 4e-4])
def test_a_probe_with_references_measures_the_drift_and_removes_it(rate_per_s):
    """A job whose pace drifts by 4e-4 a second (about 6% over the probe), probed as the
    gateway probes now (uncapped references after the second and the last cap) and fitted by
    `fit_probe_levels`: the drift read within its errors and the PFI within 2.5 of its
    standard errors of the truth on the probed grid. Stepped down once and fitted by the sweep
    rule alone, the same job reads the drift as throughput lost or kept: more than two errors
    off (2.8 +/- 0.24 against 2.2 where it speeds up)."""
    doc = job_doc("j", 2.0, 1.5)
    truth_mix = parse_job_mix({"jobs": [doc]})
    caps = probe_caps(truth_mix, 0, 0.75, 3)
    drifting = Irregularity(pace_drift_per_s=rate_per_s)
    run = run_probe(doc, caps, periods=20.0, seed=3, irregularity=drifting, reference_every=2)
    assert run.steps == [0, 1, 2, 0, 3, 0]
    assert [m["level"] for m in run.measured] == run.steps
    found = fit_probe_levels(
        run.measured, truth_mix.jobs[0].throughput, name="j", at="now", probe_id="p"
    )
    assert found is not None
    points, fit = found
    assert [p["cap_w"] for p in points] == sorted(set(run.caps_w))
    assert all(p["drift_corrected"] for p in points)
    drift = fit["drift"]
    assert drift["references"] == 3
    assert drift["throughput_per_s"] == pytest.approx(
        rate_per_s, abs=3 * drift["throughput_stderr_per_s"] + 5e-5
    )
    truth = true_pfi(run, fit["grid_w"])
    assert abs(fit["pfi"] - truth) <= 2.5 * fit["pfi_stderr"], (fit["pfi"], truth)
    once = run_probe(doc, caps, periods=20.0, seed=3, irregularity=drifting)
    plain = fit_points(points_of(once.reading, truth_mix.jobs[0], "probe", "now"), name="j")
    assert abs(plain["pfi"] - true_pfi(once, plain["grid_w"])) > 2 * plain["pfi_stderr"]


def test_a_probe_without_a_reference_and_a_capped_level_gives_no_drift_fit():
    level = {
        "cap_w": 700.0,
        "start_s": 0.0,
        "end_s": 10.0,
        "power_w": 600.0,
        "power_stderr_w": 1.0,
        "period_s": 1.0,
        "period_stderr_s": 0.01,
        "periods": 10.0,
    }
    assert fit_probe_levels([level], 1000.0, name="j", at="now", probe_id="p") is None
    no_period = level | {"cap_w": 500.0, "period_s": None}
    assert fit_probe_levels([level, no_period], 1000.0, name="j", at="now", probe_id="p") is None


def test_a_job_with_no_clear_period_gives_no_points():
    doc = job_doc("flat", 1.5, 2.0) | {"duty": 1.0}  # no communication phase: nothing repeats
    run, points, fit = measure(doc)
    assert run.reading.period_s is None
    assert run.reading.no_period_reason
    assert points == []
    assert fit["pfi"] is None
    assert verdict(fit, 0.15)


TRUE_PFI = {"a": 1.1, "b": 1.3, "c": 2.0, "d": 2.6}


def overlay(doc: dict, fit: dict, extension: str = "none") -> dict:
    """The job-mix fields a measured curve sets (as `JobCurves.in_force`)."""
    sweep = fit["sweep"]
    return doc | {
        "power_w": sweep[-1]["power_w"],
        "pfi": fit["pfi"],
        "pfi_stderr": fit["pfi_stderr"],
        "sweep": sweep,
        "sweep_extension": extension,
    }


@pytest.fixture(scope="module")
def mixes():
    truth = [job_doc(j, pfi, 1.2) for j, pfi in TRUE_PFI.items()]
    default = [{k: v for k, v in doc.items() if k != "pfi"} for doc in truth]
    measured, extended = [], []
    for i, (doc, declared) in enumerate(zip(truth, default, strict=True)):
        # 40 periods a level: the most flexible job's fit is good enough (se <= 0.15) with the
        # simulated GPUs slowing only while they compute (at 20 it is 0.18).
        _, _, fit = measure(doc, seed=i, periods=40.0)
        assert verdict(fit, 0.15) is None, fit
        measured.append(overlay(declared, fit))
        extended.append(overlay(declared, fit, "family"))
    return [parse_job_mix({"jobs": jobs}) for jobs in (truth, default, measured, extended)]


def true_outcome(truth, plan) -> tuple[float, float]:
    """(GPU power shed [W], throughput kept) on the true curves, under the plan's caps."""
    caps = np.array([job["cap_w"] for job in plan["jobs"]])
    power, thr, _ = operating_point(truth.curves, caps)
    gpus = truth.array("gpus")
    return float(np.sum(gpus * (truth.array("power_w") - power))), float(thr.sum())


def kept_at_true_shed(truth, belief, shed_w: float) -> float:
    """Throughput kept when the planner on `belief` is asked for what sheds `shed_w` on the
    true curves (the site loop at the meter corrects the request until it does)."""
    lo, hi = 0.0, 2.0 * shed_w
    for _ in range(40):
        asked = 0.5 * (lo + hi)
        plan = allocate_mix(belief, asked / 1000.0, strategy="optimal")
        got, kept = true_outcome(truth, plan)
        lo, hi = (asked, hi) if got < shed_w else (lo, asked)
    return kept


def test_a_planner_given_measured_curves_beats_the_same_planner_on_the_default_pfi(mixes):
    truth, default, measured, _ = mixes
    reach_w = 0.8 * float(measured.problem.max_cut_w.sum())  # within the probed range
    before = float(truth.array("throughput").sum())
    for share in (0.3, 0.6, 1.0):
        shed_w = share * reach_w
        on_measured = kept_at_true_shed(truth, measured, shed_w)
        on_default = kept_at_true_shed(truth, default, shed_w)
        oracle = kept_at_true_shed(truth, truth, shed_w)
        assert on_measured > on_default, (share, on_measured, on_default)
        # Measured curves close most of the gap from the default PFI to the true curves.
        assert (oracle - on_measured) <= 0.5 * (oracle - on_default), (share, before)


def test_below_the_probed_range_the_family_at_the_measured_pfi_plans_the_deeper_cut(mixes):
    """A probe reaches 75% of a job's throughput; its floor here is 50%. Extended by the
    fleet family at the measured PFI, the measured curves still beat the default PFI on a cut
    deeper than every probe reached, and the jobs give what their floor allows."""
    truth, default, measured, extended = mixes
    probed_reach_w = float(measured.problem.max_cut_w.sum())
    assert float(extended.problem.max_cut_w.sum()) > 1.5 * probed_reach_w
    shed_w = 1.4 * probed_reach_w
    on_extended = kept_at_true_shed(truth, extended, shed_w)
    on_default = kept_at_true_shed(truth, default, shed_w)
    oracle = kept_at_true_shed(truth, truth, shed_w)
    assert on_extended > on_default
    assert (oracle - on_extended) <= 0.5 * (oracle - on_default)


def test_a_fit_is_used_when_better_known_than_the_pfi_it_replaces():
    fit = {"pfi": 1.8, "pfi_stderr": 0.2}
    assert verdict(fit, 0.15, replaced_stderr=0.3) is None  # a prediction's 0.3: measured wins
    why = verdict(fit, 0.15, replaced_stderr=0.1)  # a declared PFI known to 0.1 stays
    assert "0.2 is above FLEXGATE_CURVE_MAX_PFI_STDERR=0.15" in why
    assert "not below the 0.1" in why
    assert verdict(fit, 0.25) is None


def test_a_fit_not_good_enough_is_weighed_with_the_pfi_it_would_replace():
    job = parse_job_mix({"jobs": [job_doc("w", 2.0, 1.0) | {"pfi_stderr": 0.3}]}).jobs[0]
    fit = {"pfi": 1.4, "pfi_stderr": 0.4, "grid_w": list(job.grid_w), "sweep": []}
    rule = {"max_stderr": 0.15, "extension": "family", "interpolation": "pchip"}
    fields, why = fields_in_force(job, fit, **rule)
    assert "not below the 0.3" in why  # the measured curve itself is not in force
    # Inverse-variance weights 1/0.09 and 1/0.16 (the same grid: nothing to carry over).
    assert fields["pfi"] == pytest.approx((2.0 / 0.09 + 1.4 / 0.16) / (1 / 0.09 + 1 / 0.16), 1e-3)
    assert fields["pfi_stderr"] == pytest.approx((1 / 0.09 + 1 / 0.16) ** -0.5, 1e-3)
    assert set(fields) == {"pfi", "pfi_stderr"}
    # Nothing to weigh against: a PFI declared without an error, a declared sweep; and no
    # weighing of an implausible fit or when told not to.
    exact = parse_job_mix({"jobs": [job_doc("x", 2.0, 1.0)]}).jobs[0]
    assert fields_in_force(exact, fit, **rule)[0] is None
    swept = parse_job_mix({"jobs": [_swept("s")]}).jobs[0]
    assert fields_in_force(swept, fit, **rule)[0] is None
    assert fields_in_force(job, fit | {"pfi": 40.0}, **rule)[0] is None
    assert fields_in_force(job, fit, **rule, combine=False)[0] is None
    # A good enough fit sets its curve, joined as told when planned on its points.
    good, why = fields_in_force(
        job, fit | {"pfi_stderr": 0.1, "sweep": [{"power_w": 600.0}]}, **rule, shape="points"
    )
    assert why is None
    assert good["sweep_interpolation"] == "pchip"
    assert good["sweep_extension"] == "family"
    assert "pfi_grid_w" not in good
    assert good["power_stderr_w"] is None  # a fit stored before it was kept: declared error
    measured, _ = fields_in_force(
        job,
        fit | {"pfi_stderr": 0.1, "sweep": [{"power_w": 600.0}], "power_stderr_w": 2.5},
        **rule,
        shape="points",
    )
    assert measured["power_stderr_w"] == 2.5


def test_a_measured_curve_is_planned_on_the_family_nearest_its_levels():
    """By default (`FLEXGATE_CURVE_SHAPE=family`) a fit in force is planned on the fleet
    family on its grid through its uncapped level, not on a cubic through its few noisy
    levels: the planner's curve is that of a family job of that grid and power, at the PFI
    whose curve is nearest the measured levels' throughputs (least squares: each level
    weighed by what it says, where Eq. 1's mean of ratios follows the shallow level's noise),
    with the fit's stated error. Here a family job of PFI 1.9 measured exactly but for 0.3%
    more throughput at its shallow level: Eq. 1 reads 1.94, the family nearest 1.91."""
    assert GatewaySettings.model_fields["curve_shape"].default == "family"
    doc = job_doc("f", 1.35, 1.0) | {"pfi_stderr": 0.3}
    job = parse_job_mix({"jobs": [doc]}).jobs[0]
    grid = [520.0, 610.0, 700.0]

    def family_at(pfi: float):
        family_doc = doc | {"pfi": pfi, "pfi_grid_w": grid}
        return parse_job_mix({"jobs": [family_doc]}).curves

    shape = FamilyShape.of(
        power_w=640.0, duty=0.8, comm_power_fraction=0.5, min_cap_w=200.0, max_cap_w=700.0
    )

    def levels_at(pfi: float) -> tuple[np.ndarray, np.ndarray]:
        m = solve_insensitive_share([pfi], grid_matrix([tuple(grid)]), shape)
        power, frac = family_point(np.array([grid]), shape, m)
        return power[0], 20000.0 * frac[0]

    power, thr = levels_at(1.9)
    thr = thr * np.array([1.0, 1.003, 1.0])
    levels = list(zip(grid, power, thr, strict=True))
    fit = {
        "pfi": pfi_of_sweep(levels).pfi,
        "pfi_stderr": 0.05,
        "grid_w": grid,
        "sweep": [{"cap_w": c, "power_w": p, "throughput": t} for c, p, t in levels],
    }
    assert fit["pfi"] == pytest.approx(1.95, abs=0.005)
    rule = {"max_stderr": 0.15, "extension": "family", "interpolation": "pchip"}
    fields, why = fields_in_force(job, fit, **rule)
    assert why is None
    assert fields["sweep_interpolation"] == "family"
    assert fields["pfi_grid_w"] == fit["grid_w"]
    assert fields["pfi_stderr"] == 0.05
    planned = parse_job_mix({"jobs": [doc | fields]}).curves

    def misfit(pfi: float) -> float:
        return float(np.sum((levels_at(pfi)[1][:2] - thr[:2]) ** 2))

    nearest = fields["pfi"]
    assert nearest == pytest.approx(1.91, abs=0.01)
    assert misfit(nearest) < min(misfit(nearest - 0.002), misfit(nearest + 0.002))
    for label in ("cap_w", "power_w", "throughput"):
        assert getattr(planned, label) == pytest.approx(getattr(family_at(nearest), label))
    # The points (as before, `FLEXGATE_CURVE_SHAPE=points`) pass through the shallow level,
    # its noise included, which the family does not.
    points, _ = fields_in_force(job, fit, **rule, shape="points")
    on_points = parse_job_mix({"jobs": [doc | points]}).curves
    assert operating_point(on_points, 610.0)[1][0] == pytest.approx(thr[1])
    assert abs(operating_point(planned, 610.0)[1][0] - thr[1]) > 20.0


def test_a_fit_whose_levels_the_family_cannot_bind_keeps_its_own_pfi():
    """A job declared with a waveform whose compute level (444 W: 400 W at duty 0.8 and
    communication at half) lies below every capped level measured (600 W) has no family PFI
    to fit there: its curve in force is planned at the fit's own PFI, and parses."""
    doc = job_doc("low", 1.35, 1.0, power_w=400.0) | {"pfi_stderr": 0.3}
    job = parse_job_mix({"jobs": [doc]}).jobs[0]
    levels = ((600.0, 390.0, 19800.0), (700.0, 400.0, 20000.0))
    fit = {
        "pfi": 1.5,
        "pfi_stderr": 0.05,
        "grid_w": [600.0, 700.0],
        "sweep": [{"cap_w": c, "power_w": p, "throughput": t} for c, p, t in levels],
    }
    fields, why = fields_in_force(
        job, fit, max_stderr=0.15, extension="family", interpolation="pchip"
    )
    assert why is None
    assert fields["pfi"] == 1.5
    assert parse_job_mix({"jobs": [doc | fields]}).curves.throughput[0, -1] == 20000.0


def _swept(job_id: str) -> dict:
    points = ((500.0, 460.0, 17000.0), (600.0, 560.0, 19500.0), (700.0, 660.0, 21000.0))
    return {
        "id": job_id,
        "gpus": 8,
        "power_w": 660.0,
        "throughput": 21000.0,
        "sweep": [{"cap_w": c, "power_w": p, "throughput": t} for c, p, t in points],
    }


def test_weighing_a_probe_with_a_prediction_beats_either_alone():
    """Family jobs of known PFI, probed (20 periods a level), each with a prediction
    known about as well as its probe (the rule weighs the two only then): the weighed PFI on
    the job's own grid lands nearer the truth, in root mean square over the jobs, than the
    prediction or the probe alone. It would not if the fit's stated error or its carrying to
    the job's grid were wrong."""
    rng = np.random.default_rng(4)
    errors: dict[str, list[float]] = {"predicted": [], "measured": [], "combined": []}
    for i, pfi in enumerate(np.linspace(1.15, 2.5, 24)):
        doc = job_doc(f"j{i}", float(pfi), 1.0 + 0.1 * (i % 5))
        _, _, fit = measure(doc, seed=i, periods=20.0)
        if fit["pfi"] is None:
            continue
        bare = parse_job_mix({"jobs": [doc]}).jobs[0]
        # Family jobs: the family is their shape, whose own error in carrying is then nil.
        on_own, se_own = pfi_on_own_grid(
            bare, fit["pfi"], fit["pfi_stderr"], tuple(fit["grid_w"]), shape_rel=0.0
        )
        stderr = min(se_own, fit["pfi_stderr"])  # the fit is never better known
        predicted = float(pfi + stderr * rng.standard_normal())
        job = parse_job_mix({"jobs": [doc | {"pfi": predicted, "pfi_stderr": stderr}]}).jobs[0]
        weighed, why = fields_in_force(
            job,
            fit,
            max_stderr=0.0,
            extension="family",
            interpolation="pchip",
            carry_shape_rel=0.0,
        )
        assert why is not None
        errors["predicted"].append(predicted - pfi)
        errors["measured"].append(on_own - pfi)
        errors["combined"].append(weighed["pfi"] - pfi)
    assert len(errors["combined"]) >= 20
    rms = {name: float(np.sqrt(np.mean(np.square(e)))) for name, e in errors.items()}
    assert rms["combined"] < min(rms["predicted"], rms["measured"]), rms


def test_firm_kw_carries_the_fitted_uncertainty(mixes):
    _, _, measured, _ = mixes
    doc = quote(measured, window_s=600.0, confidence=0.9)
    assert doc["firm_kw"] < doc["achievable_kw"]
    exact = parse_job_mix({"jobs": [{**_doc(job), "pfi_stderr": 1e-6} for job in measured.jobs]})
    assert quote(exact, window_s=600.0, confidence=0.9)["firm_kw"] > doc["firm_kw"]


def _doc(job) -> dict:
    return {
        "id": job.id,
        "gpus": job.gpus,
        "power_w": job.power_w,
        "throughput": job.throughput,
        "pfi": job.pfi,
        "sweep": [{"cap_w": c, "power_w": p, "throughput": t} for c, p, t in job.sweep],
        "period_s": job.period_s,
        "min_throughput_fraction": job.min_throughput_fraction,
    }


def test_a_measured_pfi_says_whether_it_shares_the_declared_one_s_grid():
    from datetime import UTC, datetime

    from gateway.services.curves import curve_doc
    from gateway.store.models import JobCurveRow

    doc = job_doc("c", 2.0, 1.2)  # declared on the study's grid for 8 GPUs
    _, points, fit = measure(doc, seed=3)
    row = JobCurveRow(
        job_id="c", at=datetime(2026, 1, 1, tzinfo=UTC), source="measured", points=points, fit=fit
    )
    shown = curve_doc(doc, row, verdict(fit, 0.15), None, extension="family", points=True)
    assert shown["declared"]["grid_w"] == [200.0, 300.0, 400.0, 500.0, 600.0, 700.0]
    assert shown["measured"]["grid_w"] == fit["grid_w"]
    assert shown["measured"]["same_grid_as_declared"] is False  # a probe within the floor
    assert shown["measured"]["extension"] == "family"
    assert shown["source"] == ("measured" if verdict(fit, 0.15) is None else "declared")
    assert shown["points"] == points


def test_a_level_measured_longer_replaces_the_one_kept():
    from gateway.services.curves import merged

    short = {"cap_w": 600.0, "power_w": 560.0, "throughput": 900.0, "periods": 5.0}
    long = short | {"power_w": 561.0, "periods": 20.0}
    other = short | {"cap_w": 500.0}
    assert merged([short], [long, other]) == [other, long]
    assert merged([long], [short]) == [long]


def test_a_probe_s_sm_clocks_give_the_job_s_own_shape_and_its_curve_in_force():
    """A job whose GPUs' power-to-clock shape is far from the fleet family's (static share
    0.08, exponent 2.0 against 0.15, 1.6), probed as the gateway probes: the SM clock at each
    level gives its static share and exponent within their stated errors, the curve in force
    takes them, and that curve is nearer the job's true curve over the probed range than the
    fleet family's through the same levels. The same levels without clocks give the family's
    shape and say why."""
    truth = job_doc("j", 1.8, 1.5) | {"static_share": 0.08, "exponent": 2.0}
    declared = {k: v for k, v in truth.items() if k not in ("pfi", "static_share", "exponent")}
    truth_mix = parse_job_mix({"jobs": [truth]})
    caps = probe_caps(truth_mix, 0, 0.65, 3)
    run = run_probe(truth, caps, periods=20.0, seed=5, reference_every=2)
    found = fit_probe_levels(run.measured, 20000.0, name="j", at="now", probe_id="p")
    assert found is not None
    _, fit = found
    shape = fit["shape"]
    assert shape["source"] == "sm_clock", shape["reason"]
    assert abs(shape["static_share"] - 0.08) <= 2.5 * shape["static_share_stderr"] + 0.01
    assert abs(shape["exponent"] - 2.0) <= 2.5 * shape["exponent_stderr"] + 0.03
    job = parse_job_mix({"jobs": [declared]}).jobs[0]
    rule = {"max_stderr": 0.3, "extension": "family", "interpolation": "pchip"}
    own, why = fields_in_force(job, fit, **rule)
    assert why is None
    assert (own["static_share"], own["exponent"]) == (shape["static_share"], shape["exponent"])
    fleet, _ = fields_in_force(job, fit, **rule, own_shape=False)
    assert "static_share" not in fleet
    powers = np.linspace(min(run.truth[c][0] for c in run.truth), 0.99 * 640.0, 30)

    def error(fields: dict) -> float:
        planned = parse_job_mix({"jobs": [declared | fields]}).curves
        diff = [
            throughput_at_power(planned, [p])[0] - throughput_at_power(truth_mix.curves, [p])[0]
            for p in powers
        ]
        return float(np.abs(diff).mean())

    assert error(own) < 0.6 * error(fleet)
    blind = [{k: v for k, v in lv.items() if "clock" not in k} for lv in run.measured]
    _, no_clock = fit_probe_levels(blind, 20000.0, name="j", at="now", probe_id="p")
    assert no_clock["shape"]["source"] == "family"
    assert "no SM clock" in no_clock["shape"]["reason"]
    assert "static_share" not in fields_in_force(job, no_clock, **rule)[0]
