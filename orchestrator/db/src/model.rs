//! Plain records returned and accepted by the datastore. They carry domain
//! types (`FirmwareVersion`, `ComponentKind`...) rather than the strings
//! stored in the tables, so a malformed row is caught once, here.

use chrono::{DateTime, Utc};
use orchestrator_types::{
    ComponentKind, FirmwareVersion, NodeId, NodeState, QualificationState, ReleaseId, Role, RolloutId, UserId,
};
use serde::{Deserialize, Serialize};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

/// Labels that place a node in the fleet's failure domains.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct NodeLabels {
    pub region: String,
    pub cluster: String,
    pub rack: String,
    pub nvlink_domain: String,
}

/// A node as imported: who it is and how to reach its BMC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct NewNode {
    /// Letters, digits, `-`, `_`, `.`; starts with a letter or digit; no `..`.
    #[cfg_attr(
        feature = "openapi",
        schema(min_length = 1, max_length = 253, pattern = "^[A-Za-z0-9][A-Za-z0-9._-]*$")
    )]
    pub name: String,
    /// An http or https URL with a host and no credentials; unique per node
    /// (scheme, host, port). Changing it for an existing node needs an admin.
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub bmc_url: String,
    /// Names a credential in the controller's configuration; never the
    /// secret itself.
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 253))]
    pub credential_ref: String,
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 253))]
    pub platform_sku: String,
    #[serde(flatten)]
    pub labels: NodeLabels,
}

/// A node with its current state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Node {
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub id: NodeId,
    pub name: String,
    pub bmc_url: String,
    pub credential_ref: String,
    pub platform_sku: String,
    #[serde(flatten)]
    pub labels: NodeLabels,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub state: NodeState,
    pub state_reason: Option<String>,
    pub last_discovered_at: Option<DateTime<Utc>>,
    pub last_discovery_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Where a node's BMC is reached: what polling it needs, without the rest of the node's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAddress {
    pub id: NodeId,
    pub name: String,
    pub bmc_url: String,
    pub credential_ref: String,
}

/// A node as the fleet-scale judge sorts it into strata and controls: its address, platform and
/// cluster (the stratum) and whether it may be touched, without the rest of its row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeOutline {
    pub address: NodeAddress,
    pub platform_sku: String,
    pub cluster: String,
    pub state: NodeState,
}

impl Node {
    /// Where this node's BMC is reached.
    pub fn address(&self) -> NodeAddress {
        NodeAddress {
            id: self.id,
            name: self.name.clone(),
            bmc_url: self.bmc_url.clone(),
            credential_ref: self.credential_ref.clone(),
        }
    }
}

/// Who is importing, as the datastore needs to know it.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// The importer is an admin (or the audited local-admin CLI): it may
    /// change an existing node's BMC address. Anyone else is refused,
    /// because a changed address sends the fleet's BMC password to that host.
    pub may_change_bmc_address: bool,
    /// The credential profiles the controller has; a node naming another is
    /// refused. `None` when the caller cannot know them (tests, tools
    /// without a configuration).
    pub known_credential_refs: Option<std::collections::BTreeSet<String>>,
}

/// What an import did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ImportSummary {
    pub created: usize,
    pub updated: usize,
    pub unchanged: usize,
}

/// Which nodes to list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeFilter {
    pub state: Option<NodeState>,
    pub platform_sku: Option<String>,
    pub region: Option<String>,
    pub cluster: Option<String>,
    pub rack: Option<String>,
    pub nvlink_domain: Option<String>,
    /// Substring of the node name.
    pub name_contains: Option<String>,
    pub limit: Option<u64>,
    pub offset: Option<u64>,
}

/// One firmware component as read from a BMC's FirmwareInventory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ComponentReading {
    /// The Redfish FirmwareInventory member id, e.g. `HGX_FW_GPU_0`.
    pub inventory_id: String,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub kind: ComponentKind,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub version: FirmwareVersion,
    pub updateable: bool,
    pub software_id: Option<String>,
    /// Redfish `Status.Health` (`OK`, `Warning`, `Critical`).
    pub health: Option<String>,
}

/// A component with when it was last read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Component {
    #[serde(flatten)]
    pub reading: ComponentReading,
    /// Redfish `LowestSupportedVersion` as the BMC last reported it, unparsed;
    /// absent when it does not report one.
    pub lowest_supported_version: Option<String>,
    pub last_read_at: DateTime<Utc>,
}

/// A component as inventory discovery read it: the reading and what the BMC
/// says about older images. Kept apart from [`ComponentReading`] so callers
/// that record a reading without asking the BMC need not invent the field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct DiscoveredComponent {
    #[serde(flatten)]
    pub reading: ComponentReading,
    /// Redfish `LowestSupportedVersion`, unparsed: the BMC refuses images
    /// older than it, so a rollback below it cannot happen.
    #[serde(default)]
    pub lowest_supported_version: Option<String>,
}

