//! Vendor RMA criteria as code: the YAML files under `policies/rma/` (kept in the policy repository,
//! pinned to a commit like policies), parsed and validated with `file:line:col` diagnostics.
//!
//! One file per vendor and part kind. It pins the edition of every vendor document its rules come
//! from, because a vendor that changes its thresholds changes what a past claim had to show: a case
//! records the edition it was judged under.

use std::collections::{BTreeMap, BTreeSet};

use chrono::TimeDelta;
use orchestrator_policy::{Diagnostic, Position, Severity as DiagSeverity, parse_duration};
use serde::{Deserialize, Serialize};
use serde_saphyr::{MessageFormatter, Spanned, UserMessageFormatter};

/// Largest criteria file accepted; real ones are a few kilobytes, the bound keeps a hostile file in
/// the policy repository cheap to refuse.
pub const MAX_CRITERIA_BYTES: usize = 128 * 1024;
/// Longest name (vendor, rule, document key) accepted: names end up in URLs and database keys.
const MAX_NAME_LEN: usize = 64;
/// Most XID occurrences a rule may ask for; more is a typo, and it bounds the window scan.
const MAX_XID_COUNT: u64 = 10_000;
/// Largest quota a vendor file may state per period.
const MAX_QUOTA: u64 = 100_000;

/// How urgent a failure is: orders the quota queue (highest first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Degraded but usable.
    Low,
    /// Usable with risk to jobs.
    Medium,
    /// Jobs fail on this part.
    High,
    /// The part is unusable or corrupts data.
    Critical,
}

impl Severity {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "low" => Self::Low,
            "medium" => Self::Medium,
            "high" => Self::High,
            "critical" => Self::Critical,
            _ => return None,
        })
    }
}

/// A sticky health flag a GPU reports (NVML / DCGM gauge, or out of band over SMBPBI).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthFlag {
    /// NVML `failureOccurred` of the row remapper (DCGM `DCGM_FI_DEV_ROW_REMAP_FAILURE`).
    RowRemapFailure,
    /// The L2/SRAM "SRAM Threshold Exceeded" flag.
    SramThresholdExceeded,
}

impl HealthFlag {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "row_remap_failure" => Self::RowRemapFailure,
            "sram_threshold_exceeded" => Self::SramThresholdExceeded,
            _ => return None,
        })
    }
}

/// A kind of evidence a vendor requires in a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvidenceKind {
    /// `nvidia-bug-report.log.gz` (or the vendor's equivalent), uploaded.
    BugReport,
    /// Field diagnostic result (for HGX run through vendor support, so uploaded).
    FieldDiagnostic,
    /// Serial and part numbers and firmware versions of the node's parts.
    Inventory,
    /// BMC event log entries around the failure.
    EventLog,
    /// Telemetry window around the failure.
    TelemetryWindow,
    /// Node-, rack- and fleet-wide events at the same time, and the node's other GPUs.
    SystemCausesRuledOut,
    /// Data pulled with Redfish `LogService.CollectDiagnosticData`.
    RedfishDiagnosticData,
    /// The node's firmware rollouts.
    RolloutHistory,
}

impl EvidenceKind {
    const ALL: [(&'static str, EvidenceKind); 8] = [
        ("bug_report", Self::BugReport),
        ("field_diagnostic", Self::FieldDiagnostic),
        ("inventory", Self::Inventory),
        ("event_log", Self::EventLog),
        ("telemetry_window", Self::TelemetryWindow),
        ("system_causes_ruled_out", Self::SystemCausesRuledOut),
        ("redfish_diagnostic_data", Self::RedfishDiagnosticData),
        ("rollout_history", Self::RolloutHistory),
    ];

    fn parse(s: &str) -> Option<Self> {
        Self::ALL.iter().find(|(name, _)| *name == s).map(|(_, k)| *k)
    }

    fn expected() -> String {
        Self::ALL.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
    }
}

/// A vendor document a rule comes from, pinned to the edition the rule was written from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceDocument {
    /// Title as the vendor publishes it.
    pub title: String,
    /// Edition as printed on the document (e.g. `DA-09826-002_vR520, December 2022`).
    pub edition: String,
    /// Where it is published.
    pub url: String,
}

