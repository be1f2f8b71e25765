//! The detector judge: stored samples → cohorts → `orchestrator_detect`
//! verdicts at planned looks, each look evaluated once and recorded.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, Duration, Utc};
use orchestrator_db::execution::{ExecRollout, ExecWave};
use orchestrator_db::health::{Cohort, HealthLook, HealthSample, LevelAgg, NewHealthLook, SampleScope};
use orchestrator_db::{Db, DbError};
use orchestrator_detect::{
    Evidence, InconclusiveReason, LevelCohorts, LevelGate, Outcome, RateCohorts, RateGate, RateSample, SequentialPlan,
    SpendingFunction, Verdict, evaluate_level, evaluate_rate,
};
use orchestrator_policy::{Direction, GateKind, GateSource, HealthGate, Policy, RedfishMetric};
use orchestrator_types::{NodeId, RolloutClock, WaveId, WaveVerdict};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::collector::Collector;

mod fleet;
use crate::connector::HealthBmcs;
use crate::health::HealthJudge;
use crate::prometheus::PrometheusClient;
pub use fleet::max_bake_seconds;

/// The actor the audit log records for the detector's looks.
pub const DETECTOR_ACTOR: &str = "detector";

// The judge's fixed choices live in the detect crate, where the power
// analysis reads them too; re-exported here for the engine's callers.
use orchestrator_detect::judging::{DEFAULT_SPENDING, gate_plan};
pub use orchestrator_detect::judging::{MAX_LOOKS, MIN_CANARY_EVENTS_FOR_FAIL, MIN_EXPOSURE, MIN_LEVEL_UNITS};

/// BMCs polled at once by the collector, per wave.
pub const DEFAULT_POLL_CONCURRENCY: usize = 32;

/// What a gate of the policy becomes for the detector.
#[derive(Debug, Clone)]
enum Gate {
    Rate {
        gate: HealthGate,
        metric: RedfishMetric,
    },
    Level {
        gate: HealthGate,
        metric: RedfishMetric,
    },
    /// A level gate whose values come from a PromQL query.
    PromLevel {
        gate: HealthGate,
        query: String,
    },
    /// A gate this judge cannot evaluate; holds the wave for a human.
    Unsupported {
        name: String,
        reason: String,
    },
}

impl Gate {
    fn name(&self) -> &str {
        match self {
            Gate::Rate { gate, .. } | Gate::Level { gate, .. } | Gate::PromLevel { gate, .. } => &gate.name,
            Gate::Unsupported { name, .. } => name,
        }
    }

    /// The gate, when it has a data source.
    fn health_gate(&self) -> Option<&HealthGate> {
        match self {
            Gate::Rate { gate, .. } | Gate::Level { gate, .. } | Gate::PromLevel { gate, .. } => Some(gate),
            Gate::Unsupported { .. } => None,
        }
    }

    /// The gate and its Redfish metric, for Redfish gates.
    fn watched(&self) -> Option<(&HealthGate, RedfishMetric)> {
        match self {
            Gate::Rate { gate, metric } | Gate::Level { gate, metric } => Some((gate, *metric)),
            Gate::PromLevel { .. } | Gate::Unsupported { .. } => None,
        }
    }

    /// The key its samples are stored under.
    fn sample_key(&self) -> String {
        match self {
            Gate::Rate { metric, .. } | Gate::Level { metric, .. } => metric.as_str().to_owned(),
            Gate::PromLevel { gate, .. } => format!("prometheus:{}", gate.name),
            Gate::Unsupported { name, .. } => name.clone(),
        }
    }
}

fn resolve_gate(policy: &Policy, name: &str, prometheus: bool) -> Gate {
    let unsupported = |reason: &str| Gate::Unsupported {
        name: name.to_owned(),
        reason: reason.to_owned(),
    };
    let Some(gate) = policy.health.gate(name) else {
        return unsupported("the policy has no gate of this name");
    };
    match &gate.source {
        GateSource::Prometheus { .. } if !prometheus => {
            unsupported("no Prometheus server is configured for this judge")
        }
        GateSource::Prometheus { query } => match gate.kind {
            GateKind::Level => Gate::PromLevel {
                gate: gate.clone(),
                query: query.clone(),
            },
            // Rate gates read their events through the metric-source seam
            // (`super::prom_rate`) at evaluation, not from polled samples.
            GateKind::Rate => Gate::PromLevel {
                gate: gate.clone(),
                query: query.clone(),
            },
        },
        GateSource::Redfish {
            metric: RedfishMetric::FlashFailures,
        } => unsupported("flash failures have no control cohort to compare with; the failure budget covers them"),
        GateSource::Redfish { metric } => match (gate.kind, metric.kind()) {
            (GateKind::Rate, GateKind::Rate) => Gate::Rate {
                gate: gate.clone(),
                metric: *metric,
            },
            (GateKind::Level, GateKind::Level) => Gate::Level {
                gate: gate.clone(),
                metric: *metric,
            },
            _ => unsupported("the gate's kind does not match its metric's"),
        },
    }
}

