//! Semantic validation: raw, position-carrying values in, a typed [`Policy`]
//! out. Every check reports into a [`Sink`] and keeps going, so one lint run
//! lists every problem in the file.

use std::collections::{BTreeMap, BTreeSet};
use std::error::Error as StdError;
use std::str::FromStr;

use chrono::TimeDelta;
use orchestrator_types::ComponentKind;

use crate::diag::{Position, Sink};
use crate::duration::{format_duration, parse_duration};
use crate::health::{AlertAction, AlertRule, Direction, GateKind, GateSource, HealthGate, LabelMatcher, RedfishMetric};
use crate::model::{ApplyTimeRule, DrainRules, OnDrainTimeout, UpdatePathRule, UpdateRules};
use crate::model::{
    Approval, Concurrency, DEFAULT_ALPHA, FailureBudget, Health, IdPattern, LabelSelector, Policy, QualificationRules,
    RollbackPolicy, RollbackScope, Target, VersionRules, Wave, WaveSize,
};
use crate::raw::{
    ActionRaw, ApprovalKind, DirectionRaw, KindRaw, OneOrMany, RawAlert, RawConcurrency, RawFailureBudget, RawGate,
    RawHealth, RawPolicy, RawRollback, RawTarget, RawVersions, RawWave, RawWindow, S, ScopeRaw, SourceKind,
};
use crate::raw::{ApplyTimeRaw, OnDrainTimeoutRaw, RawUpdate, UpdatePathRaw, at};
use crate::version_constraint::VersionConstraint;
use crate::window::MaintenanceWindow;

/// Longest name (policy, wave, gate) accepted; names end up in URLs, logs
/// and database keys.
const MAX_NAME_LEN: usize = 64;
/// Largest node count a wave or limit may state; far above any fleet, low
/// enough that arithmetic on it never overflows.
const MAX_NODES: i64 = 10_000_000;
/// Most approvers a manual wave may require; more is a typo, not a process.
const MAX_APPROVERS: i64 = 16;
/// Longest PromQL query accepted.
const MAX_QUERY_LEN: usize = 8_192;

/// `outer: inner: innermost` — the whole error chain on one line, for
/// messages built from library errors.
///
/// Some library errors (cron, regex) render a multi-line picture of the
/// input with a caret; a diagnostic is one line, and its position already
/// points at the value, so only the last line (the actual complaint) is kept.
pub(crate) fn chain(err: &dyn StdError) -> String {
    orchestrator_types::error_sources(err)
        .map(|e| last_line(&e.to_string()))
        .collect::<Vec<_>>()
        .join(": ")
}

fn last_line(text: &str) -> String {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_owned()
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && s.chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'))
}

fn check_name(sink: &mut Sink, what: &str, name: &S<String>) -> bool {
    if is_name(&name.value) {
        return true;
    }
    sink.error(
        at(name),
        format!(
            "{what} name {:?} must start with a lowercase letter or digit and use only lowercase letters, digits, '-', '_' and '.' (at most {MAX_NAME_LEN} characters)",
            name.value
        ),
    );
    false
}

fn is_label_name(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
        && s.len() <= 253
}

fn duration(sink: &mut Sink, what: &str, raw: &S<String>) -> Option<TimeDelta> {
    match parse_duration(&raw.value) {
        Ok(d) => Some(d),
        Err(e) => {
            sink.error(at(raw), format!("{what}: {}", chain(&e)));
            None
        }
    }
}

/// Positive whole number within `max`, reported against `what`.
fn positive(sink: &mut Sink, what: &str, raw: &S<i64>, min: i64, max: i64) -> Option<u32> {
    if raw.value < min || raw.value > max {
        sink.error(
            at(raw),
            format!("{what} must be between {min} and {max}, got {}", raw.value),
        );
        return None;
    }
    u32::try_from(raw.value).ok()
}

fn percent(sink: &mut Sink, what: &str, raw: &S<f64>, allow_100: bool) -> Option<f64> {
    let v = raw.value;
    let ok = v.is_finite() && v > 0.0 && (v < 100.0 || (allow_100 && v == 100.0));
    if !ok {
        let range = if allow_100 { "(0, 100]" } else { "(0, 100)" };
        sink.error(at(raw), format!("{what} must be a percentage in {range}, got {v}"));
        return None;
    }
    Some(v)
}

