//! Low-level statistical functions, each checked against SciPy (see `tests/scipy_reference.rs`).
//!
//! These are the building blocks of the gates; they take plain numbers, never panic, and never return
//! NaN for inputs within their documented domain. Values that do not exist (an upper bound of a rate
//! ratio when every event is in the canary) are `None`, not infinities, because the results go to JSON.

use statrs::distribution::{Beta, Binomial, ContinuousCDF, Discrete, Normal};

/// Above this variance a binomial tail is taken from the normal approximation: summing the exact
/// terms would need ~40 standard deviations of terms (over 1e5, and interval inversion evaluates the
/// tail dozens of times). At a standard deviation above 3,000 the approximation's relative error in
/// the tails that decisions use (z up to ~5) is a few percent at worst, irrelevant next to the spread
/// of the boundary; such counts only occur for very common events.
const BINOMIAL_NORMAL_VARIANCE: f64 = 1e7;

/// statrs' incomplete beta uses a continued fraction capped at 140 iterations, which is accurate
/// only while the shape parameters are modest; above this we invert the binomial tail by bisection.
const BETA_INVERSE_MAX_N: u64 = 10_000;

/// The exact Mann-Whitney null distribution is used (when there are no ties) up to this many pairs;
/// beyond it the normal approximation is accurate to well under 1e-3 and the exact computation would
/// cost O(n1 * n1 * n2) per look.
pub const MWU_EXACT_MAX_PAIRS: u64 = 2_500;

/// `x > 0`, false for NaN. Spelled out because "not positive" must include NaN.
pub(crate) fn is_positive(x: f64) -> bool {
    x > 0.0
}

/// `0 < x < inf`, false for NaN.
pub(crate) fn is_positive_finite(x: f64) -> bool {
    x > 0.0 && x.is_finite()
}

fn std_normal() -> Normal {
    // Mean 0 and sd 1 are always valid parameters.
    Normal::standard()
}

/// Upper tail of the standard normal distribution, `P(Z >= z)`.
pub fn norm_sf(z: f64) -> f64 {
    if z.is_nan() {
        return 1.0;
    }
    std_normal().sf(z)
}

/// Inverse of [`norm_sf`]: the `z` with `P(Z >= z) = p`. `p` is clamped to the open unit interval.
pub fn norm_isf(p: f64) -> f64 {
    let p = if p.is_nan() { 0.5 } else { p.clamp(1e-300, 1.0 - 1e-16) };
    -std_normal().inverse_cdf(p)
}

/// `P(X >= k)` for `X ~ Binomial(n, p)`.
///
/// Computed by summing probability terms outward from `k` (anchored on statrs' log pmf), so the
/// result keeps its relative precision deep in the tail where `1 - cdf` would cancel to zero.
pub fn binom_sf_ge(k: u64, n: u64, p: f64) -> f64 {
    if k == 0 {
        return 1.0;
    }
    if k > n || p.is_nan() || p <= 0.0 {
        return 0.0;
    }
    if p >= 1.0 {
        return 1.0;
    }
    let nf = n as f64;
    let mean = nf * p;
    let var = nf * p * (1.0 - p);
    if var > BINOMIAL_NORMAL_VARIANCE {
        // Continuity-corrected normal approximation; see BINOMIAL_NORMAL_VARIANCE.
        return norm_sf((k as f64 - 0.5 - mean) / var.sqrt());
    }
    let Ok(dist) = Binomial::new(p, n) else {
        return 0.0;
    };
    let odds = p / (1.0 - p);
    if (k as f64) > mean {
        // Upper tail: terms decrease from k upward.
        let anchor = dist.ln_pmf(k);
        let mut term = 1.0;
        let mut sum = 1.0;
        let mut j = k;
        while j < n {
            term *= (n - j) as f64 / (j + 1) as f64 * odds;
            sum += term;
            j += 1;
            if term < sum * 1e-17 {
                break;
            }
        }
        (anchor + sum.ln()).exp().clamp(0.0, 1.0)
    } else {
        // Lower tail P(X <= k-1): terms decrease from k-1 downward; the answer is its complement,
        // which is >= ~0.5 here so no precision is lost.
        let top = k - 1;
        let anchor = dist.ln_pmf(top);
        let mut term = 1.0;
        let mut sum = 1.0;
        let mut j = top;
        while j > 0 {
            term *= j as f64 / (n - j + 1) as f64 / odds;
            sum += term;
            j -= 1;
            if term < sum * 1e-17 {
                break;
            }
        }
        (1.0 - (anchor + sum.ln()).exp()).clamp(0.0, 1.0)
    }
}

