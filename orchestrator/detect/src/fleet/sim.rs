//! The I/O-free fleet simulation behind `waveguard bench --only detection` (issue 22) and the
//! Monte Carlo power of the fleet-scale method: one rollout
//! of a 1,000-node HGX fleet judged by the fleet-scale method (`orchestrator_detect::fleet`) or by the
//! current per-wave method (`evaluate_rate` / `evaluate_level` with group-sequential spending), on
//! the same kind of simulated world, hour by hour.
//!
//! The world: 1,000 nodes of 8 GPUs in 4 strata (rack rows); XIDs at the base rate per
//! GPU-hour that cascade over 1 + Binomial(7, 0.1) GPUs; PCIe AER at 0.02 per node-hour; GPU
//! temperature and power with a persistent offset per node (sd 2.5 °C, 25 W) plus hourly noise
//! (1 °C, 12 W). Flashes are instantaneous at a wave's start (this is a detection benchmark, not a
//! throughput one). Every number here is a model of a fleet, stated so the figures can be judged.

use super::draw::{normal, poisson};
use super::{
    ErrorBudget, FORECAST_SEEDS, Forecast, ForecastGate, ForecastWave, GateLook, LevelEConfig, LevelEProcess, NodeCell,
    NodeCount, NodeMixtureProcess, NodeObservation, RateCell, RateEConfig, RateEProcess, SoakDecision, TimedWave,
    WaveDecision, WaveTiming, catch_by_wave_end, decide_soak, decide_wave, forecast_catch, node_heterogeneity,
    quasi_poisson_dispersion,
};
use crate::{
    Direction, LevelCohorts, LevelGate, Outcome, RateCohorts, RateGate, RateSample, SequentialPlan, SpendingFunction,
    combine, evaluate_level, evaluate_rate,
};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Nodes in the simulated fleet.
pub const NODES: usize = 1000;
const STRATA: usize = 4;
const GPUS: f64 = 8.0;
/// Mean GPUs per XID episode (1 + Binomial(7, 0.1)).
const MEAN_BURST: f64 = 1.7;
const AER_PER_NODE_HOUR: f64 = 0.02;
const TEMP_OFFSET_SD: f64 = 2.5;
const TEMP_HOURLY_SD: f64 = 1.0;
const POWER_OFFSET_SD: f64 = 25.0;
const POWER_HOURLY_SD: f64 = 12.0;
/// Hours after a reset that count on neither side (see `orchestrator_detect::fleet::counted_hours`).
const EXCLUSION_H: u32 = 1;
/// The confounder cell: hours during which the whole fleet runs hot and logs twice the XIDs.
const CONFOUNDER_HOURS: std::ops::Range<u32> = 10..34;
/// Simulated hours before a rollout is cut off (counted as a hold).
const HORIZON_H: u32 = 1400;

/// What the release does to the fleet in one bench cell.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Effect {
    /// Nothing.
    Healthy,
    /// The XID rate, as a fleet average, multiplied by `ratio`; on all nodes (`share` 1) or
    /// concentrated on a `share` of them (each of those at `1 + (ratio - 1) / share`).
    Rate {
        /// Fleet-average ratio.
        ratio: f64,
        /// Share of nodes affected.
        share: f64,
    },
    /// GPU temperature raised by this many °C.
    Temp(f64),
    /// Power raised by this many W.
    Power(f64),
    /// Healthy, with a fleet-wide hot spell that doubles XIDs and adds 3 °C and 30 W to every node.
    Confounder,
    /// Healthy, with 5% of nodes (either side) at 8x the XID rate in bursts of 8 GPUs.
    HotNodes,
}

/// One bench cell.
#[derive(Debug, Clone)]
pub struct Cell {
    /// Row label.
    pub label: String,
    /// XID base rate per GPU-hour.
    pub base: f64,
    /// The release's effect.
    pub effect: Effect,
    /// Seeds (rollouts) to simulate.
    pub seeds: u32,
}

impl Cell {
    /// Whether a rollout of this cell should be stopped (the release is harmful).
    pub fn harmful(&self) -> bool {
        matches!(self.effect, Effect::Rate { .. } | Effect::Temp(_) | Effect::Power(_))
    }
}

/// A wave of the bench policy (issue 22's new-user policy: a 32-node canary stratified by rack, a 10%
/// wave, the rest; XID and AER rate gates, temperature and power level gates).
#[derive(Debug, Clone, Copy)]
pub struct WavePlan {
    /// Nodes per stratum.
    pub per_stratum: usize,
    /// Planned bake (hours).
    pub bake_h: u32,
    /// Longest bake before a hold (hours).
    pub max_bake_h: u32,
    /// `must_detect` of each gate for this wave, in the order of [`BenchPolicy::nulls`] (XID and AER
    /// ratios, temperature and power shifts): the wave's own where the policy sets one, else the gate's.
    pub must_detect: [f64; 4],
}

/// The bench policy. The numbers are the example's, with `max_bake` and `must_detect` chosen so that
/// the promises of issue 22 are physically possible (see BENCHMARKS.md).
#[derive(Debug, Clone)]
pub struct BenchPolicy {
    /// Canary and the 10% wave (judged each with its own bake).
    pub waves: [WavePlan; 2],
    /// The last wave's bake: it only watches for failures; the soak judges it.
    pub rest_bake_h: u32,
    /// Holdback nodes per stratum (5% of the fleet).
    pub holdback_per_stratum: usize,
    /// Soak minimum and maximum (hours).
    pub soak_h: (u32, u32),
    /// `must_detect` of each gate over the soak (the last wave's), in the order of `nulls`: what
    /// "fleet-proven" rules out.
    pub soak_must_detect: [f64; 4],
    /// Nulls: XID and AER ratios, temperature (°C) and power (W) shifts.
    pub nulls: [f64; 4],
    /// The rollout's error budgets.
    pub budget: ErrorBudget,
    /// The current method's family-wise alpha per wave (the example policy's `health.alpha`).
    pub current_alpha: f64,
    /// Hours of the pre-flash watch before the canary's flash (`detection.pre_period`; 0: none).
    pub pre_period_h: u32,
}

