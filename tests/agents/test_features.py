"""The PFI predictor's features, read through the fake NVML and a fake DCGM exporter on
loopback, served by a real agent."""

import httpx
import pytest

from agents.dcgm import DRAM_ACTIVE, DcgmExporter, parse_samples
from agents.errors import DcgmError
from agents.features import FeatureSampler
from agents.nvml import NvmlBackend
from agents.service import AgentNode, create_app
from agents.settings import AgentSettings
from agents.simjobs import job_features
from agents.simulated import SimulatedBackend
from flexgate.serve import ServerThread
from flexmodel.jobmix import parse_job_mix
from flexmodel.predictor import DRAM_BASE, DRAM_SLOPE
from tests.agents.fake_dcgm import FakeDcgmExporter
from tests.agents.fake_nvml import FakeNvml
from tests.conftest import wait_for
from tests.promtext import samples

TOKEN = "agent-token-0123456789abcdef"
JOBS = {"moe-ft": [0, 1], "dense-pt": [2, 3]}


def nvml_node(tmp_path, exporter, fake=None, period_s=0.02):
    backend = NvmlBackend(nvml=fake or FakeNvml(4, memory_util_pct=[40, 40, 20, 20]))
    uuids = [backend.identity(i)[0] for i in range(backend.count())]
    dram = DcgmExporter(exporter.url, uuids, timeout_s=2.0) if exporter else None
    return AgentNode(
        "node-01", backend, tmp_path / "state", jobs=JOBS, dram=dram, feature_period_s=period_s
    )


def features_of(api, samples=3):
    def ready():
        jobs = {j["job_id"]: j for j in api.get("/v1/telemetry").json()["jobs"]}
        done = all(j["feature_samples"] >= samples for j in jobs.values())
        return jobs if done else None

    return wait_for(ready, f"{samples} feature readings of every job")


def test_features_come_from_nvml_memory_utilisation_and_dcgm_dram_activity(tmp_path):
    with FakeDcgmExporter() as exporter:
        exporter.dram = {i: (f"GPU-fake-{i:04d}", v) for i, v in enumerate([0.5, 0.5, 0.3, 0.3])}
        node = nvml_node(tmp_path, exporter)
        with (
            ServerThread(create_app([node], TOKEN)) as url,
            httpx.Client(base_url=url, timeout=10) as api,
        ):
            jobs = features_of(api)
            metrics = api.get("/metrics").text
    moe, dense = jobs["moe-ft"], jobs["dense-pt"]
    assert moe["mem_copy_util"] == pytest.approx(0.40)  # NVML's percent as a fraction
    assert moe["dram_active"] == pytest.approx(0.5)
    assert moe["dram_copy_product"] == pytest.approx(0.20)
    assert dense["dram_copy_product"] == pytest.approx(0.06)
    assert 'DCGM_FI_DEV_MEM_COPY_UTIL{Hostname="node-01",UUID="GPU-fake-0002",gpu="2"}' in (
        samples(metrics)
    )
    assert exporter.scrapes >= 3


def test_readings_under_a_cap_are_not_the_uncapped_runs_and_are_left_out(tmp_path):
    fake = FakeNvml(4, memory_util_pct=[40, 40, 20, 20])
    with FakeDcgmExporter() as exporter:
        exporter.dram = {i: (f"GPU-fake-{i:04d}", 0.3) for i in range(4)}
        backend = NvmlBackend(nvml=fake)
        uuids = [backend.identity(i)[0] for i in range(4)]
        capped: set[int] = set()
        sampler = FeatureSampler(
            backend, JOBS, DcgmExporter(exporter.url, uuids), capped=lambda: capped
        )
        sampler.sample_once()
        capped |= {2, 3}  # the dense job is capped: its memory and DRAM readings change
        fake.memory_util_pct[2:] = [60, 60]
        exporter.dram[2], exporter.dram[3] = ("GPU-fake-0002", 0.9), ("GPU-fake-0003", 0.9)
        sampler.sample_once()
    dense = sampler.job_features(JOBS["dense-pt"])
    assert dense["dram_copy_product"] == pytest.approx(0.2 * 0.3)
    assert dense["feature_samples"] == 2  # one reading on each of its two GPUs
    assert sampler.job_features(JOBS["moe-ft"])["feature_samples"] == 4


