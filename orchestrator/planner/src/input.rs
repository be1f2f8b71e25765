//! What the planner is given: a fleet snapshot and a release. The engine
//! fills these from the database; tests build them by hand. Every field is
//! plain data so a plan can be recomputed from a stored copy of its inputs.

use std::collections::{BTreeMap, BTreeSet};

use orchestrator_types::{ComponentKind, FirmwareVersion, NodeId, NodeState, QualificationState, ReleaseId};
use serde::{Deserialize, Serialize};

/// The fleet as the controller last saw it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetSnapshot {
    /// Every known node, in any order (the planner sorts by id).
    pub nodes: Vec<NodeSnapshot>,
}

/// One server and the firmware inventory read from its BMC.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeSnapshot {
    /// Database id.
    pub id: NodeId,
    /// Hostname; policies exclude nodes by it.
    pub name: String,
    /// Platform (server SKU), e.g. `hgx-h100-8gpu`.
    pub platform: String,
    /// Region label.
    pub region: String,
    /// Cluster label; the per-cluster cap counts within it.
    pub cluster: String,
    /// Rack label, unique within its cluster.
    pub rack: String,
    /// NVLink domain label, unique within its cluster; empty when the node
    /// shares no NVLink fabric with other nodes.
    #[serde(default)]
    pub nvlink_domain: String,
    /// Any other labels (`environment`, `reservation`...). The fixed labels
    /// above win over entries of the same name here.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Whether the controller may touch the node.
    pub state: NodeState,
    /// Last health summary.
    pub health: NodeHealth,
    /// FirmwareInventory entries.
    pub components: Vec<ComponentSnapshot>,
}

/// The node's last health reading, as far as planning cares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeHealth {
    /// False when the last reading found a problem (or there was none), so
    /// a sick node is neither updated nor used as a control.
    pub healthy: bool,
    /// Short human text, shown as the exclusion reason.
    #[serde(default)]
    pub summary: Option<String>,
    /// Why an open RMA case keeps the node out of rollouts (a part awaits
    /// its vendor's answer or a replacement): neither updated nor a control.
    /// Left out of the serialized snapshot when absent, so the fingerprint
    /// of a fleet without holds is what it was before this field existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rma_hold: Option<String>,
}

impl NodeHealth {
    /// A healthy reading with no remarks.
    pub fn ok() -> Self {
        Self {
            healthy: true,
            summary: None,
            rma_hold: None,
        }
    }
}

/// One Redfish FirmwareInventory member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentSnapshot {
    /// FirmwareInventory id, e.g. `HGX_FW_GPU_0`.
    pub inventory_id: String,
    /// Component kind.
    pub kind: ComponentKind,
    /// `Version` exactly as the BMC reported it. Kept raw because the
    /// executor's precheck compares against the text it reads back; the
    /// planner parses it and refuses the node when it cannot.
    pub version: String,
    /// Redfish `Updateable`.
    pub updateable: bool,
    /// Set when something known about this component (a vendor quirk, a
    /// burnt anti-rollback fuse) says it refuses older images.
    #[serde(default)]
    pub downgrade_forbidden: bool,
}

/// Label names with a fixed meaning; everything else is looked up in
/// [`NodeSnapshot::labels`].
pub(crate) const PLATFORM_LABEL: &str = "platform";

impl NodeSnapshot {
    /// The value of a label, including the fixed ones (`platform`, `region`,
    /// `cluster`, `rack`, `nvlink_domain`).
    pub fn label(&self, name: &str) -> Option<&str> {
        match name {
            PLATFORM_LABEL => Some(&self.platform),
            "region" => Some(&self.region),
            "cluster" => Some(&self.cluster),
            "rack" => Some(&self.rack),
            "nvlink_domain" => Some(&self.nvlink_domain),
            other => self.labels.get(other).map(String::as_str),
        }
    }

    /// Every label, fixed ones included, as policy selectors see them.
    pub fn effective_labels(&self) -> BTreeMap<String, String> {
        let mut labels = self.labels.clone();
        for (key, value) in [
            (PLATFORM_LABEL, &self.platform),
            ("region", &self.region),
            ("cluster", &self.cluster),
            ("rack", &self.rack),
            ("nvlink_domain", &self.nvlink_domain),
        ] {
            labels.insert(key.to_owned(), value.clone());
        }
        labels
    }
}

/// The release being rolled out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReleaseSpec {
    /// Database id.
    pub id: ReleaseId,
    /// Component kind the image is for.
    pub kind: ComponentKind,
    /// Version the image installs; each step must read it back.
    pub version: FirmwareVersion,
    /// Platforms (SKUs) the image applies to.
    pub platforms: Vec<String>,
    /// Where BMCs fetch the image.
    pub image_uri: String,
    /// sha256 of the image, hex.
    pub sha256: String,
    /// Qualification state at planning time.
    pub qualification: QualificationState,
    /// Qualification gates this release passed; a qualified release that
    /// lacks a gate the policy requires is treated as unqualified.
    #[serde(default)]
    pub passed_gates: BTreeSet<String>,
    /// Release metadata: set (with the vendor's reason) when once installed
    /// the image refuses every older one, e.g. it burns an anti-rollback fuse.
    #[serde(default)]
    pub downgrade_forbidden: Option<String>,
    /// Release metadata: the oldest version a component accepts once this
    /// image runs (a security-version floor). Nodes updating from below it
    /// cannot be rolled back.
    #[serde(default)]
    pub rollback_floor: Option<FirmwareVersion>,
}
