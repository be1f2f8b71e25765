//! Errors of the scheduler seam.

use std::path::PathBuf;

/// A node name that cannot be passed to a scheduler.
#[derive(Debug, thiserror::Error)]
pub enum NameError {
    /// Empty or too long.
    #[error("scheduler node name {name:?} must be 1 to {max} characters long")]
    Length {
        /// The name (first 80 characters).
        name: String,
        /// The limit.
        max: usize,
    },
    /// Would be read as a command-line option.
    #[error("scheduler node name {name:?} starts with '-'")]
    LeadingDash {
        /// The name (first 80 characters).
        name: String,
    },
    /// Outside `[A-Za-z0-9._-]`.
    #[error("scheduler node name {name:?} contains {character:?}; only letters, digits, '.', '_' and '-' are allowed")]
    Character {
        /// The name (first 80 characters).
        name: String,
        /// The first offending character.
        character: char,
    },
    /// The mapping's result for a Waveguard node is not a valid name.
    #[error("mapping Waveguard node {node:?} to a scheduler node name")]
    Mapped {
        /// The Waveguard node name (first 80 characters).
        node: String,
        /// Why the mapped name was refused.
        #[source]
        source: Box<NameError>,
    },
}

/// Output of a scheduler command that could not be understood.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// Not the JSON document expected.
    #[error("{what}: not the expected JSON")]
    Json {
        /// Which output.
        what: &'static str,
        /// The parser's complaint.
        #[source]
        source: serde_json::Error,
    },
    /// A field is missing or has an unknown value.
    #[error("{what}: {detail}")]
    Field {
        /// Which output.
        what: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// The scheduler reported errors inside an otherwise valid answer.
    #[error("{what}: the scheduler reported errors: {errors}")]
    Reported {
        /// Which output.
        what: &'static str,
        /// Its errors, joined.
        errors: String,
    },
}

/// A scheduler operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    /// The program could not be started.
    #[error("starting {program}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Reading the program's output or waiting for it failed.
    #[error("running {program}")]
    Io {
        /// The program.
        program: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The program ran longer than allowed and was killed.
    #[error("{program} did not finish within {seconds} s and was killed")]
    Timeout {
        /// The program.
        program: PathBuf,
        /// The limit.
        seconds: u64,
    },
    /// The program wrote more than the adapter reads.
    #[error("{program} wrote more than {limit} bytes on {stream}")]
    OutputTooLarge {
        /// The program.
        program: PathBuf,
        /// `stdout` or `stderr`.
        stream: &'static str,
        /// The limit.
        limit: usize,
    },
    /// The program exited unsuccessfully.
    #[error("{program} {action} exited with {status}: {stderr}")]
    Failed {
        /// The program.
        program: PathBuf,
        /// What it was asked to do (`drain n1`).
        action: String,
        /// Exit status as text (`exit status: 1`, `signal: 9`).
        status: String,
        /// The first line(s) of its standard error, bounded.
        stderr: String,
    },
    /// The scheduler does not know the node.
    #[error("the scheduler has no node {node:?}")]
    UnknownNode {
        /// The scheduler's node name.
        node: String,
    },
    /// Its output could not be understood.
    #[error("reading the state of {node:?}")]
    Parse {
        /// The node asked about (or `*` for all).
        node: String,
        /// What was wrong.
        #[source]
        source: ParseError,
    },
    /// After a drain the node does not carry Waveguard's reason.
    #[error("drained {node:?} but it reads back with reason {found:?}, not Waveguard's {expected:?}")]
    DrainNotApplied {
        /// The scheduler's node name.
        node: String,
        /// The reason Waveguard set.
        expected: String,
        /// The reason read back, if any.
        found: Option<String>,
    },
    /// Refused because the configuration is unusable.
    #[error("scheduler configuration: {detail}")]
    Config {
        /// What is wrong.
        detail: String,
    },
}