pub(crate) fn validate(raw: &RawPolicy, sink: &mut Sink) -> Option<Policy> {
    check_name(sink, "policy", &raw.name);
    let target = target(sink, &raw.target.value);
    let versions = versions(sink, raw.versions.as_ref().map(|v| &v.value));
    let qualification = qualification(sink, raw);
    let concurrency = concurrency(sink, &raw.concurrency.value);
    let windows = windows(sink, raw);
    let health = health(sink, raw.health.as_ref());
    let waves = waves(sink, raw, health.as_ref(), concurrency.as_ref());
    let failure_budget = failure_budget(sink, &raw.failure_budget);
    let rollback = rollback(&raw.rollback.value);
    let detection = crate::detection::detection(sink, raw.detection.as_ref());
    let update = update(raw.update.as_ref().map(|u| &u.value));
    // The planner appends the holdback wave under its own name; a policy wave of that name would
    // make the two indistinguishable on the rollout page and in the engine.
    if detection.as_ref().is_some_and(|d| d.soak.is_some()) {
        for wave in &raw.waves.value {
            if wave.value.name.value == orchestrator_types::HOLDBACK_WAVE {
                sink.error(
                    at(&wave.value.name),
                    format!(
                        "wave name {:?} is the holdback wave's name when the policy has a detection.soak; rename the wave",
                        orchestrator_types::HOLDBACK_WAVE
                    ),
                );
            }
        }
    }
    if let (Some(waves), Some(soak), Some(raw_soak)) = (
        waves.as_deref(),
        detection.as_ref().and_then(|d| d.soak.as_ref()),
        raw.detection.as_ref().and_then(|d| d.value.soak.as_ref()),
    ) {
        soak_outlasts_onset(sink, waves, soak, &raw_soak.value);
    }
    if sink.has_errors() {
        return None;
    }
    Some(Policy {
        name: raw.name.value.clone(),
        description: raw.description.clone(),
        target: target?,
        versions: versions?,
        qualification,
        waves: waves?,
        concurrency: concurrency?,
        maintenance_windows: windows?,
        health: health?,
        failure_budget: failure_budget?,
        rollback,
        detection: detection?,
        update,
    })
}

/// Warns at `soak.min` when it is not longer than the plausible onset of a delayed regression: the
/// soak is the last wave's only judge, and it may pass at `min` on the evidence the earlier waves
/// pooled, before a regression that starts that late after the flash shows on the last wave's nodes.
fn soak_outlasts_onset(sink: &mut Sink, waves: &[Wave], soak: &crate::Soak, raw: &crate::raw::RawSoak) {
    let onset = soak.plausible_onset(waves.iter().map(|w| w.bake).max().unwrap_or(TimeDelta::zero()));
    if soak.min > onset {
        return;
    }
    let source = if soak.onset.is_some() {
        "detection.soak.onset".to_owned()
    } else {
        "the longest wave bake; state it with detection.soak.onset".to_owned()
    };
    sink.warning(
        at(&raw.min),
        format!(
            "detection.soak.min {} is not longer than the plausible onset of a delayed regression ({}, {source}): \
             the soak may pass before such a regression shows on the last wave's nodes; make soak.min longer",
            format_duration(soak.min),
            format_duration(onset)
        ),
    );
}

/// `update:`; `auto` (or absent) leaves the choice to the driver.
fn update(raw: Option<&RawUpdate>) -> UpdateRules {
    let Some(raw) = raw else {
        return UpdateRules::default();
    };
    UpdateRules {
        path: raw.path.as_ref().and_then(|p| match p.value {
            UpdatePathRaw::Auto => None,
            UpdatePathRaw::SimpleUpdate => Some(UpdatePathRule::SimpleUpdate),
            UpdatePathRaw::MultipartPush => Some(UpdatePathRule::MultipartPush),
            UpdatePathRaw::HttpPush => Some(UpdatePathRule::HttpPush),
        }),
        apply_time: raw.apply_time.as_ref().and_then(|a| match a.value {
            ApplyTimeRaw::Auto => None,
            ApplyTimeRaw::OnReset => Some(ApplyTimeRule::OnReset),
            ApplyTimeRaw::Immediate => Some(ApplyTimeRule::Immediate),
        }),
    }
}

fn selector(sink: &mut Sink, what: &str, map: &BTreeMap<String, S<Vec<S<String>>>>) -> LabelSelector {
    let mut out = LabelSelector::new();
    for (key, values) in map {
        if !is_label_name(key) {
            sink.error(at(values), format!("{what}: invalid label name {key:?}"));
        }
        if values.value.is_empty() {
            sink.error(
                at(values),
                format!("{what}: label {key:?} lists no values, so no node could match"),
            );
        }
        out.insert(key.clone(), values.value.iter().map(|v| v.value.clone()).collect());
    }
    out
}

fn target(sink: &mut Sink, raw: &RawTarget) -> Option<Target> {
    let component = match ComponentKind::from_str(&raw.component.value) {
        Ok(c) => Some(c),
        Err(e) => {
            sink.error(at(&raw.component), format!("target.component: {}", chain(&e)));
            None
        }
    };
    let inventory_id = raw.inventory_id.as_ref().and_then(|id| {
        if id.value.trim().is_empty() || id.value.chars().any(char::is_whitespace) {
            sink.error(
                at(id),
                "target.inventory_id must be a non-empty pattern without spaces, e.g. HGX_FW_GPU_*",
            );
            None
        } else {
            Some(IdPattern::new(id.value.clone()))
        }
    });
    if raw.platforms.value.is_empty() {
        sink.error(at(&raw.platforms), "target.platforms must name at least one platform");
    }
    let mut seen = BTreeSet::new();
    for p in &raw.platforms.value {
        if p.value.trim().is_empty() {
            sink.error(at(p), "target.platforms: empty platform name");
        } else if !seen.insert(p.value.as_str()) {
            sink.warning(at(p), format!("target.platforms: {:?} is listed twice", p.value));
        }
    }
    let sel = selector(sink, "target.selector", &raw.selector);
    let mut exclude = Vec::new();
    for ex in &raw.exclude {
        if ex.value.is_empty() {
            sink.error(
                at(ex),
                "target.exclude: an empty selector matches every node and would exclude them all",
            );
        }
        exclude.push(selector(sink, "target.exclude", &ex.value));
    }
    for n in &raw.exclude_nodes {
        if n.value.trim().is_empty() {
            sink.error(at(n), "target.exclude_nodes: empty hostname");
        }
    }
    Some(Target {
        component: component?,
        inventory_id,
        platforms: raw.platforms.value.iter().map(|p| p.value.clone()).collect(),
        selector: sel,
        exclude,
        exclude_nodes: raw.exclude_nodes.iter().map(|n| n.value.clone()).collect(),
    })
}

