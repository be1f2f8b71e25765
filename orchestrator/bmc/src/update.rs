//! Which update path a BMC offers, and which one an update takes.
//!
//! Real BMCs differ: the DGX H100 offers `SimpleUpdate` without `Targets`, GB200/GH200 offer only
//! `MultipartHttpPushUri` (apply time `Immediate` only) and `HttpPushUri`, Dell puts allowable values
//! inline on the action. [`UpdateCapabilities`] is what the driver read from the service's own links
//! (the action object, its `@Redfish.ActionInfo`, inline annotations); [`choose_update_path`] is the
//! pure decision over it, so every rule below is tested without a BMC.
//!
//! Rules, in order:
//! 1. A path the caller forces (policy or release override) is the only candidate.
//! 2. Otherwise `SimpleUpdate` first (the BMC pulls: the image never passes through the controller's
//!    memory), then multipart push, then `HttpPushUri`.
//! 3. A path that cannot restrict targets is never used for a targeted update: an untargeted update
//!    goes to every applicable component (UpdateService schema), which on HGX means ERoTs, InfoROMs
//!    and management controllers. `SimpleUpdate` restricts targets unless its ActionInfo lists its
//!    parameters without `Targets`; multipart always carries `Targets` in `UpdateParameters`;
//!    `HttpPushUri` only where the BMC has the `HttpPushUriTargets` setting.
//! 4. An apply time the path advertises it cannot do makes it unusable when the caller insists, and
//!    otherwise falls back to what the path supports (reported in the plan). Not advertised: the
//!    requested value is sent and the BMC judges.
//! 5. `SimpleUpdate` sends `TransferProtocol` whenever the BMC lists allowable protocols (some require
//!    it although the URI has a scheme), and refuses a scheme the BMC does not list.
//! 6. Nothing usable: a refusal that lists every path's reason.

use std::fmt;

use serde::{Deserialize, Serialize};

/// `@Redfish.OperationApplyTime`: when the BMC should apply a pushed image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ApplyTime {
    /// Apply as soon as the image is staged (activation may still need a reset).
    Immediate,
    /// Stage now, apply on the next reset: lets the engine choose when the node goes down.
    OnReset,
}

impl ApplyTime {
    /// Parses the Redfish string; values the driver does not use (maintenance windows) are `None`.
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "Immediate" => Some(ApplyTime::Immediate),
            "OnReset" => Some(ApplyTime::OnReset),
            _ => None,
        }
    }

    /// The Redfish string.
    pub fn as_str(self) -> &'static str {
        match self {
            ApplyTime::Immediate => "Immediate",
            ApplyTime::OnReset => "OnReset",
        }
    }
}

/// The ways an image reaches a BMC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum UpdatePath {
    /// `UpdateService.SimpleUpdate`: the BMC downloads the image.
    SimpleUpdate,
    /// POST `multipart/form-data` to `MultipartHttpPushUri` (`UpdateParameters` + `UpdateFile`).
    MultipartPush,
    /// POST the raw image to `HttpPushUri`; targets by a PATCH of `HttpPushUriTargets`.
    HttpPush,
}

impl UpdatePath {
    /// The name used in policies, logs and reasons.
    pub fn as_str(self) -> &'static str {
        match self {
            UpdatePath::SimpleUpdate => "simple_update",
            UpdatePath::MultipartPush => "multipart_push",
            UpdatePath::HttpPush => "http_push",
        }
    }

    /// Parses [`UpdatePath::as_str`].
    pub fn parse(raw: &str) -> Option<Self> {
        [
            UpdatePath::SimpleUpdate,
            UpdatePath::MultipartPush,
            UpdatePath::HttpPush,
        ]
        .into_iter()
        .find(|p| p.as_str() == raw)
    }
}

impl fmt::Display for UpdatePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the BMC says about `SimpleUpdate`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimpleUpdateCaps {
    /// The action's `target`.
    pub target: String,
    /// Allowable `TransferProtocol` values (inline annotation or ActionInfo); empty: not advertised.
    pub protocols: Vec<String>,
    /// Whether the ActionInfo marks `TransferProtocol` as required.
    pub protocol_required: bool,
    /// `Some(false)` when an ActionInfo lists the parameters and `Targets` is not among them;
    /// `None` when the BMC does not say (the schema defines `Targets`, so it is sent).
    pub accepts_targets: Option<bool>,
    /// `@Redfish.OperationApplyTimeSupport.SupportedValues`; empty: not advertised.
    pub apply_times: Vec<ApplyTime>,
}

/// What the BMC says about a push URI.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushCaps {
    /// The URI to POST to.
    pub uri: String,
    /// Supported apply times; empty: not advertised.
    pub apply_times: Vec<ApplyTime>,
    /// For `HttpPushUri`: the service has the global `HttpPushUriTargets` setting.
    pub targets_settable: bool,
}