/// Planned looks for a gate: one per interval across the bake, at least one.
fn planned_looks(bake: Duration, interval: Duration) -> u32 {
    orchestrator_detect::judging::planned_looks(bake.num_seconds(), interval.num_seconds())
}

/// No events and no exposure on either side: where a rate gate's fold starts.
fn no_rate_samples() -> RateCohorts {
    let none = RateSample {
        events: 0,
        exposure: 0.0,
    };
    RateCohorts {
        canary: none,
        control: none,
    }
}

/// Adds one stored sample to its cohort's events and exposure.
fn add_rate_sample(cohorts: &mut RateCohorts, s: &HealthSample) {
    let side = match s.cohort {
        Cohort::Canary => &mut cohorts.canary,
        Cohort::Control => &mut cohorts.control,
    };
    side.events = side.events.saturating_add(s.events);
    side.exposure += s.exposure;
}

/// One value per unit (GPU) and cohort, the unit's mean over the bake so far, folded as the samples stream in, grouped by node as [`Db::each_health_sample`] yields
/// them: only the current node's units are held, so a look over a 100,000-node wave keeps one `f64`
/// per GPU instead of every node's per-unit aggregates.
#[derive(Default)]
struct LevelFold {
    node: Option<(Cohort, NodeId)>,
    units: BTreeMap<String, LevelAgg>,
    canary: Vec<f64>,
    control: Vec<f64>,
}

impl LevelFold {
    fn add(&mut self, s: &HealthSample) {
        if self.node != Some((s.cohort, s.node_id)) {
            self.flush();
            self.node = Some((s.cohort, s.node_id));
        }
        for (unit, agg) in &s.units {
            match self.units.get_mut(unit) {
                Some(a) => a.merge(agg),
                None => {
                    self.units.insert(unit.clone(), *agg);
                }
            }
        }
    }

    fn flush(&mut self) {
        let Some((cohort, _)) = self.node else { return };
        let side = match cohort {
            Cohort::Canary => &mut self.canary,
            Cohort::Control => &mut self.control,
        };
        side.extend(self.units.values().filter_map(LevelAgg::mean));
        self.units.clear();
    }

    fn finish(mut self) -> (Vec<f64>, Vec<f64>) {
        self.flush();
        (self.canary, self.control)
    }
}

fn fmt_opt(value: Option<f64>) -> String {
    value.map_or_else(|| "unbounded".to_owned(), |v| format!("{v:.3}"))
}

/// One line for the UI and the release's block reason.
fn describe(evidence: &Evidence) -> String {
    let look = format!("look {}/{}", evidence.look.number, evidence.look.planned);
    match (evidence.canary.rate, evidence.control.rate) {
        (Some(canary), control) => format!(
            "{gate}: canary {canary:.4} vs control {control} per unit exposure ({ce} vs {xe} events), rate ratio {est} \
             (95% CI {lo}-{hi}) above {min} with p={p:.2e} at {look}",
            gate = evidence.gate,
            control = control.map_or_else(|| "n/a".to_owned(), |c| format!("{c:.4}")),
            ce = evidence.canary.events.unwrap_or(0),
            xe = evidence.control.events.unwrap_or(0),
            est = fmt_opt(evidence.effect.estimate),
            lo = fmt_opt(evidence.effect.ci95_lower),
            hi = fmt_opt(evidence.effect.ci95_upper),
            min = evidence.effect.min_effect,
            p = evidence.p_value,
        ),
        _ => format!(
            "{gate}: canary median {cm} vs control median {xm}, shift {est} (95% CI {lo}-{hi}) beyond {min} with \
             p={p:.2e} at {look}",
            gate = evidence.gate,
            cm = fmt_opt(evidence.canary.median),
            xm = fmt_opt(evidence.control.median),
            est = fmt_opt(evidence.effect.estimate),
            lo = fmt_opt(evidence.effect.ci95_lower),
            hi = fmt_opt(evidence.effect.ci95_upper),
            min = evidence.effect.min_effect,
            p = evidence.p_value,
        ),
    }
}

