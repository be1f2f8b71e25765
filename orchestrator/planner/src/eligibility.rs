//! Which nodes a release may update under a policy, and why not the others.

use std::sync::Arc;

use orchestrator_policy::{LabelSelector, Policy};
use orchestrator_types::{FirmwareVersion, NodeState};

use crate::input::{ComponentSnapshot, NodeSnapshot, ReleaseSpec};
use crate::plan::{ExclusionReason, StepPlan};

/// An eligible node's planned work.
#[derive(Debug, Clone)]
pub(crate) struct Eligible {
    pub(crate) steps: Vec<StepPlan>,
    pub(crate) already_at_target: Vec<String>,
    /// Components that get a step, as the rollback assessment needs them.
    pub(crate) updated: Vec<UpdatedComponent>,
}

/// What the rollback assessment reads of a component that gets a step: the planner keeps one per
/// planned component (800,000 at 100,000 nodes), so not a copy of the whole snapshot entry.
#[derive(Debug, Clone)]
pub(crate) struct UpdatedComponent {
    pub(crate) inventory_id: String,
    pub(crate) downgrade_forbidden: bool,
    /// Its current version, parsed.
    pub(crate) current: FirmwareVersion,
}

/// Components of the policy's kind whose inventory id matches its pattern,
/// in inventory-id order.
pub(crate) fn matching_components<'a>(node: &'a NodeSnapshot, policy: &Policy) -> Vec<&'a ComponentSnapshot> {
    let mut matching: Vec<&ComponentSnapshot> = node
        .components
        .iter()
        .filter(|c| c.kind == policy.target.component)
        .filter(|c| {
            policy
                .target
                .inventory_id
                .as_ref()
                .is_none_or(|p| p.matches(&c.inventory_id))
        })
        .collect();
    matching.sort_by(|a, b| a.inventory_id.cmp(&b.inventory_id));
    matching
}

fn selector_matches(selector: &LabelSelector, labels: &std::collections::BTreeMap<String, String>) -> bool {
    selector
        .iter()
        .all(|(key, values)| labels.get(key).is_some_and(|v| values.iter().any(|want| want == v)))
}

/// What every step of a plan flashes, made once and shared by all of them.
#[derive(Debug, Clone)]
pub(crate) struct ReleaseImage {
    target: Arc<str>,
    uri: Arc<str>,
    sha256: Arc<str>,
}

impl ReleaseImage {
    pub(crate) fn of(release: &ReleaseSpec) -> Self {
        Self {
            target: release.version.as_str().into(),
            uri: release.image_uri.as_str().into(),
            sha256: release.sha256.as_str().into(),
        }
    }
}

/// Decides one node. The checks run in the order of [`ExclusionReason`]'s
/// variants and the first failure is the reason: targeting first (so a node
/// the policy never meant is reported as such, whatever its state), then
/// "nothing to do", then the node's condition, then the version rules.
pub(crate) fn assess(
    node: &NodeSnapshot,
    policy: &Policy,
    release: &ReleaseSpec,
    image: &ReleaseImage,
) -> Result<Eligible, ExclusionReason> {
    let target = &policy.target;
    if !target.platforms.contains(&node.platform) {
        return Err(ExclusionReason::PlatformNotTargeted {
            platform: node.platform.clone(),
        });
    }
    if !release.platforms.contains(&node.platform) {
        return Err(ExclusionReason::ReleaseNotForPlatform {
            platform: node.platform.clone(),
        });
    }
    let labels = node.effective_labels();
    for (label, wanted) in &target.selector {
        let actual = labels.get(label);
        if !actual.is_some_and(|v| wanted.iter().any(|w| w == v)) {
            return Err(ExclusionReason::SelectorMismatch {
                label: label.clone(),
                wanted: wanted.clone(),
                actual: actual.cloned(),
            });
        }
    }
    if let Some(selector) = target.exclude.iter().find(|sel| selector_matches(sel, &labels)) {
        return Err(ExclusionReason::ExcludedBySelector {
            selector: selector.clone(),
        });
    }
    if target.exclude_nodes.contains(&node.name) {
        return Err(ExclusionReason::ExcludedByName);
    }
    if !node.components.iter().any(|c| c.kind == target.component) {
        return Err(ExclusionReason::NoComponentOfKind { kind: target.component });
    }
    let matching = matching_components(node, policy);
    if matching.is_empty() {
        let mut ids: Vec<String> = node
            .components
            .iter()
            .filter(|c| c.kind == target.component)
            .map(|c| c.inventory_id.clone())
            .collect();
        ids.sort();
        return Err(ExclusionReason::InventoryIdMismatch {
            pattern: target
                .inventory_id
                .as_ref()
                .map(|p| p.as_str().to_owned())
                .unwrap_or_default(),
            ids,
        });
    }
    let mut parsed = Vec::with_capacity(matching.len());
    for component in matching {
        match FirmwareVersion::parse(&component.version) {
            Ok(version) => parsed.push((component, version)),
            Err(_) => {
                return Err(ExclusionReason::CurrentVersionUnparseable {
                    inventory_id: component.inventory_id.clone(),
                    version: component.version.clone(),
                });
            }
        }
    }
    let at_target = |v: &FirmwareVersion| *v == release.version || v.is_equivalent(&release.version);
    let (done, need): (Vec<_>, Vec<_>) = parsed.into_iter().partition(|(_, v)| at_target(v));
    if need.is_empty() {
        return Err(ExclusionReason::AlreadyAtTarget {
            version: release.version.as_str().to_owned(),
        });
    }
    if node.state != NodeState::Active {
        return Err(ExclusionReason::NotActive { state: node.state });
    }
    if let Some(reason) = &node.health.rma_hold {
        return Err(ExclusionReason::OpenRmaCase { reason: reason.clone() });
    }
    if !node.health.healthy {
        return Err(ExclusionReason::Unhealthy {
            summary: node.health.summary.clone(),
        });
    }
    if let Some((component, _)) = need.iter().find(|(c, _)| !c.updateable) {
        return Err(ExclusionReason::ComponentNotUpdateable {
            inventory_id: component.inventory_id.clone(),
        });
    }
    if let Some(from) = &policy.versions.from
        && let Some((component, _)) = need.iter().find(|(_, v)| !from.matches(v))
    {
        return Err(ExclusionReason::VersionConstraintNotMet {
            inventory_id: component.inventory_id.clone(),
            current: component.version.clone(),
            constraint: from.to_string(),
        });
    }
    if !policy.versions.allow_downgrade
        && let Some((component, _)) = need.iter().find(|(_, v)| release.version < *v)
    {
        return Err(ExclusionReason::DowngradeForbidden {
            inventory_id: component.inventory_id.clone(),
            current: component.version.clone(),
            target: release.version.as_str().to_owned(),
        });
    }
    let steps = need
        .iter()
        .map(|(c, _)| StepPlan {
            inventory_id: c.inventory_id.clone(),
            expected_current: c.version.clone(),
            target: image.target.clone(),
            image_uri: image.uri.clone(),
            image_sha256: image.sha256.clone(),
        })
        .collect();
    Ok(Eligible {
        steps,
        already_at_target: done.iter().map(|(c, _)| c.inventory_id.clone()).collect(),
        updated: need
            .into_iter()
            .map(|(c, current)| UpdatedComponent {
                inventory_id: c.inventory_id.clone(),
                downgrade_forbidden: c.downgrade_forbidden,
                current,
            })
            .collect(),
    })
}