fn versions(sink: &mut Sink, raw: Option<&RawVersions>) -> Option<VersionRules> {
    let Some(raw) = raw else {
        return Some(VersionRules {
            from: None,
            allow_downgrade: false,
        });
    };
    let from = match &raw.from {
        None => None,
        Some(spanned) => {
            let parsed = match &spanned.value {
                OneOrMany::One(s) => VersionConstraint::parse(s),
                OneOrMany::Many(list) => VersionConstraint::parse_any(list.iter().map(String::as_str)),
            };
            match parsed {
                Ok(c) => Some(c),
                Err(e) => {
                    sink.error(at(spanned), format!("versions.from: {}", chain(&e)));
                    return None;
                }
            }
        }
    };
    Some(VersionRules {
        from,
        allow_downgrade: raw.allow_downgrade,
    })
}

fn qualification(sink: &mut Sink, raw: &RawPolicy) -> QualificationRules {
    let Some(q) = &raw.qualification else {
        return QualificationRules::default();
    };
    let mut seen = BTreeSet::new();
    for g in &q.value.required_gates {
        if g.value.trim().is_empty() {
            sink.error(at(g), "qualification.required_gates: empty gate name");
        } else if !seen.insert(g.value.as_str()) {
            sink.error(
                at(g),
                format!("qualification.required_gates: {:?} is listed twice", g.value),
            );
        }
    }
    if q.value.required_gates.is_empty() {
        sink.warning(
            at(q),
            "qualification.required_gates is empty: any registered release counts as qualified",
        );
    }
    QualificationRules {
        required_gates: q.value.required_gates.iter().map(|g| g.value.clone()).collect(),
        allow_unqualified_canary: q.value.allow_unqualified_canary,
    }
}

fn concurrency(sink: &mut Sink, raw: &RawConcurrency) -> Option<Concurrency> {
    let max_in_flight = positive(sink, "concurrency.max_in_flight", &raw.max_in_flight, 1, MAX_NODES);
    let per_rack = raw
        .per_rack
        .as_ref()
        .map(|v| positive(sink, "concurrency.per_rack", v, 1, MAX_NODES));
    let per_domain = domain_cap(sink, raw);
    let per_cluster_percent = raw
        .per_cluster_percent
        .as_ref()
        .map(|v| percent(sink, "concurrency.per_cluster_percent", v, true));
    let max_out_of_service_percent = raw
        .max_out_of_service_percent
        .as_ref()
        .map(|v| percent(sink, "concurrency.max_out_of_service_percent", v, true));
    Some(Concurrency {
        max_in_flight: max_in_flight?,
        per_rack: optional(per_rack)?,
        per_domain: optional(per_domain)?,
        per_cluster_percent: optional(per_cluster_percent)?,
        max_out_of_service_percent: optional(max_out_of_service_percent)?,
    })
}

/// The scale-up domain cap from `per_domain` or its older name
/// `per_nvlink_domain`. Both at once is refused even when equal: a reader
/// would not know which one a later edit must change.
fn domain_cap(sink: &mut Sink, raw: &RawConcurrency) -> Option<Option<u32>> {
    match (&raw.per_domain, &raw.per_nvlink_domain) {
        (Some(_), Some(old)) => {
            sink.error(
                at(old),
                "concurrency: give per_domain or its older name per_nvlink_domain, not both",
            );
            Some(None)
        }
        (Some(v), None) => Some(positive(sink, "concurrency.per_domain", v, 1, MAX_NODES)),
        (None, Some(v)) => Some(positive(sink, "concurrency.per_nvlink_domain", v, 1, MAX_NODES)),
        (None, None) => None,
    }
}

/// An optional field's check result: `None` (absent) is fine, `Some(None)`
/// (present but invalid, already reported) fails.
fn optional<T>(v: Option<Option<T>>) -> Option<Option<T>> {
    match v {
        None => Some(None),
        Some(inner) => inner.map(Some),
    }
}