impl Default for BenchPolicy {
    fn default() -> Self {
        Self {
            waves: [
                // max_bake 720 h (30 days): a 1.5x XID rise at 0.002/GPU-h can neither pass this
                // canary (its must_detect is 2x) nor, in 240 h, fail (null 1.1): it needs about 217
                // baseline episodes for an 80% catch and 32 nodes gather 0.30 an hour. Issue 22 asks
                // for 80% caught before 15% of the fleet runs it, so the canary waits for the evidence
                // with 32 nodes exposed. A healthy canary passes long before (median ~75 h), so the
                // longer maximum costs healthy rollouts nothing; a harmful one is held longer.
                WavePlan {
                    per_stratum: 8,
                    bake_h: 12,
                    max_bake_h: 720,
                    must_detect: [2.0, 2.0, 2.0, 40.0],
                },
                WavePlan {
                    per_stratum: 25,
                    bake_h: 8,
                    max_bake_h: 168,
                    must_detect: [1.5, 2.0, 2.0, 40.0],
                },
            ],
            rest_bake_h: 4,
            holdback_per_stratum: 12,
            soak_h: (24, 400),
            soak_must_detect: [1.5, 2.0, 2.0, 40.0],
            nulls: [1.1, 1.25, 0.5, 10.0],
            budget: ErrorBudget::default(),
            current_alpha: 0.05,
            pre_period_h: 6,
        }
    }
}

/// How one simulated rollout ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum End {
    /// A gate failed and the rollout rolled back.
    Detected {
        /// Hours since the rollout started.
        hour: f64,
        /// Nodes on the release at that moment.
        exposed: usize,
    },
    /// A wave (or the soak) reached its maximum without enough evidence.
    Held {
        /// Hours since the rollout started.
        hour: f64,
        /// Nodes on the release while held.
        exposed: usize,
        /// Hours the held wave baked beyond its planned bake.
        extension: f64,
    },
    /// Every wave and the soak passed: fleet-proven.
    FleetProven {
        /// Hours since the rollout started.
        hour: f64,
    },
    /// The current method: every node updated with no judgment of the last wave (it has no control).
    CompletedUnjudged {
        /// Hours since the rollout started.
        hour: f64,
    },
}

/// One rollout's result.
#[derive(Debug, Clone)]
pub struct Run {
    /// How it ended.
    pub end: End,
    /// Hours each judged wave baked before it passed (canary, 10%), `None` if it did not.
    pub wave_pass_h: [Option<f64>; 2],
    /// Hour at which the information bound is reached (median / p95 power), for harmful cells.
    pub bound_h: Option<(f64, f64)>,
}

/// A harmful cell's times to detect against the information bound, as ratios (`None` without a
/// catch or a bound).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BoundRatios {
    /// Median time to detect over the bound at the gate's alpha and power 95%: the bound
    /// (its "Why": events a one-sided test needs at a false alarm rate and a power), which its
    /// targets hold the median (1.5x) and the p95 (2.5x) to.
    pub median: Option<f64>,
    /// p95 time to detect over the same bound.
    pub p95: Option<f64>,
    /// Median time to detect over the bound at power 50% (the fixed-sample test's own median): a
    /// stricter reading, reported beside it.
    pub median_at_half_power: Option<f64>,
}

/// The ratios of a cell's catch times to the information bound of its runs (each run's bound on
/// its own rollout schedule; the median over runs).
pub fn bound_ratios(runs: &[Run]) -> BoundRatios {
    let sorted = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v
    };
    let quantile = |v: &[f64], q: f64| {
        let last = v.len().checked_sub(1)?;
        v.get((last as f64 * q).round() as usize).copied()
    };
    let detect_h = sorted(
        runs.iter()
            .filter_map(|r| match r.end {
                End::Detected { hour, .. } => Some(hour),
                _ => None,
            })
            .collect(),
    );
    let bound_half = sorted(runs.iter().filter_map(|r| r.bound_h.map(|b| b.0)).collect());
    let bound_95 = sorted(runs.iter().filter_map(|r| r.bound_h.map(|b| b.1)).collect());
    let ratio = |t: Option<f64>, b: Option<f64>| match (t, b) {
        (Some(t), Some(b)) if b > 0.0 => Some(t / b),
        _ => None,
    };
    BoundRatios {
        median: ratio(quantile(&detect_h, 0.5), quantile(&bound_95, 0.5)),
        p95: ratio(quantile(&detect_h, 0.95), quantile(&bound_95, 0.5)),
        median_at_half_power: ratio(quantile(&detect_h, 0.5), quantile(&bound_half, 0.5)),
    }
}

impl BoundRatios {
    /// `median/p95 (median at half power)` to one decimal, `-` for a missing ratio.
    pub fn text(&self) -> String {
        let one = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
        format!(
            "{}/{} ({})",
            one(self.median),
            one(self.p95),
            one(self.median_at_half_power)
        )
    }
}

struct Node {
    stratum: usize,
    temp_offset: f64,
    power_offset: f64,
    /// XID multiplier when on the release (the effect).
    xid_effect: f64,
    /// Persistent XID multiplier (hot nodes) and episode size override.
    hot: bool,
    updated_at: Option<u32>,
}

struct World {
    rng: ChaCha8Rng,
    cell: Cell,
    nodes: Vec<Node>,
    /// Node indices per stratum in wave order (canary first, holdback last).
    order: Vec<Vec<usize>>,
}

