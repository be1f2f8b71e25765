//! Platform profiles: what one vendor's Redfish service looks like, as data files in
//! `bmc-sim/profiles/*.yaml` (format in `bmc-sim/README.md`, "Platform profiles").
//!
//! A profile names the inventory layout (component ids and kinds) and how the UpdateService behaves:
//! which update paths exist, how they are described (ActionInfo or inline annotations), which apply
//! times they take, and how an accepted update answers (DMTF task monitor, the task itself, or no
//! task). A scenario picks one with `platform: <name>`; its own `fleet.components` and
//! `update_service` override the profile's.

use serde::Deserialize;

/// The profile format this build reads. A file with another `profile_version` is refused rather
/// than half-understood.
pub const PROFILE_FORMAT_VERSION: u32 = 1;

/// The built-in profiles, embedded so the binary needs no data directory.
const BUILT_IN: &[(&str, &str)] = &[
    ("generic-dmtf", include_str!("../profiles/generic-dmtf.yaml")),
    ("hgx-h100", include_str!("../profiles/hgx-h100.yaml")),
    ("gb200", include_str!("../profiles/gb200.yaml")),
    ("dell", include_str!("../profiles/dell.yaml")),
    // An assumed layout (AWS publishes none): see the file's header.
    ("trn2", include_str!("../profiles/trn2.yaml")),
];

/// Names of the built-in profiles.
pub fn built_in_names() -> Vec<&'static str> {
    BUILT_IN.iter().map(|(n, _)| *n).collect()
}

/// How an accepted update answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AcceptedAs {
    /// 202 with `Location` of a task monitor (202 while running), the Task in the body (DMTF).
    #[default]
    TaskMonitor,
    /// 202 with `Location` of the Task itself (many vendors).
    Task,
    /// 204 and nothing to poll: the client watches the inventory.
    NoTask,
}

/// Where a SimpleUpdate's parameters are described.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DescribedBy {
    /// Annotations on the action object (`TransferProtocol@Redfish.AllowableValues`, ...).
    #[default]
    Inline,
    /// An `@Redfish.ActionInfo` resource listing the parameters.
    ActionInfo,
}

/// `UpdateService.SimpleUpdate` as the platform offers it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimpleUpdateProfile {
    /// Whether `Targets` is a parameter (a request with it is refused 400 otherwise).
    #[serde(default = "yes")]
    pub accepts_targets: bool,
    /// Allowable `TransferProtocol` values.
    #[serde(default = "http_protocols")]
    pub transfer_protocols: Vec<String>,
    /// Whether a request without `TransferProtocol` is refused.
    #[serde(default)]
    pub protocol_required: bool,
    /// How the parameters are advertised.
    #[serde(default)]
    pub described_by: DescribedBy,
    /// Supported `@Redfish.OperationApplyTime` values; empty: not advertised, both accepted.
    #[serde(default)]
    pub apply_times: Vec<String>,
}

/// A push URI as the platform offers it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushProfile {
    /// Supported apply times; empty: not advertised, both accepted.
    #[serde(default)]
    pub apply_times: Vec<String>,
}

/// `HttpPushUri` as the platform offers it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpPushProfile {
    /// Whether the UpdateService has the `HttpPushUriTargets` setting.
    #[serde(default = "yes")]
    pub targets_settable: bool,
}

/// The UpdateService of a platform.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateServiceProfile {
    /// `SimpleUpdate`, if offered.
    #[serde(default)]
    pub simple_update: Option<SimpleUpdateProfile>,
    /// `MultipartHttpPushUri`, if offered.
    #[serde(default)]
    pub multipart: Option<PushProfile>,
    /// `HttpPushUri`, if offered.
    #[serde(default)]
    pub http_push: Option<HttpPushProfile>,
    /// How accepted updates answer.
    #[serde(default)]
    pub accepted: AcceptedAs,
}