fn windows(sink: &mut Sink, raw: &RawPolicy) -> Option<Vec<MaintenanceWindow>> {
    let list = match &raw.maintenance_windows {
        Some(list) if !list.value.is_empty() => list,
        other => {
            let pos = other.as_ref().map_or(Position::START, at);
            sink.warning(pos, "no maintenance_windows: new flashes may start at any time");
            return Some(Vec::new());
        }
    };
    let mut out = Vec::new();
    let mut ok = true;
    for w in &list.value {
        match window(sink, &w.value) {
            Some(w) => out.push(w),
            None => ok = false,
        }
    }
    ok.then_some(out)
}

fn window(sink: &mut Sink, raw: &RawWindow) -> Option<MaintenanceWindow> {
    let schedule = match cron::Schedule::from_str(raw.cron.value.trim()) {
        Ok(s) => Some(s),
        Err(e) => {
            let fields = raw.cron.value.split_whitespace().count();
            let hint = if fields == 5 {
                format!(
                    "cron expression {:?} has 5 fields; this format has a seconds field first: sec min hour day-of-month month day-of-week [year], e.g. \"0 0 2 * * Tue\"",
                    raw.cron.value
                )
            } else {
                format!(
                    "invalid cron expression {:?} ({}); expected sec min hour day-of-month month day-of-week [year]",
                    raw.cron.value,
                    chain(&e)
                )
            };
            sink.error(at(&raw.cron), hint);
            None
        }
    };
    let duration = duration(sink, "maintenance window duration", &raw.duration);
    let timezone = match raw.timezone.value.trim().parse::<chrono_tz::Tz>() {
        Ok(tz) => Some(tz),
        Err(_) => {
            sink.error(
                at(&raw.timezone),
                format!(
                    "unknown time zone {:?}; use an IANA name such as \"UTC\" or \"America/Los_Angeles\"",
                    raw.timezone.value
                ),
            );
            None
        }
    };
    Some(MaintenanceWindow {
        schedule: schedule?,
        duration: duration?,
        timezone: timezone?,
    })
}

fn health(sink: &mut Sink, raw: Option<&S<RawHealth>>) -> Option<Health> {
    let Some(raw) = raw else {
        sink.warning(
            Position::START,
            "no health gates: waves are promoted on bake time alone",
        );
        return Some(Health {
            alpha: DEFAULT_ALPHA,
            gates: Vec::new(),
            alerts: Vec::new(),
        });
    };
    let h = &raw.value;
    let alpha = match &h.alpha {
        None => Some(DEFAULT_ALPHA),
        Some(a) if a.value.is_finite() && a.value > 0.0 && a.value <= 0.5 => Some(a.value),
        Some(a) => {
            sink.error(
                at(a),
                format!(
                    "health.alpha is a false-alarm rate and must be in (0, 0.5], got {}",
                    a.value
                ),
            );
            None
        }
    };
    if h.gates.is_empty() {
        sink.warning(at(raw), "no health gates: waves are promoted on bake time alone");
    }
    let mut gates = Vec::new();
    let mut names = BTreeSet::new();
    let mut ok = true;
    for g in &h.gates {
        if check_name(sink, "gate", &g.value.name) && !names.insert(g.value.name.value.as_str()) {
            sink.error(
                at(&g.value.name),
                format!("duplicate gate name {:?}", g.value.name.value),
            );
        }
        match gate(sink, &g.value) {
            Some(gate) => gates.push(gate),
            None => ok = false,
        }
    }
    let mut alerts = Vec::new();
    for a in &h.alerts {
        match alert(sink, &a.value) {
            Some(rule) => alerts.push(rule),
            None => ok = false,
        }
    }
    if !ok {
        return None;
    }
    Some(Health {
        alpha: alpha?,
        gates,
        alerts,
    })
}