/// What makes a part qualify, one signal per rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Condition {
    /// The flag reads set.
    Flag(HealthFlag),
    /// At least `at_least` XIDs with one of `codes` within any window of length `within` (from log
    /// entries, or one reading of the exporter's windowed count whose window is no longer).
    Xid {
        /// XID codes counted together.
        codes: Vec<u32>,
        /// Occurrences needed.
        at_least: u64,
        /// Window length.
        within: TimeDelta,
    },
    /// The part's telemetry series was absent (while the node's collector ran) for at least `for_`.
    SeriesVanished {
        /// Shortest absence that counts.
        for_: TimeDelta,
    },
    /// The BMC stopped answering within `within` of a flash and stayed silent for at least `for_`.
    BmcSilentAfterFlash {
        /// How soon after the flash the silence must begin.
        within: TimeDelta,
        /// Shortest silence that counts.
        for_: TimeDelta,
    },
}

/// One qualifying rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rule {
    /// Unique within the file; named by candidates and cases.
    pub name: String,
    /// Failure mode, for acceptance rates per mode.
    pub failure_mode: String,
    /// Orders the quota queue.
    pub severity: Severity,
    /// Key of the [`SourceDocument`] the rule comes from.
    pub document: String,
    /// Section of that document.
    pub section: String,
    /// The signal.
    pub condition: Condition,
    /// When set, the rule is met only once a failed field diagnostic falls within this distance of
    /// the signal (the vendor's "validated by the field diagnostic").
    pub confirm_within: Option<TimeDelta>,
}

/// Submissions allowed per rolling period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    /// Submissions allowed in any window of `period`.
    pub submissions: u64,
    /// Length of the window.
    pub period: TimeDelta,
}

/// The criteria of one vendor for one part kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Criteria {
    /// Vendor key (`nvidia`).
    pub vendor: String,
    /// Part kind (`gpu`).
    pub part_kind: String,
    /// Part numbers covered: exact, or a prefix ending in `*`; empty covers every part of the kind.
    pub part_numbers: Vec<String>,
    /// Documents the rules come from, by key.
    pub documents: BTreeMap<String, SourceDocument>,
    /// Submission quota.
    pub quota: Quota,
    /// Expected vendor turnaround from submission to answer.
    pub turnaround: TimeDelta,
    /// A failure that begins within this time after the part's firmware changed is firmware-suspected.
    pub firmware_suspect_window: TimeDelta,
    /// Evidence every claim must carry.
    pub required_evidence: Vec<EvidenceKind>,
    /// The rules, in file order.
    pub rules: Vec<Rule>,
}

impl Criteria {
    /// Whether these criteria cover a part.
    pub fn covers(&self, vendor: &str, part_kind: &str, part_number: &str) -> bool {
        self.vendor == vendor
            && self.part_kind == part_kind
            && (self.part_numbers.is_empty()
                || self.part_numbers.iter().any(|p| match p.strip_suffix('*') {
                    Some(prefix) => part_number.starts_with(prefix),
                    None => p == part_number,
                }))
    }
}

