"""Predicted PFIs: jobs that declare none get one from their agents' telemetry features, with
its error and the source `predicted`; plans and quotes use it; the predictor refits on the
site's own measured jobs (real agents and a real gateway on loopback, real stores)."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import numpy as np
import pytest

from agents.protocol import DelayStats, JobTelemetry, TelemetryResponse
from agents.run import jobs_on_node
from agents.service import AgentNode
from agents.service import create_app as agent_app
from agents.simulated import SimulatedBackend
from flexgate.serve import ServerThread
from flexmodel.curves import operating_point
from flexmodel.jobmix import parse_job_mix
from flexmodel.predictor import DRAM_BASE, DRAM_SLOPE, PfiRecord, dram_copy_product
from flexmodel.quote import quote
from flexmodel.workload import study_predictor
from gateway.app import create_app
from gateway.clock import SystemClock
from gateway.errors import InvalidRequestError
from gateway.services.jobbook import JobBook, site_mix, with_predictions
from gateway.services.overhead import Overhead, OverheadModel
from gateway.services.planner import plan
from gateway.services.predictions import Predictions
from gateway.settings import GatewaySettings
from gateway.store.db import Store
from tests.conftest import wait_for
from tests.gateway.conftest import AGENT_TOKEN, API, API_TOKEN

#: (id, true PFI, model family, node, GPUs)
TRUTH = [
    ("llama-pt", 1.15, "dense", "node-01", [0, 1, 2, 3]),
    ("qwen-ft", 1.45, "dense", "node-01", [4, 5, 6, 7]),
    ("oss-ft", 1.95, "moe-finetune", "node-02", [0, 1, 2, 3]),
    ("qwen-moe-ft", 2.5, "moe-finetune", "node-02", [4, 5, 6, 7]),
]


def job(ident, node, gpus, **extra):
    return {
        "id": ident,
        "gpus": len(gpus),
        "power_w": 620.0,
        "throughput": 12000.0,
        "period_s": 2.0,
        "placement": [{"node": node, "gpus": gpus}],
    } | extra


def truth_jobs():
    return [job(i, n, g, pfi=p, model_family=f) for i, p, f, n, g in TRUTH]


def sweep_of(truth: dict) -> list[dict]:
    """The job's measured sweep: its true curve at the study's fine grid."""
    curves = parse_job_mix({"jobs": [truth]}).curves
    points = []
    for cap in (200.0, 300.0, 400.0, 500.0, 600.0):
        power, thr, _ = operating_point(curves, cap)
        points.append({"cap_w": cap, "power_w": float(power[0]), "throughput": float(thr[0])})
    return points


@contextlib.contextmanager
def predicting_site(tmp_path, database_url, truth, declared, **changes):
    """Simulated agents running the `truth` (their jobs' features follow their true PFIs,
    without scatter), a gateway told only `declared`."""
    mix = parse_job_mix({"jobs": truth})
    names = sorted({p.node for j in mix.jobs for p in j.placement})
    nodes = [
        AgentNode(
            n,
            SimulatedBackend(8, mix=mix, node_id=n, noise_w=3.0, feature_noise=0.0),
            tmp_path / "agents" / n,
            jobs=jobs_on_node(mix, n, 8),
            sample_hz=20,
            feature_period_s=0.05,
        )
        for n in names
    ]
    with ServerThread(agent_app(nodes, AGENT_TOKEN, prefixed=True)) as agents_url:
        settings = GatewaySettings(
            database_url=database_url,
            api_token=API_TOKEN,
            agent_token=AGENT_TOKEN,
            agents=",".join(f"{agents_url}/nodes/{n}" for n in names),
            predictor_period_s=0.1,
            **changes,
        )
        app = create_app(settings)
        with ServerThread(app) as url, httpx.Client(base_url=url, timeout=20) as api:
            answer = api.put("/v1/jobs", json={"jobs": declared}, headers=API)
            assert answer.status_code == 200, answer.text
            yield api, app


def pfis_when(api, ready):
    def check():
        doc = {p["id"]: p for p in api.get("/v1/jobs").json()["pfi"]}
        return doc if ready(doc) else None

    return wait_for(check, "the jobs' PFIs", seconds=30)


def test_a_job_without_a_declared_pfi_gets_a_predicted_one_with_its_error(tmp_path, database_url):
    # a throughput floor makes what a job can give depend on its PFI, and so firm kW on the
    # PFI's error
    floor = {"min_throughput_fraction": 0.85}
    declared = [job(i, n, g, **floor) for i, _, _, n, g in TRUTH[1:]]
    declared[1]["model_family"] = "moe-finetune"  # oss-ft: a family the study's fit has seen
    declared.insert(0, job("llama-pt", "node-01", [0, 1, 2, 3], pfi=1.2, pfi_stderr=0.05, **floor))
    study = study_predictor()
    with predicting_site(tmp_path, database_url, truth_jobs(), declared) as (api, _):
        pfis = pfis_when(api, lambda d: all(p["source"] != "default" for p in d.values()))
        one = api.get("/v1/jobs/oss-ft").json()
        missing = api.get("/v1/jobs/nobody")
        predictor = api.get("/v1/predictor").json()
        quoted = api.post("/v1/quotes", json={"window_s": 600, "reduction_kw": 2.0}).json()
        stored = api.get("/v1/jobs").json()["jobs"]
    # the declared PFI stays above any prediction, though the job's features were read too
    assert pfis["llama-pt"] | {"dram_copy_product": None} == {
        "id": "llama-pt",
        "source": "declared",
        "pfi": 1.2,
        "pfi_stderr": 0.05,
        "dram_copy_product": None,
        "feature_samples": pfis["llama-pt"]["feature_samples"],
    }
    assert pfis["llama-pt"]["dram_copy_product"] is not None
    for ident, true_pfi, *_ in TRUTH[1:]:
        got = pfis[ident]
        assert got["source"] == "predicted"
        feature = got["dram_copy_product"]
        assert feature == pytest.approx(DRAM_BASE + DRAM_SLOPE * (true_pfi - 1.0), rel=1e-6)
        assert got["pfi"] == pytest.approx(float(study.predict(feature)), abs=0.006)
        # a family the fit has seen: the within-family error; none given: the group-out one
        new = ident != "oss-ft"
        stated = float(study.prediction_stderr(feature, new_group=new))
        assert got["pfi_stderr"] >= stated
        assert got["pfi_stderr"] == pytest.approx(stated, abs=0.01)
        assert got["error_basis"] == ("leave-one-group-out" if new else "leave-one-out")
    assert pfis["oss-ft"]["pfi_stderr"] < 0.25 < study.logo_rmse <= pfis["qwen-ft"]["pfi_stderr"]
    assert one["pfi"] == pfis["oss-ft"]
    assert one["job"] == next(d for d in stored if d["id"] == "oss-ft")
    assert "pfi" not in one["job"]  # what was given is what is stored
    assert missing.status_code == 404
    assert missing.json()["detail"] == "no job 'nobody'"
    assert predictor["in_use"] is True
    assert predictor["fit"]["source"] == "study"
    assert predictor["fit"]["loo_r2"] == pytest.approx(study.loo_r2)
    assert predictor["fit"]["logo_r2"] == pytest.approx(study.logo_r2)
    assert predictor["predicted_jobs"] == ["oss-ft", "qwen-ft", "qwen-moe-ft"]
    # the quote is the model's on the mix with the predictions, their errors in firm kW
    predicted = {p["id"]: (p["pfi"], p["pfi_stderr"]) for p in pfis.values()}
    overhead = OverheadModel(1.3, 0.05, 0.0, "configured")
    asked = {"window_s": 600, "reduction_kw": 2.0}
    expected = quote(site_mix(with_predictions(stored, predicted), overhead), **asked)
    default = quote(site_mix(stored, overhead), **asked)
    for key in ("firm_kw", "achievable_kw", "requested_throughput_loss"):
        assert quoted[key] == pytest.approx(expected[key], rel=1e-3)
        assert abs(expected[key] - default[key]) > 1e-3 * abs(default[key])


def test_the_predictor_refits_on_the_sites_measured_jobs_and_keeps_them(tmp_path, database_url):
    truth = [
        job(f"swept-{i}", f"node-0{1 + i // 4}", [2 * (i % 4), 2 * (i % 4) + 1], pfi=p)
        | {"model_family": "dense" if p < 1.6 else "moe-finetune"}
        for i, p in enumerate([1.1, 1.2, 1.3, 1.45, 1.6, 1.8, 2.1, 2.4])
    ]
    truth.append(job("new", "node-03", [0, 1, 2, 3], pfi=2.0))
    declared = [
        {k: v for k, v in t.items() if k not in ("pfi",)} | {"sweep": sweep_of(t)}
        for t in truth[:-1]
    ]
    declared.append(job("new", "node-03", [0, 1, 2, 3]))
    settings = {"predictor_min_jobs": 8}
    with predicting_site(tmp_path, database_url, truth, declared, **settings) as (api, app):
        doc = wait_for(
            lambda: (d := api.get("/v1/predictor").json())["fit"]["source"] == "site" and d,
            "the site's refit",
            seconds=30,
        )
        pfis = pfis_when(api, lambda d: d["new"]["source"] == "predicted")
        predictions = app.state.services.predictions
        with pytest.raises(InvalidRequestError, match=r"'bad': feature 40\.0 is not a DRAM copy"):
            predictions.record(
                [PfiRecord(0.2, 1.5, "dense", "fine"), PfiRecord(40.0, 1.5, "dense", "bad")],
                source="test",
            )
        after = api.get("/v1/predictor").json()
    fit = doc["fit"]
    assert {pfis[f"swept-{i}"]["source"] for i in range(8)} == {"sweep"}
    assert doc["site_records"] == 8
    assert {r["source"] for r in doc["records"]} == {"sweep"}
    assert fit["groups"] == 2
    # the features follow PFI = 1 + (feature - 0.10) / 0.30 exactly here: the fit finds it
    # (the sweeps' PFIs are Eq. 1 on the true curves, within a few hundredths of the truth)
    assert fit["slope"] == pytest.approx(1 / DRAM_SLOPE, rel=0.05)
    assert fit["intercept"] == pytest.approx(1 - DRAM_BASE / DRAM_SLOPE, abs=0.05)
    assert fit["loo_rmse"] < 0.05
    assert fit["logo_rmse"] is not None
    assert pfis["new"]["pfi"] == pytest.approx(2.0, abs=0.1)
    assert pfis["new"]["pfi"] == pytest.approx(2.0, abs=2 * pfis["new"]["pfi_stderr"] + 0.02)
    assert after["records"] == doc["records"]  # the bad batch changed nothing
    # a gateway started again on the same store has the site's fit before any telemetry
    with predicting_site(tmp_path / "again", database_url, truth, declared, **settings) as (
        api,
        _,
    ):
        again = api.get("/v1/predictor").json()
    assert again["fit"]["source"] == "site"
    assert again["site_records"] == 8


PLANNER = GatewaySettings(api_token="planner-api-token-0123", agent_token="planner-agent-0123")
OVERHEAD = OverheadModel(1.3, 0.05, 0.0, "configured")


def random_site(rng):
    """12 jobs of random power, throughput and true PFI (1.1 to 2.6), one node each; and the
    true cost (throughput lost per GPU kW shed, on the true curves) of the plan for a quarter
    of the site's maximum made on the PFIs `predicted` (job id -> (PFI, stderr); none: the
    default)."""
    pfi = rng.uniform(1.1, 2.6, 12)
    docs = [
        job(f"j{i}", f"node-{i:02d}", list(range(8)), power_w=float(rng.uniform(560, 680)))
        | {"throughput": float(rng.uniform(5e3, 4e4))}
        for i in range(12)
    ]
    truth = site_mix([d | {"pfi": float(p)} for d, p in zip(docs, pfi, strict=True)], OVERHEAD)
    nodes = {f"node-{i:02d}" for i in range(12)}

    def cost_per_kw(predicted):
        mix = site_mix(with_predictions(docs, predicted), OVERHEAD)
        target = 0.25 * plan(mix, 1e9, nodes, PLANNER)["achieved_facility_kw"]
        caps = np.array([j["cap_w"] for j in plan(mix, target, nodes, PLANNER)["jobs"]])
        power, thr, _ = operating_point(truth.curves, caps)
        lost = sum(j.throughput for j in truth.jobs) - float(np.sum(thr))
        shed_kw = sum(j.gpus * (j.power_w - p) for j, p in zip(truth.jobs, power, strict=True))
        return lost / (shed_kw / 1000)

    return pfi, cost_per_kw


def by_feature(features):
    """Each job's PFI and error predicted by the study's fit from these features."""
    study = study_predictor()
    return {
        f"j{i}": (float(study.predict(f)), float(study.prediction_stderr(f)))
        for i, f in enumerate(features)
    }


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_a_planner_given_predicted_pfis_beats_the_default_on_informative_features(seed):
    """Jobs whose features follow their PFIs: the plan on predicted PFIs loses less true
    throughput per true kW shed than the plan on the default PFI, and closes a good part of
    the way to the plan on the true PFIs; the same features given to the wrong jobs do
    worse."""
    rng = np.random.default_rng(seed)
    pfi, cost_per_kw = random_site(rng)
    informative = dram_copy_product(pfi, rng, noise=0.0)
    default = cost_per_kw({})
    predicted = cost_per_kw(by_feature(informative))
    oracle = cost_per_kw({f"j{i}": (float(p), 0.0) for i, p in enumerate(pfi)})
    closed = (default - predicted) / (default - oracle)
    print(f"seed {seed}: gap closed {closed:.2f}")
    assert predicted < default
    assert closed > 0.3  # a good part of the way to the true PFIs
    assert cost_per_kw(by_feature(rng.permutation(informative))) > predicted


def test_with_the_studys_scatter_predicted_pfis_still_beat_the_default_on_most_sites():
    """Features with the feature model's scatter (the study's leave-one-out R^2 of about
    0.5): over 20 random sites the predicted PFIs' plans lose less true throughput per kW
    than the default's on most, and close most of the way to the true PFIs' on average."""
    closed, wins = [], 0
    for seed in range(20):
        rng = np.random.default_rng(1000 + seed)
        pfi, cost_per_kw = random_site(rng)
        predicted = cost_per_kw(by_feature(dram_copy_product(pfi, rng)))
        default = cost_per_kw({})
        oracle = cost_per_kw({f"j{i}": (float(p), 0.0) for i, p in enumerate(pfi)})
        closed.append((default - predicted) / (default - oracle))
        wins += predicted < default
    print(f"gap closed: mean {np.mean(closed):.2f}, median {np.median(closed):.2f}; wins {wins}/20")
    assert wins >= 16
    assert np.mean(closed) > 0.5


def test_a_measured_curve_in_force_is_recorded_for_the_refit_as_measured(tmp_path):
    """The job book holds a curve characterisation measured for a job that declared none: the
    predictor's records take it, with the job's feature, as `measured`; again when the
    measured PFI moves, not while it stands."""
    settings = GatewaySettings(database_url=f"sqlite:///{tmp_path / 'g.db'}", lab=True)
    store, clock = Store(settings.database_url), SystemClock()
    book = JobBook(store, clock, Overhead(settings, store, clock))
    truth = job("oss-ft", "node-02", [0, 1, 2, 3], pfi=1.95)
    asyncio.run(book.replace([job("oss-ft", "node-02", [0, 1, 2, 3])], "test"))
    predictions = Predictions(settings, store, clock, None, book)  # type: ignore[arg-type]
    seen = TelemetryResponse(
        node_id="node-02",
        gpus=[],
        jobs=[
            JobTelemetry(
                job_id="oss-ft",
                period_s=2.0,
                duty=0.5,
                phase_rad=None,
                phase_at=None,
                power_w=600.0,
                dram_copy_product=0.31,
                feature_samples=12,
            )
        ],
        actuation_delay=DelayStats(p50_s=None, p99_s=None, count=0),
    )

    def recorded():
        return [(r.job_id, r.source, round(r.pfi, 2)) for r in predictions.records()]

    predictions.update({"node-02": seen})
    assert recorded() == []  # no curve of its own yet: it is predicted, not recorded
    book.use_curves({"oss-ft": {"sweep": sweep_of(truth), "pfi_stderr": 0.05}})
    pfi = next(j for j in book.mix().jobs if j.id == "oss-ft").pfi_value
    predictions.update({"node-02": seen})
    assert recorded() == [("oss-ft", "measured", round(pfi, 2))]
    assert predictions.job_pfi(book.docs()[0])["source"] == "measured"
    steeper = truth | {"pfi": 2.4}
    book.use_curves({"oss-ft": {"sweep": sweep_of(steeper), "pfi_stderr": 0.05}})
    moved = next(j for j in book.mix().jobs if j.id == "oss-ft").pfi_value
    predictions.update({"node-02": seen})
    assert recorded() == [("oss-ft", "measured", round(moved, 2))]
    store.close()