fn gate(sink: &mut Sink, raw: &RawGate) -> Option<HealthGate> {
    let name = &raw.name.value;
    let kind = match raw.kind.value {
        KindRaw::Rate => GateKind::Rate,
        KindRaw::Level => GateKind::Level,
    };
    let source = match raw.source.value {
        SourceKind::Redfish => {
            if let Some(q) = &raw.query {
                sink.error(at(q), format!("gate {name:?}: `query` is only for source prometheus"));
            }
            match &raw.metric {
                None => {
                    sink.error(
                        at(&raw.source),
                        format!("gate {name:?}: source redfish needs a `metric`"),
                    );
                    None
                }
                Some(m) => match RedfishMetric::from_name(&m.value) {
                    None => {
                        let known: Vec<&str> = RedfishMetric::ALL.iter().map(|m| m.as_str()).collect();
                        sink.error(
                            at(m),
                            format!(
                                "gate {name:?}: unknown redfish metric {:?}; known metrics: {}",
                                m.value,
                                known.join(", ")
                            ),
                        );
                        None
                    }
                    Some(RedfishMetric::FlashFailures) => {
                        sink.error(
                            at(m),
                            format!(
                                "gate {name:?}: flash failures cannot be a health gate: no control node flashes to \
                                 compare with; the wave's `failure_budget` (max_failed or max_failed_percent) halts \
                                 a wave whose flashes fail"
                            ),
                        );
                        None
                    }
                    Some(metric) => {
                        if metric.kind() != kind {
                            sink.error(
                                at(&raw.kind),
                                format!(
                                    "gate {name:?}: metric {metric} is a {}, not a {}",
                                    metric.kind().as_str(),
                                    kind.as_str()
                                ),
                            );
                        }
                        Some(GateSource::Redfish { metric })
                    }
                },
            }
        }
        SourceKind::Prometheus => {
            if let Some(m) = &raw.metric {
                sink.error(
                    at(m),
                    format!("gate {name:?}: `metric` is only for source redfish; prometheus gates use `query`"),
                );
            }
            match &raw.query {
                None => {
                    sink.error(
                        at(&raw.source),
                        format!("gate {name:?}: source prometheus needs a `query`"),
                    );
                    None
                }
                Some(q) if q.value.trim().is_empty() || q.value.len() > MAX_QUERY_LEN => {
                    sink.error(
                        at(q),
                        format!("gate {name:?}: query must be non-empty and at most {MAX_QUERY_LEN} bytes"),
                    );
                    None
                }
                Some(q) if !prometheus_query_fits(sink, name, kind, q) => None,
                Some(q) => Some(GateSource::Prometheus {
                    query: q.value.trim().to_owned(),
                }),
            }
        }
    };
    let effect = raw.min_effect.value;
    let effect_ok = match kind {
        GateKind::Rate => effect.is_finite() && effect > 1.0,
        GateKind::Level => effect.is_finite() && effect > 0.0,
    };
    if !effect_ok {
        let rule = match kind {
            GateKind::Rate => {
                "for a rate it is the canary/control rate ratio and must be greater than 1 (1.5 = 50% worse)"
            }
            GateKind::Level => "for a level it is an absolute difference and must be greater than 0",
        };
        sink.error(
            at(&raw.min_effect),
            format!("gate {name:?}: min_effect {effect} is invalid: {rule}"),
        );
    }
    // Checked against min_effect only when that is valid itself, so one
    // mistake gives one error.
    let must_detect = match &raw.must_detect {
        None => Some(HealthGate::default_must_detect(effect)),
        Some(m) if effect_ok && !(m.value.is_finite() && m.value >= effect) => {
            let unit = match kind {
                GateKind::Rate => "a rate ratio",
                GateKind::Level => "a shift in the metric's unit",
            };
            sink.error(
                at(m),
                format!(
                    "gate {name:?}: must_detect {} is invalid: it is {unit} the canary must be able to catch and must be at least min_effect {effect}",
                    m.value
                ),
            );
            None
        }
        Some(m) => Some(m.value),
    };
    let baseline = match &raw.baseline {
        Some(b) if !(b.value.is_finite() && b.value > 0.0) => {
            let what = match kind {
                GateKind::Rate => "the fleet's events per unit of the gate's exposure (e.g. 0.002 XIDs per GPU-hour)",
                GateKind::Level => "the between-unit standard deviation in the metric's unit (e.g. 2.5 for °C)",
            };
            sink.error(
                at(b),
                format!(
                    "gate {name:?}: baseline {} is invalid: it is {what} and must be a number greater than 0",
                    b.value
                ),
            );
            Err(())
        }
        b => Ok(b.as_ref().map(|b| b.value)),
    };
    let interval = duration(sink, &format!("gate {name:?} interval"), &raw.interval);
    let direction = match raw.direction.value {
        DirectionRaw::IncreaseIsBad => Direction::IncreaseIsBad,
        DirectionRaw::DecreaseIsBad => Direction::DecreaseIsBad,
    };
    Some(HealthGate {
        name: name.clone(),
        source: source?,
        kind,
        direction,
        min_effect: effect_ok.then_some(effect)?,
        must_detect: must_detect?,
        baseline: baseline.ok()?,
        interval: interval?,
    })
}

/// Whether a Prometheus gate's query can be read as its kind says; reports
/// why not at the query. A rate gate counts events itself (increase over
/// each node's exposure, resets included; rises of the windowed XID count),
/// so its query must be the bare selector of a series that counts: a gauge
/// or a last-value state has no events, and a query already wrapped in
/// `rate()` has lost the resets and the exposure.
fn prometheus_query_fits(sink: &mut Sink, name: &str, kind: GateKind, q: &S<String>) -> bool {
    let selector = crate::exporter::parse_selector(&q.value);
    match (kind, selector) {
        (GateKind::Rate, Err(e)) => {
            sink.error(at(q), format!("gate {name:?}: {e}"));
            false
        }
        (GateKind::Rate, Ok(sel)) => match crate::exporter::lookup(&sel.metric) {
            Some(m) if !m.semantics.feeds_rate() => {
                sink.error(
                    at(q),
                    format!(
                        "gate {name:?}: {} is a {} ({} declares it a {}), not a count of events; a rate gate \
                         needs a counter such as DCGM_FI_DEV_PCIE_REPLAY_COUNTER or the windowed \
                         DCGM_EXP_XID_ERRORS_COUNT; gate a level with `kind: level`",
                        m.name,
                        m.semantics.as_str(),
                        m.exporter,
                        m.declared_type
                    ),
                );
                false
            }
            Some(_) => true,
            None => {
                sink.warning(
                    at(q),
                    format!(
                        "gate {name:?}: {} is not in the built-in exporter table, so it is read as a counter; \
                         check its type with `waveguard policy lint --prometheus URL`",
                        sel.metric
                    ),
                );
                true
            }
        },
        (GateKind::Level, Ok(sel)) => match crate::exporter::lookup(&sel.metric) {
            Some(m) if m.semantics.feeds_rate() => {
                sink.error(
                    at(q),
                    format!(
                        "gate {name:?}: {} is a {}; as a level it compares totals since each node's last restart, \
                         not errors during the bake; use `kind: rate`",
                        m.name,
                        m.semantics.as_str()
                    ),
                );
                false
            }
            _ => true,
        },
        (GateKind::Level, Err(_)) => true,
    }
}