impl World {
    fn new(cell: &Cell, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut nodes = Vec::with_capacity(NODES);
        for i in 0..NODES {
            let affected_share = match cell.effect {
                Effect::Rate { share, .. } => share,
                _ => 0.0,
            };
            let xid_effect = match cell.effect {
                Effect::Rate { ratio, share } if rng.random::<f64>() < affected_share => 1.0 + (ratio - 1.0) / share,
                _ => 1.0,
            };
            let hot = matches!(cell.effect, Effect::HotNodes) && rng.random::<f64>() < 0.05;
            nodes.push(Node {
                stratum: i % STRATA,
                temp_offset: TEMP_OFFSET_SD * normal(&mut rng),
                power_offset: POWER_OFFSET_SD * normal(&mut rng),
                xid_effect,
                hot,
                updated_at: None,
            });
        }
        let mut order: Vec<Vec<usize>> = (0..STRATA).map(|s| (s..NODES).step_by(STRATA).collect()).collect();
        for o in &mut order {
            o.shuffle(&mut rng);
        }
        Self {
            rng,
            cell: cell.clone(),
            nodes,
            order,
        }
    }

    fn confounded(&self, hour: u32) -> bool {
        matches!(self.cell.effect, Effect::Confounder) && CONFOUNDER_HOURS.contains(&hour)
    }

    fn update(&mut self, nodes: &[usize], hour: u32) {
        for &i in nodes {
            self.nodes[i].updated_at = Some(hour);
        }
    }

    fn updated_count(&self) -> usize {
        self.nodes.iter().filter(|n| n.updated_at.is_some()).count()
    }

    /// One node's XID events (GPU-level), XID episodes (de-duplicated across the node's GPUs) and
    /// AER events in hour `hour`.
    fn events(&mut self, i: usize, hour: u32) -> (u64, u64, u64) {
        let confounder = if self.confounded(hour) { 2.0 } else { 1.0 };
        let node = &self.nodes[i];
        let on_release = node.updated_at.is_some();
        let effect = if on_release { node.xid_effect } else { 1.0 };
        let (hot_mult, burst) = if node.hot { (8.0, 8.0) } else { (1.0, MEAN_BURST) };
        let rate = self.cell.base * GPUS * confounder * effect * hot_mult;
        let episodes = poisson(&mut self.rng, rate / burst);
        let mut xid = 0;
        for _ in 0..episodes {
            xid += if node.hot {
                8
            } else {
                1 + (0..7).filter(|_| self.rng.random::<f64>() < 0.1).count() as u64
            };
        }
        let aer = poisson(&mut self.rng, AER_PER_NODE_HOUR * confounder);
        (xid, episodes, aer)
    }

    fn level_effect(&self) -> (f64, f64) {
        match self.cell.effect {
            Effect::Temp(t) => (t, 0.0),
            Effect::Power(w) => (0.0, w),
            _ => (0.0, 0.0),
        }
    }

    /// Mean confounder over hours `[from, to)`: (°C, W).
    fn level_confounder(&self, from: u32, to: u32) -> (f64, f64) {
        let hours = to.saturating_sub(from).max(1);
        let hot = (from..to).filter(|&h| self.confounded(h)).count() as f64 / f64::from(hours);
        (3.0 * hot, 30.0 * hot)
    }
}

/// Information needed to detect `effect` at one-sided `alpha` with `power`, in expected baseline XID
/// episodes (rates, against a known control; episodes, because GPU-level events are over-dispersed
/// and carry less information than their count) or in nodes (levels, known node sd): the bound of issue 22.
fn information_needed(effect: Effect, null: [f64; 4], sd: (f64, f64), alpha: f64, power: f64) -> Option<f64> {
    let z = crate::stats::norm_isf(alpha) + crate::stats::norm_isf(1.0 - power);
    match effect {
        Effect::Rate { ratio, .. } => {
            let gap = ratio.sqrt() - null[0].sqrt();
            (gap > 0.0).then(|| (z / (2.0 * gap)).powi(2))
        }
        Effect::Temp(t) => (t > null[2]).then(|| (z * sd.0 / (t - null[2])).powi(2)),
        Effect::Power(w) => (w > null[3]).then(|| (z * sd.1 / (w - null[3])).powi(2)),
        _ => None,
    }
}

/// Tracks when the information bound is reached in one rollout.
struct Bound {
    need: Option<(f64, f64)>,
    rate: bool,
    /// The level metric the cell's effect is on (0 temperature, 1 power).
    level_metric: usize,
    got: f64,
    /// The last hour's information and its end, to extrapolate a bound not reached before the run ended.
    last: (f64, f64),
    at: [Option<f64>; 2],
}

impl Bound {
    fn new(cell: &Cell, policy: &BenchPolicy) -> Self {
        let (alpha, _) = policy.budget.per_gate(4);
        // Levels are counted in nodes measured at the hourly sd (`LevelBatch::information`).
        let sd = (TEMP_HOURLY_SD, POWER_HOURLY_SD);
        let median = information_needed(cell.effect, policy.nulls, sd, alpha, 0.5);
        let p95 = information_needed(cell.effect, policy.nulls, sd, alpha, 0.95);
        Self {
            need: median.zip(p95),
            rate: matches!(cell.effect, Effect::Rate { .. }),
            level_metric: usize::from(matches!(cell.effect, Effect::Power(_))),
            got: 0.0,
            last: (0.0, 0.0),
            at: [None, None],
        }
    }

    /// Adds an hour's information: baseline events of the updated side (rates), or sets the level
    /// information so far (nodes measured at the hourly sd; it grows as nodes are re-read).
    fn add(&mut self, hour_end: f64, baseline_events: f64, level_information: f64) {
        let Some((m, p)) = self.need else { return };
        let gained = if self.rate {
            baseline_events
        } else {
            (level_information - self.got).max(0.0)
        };
        self.got += gained;
        self.last = (gained, hour_end);
        for (slot, need) in self.at.iter_mut().zip([m, p]) {
            if slot.is_none() && self.got >= need {
                *slot = Some(hour_end);
            }
        }
    }

