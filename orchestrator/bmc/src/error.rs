//! The driver's error type: what went wrong, on which BMC, and whether trying again can help.

use std::time::Duration;

use crate::types::{TaskMessage, TaskState};

/// Longest response-body excerpt kept in an error. Enough to see a Redfish error object or the start
/// of an HTML error page; short enough that a log line stays a line.
pub const BODY_SNIPPET_LIMIT: usize = 512;

/// An error from talking to one BMC.
///
/// `endpoint` is always the BMC's base URL (scheme, host, port), never with credentials: URLs with
/// user info are refused at construction, and response bodies are redacted before they are kept.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BmcError {
    /// Could not connect at all (refused, no route, DNS, TLS handshake), after retries. A bricked BMC
    /// or one in the middle of a manager reset looks like this.
    #[error("BMC {endpoint} is unreachable ({method} {path})")]
    Unreachable {
        /// BMC base URL.
        endpoint: String,
        /// HTTP method of the last attempt.
        method: String,
        /// Path of the last attempt.
        path: String,
        /// The transport error of the last attempt.
        #[source]
        source: reqwest::Error,
    },

    /// The controller itself ran out of something it needs to talk to the BMC (file descriptors,
    /// local ports): the request never left this host, so it says nothing about the BMC. Callers
    /// must not charge it to the node (no attempt spent, no brick timer); they wait on real time
    /// and report the controller degraded instead.
    #[error("controller cannot reach BMC {endpoint} for {method} {path}: {resource} exhausted on this host")]
    ControllerResource {
        /// BMC base URL.
        endpoint: String,
        /// HTTP method.
        method: String,
        /// Request path.
        path: String,
        /// Which local resource ran out ([`ControllerFault::label`]).
        resource: ControllerFault,
        /// The transport error whose source chain carries the OS error.
        #[source]
        source: reqwest::Error,
    },

    /// The TLS handshake failed on certificate verification: the BMC's certificate is not signed by
    /// the configured CA, has the wrong name, or expired. Not retried: it will not fix itself.
    #[error("BMC {endpoint} presented a certificate the configured trust rejects ({method} {path})")]
    CertificateRejected {
        /// BMC base URL.
        endpoint: String,
        /// HTTP method.
        method: String,
        /// Request path.
        path: String,
        /// The transport error, whose chain holds the verifier's reason.
        #[source]
        source: reqwest::Error,
    },

    /// The BMC refused the credentials: 401/403 on login, 403 on a request, or with Basic
    /// authentication 401 twice in a row.
    #[error("BMC {endpoint} rejected the credentials of user {username:?} (HTTP {status})")]
    AuthFailed {
        /// BMC base URL.
        endpoint: String,
        /// The user name (never the password).
        username: String,
        /// 401 or 403.
        status: u16,
    },

    /// The BMC accepted the credentials at login but refused the sessions it issued (401) on each of
    /// several fresh logins (three) for one request. Evidence about the BMC (its
    /// session service), not about the password, and transient: the caller retries later.
    #[error(
        "BMC {endpoint} refused {method} {path} with HTTP 401 on each of {logins} fresh sessions it had just issued"
    )]
    SessionLost {
        /// BMC base URL.
        endpoint: String,
        /// HTTP method.
        method: String,
        /// Request path.
        path: String,
        /// Fresh logins made for this request.
        logins: u32,
    },

    /// A firmware task ended in `Exception`, `Killed` or `Cancelled`.
    #[error("BMC {endpoint} task {task_uri} ended in {state}: {}", summarize(.messages))]
    TaskFailed {
        /// BMC base URL.
        endpoint: String,
        /// The task or task monitor URI.
        task_uri: String,
        /// The terminal state.
        state: TaskState,
        /// The task's registry messages, which say why (e.g. `Update.1.0.VerificationFailed`).
        messages: Vec<TaskMessage>,
    },

    /// The BMC answered, but not with something the driver can use: malformed JSON, a missing
    /// required field, a 202 without a task monitor.
    #[error("BMC {endpoint} sent an unusable response to {method} {path}: {reason}")]
    Protocol {
        /// BMC base URL.
        endpoint: String,
        /// HTTP method.
        method: String,
        /// Request path.
        path: String,
        /// HTTP status, if a response arrived.
        status: Option<u16>,
        /// What was wrong.
        reason: String,
        /// The start of the body, truncated and with credentials and tokens redacted.
        body_snippet: String,
    },

    /// The BMC answered with an error status that retrying will not fix (400, 404, 405, 409, 500...).
    #[error("BMC {endpoint} refused {method} {path} with HTTP {status}{}", message_suffix(.message_ids))]
    Rejected {
        /// BMC base URL.
        endpoint: String,
        /// HTTP method.
        method: String,
        /// Request path.
        path: String,
        /// HTTP status.
        status: u16,
        /// Redfish registry message ids from the error body, if any.
        message_ids: Vec<String>,
        /// The start of the body, truncated and redacted.
        body_snippet: String,
    },

    /// The BMC kept answering 503/429 until the retry budget ran out.
    #[error("BMC {endpoint} stayed unavailable (HTTP {status}) for {method} {path} {}", attempts_phrase(*attempts))]
    Unavailable {
        /// BMC base URL.
        endpoint: String,
        /// HTTP method.
        method: String,
        /// Request path.
        path: String,
        /// The last status (503, 429, 502 or 504).
        status: u16,
        /// The last `Retry-After` the BMC asked for, so the caller can schedule its next try.
        retry_after: Option<Duration>,
        /// How many attempts were made.
        attempts: u32,
    },

    /// No answer within the per-request timeout, on every attempt the budget allowed.
    #[error("BMC {endpoint} did not answer {method} {path} in time {}", attempts_phrase(*attempts))]
    Timeout {
        /// BMC base URL.
        endpoint: String,
        /// HTTP method.
        method: String,
        /// Request path.
        path: String,
        /// How many attempts were made.
        attempts: u32,
    },

    /// A task was still running when the caller's wait ran out. It may yet finish: poll again later.
    #[error("BMC {endpoint} task {task_uri} still {last_state} when the wait ended")]
    TaskTimeout {
        /// BMC base URL.
        endpoint: String,
        /// The task or task monitor URI.
        task_uri: String,
        /// The last state read.
        last_state: String,
    },

    /// A non-idempotent request (update push, reset) was sent but no answer came back, so the BMC may
    /// or may not have acted on it. Deliberately not transient: blindly re-sending an update could
    /// flash a node twice. The caller must look (tasks, inventory) before deciding.
    #[error("outcome of {method} {path} on BMC {endpoint} is unknown: it may have been applied")]
    OutcomeUnknown {
        /// BMC base URL.
        endpoint: String,
        /// HTTP method.
        method: String,
        /// Request path.
        path: String,
        /// The transport error (timeout, connection reset after sending).
        #[source]
        source: reqwest::Error,
    },

    /// The BMC does not offer what was asked (no `MultipartHttpPushUri`, no event log, no manager).
    #[error("BMC {endpoint} does not support {feature}")]
    Unsupported {
        /// BMC base URL.
        endpoint: String,
        /// What is missing.
        feature: String,
    },

    /// A read went past one of the bounds in [`crate::limits`] (bytes, pages, requests or time, per
    /// response or per operation). The BMC is broken or hostile; what was read is discarded.
    #[error("BMC {endpoint}: {operation} went past its {limit} bound ({detail})")]
    ReadLimit {
        /// BMC base URL.
        endpoint: String,
        /// What was being read (`firmware inventory`, `sensors`, `event log`, a request path).
        operation: String,
        /// Which bound: `response_bytes`, `bytes`, `pages`, `requests` or `time`.
        limit: &'static str,
        /// The figures.
        detail: String,
    },

    /// No update path the BMC offers can do this update safely (e.g. a targeted GPU update where the
    /// only path cannot restrict targets). Nothing was sent.
    #[error("BMC {endpoint} offers no update path for this update: {reasons}")]
    NoUpdatePath {
        /// BMC base URL.
        endpoint: String,
        /// One reason per path considered.
        reasons: String,
    },

    /// The controller could not download the image it was to push to the BMC.
    #[error("cannot download image {image_uri} to push to BMC {endpoint}: {reason}")]
    ImageUnavailable {
        /// BMC base URL.
        endpoint: String,
        /// The image URI (never carries credentials: release URIs are refused with user info).
        image_uri: String,
        /// What went wrong.
        reason: String,
    },

    /// The endpoint configuration is unusable (bad URL, unreadable CA bundle...).
    #[error("invalid BMC configuration for {endpoint}: {reason}")]
    Config {
        /// BMC base URL (as configured).
        endpoint: String,
        /// What is wrong.
        reason: String,
        /// The underlying error, if any.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },
}

