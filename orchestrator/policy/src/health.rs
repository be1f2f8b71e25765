//! Health gates (what the detector compares between canary and control) and
//! Alertmanager alert rules (what pauses or rolls back without a human).

use std::collections::BTreeMap;
use std::fmt;

use chrono::TimeDelta;
use regex::Regex;

/// Whether a metric counts events per unit of exposure or reads a gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateKind {
    /// Events per exposure (errors per GPU-hour); compared as a rate ratio.
    Rate,
    /// A gauge (temperature, power); compared as a difference of levels.
    Level,
}

impl GateKind {
    /// The policy spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            GateKind::Rate => "rate",
            GateKind::Level => "level",
        }
    }
}

/// Which way is a regression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Higher on the canary is worse (error rates, temperature).
    IncreaseIsBad,
    /// Lower on the canary is worse (bandwidth, throughput).
    DecreaseIsBad,
}

/// Metrics the Redfish health collector (and the simulator) produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedfishMetric {
    /// XID-style GPU errors per GPU-hour.
    XidErrorsPerGpuHour,
    /// PCIe AER errors per node-hour.
    PcieAerPerNodeHour,
    /// Link width/speed degradation events per node-day.
    LinkDegradedPerNodeDay,
    /// GPU temperature, degrees Celsius.
    GpuTempC,
    /// GPU power draw, watts.
    GpuPowerW,
    /// Failed flashes per attempted flash.
    FlashFailures,
}

impl RedfishMetric {
    /// Every known metric, in documentation order.
    pub const ALL: &'static [RedfishMetric] = &[
        RedfishMetric::XidErrorsPerGpuHour,
        RedfishMetric::PcieAerPerNodeHour,
        RedfishMetric::LinkDegradedPerNodeDay,
        RedfishMetric::GpuTempC,
        RedfishMetric::GpuPowerW,
        RedfishMetric::FlashFailures,
    ];

    /// The policy (and wire) name.
    pub fn as_str(self) -> &'static str {
        match self {
            RedfishMetric::XidErrorsPerGpuHour => "xid_errors_per_gpu_hour",
            RedfishMetric::PcieAerPerNodeHour => "pcie_aer_per_node_hour",
            RedfishMetric::LinkDegradedPerNodeDay => "link_degraded_per_node_day",
            RedfishMetric::GpuTempC => "gpu_temp_c",
            RedfishMetric::GpuPowerW => "gpu_power_w",
            RedfishMetric::FlashFailures => "flash_failures",
        }
    }

    /// Looks a metric up by its policy name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|m| m.as_str() == name)
    }

    /// What the metric is; a gate must use the same kind, since testing a
    /// temperature as a Poisson rate (or the reverse) gives nonsense p-values.
    pub fn kind(self) -> GateKind {
        match self {
            RedfishMetric::GpuTempC | RedfishMetric::GpuPowerW => GateKind::Level,
            _ => GateKind::Rate,
        }
    }
}

impl fmt::Display for RedfishMetric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a gate's samples come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateSource {
    /// The controller's own Redfish health collection.
    Redfish {
        /// Which metric.
        metric: RedfishMetric,
    },
    /// A PromQL query returning one series per node (label `node`).
    Prometheus {
        /// The query text.
        query: String,
    },
}

/// One health gate.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthGate {
    /// Unique within the policy; waves refer to gates by it.
    pub name: String,
    /// Where samples come from.
    pub source: GateSource,
    /// Rate or level.
    pub kind: GateKind,
    /// Which way is bad.
    pub direction: Direction,
    /// Smallest effect that matters: for a rate, the canary/control rate
    /// ratio (> 1, e.g. 1.5 = 50% worse); for a level, the absolute
    /// difference in the metric's unit (> 0, e.g. 3 °C).
    pub min_effect: f64,
    /// The regression the canary must be able to catch (same unit as
    /// `min_effect`, at least it): the policy lint warns when the first
    /// wave cannot detect it with 80% power. Defaults to
    /// [`HealthGate::default_must_detect`].
    pub must_detect: f64,
    /// The fleet's baseline as the policy states it, for planning only (`policy power` and `lint`,
    /// the holdback's size), never for judging, which compares with concurrent controls: a rate
    /// gate's events per unit of its exposure on the current firmware, a level gate's between-unit
    /// standard deviation. Measured history outranks it; `None`: history or the default.
    pub baseline: Option<f64>,
    /// How often the gate is evaluated; a wave's bake lasts at least one.
    pub interval: TimeDelta,
}