/// A firmware release to register.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct NewRelease {
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "gpu"))]
    pub component_kind: ComponentKind,
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "96.00.61.00.01"))]
    pub version: FirmwareVersion,
    pub image_uri: String,
    /// Hex sha256 of the image, 64 characters.
    pub sha256: String,
    pub size_bytes: u64,
    /// Platform SKUs this image applies to.
    pub platforms: Vec<String>,
    #[serde(default)]
    pub release_notes: String,
}

/// Release metadata that decides whether a rollout of the release can be
/// undone. Both empty (the default) means nothing known forbids a rollback.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ReleaseRollback {
    /// Set, with the vendor's reason (e.g. "burns anti-rollback fuse"), when
    /// once installed the image refuses every older one.
    #[serde(default)]
    pub downgrade_forbidden: Option<String>,
    /// The oldest version a component accepts once this image runs: nodes
    /// updating from below it cannot be restored.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, example = "96.00.5A.00.00"))]
    pub rollback_floor: Option<FirmwareVersion>,
}

/// A registered release and where it stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Release {
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub id: ReleaseId,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub component_kind: ComponentKind,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub version: FirmwareVersion,
    pub image_uri: String,
    pub sha256: String,
    pub size_bytes: u64,
    pub platforms: Vec<String>,
    pub release_notes: String,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub qualification_state: QualificationState,
    pub state_reason: Option<String>,
    /// The vendor's reason the image forbids downgrades, when it does.
    pub downgrade_forbidden: Option<String>,
    /// Nodes updating from below this version cannot be rolled back.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub rollback_floor: Option<FirmwareVersion>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The rollout whose passing soak made the release fleet-proven (issue 22); kept when a person
    /// later makes it the default.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<i64>))]
    pub fleet_proven_by: Option<RolloutId>,
}

/// A qualification gate's outcome to record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct NewGateResult {
    /// The gate's name, as policies refer to it (`burn-in`, `nccl-allreduce`).
    pub gate: String,
    pub passed: bool,
    /// Free text or a link to the logs and reports.
    #[serde(default)]
    pub evidence: String,
}

/// A recorded gate outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct GateResult {
    pub id: i64,
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub release_id: ReleaseId,
    pub gate: String,
    pub passed: bool,
    pub evidence: String,
    pub recorded_by: String,
    pub recorded_at: DateTime<Utc>,
}

/// One audit log entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct AuditEntry {
    pub id: i64,
    pub at: DateTime<Utc>,
    /// Who or what acted: `user:alice`, `cli`, `engine`, `alertmanager`.
    pub actor: String,
    /// What was done: `release.transition`, `node.import`...
    pub action: String,
    pub subject_type: String,
    pub subject_id: String,
    pub details: serde_json::Value,
}

/// A rollout of one release, pinned to the policy it started from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct NewRollout {
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub release_id: ReleaseId,
    pub policy_name: String,
    /// The git commit the policy was read at.
    pub policy_commit: String,
    /// The git blob id of the policy file at that commit.
    pub policy_blob: String,
    /// Seed for every random choice of the plan, so it can be reproduced.
    pub seed: i64,
}

/// A stored rollout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Rollout {
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub id: RolloutId,
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub release_id: ReleaseId,
    pub policy_name: String,
    pub policy_commit: String,
    pub policy_blob: String,
    pub state: String,
    pub state_reason: Option<String>,
    pub seed: i64,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A local user. The password hash never leaves the datastore in this record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct User {
    #[cfg_attr(feature = "openapi", schema(value_type = i64))]
    pub id: UserId,
    pub username: String,
    pub display_name: String,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub role: Role,
    pub disabled: bool,
    pub created_at: DateTime<Utc>,
}

