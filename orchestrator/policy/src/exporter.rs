//! What the telemetry exporters' series mean, so a Prometheus gate reads
//! each one by its real semantics: a counter's events come from its
//! increase (with resets), the DCGM windowed XID count from its rises, and
//! a gauge (a temperature, the code of the last XID) never feeds a rate.
//!
//! The table is built in because most fleets cannot reach Prometheus from
//! where `policy lint` runs; `policy lint --prometheus URL` checks the same
//! names against the server's metadata API as well
//! ([`check_metadata`]).
//!
//! Where each name and type was confirmed (public sources, read 2026-12):
//! - `dcgm-exporter/etc/default-counters.csv` and `etc/dcp-metrics-included.csv`
//!   (NVIDIA/dcgm-exporter): every `DCGM_FI_*` field below, its type and
//!   whether the line is commented out (off) by default.
//! - `DCGM_EXP_XID_ERRORS_COUNT`: `internal/pkg/collector/xid_collector.go`
//!   and `expcollector.go` (counts of `DCGM_FI_DEV_XID_ERRORS` values seen
//!   since `now - window`, one series per `xid` label, a `window_size_in_ms`
//!   label from `const.go`, a zero series without `xid` when none); the
//!   exporter's own tests declare it a `gauge`, one CSV a `counter`: it falls
//!   as the window slides, so it is neither.
//! - Labels `gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`, `Hostname`:
//!   the exposition template of the GPU collector (`gpuMetricsFormat`).
//! - Neuron: `neuron-monitor-prometheus.py` (aws-neuron-sdk) exports
//!   `hardware_ecc_events_total` and `execution_errors_total` as
//!   prometheus_client `Counter`s (their `_created` series appear in
//!   DataDog's `aws_neuron` metric map) and `neuroncore_utilization_ratio`
//!   as a `Gauge`.

use std::collections::BTreeMap;
use std::fmt;

/// How a series behaves over time, which decides how events are read
/// from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeriesSemantics {
    /// Monotonic until the driver, exporter or node restarts; events are
    /// its increase, a drop is a reset.
    Counter,
    /// The number of events within the exporter's last window (DCGM's
    /// `--xid-count-window-size`); it falls as the window slides, so
    /// `increase()` over it miscounts. Events are read from its rises.
    WindowedCount,
    /// A level (temperature, power, utilization).
    Gauge,
    /// A last value or 0/1 state (the code of the last XID, row-remap
    /// failure): neither a count nor a level to average.
    State,
}

impl SeriesSemantics {
    /// Whether a `kind: rate` gate may count events from it.
    pub fn feeds_rate(self) -> bool {
        matches!(self, SeriesSemantics::Counter | SeriesSemantics::WindowedCount)
    }

    /// A word for messages.
    pub fn as_str(self) -> &'static str {
        match self {
            SeriesSemantics::Counter => "counter",
            SeriesSemantics::WindowedCount => "windowed count",
            SeriesSemantics::Gauge => "gauge",
            SeriesSemantics::State => "last-value state",
        }
    }
}

/// Which exporter publishes a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Exporter {
    /// NVIDIA dcgm-exporter.
    Dcgm,
    /// AWS neuron-monitor's Prometheus exporter.
    NeuronMonitor,
}

impl fmt::Display for Exporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Exporter::Dcgm => "dcgm-exporter",
            Exporter::NeuronMonitor => "neuron-monitor",
        })
    }
}

/// One exporter metric Waveguard knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExporterMetric {
    /// The Prometheus metric name.
    pub name: &'static str,
    /// Who publishes it.
    pub exporter: Exporter,
    /// How it behaves (what Waveguard reads it as).
    pub semantics: SeriesSemantics,
    /// The `# TYPE` the exporter declares (`counter`, `gauge`).
    pub declared_type: &'static str,
    /// Whether the exporter publishes it without configuration (for
    /// dcgm-exporter: the line is not commented out of
    /// `default-counters.csv`).
    pub on_by_default: bool,
    /// What to add to the exporter's configuration to enable it (the CSV
    /// line for dcgm-exporter).
    pub enable_with: &'static str,
}