impl HealthGate {
    /// `must_detect` when the policy does not say: twice the smallest effect
    /// that matters (a 1.5x rate gate must catch a tripled rate; a 3 °C gate
    /// a 6 °C rise). The detectable effect always exceeds `min_effect`, since
    /// the test's null sits there, so the lint needs a larger bar; twice is a
    /// regression nobody would want to ship past a canary.
    pub fn default_must_detect(min_effect: f64) -> f64 {
        2.0 * min_effect
    }
}

/// An Alertmanager matcher operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchOp {
    /// `=`
    Equal,
    /// `!=`
    NotEqual,
    /// `=~` (anchored regex)
    Regex,
    /// `!~` (anchored regex)
    NotRegex,
}

/// One `label<op>"value"` matcher, with Alertmanager semantics: a missing
/// label reads as the empty string and regexes are anchored at both ends.
#[derive(Debug, Clone)]
pub struct LabelMatcher {
    /// Label name.
    pub name: String,
    /// Operator.
    pub op: MatchOp,
    /// Value or regex source as written (unquoted).
    pub value: String,
    regex: Option<Regex>,
}

/// Longest regex source accepted in a matcher; bounds compile time and
/// memory on hostile input.
const MAX_MATCHER_REGEX_LEN: usize = 1024;

/// Why a matcher was refused.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MatcherError {
    /// No operator found.
    #[error("invalid matcher {raw:?}; expected label=\"value\" with one of =, !=, =~, !~")]
    Syntax {
        /// As written.
        raw: String,
    },
    /// Label name not `[a-zA-Z_][a-zA-Z0-9_]*`.
    #[error("invalid label name {name:?} in matcher")]
    BadLabel {
        /// The name.
        name: String,
    },
    /// A quoted value without its closing quote.
    #[error("unterminated quoted value in matcher {raw:?}")]
    Unterminated {
        /// As written.
        raw: String,
    },
    /// The regex did not compile.
    #[error("invalid regex in matcher {raw:?}")]
    BadRegex {
        /// As written.
        raw: String,
        /// The regex compiler's complaint.
        #[source]
        source: regex::Error,
    },
    /// Regex longer than the bound.
    #[error("regex in matcher is longer than {MAX_MATCHER_REGEX_LEN} characters")]
    RegexTooLong,
}

impl LabelMatcher {
    /// Parses `name="value"`, `name!=value`, `name=~"re"`, `name!~"re"`.
    pub fn parse(raw: &str) -> Result<Self, MatcherError> {
        let text = raw.trim();
        let name_end = text
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .ok_or_else(|| MatcherError::Syntax { raw: raw.to_owned() })?;
        let name = text[..name_end].trim().to_owned();
        let rest = text[name_end..].trim_start();
        let (op, value) = [
            ("=~", MatchOp::Regex),
            ("!~", MatchOp::NotRegex),
            ("!=", MatchOp::NotEqual),
            ("=", MatchOp::Equal),
        ]
        .iter()
        .find_map(|(t, op)| rest.strip_prefix(t).map(|v| (*op, v.trim())))
        .ok_or_else(|| MatcherError::Syntax { raw: raw.to_owned() })?;
        let valid_name = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        if !valid_name {
            return Err(MatcherError::BadLabel { name });
        }
        let value = unquote(value).ok_or_else(|| MatcherError::Unterminated { raw: raw.to_owned() })?;
        let regex = match op {
            MatchOp::Regex | MatchOp::NotRegex => {
                if value.len() > MAX_MATCHER_REGEX_LEN {
                    return Err(MatcherError::RegexTooLong);
                }
                let anchored = format!("^(?:{value})$");
                Some(
                    regex::RegexBuilder::new(&anchored)
                        .size_limit(1 << 20)
                        .build()
                        .map_err(|source| MatcherError::BadRegex {
                            raw: raw.to_owned(),
                            source,
                        })?,
                )
            }
            MatchOp::Equal | MatchOp::NotEqual => None,
        };
        Ok(Self { name, op, value, regex })
    }

