import json
import os

import pytest

from agents.caps import CapController
from agents.errors import InvalidCapError, StaleGenerationError
from agents.nvml import NvmlBackend
from agents.protocol import CapCommand
from agents.state import OriginalLimits
from tests.agents.fake_nvml import FakeNvml


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def rig(tmp_path):
    fake = FakeNvml(gpus=4, start_mw=650_000)
    clock = Clock()
    controller = CapController(
        NvmlBackend(nvml=fake), OriginalLimits(tmp_path), clock, node_id="node-01"
    )
    return fake, controller, clock, tmp_path


def command(generation=1, lease_s=60.0, **caps):
    return CapCommand(
        plan_id="p",
        generation=generation,
        lease_s=lease_s,
        caps=[{"gpu": int(g[1:]), "cap_w": w} for g, w in caps.items()],
    )


def test_caps_are_applied_read_back_and_timed(rig):
    fake, controller, clock, _ = rig
    answer = controller.apply(command(g0=450.0, g1=500.0), clock())
    assert [(r.gpu, r.requested_w, r.enforced_w, r.clamped, r.error) for r in answer.results] == [
        (0, 450.0, 450.0, False, None),
        (1, 500.0, 500.0, False, None),
    ]
    assert fake.limit_mw(0) == 450_000
    assert all(r.elapsed_s >= 0 for r in answer.results)
    assert controller.delay_stats().count == 2


def test_the_delay_statistics_follow_every_new_command(rig):
    """Worked out once per new delay (every telemetry summary carries them): the next
    command's delays are in the next reading, and a restore's count too."""
    _, controller, clock, _ = rig
    controller.apply(command(g0=450.0), clock())
    first = controller.delay_stats()
    assert controller.delay_stats() == first
    clock.now += 1.0
    controller.apply(command(generation=2, g0=440.0, g1=430.0), clock())
    second = controller.delay_stats()
    assert (first.count, second.count) == (1, 3)
    assert len(second.recent_s) == 3
    controller.restore_all()
    assert controller.delay_stats().count == 5


def test_out_of_range_caps_are_clamped_and_say_so(rig):
    _fake, controller, clock, _ = rig
    answer = controller.apply(command(g0=100.0, g1=900.0), clock())
    assert [(r.enforced_w, r.clamped) for r in answer.results] == [(200.0, True), (700.0, True)]


def test_originals_are_saved_before_the_first_change(rig):
    _, controller, clock, state = rig
    controller.apply(command(g0=450.0), clock())
    controller.apply(command(generation=2, g0=300.0), clock())
    saved = json.loads((state / "original-limits.json").read_text())["gpus"]
    assert saved == {"GPU-fake-0000": {"index": 0, "original_w": 650.0}}  # the first one counts


def test_a_commands_originals_are_saved_in_one_write_before_any_change(rig, monkeypatch):
    fake, controller, clock, state = rig
    writes = []
    real_replace = os.replace

    def replace(src, dst):  # each write of the originals file ends in one rename
        writes.append([fake.limit_mw(g) for g in range(4)])  # the limits when it was written
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    controller.apply(command(g0=450.0, g1=500.0, g2=550.0, g3=600.0), clock())
    assert writes == [[650_000] * 4]  # one write, every limit still the original
    saved = json.loads((state / "original-limits.json").read_text())["gpus"]
    assert sorted(e["original_w"] for e in saved.values()) == [650.0] * 4
    controller.apply(command(2, g0=400.0, g1=400.0, g2=400.0, g3=400.0), clock())
    assert len(writes) == 1  # already saved: nothing written


def test_gpus_restored_together_are_forgotten_in_one_write_after_every_change(rig, monkeypatch):
    fake, controller, clock, state = rig
    controller.apply(command(g0=450.0, g1=500.0, g2=550.0), clock())
    writes = []
    real_replace = os.replace

    def replace(src, dst):
        writes.append([fake.limit_mw(g) for g in range(4)])
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    controller.apply(command(2, g2=550.0), clock())  # g0 and g1 released by the new state
    assert writes == [[650_000, 650_000, 550_000, 650_000]]  # once, after both were back
    saved = json.loads((state / "original-limits.json").read_text())["gpus"]
    assert [e["index"] for e in saved.values()] == [2]
    controller.restore_all()
    assert len(writes) == 2
    assert json.loads((state / "original-limits.json").read_text())["gpus"] == {}


def test_a_command_is_the_whole_state(rig):
    fake, controller, clock, _ = rig
    controller.apply(command(g0=450.0, g1=450.0), clock())
    answer = controller.apply(command(generation=2, g1=400.0), clock())
    assert fake.limit_mw(0) == 650_000  # not listed: back to its original
    assert fake.limit_mw(1) == 400_000
    assert {r.gpu for r in answer.results} == {0, 1}


def test_older_generations_are_refused_and_change_nothing(rig):
    fake, controller, clock, _ = rig
    controller.apply(command(generation=5, g0=450.0), clock())
    with pytest.raises(StaleGenerationError, match="generation 4 is older"):
        controller.apply(command(generation=4, g0=300.0), clock())
    assert fake.limit_mw(0) == 450_000
    controller.apply(command(generation=5, g0=450.0, lease_s=120.0), clock())  # a renewal
    assert controller.lease_remaining_s() == pytest.approx(120.0)


