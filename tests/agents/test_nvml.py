import pytest

from agents.errors import BackendError, GpuLostError, NoPermissionError, NotSupportedError
from agents.nvml import NvmlBackend
from tests.agents.fake_nvml import FakeNvml


def test_inventory_constraints_and_units():
    fake = FakeNvml(gpus=2, start_mw=650_000)
    gpu = NvmlBackend(nvml=fake)
    assert fake.initialised
    assert gpu.count() == 2
    assert gpu.identity(1) == ("GPU-fake-0001", "NVIDIA H200")
    limits = gpu.constraints(0)
    assert (limits.min_w, limits.max_w, limits.default_w) == (200.0, 700.0, 700.0)
    assert gpu.enforced_limit_w(0) == 650.0  # milliwatts become watts here
    assert gpu.power_w(0) == 640.0
    assert gpu.energy_j(0) == pytest.approx(123_456.789)
    assert gpu.averaging_s == 0.0  # the instant field is there


def test_set_uses_milliwatts_and_reads_back_the_enforced_limit():
    fake = FakeNvml(gpus=1)
    gpu = NvmlBackend(nvml=fake)
    gpu.set_limit_w(0, 450.4)
    assert fake.calls[-1] == "set 0 450400"
    assert gpu.enforced_limit_w(0) == pytest.approx(450.4)
    assert gpu.power_capped(0) is True


def test_without_the_instant_field_power_is_the_one_second_average():
    gpu = NvmlBackend(nvml=FakeNvml(gpus=1, instant=False))
    assert gpu.averaging_s == 1.0
    assert gpu.power_w(0) == 640.0


@pytest.mark.parametrize(
    ("fault", "error", "words"),
    [
        ("lost", GpuLostError, "GPU is lost"),
        ("root", NoPermissionError, "needs root"),
        ("range", BackendError, "NVML refused the value"),
    ],
)
def test_nvml_errors_become_the_agents_own(fault, error, words):
    fake = FakeNvml(gpus=2)
    gpu = NvmlBackend(nvml=fake)
    if fault == "lost":
        fake.lost.add(1)
    if fault == "root":
        fake.root = False
    with pytest.raises(error, match=words):
        gpu.set_limit_w(1, 100.0 if fault == "range" else 400.0)


def test_not_supported_is_reported_not_raised_where_optional():
    gpu = NvmlBackend(nvml=FakeNvml(gpus=1))
    assert gpu.persistence_mode(0) is None  # the fake's driver does not say
    with pytest.raises(NotSupportedError):
        gpu._call(FakeNvml().nvmlDeviceGetPersistenceMode, gpu._handle(0))


def test_an_unknown_index_is_an_error():
    with pytest.raises(BackendError, match="no GPU 5"):
        NvmlBackend(nvml=FakeNvml(gpus=2)).enforced_limit_w(5)


def test_the_sm_clock_is_read_in_mhz_and_none_where_unsupported():
    fake = FakeNvml(gpus=2, sm_clock_mhz=[1980, 1410])
    gpu = NvmlBackend(nvml=fake)
    assert gpu.sm_clock_mhz(1) == 1410.0
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlDeviceGetClockInfo(handle, fake.NVML_CLOCK_MEM) == 3201  # not the SM's
    fake.clocks_supported = False
    assert gpu.sm_clock_mhz(0) is None


def test_a_clock_read_fails_as_pynvml_fails():
    fake = FakeNvml(gpus=1)
    with pytest.raises(fake.NVMLError_InvalidArgument):  # an unknown clock type
        fake.nvmlDeviceGetClockInfo(fake.nvmlDeviceGetHandleByIndex(0), 99)
    gpu = NvmlBackend(nvml=fake)
    fake.lost.add(0)
    with pytest.raises(GpuLostError):
        gpu.sm_clock_mhz(0)