/// "after 3 attempts", "after 1 attempt"; a refusal made before any request
/// (a busy flag read first) says so instead of counting zero attempts.
fn attempts_phrase(attempts: u32) -> String {
    match attempts {
        0 => "before any attempt".to_owned(),
        1 => "after 1 attempt".to_owned(),
        n => format!("after {n} attempts"),
    }
}

impl BmcError {
    /// Whether the same operation may succeed if the caller tries again later, untouched.
    ///
    /// The engine uses this to tell "requeue this step" from "fail this step". `OutcomeUnknown` is
    /// *not* transient on purpose: see its documentation.
    pub fn is_transient(&self) -> bool {
        match self {
            BmcError::Unreachable { .. }
            | BmcError::Unavailable { .. }
            | BmcError::Timeout { .. }
            | BmcError::TaskTimeout { .. }
            | BmcError::ControllerResource { .. }
            // A BMC that drops fresh sessions (rebooting, evicting) may keep the next one.
            | BmcError::SessionLost { .. }
            // The image server may be back next pass; nothing reached the BMC.
            | BmcError::ImageUnavailable { .. } => true,
            // A slow BMC may be faster next time; one that sends too much will send too much again.
            BmcError::ReadLimit { limit, .. } => *limit == "time",
            // A 500 from a BMC is very often a busy or restarting web server rather than a real fault.
            BmcError::Rejected { status, .. } => matches!(status, 500 | 502 | 504),
            BmcError::AuthFailed { .. }
            | BmcError::CertificateRejected { .. }
            | BmcError::TaskFailed { .. }
            | BmcError::Protocol { .. }
            | BmcError::OutcomeUnknown { .. }
            | BmcError::Unsupported { .. }
            | BmcError::NoUpdatePath { .. }
            | BmcError::Config { .. } => false,
        }
    }