/// Every update path one BMC offers, read from its UpdateService.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateCapabilities {
    /// `Actions.#UpdateService.SimpleUpdate`, if present.
    pub simple_update: Option<SimpleUpdateCaps>,
    /// `MultipartHttpPushUri`, if present.
    pub multipart: Option<PushCaps>,
    /// `HttpPushUri`, if present.
    pub http_push: Option<PushCaps>,
    /// `MaxImageSizeBytes`, if present.
    pub max_image_bytes: Option<u64>,
}

/// What the caller wants from an update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateIntent {
    /// The update names inventory targets (it must not spill onto other components).
    pub targeted: bool,
    /// The wanted apply time, if any.
    pub apply_time: Option<ApplyTime>,
    /// Refuse rather than fall back to another apply time.
    pub strict_apply_time: bool,
    /// Only this path (policy or release override).
    pub forced: Option<UpdatePath>,
    /// The image URI's scheme (`http`, `https`), for `SimpleUpdate`'s protocol check.
    pub image_scheme: Option<String>,
}

/// The decision: which path, and what to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdatePlan {
    /// The chosen path.
    pub path: UpdatePath,
    /// The apply time to send (`None`: leave the BMC's default).
    pub apply_time: Option<ApplyTime>,
    /// `TransferProtocol` to send (SimpleUpdate only).
    pub transfer_protocol: Option<String>,
    /// Why another apply time than the one asked for, if so.
    pub note: Option<String>,
}

/// No path can do the update; one reason per path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateRefusal {
    /// `(path, why not)`, in the order considered.
    pub reasons: Vec<(UpdatePath, String)>,
}

impl fmt::Display for UpdateRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.reasons.is_empty() {
            return f.write_str("no update path considered");
        }
        let parts: Vec<String> = self.reasons.iter().map(|(p, why)| format!("{p}: {why}")).collect();
        f.write_str(&parts.join("; "))
    }
}

/// Picks the update path for `intent` on a BMC with `caps` (rules in the module docs).
pub fn choose_update_path(caps: &UpdateCapabilities, intent: &UpdateIntent) -> Result<UpdatePlan, UpdateRefusal> {
    let order: Vec<UpdatePath> = match intent.forced {
        Some(p) => vec![p],
        None => vec![
            UpdatePath::SimpleUpdate,
            UpdatePath::MultipartPush,
            UpdatePath::HttpPush,
        ],
    };
    let mut reasons = Vec::new();
    for path in order {
        match consider(caps, intent, path) {
            Ok(plan) => return Ok(plan),
            Err(why) => reasons.push((path, why)),
        }
    }
    Err(UpdateRefusal { reasons })
}

fn consider(caps: &UpdateCapabilities, intent: &UpdateIntent, path: UpdatePath) -> Result<UpdatePlan, String> {
    let (apply_times, can_target, transfer_protocol) = match path {
        UpdatePath::SimpleUpdate => {
            let su = caps
                .simple_update
                .as_ref()
                .ok_or("the UpdateService has no SimpleUpdate action")?;
            let protocol = simple_update_protocol(su, intent.image_scheme.as_deref())?;
            (&su.apply_times, su.accepts_targets != Some(false), protocol)
        }
        UpdatePath::MultipartPush => {
            let mp = caps
                .multipart
                .as_ref()
                .ok_or("the UpdateService has no MultipartHttpPushUri")?;
            (&mp.apply_times, true, None)
        }
        UpdatePath::HttpPush => {
            let hp = caps.http_push.as_ref().ok_or("the UpdateService has no HttpPushUri")?;
            (&hp.apply_times, hp.targets_settable, None)
        }
    };
    if intent.targeted && !can_target {
        return Err(match path {
            UpdatePath::SimpleUpdate => {
                "its ActionInfo has no Targets parameter, so the image would go to every applicable component"
            }
            _ => "the BMC has no HttpPushUriTargets setting, so the image would go to every applicable component",
        }
        .to_string());
    }
    let (apply_time, note) = match intent.apply_time {
        Some(wanted) if !apply_times.is_empty() && !apply_times.contains(&wanted) => {
            let supported: Vec<&str> = apply_times.iter().map(|a| a.as_str()).collect();
            if intent.strict_apply_time {
                return Err(format!(
                    "apply time {} is not supported (the BMC supports {})",
                    wanted.as_str(),
                    supported.join(", ")
                ));
            }
            let fallback = apply_times[0];
            (
                Some(fallback),
                Some(format!(
                    "apply time {} instead of {}: the BMC supports only {} on {path}",
                    fallback.as_str(),
                    wanted.as_str(),
                    supported.join(", ")
                )),
            )
        }
        other => (other, None),
    };
    Ok(UpdatePlan {
        path,
        apply_time,
        transfer_protocol,
        note,
    })
}