    /// Hours to the bound (median, p95 power). A bound not reached when the run ended (an early
    /// catch) is extrapolated at the last hour's rate of information.
    fn result(&self) -> Option<(f64, f64)> {
        let (need_m, need_p) = self.need?;
        let (gained, hour_end) = self.last;
        let extrapolate = |slot: Option<f64>, need: f64| {
            slot.or_else(|| (gained > 0.0).then(|| hour_end + (need - self.got) / gained))
        };
        extrapolate(self.at[0], need_m).zip(extrapolate(self.at[1], need_p))
    }
}

/// Nodes on the release once each judged wave has started (canary, canary + 10%).
pub fn wave_exposure(policy: &BenchPolicy) -> [usize; 2] {
    let canary = policy.waves[0].per_stratum * STRATA;
    [canary, canary + policy.waves[1].per_stratum * STRATA]
}

/// What `policy power` predicts for a rate cell ([`super::forecast_catch`], behind its `catch_by_end`):
/// the chance that the fleet method has caught the release by the end of the canary and of the 10%
/// wave, from a Monte Carlo of the method's rate gates (XID episodes and AER) on the bench policy's
/// waves, with the cell's concentration. `None` for other cells: `policy power` forecasts rate gates.
pub fn predicted_catch(cell: &Cell, policy: &BenchPolicy) -> Option<[f64; 2]> {
    let Effect::Rate { ratio, share } = cell.effect else {
        return None;
    };
    let (alpha, beta) = policy.budget.per_gate(4);
    let forecast = Forecast {
        fleet_nodes: NODES,
        waves: policy
            .waves
            .iter()
            .map(|w| ForecastWave {
                nodes: w.per_stratum * STRATA,
                bake_hours: f64::from(w.bake_h),
                max_bake_hours: f64::from(w.max_bake_h),
            })
            .collect(),
        gates: vec![
            ForecastGate {
                events_per_node_hour: cell.base * GPUS / MEAN_BURST,
                null: policy.nulls[0],
                must_detect: policy.waves.iter().map(|w| w.must_detect[0]).collect(),
                alpha,
                beta,
                dispersion_estimated: true,
            },
            ForecastGate {
                events_per_node_hour: AER_PER_NODE_HOUR,
                null: policy.nulls[1],
                must_detect: policy.waves.iter().map(|w| w.must_detect[1]).collect(),
                alpha,
                beta,
                dispersion_estimated: false,
            },
        ],
        seeds: FORECAST_SEEDS,
    };
    let p = forecast_catch(&forecast, 0, ratio, share).ok()?;
    Some([(*p.first()?)?, (*p.get(1)?)?])
}

/// The closed-form prediction [`catch_by_wave_end`] for a rate cell (the XID gate's cumulative
/// process alone, uniform effect), kept for comparison with [`predicted_catch`].
pub fn predicted_catch_closed_form(cell: &Cell, policy: &BenchPolicy) -> Option<[f64; 2]> {
    let Effect::Rate { ratio, .. } = cell.effect else {
        return None;
    };
    let (alpha, beta) = policy.budget.per_gate(4);
    let per_node_hour = cell.base * GPUS / MEAN_BURST;
    let exposed = wave_exposure(policy);
    let waves: Vec<TimedWave> = policy
        .waves
        .iter()
        .zip(exposed)
        .map(|(w, nodes)| TimedWave {
            events_per_hour: per_node_hour * nodes as f64,
            bake_hours: f64::from(w.bake_h),
            max_bake_hours: f64::from(w.max_bake_h),
            must_detect: w.must_detect[0],
        })
        .collect();
    let p = catch_by_wave_end(&waves, ratio, policy.nulls[0], alpha, beta, 1.0).ok()?;
    Some([*p.first()?, *p.get(1)?])
}

/// One wave's nodes as a level gate sees them: each node's change (running mean since the post-reset
/// exclusion minus its pre-period mean) minus the same change of the concurrent controls' mean. Node
/// offsets and the fleet-wide confounder cancel in the change, so only the noise is simulated: each
/// node's pre-period mean (drawn once), the sum of its hourly readings since (drawn hour by hour), and
/// the same two for the controls' mean (sd / sqrt(controls)). A node's pre-period is what the engine
/// holds for it: the hours it was watched as a control before its flash (the policy's pre-flash watch
/// for the canary, the earlier waves' bakes for later waves). Without one (a canary with no pre-flash
/// watch) nothing cancels the node's persistent offset, which the "pre-period" term then carries. The
/// engine weighs the pre-period by CUPED's coefficient estimated from the controls; the bench takes it
/// as 1, which the coefficient approaches when, as here, the offsets dominate the hourly noise.
/// Index 0 is temperature, 1 power.
struct LevelBatch {
    flashed: u32,
    controls: usize,
    hours: u32,
    /// Variance of one node's pre-period term, in units of the metric's hourly variance: `1/W` with a
    /// `W`-hour pre-period, the persistent offsets' variance without one.
    pre_variance: [f64; 2],
    pre: Vec<[f64; 2]>,
    post_sum: Vec<[f64; 2]>,
    control_pre: [f64; 2],
    control_post_sum: [f64; 2],
}

const LEVEL_HOURLY_SD: [f64; 2] = [TEMP_HOURLY_SD, POWER_HOURLY_SD];
const LEVEL_OFFSET_SD: [f64; 2] = [TEMP_OFFSET_SD, POWER_OFFSET_SD];

impl LevelBatch {
    fn new(rng: &mut ChaCha8Rng, flashed: u32, nodes: usize, controls: usize, pre_hours: u32) -> Self {
        let controls = controls.max(2);
        let pre_variance = [0, 1].map(|m| {
            if pre_hours > 0 {
                1.0 / f64::from(pre_hours)
            } else {
                (LEVEL_OFFSET_SD[m] / LEVEL_HOURLY_SD[m]).powi(2)
            }
        });
        let pre = (0..nodes)
            .map(|_| [0, 1].map(|m| LEVEL_HOURLY_SD[m] * pre_variance[m].sqrt() * normal(rng)))
            .collect();
        let control_pre = [0, 1].map(|m| LEVEL_HOURLY_SD[m] * (pre_variance[m] / controls as f64).sqrt() * normal(rng));
        Self {
            flashed,
            controls,
            hours: 0,
            pre_variance,
            pre,
            post_sum: vec![[0.0; 2]; nodes],
            control_pre,
            control_post_sum: [0.0; 2],
        }
    }