def test_an_exporter_that_does_not_answer_is_named_and_the_product_stays_unknown(tmp_path):
    exporter = FakeDcgmExporter()
    url = exporter.url
    exporter.stop()  # nothing listens there now
    node = nvml_node(tmp_path, exporter)
    with (
        ServerThread(create_app([node], TOKEN)) as base,
        httpx.Client(base_url=base, timeout=10) as api,
    ):
        doc = wait_for(
            lambda: (d := api.get("/v1/telemetry").json())["features_error"] and d, "an error"
        )
    assert f"DCGM exporter at {url} did not answer" in doc["features_error"]
    job = doc["jobs"][0]
    assert job["mem_copy_util"] == pytest.approx(0.40)  # NVML still reads
    assert job["dram_active"] is None
    assert job["dram_copy_product"] is None


@pytest.mark.parametrize(
    ("status", "rows", "words"),
    [
        (500, True, "answered HTTP 500"),
        (200, False, f"reports no {DRAM_ACTIVE} for this node's GPUs"),
    ],
)
def test_an_exporter_answer_without_the_field_is_an_error_naming_it(status, rows, words):
    with FakeDcgmExporter() as exporter:
        exporter.status = status
        if rows:
            exporter.dram = {0: ("GPU-fake-0000", 0.5)}
        with pytest.raises(DcgmError, match=words):
            DcgmExporter(exporter.url, ["GPU-fake-0000"]).read_dram_active()


def test_rows_match_by_uuid_else_by_index_and_mig_instances_are_skipped():
    with FakeDcgmExporter() as exporter:
        exporter.dram = {0: ("GPU-b", 0.25), 1: ("", 0.75), 5: ("", 0.5)}
        exporter.extra = (
            'DCGM_FI_PROF_DRAM_ACTIVE{gpu="1",UUID="GPU-b",GPU_I_ID="3",'
            'GPU_I_PROFILE="1g.18gb"} 0.99\n'
        )
        read = DcgmExporter(exporter.url, ["GPU-a", "GPU-b"]).read_dram_active()
    # GPU-b is index 1 on this node whatever the exporter's index; the row without a UUID
    # is index 1 too and comes later; index 5 is not on this node; the MIG row is skipped.
    assert read == {1: pytest.approx(0.75)}


def test_prometheus_text_labels_with_escapes_and_timestamps_parse():
    text = (
        "# TYPE X gauge\n"
        'X{a="q\\"uote",b="2"} 0.5 1700000000000\n'
        "X 1e-2\n"
        "X_other 7\n"
        'X{a="nan"} NaN\n'
    )
    assert parse_samples(text, "X") == [({"a": 'q"uote', "b": "2"}, 0.5), ({}, 0.01)]


def test_without_dcgm_nvml_alone_gives_no_product(tmp_path):
    node = nvml_node(tmp_path, None)
    node.sampler.sample_once()
    node.features.sample_once()
    job = node.telemetry().jobs[0]
    assert job.mem_copy_util == pytest.approx(0.40)
    assert job.dram_copy_product is None


def test_a_gpu_without_utilisation_rates_reads_none():
    fake = FakeNvml(1)
    fake.utilisation_supported = False
    assert NvmlBackend(nvml=fake).memory_utilisation(0) is None


def test_simulated_jobs_show_the_features_of_their_true_pfi(tmp_path):
    mix = parse_job_mix(
        {
            "jobs": [
                {"id": j, "gpus": 4, "power_w": 600.0, "throughput": 9000.0, "pfi": pfi}
                | {"placement": [{"node": "node-01", "gpus": gpus}]}
                for j, pfi, gpus in (("flexible", 2.4, [0, 1, 2, 3]), ("stiff", 1.15, [4, 5, 6, 7]))
            ]
        }
    )
    backend = SimulatedBackend(8, mix=mix, feature_noise=0.0)
    node = AgentNode(
        "node-01",
        backend,
        tmp_path / "state",
        jobs={"flexible": [0, 1, 2, 3], "stiff": [4, 5, 6, 7]},
        sample_hz=0,
    )
    node.sampler.sample_once()
    node.features.sample_once()
    jobs = {j.job_id: j for j in node.telemetry().jobs}
    for job_id, pfi in (("flexible", 2.4), ("stiff", 1.15)):
        assert jobs[job_id].dram_copy_product == pytest.approx(DRAM_BASE + DRAM_SLOPE * (pfi - 1))
    # with the feature model's scatter, every node agrees on a job's features
    assert job_features("flexible", 2.4) == job_features("flexible", 2.4)
    assert job_features("flexible", 2.4) != job_features("other", 2.4)


def test_a_dcgm_url_that_is_not_http_is_refused():
    with pytest.raises(ValueError, match="FLEXGATE_AGENT_DCGM_URL 'localhost:9400'"):
        AgentSettings(lab=True, agent_dcgm_url="localhost:9400")