fn simple_update_protocol(su: &SimpleUpdateCaps, scheme: Option<&str>) -> Result<Option<String>, String> {
    let wanted = scheme.map(str::to_ascii_uppercase);
    if su.protocols.is_empty() {
        if su.protocol_required {
            // Required but no list: the URI's own scheme is the only honest answer.
            return Ok(wanted);
        }
        return Ok(None);
    }
    match wanted {
        Some(w) => su
            .protocols
            .iter()
            .find(|p| p.eq_ignore_ascii_case(&w))
            .map(|p| Some(p.clone()))
            .ok_or_else(|| format!("transfer protocol {w} is not among {}", su.protocols.join(", "))),
        None => Err("the image URI has no scheme to pick a TransferProtocol from".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dgx_h100() -> UpdateCapabilities {
        UpdateCapabilities {
            simple_update: Some(SimpleUpdateCaps {
                target: "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate".into(),
                protocols: vec!["HTTP".into(), "SCP".into()],
                protocol_required: true,
                accepts_targets: Some(false),
                apply_times: vec![],
            }),
            multipart: Some(PushCaps {
                uri: "/redfish/v1/UpdateService/update-multipart".into(),
                apply_times: vec![ApplyTime::Immediate],
                targets_settable: false,
            }),
            http_push: Some(PushCaps {
                uri: "/redfish/v1/UpdateService/update".into(),
                apply_times: vec![],
                targets_settable: true,
            }),
            max_image_bytes: None,
        }
    }

    fn intent(targeted: bool) -> UpdateIntent {
        UpdateIntent {
            targeted,
            apply_time: Some(ApplyTime::OnReset),
            strict_apply_time: false,
            forced: None,
            image_scheme: Some("http".into()),
        }
    }

    #[test]
    fn targeted_update_never_takes_a_simple_update_without_targets() {
        let plan = choose_update_path(&dgx_h100(), &intent(true)).unwrap();
        assert_eq!(plan.path, UpdatePath::MultipartPush);
        assert_eq!(plan.apply_time, Some(ApplyTime::Immediate));
        assert!(plan.note.as_deref().unwrap().contains("Immediate"), "{plan:?}");
    }

    #[test]
    fn untargeted_update_may_use_simple_update_and_sends_the_protocol() {
        let plan = choose_update_path(&dgx_h100(), &intent(false)).unwrap();
        assert_eq!(plan.path, UpdatePath::SimpleUpdate);
        assert_eq!(plan.transfer_protocol.as_deref(), Some("HTTP"));
        assert_eq!(plan.apply_time, Some(ApplyTime::OnReset));
    }

    #[test]
    fn forcing_a_path_that_cannot_target_is_refused_with_the_reason() {
        let mut i = intent(true);
        i.forced = Some(UpdatePath::SimpleUpdate);
        let refusal = choose_update_path(&dgx_h100(), &i).unwrap_err();
        assert_eq!(refusal.reasons.len(), 1);
        assert!(refusal.to_string().contains("no Targets parameter"), "{refusal}");
    }

    #[test]
    fn strict_apply_time_refuses_immediate_only_push() {
        let caps = UpdateCapabilities {
            multipart: dgx_h100().multipart,
            ..Default::default()
        };
        let mut i = intent(true);
        i.strict_apply_time = true;
        let refusal = choose_update_path(&caps, &i).unwrap_err();
        let text = refusal.to_string();
        assert!(
            text.contains("simple_update: the UpdateService has no SimpleUpdate"),
            "{text}"
        );
        assert!(
            text.contains("multipart_push: apply time OnReset is not supported"),
            "{text}"
        );
        assert!(
            text.contains("http_push: the UpdateService has no HttpPushUri"),
            "{text}"
        );
    }

    #[test]
    fn http_push_is_last_and_needs_settable_targets_when_targeted() {
        let mut caps = UpdateCapabilities {
            http_push: dgx_h100().http_push,
            ..Default::default()
        };
        assert_eq!(
            choose_update_path(&caps, &intent(true)).unwrap().path,
            UpdatePath::HttpPush
        );
        caps.http_push.as_mut().unwrap().targets_settable = false;
        assert!(choose_update_path(&caps, &intent(true)).is_err());
        assert_eq!(
            choose_update_path(&caps, &intent(false)).unwrap().path,
            UpdatePath::HttpPush
        );
    }

    #[test]
    fn unlisted_scheme_is_refused_and_unknown_targets_support_is_trusted() {
        let caps = UpdateCapabilities {
            simple_update: Some(SimpleUpdateCaps {
                target: "/t".into(),
                protocols: vec!["HTTPS".into()],
                ..Default::default()
            }),
            ..Default::default()
        };
        let err = choose_update_path(&caps, &intent(true)).unwrap_err();
        assert!(err.to_string().contains("HTTP is not among HTTPS"), "{err}");
        let mut https = intent(true);
        https.image_scheme = Some("https".into());
        let plan = choose_update_path(&caps, &https).unwrap();
        assert_eq!(plan.path, UpdatePath::SimpleUpdate);
        assert_eq!(plan.transfer_protocol.as_deref(), Some("HTTPS"));
    }

    #[test]
    fn path_names_round_trip() {
        for p in [
            UpdatePath::SimpleUpdate,
            UpdatePath::MultipartPush,
            UpdatePath::HttpPush,
        ] {
            assert_eq!(UpdatePath::parse(p.as_str()), Some(p));
        }
        assert_eq!(UpdatePath::parse("ftp"), None);
    }
}