    /// Whether an alert's labels satisfy this matcher.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let actual = labels.get(&self.name).map(String::as_str).unwrap_or("");
        match (self.op, &self.regex) {
            (MatchOp::Equal, _) => actual == self.value,
            (MatchOp::NotEqual, _) => actual != self.value,
            (MatchOp::Regex, Some(re)) => re.is_match(actual),
            (MatchOp::NotRegex, Some(re)) => !re.is_match(actual),
            // Unreachable by construction: parse always compiles a regex
            // for regex operators. Failing closed (no match) is the safe side.
            (MatchOp::Regex | MatchOp::NotRegex, None) => false,
        }
    }
}

/// Strips surrounding double quotes and resolves `\"` and `\\`; an unquoted
/// value is taken as is.
fn unquote(value: &str) -> Option<String> {
    let Some(inner) = value.strip_prefix('"') else {
        return Some(value.to_owned());
    };
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(chars.next()?),
            '"' => return chars.as_str().trim().is_empty().then_some(out),
            c => out.push(c),
        }
    }
    None
}

/// What an alert rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlertAction {
    /// Stop starting new flashes; a human decides.
    Pause,
    /// Roll back per the policy's rollback scope.
    Rollback,
}

/// Alerts whose labels satisfy every matcher trigger the action.
#[derive(Debug, Clone)]
pub struct AlertRule {
    /// All must match.
    pub matchers: Vec<LabelMatcher>,
    /// Pause or roll back.
    pub action: AlertAction,
}

impl AlertRule {
    /// Whether an alert with these labels triggers the rule.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matchers.iter().all(|m| m.matches(labels))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn matchers_follow_alertmanager_semantics() {
        let alert = labels(&[("alertname", "GpuXidStorm"), ("severity", "critical")]);
        let cases = [
            (r#"severity="critical""#, true),
            (r#"severity = "warning""#, false),
            (r#"severity!="warning""#, true),
            (r#"alertname=~"Gpu.*""#, true),
            (r#"alertname=~"Xid""#, false), // anchored
            (r#"alertname!~"Nic.*""#, true),
            ("team=", true),        // missing label reads as ""
            (r#"team!="""#, false), // missing label reads as ""
            ("severity=critical", true),
        ];
        for (text, expected) in cases {
            let m = LabelMatcher::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(m.matches(&alert), expected, "{text}");
        }
    }

    #[test]
    fn bad_matchers_are_refused() {
        assert!(matches!(
            LabelMatcher::parse("severity"),
            Err(MatcherError::Syntax { .. })
        ));
        assert!(matches!(
            LabelMatcher::parse("9x=\"a\""),
            Err(MatcherError::BadLabel { .. })
        ));
        assert!(matches!(
            LabelMatcher::parse("=\"a\""),
            Err(MatcherError::BadLabel { .. })
        ));
        assert!(matches!(
            LabelMatcher::parse("a=\"b"),
            Err(MatcherError::Unterminated { .. })
        ));
        assert!(matches!(
            LabelMatcher::parse("a=~\"(\""),
            Err(MatcherError::BadRegex { .. })
        ));
    }

    #[test]
    fn metric_catalogue() {
        for m in RedfishMetric::ALL {
            assert_eq!(RedfishMetric::from_name(m.as_str()), Some(*m));
        }
        assert_eq!(RedfishMetric::GpuTempC.kind(), GateKind::Level);
        assert_eq!(RedfishMetric::XidErrorsPerGpuHour.kind(), GateKind::Rate);
        assert_eq!(RedfishMetric::from_name("gpu_temp"), None);
    }
}