/// The known metrics. Names are unique.
pub const EXPORTER_METRICS: &[ExporterMetric] = &[
    ExporterMetric {
        name: "DCGM_FI_DEV_XID_ERRORS",
        exporter: Exporter::Dcgm,
        semantics: SeriesSemantics::State,
        declared_type: "gauge",
        on_by_default: true,
        enable_with: "DCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error encountered.",
    },
    ExporterMetric {
        name: "DCGM_EXP_XID_ERRORS_COUNT",
        exporter: Exporter::Dcgm,
        semantics: SeriesSemantics::WindowedCount,
        declared_type: "gauge",
        on_by_default: false,
        enable_with: "DCGM_EXP_XID_ERRORS_COUNT, gauge, Count of XID Errors within user-specified time window \
                      (see xid-count-window-size param).",
    },
    ExporterMetric {
        name: "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        exporter: Exporter::Dcgm,
        semantics: SeriesSemantics::Counter,
        declared_type: "counter",
        on_by_default: true,
        enable_with: "DCGM_FI_DEV_PCIE_REPLAY_COUNTER, counter, Total number of PCIe retries.",
    },
    ExporterMetric {
        name: "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        exporter: Exporter::Dcgm,
        semantics: SeriesSemantics::Counter,
        declared_type: "counter",
        on_by_default: false,
        enable_with: "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, counter, Total number of single-bit volatile ECC errors.",
    },
    ExporterMetric {
        name: "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        exporter: Exporter::Dcgm,
        semantics: SeriesSemantics::Counter,
        declared_type: "counter",
        on_by_default: false,
        enable_with: "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Total number of double-bit volatile ECC errors.",
    },
    ExporterMetric {
        name: "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        exporter: Exporter::Dcgm,
        semantics: SeriesSemantics::Counter,
        declared_type: "counter",
        on_by_default: false,
        enable_with: "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL, counter, Total number of single-bit persistent ECC errors.",
    },
    ExporterMetric {
        name: "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        exporter: Exporter::Dcgm,
        semantics: SeriesSemantics::Counter,
        declared_type: "counter",
        on_by_default: false,
        enable_with: "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL, counter, Total number of double-bit persistent ECC errors.",
    },
    ExporterMetric {
        name: "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        exporter: Exporter::Dcgm,
        semantics: SeriesSemantics::Counter,
        declared_type: "counter",
        on_by_default: false,
        enable_with: "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, counter, Total number of NVLink flow-control \
                      CRC errors.",
    },
    ExporterMetric {
        name: "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        exporter: Exporter::Dcgm,
        semantics: SeriesSemantics::Counter,
        declared_type: "counter",
        on_by_default: false,
        enable_with: "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, counter, Total number of NVLink data CRC errors.",
    },
    ExporterMetric {
        name: "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        exporter: Exporter::Dcgm,
        semantics: SeriesSemantics::Counter,
        declared_type: "counter",
        on_by_default: true,
        enable_with: "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, counter, Number of remapped rows for uncorrectable \
                      errors",
    },
    ExporterMetric {
        name: "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        exporter: Exporter::Dcgm,
        semantics: SeriesSemantics::Counter,
        declared_type: "counter",
        on_by_default: true,
        enable_with: "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS, counter, Number of remapped rows for correctable errors",
    },
    ExporterMetric {
        name: "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        exporter: Exporter::Dcgm,
        semantics: SeriesSemantics::State,
        declared_type: "gauge",
        on_by_default: true,
        enable_with: "DCGM_FI_DEV_ROW_REMAP_FAILURE, gauge, Whether remapping of rows has failed",
    },
    ExporterMetric {
        name: "DCGM_FI_DEV_GPU_TEMP",
        exporter: Exporter::Dcgm,
        semantics: SeriesSemantics::Gauge,
        declared_type: "gauge",
        on_by_default: true,
        enable_with: "DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).",
    },
    ExporterMetric {
        name: "DCGM_FI_DEV_MEMORY_TEMP",
        exporter: Exporter::Dcgm,
        semantics: SeriesSemantics::Gauge,
        declared_type: "gauge",
        on_by_default: true,
        enable_with: "DCGM_FI_DEV_MEMORY_TEMP, gauge, Memory temperature (in C).",
    },
    ExporterMetric {
        name: "DCGM_FI_DEV_POWER_USAGE",
        exporter: Exporter::Dcgm,
        semantics: SeriesSemantics::Gauge,
        declared_type: "gauge",
        on_by_default: true,
        enable_with: "DCGM_FI_DEV_POWER_USAGE, gauge, Power draw (in W).",
    },
    ExporterMetric {
        name: "DCGM_FI_DEV_GPU_UTIL",
        exporter: Exporter::Dcgm,
        semantics: SeriesSemantics::Gauge,
        declared_type: "gauge",
        on_by_default: true,
        enable_with: "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).",
    },
    ExporterMetric {
        name: "hardware_ecc_events_total",
        exporter: Exporter::NeuronMonitor,
        semantics: SeriesSemantics::Counter,
        declared_type: "counter",
        on_by_default: true,
        enable_with: "the neuron-monitor config's \"neuron_hw_counters\" metric group",
    },
    ExporterMetric {
        name: "execution_errors_total",
        exporter: Exporter::NeuronMonitor,
        semantics: SeriesSemantics::Counter,
        declared_type: "counter",
        on_by_default: true,
        enable_with: "the neuron-monitor config's \"execution_stats\" metric group",
    },
    ExporterMetric {
        name: "neuroncore_utilization_ratio",
        exporter: Exporter::NeuronMonitor,
        semantics: SeriesSemantics::Gauge,
        declared_type: "gauge",
        on_by_default: true,
        enable_with: "the neuron-monitor config's \"neuroncore_counters\" metric group",
    },
];