/// One thing wrong with an input record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    fn new(field: &str, message: impl Into<String>) -> Self {
        Self {
            field: field.to_owned(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Longest name or label accepted; DNS names fit in 253.
const MAX_NAME_LEN: usize = 253;

fn check_name(errors: &mut Vec<FieldError>, field: &str, value: &str) {
    if value.trim().is_empty() {
        errors.push(FieldError::new(field, "must not be empty"));
    } else if value.len() > MAX_NAME_LEN {
        errors.push(FieldError::new(field, format!("longer than {MAX_NAME_LEN} characters")));
    } else if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        errors.push(FieldError::new(field, format!("{value:?} contains whitespace")));
    }
}

fn check_url(errors: &mut Vec<FieldError>, field: &str, value: &str, schemes: &[&str]) {
    match url::Url::parse(value) {
        Ok(parsed) if schemes.contains(&parsed.scheme()) && parsed.has_host() => {
            if !parsed.username().is_empty() || parsed.password().is_some() {
                // Credentials belong in the credential store, never in a URL
                // that ends up in logs and the UI.
                errors.push(FieldError::new(field, "must not contain credentials"));
            }
        }
        Ok(_) => errors.push(FieldError::new(
            field,
            format!("must be an {} URL with a host", schemes.join(" or ")),
        )),
        Err(err) => errors.push(FieldError::new(field, format!("not a URL: {err}"))),
    }
}

/// A node name ends up in URLs, file names of evidence bundles and log
/// lines, so it is held to a hostname-like alphabet: `../../etc/passwd`,
/// `%2F` or a leading dot are refused rather than escaped everywhere.
fn check_node_name(errors: &mut Vec<FieldError>, field: &str, value: &str) {
    check_name(errors, field, value);
    if !errors.is_empty() {
        return;
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if !value.chars().all(allowed) || !value.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        errors.push(FieldError::new(
            field,
            format!("{value:?} must start with a letter or digit and use only letters, digits, '-', '_' and '.'"),
        ));
    } else if value.contains("..") {
        errors.push(FieldError::new(field, format!("{value:?} must not contain \"..\"")));
    }
}

/// The part of a BMC URL that says which machine receives the credentials:
/// scheme, host and port, lower-cased by the URL parser. Two nodes with the
/// same address would let one node's rollout log in to the other's BMC.
pub fn bmc_address(bmc_url: &str) -> Option<String> {
    let url = url::Url::parse(bmc_url).ok()?;
    let host = url.host_str()?;
    Some(format!(
        "{}://{}:{}",
        url.scheme(),
        host,
        url.port_or_known_default().unwrap_or(0)
    ))
}

impl NewNode {
    /// Every problem with this record, empty when it is acceptable.
    pub fn validate(&self) -> Vec<FieldError> {
        let mut errors = Vec::new();
        check_node_name(&mut errors, "name", &self.name);
        check_url(&mut errors, "bmc_url", &self.bmc_url, &["http", "https"]);
        check_name(&mut errors, "credential_ref", &self.credential_ref);
        check_name(&mut errors, "platform_sku", &self.platform_sku);
        check_name(&mut errors, "region", &self.labels.region);
        check_name(&mut errors, "cluster", &self.labels.cluster);
        check_name(&mut errors, "rack", &self.labels.rack);
        check_name(&mut errors, "nvlink_domain", &self.labels.nvlink_domain);
        errors
    }
}

impl NewRelease {
    /// Every problem with this record, empty when it is acceptable.
    pub fn validate(&self) -> Vec<FieldError> {
        let mut errors = Vec::new();
        check_url(&mut errors, "image_uri", &self.image_uri, &["http", "https"]);
        if self.sha256.len() != 64 || !self.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            errors.push(FieldError::new("sha256", "must be 64 hexadecimal characters"));
        }
        if self.size_bytes == 0 {
            errors.push(FieldError::new("size_bytes", "must be positive"));
        }
        if i64::try_from(self.size_bytes).is_err() {
            errors.push(FieldError::new("size_bytes", "is too large"));
        }
        if self.platforms.is_empty() {
            errors.push(FieldError::new("platforms", "must name at least one platform SKU"));
        }
        for platform in &self.platforms {
            check_name(&mut errors, "platforms", platform);
        }
        errors
    }
}

/// Longest `downgrade_forbidden` reason accepted: a sentence or a link, not a document.
const MAX_DOWNGRADE_REASON: usize = 1000;

impl ReleaseRollback {
    /// Every problem with this metadata for a release of `version`, empty
    /// when it is acceptable.
    pub fn validate(&self, version: &FirmwareVersion) -> Vec<FieldError> {
        let mut errors = Vec::new();
        if let Some(reason) = &self.downgrade_forbidden {
            if reason.trim().is_empty() {
                errors.push(FieldError::new(
                    "downgrade_forbidden",
                    "must give the vendor's reason (or be left out)",
                ));
            } else if reason.len() > MAX_DOWNGRADE_REASON {
                errors.push(FieldError::new(
                    "downgrade_forbidden",
                    format!("must be at most {MAX_DOWNGRADE_REASON} bytes"),
                ));
            }
        }
        if let Some(floor) = &self.rollback_floor
            && floor > version
        {
            // The image itself would be below its own floor.
            errors.push(FieldError::new(
                "rollback_floor",
                format!("{floor} is above the release's own version {version}"),
            ));
        }
        errors
    }
}

impl NewGateResult {
    /// Every problem with this record, empty when it is acceptable.
    pub fn validate(&self) -> Vec<FieldError> {
        let mut errors = Vec::new();
        check_name(&mut errors, "gate", &self.gate);
        errors
    }
}

/// Nodes per state, and how many failed their last inventory read (the
/// overview's counts, `overview`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeCounts {
    pub total: u64,
    pub by_state: std::collections::BTreeMap<String, u64>,
    pub discovery_errors: u64,
}
