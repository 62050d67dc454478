"""One event the site loop pursues: its target, what the loop planned and corrected, and what
it has read of the site's answer so far (`gateway.services.tracking`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

#: Settled corrections at reductions this far apart (a share of the larger) tell an offset
#: from a gain.
SPREAD = 0.2
#: The plans' moves of the GPU power kept (more than the agents' readings a step is looked for in).
PLANNED_KEPT = 120


@dataclass
class Pursuit:
    event_id: str
    reduction_kw: float  #: the event's target now, by the model [kW]
    level_kw: float | None  #: the event's level at the meter, for a setpoint [kW]
    start_facility_kw: float | None  #: the meter before the event, averaged over the window
    start_baseline_gpu_kw: float  #: the model's baseline when the event began [kW]
    start_placed_gpus: int  #: the placed jobs' GPUs then
    correction_kw: float = 0.0
    planned_kw: float = 0.0  #: the reduction last planned [kW]
    achieved_kw: float = 0.0  #: what that plan achieves by the model [kW]
    baseline_kw: float | None = None  #: the model's facility baseline at the last sample [kW]
    #: (when, kW): moves of the meter's reading expected from then on, by the model
    moves: list[tuple[float, float]] = field(default_factory=list)
    measured_kw: float | None = None
    target_kw: float | None = None
    reference_kw: float | None = None  #: the site without the event, at the meter [kW]
    #: (when, correction kW, gain) as taken: undone to before readings found wrong later
    corrections: list[tuple[float, float, float]] = field(default_factory=list)
    settled_kw: float = 0.0  #: the moves old enough to be wholly seen, summed [kW]
    undone_for_s: float | None = None  #: the suspicion (its start) last undone
    started_s: float = 0.0  #: when the loop took the event on (monotonic) [s]
    ceiling: bool = False  #: the level is a maximum (an import capacity limit)
    margin_kw: float = 0.0  #: planned below a ceiling by this [kW]
    target_since_s: float = 0.0  #: when the target last changed (monotonic) [s]
    watch_from_s: float = 0.0  #: the meter watch judges this event's moves from then on
    #: what the site sheds at the meter per kW the model plans, once settled: the model's
    #: gain error, which the predictor expects of the next moves
    gain: float = 1.0
    #: the correction once settled at each reduction asked (not while the plan was short)
    settled_at: dict[float, float] = field(default_factory=dict)
    #: the correction once settled, as a share of the reduction: the model's error here
    settled_share: float | None = None
    settled_error_kw: float = 0.0  #: the same in kW: what it planned less what it asked
    #: a delta held on the site's gain (`FLEXGATE_LOOP_DELTA_BASIS`), not on the meter
    on_gain: bool = False
    #: on the site's gain: the planned moves (when, model kW shed) whose answer at the meter
    #: is awaited (`GainHold._read_answer`), the meter's level before them [kW] (None: not
    #: flat, the answer is the model's), and the shed so far at the meter, each move's answer
    #: read on its own (a static load step between them is in none) [kW]
    answering: list[tuple[float, float]] = field(default_factory=list)
    before_kw: float | None = None
    before_gpu_kw: float | None = None  #: the agents' GPU power in the same readings [kW]
    shed_kw: float = 0.0
    answers: int = 0  #: the moves' answers read (the first is the site's gain)
    #: the meter faulted or was suspected during the event: what it settled on is not the
    #: model's error, and the events after it do not learn from it
    faulted: bool = False
    #: the job mix changed under the event, or the GPU power stepped with no plan: what it
    #: settled on is the model's baseline for the jobs that came and went, not the caps'
    churned: bool = False
    #: a static load step was last fed forward then: the readings before it are not read again
    fed_s: float = -math.inf
    #: the static load's steps fed forward, summed, as the correction took them [kW]
    static_fed_kw: float = 0.0
    #: the agents' GPU power over the window before the event, from the site at rest [kW]
    start_gpu_kw: float | None = None
    #: a feed-forward's move as the agents' GPU power should show it: (the GPU power before,
    #: after [kW], what the model planned before it [kW]); None once its answer is read
    fed_gpu: tuple[float, float, float] | None = None
    #: a step of the GPU power no plan made was last fed forward then [s]; what such steps
    #: moved the meter by, until the scheduler reports the job, and the correction by, until
    #: the reduction takes it over, summed [kW]
    gpu_fed_s: float = -math.inf
    gpu_fed_meter_kw: float = 0.0
    #: the job mix last changed then: which GPUs placed jobs hold changed with it [s]
    mix_changed_s: float = -math.inf
    #: (when, GPU kW) each plan moved the GPUs' power by, by the model (the latest
    #: `PLANNED_KEPT`): what a step of the agents' GPU power that was the plans' own shows
    planned_gpu: list[tuple[float, float]] = field(default_factory=list)
    gpu_fed_kw: float = 0.0


def carried_correction_kw(pursuit: Pursuit, reduction_kw: float) -> float:
    """The correction for a new reduction asked of the same event: the model's error as an
    offset and a gain, `a + b * reduction`, fitted on the corrections it settled at two or more
    reductions at least `SPREAD` apart; with fewer, all of it a gain (a model's error at the
    meter is mostly in what the caps shed: the baseline was read at the meter before the event),
    scaled from the reduction it was taken at. A correction kept as kW misread a deep cut's
    error at a shallow one: 19 kW then 4 kW shed 5.7 kW (+43%) for 30 s."""
    points = sorted(pursuit.settled_at.items())
    if len(points) >= 2 and points[-1][0] - points[0][0] >= SPREAD * points[-1][0]:
        asked = np.array([r for r, _ in points])
        taken = np.array([c for _, c in points])
        b, a = np.polyfit(asked, taken, 1)
        return float(a + b * reduction_kw)
    if pursuit.reduction_kw <= 0.0:
        return pursuit.correction_kw
    return pursuit.correction_kw * reduction_kw / pursuit.reduction_kw


def asked_at_meter_kw(pursuit: Pursuit) -> float:
    """The reduction the event asks at the meter [kW]: the model's, or for a level the meter's
    own distance to it when that is more (a model whose baseline is low asks too little, and
    a correction bounded by that could never reach the level)."""
    if pursuit.reference_kw is None or pursuit.target_kw is None or pursuit.level_kw is None:
        return pursuit.reduction_kw
    return max(pursuit.reduction_kw, pursuit.reference_kw - pursuit.target_kw)