    /// One more hour of readings.
    fn advance(&mut self, rng: &mut ChaCha8Rng) {
        self.hours += 1;
        for sums in &mut self.post_sum {
            for (sum, sd) in sums.iter_mut().zip(LEVEL_HOURLY_SD) {
                *sum += sd * normal(rng);
            }
        }
        for (sum, sd) in self.control_post_sum.iter_mut().zip(LEVEL_HOURLY_SD) {
            *sum += sd / (self.controls as f64).sqrt() * normal(rng);
        }
    }

    /// Each node's difference (metric `m`, true shift `effect`) and one node's sd at this look.
    fn differences(&self, m: usize, effect: f64) -> (Vec<f64>, f64) {
        let t = f64::from(self.hours.max(1));
        let control = self.control_post_sum[m] / t - self.control_pre[m];
        let diffs = self
            .pre
            .iter()
            .zip(&self.post_sum)
            .map(|(pre, post)| effect + post[m] / t - pre[m] - control)
            .collect();
        let sd = LEVEL_HOURLY_SD[m] * (1.0 / t + self.pre_variance[m]).sqrt();
        (diffs, sd)
    }

    /// Information so far in nodes measured at the hourly sd of metric `m` (a node read for `t`
    /// hours after a `W`-hour pre-period counts `1 / (1/t + 1/W)`; 1 at t = W = 2), the unit of the
    /// level bound.
    fn information(&self, m: usize) -> f64 {
        let t = f64::from(self.hours.max(1));
        self.pre.len() as f64 / (1.0 / t + self.pre_variance[m])
    }
}

