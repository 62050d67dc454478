"""The gateway's settings: environment variables prefixed `FLEXGATE_` (docs/configuration.md).

Read through `get_settings()` (cached), never at import; `create_app(settings)` takes them as
an argument so tests pass their own.
"""

from __future__ import annotations

import ipaddress
import os
import re
from datetime import date, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from agents.protocol import (
    AGENT_NAMESPACE,
    LAB_TOKEN,
    MIN_TOKEN_CHARS,
    NATS_NODE_ID,
    PLACEHOLDER_TOKENS,
    node_token,
    unknown_variables,
)
from flexmodel.baselines import RULE_NAMES, is_preset
from flexmodel.droop import DEFAULT_PHASE_BOUND_DEG
from flexmodel.errors import FlexModelError, InvalidJobError
from flexmodel.frequencyrule import FrequencyRule
from flexmodel.localdays import INTERVAL_MINUTES
from flexmodel.quote import DEFAULT_POWER_UNCERTAINTY
from flexmodel.tiers import TierTable
from gateway.meter.frequency import open_frequency
from gateway.meter.sources import DEFAULT_JSON_KEY, open_meter
from gateway.settingsfiles import read_agents_file, url_with_password

LAB_API_TOKEN = "lab-api-token"
#: The OpenADR 3.1 mock VTN's lab client (`flexgate mock-vtn --openadr 3.1`), used with
#: `--lab` when no client is configured.
LAB_VTN_CLIENT_ID = "flexgate-lab-ven"
LAB_VTN_CLIENT_SECRET = "flexgate-lab-ven-secret"


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="FLEXGATE_", extra="ignore", hide_input_in_errors=True
    )

    database_url: str = "sqlite:///.flexgate/gateway.db"
    #: the store's password, read from this file (a mounted secret) into the URL; None: the
    #: URL's own, if any
    database_password_file: Path | None = None
    api_token: SecretStr = SecretStr("")
    read_token: SecretStr | None = None
    #: without a read token, reads (the dashboard, the API's GETs, quotes) are open to anyone
    #: who reaches the port: outside the lab only when this says so
    read_public: bool = False
    agent_token: SecretStr = SecretStr("")
    #: each agent's token derived from this and its node id (`node_token`), instead of the one
    #: FLEXGATE_AGENT_TOKEN every agent shares
    node_token_secret: SecretStr | None = None
    #: the CA the agents' certificates are verified against (https:// agent URLs); None: the
    #: system's CAs
    agents_ca: Path | None = None
    agents: str = Field(
        default="", description="comma-separated agent base URLs (node ids over NATS)"
    )
    #: the agents one a line (URLs, or node ids over NATS; `#` comments), instead of
    #: FLEXGATE_AGENTS
    agents_file: Path | None = None
    transport: Literal["http", "nats"] = "http"
    nats_url: str = "nats://127.0.0.1:4222"
    nats_token: SecretStr | None = None
    nats_user: str | None = None
    nats_password: SecretStr | None = None
    nats_tls_ca: Path | None = None
    overhead_factor: float = Field(default=1.3, ge=1.0)
    overhead_factor_stderr: float = Field(default=0.05, ge=0.0)
    static_load_kw: float = Field(default=0.0, ge=0.0)
    lease_s: float = Field(default=120.0, gt=0.0, le=86400.0)
    reconcile_period_s: float = Field(default=15.0, gt=0.0)
    recovery_ramp_s: float = Field(default=60.0, ge=0.0)
    recovery_steps: int = Field(default=4, ge=1, le=100)
    dispatch_timeout_s: float = Field(default=5.0, gt=0.0)
    dispatch_retries: int = Field(default=3, ge=0, le=10)
    telemetry_max_age_s: float = Field(default=1.0, ge=0.0)
    #: how often jobs' PFIs are predicted from their telemetry [s]
    predictor_period_s: float = Field(default=30.0, gt=0.0, le=86400.0)
    #: the site's measured jobs the predictor needs before it is refitted on them alone
    predictor_min_jobs: int = Field(default=8, ge=3, le=100_000)
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    log_level: str = "info"
    vtn_url: str = Field(default="", description="the VTN's endpoint; empty: no VEN")
    openadr: Literal["2.0b", "3.1"] = "2.0b"  #: the OpenADR version the VEN speaks
    vtn_client_id: str = ""  #: OpenADR 3.1: the OAuth2 client the VTN's operator issued
    vtn_client_secret: SecretStr = SecretStr("")  #: OpenADR 3.1: its secret
    vtn_token_url: str = ""  #: OpenADR 3.1: the token service; empty: `GET /auth/server`
    #: OpenADR 3.1: how the client credentials reach the token service: in the form body (the
    #: 3.1.0 schema's clientCredentialRequest) or as HTTP Basic (RFC 6749 2.3.1)
    vtn_client_auth: Literal["body", "basic"] = "body"
    vtn_allow_http: bool = False  #: OpenADR 3.1: plain HTTP to a VTN on loopback
    vtn_poll_s: float = Field(default=10.0, gt=0.0)  #: OpenADR 3.1: events are read this often
    #: OpenADR 3.1 safe mode: `programName=kW,...`, each program's import limit held while the
    #: VTN is unreachable; FALLBACK_EVENT names events that set it; FALLBACK_AFTER_S the wait
    vtn_fallback_limits: str = ""
    vtn_fallback_event: str = ""
    vtn_fallback_after_s: float = Field(default=300.0, gt=0.0)
    ven_callback_url: str = ""  #: OpenADR 3.1: where the VTN posts notifications; empty: poll
    vtn_mqtt: bool = True  #: OpenADR 3.1: use the VTN's MQTT notifier when it offers one
    vtn_mqtt_username: str = ""  #: OpenADR 3.1: the broker's username; empty: as the VTN says
    vtn_mqtt_password: SecretStr = SecretStr("")  #: OpenADR 3.1: with vtn_mqtt_username
    ven_name: str = "flexgate"
    ven_groups: str = Field(default="", description="comma-separated groupIDs this VEN answers")
    ven_resources: str = Field(default="", description="comma-separated resourceIDs it controls")
    vtn_fingerprint: str | None = None
    vtn_allow_unsigned: bool = False
    ven_cert: Path | None = None
    ven_key: Path | None = None
    opt_policy: Literal["feasible", "always", "never"] = "feasible"
    opt_confidence: float = Field(default=0.9, gt=0.0, lt=1.0)
    #: relative standard error of a declared job power, carried into firm kW (docs/model.md)
    declared_power_uncertainty: float = Field(default=DEFAULT_POWER_UNCERTAINTY, ge=0.0, lt=1.0)
    #: the last events whose delivery at the meter scales firm kW; 0: the model alone
    quote_history_events: int = Field(default=10, ge=0)
    lab: bool = False
    #: plans may rest on agents with simulated GPUs outside the lab (a demo or staging site);
    #: otherwise an event is refused while any known agent runs the sim backend
    allow_simulated: bool = False
    #: a manual event asking more than this many times the kW the site can shed now is refused
    #: (422) unless forced: watts typed as kW would drive every job to its floor
    event_max_overreach: float = Field(default=3.0, ge=1.0, le=1000.0)
    meter_url: str = Field(default="", description="the facility meter; empty: the estimate")
    meter_json_key: str = DEFAULT_JSON_KEY
    meter_period_s: float = Field(default=5.0, gt=0.0)
    meter_timeout_s: float = Field(default=2.0, gt=0.0)
    meter_max_age_s: float | None = Field(default=None, gt=0.0)  #: None: three periods
    meter_max_step_kw: float | None = Field(default=None, gt=0.0)  #: None: no jump check
    #: the meter path until a calibration identifies it (flexmodel.meterpath): the meter's own
    #: transport delay, the first-order time constant after it, each reading's averaging [s]
    meter_dead_s: float = Field(default=0.0, ge=0.0)
    meter_lag_s: float = Field(default=0.0, ge=0.0)
    meter_averaging_s: float = Field(default=0.0, ge=0.0)
    #: silent faults (gateway.meter.watch): the meter's noise, one standard deviation [kW], and
    #: the smallest predicted move it must answer (None: 2% of the site or six noise deviations)
    meter_noise_kw: float = Field(default=0.0, ge=0.0)
    meter_check_kw: float | None = Field(default=None, gt=0.0)
    meter_max_kw: float | None = Field(default=None, gt=0.0)  #: the site's physical maximum
    #: the meter history (gateway.services.meterhistory): every site sample stored, written in
    #: batches every FLUSH_S, kept RAW_KEEP_S (at least an hour: the 30-minute intervals are
    #: rolled up from them), and its 1/5/15/30-minute intervals kept KEEP_DAYS
    meter_history: bool = True
    meter_history_flush_s: float = Field(default=10.0, gt=0.0, le=3600.0)
    meter_history_raw_keep_s: float = Field(default=7 * 86400.0, ge=3600.0)
    meter_history_keep_days: float = Field(default=400.0, ge=90.0)
    #: settlement (gateway.services.settlement): the program's baseline rules (presets of
    #: flexmodel.baselines), the site's time zone (IANA) its clock intervals are in, their
    #: length [min], and the program's holidays (ISO dates)
    settlement_rules: str = Field(default="10of10,sameday-3+2", description="preset names")
    site_timezone: str = "UTC"
    settlement_interval_min: int = 15
    #: a fast event's (source `fast`) rules and interval length [min]: the level just before
    #: the trigger, in minutes, as fast services settle (docs/fast.md)
    fast_settlement_rules: str = Field(default="meterbefore-30s", description="preset names")
    fast_settlement_interval_min: int = 1
    settlement_holidays: str = Field(default="", description="comma-separated ISO dates")
    #: a preset the opt-in decision also counts an event under (gateway.services.counted):
    #: opted out when the firm kW the utility would count falls short; None: not counted
    opt_in_baseline: str | None = Field(default=None, description="a preset name")
    #: the preset the VENs' BASELINE and DELTA_USAGE reports (3.1) and settlement report (2.0b)
    #: follow (gateway.openadr.programbaseline); None: the uncapped power, as before
    report_baseline: str | None = Field(default=None, description="a preset name")
    calibrate: bool = True  #: fit the overhead factor on the meter (a real meter only)
    calibration_window_s: float = Field(default=60.0, gt=0.0)
    calibration_settle_s: float = Field(default=60.0, ge=0.0)
    calibration_history_s: float = Field(default=3600.0, gt=0.0)
    calibration_every_s: float = Field(default=300.0, gt=0.0)
    tracking: bool = True  #: close the site loop at the meter during events
    loop_window_s: float | None = Field(default=None, gt=0.0)  #: None: from the jobs' periods
    loop_gain: float = Field(default=0.5, gt=0.0, le=1.5)  #: share of the error taken per sample
    loop_max_correction: float = Field(default=1.0, gt=0.0, le=2.0)
    #: how a delta (a reduction from what the site would draw) is held where there is a meter:
    #: "gain", the model's plan at the site's measured gain (the meter's answer to the
    #: events' opening steps: a cooling step or a meter offset is not the event's); "meter",
    #: the meter's reading at the meter before the event less the reduction (what a
    #: meter-before settlement counts)
    loop_delta_basis: Literal["gain", "meter"] = "gain"
    #: a ceiling (an import capacity limit) is judged on means over this interval, from this
    #: long after it began (the ramp allowance) [s]
    limit_interval_s: float = Field(default=60.0, gt=0.0)
    limit_ramp_s: float = Field(default=60.0, ge=0.0)
    #: what a GPU no job uses draws [W]: a job that ends mid-event frees its GPUs to this
    gpu_idle_w: float = Field(default=80.0, ge=0.0, le=500.0)
    #: the model's gain error the loop's gain must be robust to (flexmodel.looprobust)
    loop_gain_error: float = Field(default=0.3, ge=0.0, lt=1.0)
    #: lab only: the site loop keeps a configuration the sync analysis rejects (the lock lab)
    loop_unsafe: bool = False
    scatter: Literal["auto", "off"] = "auto"  #: spread the jobs' rates when they lock
    scatter_spread: float = Field(default=0.01, gt=0.0, le=0.5)  #: first half-width of rates
    scatter_max_spread: float = Field(default=0.08, gt=0.0, le=0.5)  #: widened up to this
    #: the site power's oscillation band watched [Hz], and the in-band swing (RMS) that raises
    #: the alarm and starts scattering [kW]; None: watched, no alarm
    oscillation_band_low_hz: float = Field(default=0.1, ge=0.0)
    oscillation_band_high_hz: float = Field(default=20.0, gt=0.0)
    oscillation_limit_kw: float | None = Field(default=None, gt=0.0)
    #: the most the site's power may fall (down) or rise (up) per minute by the gateway's
    #: plans, at the meter [kW/min]; None: no bound
    ramp_down_kw_per_min: float | None = Field(default=None, gt=0.0)
    ramp_up_kw_per_min: float | None = Field(default=None, gt=0.0)
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
    tiers: str = Field(default="0,0.10,0.25,0.50", description="tolerated slowdown per tier")
    tier_slowdown_means: Literal["throughput", "duration"] = "throughput"
    #: characterisation (gateway.services.characterise): the share of the site's throughput
    #: (tokens/s of the jobs probed, over the mix's) that may be under probe at once
    probe_budget: float = Field(default=0.25, gt=0.0, le=1.0)
    probe_levels: int = Field(default=3, ge=1, le=10)  #: capped levels per probe
    #: capped levels between the uncapped references that measure a probe's drift (the
    #: references run before the first capped level and after the last anyway); 0: no more
    probe_reference_every: int = Field(default=2, ge=0, le=10)
    probe_periods: float = Field(default=20.0, ge=3.0, le=1000.0)  #: iterations per level
    probe_settle_s: float = Field(default=2.0, ge=0.0)  #: added to each level's hold
    #: no level below this throughput fraction (nor below the job's own floor)
    probe_min_throughput_fraction: float = Field(default=0.65, gt=0.0, lt=1.0)
    probe_every_s: float = Field(default=0.0, ge=0.0)  #: probe unmeasured jobs; 0: never
    curve_harvest_s: float = Field(default=60.0, gt=0.0)  #: agents' points read this often
    #: a measured curve replaces the declared one once its PFI's standard error is this small
    curve_max_pfi_stderr: float = Field(default=0.15, gt=0.0)
    #: below a measured curve's lowest level: the fleet family at its PFI, or nothing
    curve_extend: Literal["family", "none"] = "family"
    #: between a measured curve's levels: a monotone cubic, or straight lines
    curve_interpolation: Literal["pchip", "linear"] = "pchip"
    #: what a measured curve is planned on: the fleet family's shape at the measured PFI and
    #: uncapped level, or the measured points themselves (as interpolated and extended above)
    curve_shape: Literal["family", "points"] = "family"
    #: the fast path's armed depths, percent of the site's power, comma-separated (10,20,30);
    #: empty: no plans armed, no fast trigger (docs/fast.md)
    fast_depths: str = ""
    fast_secret: SecretStr | None = None  #: signs fast triggers; the agents' FAST_SECRET
    fast_rearm_s: float = Field(default=10.0, gt=0.0, le=3600.0)  #: how often plans are checked
    #: an OpenADR event with zero notice whose reduction matches an armed depth fires the fast
    #: path (gateway/openadr/zeronotice.py); its notice at most this [s], its reduction within
    #: this many percentage points of the depth
    fast_openadr: bool = True
    fast_openadr_max_notice_s: float = Field(default=2.0, ge=0.0, le=60.0)
    fast_openadr_depth_tolerance_pct: float = Field(default=1.0, ge=0.0, le=50.0)
    #: the frequency trigger's feed (modbus://... or tcp://host:port); empty: off (docs/fast.md)
    frequency_url: str = ""
    frequency_mode: Literal["threshold", "droop"] = "threshold"
    frequency_period_s: float = Field(default=0.1, gt=0.0, le=0.1)  #: sampled at 10 Hz or faster
    frequency_timeout_s: float = Field(
        default=0.5, gt=0.0, le=10.0
    )  #: a feed silent this long: fault
    frequency_nominal_hz: float = Field(default=50.0, ge=45.0, le=65.0)
    frequency_threshold_hz: float = 49.7  #: threshold mode: fires below this
    frequency_depth_pct: float | None = None  #: threshold mode's depth; None: the deepest armed
    frequency_dead_band_hz: float = Field(default=0.015, ge=0.0)  #: droop: none this near nominal
    frequency_full_hz: float = 49.5  #: droop: the deepest armed depth at and below this
    frequency_hysteresis_hz: float = Field(default=0.05, ge=0.0)
    frequency_retrigger_s: float = Field(default=2.0, ge=0.0)  #: at most one trigger per this
    frequency_hold_s: float = Field(default=30.0, gt=0.0, le=3600.0)  #: each trigger's caps hold
    frequency_min_hz: float = 45.0  #: a reading outside min-max is a fault
    frequency_max_hz: float = 65.0
    #: the grid's frequency change per MW of the site's power [Hz/MW]; droop mode needs it
    frequency_stiffness_hz_per_mw: float | None = Field(default=None, ge=0.0)
    #: the trigger path's delay, trigger to caps enforced (bench/fast_bench.py measures it) [s]
    frequency_trigger_delay_s: float = Field(default=0.1, ge=0.0, le=10.0)
    frequency_phase_bound_deg: float = Field(default=DEFAULT_PHASE_BOUND_DEG, gt=0.0, le=180.0)

    @property
    def tier_table(self) -> TierTable:
        """The flexibility tiers (FLEXGATE_TIERS read as FLEXGATE_TIER_SLOWDOWN_MEANS says)."""
        try:
            slowdowns = tuple(float(s) for s in self.tiers.split(","))
        except ValueError:
            raise ValueError(
                f"FLEXGATE_TIERS must be comma-separated fractions (0,0.10,0.25,0.50), "
                f"got {self.tiers!r}"
            ) from None
        try:
            return TierTable(slowdowns, self.tier_slowdown_means)
        except InvalidJobError as exc:
            raise ValueError(f"FLEXGATE_TIERS: {exc}") from None

    @property
    def fast_depths_pct(self) -> tuple[float, ...]:
        """FLEXGATE_FAST_DEPTHS as numbers, ascending; ValueError naming a wrong one."""
        try:
            depths = sorted({float(d) for d in self.fast_depths.split(",") if d.strip()})
        except ValueError:
            raise ValueError(
                f"FLEXGATE_FAST_DEPTHS must be comma-separated percentages (10,20,30,40), "
                f"got {self.fast_depths!r}"
            ) from None
        if any(not 0.0 < d <= 100.0 for d in depths):
            raise ValueError(f"FLEXGATE_FAST_DEPTHS {self.fast_depths!r}: each in (0, 100]")
        return tuple(depths)

    @property
    def frequency_rule(self) -> FrequencyRule | None:
        """The frequency trigger's rule (None: FLEXGATE_FREQUENCY_URL empty); ValueError naming
        the settings that cannot work."""
        if not self.frequency_url.strip():
            return None
        depths = self.fast_depths_pct
        try:
            return FrequencyRule(
                self.frequency_mode,
                depths,
                nominal_hz=self.frequency_nominal_hz,
                threshold_hz=self.frequency_threshold_hz,
                depth_pct=self.frequency_depth_pct or max(depths, default=0.0),
                dead_band_hz=self.frequency_dead_band_hz,
                full_hz=self.frequency_full_hz,
                hysteresis_hz=self.frequency_hysteresis_hz,
                retrigger_s=self.frequency_retrigger_s,
                hold_s=self.frequency_hold_s,
                min_hz=self.frequency_min_hz,
                max_hz=self.frequency_max_hz,
            )
        except FlexModelError as exc:
            raise ValueError(
                f"the frequency trigger (FLEXGATE_FREQUENCY_*, FLEXGATE_FAST_DEPTHS): {exc}"
            ) from None

    @property
    def agent_urls(self) -> list[str]:
        return [u.strip().rstrip("/") for u in self.agents.split(",") if u.strip()]

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_variables(cls, data: Any) -> Any:
        """Before the fields: a misspelt name explains a missing setting better than the
        missing setting's own error does. `FLEXGATE_AGENT_*` is the agents' (they check it)."""
        problem = unknown_variables(
            os.environ, cls.model_fields, foreign=lambda name: name.startswith(AGENT_NAMESPACE)
        )
        if problem:
            raise ValueError(problem)
        return data

    @model_validator(mode="after")
    def _refuse_placeholders(self) -> GatewaySettings:
        self._read_files()
        for name, lab_value in (("api_token", LAB_API_TOKEN), ("agent_token", LAB_TOKEN)):
            token = getattr(self, name).get_secret_value()
            if name == "agent_token" and self.node_token_secret is not None:
                self._check_node_token_secret()
                continue
            if self.lab and not token:
                setattr(self, name, SecretStr(lab_value))
            elif not self.lab and (
                token.lower() in PLACEHOLDER_TOKENS or len(token) < MIN_TOKEN_CHARS
            ):
                raise ValueError(
                    f"FLEXGATE_{name.upper()} must be set to a secret of at least "
                    f"{MIN_TOKEN_CHARS} characters (placeholders are refused outside the lab)"
                )
        if self.vtn_url and self.openadr == "3.1":
            self._check_openadr31()
        elif self.vtn_url and not (self.lab or self.vtn_fingerprint or self.vtn_allow_unsigned):
            raise ValueError(
                "FLEXGATE_VTN_FINGERPRINT must be set with FLEXGATE_VTN_URL: without it openleadr "
                "checks no signature and a forged event would cap real GPUs (set "
                "FLEXGATE_VTN_ALLOW_UNSIGNED=true only for a VTN that signs nothing, on a trusted "
                "network)"
            )
        if (self.ven_cert is None) != (self.ven_key is None):
            raise ValueError("FLEXGATE_VEN_CERT and FLEXGATE_VEN_KEY go together")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("FLEXGATE_TLS_CERT and FLEXGATE_TLS_KEY go together")
        if self.agents_ca is not None and not self.agents_ca.is_file():
            raise ValueError(f"FLEXGATE_AGENTS_CA {self.agents_ca}: no such file")
        self._check_meter()
        self._check_settlement()
        if self.job_source_default_tier >= self.tier_table.count:
            raise ValueError(
                f"FLEXGATE_JOB_SOURCE_DEFAULT_TIER ({self.job_source_default_tier}) names no tier "
                f"of FLEXGATE_TIERS ({self.tier_table.count} tiers, 0 to "
                f"{self.tier_table.count - 1})"
            )
        self._check_nats()
        self._check_fast()
        self._check_frequency()
        if self.loop_unsafe and not self.lab:
            raise ValueError(
                "FLEXGATE_LOOP_UNSAFE keeps a site loop the sync analysis rejects, which makes "
                "jobs phase-lock: it is for the lab's lock scenario only (FLEXGATE_LAB=true)"
            )
        self._check_reads()
        if self.oscillation_band_high_hz <= self.oscillation_band_low_hz:
            raise ValueError(
                f"FLEXGATE_OSCILLATION_BAND_HIGH_HZ ({self.oscillation_band_high_hz:g}) must be "
                f"above FLEXGATE_OSCILLATION_BAND_LOW_HZ ({self.oscillation_band_low_hz:g})"
            )
        if self.scatter_max_spread < self.scatter_spread:
            raise ValueError(
                f"FLEXGATE_SCATTER_MAX_SPREAD ({self.scatter_max_spread:g}) must be at least "
                f"FLEXGATE_SCATTER_SPREAD ({self.scatter_spread:g}): the spread only widens"
            )
        return self

    def _check_fast(self) -> None:
        secret = self.fast_secret.get_secret_value() if self.fast_secret else None
        if secret is not None and (
            secret.lower() in PLACEHOLDER_TOKENS or len(secret) < MIN_TOKEN_CHARS
        ):
            raise ValueError(
                f"FLEXGATE_FAST_SECRET must be a secret of at least {MIN_TOKEN_CHARS} characters "
                "(placeholders are refused)"
            )
        if self.fast_depths_pct and secret is None:
            raise ValueError(
                "FLEXGATE_FAST_DEPTHS needs FLEXGATE_FAST_SECRET (the agents' "
                "FLEXGATE_AGENT_FAST_SECRET): triggers are signed"
            )

    def _check_frequency(self) -> None:
        if not self.frequency_url.strip():
            return
        if not self.fast_depths_pct:
            raise ValueError("FLEXGATE_FREQUENCY_URL needs FLEXGATE_FAST_DEPTHS: it fires them")
        open_frequency(self.frequency_url, timeout_s=self.frequency_timeout_s)
        rule = self.frequency_rule  # built: one that cannot work is refused
        if rule is not None and rule.mode == "droop" and self.frequency_stiffness_hz_per_mw is None:
            raise ValueError(
                "FLEXGATE_FREQUENCY_MODE=droop needs FLEXGATE_FREQUENCY_STIFFNESS_HZ_PER_MW (the "
                "grid's Hz per MW): the droop's phase is checked against it before it starts"
            )

    def _read_files(self) -> None:
        """FLEXGATE_AGENTS_FILE into `agents`, the password file into `database_url`."""
        if self.agents_file is not None:
            if self.agents.strip():
                raise ValueError("set FLEXGATE_AGENTS or FLEXGATE_AGENTS_FILE, not both")
            self.agents = ",".join(read_agents_file(self.agents_file))
        if self.database_password_file is not None:
            self.database_url = url_with_password(self.database_url, self.database_password_file)

    def _check_node_token_secret(self) -> None:
        assert self.node_token_secret is not None
        secret = self.node_token_secret.get_secret_value()
        if self.agent_token.get_secret_value():
            raise ValueError(
                "set FLEXGATE_NODE_TOKEN_SECRET (a token per node) or FLEXGATE_AGENT_TOKEN (one "
                "shared token), not both"
            )
        if not self.lab and (secret.lower() in PLACEHOLDER_TOKENS or len(secret) < 32):
            raise ValueError(
                "FLEXGATE_NODE_TOKEN_SECRET must be a secret of at least 32 characters "
                "(placeholders are refused outside the lab)"
            )

    def token_for(self, node_id: str) -> str:
        """The bearer token the agent of `node_id` expects."""
        if self.node_token_secret is not None:
            return node_token(self.node_token_secret.get_secret_value(), node_id)
        return self.agent_token.get_secret_value()

    def _check_reads(self) -> None:
        read = self.read_token.get_secret_value() if self.read_token is not None else ""
        if self.lab:
            return
        if not read and not self.read_public:
            raise ValueError(
                "FLEXGATE_READ_TOKEN must be set outside the lab: without it anyone who reaches "
                "the port reads the dashboard, the jobs and the events (set "
                "FLEXGATE_READ_PUBLIC=true to make reads public on purpose)"
            )
        if read and (read.lower() in PLACEHOLDER_TOKENS or len(read) < MIN_TOKEN_CHARS):
            raise ValueError(
                f"FLEXGATE_READ_TOKEN must be a secret of at least {MIN_TOKEN_CHARS} characters "
                "(placeholders are refused outside the lab)"
            )

    def _check_openadr31(self) -> None:
        if self.lab and not self.vtn_client_id:
            self.vtn_client_id, self.vtn_client_secret = (
                LAB_VTN_CLIENT_ID,
                SecretStr(LAB_VTN_CLIENT_SECRET),
            )
        # The callback carries the subscription's bearer token: the same rule as the VTN.
        for name in ("vtn_url", "vtn_token_url", "ven_callback_url"):
            problem = insecure_url(getattr(self, name), allow_http=self.lab or self.vtn_allow_http)
            if problem:
                raise ValueError(f"FLEXGATE_{name.upper()}: {problem}")
        if self.vtn_mqtt_password.get_secret_value() and not self.vtn_mqtt_username:
            raise ValueError(
                "FLEXGATE_VTN_MQTT_PASSWORD is set without FLEXGATE_VTN_MQTT_USERNAME: set both, "
                "or neither to use the credentials the VTN's MQTT notifier names"
            )
        try:
            parse_fallback_limits(self.vtn_fallback_limits)
        except ValueError as exc:
            raise ValueError(f"FLEXGATE_VTN_FALLBACK_LIMITS: {exc}") from None
        secret = self.vtn_client_secret.get_secret_value()
        if not self.vtn_client_id or not secret:
            raise ValueError(
                "FLEXGATE_VTN_CLIENT_ID and FLEXGATE_VTN_CLIENT_SECRET must be set with "
                "FLEXGATE_OPENADR=3.1: the VTN answers only OAuth2 clients it issued"
            )
        if not self.lab and (
            secret.lower() in PLACEHOLDER_TOKENS or secret == LAB_VTN_CLIENT_SECRET
        ):
            raise ValueError(
                "FLEXGATE_VTN_CLIENT_SECRET is a placeholder or the lab's secret: set the one "
                "the VTN's operator issued (placeholders are refused outside the lab)"
            )

    def _check_nats(self) -> None:
        if (self.nats_user is None) != (self.nats_password is None):
            raise ValueError("FLEXGATE_NATS_USER and FLEXGATE_NATS_PASSWORD go together")
        if self.nats_token is not None and self.nats_user is not None:
            raise ValueError("set FLEXGATE_NATS_TOKEN or FLEXGATE_NATS_USER/_PASSWORD, not both")
        if self.transport != "nats":
            return
        if self.nats_token is None and self.nats_user is None and not self.lab:
            raise ValueError(
                "FLEXGATE_TRANSPORT=nats needs FLEXGATE_NATS_TOKEN or FLEXGATE_NATS_USER and "
                "FLEXGATE_NATS_PASSWORD (anonymous NATS is for the lab only)"
            )
        bad = [a for a in self.agent_urls if not re.match(NATS_NODE_ID, a)]
        if bad:
            raise ValueError(
                f"FLEXGATE_AGENTS over NATS lists node ids (letters, digits, '-', '_'), not "
                f"{', '.join(bad[:3])}"
            )

    @property
    def settlement_rule_names(self) -> tuple[str, ...]:
        """FLEXGATE_SETTLEMENT_RULES as a list of preset names (checked at load)."""
        return tuple(n.strip() for n in self.settlement_rules.split(",") if n.strip())

    @property
    def fast_settlement_rule_names(self) -> tuple[str, ...]:
        """FLEXGATE_FAST_SETTLEMENT_RULES as a list of preset names (checked at load)."""
        return tuple(n.strip() for n in self.fast_settlement_rules.split(",") if n.strip())

    def settles_with(self, source: str) -> tuple[tuple[str, ...], int]:
        """The rules and interval length [min] an event from `source` is settled under."""
        if source == "fast":
            return self.fast_settlement_rule_names, self.fast_settlement_interval_min
        return self.settlement_rule_names, self.settlement_interval_min

    @property
    def site_zone(self) -> ZoneInfo:
        return ZoneInfo(self.site_timezone)

    @property
    def holiday_dates(self) -> frozenset[date]:
        return parse_dates(self.settlement_holidays)

    def _check_settlement(self) -> None:
        for key, names in (
            ("SETTLEMENT_RULES", self.settlement_rule_names),
            ("FAST_SETTLEMENT_RULES", self.fast_settlement_rule_names),
        ):
            for name in names:
                if not is_preset(name):
                    raise ValueError(
                        f"FLEXGATE_{key}: {name!r} is not a baseline preset (one of {RULE_NAMES})"
                    )
        for key, chosen in (
            ("OPT_IN_BASELINE", self.opt_in_baseline),
            ("REPORT_BASELINE", self.report_baseline),
        ):
            if chosen is not None and not is_preset(chosen):
                raise ValueError(
                    f"FLEXGATE_{key}: {chosen!r} is not a baseline preset (one of {RULE_NAMES})"
                )
        for key, minutes in (
            ("SETTLEMENT_INTERVAL_MIN", self.settlement_interval_min),
            ("FAST_SETTLEMENT_INTERVAL_MIN", self.fast_settlement_interval_min),
        ):
            problem = interval_problem(minutes)
            if problem:
                raise ValueError(f"FLEXGATE_{key}: {problem}")
            problem = zone_problem(self.site_timezone, minutes)
            if problem:
                raise ValueError(f"FLEXGATE_SITE_TIMEZONE: {problem}")
        try:
            parse_dates(self.settlement_holidays)
        except ValueError as exc:
            raise ValueError(f"FLEXGATE_SETTLEMENT_HOLIDAYS: {exc}") from None

    def _check_meter(self) -> None:
        try:
            open_meter(self.meter_url, json_key=self.meter_json_key, timeout_s=self.meter_timeout_s)
        except ValueError as exc:
            raise ValueError(f"FLEXGATE_METER_URL / FLEXGATE_METER_JSON_KEY: {exc}") from exc
        if self.calibration_window_s < 2 * self.meter_period_s:
            raise ValueError(
                f"FLEXGATE_CALIBRATION_WINDOW_S ({self.calibration_window_s:g} s) must cover at "
                f"least two meter periods (FLEXGATE_METER_PERIOD_S {self.meter_period_s:g} s)"
            )
        if self.meter_max_age_s is not None and self.meter_max_age_s <= self.meter_period_s:
            raise ValueError(
                f"FLEXGATE_METER_MAX_AGE_S ({self.meter_max_age_s:g} s) must be longer than "
                f"FLEXGATE_METER_PERIOD_S ({self.meter_period_s:g} s), or every reading is stale"
            )


