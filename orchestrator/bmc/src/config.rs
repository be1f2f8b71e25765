//! How to reach one BMC: address, credentials, TLS trust, timeouts and retry budget.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use url::Url;

/// A BMC user name and password.
///
/// `Debug` and `Display` never show the password: these values end up in log lines and error chains
/// constantly, and a BMC password opens the whole machine.
#[derive(Clone)]
pub struct Credentials {
    username: String,
    password: SecretString,
}

impl Credentials {
    /// Creates credentials; the password is moved into a zeroize-on-drop secret.
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Self {
        Self {
            username: username.into(),
            password: SecretString::from(password.into()),
        }
    }

    /// The user name (not secret: it appears in audit logs on the BMC too).
    pub fn username(&self) -> &str {
        &self.username
    }

    /// The password, for the two places that must send it (session login, Basic header).
    pub(crate) fn password(&self) -> &str {
        self.password.expose_secret()
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl fmt::Display for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:<redacted>", self.username)
    }
}

/// How the driver authenticates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthMode {
    /// Redfish session (`POST /SessionService/Sessions`, then `X-Auth-Token`). The default: BMCs
    /// rate-limit and audit-log every Basic authentication, and sessions are cheaper for them.
    #[default]
    Session,
    /// HTTP Basic on every request, for BMCs whose session service is broken or absent.
    Basic,
}

/// Which certificates the driver trusts for an `https` BMC.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum TlsTrust {
    /// The operating system's trust store.
    #[default]
    System,
    /// Only the CAs in this PEM bundle: the usual production setup, where BMC certificates are issued
    /// by a private fleet CA that must not be mixed with public roots.
    CaBundle {
        /// Path to a PEM file with one or more CA certificates.
        path: PathBuf,
    },
    /// No verification at all. Only for lab BMCs with factory self-signed certificates; it must be
    /// chosen explicitly per node, and the reason is kept so an audit can find every such node.
    InsecureSkipVerify {
        /// Why this node is exempt (e.g. "lab rack 12, factory certificate").
        reason: String,
    },
}

/// Per-request and per-operation time limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeouts {
    /// TCP + TLS connect limit for one attempt.
    pub connect: Duration,
    /// Whole-request limit for one attempt (headers and body).
    pub request: Duration,
    /// Limit for one attempt of an image upload, which moves far more bytes than anything else.
    pub upload: Duration,
    /// Limit for the liveness probe, which must stay cheap even across thousands of nodes.
    pub probe: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(5),
            // Real BMCs take several seconds for large collections; 30 s matches the redfish crate.
            request: Duration::from_secs(30),
            upload: Duration::from_secs(600),
            probe: Duration::from_secs(5),
        }
    }
}

/// Retry budget for transient failures (503, 429, timeouts, refused connections).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Attempts after the first one.
    pub max_retries: u32,
    /// Backoff before the first retry; doubles each retry.
    pub base_delay: Duration,
    /// Cap on a single backoff.
    pub max_delay: Duration,
    /// Cap on a server's `Retry-After`, so one misconfigured BMC cannot park a worker for an hour.
    pub max_retry_after: Duration,
    /// Total time an operation may spend on attempts and waits together.
    pub deadline: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 5,
            base_delay: Duration::from_millis(250),
            max_delay: Duration::from_secs(10),
            max_retry_after: Duration::from_secs(60),
            deadline: Duration::from_secs(120),
        }
    }
}

impl RetryPolicy {
    /// A policy that never retries (useful for probes and for tests of the first attempt).
    pub fn no_retries() -> Self {
        Self {
            max_retries: 0,
            ..Self::default()
        }
    }
}

/// Everything needed to talk to one BMC.
#[derive(Debug, Clone)]
pub struct BmcEndpoint {
    /// Scheme, host and port, e.g. `https://10.1.2.3` (any path is ignored: Redfish lives at `/redfish/v1`).
    pub base_url: Url,
    /// Login credentials.
    pub credentials: Credentials,
    /// Session or Basic authentication.
    pub auth: AuthMode,
    /// Certificate trust for `https`.
    pub tls: TlsTrust,
    /// Time limits.
    pub timeouts: Timeouts,
    /// Retry budget.
    pub retry: RetryPolicy,
    /// The `@odata.id` of the LogService holding GPU events, when the site names it (a platform whose
    /// layout the standard-based choice gets wrong); `None`: chosen by the driver (see
    /// `RedfishBmc`'s event-log discovery).
    pub event_log: Option<String>,
}

impl BmcEndpoint {
    /// An endpoint with default auth (session), trust (system), timeouts and retries.
    pub fn new(base_url: Url, credentials: Credentials) -> Self {
        Self {
            base_url,
            credentials,
            auth: AuthMode::default(),
            tls: TlsTrust::default(),
            timeouts: Timeouts::default(),
            retry: RetryPolicy::default(),
            event_log: None,
        }
    }

    /// Names the LogService that holds GPU events (its `@odata.id`, or its `Entries` collection).
    pub fn with_event_log(mut self, log_service: impl Into<String>) -> Self {
        self.event_log = Some(log_service.into());
        self
    }

    /// Sets the authentication mode.
    pub fn with_auth(mut self, auth: AuthMode) -> Self {
        self.auth = auth;
        self
    }

    /// Sets the TLS trust.
    pub fn with_tls(mut self, tls: TlsTrust) -> Self {
        self.tls = tls;
        self
    }

    /// Sets the time limits.
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = timeouts;
        self
    }

    /// Sets the retry budget.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_print_the_password() {
        let c = Credentials::new("root", "hunter2-very-secret");
        let endpoint = BmcEndpoint::new(Url::parse("https://10.0.0.1").unwrap(), c.clone());
        for text in [
            format!("{c:?}"),
            format!("{c}"),
            format!("{endpoint:?}"),
            format!("{endpoint:#?}"),
        ] {
            assert!(!text.contains("hunter2"), "password leaked: {text}");
            assert!(text.contains("root"), "username should stay visible: {text}");
        }
        assert_eq!(c.password(), "hunter2-very-secret");
    }
}
