//! Turning a node's `bmc_url` and `credential_ref` into a Redfish endpoint,
//! with the secret read from where the configuration says it lives.

use std::collections::BTreeMap;

use orchestrator_bmc::{AuthMode, BmcEndpoint, Credentials, TlsTrust};
use orchestrator_db::model::Node;
use url::Url;

use crate::config::CredentialSource;

/// Why a node's BMC cannot be addressed; recorded as its discovery error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    #[error("credential profile {0:?} is not configured (add [credentials.{0}] to the config file)")]
    UnknownProfile(String),
    #[error("credential profile {profile:?}: {reason}")]
    BadProfile { profile: String, reason: String },
    #[error("BMC URL {url:?} is not a URL: {reason}")]
    BadUrl { url: String, reason: String },
}

/// Resolves endpoints for many nodes, reading each profile's secret once.
#[derive(Debug)]
pub struct EndpointResolver<'a> {
    profiles: &'a BTreeMap<String, CredentialSource>,
    resolved: BTreeMap<String, Result<(Credentials, AuthMode, TlsTrust), AccessError>>,
}

impl<'a> EndpointResolver<'a> {
    /// A resolver over the configured profiles.
    pub fn new(profiles: &'a BTreeMap<String, CredentialSource>) -> Self {
        Self {
            profiles,
            resolved: BTreeMap::new(),
        }
    }

    /// The endpoint of one node's BMC.
    pub fn endpoint(&mut self, node: &Node) -> Result<BmcEndpoint, AccessError> {
        let profile_name = node.credential_ref.clone();
        let profiles = self.profiles;
        let (credentials, auth, tls) = self
            .resolved
            .entry(profile_name.clone())
            .or_insert_with(|| resolve_profile(&profile_name, profiles.get(&profile_name)))
            .clone()?;
        let url = Url::parse(&node.bmc_url).map_err(|err| AccessError::BadUrl {
            url: node.bmc_url.clone(),
            reason: err.to_string(),
        })?;
        Ok(BmcEndpoint::new(url, credentials).with_auth(auth).with_tls(tls))
    }
}

/// A node record carrying only what endpoint resolution reads, for callers
/// (the engine) that know a node by its BMC URL and credential reference.
pub fn node_for_access(bmc_url: &str, credential_ref: &str) -> Node {
    let epoch = chrono::DateTime::<chrono::Utc>::UNIX_EPOCH;
    Node {
        id: orchestrator_types::NodeId(0),
        name: String::new(),
        bmc_url: bmc_url.to_owned(),
        credential_ref: credential_ref.to_owned(),
        platform_sku: String::new(),
        labels: orchestrator_db::model::NodeLabels {
            region: String::new(),
            cluster: String::new(),
            rack: String::new(),
            nvlink_domain: String::new(),
        },
        state: orchestrator_types::NodeState::Active,
        state_reason: None,
        last_discovered_at: None,
        last_discovery_error: None,
        created_at: epoch,
        updated_at: epoch,
    }
}

fn resolve_profile(
    name: &str,
    source: Option<&CredentialSource>,
) -> Result<(Credentials, AuthMode, TlsTrust), AccessError> {
    let source = source.ok_or_else(|| AccessError::UnknownProfile(name.to_owned()))?;
    let bad = |reason: String| AccessError::BadProfile {
        profile: name.to_owned(),
        reason,
    };
    let password = match (&source.password_env, &source.password_file) {
        (Some(var), None) => std::env::var(var).map_err(|_| bad(format!("environment variable {var} is not set")))?,
        (None, Some(path)) => std::fs::read_to_string(path)
            .map_err(|err| bad(format!("cannot read password file {}: {err}", path.display())))?
            .trim_end_matches(['\n', '\r'])
            .to_owned(),
        (Some(_), Some(_)) => return Err(bad("set password_env or password_file, not both".into())),
        (None, None) => return Err(bad("set password_env or password_file".into())),
    };
    let auth = match source.auth.as_deref() {
        None | Some("session") => AuthMode::Session,
        Some("basic") => AuthMode::Basic,
        Some(other) => return Err(bad(format!("auth {other:?} is not session or basic"))),
    };
    let tls = match (&source.ca_bundle, &source.insecure_skip_verify) {
        (Some(path), None) => TlsTrust::CaBundle { path: path.clone() },
        (None, Some(reason)) if !reason.trim().is_empty() => TlsTrust::InsecureSkipVerify { reason: reason.clone() },
        (None, Some(_)) => return Err(bad("insecure_skip_verify needs a reason".into())),
        (None, None) => TlsTrust::System,
        (Some(_), Some(_)) => return Err(bad("set ca_bundle or insecure_skip_verify, not both".into())),
    };
    Ok((Credentials::new(source.username.clone(), password), auth, tls))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(password_env: Option<&str>) -> CredentialSource {
        CredentialSource {
            username: "admin".into(),
            password_env: password_env.map(str::to_owned),
            password_file: None,
            auth: None,
            ca_bundle: None,
            insecure_skip_verify: None,
        }
    }

    #[test]
    fn profiles_resolve_or_say_what_is_missing() {
        assert_eq!(
            resolve_profile("lab", None).unwrap_err(),
            AccessError::UnknownProfile("lab".into())
        );
        let err = resolve_profile("lab", Some(&source(Some("WAVEGUARD_TEST_SURELY_UNSET_VAR")))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "credential profile \"lab\": environment variable WAVEGUARD_TEST_SURELY_UNSET_VAR is not set"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "s3cret\n").unwrap();
        let mut from_file = source(None);
        from_file.password_file = Some(file);
        from_file.insecure_skip_verify = Some("lab rack 12".into());
        let (credentials, auth, tls) = resolve_profile("lab", Some(&from_file)).unwrap();
        assert_eq!(auth, AuthMode::Session);
        assert!(matches!(tls, TlsTrust::InsecureSkipVerify { .. }));
        assert!(
            !format!("{credentials:?}").contains("s3cret"),
            "the password never prints"
        );
    }
}
