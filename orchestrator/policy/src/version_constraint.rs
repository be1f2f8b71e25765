//! Constraints over firmware versions: which *current* versions a policy may
//! update from.
//!
//! Grammar (documented in `policies/README.md`):
//! - a string is a comma-separated list of comparators that must all hold:
//!   `">= 96.00.50.00.00, < 96.00.61.00.01"`; a comparator is one of
//!   `=`, `!=`, `>`, `>=`, `<`, `<=` followed by a version; a bare version
//!   means `=`;
//! - a YAML list of such strings matches when any entry matches, which is how
//!   a list of exact versions is written: `["96.00.5E.00.01", "96.00.61.00.00"]`.
//!
//! Comparisons use the precedence of [`FirmwareVersion`]: versions that differ
//! only in spelling (`01.2` and `1.2`, `5E` and `5e`) count as equal here,
//! because a policy author writing `= 1.2` means that release however the BMC
//! prints it. `1.2` and `1.2.0` are different versions (`1.2` < `1.2.0`).

use std::cmp::Ordering;
use std::fmt;

use orchestrator_types::{FirmwareVersion, VersionError};

/// Most comparators in one constraint; real ones have one to three.
const MAX_COMPARATORS: usize = 64;

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `=`
    Eq,
    /// `!=`
    Ne,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `<`
    Lt,
    /// `<=`
    Le,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::Eq => "=",
            Op::Ne => "!=",
            Op::Gt => ">",
            Op::Ge => ">=",
            Op::Lt => "<",
            Op::Le => "<=",
        }
    }
}

/// One `op version` term.
#[derive(Debug, Clone)]
pub struct Comparator {
    /// The operator.
    pub op: Op,
    /// The version compared against.
    pub version: FirmwareVersion,
}

impl Comparator {
    /// Whether `v` satisfies this term (by precedence, see the module docs).
    pub fn matches(&self, v: &FirmwareVersion) -> bool {
        let ord = if v.is_equivalent(&self.version) {
            Ordering::Equal
        } else {
            v.cmp(&self.version)
        };
        match self.op {
            Op::Eq => ord == Ordering::Equal,
            Op::Ne => ord != Ordering::Equal,
            Op::Gt => ord == Ordering::Greater,
            Op::Ge => ord != Ordering::Less,
            Op::Lt => ord == Ordering::Less,
            Op::Le => ord != Ordering::Greater,
        }
    }
}

/// Any-of a list of all-of comparator sets.
#[derive(Debug, Clone)]
pub struct VersionConstraint {
    alternatives: Vec<Vec<Comparator>>,
}

/// Why a constraint was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConstraintError {
    /// No terms.
    #[error("version constraint is empty")]
    Empty,
    /// A comparator with no version after it, or an empty term between commas.
    #[error("version constraint {raw:?} has an empty term")]
    EmptyTerm {
        /// The constraint as written.
        raw: String,
    },
    /// The version in a term did not parse.
    #[error("version constraint term {term:?} has an invalid version")]
    BadVersion {
        /// The offending term.
        term: String,
        /// Why the version was refused.
        #[source]
        source: VersionError,
    },
    /// No version can satisfy every term (e.g. `> 2, < 1`).
    #[error("version constraint {raw:?} can never match: its lower bound is not below its upper bound")]
    Unsatisfiable {
        /// The constraint as written.
        raw: String,
    },
    /// Unreasonably many terms.
    #[error("version constraint has more than {MAX_COMPARATORS} terms")]
    TooManyTerms,
}

impl VersionConstraint {
    /// Parses one all-of string (`">= 1.0, < 2.0"`).
    pub fn parse(raw: &str) -> Result<Self, ConstraintError> {
        Self::parse_any([raw])
    }

    /// Parses an any-of list; each entry is an all-of string.
    pub fn parse_any<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<Self, ConstraintError> {
        let mut alternatives = Vec::new();
        let mut count = 0usize;
        for raw in entries {
            if raw.trim().is_empty() {
                return Err(ConstraintError::EmptyTerm { raw: raw.to_owned() });
            }
            let mut all = Vec::new();
            for term in raw.split(',') {
                count += 1;
                if count > MAX_COMPARATORS {
                    return Err(ConstraintError::TooManyTerms);
                }
                all.push(parse_term(raw, term)?);
            }
            check_satisfiable(raw, &all)?;
            alternatives.push(all);
        }
        if alternatives.is_empty() {
            return Err(ConstraintError::Empty);
        }
        Ok(Self { alternatives })
    }

    /// Whether `v` satisfies any alternative.
    pub fn matches(&self, v: &FirmwareVersion) -> bool {
        self.alternatives.iter().any(|all| all.iter().all(|c| c.matches(v)))
    }

    /// The alternatives (any-of), each a list of comparators (all-of).
    pub fn alternatives(&self) -> &[Vec<Comparator>] {
        &self.alternatives
    }
}

