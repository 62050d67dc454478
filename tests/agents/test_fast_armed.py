"""Armed plans on a node (agents.armed): held per depth with a generation, applied on a
trigger under the ordinary lease rules; checked against the fake NVML's limits."""

import pytest

from agents.armed import ArmedController
from agents.errors import InvalidCapError, StaleGenerationError
from agents.nvml import NvmlBackend
from agents.protocol import CapCommand
from agents.protocol_fast import ArmCommand, FastTrigger
from agents.state import OriginalLimits
from tests.agents.fake_nvml import FakeNvml
from tests.agents.test_caps import Clock


@pytest.fixture
def rig(tmp_path):
    fake = FakeNvml(gpus=4, start_mw=650_000)  # limits 200-700 W, at 650 W now
    clock = Clock()
    controller = ArmedController(
        NvmlBackend(nvml=fake), OriginalLimits(tmp_path), clock, node_id="node-01"
    )
    return fake, controller, clock


def arm(generation=1, **depths):
    """`arm(1, d10={0: 500.0})`: caps per GPU at each depth."""
    return ArmCommand(
        generation=generation,
        depths=[
            {"depth_pct": float(d[1:]), "caps": [{"gpu": g, "cap_w": w} for g, w in caps.items()]}
            for d, caps in depths.items()
        ],
    )


def trigger(depth=10.0, duration_s=30.0, seq=1):
    return FastTrigger(seq=seq, sent_at_s=0.0, depth_pct=depth, duration_s=duration_s)


def limits(fake, gpus=4):
    return [fake.limit_mw(i) / 1000 for i in range(gpus)]


def test_arming_changes_no_limit_and_a_trigger_applies_its_depth(rig):
    fake, controller, clock = rig
    controller.arm(arm(1, d10={0: 500.0}, d20={0: 400.0, 1: 450.0}))
    assert limits(fake) == [650.0] * 4
    results = controller.fire(trigger(depth=20.0), clock())
    assert [(r.gpu, r.enforced_w) for r in results] == [(0, 400.0), (1, 450.0)]
    assert limits(fake) == [400.0, 450.0, 650.0, 650.0]


def test_a_depth_not_armed_changes_nothing(rig):
    fake, controller, clock = rig
    controller.arm(arm(1, d10={0: 500.0}))
    assert controller.fire(trigger(depth=30.0), clock()) is None
    assert limits(fake) == [650.0] * 4
    assert controller.fast is None


def test_armed_caps_never_go_below_the_gpus_minimum(rig):
    fake, controller, clock = rig
    state = controller.arm(arm(1, d40={0: 50.0, 1: 900.0}))
    assert [(c.gpu, c.cap_w) for c in state.depths[0].caps] == [(0, 200.0), (1, 700.0)]
    assert state.clamped == 2
    controller.fire(trigger(depth=40.0), clock())
    assert limits(fake)[:2] == [200.0, 700.0]


def test_a_stale_armed_generation_is_refused_and_changes_nothing(rig):
    _, controller, _ = rig
    controller.arm(arm(5, d10={0: 500.0}))
    with pytest.raises(StaleGenerationError, match="older than the last armed"):
        controller.arm(arm(4, d10={0: 300.0}))
    assert controller.arm_state().generation == 5
    assert controller.armed[10.0][0].cap_w == 500.0


@pytest.mark.parametrize(
    ("command", "words"),
    [
        (arm(2, d10={9: 500.0}), "GPU 9 does not exist"),
        (
            ArmCommand(
                generation=2,
                depths=[
                    {"depth_pct": 10, "caps": [{"gpu": 0, "cap_w": 500}, {"gpu": 0, "cap_w": 1}]}
                ],
            ),
            "GPU 0 appears twice",
        ),
        (
            ArmCommand(generation=2, depths=[{"depth_pct": 10}, {"depth_pct": 10}]),
            "10% appears twice",
        ),
    ],
)
def test_bad_armed_plans_are_refused_and_change_nothing(rig, command, words):
    _, controller, _ = rig
    controller.arm(arm(1, d10={0: 500.0}))
    with pytest.raises(InvalidCapError, match=words):
        controller.arm(command)
    assert controller.arm_state().generation == 1
    assert list(controller.armed) == [10.0]