/// The evidence of a [`DetectorJudge`] wave verdict (the `evidence` of its
/// [`WaveVerdict`]): how the gates shared the false-alarm rate and each
/// gate's latest look. Readers (the simulate report, the evidence package)
/// decode it with this type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DetectorEvidence {
    /// The policy's family-wise false-alarm rate.
    pub alpha: f64,
    /// How the gates share it.
    pub correction: String,
    /// The alpha-spending function over the looks.
    pub spending: String,
    pub bake_seconds: i64,
    pub bake_started_at: DateTime<Utc>,
    /// Size of the control cohort.
    pub control_nodes: usize,
    pub gates: Vec<GateLook>,
    /// Watched nodes whose last health poll failed, with the reason (a canary node among them makes a
    /// final verdict that is not a Fail an Error: its health was not read).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub poll_errors: Vec<PollError>,
}

/// A watched node whose latest health poll failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PollError {
    pub node: NodeId,
    /// The node's name, for people.
    pub name: String,
    pub cohort: Cohort,
    /// The poll's error chain, as stored.
    pub error: String,
}

impl PollError {
    fn describe(&self) -> String {
        format!(
            "health of {} node {} unreadable: {}",
            self.cohort.as_str(),
            self.name,
            self.error
        )
    }
}

/// One gate's latest look in a wave verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateLook {
    pub gate: String,
    pub outcome: Outcome,
    /// The look's number, `None` before the first look.
    pub look: Option<u32>,
    pub planned_looks: Option<u32>,
    pub summary: String,
    /// The detector's per-gate verdict ([`orchestrator_detect::Verdict`]
    /// when the look was evaluated; a reason otherwise).
    pub verdict: serde_json::Value,
}

/// A gate's state after this round: its latest look's verdict.
#[derive(Debug, Clone)]
struct GateState {
    gate: String,
    outcome: Outcome,
    look: Option<u32>,
    planned: Option<u32>,
    summary: String,
    verdict: serde_json::Value,
}

fn state_from_look(look: &HealthLook) -> GateState {
    let verdict: Option<orchestrator_detect::Verdict> = serde_json::from_value(look.look.verdict.clone()).ok();
    let summary = verdict
        .as_ref()
        .and_then(|v| v.evidence().map(describe))
        .unwrap_or_else(|| format!("{}: {}", look.look.gate, look.look.outcome));
    GateState {
        gate: look.look.gate.clone(),
        outcome: look.look.outcome,
        look: Some(look.look.look_number),
        planned: Some(look.look.planned_looks),
        summary,
        verdict: look.look.verdict.clone(),
    }
}

/// Judges waves by comparing them with their control cohorts, from samples
/// the Redfish [`Collector`] stores.
///
/// Every engine pass of a baking wave calls [`HealthJudge::check`]: it polls
/// when the gates' interval has passed and evaluates a gate's look when its
/// time has come, once (the look is recorded; a restart reads it back and
/// never spends the same boundary twice). A crossed boundary fails the wave
/// at once (the engine then rolls back per policy and blocks the release
/// with the evidence as the reason). At the
/// bake's end [`HealthJudge::judge`] evaluates the final looks: all pass →
/// Pass; anything short of proof either way → Inconclusive (a human holds).
#[derive(Debug)]
pub struct DetectorJudge {
    db: Db,
    clock: RolloutClock,
    collector: Collector,
    spending: SpendingFunction,
    prometheus: Option<PrometheusClient>,
    last_poll: Mutex<HashMap<WaveId, DateTime<Utc>>>,
}

impl DetectorJudge {
    /// The wave's gates as this judge can read them (Prometheus gates only with a Prometheus client).
    fn wave_gates(&self, wave: &ExecWave, policy: &Policy) -> Vec<Gate> {
        wave.gates
            .iter()
            .map(|name| resolve_gate(policy, name, self.prometheus.is_some()))
            .collect()
    }

