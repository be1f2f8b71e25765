//! Turning a node's `bmc_url` and `credential_ref` into a Redfish endpoint,
//! with the secret read from where the configuration says it lives. Beside
//! [`crate::connector`], which builds drivers from these endpoints: `serve`
//! resolves through here for every login, `fleet discover` for every node.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use orchestrator_bmc::{AuthMode, BmcEndpoint, Credentials, TlsTrust};
use orchestrator_db::model::Node;
use serde::Deserialize;
use url::Url;

/// How to reach the BMCs whose nodes name this profile in their
/// `credential_ref`: who to log in as, where the password is, and which
/// certificates to trust. The secret itself is never in the file: only the
/// name of the environment variable or file holding it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialSource {
    /// The user to log in as.
    pub username: String,
    /// Environment variable holding the password.
    pub password_env: Option<String>,
    /// File holding the password (trailing newline ignored).
    pub password_file: Option<PathBuf>,
    /// `session` (default; X-Auth-Token) or `basic`.
    #[serde(default)]
    pub auth: Option<String>,
    /// PEM bundle of the CA(s) that issue these BMCs' certificates.
    pub ca_bundle: Option<PathBuf>,
    /// Skip certificate verification, for lab BMCs with factory
    /// certificates; the value is the reason, kept for audits.
    pub insecure_skip_verify: Option<String>,
    /// The BMC hosts this profile's password may be sent to: host names,
    /// `*.suffix` wildcards, IP addresses or CIDRs (`10.20.0.0/16`). Checked
    /// before every login and request that carries it, so a node whose
    /// address was changed to an attacker's host gets no password.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// The `@odata.id` of the LogService holding GPU events on these BMCs, for a platform whose
    /// layout the driver's standard-based choice gets wrong; unset: the driver chooses (the log of the
    /// system whose Processors include GPUs, preferring the service `EventLog`).
    #[serde(default)]
    pub event_log: Option<String>,
}

/// Why a node's BMC cannot be addressed; recorded as its discovery error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// No profile of that name is configured.
    #[error("credential profile {0:?} is not configured (add [credentials.{0}] to the config file)")]
    UnknownProfile(String),
    /// The profile is configured but unusable (secret unreadable, settings contradict).
    #[error("credential profile {profile:?}: {reason}")]
    BadProfile {
        /// Profile name.
        profile: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The node's BMC URL does not parse.
    #[error("BMC URL {url:?} is not a URL: {reason}")]
    BadUrl {
        /// The URL as stored.
        url: String,
        /// The parser's complaint.
        reason: String,
    },
    /// The profile is bound to other hosts: its password is not sent here.
    #[error(
        "credential profile {profile:?} may not be sent to {host:?} (not in its hosts list, nor among the hosts \
         it was first imported with; an admin can extend it with `waveguard fleet bind-host`)"
    )]
    HostNotAllowed {
        /// Profile name.
        profile: String,
        /// The host refused.
        host: String,
    },
}

/// Why a `hosts` entry does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostPatternError {
    /// Blank.
    #[error("an empty host pattern")]
    Empty,
    /// `address/prefix` whose address is not one.
    #[error("{text:?}: {address:?} is not an IP address")]
    BadAddress {
        /// The pattern.
        text: String,
        /// Its address part.
        address: String,
    },
    /// A prefix length out of range for the address family.
    #[error("{text:?}: the prefix length must be 0..={max}")]
    BadPrefix {
        /// The pattern.
        text: String,
        /// 32 or 128.
        max: u8,
    },
    /// A `*` elsewhere than a leading `*.`.
    #[error("{text:?}: a wildcard is only allowed as a leading \"*.\"")]
    BadWildcard {
        /// The pattern.
        text: String,
    },
}

/// Resolves endpoints for many nodes, reading each profile's secret once.
#[derive(Debug)]
pub struct ProfileResolver<'a> {
    profiles: &'a BTreeMap<String, CredentialSource>,
    resolved: BTreeMap<String, Result<Resolved, AccessError>>,
    /// Hosts each profile was bound to on its first import (the database's
    /// `credential_host_bindings`), used when the configuration lists none.
    learned: BTreeMap<String, Vec<String>>,
}

/// A profile's secret and settings, with the hosts it is bound to.
type Resolved = (Credentials, AuthMode, TlsTrust, Vec<HostPattern>);