/// One rollout judged by the fleet-scale method.
pub fn run_fleet_method(cell: &Cell, policy: &BenchPolicy, seed: u64) -> Run {
    let mut world = World::new(cell, seed);
    let (alpha, beta) = policy.budget.per_gate(4);
    let config = RateEConfig::with_node_look();
    let mut xid = RateEProcess::new(config);
    let mut aer = RateEProcess::new(config);
    // A null the node look rejects (not a positive ratio) leaves the gate without the look.
    let mut xid_nodes = NodeMixtureProcess::new(policy.nulls[0]).ok();
    let mut aer_nodes = NodeMixtureProcess::new(policy.nulls[1]).ok();
    let mut bound = Bound::new(cell, policy);
    // Control nodes' counts since the start, for the dispersion estimate.
    let mut control_aer = vec![0u64; NODES];
    let mut control_xid = vec![0u64; NODES];
    let mut control_hours = vec![0u32; NODES];
    let mut wave_pass_h = [None, None];
    // Phases: 0, 1 = judged waves, 2 = the rest baking, 3 = soak.
    let mut phase = 0usize;
    // The pre-flash watch (`detection.pre_period`) runs first: the canary flashes when it ends.
    let watch_h = policy.pre_period_h;
    let mut phase_start = watch_h;
    let mut level_batches: Vec<LevelBatch> = Vec::new();
    let start_phase = |world: &mut World, phase: usize, hour: u32, batches: &mut Vec<LevelBatch>| {
        let mut taken = 0;
        for w in policy.waves.iter().take(phase) {
            taken += w.per_stratum;
        }
        let nodes: Vec<usize> = world
            .order
            .iter()
            .flat_map(|o| {
                let end = if phase < 2 {
                    taken + policy.waves[phase].per_stratum
                } else {
                    o.len() - policy.holdback_per_stratum
                };
                o[taken..end].to_vec()
            })
            .collect();
        world.update(&nodes, hour);
        let controls = world.nodes.iter().filter(|n| n.updated_at.is_none()).count();
        // Every node not yet flashed is watched as a control from the start (the pre-flash watch,
        // then the canary's bake), so a wave flashed at `hour` has that many hours of pre-period.
        batches.push(LevelBatch::new(&mut world.rng, hour, nodes.len(), controls, hour));
    };
    start_phase(&mut world, 0, watch_h, &mut level_batches);
    for hour in 0..HORIZON_H {
        let hour_end = f64::from(hour + 1);
        let mut xid_cells = vec![RateCell::default(); STRATA];
        let mut aer_cells = vec![RateCell::default(); STRATA];
        let mut xid_node_cells = vec![NodeCell::default(); STRATA];
        let mut aer_node_cells = vec![NodeCell::default(); STRATA];
        let mut baseline = 0.0;
        for i in 0..NODES {
            // The fleet method counts XID episodes per node: a cascade over a node's GPUs is one event.
            let (_, x, a) = world.events(i, hour);
            let node = &world.nodes[i];
            let (xc, ac) = (&mut xid_cells[node.stratum], &mut aer_cells[node.stratum]);
            match node.updated_at {
                Some(at) if hour < at + EXCLUSION_H => {}
                Some(_) => {
                    xc.updated_events += x;
                    xc.updated_exposure += GPUS;
                    ac.updated_events += a;
                    ac.updated_exposure += 1.0;
                    baseline += cell.base * GPUS / MEAN_BURST;
                    let id = i as u32;
                    xid_node_cells[node.stratum].updated.push(NodeObservation {
                        node: id,
                        events: x,
                        exposure: GPUS,
                    });
                    aer_node_cells[node.stratum].updated.push(NodeObservation {
                        node: id,
                        events: a,
                        exposure: 1.0,
                    });
                }
                None => {
                    xc.control_events += x;
                    xc.control_exposure += GPUS;
                    ac.control_events += a;
                    ac.control_exposure += 1.0;
                    let (xn, an) = (&mut xid_node_cells[node.stratum], &mut aer_node_cells[node.stratum]);
                    xn.control_events += x;
                    xn.control_exposure += GPUS;
                    an.control_events += a;
                    an.control_exposure += 1.0;
                    control_xid[i] += x;
                    control_aer[i] += a;
                    control_hours[i] += 1;
                }
            }
        }
        // Level gates: every wave's nodes, re-measured at every look from their first hour after the
        // reset exclusion (as the engine's judge does), so a level gate can fail inside the bake.
        let (temp_effect, power_effect) = world.level_effect();
        let mut temp = LevelEProcess::new(LevelEConfig::default());
        let mut power = LevelEProcess::new(LevelEConfig::default());
        let mut level_info = [0.0; 2];
        for batch in &mut level_batches {
            if hour < batch.flashed + EXCLUSION_H {
                continue;
            }
            batch.advance(&mut world.rng);
            let (td, tsd) = batch.differences(0, temp_effect);
            let (pd, psd) = batch.differences(1, power_effect);
            // The simulation's own inputs are always valid; an error here would be a bench bug.
            let _ = temp.observe_batch(&td, tsd, batch.controls);
            let _ = power.observe_batch(&pd, psd, batch.controls);
            for (m, info) in level_info.iter_mut().enumerate() {
                *info += batch.information(m);
            }
        }
        let _ = xid.observe_bin(&xid_cells);
        let _ = aer.observe_bin(&aer_cells);
        for (process, cells) in [(&mut xid_nodes, &xid_node_cells), (&mut aer_nodes, &aer_node_cells)] {
            if let Some(p) = process {
                let _ = p.observe_bin(cells);
            }
        }
        bound.add(hour_end, baseline, level_info[bound.level_metric]);
        if hour < watch_h {
            // The pre-flash watch: nothing is on the release yet, nothing to decide.
            continue;
        }
        let control_counts = |counts: &[u64], per_hour: f64| -> Vec<NodeCount> {
            (0..NODES)
                .filter(|&i| world.nodes[i].updated_at.is_none() && control_hours[i] > 0)
                .map(|i| NodeCount {
                    stratum: world.nodes[i].stratum as u32,
                    events: counts[i],
                    exposure: f64::from(control_hours[i]) * per_hour,
                })
                .collect()
        };
        let xid_control = control_counts(&control_xid, GPUS);
        let phi = quasi_poisson_dispersion(&xid_control).unwrap_or(1.0);
        // Without control events there is no spread to estimate; the look's floor applies.
        let xid_spread = node_heterogeneity(&xid_control).unwrap_or(0.0);
        let aer_spread = node_heterogeneity(&control_counts(&control_aer, 1.0)).unwrap_or(0.0);
        let node_level = config.node_look_level(alpha);
        let node_fail = |process: &Option<NodeMixtureProcess>, spread: f64| {
            process
                .as_ref()
                .is_some_and(|p| p.may_have_risen() && p.fails(node_level, spread).unwrap_or(false))
        };
        let xid_node_fail = node_fail(&xid_nodes, xid_spread);
        let aer_node_fail = node_fail(&aer_nodes, aer_spread);
        let must_detect = match phase {
            0 | 1 => policy.waves[phase].must_detect,
            _ => policy.soak_must_detect,
        };
        let looks = [
            (
                "xid",
                xid.look(policy.nulls[0], must_detect[0], alpha, beta, phi)
                    .ok()
                    .map(|l| (l.fail || xid_node_fail, l.pass_ready)),
            ),
            (
                "aer",
                aer.look(policy.nulls[1], must_detect[1], alpha, beta, 1.0)
                    .ok()
                    .map(|l| (l.fail || aer_node_fail, l.pass_ready)),
            ),
            (
                "temp",
                temp.look(policy.nulls[2], must_detect[2], alpha, beta)
                    .ok()
                    .map(|l| (l.fail, l.pass_ready)),
            ),
            (
                "power",
                power
                    .look(policy.nulls[3], must_detect[3], alpha, beta)
                    .ok()
                    .map(|l| (l.fail, l.pass_ready)),
            ),
        ];
        let gates: Vec<GateLook> = looks
            .iter()
            .map(|(name, l)| {
                let (fail, pass_ready) = l.unwrap_or((false, false));
                GateLook {
                    gate: (*name).into(),
                    fail,
                    pass_ready,
                    lower: f64::NAN,
                    upper: f64::NAN,
                    null: 0.0,
                    must_detect: 0.0,
                }
            })
            .collect();
        let elapsed = f64::from(hour + 1 - phase_start);
        let exposed = world.updated_count();
        match phase {
            0 | 1 => {
                let w = policy.waves[phase];
                let timing = WaveTiming {
                    elapsed_hours: elapsed,
                    bake_hours: f64::from(w.bake_h),
                    max_bake_hours: f64::from(w.max_bake_h),
                };
                match decide_wave(timing, &gates) {
                    WaveDecision::Fail { .. } => return detected(hour_end, exposed, wave_pass_h, &bound),
                    WaveDecision::Hold { .. } => {
                        return held(hour_end, exposed, elapsed - f64::from(w.bake_h), wave_pass_h, &bound);
                    }
                    WaveDecision::Pass => {
                        wave_pass_h[phase] = Some(elapsed);
                        phase += 1;
                        phase_start = hour + 1;
                        start_phase(&mut world, phase, hour + 1, &mut level_batches);
                    }
                    WaveDecision::Extend { .. } => {}
                }
            }
            2 => {
                if gates.iter().any(|g| g.fail) {
                    return detected(hour_end, exposed, wave_pass_h, &bound);
                }
                if elapsed >= f64::from(policy.rest_bake_h) {
                    phase = 3;
                    phase_start = hour + 1;
                }
            }
            _ => {
                let timing = WaveTiming {
                    elapsed_hours: elapsed,
                    bake_hours: f64::from(policy.soak_h.0),
                    max_bake_hours: f64::from(policy.soak_h.1),
                };
                match decide_soak(timing, &gates) {
                    SoakDecision::RollBackAndBlock { .. } => return detected(hour_end, exposed, wave_pass_h, &bound),
                    SoakDecision::FleetProvenThenUpdateHoldback => {
                        return Run {
                            end: End::FleetProven { hour: hour_end },
                            wave_pass_h,
                            bound_h: bound.result(),
                        };
                    }
                    SoakDecision::Hold { .. } => {
                        return held(
                            hour_end,
                            exposed,
                            elapsed - f64::from(policy.soak_h.0),
                            wave_pass_h,
                            &bound,
                        );
                    }
                    SoakDecision::Extend { .. } => {}
                }
            }
        }
    }
    held(
        f64::from(HORIZON_H),
        world.updated_count(),
        f64::NAN,
        wave_pass_h,
        &bound,
    )
}