/// One-sided Clopper-Pearson lower bound for a binomial proportion: the smallest `p` with
/// `P(X >= x | p) >= alpha`. Zero when `x == 0` or `alpha <= 0` (total confidence).
pub fn clopper_pearson_lower(x: u64, n: u64, alpha: f64) -> f64 {
    if x == 0 || n == 0 || !is_positive(alpha) {
        return 0.0;
    }
    let x = x.min(n);
    if n <= BETA_INVERSE_MAX_N
        && let Ok(beta) = Beta::new(x as f64, (n - x) as f64 + 1.0)
    {
        let v = beta.inverse_cdf(alpha);
        if v.is_finite() {
            return v.clamp(0.0, 1.0);
        }
    }
    // P(X >= x | p) increases with p: find where it reaches alpha.
    invert_increasing(|p| binom_sf_ge(x, n, p), alpha)
}

/// One-sided Clopper-Pearson upper bound: the largest `p` with `P(X <= x | p) >= alpha`. One when
/// `x == n` or `alpha <= 0`.
pub fn clopper_pearson_upper(x: u64, n: u64, alpha: f64) -> f64 {
    if x >= n || !is_positive(alpha) {
        return 1.0;
    }
    if n <= BETA_INVERSE_MAX_N
        && let Ok(beta) = Beta::new(x as f64 + 1.0, (n - x) as f64)
    {
        let v = beta.inverse_cdf(1.0 - alpha);
        if v.is_finite() {
            return v.clamp(0.0, 1.0);
        }
    }
    // P(X >= x+1 | p) increases with p; the bound is where it reaches 1 - alpha.
    invert_increasing(|p| binom_sf_ge(x + 1, n, p), 1.0 - alpha)
}

/// Solve `f(p) = target` for an increasing `f` on (0, 1) by bisection on the logit scale, which keeps
/// relative precision for tiny and near-one proportions.
fn invert_increasing(f: impl Fn(f64) -> f64, target: f64) -> f64 {
    let (mut lo, mut hi) = (-745.0_f64, 37.0_f64);
    let p_of = |t: f64| 1.0 / (1.0 + (-t).exp());
    // 64 halvings of a width-782 logit range leave ~4e-17: full double precision in p.
    for _ in 0..64 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            break;
        }
        if f(p_of(mid)) >= target {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    p_of(0.5 * (lo + hi))
}

/// Exact conditional test for two Poisson rates, one-sided in the harmful direction.
///
/// Tests `H0: rate1 / rate0 <= ratio0` against `rate1 / rate0 > ratio0` given `x1` events in exposure
/// `e1` (canary) and `x0` in `e0` (control). Conditional on the total `n = x1 + x0`, `x1` is
/// `Binomial(n, p0)` with `p0 = ratio0 * e1 / (ratio0 * e1 + e0)` at the boundary of H0, so the
/// p-value is `P(X >= x1)`. Requires `e1 > 0`, `e0 > 0`, `ratio0 > 0` (returns 1 otherwise: no
/// evidence). Matches `scipy.stats.binomtest(x1, n, p0, alternative="greater")`.
pub fn poisson_rate_test(x1: u64, e1: f64, x0: u64, e0: f64, ratio0: f64) -> f64 {
    if !(is_positive_finite(e1) && is_positive_finite(e0) && is_positive_finite(ratio0)) {
        return 1.0;
    }
    let Some(n) = x1.checked_add(x0) else {
        return 1.0;
    };
    binom_sf_ge(x1, n, boundary_proportion(e1, e0, ratio0))
}

