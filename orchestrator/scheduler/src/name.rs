//! Scheduler node names and the mapping from a Waveguard node to one.
//!
//! A name ends up as an argument of `scontrol` (or of an operator's own
//! command), so it is validated once here: Slurm reads `NodeName=a,b` or
//! `NodeName=n[1-9]` as several nodes, and a stray space or `=` would let a
//! name smuggle in another `scontrol` keyword. Only hostname characters pass.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

use crate::error::NameError;

/// Longest accepted scheduler node name (a DNS label is 63; FQDNs are longer).
pub const MAX_NODE_NAME_LEN: usize = 253;

/// A node name as the scheduler knows it, safe to pass as one argument.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SchedulerNodeName(String);

impl SchedulerNodeName {
    /// Checks `name`: 1..=253 characters of `[A-Za-z0-9._-]`, not starting
    /// with `-` (an argument starting with `-` is read as an option).
    pub fn new(name: &str) -> Result<Self, NameError> {
        if name.is_empty() || name.len() > MAX_NODE_NAME_LEN {
            return Err(NameError::Length {
                name: truncate(name),
                max: MAX_NODE_NAME_LEN,
            });
        }
        if name.starts_with('-') {
            return Err(NameError::LeadingDash { name: truncate(name) });
        }
        if let Some(bad) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(NameError::Character {
                name: truncate(name),
                character: bad,
            });
        }
        Ok(Self(name.to_owned()))
    }

    /// The name as the scheduler spells it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SchedulerNodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Error messages quote the offending name; a hostile one stays short.
fn truncate(name: &str) -> String {
    name.chars().take(80).collect()
}

/// How a Waveguard node name becomes the scheduler's node name.
///
/// Fleets rarely agree: the BMC inventory says `gpu-r12-u07.dc1.example`
/// while Slurm knows `r12u07`. Explicit entries win; otherwise `template`
/// is applied, where `{node}` is the Waveguard name and `{short}` the part
/// before its first dot.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NameMapping {
    /// Template for nodes without an explicit entry (default `{node}`).
    pub template: String,
    /// Waveguard name -> scheduler name, for the exceptions.
    pub explicit: BTreeMap<String, String>,
}

impl Default for NameMapping {
    fn default() -> Self {
        Self {
            template: "{node}".to_owned(),
            explicit: BTreeMap::new(),
        }
    }
}

impl NameMapping {
    /// A mapping that applies `template` to every node.
    pub fn with_template(template: &str) -> Self {
        Self {
            template: template.to_owned(),
            explicit: BTreeMap::new(),
        }
    }

    /// The scheduler's name for the Waveguard node `node`.
    pub fn map(&self, node: &str) -> Result<SchedulerNodeName, NameError> {
        if let Some(name) = self.explicit.get(node) {
            return SchedulerNodeName::new(name);
        }
        let short = node.split('.').next().unwrap_or(node);
        let mapped = self.template.replace("{node}", node).replace("{short}", short);
        SchedulerNodeName::new(&mapped).map_err(|source| NameError::Mapped {
            node: truncate(node),
            source: Box::new(source),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_scontrol_would_read_as_something_else_are_refused() {
        for bad in [
            "",
            "n1,n2",
            "n[1-4]",
            "n1 State=RESUME",
            "-h",
            "n1\n",
            "n=1",
            "ß",
            &"a".repeat(254),
        ] {
            assert!(SchedulerNodeName::new(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["n1", "gpu-r12-u07.dc1.example", "node_7", &"a".repeat(253)] {
            assert!(SchedulerNodeName::new(good).is_ok(), "{good:?} refused");
        }
    }

    #[test]
    fn explicit_entries_win_over_the_template() {
        let mut mapping = NameMapping::with_template("{short}");
        mapping.explicit.insert("odd.dc1".into(), "r12u07".into());
        let map = |n: &str| mapping.map(n).map(|m| m.to_string());
        assert_eq!(map("gpu-1.dc1.example").unwrap(), "gpu-1");
        assert_eq!(map("gpu-2").unwrap(), "gpu-2");
        assert_eq!(map("odd.dc1").unwrap(), "r12u07");
        assert!(NameMapping::with_template("slurm-{node}").map("a b").is_err());
        assert_eq!(
            NameMapping::default().map("x.y").unwrap().as_str(),
            "x.y",
            "the default template keeps the name"
        );
    }
}