    /// A judge polling BMCs through `bmcs`, O'Brien-Fleming spending (see
    /// the detect README for why).
    pub fn new(db: Db, bmcs: Arc<dyn HealthBmcs>) -> Self {
        Self {
            clock: db.clock().clone(),
            collector: Collector::new(db.clone(), bmcs, DEFAULT_POLL_CONCURRENCY),
            db,
            spending: DEFAULT_SPENDING,
            prometheus: None,
            last_poll: Mutex::new(HashMap::new()),
        }
    }

    /// Uses another alpha-spending function.
    pub fn with_spending(mut self, spending: SpendingFunction) -> Self {
        self.spending = spending;
        self
    }

    /// Judges the policy's Prometheus level gates with this server's data
    /// (without one they hold the wave for a human).
    pub fn with_prometheus(mut self, client: PrometheusClient) -> Self {
        self.prometheus = Some(client);
        self
    }

    /// Polls the wave when its interval has passed (always when `force`).
    async fn poll_if_due(
        &self,
        rollout: &ExecRollout,
        wave: &ExecWave,
        gates: &[Gate],
        bake_start: DateTime<Utc>,
        now: DateTime<Utc>,
        force: bool,
    ) -> Result<(), DbError> {
        let watched: Vec<(&HealthGate, RedfishMetric)> = gates.iter().filter_map(Gate::watched).collect();
        let Some(interval) = gates.iter().filter_map(Gate::health_gate).map(|g| g.interval).min() else {
            return Ok(());
        };
        let due = {
            let polls = self.last_poll.lock().unwrap_or_else(|p| p.into_inner());
            force || polls.get(&wave.id).is_none_or(|last| now - *last >= interval)
        };
        if !due {
            return Ok(());
        }
        let mut metrics: Vec<RedfishMetric> = Vec::new();
        for (_, metric) in &watched {
            if !metrics.contains(metric) {
                metrics.push(*metric);
            }
        }
        if !metrics.is_empty() {
            let started = std::time::Instant::now();
            let report = self.collector.collect(rollout, wave, &metrics, bake_start, now).await?;
            tracing::debug!(wave = %wave.name, ?report, ms = started.elapsed().as_millis(), "health poll");
        }
        let queries = prometheus_level_queries(gates);
        if let (Some(client), false) = (&self.prometheus, queries.is_empty()) {
            let report = self
                .collector
                .collect_prometheus(client, rollout, wave, &queries, bake_start, now)
                .await?;
            tracing::debug!(wave = %wave.name, ?report, "Prometheus health poll");
        }
        self.last_poll
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(wave.id, now);
        Ok(())
    }