/// `p0 = r * e1 / (r * e1 + e0)`, the share of events expected in the canary when its rate is `r`
/// times the control's. Written as `1 / (1 + e0 / (r * e1))` so that huge exposures do not overflow.
fn boundary_proportion(e1: f64, e0: f64, ratio: f64) -> f64 {
    (1.0 / (1.0 + e0 / (ratio * e1))).clamp(0.0, 1.0)
}

/// A confidence interval; `None` bounds are unbounded (an infinite rate ratio, say).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    /// Lower bound, `None` when unbounded below.
    pub lower: Option<f64>,
    /// Upper bound, `None` when unbounded above.
    pub upper: Option<f64>,
}

/// Exact (Clopper-Pearson based) interval for the rate ratio `rate1 / rate0`, with `alpha_lower` in
/// the lower tail and `alpha_upper` in the upper tail (a two-sided 95% interval uses 0.025 each).
///
/// Conditional on `n`, the canary share `p` maps to the ratio as `R = p * e0 / ((1 - p) * e1)`; the
/// Clopper-Pearson bounds of `p` map to bounds of `R`. With zero control events the upper bound is
/// unbounded but the lower bound is finite and can still exceed the smallest effect that matters.
pub fn rate_ratio_interval(x1: u64, e1: f64, x0: u64, e0: f64, alpha_lower: f64, alpha_upper: f64) -> Bounds {
    let unbounded = Bounds {
        lower: Some(0.0),
        upper: None,
    };
    if !(is_positive_finite(e1) && is_positive_finite(e0)) {
        return unbounded;
    }
    let Some(n) = x1.checked_add(x0) else {
        return unbounded;
    };
    if n == 0 {
        return unbounded;
    }
    let to_ratio = |p: f64| -> Option<f64> {
        if p >= 1.0 {
            return None;
        }
        let r = p * e0 / ((1.0 - p) * e1);
        r.is_finite().then_some(r)
    };
    let p_lo = clopper_pearson_lower(x1, n, alpha_lower);
    let p_hi = clopper_pearson_upper(x1, n, alpha_upper);
    // p_lo < 1 whenever alpha_lower > 0, so the lower bound exists.
    Bounds {
        lower: to_ratio(p_lo),
        upper: to_ratio(p_hi),
    }
}

/// Which p-value computation a Mann-Whitney test used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MwuMethod {
    /// Exact null distribution of U (no ties, small samples).
    Exact,
    /// Normal approximation with tie correction and continuity correction.
    Asymptotic,
}

/// Result of a one-sided Mann-Whitney U test.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MannWhitney {
    /// U of the first sample: pairs where it is larger, ties counting one half.
    pub u: f64,
    /// `P(U >= u)` under the null hypothesis of identical distributions.
    pub p_value: f64,
    /// How the p-value was computed.
    pub method: MwuMethod,
    /// Whether the pooled sample had ties.
    pub ties: bool,
}

