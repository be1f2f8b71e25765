#!/usr/bin/env python3
"""Reference values for orchestrator-detect's statistics, computed with SciPy.

Run:  pip install scipy && python3 orchestrator/detect/reference/scipy_reference.py
Writes orchestrator/detect/tests/data/scipy_reference.json, which is checked in and read by
tests/scipy_reference.rs. Every input is listed here explicitly (or drawn from a seeded generator and
written out), so the Rust tests never depend on Python at test time.

Where SciPy has no public function (the exact Mann-Whitney null distribution used for the
Hodges-Lehmann interval, group-sequential boundaries) the reference is computed here by a different
method than the Rust code: brute-force counting recursion for U, and SciPy's multivariate normal CDF
(Genz integration) for the alpha-spending boundaries, where Rust uses recursive numerical integration.
"""

import json
import math
import pathlib
from functools import lru_cache

import numpy as np
import scipy
from scipy import stats
from scipy.optimize import brentq

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "scipy_reference.json"

# Must match MWU_EXACT_MAX_PAIRS in src/stats.rs.
MWU_EXACT_MAX_PAIRS = 2500


def binomial_tail():
    cases = [
        (1, 1, 0.5), (2, 3, 0.5), (5, 10, 0.3), (0, 10, 0.3), (10, 10, 0.3),
        (7, 20, 0.1), (15, 20, 0.1), (1, 1000, 1e-4), (30, 1000, 0.01),
        (5, 1000, 0.01), (200, 10000, 0.01), (130, 10000, 0.01),
        (600, 100000, 0.005), (480, 100000, 0.005), (51000, 100000, 0.5),
        (5_005_000, 10_000_000, 0.5), (1500, 10_000_000, 1e-4), (1000, 10_000_000, 1e-4),
        (1, 3, 0.999), (3, 3, 0.999), (40, 50, 0.3),
    ]
    out = []
    for k, n, p in cases:
        out.append({"k": k, "n": n, "p": p, "sf_ge": float(stats.binom.sf(k - 1, n, p)) if k > 0 else 1.0})
    return out


def rate_tests():
    # (canary events, canary exposure, control events, control exposure, ratio under H0)
    cases = [
        (10, 100.0, 10, 100.0, 1.0), (20, 100.0, 10, 100.0, 1.0), (20, 100.0, 10, 100.0, 1.5),
        (1, 10.0, 0, 1000.0, 1.5), (3, 10.0, 0, 1000.0, 1.5), (10, 100.0, 0, 100.0, 1.5),
        (0, 100.0, 50, 1000.0, 1.0), (45, 800.0, 120, 8000.0, 1.5), (300, 1e4, 2000, 1e5, 1.2),
        (5, 0.5, 40, 20.0, 2.0), (12_000, 1e6, 100_000, 1e7, 1.1), (7, 3.0, 1, 1.0, 1.0),
    ]
    out = []
    for x1, e1, x0, e0, r in cases:
        n = x1 + x0
        p0 = r * e1 / (r * e1 + e0)
        p_value = float(stats.binomtest(x1, n, p0, alternative="greater").pvalue) if n > 0 else 1.0
        # Two-sided 95% exact interval of the ratio from Clopper-Pearson bounds of the canary share.
        if n > 0:
            lo_p = 0.0 if x1 == 0 else float(stats.beta.ppf(0.025, x1, n - x1 + 1))
            hi_p = 1.0 if x1 == n else float(stats.beta.ppf(0.975, x1 + 1, n - x1))
            lo = lo_p * e0 / ((1 - lo_p) * e1)
            hi = None if hi_p >= 1.0 else hi_p * e0 / ((1 - hi_p) * e1)
        else:
            lo, hi = 0.0, None
        out.append({"x1": x1, "e1": e1, "x0": x0, "e0": e0, "ratio0": r, "p_value": p_value,
                    "ci95_lower": lo, "ci95_upper": hi})
    return out