fn alert(sink: &mut Sink, raw: &RawAlert) -> Option<AlertRule> {
    if raw.matchers.value.is_empty() {
        sink.error(
            at(&raw.matchers),
            "alert rule has no matchers; it would fire on every alert",
        );
        return None;
    }
    let mut matchers = Vec::new();
    let mut ok = true;
    for m in &raw.matchers.value {
        match LabelMatcher::parse(&m.value) {
            Ok(parsed) => matchers.push(parsed),
            Err(e) => {
                sink.error(at(m), chain(&e));
                ok = false;
            }
        }
    }
    let action = match raw.action.value {
        ActionRaw::Pause => AlertAction::Pause,
        ActionRaw::Rollback => AlertAction::Rollback,
    };
    ok.then_some(AlertRule { matchers, action })
}

/// The size as written, with the position of the field that set it.
fn wave_size(sink: &mut Sink, w: &S<RawWave>) -> Option<(WaveSize, Position)> {
    let raw = &w.value;
    let name = &raw.name.value;
    let mut given = Vec::new();
    if let Some(c) = &raw.count {
        given.push(at(c));
    }
    if let Some(p) = &raw.percent {
        given.push(at(p));
    }
    if let Some(r) = &raw.rest {
        given.push(at(r));
    }
    if given.len() != 1 {
        let pos = given.get(1).copied().unwrap_or_else(|| at(&raw.name));
        sink.error(
            pos,
            format!("wave {name:?} must set exactly one of `count`, `percent` or `rest: true`"),
        );
        return None;
    }
    if let Some(c) = &raw.count {
        return positive(sink, &format!("wave {name:?} count"), c, 1, MAX_NODES).map(|n| (WaveSize::Count(n), at(c)));
    }
    if let Some(p) = &raw.percent {
        return percent(sink, &format!("wave {name:?} percent"), p, false).map(|v| (WaveSize::Percent(v), at(p)));
    }
    match &raw.rest {
        Some(r) if r.value => Some((WaveSize::Rest, at(r))),
        Some(r) => {
            sink.error(
                at(r),
                format!("wave {name:?}: `rest: false` means nothing; use `count` or `percent`"),
            );
            None
        }
        None => None,
    }
}

