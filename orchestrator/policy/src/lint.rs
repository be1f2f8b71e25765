//! Parsing a policy file into diagnostics and (when clean) a [`Policy`]; the
//! library behind `waveguard policy lint`, the git sync and the web UI.

use std::collections::BTreeMap;

use serde_saphyr::{MessageFormatter, UserMessageFormatter};

use crate::diag::{Diagnostic, Position, Severity, Sink};
use crate::model::Policy;
use crate::raw::{RawPolicy, at};
use crate::validate::validate;

/// Largest policy file accepted. Real ones are a few kilobytes; the bound
/// keeps a hostile file in a policy repository cheap to refuse.
pub const MAX_POLICY_BYTES: usize = 256 * 1024;

/// The outcome of checking one policy source.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The policy, when there are no errors (warnings allowed).
    pub policy: Option<Policy>,
    /// Every finding, sorted by position.
    pub diagnostics: Vec<Diagnostic>,
    /// Where the `name` value is, for cross-file checks.
    pub name_position: Option<Position>,
    /// Where each health gate's `name` value is, by gate name, so checks
    /// outside this crate (the power lint) can point at a gate.
    pub gate_positions: BTreeMap<String, Position>,
}

impl Checked {
    /// Whether any finding is an error.
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }
}

/// A policy that did not validate, with every error.
#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid policy: {}", summary(.diagnostics))]
pub struct PolicyError {
    /// The findings (errors and warnings), sorted by position.
    pub diagnostics: Vec<Diagnostic>,
}

fn summary(diags: &[Diagnostic]) -> String {
    let errors: Vec<&Diagnostic> = diags.iter().filter(|d| d.is_error()).collect();
    match errors.as_slice() {
        [] => "no errors".to_owned(),
        [one] => one.to_string(),
        [first, rest @ ..] => format!("{first} (and {} more)", rest.len()),
    }
}

/// Checks a policy given as raw bytes (as read from a file or a git blob).
pub fn check_bytes(bytes: &[u8]) -> Checked {
    if bytes.len() > MAX_POLICY_BYTES {
        return failed(
            Position::START,
            format!("policy file is larger than {MAX_POLICY_BYTES} bytes"),
        );
    }
    match std::str::from_utf8(bytes) {
        Ok(text) => check_source(text),
        Err(e) => {
            let valid = &bytes[..e.valid_up_to()];
            // `valid` is UTF-8 by construction; the lossy call never replaces.
            let before = String::from_utf8_lossy(valid);
            let line = before.matches('\n').count() as u64 + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) as u64 + 1;
            failed(Position { line, column }, "policy file is not valid UTF-8")
        }
    }
}

fn failed(position: Position, message: impl Into<String>) -> Checked {
    Checked {
        policy: None,
        diagnostics: vec![Diagnostic {
            severity: Severity::Error,
            position,
            message: message.into(),
        }],
        name_position: None,
        gate_positions: BTreeMap::new(),
    }
}

/// Checks a policy given as text: YAML syntax and structure first (which
/// stops at the first problem, as serde does), then every semantic check.
pub fn check_source(source: &str) -> Checked {
    if source.len() > MAX_POLICY_BYTES {
        return failed(
            Position::START,
            format!("policy file is larger than {MAX_POLICY_BYTES} bytes"),
        );
    }
    // Strict booleans: `automatic: yes` or `on` must not quietly mean true.
    let options = serde_saphyr::options! {
        strict_booleans: true,
        with_snippet: false,
    };
    let raw: RawPolicy = match serde_saphyr::from_str_with_options(source, options) {
        Ok(raw) => raw,
        Err(e) => {
            let plain = e.without_snippet();
            let message = UserMessageFormatter.format_message(plain);
            // Diagnostics are one line each; control characters from the
            // input (in a quoted key, say) must not break that layout.
            let message: String = message.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
            // serde's wording for a scalar of the wrong type names Rust types.
            let message = match message.as_str() {
                "invalid i64" => "expected a whole number".to_owned(),
                "invalid f64" => "expected a number".to_owned(),
                _ => message,
            };
            let position = e
                .location()
                .map_or(Position::START, |loc| Position::from_location(loc, Position::START));
            return failed(position, message);
        }
    };
    let mut sink = Sink::default();
    let policy = validate(&raw, &mut sink);
    let gate_positions = raw
        .health
        .iter()
        .flat_map(|h| &h.value.gates)
        .map(|g| (g.value.name.value.clone(), at(&g.value.name)))
        .collect();
    Checked {
        policy,
        diagnostics: sink.finish(),
        name_position: Some(at(&raw.name)),
        gate_positions,
    }
}

