//! A policy in words: its waves, gates, failure budget, rollback and the
//! effects its gates are built to detect, read from the parsed policy so the
//! summary can never disagree with the YAML shown (collapsed) below it.

use minijinja::{Value, context};
use orchestrator_policy::{
    AlertAction, Approval, Direction, FailureBudget, GateKind, GateSource, HealthGate, Policy, RedfishMetric,
    RollbackScope, WaveSize, format_duration,
};

/// The unit a gate's values are in, for people.
pub(crate) fn unit(gate: &HealthGate) -> &'static str {
    match &gate.source {
        GateSource::Redfish { metric } => match metric {
            RedfishMetric::XidErrorsPerGpuHour => "XID errors per GPU-hour",
            RedfishMetric::PcieAerPerNodeHour => "PCIe AER errors per node-hour",
            RedfishMetric::LinkDegradedPerNodeDay => "link degradations per node-day",
            RedfishMetric::GpuTempC => "°C",
            RedfishMetric::GpuPowerW => "W",
            RedfishMetric::FlashFailures => "failed flashes per flash",
        },
        GateSource::Prometheus { .. } => "the query's unit",
    }
}

/// An effect size of `gate` in words: a rate gate's effects are ratios of
/// the canary's rate to the control's, a level gate's are differences.
pub(crate) fn effect(gate: &HealthGate, value: f64) -> String {
    let worse = match gate.direction {
        Direction::IncreaseIsBad => "higher",
        Direction::DecreaseIsBad => "lower",
    };
    match gate.kind {
        GateKind::Rate => match gate.direction {
            Direction::IncreaseIsBad => format!("{value}× the control's rate"),
            Direction::DecreaseIsBad => format!("1/{value} of the control's rate"),
        },
        GateKind::Level => format!("{value} {} {worse} than the control", unit(gate)),
    }
}

/// The failure budget in words.
pub(crate) fn budget(budget: FailureBudget) -> String {
    match budget {
        FailureBudget::Count(0) => "the first failed update halts the wave and the rollout".to_owned(),
        FailureBudget::Count(n) => format!("up to {n} failed updates per wave; one more halts the rollout"),
        FailureBudget::Percent(p) => format!("up to {p}% of a wave's nodes may fail; more halts the rollout"),
    }
}

fn wave_size(size: WaveSize) -> String {
    match size {
        WaveSize::Count(n) => format!("{n} node{}", if n == 1 { "" } else { "s" }),
        WaveSize::Percent(p) => format!("{p}% of eligible nodes"),
        WaveSize::Rest => "every remaining node".into(),
    }
}

/// The template value of a policy's summary.
pub(crate) fn summarise(policy: &Policy) -> Value {
    let waves: Vec<Value> = policy
        .waves
        .iter()
        .enumerate()
        .map(|(i, wave)| {
            let approval = match wave.approval {
                Approval::Auto => "starts when the previous wave passed its bake".to_owned(),
                Approval::Manual { approvers } => format!(
                    "starts after {approvers} approval{} of the previous wave (never by the rollout's author)",
                    if approvers == 1 { "" } else { "s" }
                ),
            };
            context! {
                position => i + 1, name => wave.name.clone(), size => wave_size(wave.size),
                bake => format_duration(wave.bake), approval, max_in_flight => wave.max_in_flight,
                gates => wave.gates.clone(),
                stratify_by => wave.stratify_by.clone(),
                unguarded => wave.gates.is_empty(),
            }
        })
        .collect();
    let gates: Vec<Value> = policy
        .health
        .gates
        .iter()
        .map(|gate| {
            let source = match &gate.source {
                GateSource::Redfish { metric } => format!("Redfish {metric}"),
                GateSource::Prometheus { query } => format!("Prometheus: {query}"),
            };
            let used_by: Vec<String> = policy
                .waves
                .iter()
                .filter(|w| w.gates.contains(&gate.name))
                .map(|w| w.name.clone())
                .collect();
            context! {
                name => gate.name.clone(), source, kind => gate.kind.as_str(), unit => unit(gate),
                ignored => effect(gate, gate.min_effect),
                must_detect => effect(gate, gate.must_detect),
                interval => format_duration(gate.interval), used_by,
            }
        })
        .collect();
    let budget = budget(policy.failure_budget);
    let scope = match policy.rollback.scope {
        RollbackScope::Wave => "the failing wave's nodes",
        RollbackScope::Rollout => "every node the rollout updated",
    };
    let rollback = if policy.rollback.automatic {
        format!("automatic on a failed gate: {scope} go back to their previous version")
    } else {
        format!("a failed gate halts the rollout; a person decides whether to roll back ({scope})")
    };
    let alerts: Vec<String> = policy
        .health
        .alerts
        .iter()
        .map(|rule| {
            let matchers: Vec<String> = rule
                .matchers
                .iter()
                .map(|m| format!("{}{}{:?}", m.name, op(m.op), m.value))
                .collect();
            let action = match rule.action {
                AlertAction::Pause => "pauses the rollout",
                AlertAction::Rollback => "rolls back",
            };
            format!("an alert matching {{{}}} {action}", matchers.join(", "))
        })
        .collect();
    let concurrency = &policy.concurrency;
    let mut limits = vec![format!("{} flashes at once", concurrency.max_in_flight)];
    if let Some(n) = concurrency.per_rack {
        limits.push(format!("{n} per rack"));
    }
    if let Some(n) = concurrency.per_domain {
        limits.push(format!("{n} per scale-up domain (NVLink domain, UltraServer)"));
    }
    if let Some(p) = concurrency.per_cluster_percent {
        limits.push(format!("{p}% of a cluster"));
    }
    context! {
        component => policy.target.component.as_str(), platforms => policy.target.platforms.clone(),
        description => policy.description.clone(),
        required_gates => policy.qualification.required_gates.clone(),
        unqualified_canary => policy.qualification.allow_unqualified_canary,
        waves, gates, budget, rollback, alerts, limits => limits.join(", "),
        alpha => policy.health.alpha,
        windows => policy.maintenance_windows.len(),
    }
}

fn op(op: orchestrator_policy::MatchOp) -> &'static str {
    use orchestrator_policy::MatchOp;
    match op {
        MatchOp::Equal => "=",
        MatchOp::NotEqual => "!=",
        MatchOp::Regex => "=~",
        MatchOp::NotRegex => "!~",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: &str = include_str!("../../../policies/bmc-firmware-lab.yaml");

    #[test]
    fn the_lab_policy_in_words() {
        let policy = orchestrator_policy::parse_policy(POLICY).unwrap();
        let summary = summarise(&policy);
        let waves = summary.get_attr("waves").unwrap();
        assert_eq!(waves.len(), Some(3));
        let rest = waves.get_item(&Value::from(2)).unwrap();
        assert_eq!(rest.get_attr("size").unwrap().to_string(), "every remaining node");
        assert!(rest.get_attr("approval").unwrap().to_string().contains("1 approval"));
        assert!(rest.get_attr("unguarded").unwrap().is_true());
        let gate = summary.get_attr("gates").unwrap().get_item(&Value::from(0)).unwrap();
        assert_eq!(
            gate.get_attr("must_detect").unwrap().to_string(),
            "40 W higher than the control"
        );
        assert_eq!(
            summary.get_attr("budget").unwrap().to_string(),
            "the first failed update halts the wave and the rollout"
        );
        assert!(
            summary
                .get_attr("rollback")
                .unwrap()
                .to_string()
                .contains("a person decides")
        );
    }
}
