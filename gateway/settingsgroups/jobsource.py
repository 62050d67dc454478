"""Where the jobs come from: static, Slurm or Kubernetes (gateway.jobsource)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from gateway.settingsgroups.base import SettingsGroup


class JobSourceSettings(SettingsGroup):
    job_source: Literal["static", "slurm", "kubernetes"] = "static"  #: where the jobs come from
    job_source_poll_s: float = Field(default=15.0, gt=0.0)
    job_source_timeout_s: float = Field(default=10.0, gt=0.0)
    job_source_stale_s: float = Field(default=120.0, gt=0.0)
    job_source_default_tier: int = Field(default=1, ge=0)  #: a job that names no tier
    job_source_gpu_power_w: float = Field(default=600.0, ge=50.0, le=2000.0)
    job_source_throughput_per_gpu: float = Field(default=1000.0, gt=0.0)
    slurm_bin_dir: str = ""  #: where squeue is; empty: PATH
    kubernetes_kubeconfig: Path | None = None  #: None: the pod's service account (in-cluster)
    kubernetes_namespace: str = ""  #: empty: every namespace
    kubernetes_watch_s: float = Field(default=300.0, ge=1.0)  #: one watch request's length