/// Parses and validates a policy, for callers that only want the result.
pub fn parse_policy(source: &str) -> Result<Policy, PolicyError> {
    let checked = check_source(source);
    match checked.policy {
        Some(policy) => Ok(policy),
        None => Err(PolicyError {
            diagnostics: checked.diagnostics,
        }),
    }
}

/// One file's lint result.
#[derive(Debug, Clone)]
pub struct FileReport {
    /// The file as named to the user (path or path in the repository).
    pub file: String,
    /// The check result.
    pub checked: Checked,
}

impl FileReport {
    /// `file:line:col: message` lines, in order.
    pub fn rendered(&self) -> Vec<String> {
        self.checked.diagnostics.iter().map(|d| d.render(&self.file)).collect()
    }

    /// Adds findings of checks made outside the file's own validation (power,
    /// a Prometheus server's metadata) at the gate they are about, or at the
    /// file's start for a gate without a position, keeping the diagnostics in
    /// file order. An added error refuses the policy, as one found in the file does.
    pub fn add_gate_findings(&mut self, findings: impl IntoIterator<Item = (Severity, String, String)>) {
        for (severity, gate, message) in findings {
            let position = self
                .checked
                .gate_positions
                .get(&gate)
                .copied()
                .unwrap_or(Position::START);
            self.checked.diagnostics.push(Diagnostic {
                severity,
                position,
                message,
            });
        }
        self.checked.diagnostics.sort_by_key(|d| d.position);
        if self.checked.has_errors() {
            self.checked.policy = None;
        }
    }

    /// `file: needs <exporter> field ...` lines: what the fleet's exporters
    /// must publish for the policy's Prometheus gates.
    pub fn exporter_fields(&self) -> Vec<String> {
        let Some(policy) = &self.checked.policy else {
            return Vec::new();
        };
        crate::exporter::required_metrics(policy)
            .into_iter()
            .map(|m| {
                if m.on_by_default {
                    format!("{}: needs {} field {} (on by default)", self.file, m.exporter, m.name)
                } else {
                    format!(
                        "{}: needs {} field {} (off by default; enable it with: {})",
                        self.file, m.exporter, m.name, m.enable_with
                    )
                }
            })
            .collect()
    }
}

/// Lints a set of policy files together: each on its own, then the rules
/// that span files (policy names are unique, since rollouts refer to a
/// policy by name).
pub fn lint_files(files: impl IntoIterator<Item = (String, Vec<u8>)>) -> Vec<FileReport> {
    let mut reports: Vec<FileReport> = files
        .into_iter()
        .map(|(file, bytes)| FileReport {
            checked: check_bytes(&bytes),
            file,
        })
        .collect();
    let mut first_by_name: BTreeMap<String, String> = BTreeMap::new();
    for report in &mut reports {
        let Some(policy) = &report.checked.policy else {
            continue;
        };
        let name = policy.name.clone();
        match first_by_name.get(&name) {
            Some(first) => {
                let pos = report.checked.name_position.unwrap_or(Position::START);
                report.checked.diagnostics.push(Diagnostic {
                    severity: Severity::Error,
                    position: pos,
                    message: format!("policy name {name:?} is already used by {first}"),
                });
                report.checked.policy = None;
            }
            None => {
                first_by_name.insert(name.clone(), report.file.clone());
                let stem = std::path::Path::new(&report.file)
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .unwrap_or_default();
                if stem != name {
                    let pos = report.checked.name_position.unwrap_or(Position::START);
                    report.checked.diagnostics.push(Diagnostic {
                        severity: Severity::Warning,
                        position: pos,
                        message: format!("policy name {name:?} differs from the file name {stem:?}"),
                    });
                }
            }
        }
        report.checked.diagnostics.sort_by_key(|d| d.position);
    }
    reports
}