    /// Evaluates `gate` at `look` (cumulative data) and records it; a look
    /// already recorded (by a previous run) is read back instead.
    async fn evaluate(
        &self,
        rollout: &ExecRollout,
        wave: &ExecWave,
        gate: &Gate,
        plan: &SequentialPlan,
        look_number: u32,
    ) -> Result<GateState, DbError> {
        let look = match plan.look(look_number) {
            Ok(look) => look,
            Err(err) => {
                return Ok(GateState {
                    gate: gate.name().to_owned(),
                    outcome: Outcome::Error,
                    look: None,
                    planned: None,
                    summary: format!("{}: {err}", gate.name()),
                    verdict: json!({ "error": err.to_string() }),
                });
            }
        };
        let key = gate.sample_key();
        let prom_rate = match (gate, &self.prometheus) {
            (Gate::PromLevel { gate: g, .. }, Some(client)) if g.kind == GateKind::Rate => {
                let bake_start = wave.bake_started_at.unwrap_or_else(|| self.clock.now());
                match super::prom_rate::prometheus_rate_cohorts(
                    client,
                    &self.collector,
                    wave,
                    g,
                    bake_start,
                    self.clock.now(),
                )
                .await
                {
                    // Not recorded: a later pass asks Prometheus again.
                    Err(reason) => {
                        return Ok(GateState {
                            gate: g.name.clone(),
                            outcome: Outcome::Error,
                            look: None,
                            planned: None,
                            summary: format!("{}: {reason}", g.name),
                            verdict: json!({ "error": reason }),
                        });
                    }
                    Ok(cohorts) => Some((g, cohorts)),
                }
            }
            _ => None,
        };
        let verdict = match gate {
            Gate::PromLevel { .. } if prom_rate.is_some() => prom_rate_verdict(prom_rate.as_ref(), &look),
            Gate::Rate { gate, metric } => {
                let mut cohorts = no_rate_samples();
                self.db
                    .each_health_sample(SampleScope::Wave(wave.id), Some(metric.as_str()), |s| {
                        add_rate_sample(&mut cohorts, &s)
                    })
                    .await?;
                evaluate_rate(
                    &RateGate {
                        name: gate.name.clone(),
                        min_effect_ratio: gate.min_effect,
                        min_canary_events_for_fail: MIN_CANARY_EVENTS_FOR_FAIL,
                        min_exposure: MIN_EXPOSURE,
                    },
                    &cohorts,
                    &look,
                )
            }
            Gate::Level { gate, .. } | Gate::PromLevel { gate, .. } => {
                let mut fold = LevelFold::default();
                self.db
                    .each_health_sample(SampleScope::Wave(wave.id), Some(&key), |s| fold.add(&s))
                    .await?;
                let (canary, control) = fold.finish();
                evaluate_level(
                    &LevelGate {
                        name: gate.name.clone(),
                        direction: match gate.direction {
                            Direction::IncreaseIsBad => orchestrator_detect::Direction::HigherIsWorse,
                            Direction::DecreaseIsBad => orchestrator_detect::Direction::LowerIsWorse,
                        },
                        min_shift: gate.min_effect,
                        min_samples: MIN_LEVEL_UNITS,
                    },
                    &LevelCohorts {
                        canary: &canary,
                        control: &control,
                    },
                    &look,
                )
            }
            Gate::Unsupported { .. } => unreachable_gate(),
        };
        let new = NewHealthLook {
            rollout_id: rollout.id,
            wave_id: wave.id,
            gate: gate.name().to_owned(),
            look_number,
            planned_looks: look.planned,
            outcome: verdict.outcome(),
            verdict: serde_json::to_value(&verdict).unwrap_or_default(),
        };
        match self.db.record_health_look(&new, DETECTOR_ACTOR).await {
            Ok(recorded) => Ok(state_from_look(&recorded)),
            Err(DbError::AlreadyExists { .. }) => {
                let looks = self.db.health_looks(SampleScope::Wave(wave.id)).await?;
                looks
                    .iter()
                    .find(|l| l.look.gate == new.gate && l.look.look_number == look_number)
                    .map(state_from_look)
                    .ok_or(DbError::NotFound {
                        what: "health look",
                        key: format!("wave {} gate {} look {look_number}", wave.id, new.gate),
                    })
            }
            Err(err) => Err(err),
        }
    }