fn detected(hour: f64, exposed: usize, wave_pass_h: [Option<f64>; 2], bound: &Bound) -> Run {
    Run {
        end: End::Detected { hour, exposed },
        wave_pass_h,
        bound_h: bound.result(),
    }
}

fn held(hour: f64, exposed: usize, extension: f64, wave_pass_h: [Option<f64>; 2], bound: &Bound) -> Run {
    Run {
        end: End::Held {
            hour,
            exposed,
            extension,
        },
        wave_pass_h,
        bound_h: bound.result(),
    }
}

/// One rollout judged by the current method: each wave against a control sample of its own size,
/// a test that starts from zero per wave, the null at `min_effect`, a fixed bake with hourly looks and
/// O'Brien-Fleming spending, a pass when nothing was proven; the last wave has no control left.
pub fn run_current_method(cell: &Cell, policy: &BenchPolicy, seed: u64) -> Run {
    let mut world = World::new(cell, seed);
    let mut bound = Bound::new(cell, policy);
    let mut wave_pass_h = [None, None];
    let mut hour = 0u32;
    let mut taken = 0usize;
    let rate_gate = |name: &str, min: f64| RateGate {
        name: name.into(),
        min_effect_ratio: min,
        min_canary_events_for_fail: crate::judging::MIN_CANARY_EVENTS_FOR_FAIL,
        min_exposure: crate::judging::MIN_EXPOSURE,
    };
    let level_gate = |name: &str, min: f64| LevelGate {
        name: name.into(),
        direction: Direction::HigherIsWorse,
        min_shift: min,
        min_samples: crate::judging::MIN_LEVEL_UNITS,
    };
    let gates = (
        rate_gate("xid", policy.nulls[0]),
        rate_gate("aer", policy.nulls[1]),
        level_gate("temp", policy.nulls[2]),
        level_gate("power", policy.nulls[3]),
    );
    let (temp_effect, power_effect) = world.level_effect();
    for (index, wave) in policy.waves.iter().enumerate() {
        let canary: Vec<usize> = world
            .order
            .iter()
            .flat_map(|o| o[taken..taken + wave.per_stratum].to_vec())
            .collect();
        taken += wave.per_stratum;
        let mut pool: Vec<usize> = world.order.iter().flat_map(|o| o[taken..].to_vec()).collect();
        pool.shuffle(&mut world.rng);
        let control: Vec<usize> = pool.into_iter().take(canary.len()).collect();
        world.update(&canary, hour);
        let start = hour;
        let Ok(plan) =
            SequentialPlan::bonferroni(policy.current_alpha, 4, wave.bake_h, SpendingFunction::OBrienFleming)
        else {
            break;
        };
        let mut samples = [[RateSample {
            events: 0,
            exposure: 0.0,
        }; 2]; 2];
        let z_canary: Vec<(f64, f64)> = canary
            .iter()
            .map(|_| (normal(&mut world.rng), normal(&mut world.rng)))
            .collect();
        let z_control: Vec<(f64, f64)> = control
            .iter()
            .map(|_| (normal(&mut world.rng), normal(&mut world.rng)))
            .collect();
        for look_number in 1..=wave.bake_h {
            for (side, nodes) in [(0, &canary), (1, &control)] {
                for &i in nodes {
                    let (x, _, a) = world.events(i, hour);
                    samples[0][side].events += x;
                    samples[0][side].exposure += GPUS;
                    samples[1][side].events += a;
                    samples[1][side].exposure += 1.0;
                }
            }
            bound.add(
                f64::from(hour + 1),
                cell.base * GPUS / MEAN_BURST * world.updated_count() as f64,
                0.0,
            );
            hour += 1;
            let Ok(look) = plan.look(look_number) else { break };
            // A node's running mean over the bake so far: offset + effect + shared confounder + noise / sqrt(hours).
            let elapsed = f64::from(hour - start);
            let conf = world.level_confounder(start, hour);
            let level = |i: usize, z: (f64, f64), on: bool| {
                let n = &world.nodes[i];
                (
                    n.temp_offset + conf.0 + if on { temp_effect } else { 0.0 } + TEMP_HOURLY_SD * z.0 / elapsed.sqrt(),
                    n.power_offset
                        + conf.1
                        + if on { power_effect } else { 0.0 }
                        + POWER_HOURLY_SD * z.1 / elapsed.sqrt(),
                )
            };
            let c: Vec<(f64, f64)> = canary.iter().zip(&z_canary).map(|(&i, &z)| level(i, z, true)).collect();
            let k: Vec<(f64, f64)> = control
                .iter()
                .zip(&z_control)
                .map(|(&i, &z)| level(i, z, false))
                .collect();
            let (ct, cp): (Vec<f64>, Vec<f64>) = c.into_iter().unzip();
            let (kt, kp): (Vec<f64>, Vec<f64>) = k.into_iter().unzip();
            let verdict = combine(vec![
                evaluate_rate(
                    &gates.0,
                    &RateCohorts {
                        canary: samples[0][0],
                        control: samples[0][1],
                    },
                    &look,
                ),
                evaluate_rate(
                    &gates.1,
                    &RateCohorts {
                        canary: samples[1][0],
                        control: samples[1][1],
                    },
                    &look,
                ),
                evaluate_level(
                    &gates.2,
                    &LevelCohorts {
                        canary: &ct,
                        control: &kt,
                    },
                    &look,
                ),
                evaluate_level(
                    &gates.3,
                    &LevelCohorts {
                        canary: &cp,
                        control: &kp,
                    },
                    &look,
                ),
            ]);
            match verdict.outcome {
                Outcome::Fail => {
                    return detected(f64::from(hour), world.updated_count(), wave_pass_h, &bound);
                }
                _ if look_number < wave.bake_h => {}
                Outcome::Pass => wave_pass_h[index] = Some(elapsed),
                // The per-wave method never extends; its other outcomes hold for a human.
                Outcome::Extend | Outcome::Inconclusive | Outcome::Hold | Outcome::Error => {
                    return held(f64::from(hour), world.updated_count(), 0.0, wave_pass_h, &bound);
                }
            }
        }
    }
    // The rest: everything left, no control, nothing judges it.
    let rest: Vec<usize> = world.order.iter().flat_map(|o| o[taken..].to_vec()).collect();
    world.update(&rest, hour);
    for _ in 0..policy.rest_bake_h {
        bound.add(f64::from(hour + 1), cell.base * GPUS / MEAN_BURST * NODES as f64, 0.0);
        hour += 1;
    }
    Run {
        end: End::CompletedUnjudged { hour: f64::from(hour) },
        wave_pass_h,
        bound_h: bound.result(),
    }
}