impl Default for UpdateServiceProfile {
    /// What bmc-sim offered before profiles existed: SimpleUpdate with targets, multipart push.
    fn default() -> Self {
        Self {
            simple_update: Some(SimpleUpdateProfile {
                accepts_targets: true,
                transfer_protocols: http_protocols(),
                protocol_required: false,
                described_by: DescribedBy::Inline,
                apply_times: Vec::new(),
            }),
            multipart: Some(PushProfile::default()),
            http_push: None,
            accepted: AcceptedAs::TaskMonitor,
        }
    }
}

fn yes() -> bool {
    true
}

fn http_protocols() -> Vec<String> {
    vec!["HTTP".to_owned(), "HTTPS".to_owned()]
}

/// A profile file as written. Components stay raw here; the scenario validates them like its own.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawProfile {
    pub profile_version: u32,
    pub name: String,
    /// For readers of the file only.
    #[serde(default, rename = "description")]
    pub _description: String,
    #[serde(default)]
    pub components: Vec<crate::scenario::RawComponent>,
    #[serde(default)]
    pub update_service: Option<UpdateServiceProfile>,
}

/// The built-in profile `name`, parsed; the error says what is wrong.
pub(crate) fn built_in(name: &str) -> Result<RawProfile, String> {
    let (_, text) = BUILT_IN
        .iter()
        .find(|(n, _)| *n == name)
        .ok_or_else(|| format!("unknown platform `{name}` (built in: {})", built_in_names().join(", ")))?;
    let profile: RawProfile =
        serde_saphyr::from_str(text).map_err(|e| format!("profile `{name}` does not parse: {e}"))?;
    if profile.profile_version != PROFILE_FORMAT_VERSION {
        return Err(format!(
            "profile `{name}` has profile_version {}, this bmc-sim reads {PROFILE_FORMAT_VERSION}",
            profile.profile_version
        ));
    }
    if profile.name != name {
        return Err(format!("profile file for `{name}` names itself `{}`", profile.name));
    }
    Ok(profile)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_built_in_profile_parses_and_names_itself() {
        for name in built_in_names() {
            let p = built_in(name).unwrap_or_else(|e| panic!("{e}"));
            assert!(!p.components.is_empty(), "{name}");
            assert!(p.update_service.is_some(), "{name}");
        }
        assert!(built_in("nope").unwrap_err().contains("hgx-h100"));
    }

    #[test]
    fn hgx_h100_simple_update_cannot_target_and_gb200_is_push_only() {
        let hgx = built_in("hgx-h100").unwrap().update_service.unwrap();
        assert!(!hgx.simple_update.unwrap().accepts_targets);
        let gb = built_in("gb200").unwrap().update_service.unwrap();
        assert!(gb.simple_update.is_none());
        assert_eq!(gb.multipart.unwrap().apply_times, vec!["Immediate".to_string()]);
    }

    #[test]
    fn trn2_is_labelled_an_assumption_and_lists_sixteen_accelerators() {
        let text = BUILT_IN.iter().find(|(n, _)| *n == "trn2").unwrap().1;
        assert!(
            text.starts_with("# ASSUMPTION"),
            "the header must say the layout is assumed"
        );
        let yaml = "seed: 1\nplatform: trn2\nfleet:\n  nodes: 4\n  racks: 1\n  clusters: 1\n  region: r\n  \
                    sku: trn2\n  nodes_per_nvlink_domain: 4\n";
        let scenario = crate::Scenario::from_yaml_str(yaml).unwrap();
        let chips: Vec<&str> = scenario
            .fleet
            .components
            .iter()
            .filter(|c| c.kind == orchestrator_types::ComponentKind::Gpu)
            .map(|c| c.id.as_str())
            .collect();
        assert_eq!(chips.len(), 16, "{chips:?}");
        assert_eq!(chips[0], "NeuronDevice_0");
        assert_eq!(chips[15], "NeuronDevice_15");
    }
}