fn waves(sink: &mut Sink, raw: &RawPolicy, health: Option<&Health>, conc: Option<&Concurrency>) -> Option<Vec<Wave>> {
    let list = &raw.waves;
    if list.value.is_empty() {
        sink.error(at(list), "waves must list at least one wave");
        return None;
    }
    let mut out = Vec::new();
    let mut ok = true;
    let mut names = BTreeSet::new();
    // (size, position) of the previous wave, for the monotonicity check.
    let mut prev: Option<(WaveSize, String)> = None;
    let mut percent_sum = 0.0;
    let last = list.value.len() - 1;
    for (i, w) in list.value.iter().enumerate() {
        let raw_w = &w.value;
        let name = raw_w.name.value.clone();
        if check_name(sink, "wave", &raw_w.name) && !names.insert(name.clone()) {
            sink.error(at(&raw_w.name), format!("duplicate wave name {name:?}"));
        }
        let size = wave_size(sink, w);
        if let Some((size, pos)) = size {
            match (prev.as_ref().map(|p| p.0), size) {
                (Some(WaveSize::Count(a)), WaveSize::Count(b)) if b < a => sink.error(
                    pos,
                    format!(
                        "wave {name:?} takes {b} nodes, fewer than the {a} of the previous wave {:?}; wave sizes must not decrease",
                        prev.as_ref().map_or("", |p| p.1.as_str())
                    ),
                ),
                (Some(WaveSize::Percent(a)), WaveSize::Percent(b)) if b < a => sink.error(
                    pos,
                    format!(
                        "wave {name:?} takes {b}%, less than the {a}% of the previous wave {:?}; wave sizes must not decrease",
                        prev.as_ref().map_or("", |p| p.1.as_str())
                    ),
                ),
                (Some(WaveSize::Percent(_)), WaveSize::Count(_)) => sink.error(
                    pos,
                    format!(
                        "wave {name:?} has a fixed count after a percentage wave; it would shrink relative to the waves before it as the fleet grows"
                    ),
                ),
                _ => {}
            }
            if let WaveSize::Percent(p) = size {
                percent_sum += p;
                if percent_sum >= 100.0 {
                    sink.error(
                        pos,
                        format!(
                            "percentage waves up to {name:?} add up to {percent_sum}%, leaving nothing for the waves after; the last wave should be `rest: true`"
                        ),
                    );
                }
            }
            if size == WaveSize::Rest && i != last {
                sink.error(
                    pos,
                    format!("wave {name:?} takes the rest of the nodes, so it must be the last wave"),
                );
            }
            if i == last && size != WaveSize::Rest {
                sink.error(
                    pos,
                    format!("the last wave {name:?} must be `rest: true` so that every eligible node is covered"),
                );
            }
            if i == 0 && size == WaveSize::Rest {
                sink.warning(
                    pos,
                    format!("the first wave {name:?} takes every node: there is no canary"),
                );
            }
            prev = Some((size, name.clone()));
        }
        let bake = duration(sink, &format!("wave {name:?} bake"), &raw_w.bake);
        let approval = approval(sink, raw_w);
        if i == 0
            && matches!(approval, Some(Approval::Manual { .. }))
            && let Some(kind) = &raw_w.approval
        {
            sink.error(
                at(kind),
                format!(
                    "the first wave {name:?} cannot ask for manual approval: a wave's approval is given at the end \
                     of the previous wave's bake, and starting the rollout is the first wave's"
                ),
            );
        }
        let max_in_flight = match (&raw_w.max_in_flight, conc) {
            (Some(m), conc) => positive(sink, &format!("wave {name:?} max_in_flight"), m, 1, MAX_NODES).map(|n| {
                if let Some(c) = conc
                    && n > c.max_in_flight
                {
                    sink.warning(
                        at(m),
                        format!(
                            "wave {name:?} max_in_flight {n} is above concurrency.max_in_flight {}; the lower limit applies",
                            c.max_in_flight
                        ),
                    );
                    return c.max_in_flight;
                }
                n
            }),
            (None, Some(c)) => Some(c.max_in_flight),
            (None, None) => None,
        };
        for label in &raw_w.stratify_by {
            if !is_label_name(&label.value) {
                sink.error(
                    at(label),
                    format!("wave {name:?} stratify_by: invalid label name {:?}", label.value),
                );
            }
        }
        let gates = wave_gates(sink, raw_w, health, bake);
        let must_detect = wave_must_detect(sink, raw_w, health, gates.as_deref());
        let drain = drain_rules(sink, raw_w);
        let max_bake = crate::detection::max_bake(sink, &name, raw_w.max_bake.as_ref(), bake);
        match (size, bake, approval, max_in_flight, gates, must_detect, drain, max_bake) {
            (
                Some((size, _)),
                Some(bake),
                Some(approval),
                Some(max_in_flight),
                Some(gates),
                Some(must_detect),
                Some(drain),
                Some(max_bake),
            ) => out.push(Wave {
                name,
                size,
                bake,
                max_bake,
                approval,
                max_in_flight,
                stratify_by: raw_w.stratify_by.iter().map(|l| l.value.clone()).collect(),
                gates,
                must_detect,
                drain,
            }),
            _ => ok = false,
        }
    }
    ok.then_some(out)
}

/// Longest `drain_timeout`: a node kept drained for longer than a week is
/// stranded capacity, whatever the policy meant.
const MAX_DRAIN_TIMEOUT_DAYS: i64 = 7;

fn drain_rules(sink: &mut Sink, w: &RawWave) -> Option<DrainRules> {
    let name = &w.name.value;
    let mut rules = DrainRules::default();
    if let Some(raw) = &w.drain_timeout {
        let timeout = duration(sink, &format!("wave {name:?} drain_timeout"), raw)?;
        if timeout > TimeDelta::days(MAX_DRAIN_TIMEOUT_DAYS) {
            sink.error(
                at(raw),
                format!(
                    "wave {name:?} drain_timeout {} is longer than {MAX_DRAIN_TIMEOUT_DAYS} days; drained nodes are capacity out of service",
                    raw.value
                ),
            );
            return None;
        }
        if timeout < TimeDelta::minutes(1) {
            sink.warning(
                at(raw),
                format!(
                    "wave {name:?} drain_timeout {} is under a minute: nearly every busy node will time out",
                    raw.value
                ),
            );
        }
        rules.timeout = timeout;
    }
    if let Some(raw) = &w.on_drain_timeout {
        rules.on_timeout = match raw.value {
            OnDrainTimeoutRaw::Skip => OnDrainTimeout::Skip,
            OnDrainTimeoutRaw::Hold => OnDrainTimeout::Hold,
        };
    }
    Some(rules)
}

