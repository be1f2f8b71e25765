//! Structured diagnostics: what `waveguard policy lint`, the web UI and the
//! git sync all report, each pointing at a line and column of the YAML file.

use std::fmt;

/// How bad a finding is. Errors make a policy unusable; warnings are printed
/// but a policy with only warnings is still put in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// Legal but probably not what the author meant.
    Warning,
    /// The policy is refused.
    Error,
}

/// A 1-based line and column (in characters) in a policy file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// 1-based line.
    pub line: u64,
    /// 1-based column, counted in characters.
    pub column: u64,
}

impl Position {
    /// The start of the file; used when the parser cannot say more.
    pub const START: Position = Position { line: 1, column: 1 };

    /// Converts a parser location; an unknown location (line 0) becomes
    /// `fallback` so that every diagnostic still points somewhere real.
    pub(crate) fn from_location(loc: serde_saphyr::Location, fallback: Position) -> Position {
        if loc.line() == 0 {
            fallback
        } else {
            Position {
                line: loc.line(),
                column: loc.column().max(1),
            }
        }
    }
}

/// One finding about one policy file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// Error or warning.
    pub severity: Severity,
    /// Where the offending value starts.
    pub position: Position,
    /// Human-readable explanation, without the location.
    pub message: String,
}

impl Diagnostic {
    /// Renders as `file:line:col: message` (warnings add `warning: ` before
    /// the message), the form editors and CI annotators understand.
    pub fn render(&self, file: &str) -> String {
        let prefix = match self.severity {
            Severity::Error => "",
            Severity::Warning => "warning: ",
        };
        format!(
            "{file}:{}:{}: {prefix}{}",
            self.position.line, self.position.column, self.message
        )
    }

    /// Whether this finding refuses the policy.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.position.line, self.position.column, self.message)
    }
}

/// Collects findings while validation keeps going, so that one run reports
/// every problem instead of stopping at the first.
#[derive(Debug, Default)]
pub(crate) struct Sink {
    pub(crate) items: Vec<Diagnostic>,
}

impl Sink {
    pub(crate) fn error(&mut self, at: Position, message: impl Into<String>) {
        self.items.push(Diagnostic {
            severity: Severity::Error,
            position: at,
            message: message.into(),
        });
    }

    pub(crate) fn warning(&mut self, at: Position, message: impl Into<String>) {
        self.items.push(Diagnostic {
            severity: Severity::Warning,
            position: at,
            message: message.into(),
        });
    }

    pub(crate) fn has_errors(&self) -> bool {
        self.items.iter().any(Diagnostic::is_error)
    }

    /// Sorted by position so output reads top to bottom like the file.
    pub(crate) fn finish(mut self) -> Vec<Diagnostic> {
        self.items.sort_by_key(|d| d.position);
        self.items
    }
}