def insecure_url(url: str, *, allow_http: bool) -> str | None:
    """Why an OpenADR 3 URL may not be used, or None: HTTPS always, plain HTTP only to a
    loopback address and only when allowed (the lab, FLEXGATE_VTN_ALLOW_HTTP)."""
    if not url:
        return None
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return None
    if parts.scheme != "http" or not parts.hostname:
        return f"{url!r} is not an https:// URL"
    if not is_loopback(parts.hostname):
        return (
            f"{url} is plain HTTP to another machine: OpenADR 3 carries bearer tokens and "
            "events, so it must be https://"
        )
    if not allow_http:
        return (
            f"{url} is plain HTTP: use https://, or for a VTN on this machine set "
            "FLEXGATE_VTN_ALLOW_HTTP=true"
        )
    return None


def is_loopback(host: str) -> bool:
    """`localhost` or a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@lru_cache
def get_settings() -> GatewaySettings:
    return GatewaySettings()


def interval_problem(interval_min: int) -> str | None:
    """Why a settlement interval length [min] cannot be used, or None."""
    if interval_min not in INTERVAL_MINUTES:
        return f"{interval_min} is not one of {', '.join(map(str, INTERVAL_MINUTES))} minutes"
    return None


def zone_problem(name: str, interval_min: int) -> str | None:
    """Why a time zone cannot carry a site's clock intervals of `interval_min`, or None:
    unknown, or an offset from UTC off the intervals' grid (India's +5:30 on hours), since
    the meter history's intervals are aligned on UTC."""
    try:
        zone = ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return f"{name!r} is not a time zone of the IANA database (Europe/London, America/New_York)"
    for month in (1, 7):
        offset = zone.utcoffset(datetime(2026, month, 1))
        if offset is not None and offset.total_seconds() % (60 * interval_min):
            return (
                f"{name}'s offset from UTC ({offset}) is not a whole number of "
                f"{interval_min}-minute intervals: choose a shorter settlement interval"
            )
    return None


def parse_dates(text: str) -> frozenset[date]:
    """`2026-11-26,2026-12-25` -> the dates; ValueError naming the one that is not a date."""
    out = set()
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            out.add(date.fromisoformat(item))
        except ValueError:
            raise ValueError(f"{item!r} is not an ISO date (2026-11-26)") from None
    return frozenset(out)


def parse_fallback_limits(text: str) -> dict[str, float]:
    """`name=kW,name=kW` -> {program name: limit [kW]}; ValueError naming what is wrong."""
    limits: dict[str, float] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, value = item.rpartition("=")
        try:
            limit_kw = float(value)
        except ValueError:
            limit_kw = -1.0
        if not sep or not name.strip() or not limit_kw >= 0:
            raise ValueError(f"{item!r} is not programName=kW (a limit of 0 kW or more)")
        limits[name.strip()] = limit_kw
    return limits
