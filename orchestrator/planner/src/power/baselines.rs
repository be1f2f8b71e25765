//! Baselines given by the user (`--baseline`, `--sd`), checked against the
//! policy's gates so a typo is an error rather than a silently unused value.

use std::collections::BTreeMap;

use orchestrator_policy::{GateKind, GateSource, HealthGate, Policy};

/// A `--baseline`/`--sd` value that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BaselineError {
    /// Not `KEY=VALUE`.
    #[error("{flag} {text:?}: expected GATE_OR_METRIC=NUMBER")]
    Syntax {
        /// The option (`--baseline` or `--sd`).
        flag: &'static str,
        /// What was given.
        text: String,
    },
    /// The value is not a positive finite number.
    #[error("{flag} {text:?}: {value:?} is not a positive number")]
    NotPositive {
        /// The option.
        flag: &'static str,
        /// What was given.
        text: String,
        /// The value part.
        value: String,
    },
    /// No gate of the policy has this name or metric.
    #[error(
        "{flag} {text:?}: policy {policy:?} has no gate or metric {key:?}; {flag} takes: {}",
        if known.is_empty() { "none".to_owned() } else { known.join(", ") }
    )]
    Unknown {
        /// The option.
        flag: &'static str,
        /// What was given.
        text: String,
        /// Policy name.
        policy: String,
        /// The key part.
        key: String,
        /// Gate and metric names the option takes.
        known: Vec<String>,
    },
    /// The gate is of the other kind.
    #[error("{flag} {text:?}: gate {gate:?} is a {kind} gate; use {other}")]
    WrongKind {
        /// The option.
        flag: &'static str,
        /// What was given.
        text: String,
        /// The gate named.
        gate: String,
        /// Its kind.
        kind: &'static str,
        /// The option for that kind.
        other: &'static str,
    },
}

/// The option that gives baselines of gates of `kind`: rate gates take event rates
/// (`--baseline`), level gates standard deviations (`--sd`).
fn baseline_flag(kind: GateKind) -> &'static str {
    match kind {
        GateKind::Rate => "--baseline",
        GateKind::Level => "--sd",
    }
}

/// Parses repeated `KEY=VALUE` baselines for gates of `kind`: each key a gate of
/// the policy (or the metric of one) of that kind, each value a positive number.
pub fn parse_baselines(
    policy: &Policy,
    kind: GateKind,
    values: &[String],
) -> Result<BTreeMap<String, f64>, BaselineError> {
    let flag = baseline_flag(kind);
    let mut out = BTreeMap::new();
    for text in values {
        let (key, value) = text.split_once('=').ok_or_else(|| BaselineError::Syntax {
            flag,
            text: text.clone(),
        })?;
        let (key, value) = (key.trim(), value.trim());
        let number: f64 = value
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite() && *v > 0.0)
            .ok_or_else(|| BaselineError::NotPositive {
                flag,
                text: text.clone(),
                value: value.to_owned(),
            })?;
        let gates: Vec<&HealthGate> = policy
            .health
            .gates
            .iter()
            .filter(|g| g.name == key || matches!(&g.source, GateSource::Redfish { metric } if metric.as_str() == key))
            .collect();
        if gates.is_empty() {
            let known: Vec<String> = policy
                .health
                .gates
                .iter()
                .filter(|g| g.kind == kind)
                .flat_map(|g| match &g.source {
                    GateSource::Redfish { metric } => vec![g.name.clone(), metric.as_str().to_owned()],
                    GateSource::Prometheus { .. } => vec![g.name.clone()],
                })
                .collect();
            return Err(BaselineError::Unknown {
                flag,
                text: text.clone(),
                policy: policy.name.clone(),
                key: key.to_owned(),
                known,
            });
        }
        if let Some(g) = gates.iter().find(|g| g.kind != kind) {
            return Err(BaselineError::WrongKind {
                flag,
                text: text.clone(),
                gate: g.name.clone(),
                kind: g.kind.as_str(),
                other: baseline_flag(g.kind),
            });
        }
        out.insert(key.to_owned(), number);
    }
    Ok(out)
}
