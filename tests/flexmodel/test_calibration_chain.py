"""The calibration test of the probe chain (issue 34, item 3): do the PFIs' errors mean what
they say?

Simulated probed jobs across the study's PFI range (fleet-family curves with the insensitive
share `m` from -0.2 to 0.65: PFI about 1.1 to 2.6 on the study's grid), each probed as the
gateway plans it (`flexmodel.drift.probe_sequence`: the uncapped level, four caps going down
to 350-500 W, the uncapped level between every two and at the end), held 5 to 40 iteration
periods a level (one level's throughput noise 2%/sqrt(periods), power 1%/sqrt(periods), as
stated by the agent), with a throughput drift of up to 2% and a power drift of up to 1% across
the probe, read by `flexmodel.drift.fit_probe`. Judged on the probe's kept grid (Eq. 1 on the
true curve at the caps the fit kept). The table in docs/benchmarks.md is `table()`.
"""

import numpy as np

from flexmodel.curves import FamilyShape, family_point
from flexmodel.drift import ProbeLevel, fit_probe, probe_sequence
from flexmodel.pfi import pfi_of_sweep
from flexmodel.sweeps import fit_sweep

SHAPE = FamilyShape.of(
    power_w=650.0, duty=0.8, comm_power_fraction=0.5, min_cap_w=200.0, max_cap_w=700.0
)


def simulate(seed: int, jobs: int, *, references: bool = True) -> dict[str, np.ndarray]:
    """Per job: the true PFI, the reported one, its standard error, the periods a level.
    Without `references`, the probe as it was: stepped down once, no drift measured."""
    rng = np.random.default_rng(seed)
    out: dict[str, list[float]] = {"truth": [], "pfi": [], "stderr": [], "periods": []}
    for _ in range(jobs):
        m = rng.uniform(-0.2, 0.65)
        caps = [700.0] + [float(round(c)) for c in np.linspace(700, rng.uniform(350, 500), 5)[1:]]
        seq = probe_sequence(caps, reference_every=2) if references else caps
        periods = rng.uniform(5, 40)
        noise_t, noise_p = 0.02 / np.sqrt(periods), 0.01 / np.sqrt(periods)
        drift_t, drift_p = rng.uniform(-0.02, 0.02), rng.uniform(-0.01, 0.01)
        power, frac = family_point(np.array([caps]), SHAPE, np.array([m]))
        truth = {c: (p, 20000.0 * f) for c, p, f in zip(caps, power[0], frac[0], strict=True)}
        span = len(seq) - 1
        levels = [
            ProbeLevel(
                c,
                float(i),
                truth[c][0] * (1 + drift_p * i / span) * (1 + noise_p * rng.standard_normal()),
                truth[c][1] * (1 + drift_t * i / span) * (1 + noise_t * rng.standard_normal()),
            )
            for i, c in enumerate(seq)
        ]
        if references:
            sweep = fit_probe(levels, noise=noise_t, power_noise=noise_p).sweep
        else:
            rows = [(lv.cap_w, lv.power_w, lv.throughput) for lv in levels]
            sweep = fit_sweep(rows, noise=noise_t, power_noise=noise_p)
        if sweep.pfi is None:
            continue
        true = pfi_of_sweep([(c, truth[c][0], truth[c][1]) for c in sweep.grid_w]).pfi
        for key, value in (("truth", true), ("pfi", sweep.pfi), ("stderr", sweep.pfi_stderr)):
            out[key].append(float(value))
        out["periods"].append(float(periods))
    return {k: np.array(v) for k, v in out.items()}


def scores(run: dict[str, np.ndarray]) -> dict[str, float]:
    z = (run["pfi"] - run["truth"]) / run["stderr"]
    return {
        "jobs": float(z.size),
        "coverage": float(np.mean(np.abs(z) <= 1.96)),
        "z_sd": float(z.std()),
        "bias": float(np.mean(run["pfi"] - run["truth"])),
        "mean_stderr": float(run["stderr"].mean()),
    }


def test_the_reported_intervals_cover_the_truth_as_stated():
    run = simulate(34, 2000)
    s = scores(run)
    assert s["jobs"] >= 1900
    assert run["truth"].min() >= 1.05  # the study's range
    assert run["truth"].max() >= 2.5
    assert 0.92 <= s["coverage"] <= 0.98, s
    assert 0.85 <= s["z_sd"] <= 1.15, s
    assert abs(s["bias"]) < 0.25 * s["mean_stderr"], s


def test_without_references_the_drift_breaks_the_calibration():
    """The probe as it was (no drift measured) on the same jobs: the errors do not hold."""
    s = scores(simulate(34, 600, references=False))
    assert s["coverage"] < 0.92 or s["z_sd"] > 1.15


def table() -> str:
    """The coverage and bias table of docs/benchmarks.md."""
    rows = [
        "| jobs | PFI | periods | coverage | sd(z) | bias / mean se |",
        "|---|---|---|---|---|---|",
    ]
    for label, run in (
        ("with references", simulate(34, 2000)),
        ("before", simulate(34, 2000, references=False)),
    ):
        for lo, hi in ((1.0, 1.4), (1.4, 1.9), (1.9, 3.5)):
            for plo, phi in ((5, 15), (15, 40)):
                pick = (
                    (run["truth"] >= lo)
                    & (run["truth"] < hi)
                    & (run["periods"] >= plo)
                    & (run["periods"] < phi)
                )
                s = scores({k: v[pick] for k, v in run.items()})
                ratio = s["bias"] / s["mean_stderr"]
                rows.append(
                    f"| {label}: {int(s['jobs'])} | {lo:g}-{hi:g} | {plo}-{phi} | "
                    f"{100 * s['coverage']:.1f}% | {s['z_sd']:.2f} | {ratio:+.2f} |"
                )
        s = scores(run)
        rows.append(
            f"| {label}: all {int(s['jobs'])} | 1.1-2.6 | 5-40 | {100 * s['coverage']:.1f}% | "
            f"{s['z_sd']:.2f} | {s['bias'] / s['mean_stderr']:+.2f} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