type S<T> = Spanned<T>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCriteria {
    vendor: S<String>,
    part_kind: S<String>,
    #[serde(default)]
    part_numbers: Vec<S<String>>,
    documents: S<BTreeMap<String, S<RawDocument>>>,
    quota: S<RawQuota>,
    turnaround: S<String>,
    firmware_suspect_window: S<String>,
    required_evidence: S<Vec<S<String>>>,
    rules: S<Vec<S<RawRule>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDocument {
    title: S<String>,
    edition: S<String>,
    url: S<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQuota {
    submissions: S<i64>,
    per: S<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    name: S<String>,
    failure_mode: S<String>,
    severity: S<String>,
    source: S<RawSource>,
    when: S<RawWhen>,
    #[serde(default)]
    confirmed_by: Option<S<RawConfirm>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSource {
    document: S<String>,
    section: S<String>,
}

/// Exactly one key must be present; a struct of options (not an enum) keeps every position.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWhen {
    #[serde(default)]
    flag: Option<S<String>>,
    #[serde(default)]
    xid: Option<S<RawXid>>,
    #[serde(default)]
    series_vanished: Option<S<RawFor>>,
    #[serde(default)]
    bmc_silent_after_flash: Option<S<RawBmcSilent>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawXid {
    codes: S<Vec<S<i64>>>,
    at_least: S<i64>,
    within: S<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFor {
    #[serde(rename = "for")]
    for_: S<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBmcSilent {
    within: S<String>,
    #[serde(rename = "for")]
    for_: S<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfirm {
    field_diagnostic: S<String>,
    within: S<String>,
}

fn at<T>(s: &S<T>) -> Position {
    let loc = s.referenced;
    if loc.line() == 0 {
        Position::START
    } else {
        Position {
            line: loc.line(),
            column: loc.column().max(1),
        }
    }
}

#[derive(Default)]
struct Sink(Vec<Diagnostic>);

impl Sink {
    fn error(&mut self, position: Position, message: impl Into<String>) {
        self.0.push(Diagnostic {
            severity: DiagSeverity::Error,
            position,
            message: message.into(),
        });
    }
}

/// The outcome of checking one criteria file.
#[derive(Debug, Clone)]
pub struct CheckedCriteria {
    /// The criteria, when there are no errors.
    pub criteria: Option<Criteria>,
    /// Every finding, sorted by position.
    pub diagnostics: Vec<Diagnostic>,
}

/// Criteria that did not validate, with every finding.
#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid RMA criteria: {}", .diagnostics.first().map(ToString::to_string).unwrap_or_default())]
pub struct CriteriaError {
    /// The findings, sorted by position.
    pub diagnostics: Vec<Diagnostic>,
}

/// Parses and validates criteria, for callers that only want the result.
pub fn parse_criteria(source: &str) -> Result<Criteria, CriteriaError> {
    let checked = check_source(source);
    checked.criteria.ok_or(CriteriaError {
        diagnostics: checked.diagnostics,
    })
}

fn failed(position: Position, message: impl Into<String>) -> CheckedCriteria {
    let mut sink = Sink::default();
    sink.error(position, message);
    CheckedCriteria {
        criteria: None,
        diagnostics: sink.0,
    }
}

/// Checks a criteria file: YAML structure first (stops at the first problem), then every semantic
/// check (reports them all).
pub fn check_source(source: &str) -> CheckedCriteria {
    if source.len() > MAX_CRITERIA_BYTES {
        return failed(
            Position::START,
            format!("criteria file is larger than {MAX_CRITERIA_BYTES} bytes"),
        );
    }
    let options = serde_saphyr::options! {
        strict_booleans: true,
        with_snippet: false,
    };
    let raw: RawCriteria = match serde_saphyr::from_str_with_options(source, options) {
        Ok(raw) => raw,
        Err(e) => {
            let message = UserMessageFormatter.format_message(e.without_snippet());
            // One line per diagnostic, whatever the input's control characters.
            let message: String = message.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
            let position = e.location().map_or(Position::START, |loc| {
                if loc.line() == 0 {
                    Position::START
                } else {
                    Position {
                        line: loc.line(),
                        column: loc.column().max(1),
                    }
                }
            });
            return failed(position, message);
        }
    };
    let mut sink = Sink::default();
    let criteria = validate(&raw, &mut sink);
    let mut diagnostics = sink.0;
    diagnostics.sort_by_key(|d| d.position);
    let has_errors = diagnostics.iter().any(Diagnostic::is_error);
    CheckedCriteria {
        criteria: if has_errors { None } else { criteria },
        diagnostics,
    }
}

fn name(sink: &mut Sink, what: &str, s: &S<String>) -> String {
    let v = s.value.trim();
    let ok = !v.is_empty()
        && v.len() <= MAX_NAME_LEN
        && v.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if !ok {
        sink.error(
            at(s),
            format!("{what} {v:?} must be 1-{MAX_NAME_LEN} characters of a-z, 0-9, '_' or '-'"),
        );
    }
    v.to_owned()
}

fn text(sink: &mut Sink, what: &str, s: &S<String>) -> String {
    let v = s.value.trim();
    if v.is_empty() {
        sink.error(at(s), format!("{what} must not be empty"));
    }
    v.to_owned()
}

fn duration(sink: &mut Sink, what: &str, s: &S<String>) -> TimeDelta {
    match parse_duration(&s.value) {
        Ok(d) => d,
        Err(e) => {
            sink.error(at(s), format!("{what}: {e}"));
            TimeDelta::zero()
        }
    }
}

fn validate(raw: &RawCriteria, sink: &mut Sink) -> Option<Criteria> {
    let vendor = name(sink, "vendor", &raw.vendor);
    let part_kind = name(sink, "part_kind", &raw.part_kind);
    let part_numbers = raw
        .part_numbers
        .iter()
        .map(|p| {
            let v = text(sink, "part number", p);
            if v.strip_suffix('*').is_some_and(|pre| pre.contains('*')) || (!v.ends_with('*') && v.contains('*')) {
                sink.error(
                    at(p),
                    "a part number may end in one '*' (a prefix) and contain no other '*'",
                );
            }
            v
        })
        .collect();

    let mut documents = BTreeMap::new();
    if raw.documents.value.is_empty() {
        sink.error(
            at(&raw.documents),
            "documents: name at least one vendor document the rules come from",
        );
    }
    for (key, doc) in &raw.documents.value {
        let d = &doc.value;
        let url = text(sink, "url", &d.url);
        if !url.starts_with("https://") {
            sink.error(at(&d.url), "url must be an https:// address of the published document");
        }
        documents.insert(
            key.clone(),
            SourceDocument {
                title: text(sink, "title", &d.title),
                edition: text(
                    sink,
                    "edition (pin the edition the rules were written from)",
                    &d.edition,
                ),
                url,
            },
        );
    }

    let q = &raw.quota.value;
    let submissions = q.submissions.value;
    if !(1..=MAX_QUOTA as i64).contains(&submissions) {
        sink.error(at(&q.submissions), format!("quota.submissions must be 1..={MAX_QUOTA}"));
    }
    let quota = Quota {
        submissions: u64::try_from(submissions).unwrap_or(0),
        period: duration(sink, "quota.per", &q.per),
    };
    let turnaround = duration(sink, "turnaround", &raw.turnaround);
    let firmware_suspect_window = duration(sink, "firmware_suspect_window", &raw.firmware_suspect_window);

    let mut required_evidence = Vec::new();
    for e in &raw.required_evidence.value {
        match EvidenceKind::parse(e.value.trim()) {
            Some(k) if required_evidence.contains(&k) => {
                sink.error(at(e), format!("evidence {:?} listed twice", e.value))
            }
            Some(k) => required_evidence.push(k),
            None => sink.error(
                at(e),
                format!(
                    "unknown evidence {:?}; expected one of: {}",
                    e.value,
                    EvidenceKind::expected()
                ),
            ),
        }
    }

    let mut rules = Vec::new();
    let mut seen = BTreeSet::new();
    if raw.rules.value.is_empty() {
        sink.error(at(&raw.rules), "rules: at least one rule is needed");
    }
    for r in &raw.rules.value {
        if let Some(rule) = validate_rule(&r.value, &documents, sink) {
            if !seen.insert(rule.name.clone()) {
                sink.error(at(&r.value.name), format!("rule name {:?} is used twice", rule.name));
            }
            if rule.confirm_within.is_some() && !required_evidence.contains(&EvidenceKind::FieldDiagnostic) {
                sink.error(
                    at(&r.value.name),
                    "a rule confirmed by the field diagnostic needs field_diagnostic in required_evidence",
                );
            }
            rules.push(rule);
        }
    }
    Some(Criteria {
        vendor,
        part_kind,
        part_numbers,
        documents,
        quota,
        turnaround,
        firmware_suspect_window,
        required_evidence,
        rules,
    })
}

fn validate_rule(r: &RawRule, documents: &BTreeMap<String, SourceDocument>, sink: &mut Sink) -> Option<Rule> {
    let rule_name = name(sink, "rule name", &r.name);
    let failure_mode = name(sink, "failure_mode", &r.failure_mode);
    let severity = Severity::parse(r.severity.value.trim()).unwrap_or_else(|| {
        sink.error(
            at(&r.severity),
            format!(
                "unknown severity {:?}; expected low, medium, high or critical",
                r.severity.value
            ),
        );
        Severity::Low
    });
    let src = &r.source.value;
    let document = src.document.value.trim().to_owned();
    if !documents.contains_key(&document) {
        sink.error(
            at(&src.document),
            format!("document {document:?} is not listed under documents"),
        );
    }
    let section = text(sink, "source.section", &src.section);

    let w = &r.when.value;
    let given = [
        w.flag.is_some(),
        w.xid.is_some(),
        w.series_vanished.is_some(),
        w.bmc_silent_after_flash.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count();
    if given != 1 {
        sink.error(
            at(&r.when),
            "when: give exactly one of flag, xid, series_vanished, bmc_silent_after_flash",
        );
        return None;
    }
    let condition = if let Some(flag) = &w.flag {
        match HealthFlag::parse(flag.value.trim()) {
            Some(f) => Condition::Flag(f),
            None => {
                sink.error(
                    at(flag),
                    format!(
                        "unknown flag {:?}; expected row_remap_failure or sram_threshold_exceeded",
                        flag.value
                    ),
                );
                return None;
            }
        }
    } else if let Some(x) = &w.xid {
        let x = &x.value;
        let mut codes = Vec::new();
        if x.codes.value.is_empty() {
            sink.error(at(&x.codes), "xid.codes: name at least one XID code");
        }
        for c in &x.codes.value {
            match u32::try_from(c.value) {
                Ok(v) if v > 0 => codes.push(v),
                _ => sink.error(at(c), "an XID code is a positive whole number"),
            }
        }
        let at_least = x.at_least.value;
        if !(1..=MAX_XID_COUNT as i64).contains(&at_least) {
            sink.error(at(&x.at_least), format!("xid.at_least must be 1..={MAX_XID_COUNT}"));
        }
        Condition::Xid {
            codes,
            at_least: u64::try_from(at_least).unwrap_or(1),
            within: duration(sink, "xid.within", &x.within),
        }
    } else if let Some(v) = &w.series_vanished {
        Condition::SeriesVanished {
            for_: duration(sink, "series_vanished.for", &v.value.for_),
        }
    } else if let Some(b) = &w.bmc_silent_after_flash {
        Condition::BmcSilentAfterFlash {
            within: duration(sink, "bmc_silent_after_flash.within", &b.value.within),
            for_: duration(sink, "bmc_silent_after_flash.for", &b.value.for_),
        }
    } else {
        return None;
    };
    let confirm_within = r.confirmed_by.as_ref().map(|c| {
        if c.value.field_diagnostic.value.trim() != "failed" {
            sink.error(
                at(&c.value.field_diagnostic),
                "confirmed_by.field_diagnostic: only `failed` is meaningful (a claim needs a failed diagnostic)",
            );
        }
        duration(sink, "confirmed_by.within", &c.value.within)
    });
    Some(Rule {
        name: rule_name,
        failure_mode,
        severity,
        document,
        section,
        condition,
        confirm_within,
    })
}

/// One criteria file's lint result.
#[derive(Debug, Clone)]
pub struct CriteriaReport {
    /// The file as named to the user.
    pub file: String,
    /// The check result.
    pub checked: CheckedCriteria,
}

impl CriteriaReport {
    /// `file:line:col: message` lines, in order.
    pub fn rendered(&self) -> Vec<String> {
        self.checked.diagnostics.iter().map(|d| d.render(&self.file)).collect()
    }
}

/// Lints a set of criteria files: each on its own, then across files (one file per vendor and part
/// kind, so that a part is judged by exactly one set of rules).
pub fn lint_files(files: impl IntoIterator<Item = (String, String)>) -> Vec<CriteriaReport> {
    let mut reports: Vec<CriteriaReport> = files
        .into_iter()
        .map(|(file, text)| CriteriaReport {
            checked: check_source(&text),
            file,
        })
        .collect();
    let mut first: BTreeMap<(String, String), String> = BTreeMap::new();
    for report in &mut reports {
        let Some(c) = &report.checked.criteria else { continue };
        let key = (c.vendor.clone(), c.part_kind.clone());
        if let Some(other) = first.get(&key) {
            report.checked.diagnostics.push(Diagnostic {
                severity: DiagSeverity::Error,
                position: Position::START,
                message: format!("vendor {:?} part kind {:?} is already defined by {other}", key.0, key.1),
            });
            report.checked.criteria = None;
        } else {
            first.insert(key, report.file.clone());
        }
    }
    reports
}