def test_the_fast_caps_expire_with_their_lease_and_the_originals_come_back(rig):
    fake, controller, clock = rig
    controller.arm(arm(1, d10={0: 500.0, 3: 450.0}))
    controller.fire(trigger(duration_s=30.0), clock())
    clock.now += 29.0
    assert controller.expire() is None
    assert limits(fake)[0] == 500.0
    clock.now += 1.0
    controller.expire()
    assert limits(fake) == [650.0] * 4
    assert controller.originals.saved() == {}


def test_under_a_fast_event_the_deeper_cap_wins_and_the_ordinary_one_returns(rig):
    fake, controller, clock = rig
    ordinary = CapCommand(
        plan_id="plan-1",
        generation=3,
        lease_s=120.0,
        caps=[{"gpu": 0, "cap_w": 450.0}, {"gpu": 1, "cap_w": 400.0}],
    )
    controller.apply(ordinary, clock())
    controller.arm(arm(1, d20={0: 300.0, 1: 500.0, 2: 600.0}))
    controller.fire(trigger(depth=20.0, duration_s=10.0), clock())
    assert limits(fake) == [300.0, 400.0, 600.0, 650.0]
    clock.now += 5.0
    answer = controller.apply(ordinary, clock())  # the gateway renews: the fast caps hold
    assert answer.lease_s == 120.0
    assert limits(fake) == [300.0, 400.0, 600.0, 650.0]
    clock.now += 5.0
    controller.expire()  # the fast event ends: the ordinary command again, not the originals
    assert limits(fake) == [450.0, 400.0, 650.0, 650.0]
    assert controller.generation == 3
    clock.now += 120.0
    controller.expire()
    assert limits(fake) == [650.0] * 4


def test_when_the_ordinary_lease_ends_first_the_fast_caps_hold_alone(rig):
    fake, controller, clock = rig
    controller.apply(
        CapCommand(plan_id="p", generation=1, lease_s=5.0, caps=[{"gpu": 1, "cap_w": 400.0}]),
        clock(),
    )
    controller.arm(arm(1, d10={0: 500.0}))
    controller.fire(trigger(duration_s=20.0), clock())
    assert limits(fake)[:2] == [500.0, 400.0]
    clock.now += 5.0
    controller.expire()
    assert limits(fake)[:2] == [500.0, 650.0]
    clock.now += 15.0
    controller.expire()
    assert limits(fake) == [650.0] * 4


def test_a_stale_ordinary_command_is_still_refused_under_a_fast_event(rig):
    fake, controller, clock = rig
    controller.apply(CapCommand(plan_id="p", generation=4, lease_s=60.0), clock())
    controller.arm(arm(1, d10={0: 500.0}))
    controller.fire(trigger(), clock())
    with pytest.raises(StaleGenerationError):
        controller.apply(
            CapCommand(plan_id="old", generation=3, lease_s=60.0, caps=[{"gpu": 0, "cap_w": 300}]),
            clock(),
        )
    assert limits(fake)[0] == 500.0


def test_a_restore_ends_the_fast_event(rig):
    fake, controller, clock = rig
    controller.arm(arm(1, d10={0: 500.0}))
    controller.fire(trigger(), clock())
    controller.restore_all()
    assert limits(fake) == [650.0] * 4
    assert controller.fast is None


def test_a_trigger_at_a_depth_where_the_node_gives_nothing_ends_its_fast_event(rig):
    fake, controller, clock = rig
    controller.arm(arm(1, d10={0: 500.0}, d30={0: 400.0, 1: 400.0}))
    controller.fire(trigger(depth=30.0, seq=1), clock())
    assert limits(fake)[:2] == [400.0, 400.0]
    controller.fire(trigger(depth=20.0, seq=2), clock())  # the site moved to 20%: nothing here
    assert limits(fake) == [650.0] * 4
    assert controller.fast is None


def test_a_command_after_the_fast_event_ended_is_not_combined_with_it(rig):
    fake, controller, clock = rig
    controller.arm(arm(1, d10={0: 300.0}))
    controller.fire(trigger(duration_s=5.0), clock())
    clock.now += 6.0  # over; the watcher has not looked yet
    controller.apply(
        CapCommand(plan_id="p", generation=1, lease_s=60.0, caps=[{"gpu": 0, "cap_w": 500.0}]),
        clock(),
    )
    assert limits(fake)[0] == 500.0