def clopper_pearson():
    cases = [(0, 10, 0.025), (1, 10, 0.025), (5, 10, 0.025), (10, 10, 0.025), (3, 1000, 0.001),
             (997, 1000, 0.05), (50, 120, 1e-6), (4000, 20000, 0.025), (10, 50000, 0.025),
             (49990, 50000, 0.01), (123456, 1_000_000, 0.0001)]
    out = []
    for x, n, a in cases:
        lower = 0.0 if x == 0 else float(stats.beta.ppf(a, x, n - x + 1))
        upper = 1.0 if x == n else float(stats.beta.ppf(1 - a, x + 1, n - x))
        out.append({"x": x, "n": n, "alpha": a, "lower": lower, "upper": upper})
    return out


@lru_cache(maxsize=None)
def _u_counts(n1, n2):
    """Counts of arrangements with U = u, by the classic recursion on the largest observation."""
    if n1 == 0 or n2 == 0:
        return (1,)
    # Largest observation from x: it beats all n2 y's (shift by n2); else from y: no pairs added.
    a = _u_counts(n1 - 1, n2)
    b = _u_counts(n1, n2 - 1)
    size = n1 * n2 + 1
    c = [0] * size
    for u, v in enumerate(a):
        c[u + n2] += v
    for u, v in enumerate(b):
        c[u] += v
    return tuple(c)


def _critical_value(n1, n2, alpha):
    """Smallest u with P(U >= u) <= alpha."""
    if n1 * n2 <= MWU_EXACT_MAX_PAIRS:
        counts = _u_counts(n1, n2)
        total = sum(counts)
        tail = 0
        crit = len(counts)
        for u in range(len(counts) - 1, -1, -1):
            tail += counts[u]
            if tail / total > alpha:
                break
            crit = u
        return crit
    sd = math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12)
    c = math.ceil(n1 * n2 / 2 + 0.5 + stats.norm.isf(alpha) * sd)
    return min(max(c, 0), n1 * n2 + 1)


def _hl_bounds(x, y, alpha):
    d = np.sort(np.subtract.outer(np.asarray(x), np.asarray(y)).ravel())
    total = len(d)
    c = _critical_value(len(x), len(y), alpha)
    if c > total or c == 0:
        return None, None
    return float(d[total - c]), float(d[c - 1])


def mann_whitney():
    rng = np.random.default_rng(20261202)
    specs = [
        # (n1, n2, canary shift, rounding decimals or None, note)
        (3, 4, 0.0, None, "tiny exact"), (5, 5, 2.0, None, "exact shifted"),
        (8, 12, 0.5, None, "exact"), (20, 30, 1.0, None, "exact near limit"),
        (10, 250, 0.8, None, "exact unbalanced"), (40, 70, 0.3, None, "asymptotic"),
        (12, 15, 1.0, 0, "ties asymptotic"), (60, 400, 0.2, 1, "ties large"),
        (1, 1, 1.0, None, "one each"), (6, 6, 0.0, -1, "all ties maybe"),
    ]
    out = []
    for n1, n2, shift, decimals, note in specs:
        x = rng.normal(50.0 + shift, 1.0, n1)
        y = rng.normal(50.0, 1.0, n2)
        if decimals is not None:
            x = np.round(x, decimals)
            y = np.round(y, decimals)
        out.append(_mwu_case(x, y, note))
    # Deterministic edge cases.
    out.append(_mwu_case(np.array([70.0] * 5), np.array([70.0] * 7), "all tied"))
    out.append(_mwu_case(np.array([1.0, 2.0, 3.0]), np.array([4.0, 5.0, 6.0, 7.0]), "canary all lower"))
    out.append(_mwu_case(np.array([10.0, 11.0, 12.0, 13.0]), np.array([1.0, 2.0, 3.0]), "canary all higher"))
    return out