fn approval(sink: &mut Sink, w: &RawWave) -> Option<Approval> {
    let name = &w.name.value;
    let kind = w.approval.as_ref().map_or(ApprovalKind::Auto, |a| a.value);
    match (kind, &w.approvers) {
        (ApprovalKind::Auto, None) => Some(Approval::Auto),
        (ApprovalKind::Auto, Some(n)) => {
            sink.error(at(n), format!("wave {name:?}: `approvers` needs `approval: manual`"));
            None
        }
        (ApprovalKind::Manual, None) => Some(Approval::Manual { approvers: 1 }),
        (ApprovalKind::Manual, Some(n)) => positive(sink, &format!("wave {name:?} approvers"), n, 1, MAX_APPROVERS)
            .map(|approvers| Approval::Manual { approvers }),
    }
}

/// Resolves the wave's gate names and checks that the bake lasts at least
/// one evaluation of each: a gate never evaluated during the bake would let
/// the wave through unexamined.
fn wave_gates(sink: &mut Sink, w: &RawWave, health: Option<&Health>, bake: Option<TimeDelta>) -> Option<Vec<String>> {
    let name = &w.name.value;
    // Without a valid health section the gate names cannot be checked; its
    // own errors were reported already.
    let health = health?;
    let names: Vec<(String, Position)> = match &w.gates {
        Some(list) => list.iter().map(|g| (g.value.clone(), at(g))).collect(),
        None => health.gates.iter().map(|g| (g.name.clone(), at(&w.bake))).collect(),
    };
    let mut ok = true;
    for (gate_name, pos) in &names {
        match health.gate(gate_name) {
            None => {
                let defined: Vec<&str> = health.gates.iter().map(|g| g.name.as_str()).collect();
                let known = if defined.is_empty() {
                    "no gates are defined under health.gates".to_owned()
                } else {
                    format!("defined gates: {}", defined.join(", "))
                };
                sink.error(
                    *pos,
                    format!("wave {name:?} refers to unknown health gate {gate_name:?}; {known}"),
                );
                ok = false;
            }
            Some(g) => {
                if let Some(bake) = bake
                    && bake < g.interval
                {
                    sink.error(
                        at(&w.bake),
                        format!(
                            "wave {name:?} bake time {} is shorter than the evaluation interval {} of gate {:?}",
                            format_duration(bake),
                            format_duration(g.interval),
                            g.name
                        ),
                    );
                }
            }
        }
    }
    ok.then(|| names.into_iter().map(|(n, _)| n).collect())
}

/// A wave's `must_detect` overrides: each names a gate the wave watches and is valid for that gate
/// (at least its `min_effect`), as the gate's own `must_detect` must be.
fn wave_must_detect(
    sink: &mut Sink,
    w: &RawWave,
    health: Option<&Health>,
    gates: Option<&[String]>,
) -> Option<BTreeMap<String, f64>> {
    let name = &w.name.value;
    let mut out = BTreeMap::new();
    let mut ok = true;
    for (gate_name, value) in &w.must_detect {
        // Unknown gates in the wave's own list were reported already; without them nothing
        // here can be checked.
        let (Some(health), Some(gates)) = (health, gates) else {
            return None;
        };
        let Some(gate) = health.gate(gate_name).filter(|_| gates.contains(gate_name)) else {
            sink.error(
                at(value),
                format!(
                    "wave {name:?} must_detect names gate {gate_name:?}, which the wave does not watch; its gates: {}",
                    gates.join(", ")
                ),
            );
            ok = false;
            continue;
        };
        let v = value.value;
        if !(v.is_finite() && v >= gate.min_effect) {
            let unit = match gate.kind {
                GateKind::Rate => "a rate ratio",
                GateKind::Level => "a shift in the metric's unit",
            };
            sink.error(
                at(value),
                format!(
                    "wave {name:?} must_detect {v} for gate {gate_name:?} is invalid: it is {unit} this wave must \
                     rule out to pass and must be at least the gate's min_effect {}",
                    gate.min_effect
                ),
            );
            ok = false;
            continue;
        }
        out.insert(gate_name.clone(), v);
    }
    ok.then_some(out)
}

fn failure_budget(sink: &mut Sink, raw: &S<RawFailureBudget>) -> Option<FailureBudget> {
    match (&raw.value.max_failed, &raw.value.max_failed_percent) {
        (Some(n), None) => positive(sink, "failure_budget.max_failed", n, 0, MAX_NODES).map(FailureBudget::Count),
        (None, Some(p)) => {
            let v = p.value;
            if v.is_finite() && (0.0..100.0).contains(&v) {
                Some(FailureBudget::Percent(v))
            } else {
                sink.error(
                    at(p),
                    format!("failure_budget.max_failed_percent must be in [0, 100), got {v}"),
                );
                None
            }
        }
        (Some(_), Some(p)) => {
            sink.error(
                at(p),
                "failure_budget: set either `max_failed` or `max_failed_percent`, not both",
            );
            None
        }
        (None, None) => {
            sink.error(
                at(raw),
                "failure_budget: set `max_failed` (count) or `max_failed_percent`",
            );
            None
        }
    }
}

fn rollback(raw: &RawRollback) -> RollbackPolicy {
    RollbackPolicy {
        automatic: raw.automatic.value,
        scope: match raw.scope.value {
            ScopeRaw::Wave => RollbackScope::Wave,
            ScopeRaw::Rollout => RollbackScope::Rollout,
        },
    }
}