@pytest.mark.parametrize(
    ("caps", "message"),
    [({"g9": 400.0}, "GPU 9 does not exist")],
)
def test_invalid_commands_change_nothing(rig, caps, message):
    fake, controller, clock, _ = rig
    with pytest.raises(InvalidCapError, match=message):
        controller.apply(command(g0=300.0, **caps), clock())
    assert fake.limit_mw(0) == 650_000
    assert controller.generation is None


def test_a_repeated_gpu_is_refused(rig):
    fake, controller, clock, _ = rig
    twice = CapCommand(
        plan_id="p",
        generation=1,
        lease_s=10,
        caps=[{"gpu": 0, "cap_w": 400}, {"gpu": 0, "cap_w": 500}],
    )
    with pytest.raises(InvalidCapError, match="appears twice"):
        controller.apply(twice, clock())
    assert fake.limit_mw(0) == 650_000


def test_the_lease_runs_out_on_the_monotonic_clock(rig):
    fake, controller, clock, state = rig
    controller.apply(command(g0=450.0, g2=300.0, lease_s=30.0), clock())
    clock.now += 29.0
    assert controller.expire() is None
    assert fake.limit_mw(0) == 450_000
    clock.now += 2.0
    restored = controller.expire()
    assert {r.gpu for r in restored} == {0, 2}
    assert fake.limit_mw(0) == fake.limit_mw(2) == 650_000
    assert json.loads((state / "original-limits.json").read_text())["gpus"] == {}


def test_a_lost_gpu_is_reported_and_the_others_still_apply(rig):
    fake, controller, clock, _ = rig
    controller.apply(command(g0=450.0, g1=450.0), clock())
    fake.lost.add(1)
    answer = controller.apply(command(generation=2, g0=400.0, g1=400.0), clock())
    by_gpu = {r.gpu: r for r in answer.results}
    assert by_gpu[0].error is None
    assert by_gpu[0].enforced_w == 400.0
    assert "GPU is lost" in by_gpu[1].error
    assert by_gpu[1].enforced_w is None
    fake.lost.clear()
    clock.now += 1000
    controller.expire()  # the lease ends: both come back, the lost one once it is back
    assert fake.limit_mw(0) == fake.limit_mw(1) == 650_000


def test_a_limit_that_reads_back_wrong_is_an_error_never_silent(rig):
    fake, controller, clock, _ = rig
    fake.readback_offset_mw[0] = 25_000
    answer = controller.apply(command(g0=450.0), clock())
    assert answer.results[0].enforced_w == 475.0
    assert "reads back as 475 W, not the 450 W set" in answer.results[0].error


def test_no_permission_is_reported_per_gpu(rig):
    fake, controller, clock, _ = rig
    fake.root = False
    answer = controller.apply(command(g0=450.0), clock())
    assert "needs root" in answer.results[0].error
    assert fake.limit_mw(0) == 650_000


def test_a_restore_that_fails_is_retried_until_the_gpu_comes_back(rig):
    fake, controller, clock, _ = rig
    controller.apply(command(g0=450.0, lease_s=10.0), clock())
    fake.lost.add(0)
    clock.now += 11.0
    failed = controller.expire()
    assert "GPU is lost" in failed[0].error
    assert controller.restore_pending
    assert fake.limit_mw(0) == 450_000
    fake.lost.clear()  # the GPU is back (a driver reset, a re-seated card)
    controller.expire()
    assert fake.limit_mw(0) == 650_000
    assert not controller.restore_pending
    assert controller.expire() is None


def _lines(caplog, what):
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(what + " ")]


def test_every_cap_that_moves_is_one_log_line_and_a_renewal_is_not(rig, caplog):
    _fake, controller, clock, _ = rig
    caplog.set_level("INFO", logger="flexgate.agent")
    controller.apply(command(g0=450.0, g1=900.0), clock())
    assert _lines(caplog, "cap set") == [
        "cap set node=node-01 gpu=0 requested_w=450.0 enforced_w=450.0 clamped=False plan=p "
        "generation=1 lease_s=60.0",
        "cap set node=node-01 gpu=1 requested_w=900.0 enforced_w=700.0 clamped=True plan=p "
        "generation=1 lease_s=60.0",
    ]
    caplog.clear()
    controller.apply(command(g0=450.0, g1=900.0), clock())  # a renewal: nothing moved
    assert caplog.records == []
    controller.apply(command(generation=2, g0=450.0), clock())  # GPU 1 goes back
    assert _lines(caplog, "cap restored") == [
        "cap restored node=node-01 gpu=1 requested_w=none enforced_w=650.0 clamped=False plan=p "
        "generation=2 lease_s=60.0"
    ]


def test_a_lease_that_runs_out_logs_what_it_restored(rig, caplog):
    _fake, controller, clock, _ = rig
    caplog.set_level("INFO", logger="flexgate.agent")
    controller.apply(command(lease_s=5.0, g0=450.0, g2=300.0), clock())
    clock.now += 5.0
    controller.expire()
    (line,) = _lines(caplog, "lease expired")
    assert (
        line == "lease expired node=node-01 plan=p generation=1 restored_gpus=0,2 failed_gpus=none"
    )
    assert [r.levelname for r in caplog.records if r.getMessage() == line] == ["WARNING"]


def test_a_gpu_that_refuses_its_cap_is_an_error_line(rig, caplog):
    fake, controller, clock, _ = rig
    caplog.set_level("INFO", logger="flexgate.agent")
    fake.lost.add(1)
    controller.apply(command(g0=450.0, g1=450.0), clock())
    (line,) = _lines(caplog, "cap failed")
    assert line.startswith("cap failed node=node-01 gpu=1 requested_w=450.0 enforced_w=none")
    assert "error=" in line