def _mwu_case(x, y, note):
    x = [float(v) for v in x]
    y = [float(v) for v in y]
    pooled = np.concatenate([x, y])
    ties = len(np.unique(pooled)) < len(pooled)
    exact = (not ties) and len(x) * len(y) <= MWU_EXACT_MAX_PAIRS
    res = stats.mannwhitneyu(x, y, alternative="greater", method="exact" if exact else "asymptotic",
                             use_continuity=True)
    p_value = float(res.pvalue)
    if math.isnan(p_value):
        # SciPy's asymptotic formula divides by a zero variance when every value is tied; no evidence.
        p_value = 1.0
    hl = float(np.median(np.subtract.outer(np.asarray(x), np.asarray(y))))
    ci_lo, _ = _hl_bounds(x, y, 0.025)
    _, ci_hi = _hl_bounds(x, y, 0.025)
    dec_lo, _ = _hl_bounds(x, y, 0.001)
    return {"note": note, "x": x, "y": y, "method": "exact" if exact else "asymptotic",
            "u": float(res.statistic), "p_value": p_value, "hodges_lehmann": hl,
            "ci95_lower": ci_lo, "ci95_upper": ci_hi, "lower_bound_0_001": dec_lo}


def normal():
    zs = [-3.0, -1.0, 0.0, 0.5, 1.6448536269514722, 1.96, 3.0, 5.0, 8.0, 12.0]
    ps = [0.5, 0.1, 0.05, 0.025, 0.01, 1e-4, 1e-8, 1e-12]
    return {"sf": [{"z": z, "sf": float(stats.norm.sf(z))} for z in zs],
            "isf": [{"p": p, "isf": float(stats.norm.isf(p))} for p in ps]}


def spent(kind, alpha, t):
    if t <= 0:
        return 0.0
    if t >= 1:
        return alpha
    if kind == "o_brien_fleming":
        return 2 * stats.norm.sf(stats.norm.isf(alpha / 2) / math.sqrt(t))
    return alpha * math.log(1 + (math.e - 1) * t)


def _mvn_upper_cross(bounds, means, k_total):
    """P(cross at some look among the given bounds) for Z_k with corr sqrt(t_i/t_j)."""
    k = len(bounds)
    t = np.arange(1, k + 1) / k_total
    cov = np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))
    # Seeded: the Genz integration is randomised quasi-Monte Carlo; a seed makes the table reproducible.
    mvn = stats.multivariate_normal(mean=means[:k], cov=cov, allow_singular=False, seed=20261202,
                                    maxpts=2_000_000, abseps=1e-8, releps=1e-8)
    return 1.0 - float(mvn.cdf(np.asarray(bounds)))


def sequential():
    out = []
    for kind in ["o_brien_fleming", "pocock"]:
        for alpha, looks in [(0.025, 3), (0.05, 5), (0.01, 4)]:
            zeros = np.zeros(looks)
            bounds = []
            for k in range(1, looks + 1):
                target = spent(kind, alpha, k / looks)
                if k == 1:
                    bounds.append(float(stats.norm.isf(target)))
                    continue
                f = lambda c: _mvn_upper_cross(bounds + [c], zeros, looks) - target
                bounds.append(float(brentq(f, -5.0, 15.0, xtol=1e-7)))
            theta = 2.5
            means = theta * np.sqrt(np.arange(1, looks + 1) / looks)
            power = _mvn_upper_cross(bounds, means, looks)
            out.append({"spending": kind, "alpha": alpha, "looks": looks, "z_boundaries": bounds,
                        "nominal_alpha": [float(stats.norm.sf(b)) for b in bounds],
                        "theta": theta, "crossing_probability": power})
    return out


def main():
    data = {
        "generated_by": "orchestrator/detect/reference/scipy_reference.py",
        "scipy_version": scipy.__version__,
        "numpy_version": np.__version__,
        "binomial_tail": binomial_tail(),
        "rate_tests": rate_tests(),
        "clopper_pearson": clopper_pearson(),
        "mann_whitney": mann_whitney(),
        "normal": normal(),
        "sequential": sequential(),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