    /// A short stable label for metrics and database columns (`unreachable`, `auth_failed`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            BmcError::Unreachable { .. } => "unreachable",
            BmcError::AuthFailed { .. } => "auth_failed",
            BmcError::SessionLost { .. } => "session_lost",
            BmcError::CertificateRejected { .. } => "certificate_rejected",
            BmcError::TaskFailed { .. } => "task_failed",
            BmcError::Protocol { .. } => "protocol",
            BmcError::Rejected { .. } => "rejected",
            BmcError::Unavailable { .. } => "unavailable",
            BmcError::Timeout { .. } => "timeout",
            BmcError::TaskTimeout { .. } => "task_timeout",
            BmcError::OutcomeUnknown { .. } => "outcome_unknown",
            BmcError::Unsupported { .. } => "unsupported",
            BmcError::Config { .. } => "config",
            BmcError::ReadLimit { .. } => "read_limit",
            BmcError::NoUpdatePath { .. } => "no_update_path",
            BmcError::ImageUnavailable { .. } => "image_unavailable",
            BmcError::ControllerResource { .. } => "controller_resource",
        }
    }

    /// Whether the failure is the controller's own rather than evidence about the BMC: local
    /// resource exhaustion, or the controller's image source failing before anything reached the
    /// BMC. Such an error must never count against the node or its wave.
    pub fn is_controller_fault(&self) -> bool {
        matches!(
            self,
            BmcError::ControllerResource { .. } | BmcError::ImageUnavailable { .. }
        )
    }
}

/// A local resource whose exhaustion makes a request fail before it reaches the BMC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ControllerFault {
    /// EMFILE: this process hit its open-file limit (`ulimit -n`).
    ProcessFileLimit,
    /// ENFILE: the whole host hit its open-file limit.
    SystemFileLimit,
    /// EADDRNOTAVAIL on connect: no free local (ephemeral) port.
    LocalPorts,
    /// ENOBUFS / ENOMEM from the socket layer: the kernel refused buffers to this host.
    SocketBuffers,
}

impl ControllerFault {
    /// A short stable label for logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            ControllerFault::ProcessFileLimit => "process open-file limit (EMFILE)",
            ControllerFault::SystemFileLimit => "system open-file table (ENFILE)",
            ControllerFault::LocalPorts => "local ports (EADDRNOTAVAIL)",
            ControllerFault::SocketBuffers => "socket buffers (ENOBUFS/ENOMEM)",
        }
    }

    /// The fault an OS error number stands for, if it is one of the controller's own. Linux
    /// numbering (the controller's platform); other errors (refused, unreachable, reset) are
    /// about the peer or the network and stay the BMC's.
    pub fn from_raw_os_error(code: i32) -> Option<Self> {
        match code {
            24 => Some(ControllerFault::ProcessFileLimit),
            23 => Some(ControllerFault::SystemFileLimit),
            99 => Some(ControllerFault::LocalPorts),
            105 | 12 => Some(ControllerFault::SocketBuffers),
            _ => None,
        }
    }

    /// Walks an error's source chain (reqwest -> hyper-util -> connector -> `io::Error`) for an OS
    /// error that is the controller's own. `io::Error::source` skips the error it wraps, so a
    /// custom `io::Error` is also looked into through `get_ref`.
    pub fn find_in(err: &(dyn std::error::Error + 'static)) -> Option<Self> {
        let mut current = Some(err);
        // Bounded: a cyclic or absurdly deep chain must not hang the caller.
        for _ in 0..32 {
            let e = current?;
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                if let Some(fault) = io.raw_os_error().and_then(Self::from_raw_os_error) {
                    return Some(fault);
                }
                if let Some(inner) = io.get_ref()
                    && let Some(fault) = Self::find_in(inner)
                {
                    return Some(fault);
                }
            }
            current = e.source();
        }
        None
    }
}

