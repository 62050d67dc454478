"""What an event is measured against, sample by sample: the site as it would draw without the
event (the meter before it, moved by the job mix's model baseline as jobs start and end, and by
the GPU power steps fed forward), the event's target, and the meter's window."""

from __future__ import annotations

import numpy as np

from flexmodel.jobs import JobMix
from gateway.clock import Clock
from gateway.services.feedforward import FeedForward
from gateway.services.loopconfig import LoopConfig
from gateway.services.pursuit import Pursuit
from gateway.services.site import SitePower
from gateway.settings import GatewaySettings


class SiteReference:
    def __init__(
        self,
        settings: GatewaySettings,
        clock: Clock,
        site: SitePower,
        config: LoopConfig,
        feed_forward: FeedForward,
    ) -> None:
        self.settings, self.clock, self.site, self.config = settings, clock, site, config
        self.feed_forward = feed_forward

    def follow_mix(self, pursuit: Pursuit, mix: JobMix) -> None:
        """The job mix's move, by the model, expected at the meter from when the agents'
        GPU power showed it (a report comes seconds to a minute after a job ends or starts),
        else from now on."""
        if pursuit.start_facility_kw is None:
            # No whole window of the meter before the event: the model's baseline stands in.
            pursuit.start_facility_kw = self.site.facility_kw(pursuit.start_baseline_gpu_kw)
        baseline_kw = self.site.facility_kw(self._uncapped_gpu_kw(pursuit, mix))
        if pursuit.baseline_kw is not None and baseline_kw != pursuit.baseline_kw:
            move_kw = FeedForward.reported(pursuit, baseline_kw - pursuit.baseline_kw)
            pursuit.moves.append((self.feed_forward.reported_at_s(pursuit, move_kw), move_kw))
            pursuit.mix_changed_s, pursuit.churned = self.clock.monotonic(), True
            if pursuit.on_gain:  # the meter's move is not the plan's alone: the model's
                pursuit.shed_kw = pursuit.gain * pursuit.achieved_kw
                pursuit.answering, pursuit.before_kw = [], None
        pursuit.baseline_kw = baseline_kw

    def read(self, pursuit: Pursuit, mix: JobMix) -> None:
        """The meter's window, the site without the event and the target, into `pursuit`."""
        pursuit.measured_kw = self.site.filtered_kw(self.config.window_s)
        reference = self._reference_kw(pursuit, mix)
        target = None if pursuit.level_kw is None else pursuit.level_kw - pursuit.margin_kw
        if target is None and reference is not None:
            target = reference - pursuit.reduction_kw
        pursuit.target_kw, pursuit.reference_kw = target, reference

    def _reference_kw(self, pursuit: Pursuit, mix: JobMix) -> float | None:
        """What the site would draw at the meter without the event: the meter before it,
        moved by the model's baseline as the job mix changed, and by the GPU power's steps
        fed forward that the job mix does not show yet (or ever: a job's drift)."""
        if pursuit.start_facility_kw is None:
            return None
        moved_kw = self.site.facility_kw(self._uncapped_gpu_kw(pursuit, mix)) - (
            self.site.facility_kw(pursuit.start_baseline_gpu_kw)
        )
        return pursuit.start_facility_kw + moved_kw + pursuit.gpu_fed_meter_kw

    def _uncapped_gpu_kw(self, pursuit: Pursuit, mix: JobMix) -> float:
        """The GPUs' power without the event by the model [kW]: the placed jobs' baseline, and
        the idle draw of the GPUs the jobs ended since the event began have freed
        (`FLEXGATE_GPU_IDLE_W`; negative for GPUs jobs started since have taken)."""
        freed = pursuit.start_placed_gpus - sum(j.gpus for j in mix.placed)
        return mix.baseline_gpu_kw + freed * self.settings.gpu_idle_w / 1000.0

    def window_gpu_kw(self) -> float | None:
        """The agents' GPU power over the loop's window [kW] (None: no samples, or the agents
        send no power readings)."""
        window = self.site.window(self.config.window_s)
        if not window or not self.config.gpu_span_s():
            return None
        return float(np.mean([s.gpu_kw for s in window]))