/// One-sided Mann-Whitney U test that `x` tends to be larger than `y` (SciPy `alternative="greater"`).
///
/// Exact when there are no ties and `len(x) * len(y) <= MWU_EXACT_MAX_PAIRS`, otherwise the normal
/// approximation with tie correction and continuity correction (SciPy `method="asymptotic"`). All
/// values tied gives p = 1. `None` when either sample is empty. Inputs must be finite (callers check).
pub fn mann_whitney_greater(x: &[f64], y: &[f64]) -> Option<MannWhitney> {
    let (n1, n2) = (x.len(), y.len());
    if n1 == 0 || n2 == 0 {
        return None;
    }
    let mut pooled: Vec<(f64, bool)> = x
        .iter()
        .map(|&v| (v, true))
        .chain(y.iter().map(|&v| (v, false)))
        .collect();
    pooled.sort_by(|a, b| a.0.total_cmp(&b.0));
    let n = pooled.len();
    let mut rank_sum_x = 0.0;
    let mut tie_term = 0.0;
    let mut i = 0;
    while i < n {
        let mut j = i + 1;
        while j < n && pooled[j].0 == pooled[i].0 {
            j += 1;
        }
        // Positions i..j share the average of ranks i+1..=j.
        let avg_rank = (i + 1 + j) as f64 / 2.0;
        let t = (j - i) as f64;
        tie_term += t * t * t - t;
        rank_sum_x += avg_rank * pooled[i..j].iter().filter(|(_, is_x)| *is_x).count() as f64;
        i = j;
    }
    let (n1f, n2f) = (n1 as f64, n2 as f64);
    let u = rank_sum_x - n1f * (n1f + 1.0) / 2.0;
    let ties = tie_term > 0.0;
    let pairs = (n1 as u64).saturating_mul(n2 as u64);
    if !ties && pairs <= MWU_EXACT_MAX_PAIRS {
        let dist = MwuNull::new(n1, n2);
        // Without ties U is an integer; round away float noise from the rank sums.
        let p_value = dist.sf_ge(u.round() as u64);
        return Some(MannWhitney {
            u,
            p_value,
            method: MwuMethod::Exact,
            ties,
        });
    }
    let mu = n1f * n2f / 2.0;
    let nf = n as f64;
    let var = n1f * n2f / 12.0 * ((nf + 1.0) - tie_term / (nf * (nf - 1.0)));
    let p_value = if var > 0.0 {
        norm_sf((u - mu - 0.5) / var.sqrt())
    } else {
        1.0
    };
    Some(MannWhitney {
        u,
        p_value,
        method: MwuMethod::Asymptotic,
        ties,
    })
}

/// Exact null distribution of the Mann-Whitney U statistic for sample sizes `n1`, `n2` (no ties).
///
/// The counts of arrangements with `U = u` are the coefficients of the Gaussian binomial coefficient
/// `[n1 + n2 choose m]_q = prod_{i=1..m} (1 - q^(M+i)) / (1 - q^i)` with `m = min`, `M = max`. Each
/// factor pair is applied in turn, so every intermediate result is itself a Gaussian binomial with
/// nonnegative coefficients and rounding stays relative to the largest coefficient.
#[derive(Debug, Clone)]
pub struct MwuNull {
    /// Probability of each value of U, index = U.
    pmf: Vec<f64>,
}

impl MwuNull {
    /// Compute the distribution; cost O(min(n1, n2) * n1 * n2).
    pub fn new(n1: usize, n2: usize) -> Self {
        let (m, big) = (n1.min(n2), n1.max(n2));
        let deg = m * big;
        let mut c = vec![0.0_f64; deg + m + 1];
        c[0] = 1.0;
        let mut cur = 0;
        for i in 1..=m {
            let shifted = big + i;
            let new_deg = cur + shifted;
            for k in (shifted..=new_deg).rev() {
                c[k] -= c[k - shifted];
            }
            for k in i..=new_deg {
                c[k] += c[k - i];
            }
            cur += big;
        }
        c.truncate(deg + 1);
        let total: f64 = c.iter().sum();
        let pmf = c.into_iter().map(|v| (v / total).max(0.0)).collect();
        Self { pmf }
    }

    /// `P(U >= u)`.
    pub fn sf_ge(&self, u: u64) -> f64 {
        let start = usize::try_from(u).unwrap_or(usize::MAX);
        if start >= self.pmf.len() {
            return 0.0;
        }
        self.pmf[start..].iter().rev().sum::<f64>().clamp(0.0, 1.0)
    }

    /// Smallest `u` with `P(U >= u) <= alpha` (the one-sided critical value); `n1 * n2 + 1` when even
    /// the largest U is not significant.
    pub fn critical_value(&self, alpha: f64) -> u64 {
        let mut tail = 0.0;
        let mut crit = self.pmf.len();
        for u in (0..self.pmf.len()).rev() {
            tail += self.pmf[u];
            if tail > alpha {
                break;
            }
            crit = u;
        }
        crit as u64
    }
}