impl<'a> ProfileResolver<'a> {
    /// A resolver over the configured profiles.
    pub fn new(profiles: &'a BTreeMap<String, CredentialSource>) -> Self {
        Self {
            profiles,
            resolved: BTreeMap::new(),
            learned: BTreeMap::new(),
        }
    }

    /// Adds the bindings learned on first import (`Db::credential_host_bindings`).
    /// A configured `hosts` list wins; a profile with neither stays unbound.
    pub fn with_learned_bindings(mut self, learned: BTreeMap<String, Vec<String>>) -> Self {
        self.learned = learned;
        self
    }

    /// The endpoint of one node's BMC.
    pub fn endpoint(&mut self, node: &Node) -> Result<BmcEndpoint, AccessError> {
        self.endpoint_for(&node.bmc_url, &node.credential_ref)
    }

    /// The endpoint of the BMC at `bmc_url` reached with profile `credential_ref`.
    pub fn endpoint_for(&mut self, bmc_url: &str, credential_ref: &str) -> Result<BmcEndpoint, AccessError> {
        let profile_name = credential_ref.to_owned();
        let profiles = self.profiles;
        let (credentials, auth, tls, hosts) = self
            .resolved
            .entry(profile_name.clone())
            .or_insert_with(|| resolve_profile(&profile_name, profiles.get(&profile_name)))
            .clone()?;
        let url = Url::parse(bmc_url).map_err(|err| AccessError::BadUrl {
            url: bmc_url.to_owned(),
            reason: err.to_string(),
        })?;
        if hosts.is_empty()
            && let Some(learned) = self.learned.get(&profile_name)
        {
            let learned = learned
                .iter()
                .filter_map(|host| HostPattern::parse(host).ok())
                .collect::<Vec<_>>();
            // A stored binding that no longer parses must not unbind the
            // profile: an empty list here would mean "send anywhere".
            if learned.is_empty() {
                return Err(AccessError::HostNotAllowed {
                    profile: profile_name,
                    host: url.host_str().unwrap_or_default().to_owned(),
                });
            }
            check_host_binding(&profile_name, &learned, &url)?;
        } else {
            check_host_binding(&profile_name, &hosts, &url)?;
        }
        let endpoint = BmcEndpoint::new(url, credentials).with_auth(auth).with_tls(tls);
        Ok(match profiles.get(&profile_name).and_then(|p| p.event_log.clone()) {
            Some(log) => endpoint.with_event_log(log),
            None => endpoint,
        })
    }
}

/// One entry of a profile's `hosts` list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// A host name, compared case-insensitively.
    Exact(String),
    /// `*.example.com`: any host ending in `.example.com` (not the apex).
    Suffix(String),
    /// An address range; a single address is a full-length prefix.
    Cidr {
        /// The network address.
        network: IpAddr,
        /// Bits of `network` that must match.
        prefix: u8,
    },
}

impl HostPattern {
    /// Parses `name`, `*.suffix`, an IP address or `address/prefix`.
    pub fn parse(text: &str) -> Result<Self, HostPatternError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(HostPatternError::Empty);
        }
        let wildcard = || HostPatternError::BadWildcard { text: text.to_owned() };
        if let Some((address, prefix)) = text.split_once('/') {
            let network: IpAddr = address.parse().map_err(|_| HostPatternError::BadAddress {
                text: text.to_owned(),
                address: address.to_owned(),
            })?;
            let max = if network.is_ipv4() { 32 } else { 128 };
            let prefix: u8 = prefix
                .parse()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| HostPatternError::BadPrefix {
                    text: text.to_owned(),
                    max,
                })?;
            return Ok(HostPattern::Cidr { network, prefix });
        }
        if let Ok(network) = text.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            let prefix = if network.is_ipv4() { 32 } else { 128 };
            return Ok(HostPattern::Cidr { network, prefix });
        }
        let lower = text.to_ascii_lowercase();
        if let Some(suffix) = lower.strip_prefix("*.") {
            if suffix.is_empty() || suffix.contains('*') {
                return Err(wildcard());
            }
            return Ok(HostPattern::Suffix(format!(".{suffix}")));
        }
        if lower.contains('*') {
            return Err(wildcard());
        }
        Ok(HostPattern::Exact(lower))
    }

    /// Whether `host` (as the URL parser gives it) falls under this pattern.
    /// A host name never matches an address range: the name could resolve
    /// anywhere, and binding by range means trusting the address alone.
    pub fn matches(&self, host: &url::Host<&str>) -> bool {
        match (self, host) {
            (HostPattern::Exact(name), url::Host::Domain(domain)) => domain.eq_ignore_ascii_case(name),
            (HostPattern::Suffix(suffix), url::Host::Domain(domain)) => {
                domain.len() > suffix.len() && domain.to_ascii_lowercase().ends_with(suffix.as_str())
            }
            (HostPattern::Cidr { network, prefix }, url::Host::Ipv4(ip)) => {
                in_range(IpAddr::V4(*ip), *network, *prefix)
            }
            (HostPattern::Cidr { network, prefix }, url::Host::Ipv6(ip)) => {
                in_range(IpAddr::V6(*ip), *network, *prefix)
            }
            _ => false,
        }
    }
}