/// Looks a metric up by its Prometheus name.
pub fn lookup(name: &str) -> Option<&'static ExporterMetric> {
    EXPORTER_METRICS.iter().find(|m| m.name == name)
}

/// PromQL functions that already turn a counter into a rate or an
/// increase; a rate gate does that arithmetic itself, so wrapping it again
/// counts nothing meaningful (and hides resets and exposure from the
/// detector).
const RATE_FUNCTIONS: &[&str] = &[
    "rate", "irate", "increase", "delta", "idelta", "deriv", "resets", "changes",
];

/// A plain series selector, as a rate gate's `query` must be:
/// `name{label="value",...}` with no function, operator or range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    /// The metric name.
    pub metric: String,
    /// The `{...}` part as written, braces included (empty when absent).
    pub matchers: String,
}

/// Why a rate gate's query is not a plain selector.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// `rate(x[5m])` and friends.
    #[error(
        "the query is already wrapped in {function}(); a rate gate takes the bare counter selector and computes \
         the increase itself over each node's exact exposure window, counter resets included"
    )]
    AlreadyRate {
        /// The function found.
        function: String,
    },
    /// Anything else that is not `name{...}`.
    #[error("a rate gate's query must be a plain series selector such as `NAME{{label=\"value\"}}`: {reason}")]
    NotSelector {
        /// What was found instead.
        reason: String,
    },
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Parses a rate gate's query as a plain selector.
pub fn parse_selector(query: &str) -> Result<Selector, SelectorError> {
    let q = query.trim();
    match plain_selector(q) {
        Err(SelectorError::NotSelector { reason }) => {
            // `sum by (node) (rate(x[5m]))` is a rate whatever surrounds it.
            match RATE_FUNCTIONS.iter().find(|f| contains_call(q, f)) {
                Some(function) => Err(SelectorError::AlreadyRate {
                    function: (*function).to_owned(),
                }),
                None => Err(SelectorError::NotSelector { reason }),
            }
        }
        other => other,
    }
}

fn plain_selector(q: &str) -> Result<Selector, SelectorError> {
    let name_end = q.find(|c: char| !is_name_char(c)).unwrap_or(q.len());
    let name = &q[..name_end];
    let rest = q[name_end..].trim_start();
    if name.is_empty() || !name.starts_with(is_name_start) {
        return Err(SelectorError::NotSelector {
            reason: "it does not start with a metric name".into(),
        });
    }
    if rest.starts_with('(') {
        let lower = name.to_ascii_lowercase();
        if RATE_FUNCTIONS.contains(&lower.as_str()) {
            return Err(SelectorError::AlreadyRate { function: lower });
        }
        return Err(SelectorError::NotSelector {
            reason: format!("it calls {name}()"),
        });
    }
    let matchers = if rest.starts_with('{') {
        let end = matchers_end(rest).ok_or_else(|| SelectorError::NotSelector {
            reason: "its `{` is not closed".into(),
        })?;
        &rest[..end]
    } else {
        ""
    };
    let tail = rest[matchers.len()..].trim();
    if !tail.is_empty() {
        return Err(SelectorError::NotSelector {
            reason: format!("unexpected {tail:?} after the selector"),
        });
    }
    Ok(Selector {
        metric: name.to_owned(),
        matchers: matchers.to_owned(),
    })
}