impl fmt::Display for VersionConstraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, all) in self.alternatives.iter().enumerate() {
            if i > 0 {
                f.write_str(" | ")?;
            }
            for (j, c) in all.iter().enumerate() {
                if j > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{} {}", c.op.as_str(), c.version)?;
            }
        }
        Ok(())
    }
}

fn parse_term(raw: &str, term: &str) -> Result<Comparator, ConstraintError> {
    let t = term.trim();
    // Longest operators first so `>=` is not read as `>` followed by `=...`.
    let (op, rest) = [
        (">=", Op::Ge),
        ("<=", Op::Le),
        ("!=", Op::Ne),
        ("==", Op::Eq),
        (">", Op::Gt),
        ("<", Op::Lt),
        ("=", Op::Eq),
    ]
    .iter()
    .find_map(|(text, op)| t.strip_prefix(text).map(|rest| (*op, rest)))
    .unwrap_or((Op::Eq, t));
    let rest = rest.trim();
    if rest.is_empty() {
        return Err(ConstraintError::EmptyTerm { raw: raw.to_owned() });
    }
    let version = FirmwareVersion::parse(rest).map_err(|source| ConstraintError::BadVersion {
        term: t.to_owned(),
        source,
    })?;
    Ok(Comparator { op, version })
}

/// Catches the common slip of swapped bounds (`> 2, < 1`), which would make
/// a policy silently match nothing.
fn check_satisfiable(raw: &str, all: &[Comparator]) -> Result<(), ConstraintError> {
    let lower = all.iter().filter(|c| matches!(c.op, Op::Gt | Op::Ge | Op::Eq));
    let upper = all.iter().filter(|c| matches!(c.op, Op::Lt | Op::Le | Op::Eq));
    for lo in lower {
        for hi in upper.clone() {
            let ord = if lo.version.is_equivalent(&hi.version) {
                Ordering::Equal
            } else {
                lo.version.cmp(&hi.version)
            };
            let inclusive_both = matches!(lo.op, Op::Ge | Op::Eq) && matches!(hi.op, Op::Le | Op::Eq);
            let empty = match ord {
                Ordering::Greater => true,
                Ordering::Equal => !inclusive_both,
                Ordering::Less => false,
            };
            if empty {
                return Err(ConstraintError::Unsatisfiable { raw: raw.to_owned() });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> FirmwareVersion {
        FirmwareVersion::parse(s).unwrap()
    }

    #[test]
    fn ranges_match_by_precedence() {
        let c = VersionConstraint::parse(">= 96.00.50.00.00, < 96.00.61.00.01").unwrap();
        assert!(c.matches(&v("96.00.50.00.00")));
        assert!(c.matches(&v("96.00.5E.00.01")));
        assert!(c.matches(&v("96.00.61.00.00")));
        assert!(!c.matches(&v("96.00.61.00.01")));
        assert!(!c.matches(&v("96.00.4F.00.00")));
    }

    #[test]
    fn lists_are_any_of_exact_versions() {
        let c = VersionConstraint::parse_any(["96.00.5E.00.01", "= 1.2"]).unwrap();
        assert!(c.matches(&v("96.00.5E.00.01")));
        assert!(c.matches(&v("01.2")), "equivalent spelling matches");
        assert!(c.matches(&v("96.00.5e.00.01")), "hex case does not matter");
        assert!(!c.matches(&v("1.3")));
        assert_eq!(c.to_string(), "= 96.00.5E.00.01 | = 1.2");
    }

    #[test]
    fn every_operator() {
        let cases = [
            ("!= 2", "2", false),
            ("!= 2", "3", true),
            ("> 2", "02", false),
            ("> 2", "2.0", true),
            ("> 2", "2.1", true),
            ("<= 2", "02", true),
            ("< 2", "1.9", true),
            ("== 2", "2", true),
        ];
        for (expr, version, expected) in cases {
            assert_eq!(
                VersionConstraint::parse(expr).unwrap().matches(&v(version)),
                expected,
                "{expr} {version}"
            );
        }
    }

    #[test]
    fn refuses_bad_constraints() {
        assert_eq!(VersionConstraint::parse_any([]).unwrap_err(), ConstraintError::Empty);
        assert!(matches!(
            VersionConstraint::parse(">= 1,"),
            Err(ConstraintError::EmptyTerm { .. })
        ));
        assert!(matches!(
            VersionConstraint::parse(">="),
            Err(ConstraintError::EmptyTerm { .. })
        ));
        assert!(matches!(
            VersionConstraint::parse(">= 1.0!"),
            Err(ConstraintError::BadVersion { .. })
        ));
        assert!(matches!(
            VersionConstraint::parse("> 2, < 1"),
            Err(ConstraintError::Unsatisfiable { .. })
        ));
        assert!(matches!(
            VersionConstraint::parse(">= 2, < 2"),
            Err(ConstraintError::Unsatisfiable { .. })
        ));
        assert!(VersionConstraint::parse(">= 2, <= 2").is_ok());
    }
}