fn in_range(ip: IpAddr, network: IpAddr, prefix: u8) -> bool {
    match (ip, network) {
        (IpAddr::V4(ip), IpAddr::V4(net)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(ip) & mask == u32::from(net) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(net)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(ip) & mask == u128::from(net) & mask
        }
        _ => false,
    }
}

/// The host check made before a profile's password leaves the controller:
/// a bound profile is sent only to a host its `hosts` list allows. The
/// engine's connector reaches it through [`ProfileResolver::endpoint_for`], so
/// every login and every request carrying the credentials passes here.
/// A profile with an empty list is unbound (configurations written before
/// the list existed); SECURITY.md says why that is the operator's choice.
pub fn check_host_binding(profile: &str, hosts: &[HostPattern], url: &Url) -> Result<(), AccessError> {
    if hosts.is_empty() {
        return Ok(());
    }
    let refused = || AccessError::HostNotAllowed {
        profile: profile.to_owned(),
        host: url.host_str().unwrap_or_default().to_owned(),
    };
    let host = url.host().ok_or_else(refused)?;
    if hosts.iter().any(|pattern| pattern.matches(&host)) {
        Ok(())
    } else {
        Err(refused())
    }
}

fn resolve_profile(name: &str, source: Option<&CredentialSource>) -> Result<Resolved, AccessError> {
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
    if let Some(log) = &source.event_log
        && !log.starts_with("/redfish/")
    {
        return Err(bad(format!(
            "event_log {log:?} must be a LogService's @odata.id (/redfish/v1/...)"
        )));
    }
    let hosts = source
        .hosts
        .iter()
        .map(|text| HostPattern::parse(text).map_err(|reason| bad(format!("hosts: {reason}"))))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((Credentials::new(source.username.clone(), password), auth, tls, hosts))
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
            hosts: Vec::new(),
            event_log: None,
        }
    }

    /// A profile may name the LogService holding GPU events; the endpoint carries it to the driver,
    /// and a value that is no Redfish path is refused with the profile's name.
    #[test]
    fn a_profile_names_the_gpu_event_log() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "pw").unwrap();
        let mut dgx = source(None);
        dgx.password_file = Some(file);
        dgx.hosts = vec!["10.20.0.0/16".into()];
        dgx.event_log = Some("/redfish/v1/Systems/HGX_Baseboard_0/LogServices/EventLog".into());
        let profiles = BTreeMap::from([("dgx".to_owned(), dgx.clone())]);
        let endpoint = ProfileResolver::new(&profiles)
            .endpoint_for("https://10.20.3.4", "dgx")
            .unwrap();
        assert_eq!(endpoint.event_log, dgx.event_log);
        dgx.event_log = Some("EventLog".into());
        let err = resolve_profile("dgx", Some(&dgx)).unwrap_err();
        assert!(
            err.to_string().contains("credential profile \"dgx\": event_log"),
            "{err}"
        );
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
        let (credentials, auth, tls, _) = resolve_profile("lab", Some(&from_file)).unwrap();
        assert_eq!(auth, AuthMode::Session);
        assert!(matches!(tls, TlsTrust::InsecureSkipVerify { .. }));
        assert!(
            !format!("{credentials:?}").contains("s3cret"),
            "the password never prints"
        );
    }

    /// Issue 24 #1: a release manager points a node at their own host; the
    /// profile bound to the lab's range refuses to send the password there,
    /// and the refusal happens in `endpoint`, before any connection.
    #[test]
    fn a_bound_profile_is_never_resolved_for_another_host() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "fleet-secret").unwrap();
        let mut lab = source(None);
        lab.password_file = Some(file);
        lab.hosts = vec![
            "10.20.0.0/16".into(),
            "*.bmc.lab.example".into(),
            "bmc-0.lab.example".into(),
        ];
        let profiles = BTreeMap::from([("lab".to_owned(), lab)]);
        let mut resolver = ProfileResolver::new(&profiles);
        for allowed in [
            "https://10.20.3.4",
            "https://10.20.255.1:8443/redfish/v1",
            "https://node7.BMC.lab.example",
            "https://bmc-0.lab.example",
        ] {
            assert!(resolver.endpoint_for(allowed, "lab").is_ok(), "{allowed}");
        }
        for refused in [
            "https://10.21.0.1",
            "https://attacker.example",
            "https://bmc.lab.example",
            "https://evil-bmc.lab.example.attacker.example",
            "https://[::1]",
        ] {
            let err = resolver.endpoint_for(refused, "lab").unwrap_err();
            assert!(matches!(err, AccessError::HostNotAllowed { .. }), "{refused}: {err}");
            assert!(!err.to_string().contains("fleet-secret"));
        }
    }

    /// Issue 24 #1, unbound profiles: the hosts learned on first import bind
    /// a profile whose configuration lists none, and an extension admits
    /// the new host.
    #[test]
    fn an_unlisted_profile_is_bound_to_the_hosts_it_was_first_imported_with() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "fleet-secret").unwrap();
        let mut lab = source(None);
        lab.password_file = Some(file);
        let profiles = BTreeMap::from([("lab".to_owned(), lab)]);
        let learned =
            |hosts: &[&str]| BTreeMap::from([("lab".to_owned(), hosts.iter().map(|h| h.to_string()).collect())]);
        let mut resolver = ProfileResolver::new(&profiles).with_learned_bindings(learned(&["10.0.0.1", "bmc-a.lab"]));
        assert!(resolver.endpoint_for("https://10.0.0.1", "lab").is_ok());
        assert!(resolver.endpoint_for("https://BMC-A.lab:8443", "lab").is_ok());
        let err = resolver.endpoint_for("https://10.0.0.2", "lab").unwrap_err();
        assert!(matches!(err, AccessError::HostNotAllowed { .. }), "{err}");
        let mut extended =
            ProfileResolver::new(&profiles).with_learned_bindings(learned(&["10.0.0.1", "bmc-a.lab", "10.0.0.2"]));
        assert!(extended.endpoint_for("https://10.0.0.2", "lab").is_ok());
        // A corrupt stored binding refuses rather than unbinding.
        let mut corrupt = ProfileResolver::new(&profiles).with_learned_bindings(learned(&["bad*host"]));
        assert!(corrupt.endpoint_for("https://10.0.0.1", "lab").is_err());
        // With no binding at all (a profile never imported) it stays unbound.
        let mut unbound = ProfileResolver::new(&profiles);
        assert!(unbound.endpoint_for("https://10.9.9.9", "lab").is_ok());
    }

    #[test]
    fn host_patterns_parse_or_say_why_not() {
        let check = |text: &str, expected: Result<HostPattern, ()>| {
            assert_eq!(HostPattern::parse(text).map_err(|_| ()), expected, "{text}");
        };
        check(
            "10.0.0.0/8",
            Ok(HostPattern::Cidr {
                network: "10.0.0.0".parse().unwrap(),
                prefix: 8,
            }),
        );
        check(
            "fd00::/8",
            Ok(HostPattern::Cidr {
                network: "fd00::".parse().unwrap(),
                prefix: 8,
            }),
        );
        check(
            "192.0.2.7",
            Ok(HostPattern::Cidr {
                network: "192.0.2.7".parse().unwrap(),
                prefix: 32,
            }),
        );
        check("*.Lab.example", Ok(HostPattern::Suffix(".lab.example".into())));
        check("BMC-1", Ok(HostPattern::Exact("bmc-1".into())));
        check("10.0.0.0/33", Err(()));
        check("bmc-*.lab", Err(()));
        check("*.", Err(()));
        check("", Err(()));
        check(
            "0.0.0.0/0",
            Ok(HostPattern::Cidr {
                network: "0.0.0.0".parse().unwrap(),
                prefix: 0,
            }),
        );
        assert!(
            HostPattern::parse("0.0.0.0/0")
                .unwrap()
                .matches(&url::Host::Ipv4("203.0.113.9".parse().unwrap()))
        );
    }
}