/// The cells issue 22 asks for, with `effect_seeds` per effect cell and `healthy_seeds` for the
/// healthy one (the confounder and hot-node cells get `effect_seeds`).
pub fn cells(effect_seeds: u32, healthy_seeds: u32) -> Vec<Cell> {
    let mut cells = vec![Cell {
        label: "healthy".into(),
        base: 0.002,
        effect: Effect::Healthy,
        seeds: healthy_seeds,
    }];
    for (label, effect) in [("confounder", Effect::Confounder), ("hot nodes", Effect::HotNodes)] {
        cells.push(Cell {
            label: label.into(),
            base: 0.002,
            effect,
            seeds: effect_seeds,
        });
    }
    for base in [0.002, 0.0005] {
        for share in [1.0, 0.25] {
            for ratio in [1.5, 2.0, 3.0, 6.0] {
                let on = if share < 1.0 { "25% nodes" } else { "all nodes" };
                cells.push(Cell {
                    label: format!("xid {ratio}x {on} @{base}"),
                    base,
                    effect: Effect::Rate { ratio, share },
                    seeds: effect_seeds,
                });
            }
        }
    }
    for t in [1.0, 2.0, 3.0] {
        cells.push(Cell {
            label: format!("temp +{t} C"),
            base: 0.002,
            effect: Effect::Temp(t),
            seeds: effect_seeds,
        });
    }
    for w in [20.0, 60.0] {
        cells.push(Cell {
            label: format!("power +{w} W"),
            base: 0.002,
            effect: Effect::Power(w),
            seeds: effect_seeds,
        });
    }
    cells
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(effect: Effect) -> Cell {
        Cell {
            label: "t".into(),
            base: 0.002,
            effect,
            seeds: 1,
        }
    }

    #[test]
    fn a_six_fold_rise_is_caught_in_the_canary_by_the_fleet_method() {
        let policy = BenchPolicy::default();
        let run = run_fleet_method(&cell(Effect::Rate { ratio: 6.0, share: 1.0 }), &policy, 1);
        match run.end {
            End::Detected { exposed, .. } => assert_eq!(exposed, 32),
            other => panic!("{other:?}"),
        }
        assert!(run.bound_h.is_some());
    }

    #[test]
    fn policy_power_predicts_rate_cells_only_and_a_big_rise_is_predicted_caught_in_the_canary() {
        let policy = BenchPolicy::default();
        let p = predicted_catch(
            &Cell {
                base: 0.002,
                ..cell(Effect::Rate { ratio: 6.0, share: 1.0 })
            },
            &policy,
        )
        .unwrap();
        assert!(p[0] > 0.99 && p[1] >= p[0], "{p:?}");
        assert!(predicted_catch(&cell(Effect::Temp(2.0)), &policy).is_none());
    }

    #[test]
    fn a_waves_own_must_detect_for_a_non_xid_gate_is_what_the_wave_must_rule_out() {
        // The canary holds AER to 1.5x instead of 2x: a healthy canary (about 32 AER events a day)
        // needs more evidence, so it passes later than with the gate's own must_detect.
        let base = BenchPolicy::default();
        let mut tight = base.clone();
        tight.waves[0].must_detect[1] = 1.5;
        let c = cell(Effect::Healthy);
        // Over a few seeds: never sooner, and later where AER rather than XID is what the canary
        // waits for.
        let passed = |p: &BenchPolicy, seed| run_fleet_method(&c, p, seed).wave_pass_h[0].expect("the canary passes");
        let pairs: Vec<(f64, f64)> = (0..8).map(|seed| (passed(&base, seed), passed(&tight, seed))).collect();
        assert!(pairs.iter().all(|(loose, strict)| strict >= loose), "{pairs:?}");
        assert!(pairs.iter().any(|(loose, strict)| strict > loose), "{pairs:?}");
    }

    #[test]
    fn the_same_seed_gives_the_same_rollout() {
        let policy = BenchPolicy::default();
        let c = cell(Effect::Temp(3.0));
        assert_eq!(
            run_fleet_method(&c, &policy, 5).end,
            run_fleet_method(&c, &policy, 5).end
        );
        assert_eq!(
            run_current_method(&c, &policy, 5).end,
            run_current_method(&c, &policy, 5).end
        );
    }
}