/// Count of pairwise differences `x[i] - y[j] <= d`; both slices sorted ascending.
fn count_le(xs: &[f64], ys: &[f64], d: f64) -> u64 {
    // For fixed i, x - y[j] does not increase with j, so the matching j form a suffix.
    xs.iter()
        .map(|&xi| (ys.len() - ys.partition_point(|&yj| xi - yj > d)) as u64)
        .sum()
}

/// Largest pairwise difference `<= d`, if any; both slices sorted ascending.
fn largest_le(xs: &[f64], ys: &[f64], d: f64) -> Option<f64> {
    xs.iter()
        .filter_map(|&xi| {
            let j = ys.partition_point(|&yj| xi - yj > d);
            ys.get(j).map(|&yj| xi - yj)
        })
        .max_by(f64::total_cmp)
}

/// Smallest pairwise difference `> d`, if any; both slices sorted ascending.
fn smallest_gt(xs: &[f64], ys: &[f64], d: f64) -> Option<f64> {
    // For fixed i the differences above d form a prefix of j; the last of the prefix is the smallest.
    xs.iter()
        .filter_map(|&xi| {
            let j = ys.partition_point(|&yj| xi - yj > d);
            j.checked_sub(1).map(|j| xi - ys[j])
        })
        .min_by(f64::total_cmp)
}