    /// One round: poll if due, evaluate due looks, decide. `None` while
    /// nothing is decided before the bake's end.
    async fn round(&self, rollout: &ExecRollout, wave: &ExecWave, policy: &Policy, last: bool) -> Option<WaveVerdict> {
        if wave.gates.is_empty() {
            return last.then(|| WaveVerdict {
                outcome: Outcome::Pass,
                summary: "the wave has no health gates".into(),
                evidence: json!({ "gates": [] }),
            });
        }
        if policy.detection.enabled {
            return self.fleet_round(rollout, wave, policy, last).await;
        }
        let error = |summary: String| {
            last.then(|| WaveVerdict {
                outcome: Outcome::Error,
                evidence: json!({ "error": summary }),
                summary,
            })
        };
        let Some(bake_start) = wave.bake_started_at else {
            return error(format!("wave {} has no bake start", wave.name));
        };
        let now = self.clock.now();
        let bake = Duration::seconds(wave.bake_seconds.max(0));
        let gates = self.wave_gates(wave, policy);
        let stored = match self.db.health_looks(SampleScope::Wave(wave.id)).await {
            Ok(looks) => looks,
            Err(err) => {
                return error(format!(
                    "cannot read evaluated looks: {}",
                    orchestrator_types::error_chain(&err)
                ));
            }
        };
        let elapsed = (now - bake_start).to_std().unwrap_or_default();
        let bake_std = bake.to_std().unwrap_or_default();
        // A look about to be evaluated gets fresh data, whatever the poll
        // cadence says.
        let look_due = gates.iter().filter_map(Gate::health_gate).any(|g| {
            let planned = planned_looks(bake, g.interval);
            let due = u128::from(planned) * elapsed.as_nanos() / bake_std.as_nanos().max(1);
            let latest = stored
                .iter()
                .filter(|l| l.look.gate == g.name)
                .map(|l| l.look.look_number)
                .max()
                .unwrap_or(0);
            due.min(u128::from(planned)) > u128::from(latest)
        });
        if let Err(err) = self
            .poll_if_due(rollout, wave, &gates, bake_start, now, last || look_due)
            .await
        {
            tracing::warn!(error = %orchestrator_types::error_chain(&err), wave = %wave.name, "health collection failed");
            return error(format!(
                "health collection failed: {}",
                orchestrator_types::error_chain(&err)
            ));
        }
        let mut states = Vec::new();
        for gate in &gates {
            let Some(health_gate) = gate.health_gate() else {
                if let Gate::Unsupported { name, reason } = gate {
                    states.push(GateState {
                        gate: name.clone(),
                        outcome: Outcome::Error,
                        look: None,
                        planned: None,
                        summary: format!("{name}: {reason}"),
                        verdict: json!({ "error": reason }),
                    });
                }
                continue;
            };
            let planned = planned_looks(bake, health_gate.interval);
            let plan = match gate_plan(policy.health.alpha, gates.len(), planned, self.spending) {
                Ok(plan) => plan,
                Err(err) => {
                    states.push(GateState {
                        gate: gate.name().to_owned(),
                        outcome: Outcome::Error,
                        look: None,
                        planned: Some(planned),
                        summary: format!("{}: {err}", gate.name()),
                        verdict: json!({ "error": err.to_string() }),
                    });
                    continue;
                }
            };
            let due = if last {
                Some(planned)
            } else {
                plan.look_at(elapsed, bake_std).map(|l| l.number).filter(|n| *n >= 1)
            };
            let done: Vec<&HealthLook> = stored.iter().filter(|l| l.look.gate == gate.name()).collect();
            // A failed look stands: the wave failed then, whatever came later.
            if let Some(failed) = done.iter().find(|l| l.look.outcome == Outcome::Fail) {
                states.push(state_from_look(failed));
                continue;
            }
            let latest = done.iter().max_by_key(|l| l.look.look_number);
            let state = match (due, latest) {
                (Some(n), Some(prev)) if prev.look.look_number >= n => state_from_look(prev),
                (Some(n), _) => match self.evaluate(rollout, wave, gate, &plan, n).await {
                    Ok(state) => state,
                    Err(err) => {
                        return error(format!(
                            "cannot evaluate a look: {}",
                            orchestrator_types::error_chain(&err)
                        ));
                    }
                },
                (None, Some(prev)) => state_from_look(prev),
                (None, None) => GateState {
                    gate: gate.name().to_owned(),
                    outcome: Outcome::Inconclusive,
                    look: None,
                    planned: Some(planned),
                    summary: format!("{}: first look not due yet", gate.name()),
                    verdict: serde_json::to_value(Verdict::Inconclusive {
                        gate: gate.name().to_owned(),
                        reason: InconclusiveReason::BakeInProgress,
                        evidence: None,
                    })
                    .unwrap_or_default(),
                },
            };
            states.push(state);
        }
        let worst = states.iter().map(|s| s.outcome).max().unwrap_or(Outcome::Inconclusive);
        if !last && worst != Outcome::Fail {
            return None;
        }
        // Only a verdict that will be stored shows the nodes whose health could not be read.
        let poll_errors = match self.poll_errors(wave).await {
            Ok(errors) => errors,
            Err(err) => {
                return error(format!(
                    "cannot read poll errors: {}",
                    orchestrator_types::error_chain(&err)
                ));
            }
        };
        let evidence = DetectorEvidence {
            alpha: policy.health.alpha,
            correction: "bonferroni".into(),
            spending: format!("{:?}", self.spending),
            bake_seconds: wave.bake_seconds,
            bake_started_at: bake_start,
            control_nodes: wave.control_nodes.len(),
            gates: states
                .iter()
                .map(|s| GateLook {
                    gate: s.gate.clone(),
                    outcome: s.outcome,
                    look: s.look,
                    planned_looks: s.planned,
                    summary: s.summary.clone(),
                    verdict: s.verdict.clone(),
                })
                .collect(),
            poll_errors: poll_errors.clone(),
        };
        let evidence = serde_json::to_value(&evidence).unwrap_or_default();
        if worst == Outcome::Fail {
            let summary = states
                .iter()
                .filter(|s| s.outcome == Outcome::Fail)
                .map(|s| s.summary.clone())
                .collect::<Vec<_>>()
                .join("; ");
            return Some(WaveVerdict {
                outcome: Outcome::Fail,
                summary,
                evidence,
            });
        }
        if !last {
            return None;
        }
        // A canary node whose health could not be read at the end has not been judged: no Pass and
        // no Inconclusive hides that (a proven regression above still fails the wave).
        let unread_canary: Vec<&PollError> = poll_errors.iter().filter(|e| e.cohort == Cohort::Canary).collect();
        if !unread_canary.is_empty() {
            let mut parts: Vec<String> = unread_canary.iter().map(|e| e.describe()).collect();
            parts.extend(
                states
                    .iter()
                    .filter(|s| s.outcome >= Outcome::Error)
                    .map(|s| s.summary.clone()),
            );
            return Some(WaveVerdict {
                outcome: Outcome::Error,
                summary: with_control_gaps(parts.join("; "), &poll_errors),
                evidence,
            });
        }
        let (outcome, summary) = match worst {
            Outcome::Pass => (
                Outcome::Pass,
                format!("every gate passed against {} control nodes", wave.control_nodes.len()),
            ),
            Outcome::Inconclusive => (
                Outcome::Inconclusive,
                states
                    .iter()
                    .filter(|s| s.outcome == Outcome::Inconclusive)
                    .map(|s| format!("{} inconclusive", s.gate))
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
            _ => (
                Outcome::Error,
                states
                    .iter()
                    .filter(|s| s.outcome == Outcome::Error)
                    .map(|s| s.summary.clone())
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
        };
        Some(WaveVerdict {
            outcome,
            summary: with_control_gaps(summary, &poll_errors),
            evidence,
        })
    }

    /// The wave's watched nodes whose latest poll failed, as stored on their cursors.
    async fn poll_errors(&self, wave: &ExecWave) -> Result<Vec<PollError>, DbError> {
        let mut out = Vec::new();
        for cursor in self.db.health_cursors(wave.id).await? {
            let Some(error) = cursor.last_error else { continue };
            let name = match self.db.node(cursor.node_id).await {
                Ok(node) => node.name,
                Err(DbError::NotFound { .. }) => cursor.node_id.to_string(),
                Err(err) => return Err(err),
            };
            out.push(PollError {
                node: cursor.node_id,
                name,
                cohort: cursor.cohort,
                error,
            });
        }
        out.sort_by(|a, b| (a.cohort.as_str(), &a.name).cmp(&(b.cohort.as_str(), &b.name)));
        Ok(out)
    }
}

/// `summary` with the control nodes left out for unreadable health named after it.
fn with_control_gaps(summary: String, poll_errors: &[PollError]) -> String {
    let gaps: Vec<String> = poll_errors
        .iter()
        .filter(|e| e.cohort == Cohort::Control)
        .map(|e| e.describe())
        .collect();
    if gaps.is_empty() {
        summary
    } else {
        format!("{summary}; left out of the control: {}", gaps.join("; "))
    }
}

/// Unsupported gates are answered before evaluation; reaching this is a
/// logic error that must not panic a controller, so it reads as an error.
/// The verdict of a Prometheus rate gate from the seam's cohorts.
fn prom_rate_verdict(
    prom_rate: Option<&(&HealthGate, RateCohorts)>,
    look: &orchestrator_detect::Look,
) -> orchestrator_detect::Verdict {
    let Some((g, cohorts)) = prom_rate else {
        return unreachable_gate();
    };
    evaluate_rate(
        &RateGate {
            name: g.name.clone(),
            min_effect_ratio: g.min_effect,
            min_canary_events_for_fail: MIN_CANARY_EVENTS_FOR_FAIL,
            min_exposure: MIN_EXPOSURE,
        },
        cohorts,
        look,
    )
}

fn unreachable_gate() -> orchestrator_detect::Verdict {
    orchestrator_detect::Verdict::Error {
        gate: String::new(),
        error: orchestrator_detect::DetectError::NoGates,
    }
}

#[async_trait]
impl HealthJudge for DetectorJudge {
    async fn check(&self, rollout: &ExecRollout, wave: &ExecWave, policy: &Policy) -> Option<WaveVerdict> {
        self.round(rollout, wave, policy, false).await
    }

    async fn watch_before_flash(&self, rollout: &ExecRollout, wave: &ExecWave, policy: &Policy) {
        self.pre_flash_round(rollout, wave, policy).await;
    }

    async fn judge(&self, rollout: &ExecRollout, wave: &ExecWave, policy: &Policy) -> WaveVerdict {
        self.round(rollout, wave, policy, true)
            .await
            .unwrap_or_else(|| WaveVerdict {
                outcome: Outcome::Error,
                summary: "the detector reached no verdict".into(),
                evidence: json!({}),
            })
    }
}

/// The Prometheus level gates' queries by sample key: what one poll asks Prometheus, for the
/// per-wave judge and the fleet judge alike.
fn prometheus_level_queries(gates: &[Gate]) -> Vec<(String, String)> {
    gates
        .iter()
        .filter_map(|g| match g {
            Gate::PromLevel { query, gate } if gate.kind == GateKind::Level => Some((g.sample_key(), query.clone())),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn sample(cohort: Cohort, node: i64, metric: &str, events: u64, exposure: f64) -> HealthSample {
        HealthSample {
            rollout_id: orchestrator_types::RolloutId(1),
            wave_id: WaveId(1),
            node_id: NodeId(node),
            cohort,
            metric: metric.into(),
            window_start: Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap(),
            events,
            exposure,
            readings: 0,
            sum: 0.0,
            min: None,
            max: None,
            units: BTreeMap::new(),
        }
    }

    #[test]
    fn looks_follow_the_interval_within_limits() {
        assert_eq!(planned_looks(Duration::hours(6), Duration::minutes(30)), 12);
        assert_eq!(planned_looks(Duration::minutes(10), Duration::minutes(30)), 1);
        assert_eq!(planned_looks(Duration::days(7), Duration::minutes(5)), MAX_LOOKS);
    }

    fn rate_cohorts(samples: &[HealthSample], metric: RedfishMetric) -> RateCohorts {
        let mut cohorts = no_rate_samples();
        for s in samples.iter().filter(|s| s.metric == metric.as_str()) {
            add_rate_sample(&mut cohorts, s);
        }
        cohorts
    }

    /// One value per unit (GPU) and cohort: the unit's mean over the bake so far.
    fn level_cohorts(samples: &[HealthSample], metric: &str) -> (Vec<f64>, Vec<f64>) {
        let mut fold = LevelFold::default();
        for s in samples.iter().filter(|s| s.metric == metric) {
            fold.add(s);
        }
        fold.finish()
    }

    #[test]
    fn rate_cohorts_add_up_by_side_and_metric() {
        let samples = [
            sample(Cohort::Canary, 1, "xid_errors_per_gpu_hour", 3, 8.0),
            sample(Cohort::Canary, 2, "xid_errors_per_gpu_hour", 1, 8.0),
            sample(Cohort::Control, 3, "xid_errors_per_gpu_hour", 2, 16.0),
            sample(Cohort::Control, 3, "pcie_aer_per_node_hour", 9, 1.0),
        ];
        let c = rate_cohorts(&samples, RedfishMetric::XidErrorsPerGpuHour);
        assert_eq!((c.canary.events, c.canary.exposure), (4, 16.0));
        assert_eq!((c.control.events, c.control.exposure), (2, 16.0));
    }

    #[test]
    fn level_cohorts_give_one_mean_per_gpu_across_windows() {
        let mut a = sample(Cohort::Canary, 1, "gpu_temp_c", 0, 0.0);
        a.units.insert("GPU_0".into(), LevelAgg::of(60.0));
        a.units.insert("GPU_1".into(), LevelAgg::of(70.0));
        let mut b = a.clone();
        b.window_start += Duration::hours(1);
        b.units.insert("GPU_0".into(), LevelAgg::of(64.0));
        let mut c = sample(Cohort::Control, 2, "gpu_temp_c", 0, 0.0);
        c.units.insert("GPU_0".into(), LevelAgg::of(50.0));
        let (canary, control) = level_cohorts(&[a, b, c], "gpu_temp_c");
        assert_eq!(canary, vec![62.0, 70.0]);
        assert_eq!(control, vec![50.0]);
    }
}