/// Whether `q` calls `function(` as a whole word.
fn contains_call(q: &str, function: &str) -> bool {
    let lower = q.to_ascii_lowercase();
    lower.match_indices(function).any(|(i, _)| {
        let before_ok = lower[..i].chars().next_back().is_none_or(|c| !is_name_char(c));
        let after = lower[i + function.len()..].trim_start();
        before_ok && after.starts_with('(')
    })
}

/// The byte index just past the `}` closing the `{` at the start of `s`,
/// skipping quoted label values (which may contain braces).
fn matchers_end(s: &str) -> Option<usize> {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in s.char_indices().skip(1) {
        match quote {
            Some(_) if escaped => escaped = false,
            Some(_) if c == '\\' => escaped = true,
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '"' || c == '\'' || c == '`' => quote = Some(c),
            None if c == '}' => return Some(i + 1),
            None => {}
        }
    }
    None
}

/// Every exporter metric named in `query` (as a whole word), for the list
/// of fields a policy needs enabled.
pub fn metrics_in_query(query: &str) -> Vec<&'static ExporterMetric> {
    EXPORTER_METRICS
        .iter()
        .filter(|m| {
            query.match_indices(m.name).any(|(i, _)| {
                let before_ok = query[..i].chars().next_back().is_none_or(|c| !is_name_char(c));
                let after_ok = query[i + m.name.len()..]
                    .chars()
                    .next()
                    .is_none_or(|c| !is_name_char(c));
                before_ok && after_ok
            })
        })
        .collect()
}

/// Checks a rate gate's metric against the types a Prometheus server
/// reports (`/api/v1/metadata`: metric name to `counter`, `gauge`, ...).
/// Returns why the gate is wrong, or `None` when the server agrees it is a
/// counter (or does not know the metric, which the built-in table covers).
pub fn check_metadata(metric: &str, types: &BTreeMap<String, String>) -> Option<String> {
    let declared = types.get(metric)?;
    // The windowed XID count is declared a gauge (or, in one CSV, a
    // counter), yet Waveguard reads it by its rises, not as either.
    if lookup(metric).is_some_and(|m| m.semantics == SeriesSemantics::WindowedCount) {
        return None;
    }
    match declared.as_str() {
        "counter" => None,
        other => Some(format!(
            "Prometheus reports {metric} as a {other}; a rate gate needs a counter (events are its increase)"
        )),
    }
}

/// [`check_metadata`] over a policy's Prometheus rate gates: `(severity,
/// gate, message)`, an error for a gate whose metric the server says is not
/// a counter, a warning when the server has no metadata for it (not
/// scraped: the exporter does not publish it).
pub fn metadata_findings(
    policy: &crate::model::Policy,
    types: &BTreeMap<String, String>,
) -> Vec<(crate::diag::Severity, String, String)> {
    use crate::diag::Severity;
    use crate::health::{GateKind, GateSource};
    let mut findings = Vec::new();
    for gate in &policy.health.gates {
        let GateSource::Prometheus { query } = &gate.source else {
            continue;
        };
        if gate.kind != GateKind::Rate {
            continue;
        }
        let Ok(selector) = parse_selector(query) else {
            continue;
        };
        if let Some(reason) = check_metadata(&selector.metric, types) {
            findings.push((
                Severity::Error,
                gate.name.clone(),
                format!("gate {:?}: {reason}", gate.name),
            ));
        } else if !types.contains_key(&selector.metric) {
            findings.push((
                Severity::Warning,
                gate.name.clone(),
                format!(
                    "gate {:?}: Prometheus has no metadata for {}: no target exports it (enable it in the exporter)",
                    gate.name, selector.metric
                ),
            ));
        }
    }
    findings
}

