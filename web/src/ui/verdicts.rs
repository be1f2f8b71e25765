//! Verdict tables: one table per gate of a wave, in the detection method's
//! own terms (estimate, interval, the bound that decides, the thresholds,
//! what has been ruled out, how much of the planned information is in),
//! with events and exposure in their units and the nodes whose health could
//! not be read. Built from the looks the judge already recorded (each look
//! is evaluated once and stored), so a baking wave shows its latest look
//! and a decided wave shows the look that decided it; nothing is
//! recomputed here.

use std::collections::BTreeMap;

use minijinja::{Value, context};
use orchestrator_db::health::{Cohort, HealthLook};
use orchestrator_detect::{CohortSummary, EffectMeasure, Evidence, InconclusiveReason, TestKind, Verdict};
use orchestrator_policy::{GateKind, GateSource, HealthGate, Policy};
use orchestrator_types::{FleetGateLook, Outcome, WaveVerdict};

use super::charts::ChartMarks;
use super::policy_summary;

/// A watched node whose latest health poll failed, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeInError {
    pub name: String,
    pub cohort: Cohort,
    pub error: String,
}

/// Nodes in error as recorded in a stored verdict's evidence (the judge
/// names them there); empty for verdicts without that evidence.
pub(crate) fn verdict_poll_errors(verdict: &WaveVerdict) -> Vec<NodeInError> {
    serde_json::from_value::<orchestrator_engine::watch::DetectorEvidence>(verdict.evidence.clone())
        .map(|evidence| {
            evidence
                .poll_errors
                .into_iter()
                .map(|e| NodeInError {
                    name: e.name,
                    cohort: e.cohort,
                    error: e.error,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// How exposure of a rate gate is counted, for people: `GPU-hours`.
fn exposure_unit(gate: &HealthGate) -> &'static str {
    match &gate.source {
        GateSource::Redfish { metric } => match orchestrator_planner::power::rate_exposure_unit(*metric).1 {
            "gpu-hour" => "GPU-hours",
            "node-day" => "node-days",
            _ => "node-hours",
        },
        // One series per GPU from dcgm-exporter: series-hours are GPU-hours.
        GateSource::Prometheus { .. } => "GPU-hours (series-hours)",
    }
}

/// A number with at most `digits` decimals and no trailing zeros.
fn num(value: f64, digits: usize) -> String {
    let text = format!("{value:.digits$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

/// An effect value in the gate's terms: `2.1×` for a rate ratio, `+3.4 °C`
/// for a level shift (positive is worse).
fn effect(measure: EffectMeasure, value: f64, unit: &str) -> String {
    match measure {
        EffectMeasure::RateRatio => format!("{}×", num(value, 2)),
        EffectMeasure::Shift => format!("{}{} {unit}", if value >= 0.0 { "+" } else { "" }, num(value, 2))
            .trim_end()
            .to_owned(),
    }
}

fn cohort_line(summary: &CohortSummary, gate: Option<&HealthGate>, unit: &str) -> String {
    match (summary.events, summary.exposure, summary.samples) {
        (Some(events), Some(exposure), _) => {
            let unit = gate.map_or("units of exposure", exposure_unit);
            let rate = summary
                .rate
                .map(|r| format!(" ({} per {})", num(r, 4), unit.trim_end_matches('s')))
                .unwrap_or_default();
            format!("{events} events over {} {unit}{rate}", num(exposure, 1))
        }
        (_, _, Some(samples)) => {
            let median = summary
                .median
                .map(|m| format!(", median {} {unit}", num(m, 2)))
                .unwrap_or_default();
            format!("{samples} GPUs (each its mean over the bake so far){median}")
        }
        _ => "no data yet".into(),
    }
}

fn method(test: TestKind) -> &'static str {
    match test {
        TestKind::ConditionalBinomial => {
            "exact conditional test of two Poisson rates (canary rate / control rate), sequential looks"
        }
        TestKind::MannWhitney { .. } => {
            "Mann-Whitney U of canary minus min_effect against control, Hodges-Lehmann shift, sequential looks"
        }
    }
}

fn inconclusive(reason: InconclusiveReason) -> &'static str {
    match reason {
        InconclusiveReason::BakeInProgress => "no boundary crossed; the bake goes on",
        InconclusiveReason::NoData => "a cohort has no data yet",
        InconclusiveReason::InsufficientData => "the bake is over but a cohort has too little data to pass",
    }
}

/// The rows of one gate's table from its evidence.
fn evidence_rows(evidence: &Evidence, gate: Option<&HealthGate>, rows: &mut Vec<(String, String)>) {
    let unit = gate.map_or("", policy_summary::unit);
    let e = &evidence.effect;
    let show = |v: Option<f64>| v.map_or_else(|| "unbounded".to_owned(), |v| effect(e.measure, v, unit));
    rows.push(("Method".into(), method(evidence.test).into()));
    rows.push((
        "Estimate".into(),
        e.estimate.map_or_else(
            || "undefined (the control has no events yet)".to_owned(),
            |v| match e.measure {
                EffectMeasure::RateRatio => format!("{} the control's rate", effect(e.measure, v, unit)),
                EffectMeasure::Shift => format!("{} against the control", effect(e.measure, v, unit)),
            },
        ),
    ));
    rows.push((
        "95% interval".into(),
        format!("{} to {}", show(e.ci95_lower), show(e.ci95_upper)),
    ));
    rows.push((
        "Decision bound".into(),
        format!(
            "{} (one-sided lower bound at this look's level; the gate fails when it is above {})",
            show(e.decision_lower_bound),
            effect(e.measure, e.min_effect, unit)
        ),
    ));
    rows.push((
        "Ruled out".into(),
        match e.ci95_upper {
            Some(upper) => format!("ruled out: ≥{}", effect(e.measure, upper, unit)),
            None => "nothing ruled out yet".into(),
        },
    ));
    let look = &evidence.look;
    rows.push((
        "Information gathered".into(),
        format!(
            "{}% of the planned information (look {} of {}{})",
            num(look.information_fraction * 100.0, 0),
            look.number,
            look.planned,
            if look.is_final { ", the final look" } else { "" }
        ),
    ));
    rows.push((
        "p-value".into(),
        format!(
            "{} (fails at ≤ {} at this look)",
            num(evidence.p_value, 4),
            num(look.nominal_alpha, 6)
        ),
    ));
    rows.push(("Canary".into(), cohort_line(&evidence.canary, gate, unit)));
    rows.push(("Control".into(), cohort_line(&evidence.control, gate, unit)));
}

/// The rows of a gate judged by the fleet-scale method (anytime-valid
/// bounds over the whole fleet), in that method's terms.
fn fleet_rows(look: &FleetGateLook, gate: Option<&HealthGate>, at: &str, rows: &mut Vec<(String, String)>) {
    let unit = gate.map_or("", policy_summary::unit);
    let measure = if look.kind == "rate" {
        EffectMeasure::RateRatio
    } else {
        EffectMeasure::Shift
    };
    let show = |v: Option<f64>| v.map_or_else(|| "unbounded".to_owned(), |v| effect(measure, v, unit));
    let said = match look.outcome {
        Outcome::Pass => "pass: the upper bound is below must_detect".to_owned(),
        Outcome::Fail => "fail: the lower bound is above min_effect".to_owned(),
        Outcome::Error => format!("error: {}", look.error.as_deref().unwrap_or("not evaluated")),
        other => format!("{other}: neither bound decides yet"),
    };
    rows.push(("Verdict".into(), format!("{said} {at}")));
    rows.push((
        "Method".into(),
        "fleet-scale anytime-valid comparison (stratified, pooled across waves)".into(),
    ));
    rows.push(("Estimate".into(), show(look.estimate)));
    rows.push((
        "Anytime-valid bounds".into(),
        format!("{} to {}", show(look.lower), show(look.upper)),
    ));
    rows.push(("Ruled out".into(), format!("ruled out: {}", look.ruled_out)));
    rows.push((
        "Information gathered".into(),
        format!(
            "{}% of the longest bake (look {} of at most {})",
            num(look.information_fraction * 100.0, 0),
            look.look,
            look.max_looks
        ),
    ));
    let unit_text = look.exposure_unit.replace('_', "-").replace("gpu", "GPU");
    let cohort = |c: &orchestrator_types::FleetCohort| match (c.events, c.exposure) {
        (Some(events), Some(exposure)) => {
            format!(
                "{} nodes: {events} events over {} {unit_text}",
                c.nodes,
                num(exposure, 1)
            )
        }
        _ => format!("{} nodes", c.nodes),
    };
    rows.push(("Updated".into(), cohort(&look.updated)));
    rows.push(("Control".into(), cohort(&look.control)));
}

/// One gate's table: its latest look (or why there is none yet).
fn gate_table(
    wave_id: i64,
    gate_name: &str,
    latest: Option<&HealthLook>,
    policy: Option<&Policy>,
    errors: &[NodeInError],
) -> Value {
    let gate = policy.and_then(|p| p.health.gate(gate_name));
    let mut rows: Vec<(String, String)> = Vec::new();
    let mut outcome = Outcome::Inconclusive;
    let mut failed_at = None;
    match latest {
        None => rows.push(("Verdict".into(), "first look not due yet".into())),
        Some(look) => {
            outcome = look.look.outcome;
            let at = format!(
                "at look {} of {} ({})",
                look.look.look_number,
                look.look.planned_looks,
                look.evaluated_at.format("%Y-%m-%d %H:%M UTC")
            );
            match serde_json::from_value::<Verdict>(look.look.verdict.clone()) {
                Ok(verdict) => {
                    let said = match &verdict {
                        Verdict::Pass { .. } => "pass: no regression beyond min_effect".to_owned(),
                        Verdict::Fail { .. } => {
                            failed_at = Some(look.evaluated_at);
                            "fail: a regression beyond min_effect is proven".to_owned()
                        }
                        Verdict::Inconclusive { reason, .. } => format!("inconclusive: {}", inconclusive(*reason)),
                        Verdict::Error { error, .. } => format!("error: {error}"),
                    };
                    rows.push(("Verdict".into(), format!("{said} {at}")));
                    if let Some(evidence) = verdict.evidence() {
                        evidence_rows(evidence, gate, &mut rows);
                    }
                }
                Err(_) => match serde_json::from_value::<FleetGateLook>(look.look.verdict.clone()) {
                    Ok(fleet) => {
                        if fleet.outcome == Outcome::Fail {
                            failed_at = Some(look.evaluated_at);
                        }
                        fleet_rows(&fleet, gate, &at, &mut rows);
                    }
                    Err(_) => {
                        let why = look
                            .look
                            .verdict
                            .get("error")
                            .and_then(serde_json::Value::as_str)
                            .unwrap_or("no evidence recorded");
                        rows.push(("Verdict".into(), format!("{}: {why} {at}", look.look.outcome)));
                    }
                },
            }
        }
    }
    if let Some(gate) = gate {
        let kind = match gate.kind {
            GateKind::Rate => "rate",
            GateKind::Level => "level",
        };
        rows.push((
            "Thresholds".into(),
            format!(
                "min_effect {} (smaller is ignored); must_detect {} ({kind} gate)",
                policy_summary::effect(gate, gate.min_effect),
                policy_summary::effect(gate, gate.must_detect)
            ),
        ));
    }
    let nodes: Vec<Value> = errors
        .iter()
        .map(|e| {
            context! {
                name => e.name.clone(), cohort => e.cohort.as_str(), error => e.error.clone(),
                link => format!("/nodes/{}", crate::url::urlencode(&e.name)),
            }
        })
        .collect();
    let rows: Vec<Value> = rows
        .into_iter()
        .map(|(k, v)| context! { key => k, value => v })
        .collect();
    context! {
        id => format!("verdict-{wave_id}-{gate_name}"), gate => gate_name, outcome => outcome.as_str(),
        rows, nodes, failed_at => failed_at.map(|t| t.to_rfc3339()),
    }
}

/// A recorded look's numbers in one phrase, for the audit log's sentence:
/// `estimate 1.25×, ruled out ≥2.2×, 50% of the planned information`.
/// `None` when the look holds no evidence (an error, no data yet).
pub(crate) fn look_phrase(verdict: &serde_json::Value) -> Option<String> {
    let verdict: Verdict = serde_json::from_value(verdict.clone()).ok()?;
    let evidence = verdict.evidence()?;
    let e = &evidence.effect;
    let mut parts = Vec::new();
    if let Some(v) = e.estimate {
        parts.push(format!("estimate {}", effect(e.measure, v, "")));
    }
    parts.push(match e.ci95_upper {
        Some(upper) => format!("ruled out ≥{}", effect(e.measure, upper, "")),
        None => "nothing ruled out yet".into(),
    });
    parts.push(format!(
        "{}% of the planned information",
        num(evidence.look.information_fraction * 100.0, 0)
    ));
    Some(parts.join(", "))
}

/// The latest recorded look of each gate, by (wave, gate).
pub(crate) fn latest_looks(looks: &[HealthLook]) -> BTreeMap<(i64, &str), &HealthLook> {
    let mut out: BTreeMap<(i64, &str), &HealthLook> = BTreeMap::new();
    for look in looks {
        let key = (look.look.wave_id.0, look.look.gate.as_str());
        match out.get(&key) {
            Some(have) if have.look.look_number >= look.look.look_number => {}
            _ => {
                out.insert(key, look);
            }
        }
    }
    out
}

/// One table per gate of a wave.
pub(crate) fn wave_tables(
    wave_id: i64,
    gates: &[String],
    latest: &BTreeMap<(i64, &str), &HealthLook>,
    policy: Option<&Policy>,
    errors: &[NodeInError],
) -> Vec<Value> {
    gates
        .iter()
        .map(|gate| {
            gate_table(
                wave_id,
                gate,
                latest.get(&(wave_id, gate.as_str())).copied(),
                policy,
                errors,
            )
        })
        .collect()
}

/// The marks of each sample metric a wave's gates watch, keyed by the
/// metric name the samples carry.
pub(crate) fn chart_marks(
    wave_id: i64,
    gates: &[String],
    looks: &[HealthLook],
    policy: Option<&Policy>,
) -> BTreeMap<String, ChartMarks> {
    let mut out = BTreeMap::new();
    let Some(policy) = policy else { return out };
    for name in gates {
        let Some(gate) = policy.health.gate(name) else { continue };
        let metric = match &gate.source {
            GateSource::Redfish { metric } => metric.as_str().to_owned(),
            GateSource::Prometheus { .. } => gate.name.clone(),
        };
        let mine = looks
            .iter()
            .filter(|l| l.look.wave_id.0 == wave_id && l.look.gate == *name);
        let mut marks = ChartMarks {
            gate: gate.name.clone(),
            min_effect: gate.min_effect,
            rate: gate.kind == GateKind::Rate,
            lower_is_worse: gate.direction == orchestrator_policy::Direction::DecreaseIsBad,
            ..Default::default()
        };
        for look in mine {
            marks.looks.push(look.evaluated_at);
            if look.look.outcome == Outcome::Fail && marks.failed_at.is_none() {
                marks.failed_at = Some(look.evaluated_at);
            }
        }
        out.insert(metric, marks);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fleet_scale_look_reads_in_its_own_terms() {
        let fleet = FleetGateLook {
            gate: "xid".into(),
            kind: "rate".into(),
            look: 3,
            max_looks: 12,
            outcome: Outcome::Fail,
            estimate: Some(3.1),
            lower: Some(1.8),
            upper: None,
            null: 1.5,
            must_detect: 3.0,
            alpha: 0.01,
            beta: 0.05,
            ruled_out: "≤1.8×".into(),
            information_fraction: 0.25,
            expected_baseline_events: Some(12.0),
            updated: orchestrator_types::FleetCohort {
                nodes: 16,
                events: Some(40),
                exposure: Some(384.0),
            },
            control: orchestrator_types::FleetCohort {
                nodes: 16,
                events: Some(12),
                exposure: Some(384.0),
            },
            exposure_unit: "gpu_hours".into(),
            dispersion: Some(1.0),
            failed_from_hour: None,
            node_look: None,
            error: None,
        };
        let mut rows = Vec::new();
        fleet_rows(&fleet, None, "at look 3 of 12", &mut rows);
        let text: Vec<String> = rows.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        for want in [
            "Verdict: fail: the lower bound is above min_effect at look 3 of 12",
            "Estimate: 3.1×",
            "Anytime-valid bounds: 1.8× to unbounded",
            "Ruled out: ruled out: ≤1.8×",
            "Information gathered: 25% of the longest bake (look 3 of at most 12)",
            "Updated: 16 nodes: 40 events over 384 GPU-hours",
        ] {
            assert!(text.iter().any(|t| t == want), "{want:?} in {text:?}");
        }
    }

    #[test]
    fn numbers_read_short() {
        assert_eq!(num(2.0, 2), "2");
        assert_eq!(num(1.256, 2), "1.26");
        assert_eq!(effect(EffectMeasure::RateRatio, 2.0, ""), "2×");
        assert_eq!(effect(EffectMeasure::Shift, 3.25, "°C"), "+3.25 °C");
        assert_eq!(effect(EffectMeasure::Shift, -1.0, "W"), "-1 W");
    }
}