/// The `k`-th smallest (1-based) of the `len(x) * len(y)` differences `x[i] - y[j]`, without
/// materialising them (a control cohort may have tens of thousands of GPUs): bisection on the value
/// with a counting oracle, then a snap to the actual difference. Slices sorted ascending, nonempty,
/// finite; `k` in `1..=len(x)*len(y)`.
fn kth_difference(xs: &[f64], ys: &[f64], k: u64) -> f64 {
    let (Some(&x_min), Some(&x_max), Some(&y_min), Some(&y_max)) = (xs.first(), xs.last(), ys.first(), ys.last())
    else {
        return 0.0;
    };
    let mut lo = x_min - y_max;
    let mut hi = x_max - y_min;
    if count_le(xs, ys, lo) >= k {
        return lo;
    }
    // Invariant: count_le(lo) < k <= count_le(hi). Ends when lo and hi are adjacent floats, or as
    // soon as the smallest difference above lo alone reaches rank k (typically after a dozen steps,
    // once the bracket is narrower than the gaps between differences).
    for _ in 0..2200 {
        if let Some(s) = smallest_gt(xs, ys, lo)
            && count_le(xs, ys, s) >= k
        {
            return s;
        }
        let mid = lo + (hi - lo) / 2.0;
        if mid <= lo || mid >= hi {
            break;
        }
        if count_le(xs, ys, mid) >= k {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    largest_le(xs, ys, hi).unwrap_or(hi)
}

fn sorted(v: &[f64]) -> Vec<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s
}

/// Hodges-Lehmann estimate of the shift between `x` and `y`: the median of all differences
/// `x[i] - y[j]`. `None` when either sample is empty. Inputs must be finite.
pub fn hodges_lehmann(x: &[f64], y: &[f64]) -> Option<f64> {
    if x.is_empty() || y.is_empty() {
        return None;
    }
    let (xs, ys) = (sorted(x), sorted(y));
    let total = (xs.len() as u64) * (ys.len() as u64);
    if total % 2 == 1 {
        Some(kth_difference(&xs, &ys, total.div_ceil(2)))
    } else {
        let a = kth_difference(&xs, &ys, total / 2);
        let b = kth_difference(&xs, &ys, total / 2 + 1);
        Some(a + (b - a) / 2.0)
    }
}

/// Confidence interval for the Hodges-Lehmann shift (Moses' distribution-free interval), with
/// `alpha_lower` in the lower tail and `alpha_upper` in the upper tail; an alpha of 0 skips that bound
/// (`None`), which saves the work when only the decision bound is wanted.
///
/// The lower bound is the `k`-th smallest difference where `k = n1*n2 - c + 1` and `c` is the one-sided
/// critical value of U at `alpha_lower`: the lower bound exceeds `delta` exactly when the Mann-Whitney
/// test of `x - delta` against `y` rejects at that level (for data without ties). The critical value
/// comes from the exact distribution when `n1*n2 <= MWU_EXACT_MAX_PAIRS`, otherwise from the normal
/// approximation with continuity correction. A bound the data cannot resolve is `None`.
pub fn hodges_lehmann_interval(x: &[f64], y: &[f64], alpha_lower: f64, alpha_upper: f64) -> Bounds {
    if x.is_empty() || y.is_empty() {
        return Bounds {
            lower: None,
            upper: None,
        };
    }
    let (xs, ys) = (sorted(x), sorted(y));
    let (n1, n2) = (xs.len(), ys.len());
    let total = (n1 as u64) * (n2 as u64);
    let null = (total <= MWU_EXACT_MAX_PAIRS).then(|| MwuNull::new(n1, n2));
    let critical = |alpha: f64| -> u64 {
        if let Some(null) = &null {
            null.critical_value(alpha)
        } else {
            let (a, b) = (n1 as f64, n2 as f64);
            let sd = (a * b * (a + b + 1.0) / 12.0).sqrt();
            let c = (a * b / 2.0 + 0.5 + norm_isf(alpha) * sd).ceil();
            if c > total as f64 { total + 1 } else { c.max(0.0) as u64 }
        }
    };
    let bound = |alpha: f64, lower: bool| -> Option<f64> {
        if !is_positive(alpha) {
            return None;
        }
        let c = critical(alpha);
        if c > total || c == 0 {
            return None;
        }
        // Lower bound: (total - c + 1)-th smallest; upper bound by symmetry: the c-th smallest.
        let k = if lower { total - c + 1 } else { c };
        Some(kth_difference(&xs, &ys, k))
    };
    Bounds {
        lower: bound(alpha_lower, true),
        upper: bound(alpha_upper, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binomial_tail_small_cases_by_hand() {
        // Bin(3, 0.5): P(X >= 2) = 4/8.
        assert!((binom_sf_ge(2, 3, 0.5) - 0.5).abs() < 1e-15);
        assert!((binom_sf_ge(3, 3, 0.5) - 0.125).abs() < 1e-15);
        assert_eq!(binom_sf_ge(0, 3, 0.5), 1.0);
        assert_eq!(binom_sf_ge(4, 3, 0.5), 0.0);
        assert_eq!(binom_sf_ge(1, 3, 0.0), 0.0);
        assert_eq!(binom_sf_ge(3, 3, 1.0), 1.0);
    }

    #[test]
    fn mwu_null_small_distribution_by_hand() {
        // n1 = n2 = 2: U takes 0..=4 with counts 1,1,2,1,1 over 6 arrangements.
        let d = MwuNull::new(2, 2);
        let expected = [1.0, 1.0, 2.0, 1.0, 1.0].map(|c| c / 6.0);
        for (got, want) in d.pmf.iter().zip(expected) {
            assert!((got - want).abs() < 1e-15, "{:?}", d.pmf);
        }
        assert!((d.sf_ge(3) - 2.0 / 6.0).abs() < 1e-15);
        assert_eq!(d.critical_value(1.0 / 6.0), 4);
        assert_eq!(d.critical_value(0.1), 5);
    }

    #[test]
    fn kth_difference_matches_brute_force() {
        let x = [3.1, -2.0, 7.5, 0.0, 0.0, 1e-9];
        let y = [0.5, 2.25, -1.0, 0.0];
        let mut all: Vec<f64> = x.iter().flat_map(|a| y.iter().map(move |b| a - b)).collect();
        all.sort_by(f64::total_cmp);
        let (xs, ys) = (sorted(&x), sorted(&y));
        for (i, want) in all.iter().enumerate() {
            assert_eq!(kth_difference(&xs, &ys, i as u64 + 1), *want, "k = {}", i + 1);
        }
    }
}