/// The exporter metrics a policy's Prometheus gates read, each once, in
/// table order: what `policy lint` tells the fleet to enable (most DCGM
/// error fields are commented out of dcgm-exporter's default CSV).
pub fn required_metrics(policy: &crate::model::Policy) -> Vec<&'static ExporterMetric> {
    let mut out: Vec<&'static ExporterMetric> = Vec::new();
    for gate in &policy.health.gates {
        if let crate::health::GateSource::Prometheus { query } = &gate.source {
            for m in metrics_in_query(query) {
                if !out.iter().any(|o| o.name == m.name) {
                    out.push(m);
                }
            }
        }
    }
    out.sort_by_key(|m| EXPORTER_METRICS.iter().position(|o| o.name == m.name));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_types_match_semantics() {
        for (i, m) in EXPORTER_METRICS.iter().enumerate() {
            assert!(
                EXPORTER_METRICS[i + 1..].iter().all(|o| o.name != m.name),
                "{} twice",
                m.name
            );
            if m.semantics == SeriesSemantics::Counter {
                assert_eq!(m.declared_type, "counter", "{}", m.name);
            }
            if m.exporter == Exporter::Dcgm {
                assert!(m.enable_with.starts_with(m.name), "{}", m.name);
            }
        }
        assert!(!lookup("DCGM_FI_DEV_XID_ERRORS").unwrap().semantics.feeds_rate());
        assert!(!lookup("DCGM_FI_DEV_GPU_TEMP").unwrap().semantics.feeds_rate());
        assert!(lookup("DCGM_EXP_XID_ERRORS_COUNT").unwrap().semantics.feeds_rate());
        assert!(
            lookup("DCGM_FI_DEV_PCIE_REPLAY_COUNTER")
                .unwrap()
                .semantics
                .feeds_rate()
        );
    }

    fn check(query: &str, expected: Result<(&str, &str), &str>) {
        let got = parse_selector(query);
        match (got, expected) {
            (Ok(sel), Ok((metric, matchers))) => {
                assert_eq!(
                    (sel.metric.as_str(), sel.matchers.as_str()),
                    (metric, matchers),
                    "{query}"
                )
            }
            (Err(e), Err(fragment)) => assert!(e.to_string().contains(fragment), "{query}: {e}"),
            (got, expected) => panic!("{query}: got {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn selectors_and_non_selectors() {
        check(
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
            Ok(("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "")),
        );
        check(
            " DCGM_EXP_XID_ERRORS_COUNT{job=\"dcgm\", xid!=\"0\"} ",
            Ok(("DCGM_EXP_XID_ERRORS_COUNT", "{job=\"dcgm\", xid!=\"0\"}")),
        );
        check("x{a=\"}\"}", Ok(("x", "{a=\"}\"}")));
        check(
            "rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER[5m])",
            Err("already wrapped in rate()"),
        );
        check("increase (x[1h])", Err("already wrapped in increase()"));
        check("sum by (node) (rate(x[5m]))", Err("already wrapped in rate()"));
        check("sum by (node) (x)", Err("unexpected \"by (node) (x)\""));
        check("abs(x)", Err("it calls abs()"));
        check("x[5m]", Err("unexpected \"[5m]\""));
        check("x{a=\"b\"", Err("not closed"));
        check("x > 0", Err("unexpected \"> 0\""));
        check("{__name__=\"x\"}", Err("does not start with a metric name"));
        check("generate_rate_limit_total", Ok(("generate_rate_limit_total", "")));
    }

    #[test]
    fn metrics_named_in_a_query() {
        let names: Vec<&str> =
            metrics_in_query("max by (node) (DCGM_FI_DEV_GPU_TEMP{job=\"dcgm\"}) + DCGM_FI_DEV_GPU_TEMPX")
                .iter()
                .map(|m| m.name)
                .collect();
        assert_eq!(names, ["DCGM_FI_DEV_GPU_TEMP"]);
    }

    #[test]
    fn metadata_disagreement() {
        let types: BTreeMap<String, String> = [
            ("DCGM_FI_DEV_XID_ERRORS", "gauge"),
            ("my_errors_total", "counter"),
            ("DCGM_EXP_XID_ERRORS_COUNT", "gauge"),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .collect();
        assert!(
            check_metadata("DCGM_FI_DEV_XID_ERRORS", &types)
                .unwrap()
                .contains("as a gauge")
        );
        assert_eq!(check_metadata("my_errors_total", &types), None);
        assert_eq!(check_metadata("DCGM_EXP_XID_ERRORS_COUNT", &types), None);
        assert_eq!(check_metadata("unknown", &types), None);
    }
}