impl std::fmt::Display for ControllerFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

fn summarize(messages: &[TaskMessage]) -> String {
    if messages.is_empty() {
        return "no messages".to_string();
    }
    messages
        .iter()
        .map(|m| match (&m.message_id, &m.message) {
            (Some(id), Some(text)) => format!("{id} ({text})"),
            (Some(id), None) => id.clone(),
            (None, Some(text)) => text.clone(),
            (None, None) => "unnamed message".to_string(),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn message_suffix(ids: &[String]) -> String {
    if ids.is_empty() {
        String::new()
    } else {
        format!(": {}", ids.join(", "))
    }
}

/// Truncates a body for an error, after replacing every known secret and every JSON value under a
/// secret-looking key, so that an echoing or buggy BMC cannot smuggle a password into our logs.
pub(crate) fn redacted_snippet(body: &[u8], secrets: &[&str]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut text = match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(mut value) => {
            redact_json(&mut value);
            value.to_string()
        }
        Err(_) => text.into_owned(),
    };
    for secret in secrets {
        if !secret.is_empty() {
            text = text.replace(secret, "<redacted>");
        }
    }
    if text.len() > BODY_SNIPPET_LIMIT {
        let mut cut = BODY_SNIPPET_LIMIT;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("...");
    }
    text
}

fn redact_json(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                let k = key.to_ascii_lowercase();
                if k.contains("password") || k.contains("token") || k.contains("secret") {
                    *v = serde_json::Value::String("<redacted>".to_string());
                } else {
                    redact_json(v);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(redact_json),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snippet_redacts_known_secrets_and_secret_keys_and_truncates() {
        let body = br#"{"UserName":"root","Password":"pw1","Oem":{"AuthToken":"t0k"},"Note":"echo pw1"}"#;
        let s = redacted_snippet(body, &["pw1"]);
        assert!(!s.contains("pw1"), "{s}");
        assert!(!s.contains("t0k"), "{s}");
        assert!(s.contains("root"), "{s}");

        let long = "é".repeat(1000);
        let s = redacted_snippet(long.as_bytes(), &[]);
        assert!(s.len() <= BODY_SNIPPET_LIMIT + 3);
        assert!(s.ends_with("..."));

        let html = b"<html>secret-pass in page</html>";
        assert_eq!(
            redacted_snippet(html, &["secret-pass"]),
            "<html><redacted> in page</html>"
        );
    }

    #[derive(Debug, thiserror::Error)]
    #[error("connect failed")]
    struct Wrapper(#[source] Box<dyn std::error::Error + Send + Sync>);

    #[test]
    fn controller_faults_are_found_through_the_chain_and_io_wrappers() {
        let direct = std::io::Error::from_raw_os_error(24);
        assert_eq!(
            ControllerFault::find_in(&direct),
            Some(ControllerFault::ProcessFileLimit)
        );
        let wrapped = Wrapper(Box::new(std::io::Error::from_raw_os_error(23)));
        assert_eq!(
            ControllerFault::find_in(&wrapped),
            Some(ControllerFault::SystemFileLimit)
        );
        // A custom io::Error around an OS error: io::Error::source skips it, get_ref does not.
        let custom = std::io::Error::other(std::io::Error::from_raw_os_error(24));
        let wrapped = Wrapper(Box::new(custom));
        assert_eq!(
            ControllerFault::find_in(&wrapped),
            Some(ControllerFault::ProcessFileLimit)
        );
        // The BMC's (or the network's) failures stay the BMC's.
        for code in [111, 113, 104, 110] {
            let e = Wrapper(Box::new(std::io::Error::from_raw_os_error(code)));
            assert_eq!(ControllerFault::find_in(&e), None, "os error {code}");
        }
    }

    #[test]
    fn transient_classification() {
        let e = BmcError::Timeout {
            endpoint: "http://x".into(),
            method: "GET".into(),
            path: "/".into(),
            attempts: 3,
        };
        assert!(e.is_transient());
        let e = BmcError::AuthFailed {
            endpoint: "http://x".into(),
            username: "root".into(),
            status: 401,
        };
        assert!(!e.is_transient());
        assert_eq!(e.kind(), "auth_failed");
        let e = BmcError::TaskFailed {
            endpoint: "http://x".into(),
            task_uri: "/t/1".into(),
            state: TaskState::Exception,
            messages: vec![TaskMessage {
                message_id: Some("Update.1.0.VerificationFailed".into()),
                message: Some("bad checksum".into()),
                message_args: vec![],
                severity: None,
            }],
        };
        assert!(!e.is_transient());
        let text = e.to_string();
        assert!(text.contains("Update.1.0.VerificationFailed (bad checksum)"), "{text}");
    }
}
