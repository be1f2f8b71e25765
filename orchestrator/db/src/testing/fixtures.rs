//! Fixture builders for tests: policies (rendered as valid policy YAML), nodes with their GPU
//! inventory, and releases. One copy, so that a change to the policy format or to a record is made
//! once; the test kit (`integration-tests`) re-exports these beside its harness, and tests of crates
//! that need no simulated fleet (`db`, `web`, the CLI's) use them from here.

use orchestrator_types::{ComponentKind, FirmwareVersion, QualificationState, ReleaseId, TransitionRequest};

use crate::execution::{ExecRollout, NewPlan, NewStep, NewWave};
use crate::model::{ComponentReading, NewNode, NewRelease, NewRollout, Node, NodeLabels, Release};
use crate::{Db, DbError};

/// The HGX H100 platform SKU most fixtures run on.
pub const SKU: &str = "hgx-h100-8gpu";
/// The GPU firmware the fixture fleet runs before a rollout.
pub const GPU_FROM: &str = "96.00.5E.00.01";
/// The GPU firmware the fixture release brings.
pub const GPU_TO: &str = "96.00.61.00.01";

// ---------------------------------------------------------------------------
// Policies.

/// How many nodes a wave takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaveSize {
    /// `count: N`.
    Count(u32),
    /// `percent: N`.
    Percent(u32),
    /// `rest: true`.
    Rest,
}

/// One wave of a [`PolicyYaml`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaveYaml {
    /// The wave's name.
    pub name: String,
    /// Its size.
    pub size: WaveSize,
    /// `stratify_by`, omitted when empty.
    pub stratify_by: Vec<String>,
    /// `bake`, e.g. `10m`.
    pub bake: String,
    /// Further lines of the wave as written (`approval: manual`, `approvers: 1`), in order.
    pub lines: Vec<String>,
    /// `max_in_flight`.
    pub max_in_flight: u32,
}

impl WaveYaml {
    /// A wave of `size` baking 10 minutes, at most 10 in flight.
    pub fn new(name: &str, size: WaveSize) -> WaveYaml {
        WaveYaml {
            name: name.to_owned(),
            size,
            stratify_by: Vec::new(),
            bake: "10m".into(),
            lines: Vec::new(),
            max_in_flight: 10,
        }
    }

    /// Sets `bake`.
    pub fn bake(mut self, bake: &str) -> WaveYaml {
        self.bake = bake.to_owned();
        self
    }

    /// Sets `max_in_flight`.
    pub fn max_in_flight(mut self, n: u32) -> WaveYaml {
        self.max_in_flight = n;
        self
    }

    /// Sets `stratify_by`.
    pub fn stratify_by(mut self, labels: &[&str]) -> WaveYaml {
        self.stratify_by = labels.iter().map(|l| (*l).to_owned()).collect();
        self
    }

    /// Adds a line (or several, indented as a wave's keys) as written, e.g. `approval: auto`.
    pub fn line(mut self, line: &str) -> WaveYaml {
        if !line.is_empty() {
            self.lines.push(line.to_owned());
        }
        self
    }

    /// `approval: manual` with `approvers: n`.
    pub fn manual(self, approvers: u32) -> WaveYaml {
        self.line("approval: manual").line(&format!("approvers: {approvers}"))
    }
}

/// A rollout policy for GPU firmware on one platform, rendered by [`PolicyYaml::render`]. The
/// defaults are the two-wave policy most API and CLI tests start rollouts under (see
/// [`PolicyYaml::two_waves`]); change fields or use the setters for the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyYaml {
    /// `name`.
    pub name: String,
    /// `target.inventory_id`, omitted when empty (the policy then targets every component of the kind).
    pub inventory_id: String,
    /// `target.platforms`.
    pub platforms: Vec<String>,
    /// `qualification.required_gates`.
    pub required_gates: Vec<String>,
    /// The waves, in order.
    pub waves: Vec<WaveYaml>,
    /// `concurrency.max_in_flight`.
    pub max_in_flight: u32,
    /// Further `concurrency` lines as written (`per_rack: 6`).
    pub concurrency: Vec<String>,
    /// `failure_budget.max_failed`.
    pub max_failed: u32,
    /// A `health:` section as written (starting with `health:`), if any.
    pub health: Option<String>,
    /// `rollback.automatic`.
    pub automatic_rollback: bool,
    /// `rollback.scope`: `rollout` or `wave`.
    pub rollback_scope: String,
}

impl PolicyYaml {
    /// A two-node canary baking 10 minutes, then the rest (at most 10 in flight) after one manual
    /// approval; a failed node is tolerated; automatic rollback of the whole rollout.
    pub fn two_waves(name: &str) -> PolicyYaml {
        PolicyYaml {
            name: name.to_owned(),
            inventory_id: "HGX_FW_GPU_*".into(),
            platforms: vec![SKU.into()],
            required_gates: Vec::new(),
            waves: vec![
                WaveYaml::new("canary", WaveSize::Count(2)).max_in_flight(2),
                WaveYaml::new("rest", WaveSize::Rest).manual(1),
            ],
            max_in_flight: 10,
            concurrency: Vec::new(),
            max_failed: 1,
            health: None,
            automatic_rollback: true,
            rollback_scope: "rollout".into(),
        }
    }

    /// Ten canaries (one per rack first), 30% and the rest, each baking `bake`, with `middle` (e.g.
    /// `approval: auto`) on the middle wave; caps of 10, 60 and 120 in flight, 6 per rack and 3 per
    /// NVLink domain; two failures tolerated; automatic rollback. The engine tests' policy.
    pub fn three_waves(name: &str, bake: &str, middle: &str) -> PolicyYaml {
        PolicyYaml {
            waves: vec![
                WaveYaml::new("canary", WaveSize::Count(10))
                    .stratify_by(&["rack"])
                    .bake(bake)
                    .max_in_flight(10),
                WaveYaml::new("early", WaveSize::Percent(30))
                    .bake(bake)
                    .line(middle)
                    .max_in_flight(60),
                WaveYaml::new("rest", WaveSize::Rest).bake(bake).max_in_flight(120),
            ],
            max_in_flight: 120,
            concurrency: vec!["per_rack: 6".into(), "per_nvlink_domain: 3".into()],
            max_failed: 2,
            ..PolicyYaml::two_waves(name)
        }
    }

    /// Sets the waves.
    pub fn waves(mut self, waves: Vec<WaveYaml>) -> PolicyYaml {
        self.waves = waves;
        self
    }

    /// Sets `concurrency.max_in_flight` and its further lines.
    pub fn concurrency(mut self, max_in_flight: u32, lines: &[&str]) -> PolicyYaml {
        self.max_in_flight = max_in_flight;
        self.concurrency = lines.iter().map(|l| (*l).to_owned()).collect();
        self
    }

    /// Sets `failure_budget.max_failed`.
    pub fn max_failed(mut self, n: u32) -> PolicyYaml {
        self.max_failed = n;
        self
    }

    /// Sets `qualification.required_gates`.
    pub fn required_gates(mut self, gates: &[&str]) -> PolicyYaml {
        self.required_gates = gates.iter().map(|g| (*g).to_owned()).collect();
        self
    }

    /// Sets the `health:` section (the text from `health:` on).
    pub fn health(mut self, section: &str) -> PolicyYaml {
        self.health = Some(section.trim_end().to_owned());
        self
    }

    /// Sets `rollback.automatic`.
    pub fn automatic_rollback(mut self, automatic: bool) -> PolicyYaml {
        self.automatic_rollback = automatic;
        self
    }

    /// Sets `rollback.scope`.
    pub fn rollback_scope(mut self, scope: &str) -> PolicyYaml {
        scope.clone_into(&mut self.rollback_scope);
        self
    }

    /// Sets `target.platforms`.
    pub fn platforms(mut self, platforms: &[&str]) -> PolicyYaml {
        self.platforms = platforms.iter().map(|p| (*p).to_owned()).collect();
        self
    }

    /// Sets `target.inventory_id`.
    pub fn inventory_id(mut self, pattern: &str) -> PolicyYaml {
        self.inventory_id = pattern.to_owned();
        self
    }

    /// The policy file's text.
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = write!(
            out,
            "name: {name}\ntarget:\n  component: gpu\n{inventory}  platforms: [{platforms}]\n\
             versions:\n  allow_downgrade: false\nqualification:\n  required_gates: [{gates}]\nwaves:\n",
            name = self.name,
            inventory = if self.inventory_id.is_empty() {
                String::new()
            } else {
                format!("  inventory_id: \"{}\"\n", self.inventory_id)
            },
            platforms = self.platforms.join(", "),
            gates = self.required_gates.join(", "),
        );
        for wave in &self.waves {
            let _ = writeln!(out, "  - name: {}", wave.name);
            let _ = match wave.size {
                WaveSize::Count(n) => writeln!(out, "    count: {n}"),
                WaveSize::Percent(n) => writeln!(out, "    percent: {n}"),
                WaveSize::Rest => writeln!(out, "    rest: true"),
            };
            if !wave.stratify_by.is_empty() {
                let _ = writeln!(out, "    stratify_by: [{}]", wave.stratify_by.join(", "));
            }
            let _ = writeln!(out, "    bake: {}", wave.bake);
            for line in &wave.lines {
                let _ = writeln!(out, "    {line}");
            }
            let _ = writeln!(out, "    max_in_flight: {}", wave.max_in_flight);
        }
        let _ = writeln!(out, "concurrency:\n  max_in_flight: {}", self.max_in_flight);
        for line in &self.concurrency {
            let _ = writeln!(out, "  {line}");
        }
        let _ = writeln!(out, "failure_budget:\n  max_failed: {}", self.max_failed);
        if let Some(health) = &self.health {
            let _ = writeln!(out, "{health}");
        }
        let _ = writeln!(
            out,
            "rollback:\n  automatic: {}\n  scope: {}",
            self.automatic_rollback, self.rollback_scope
        );
        out
    }
}

/// A `health:` section with `alpha` and `gates` (each as [`redfish_gate`] renders one).
pub fn health_section(alpha: f64, gates: &[String]) -> String {
    format!("health:\n  alpha: {alpha}\n  gates:\n{}", gates.concat())
}

/// A health gate on bmc-sim's Redfish metric `metric`, where an increase is bad, looked at every
/// `interval`; `kind` is `rate` or `level`. Ends with a newline.
pub fn redfish_gate(name: &str, metric: &str, kind: &str, min_effect: &str, interval: &str) -> String {
    format!(
        "    - name: {name}\n      source: redfish\n      metric: {metric}\n      kind: {kind}\n      \
         direction: increase_is_bad\n      min_effect: {min_effect}\n      interval: {interval}\n"
    )
}

// ---------------------------------------------------------------------------
// Nodes.

/// A node to import; see [`node`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeBuilder(NewNode);

/// A node named `name` on [`SKU`]: BMC at `https://{name}.bmc.example`, credential `lab`, region
/// `r1`, cluster `c1`, rack `rack-1`, NVLink domain `nvl-1`.
pub fn node(name: &str) -> NodeBuilder {
    NodeBuilder(NewNode {
        name: name.to_owned(),
        bmc_url: format!("https://{name}.bmc.example"),
        credential_ref: "lab".into(),
        platform_sku: SKU.into(),
        labels: NodeLabels {
            region: "r1".into(),
            cluster: "c1".into(),
            rack: "rack-1".into(),
            nvlink_domain: "nvl-1".into(),
        },
    })
}

impl NodeBuilder {
    /// Sets the BMC URL.
    pub fn bmc_url(mut self, url: &str) -> NodeBuilder {
        url.clone_into(&mut self.0.bmc_url);
        self
    }

    /// Sets the credential reference.
    pub fn credential(mut self, name: &str) -> NodeBuilder {
        name.clone_into(&mut self.0.credential_ref);
        self
    }

    /// Sets the platform SKU.
    pub fn sku(mut self, sku: &str) -> NodeBuilder {
        sku.clone_into(&mut self.0.platform_sku);
        self
    }

    /// Sets all four labels.
    pub fn labels(mut self, region: &str, cluster: &str, rack: &str, nvlink_domain: &str) -> NodeBuilder {
        self.0.labels = NodeLabels {
            region: region.to_owned(),
            cluster: cluster.to_owned(),
            rack: rack.to_owned(),
            nvlink_domain: nvlink_domain.to_owned(),
        };
        self
    }

    /// Sets the rack label.
    pub fn rack(mut self, rack: &str) -> NodeBuilder {
        rack.clone_into(&mut self.0.labels.rack);
        self
    }

    /// The record to import.
    pub fn build(self) -> NewNode {
        self.0
    }
}

impl From<NodeBuilder> for NewNode {
    fn from(builder: NodeBuilder) -> NewNode {
        builder.0
    }
}

/// What an HGX node's BMC reports: eight updateable, healthy GPUs (`HGX_FW_GPU_0..7`) on `version`.
pub fn gpu_inventory(version: &str) -> Vec<ComponentReading> {
    (0..8)
        .map(|g| ComponentReading {
            inventory_id: format!("HGX_FW_GPU_{g}"),
            kind: ComponentKind::Gpu,
            version: FirmwareVersion::parse(version).unwrap_or_else(|e| panic!("fixture version {version:?}: {e}")),
            updateable: true,
            software_id: None,
            health: Some("OK".into()),
        })
        .collect()
}

/// `count` updateable GPUs `GPU_0..` on `version` with no health reported: a bare inventory for
/// counting and paging tests.
pub fn gpus(count: usize, version: &str) -> Vec<ComponentReading> {
    (0..count)
        .map(|g| ComponentReading {
            inventory_id: format!("GPU_{g}"),
            health: None,
            ..gpu_inventory(version).swap_remove(0)
        })
        .collect()
}

/// A numbered fleet of GPU nodes, all reporting [`gpu_inventory`]; see [`gpu_nodes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuNodes {
    count: usize,
    racks: usize,
    clusters: Option<usize>,
    version: String,
    versions: Vec<(String, String)>,
    without_inventory: Vec<String>,
}

/// `count` nodes `node-{i}` on [`SKU`] and [`GPU_FROM`], BMC at `https://bmc-{i}.example`, credential
/// `lab`, region `r1`, cluster `c1`, one rack and NVLink domain each (`rack-{i}`, `nvl-{i}`).
pub fn gpu_nodes(count: usize) -> GpuNodes {
    GpuNodes {
        count,
        racks: count.max(1),
        clusters: None,
        version: GPU_FROM.into(),
        versions: Vec::new(),
        without_inventory: Vec::new(),
    }
}

impl GpuNodes {
    /// Spreads the nodes over `racks` racks (and as many NVLink domains) round-robin.
    pub fn racks(mut self, racks: usize) -> GpuNodes {
        self.racks = racks.max(1);
        self
    }

    /// Spreads the nodes over clusters `c0..c{n-1}` round-robin (instead of all in `c1`).
    pub fn clusters(mut self, clusters: usize) -> GpuNodes {
        self.clusters = Some(clusters.max(1));
        self
    }

    /// The GPU firmware the nodes report.
    pub fn version(mut self, version: &str) -> GpuNodes {
        version.clone_into(&mut self.version);
        self
    }

    /// Node `name` reports `version` instead.
    pub fn node_version(mut self, name: &str, version: &str) -> GpuNodes {
        self.versions.push((name.to_owned(), version.to_owned()));
        self
    }

    /// Leaves node `name` without inventory (so the planner excludes it).
    pub fn without_inventory(mut self, name: &str) -> GpuNodes {
        self.without_inventory.push(name.to_owned());
        self
    }

    /// The records to import.
    pub fn new_nodes(&self) -> Vec<NewNode> {
        (0..self.count)
            .map(|i| {
                let rack = i % self.racks;
                let cluster = self.clusters.map_or_else(|| "c1".to_owned(), |n| format!("c{}", i % n));
                node(&format!("node-{i}"))
                    .bmc_url(&format!("https://bmc-{i}.example"))
                    .labels("r1", &cluster, &format!("rack-{rack}"), &format!("nvl-{rack}"))
                    .build()
            })
            .collect()
    }

    /// Imports the nodes as `test` and records their inventory; returns them as stored.
    pub async fn seed(&self, db: &Db) -> Result<Vec<Node>, DbError> {
        db.import_nodes(&self.new_nodes(), "test").await?;
        let nodes = db.all_nodes().await?;
        for node in &nodes {
            if self.without_inventory.contains(&node.name) {
                continue;
            }
            let version = self
                .versions
                .iter()
                .find(|(name, _)| *name == node.name)
                .map_or(self.version.as_str(), |(_, version)| version);
            db.record_inventory(node.id, &gpu_inventory(version)).await?;
        }
        Ok(nodes)
    }
}

/// `count` nodes `node-{i}` on platform `hgx`, BMC at `https://10.0.0.{i}`, credential `default`,
/// labels `r`, `c`, `k`, `n`: for tests where only a node's identity matters.
pub fn plain_nodes(count: usize) -> Vec<NewNode> {
    (0..count)
        .map(|i| {
            node(&format!("node-{i}"))
                .bmc_url(&format!("https://10.0.0.{i}"))
                .credential("default")
                .sku("hgx")
                .labels("r", "c", "k", "n")
                .build()
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Releases.

/// A GPU release of `version` for [`SKU`] whose image nobody fetches: `https://images.example/gpu.fw`,
/// a placeholder sha256, 1 KiB.
pub fn release(version: &str) -> NewRelease {
    NewRelease {
        component_kind: ComponentKind::Gpu,
        version: FirmwareVersion::parse(version).unwrap_or_else(|e| panic!("fixture version {version:?}: {e}")),
        image_uri: "https://images.example/gpu.fw".into(),
        sha256: "0123456789abcdef".repeat(4),
        size_bytes: 1024,
        platforms: vec![SKU.into()],
        release_notes: String::new(),
    }
}

/// The GPU release `96.00.61.00.01` for [`plain_nodes`]' platform `hgx` (image
/// `https://images.example/g.fw`, 1 byte, a placeholder sha256).
pub fn plain_release() -> NewRelease {
    NewRelease {
        image_uri: "https://images.example/g.fw".into(),
        sha256: "ab".repeat(32),
        size_bytes: 1,
        platforms: vec!["hgx".into()],
        ..release(GPU_TO)
    }
}

/// Moves release `id` through qualifying to qualified as `actor`, without gates.
pub async fn qualify(db: &Db, id: ReleaseId, actor: &str) -> Result<(), DbError> {
    for to in [QualificationState::Qualifying, QualificationState::Qualified] {
        db.transition_release(id, &TransitionRequest { to, reason: None }, actor)
            .await?;
    }
    Ok(())
}

/// Registers `new` and qualifies it, both as `actor`; returns it as stored after qualification.
pub async fn add_qualified_release(db: &Db, new: &NewRelease, actor: &str) -> Result<Release, DbError> {
    let release = db.add_release(new, actor).await?;
    qualify(db, release.id, actor).await?;
    db.release(release.id).await
}

/// Puts `content` in force as policy `name` (file `gpu.yaml`), as a git sync of
/// `https://git.example/policies@main` would, recorded as `test`; returns its (commit, blob), fixed
/// at forty `c`s and forty `b`s.
pub async fn put_policy_in_force(db: &Db, name: &str, content: &str) -> Result<(String, String), DbError> {
    use crate::policies::{PolicySync, SyncedPolicy};
    let (commit, blob) = ("c".repeat(40), "b".repeat(40));
    let sync = PolicySync {
        source: "https://git.example/policies@main".into(),
        commit_id: commit.clone(),
        in_force: vec![SyncedPolicy {
            name: name.to_owned(),
            path: "gpu.yaml".into(),
            commit_id: commit.clone(),
            blob_id: blob.clone(),
            content: content.to_owned(),
        }],
        changed: vec![name.to_owned()],
        removed: Vec::new(),
        rejected: Vec::new(),
        warnings: Vec::new(),
    };
    db.record_policy_sync(&sync, "test").await?;
    Ok((commit, blob))
}

// ---------------------------------------------------------------------------
// Stored rollouts.

/// One update step per node of `nodes`, on components `inventory_id`, expected at `from`.
pub fn steps(nodes: &[Node], inventory_id: &str, from: &str) -> Vec<NewStep> {
    nodes
        .iter()
        .map(|n| NewStep {
            node_id: n.id,
            inventory_id: inventory_id.to_owned(),
            expected_from_version: from.to_owned(),
        })
        .collect()
}

/// A wave `name` of `steps` baking `bake_seconds`, needing `approvals` approvals, at most
/// `max_in_flight` in flight, no gates and no control cohort.
pub fn wave(name: &str, bake_seconds: i64, approvals: u32, max_in_flight: u32, steps: Vec<NewStep>) -> NewWave {
    NewWave {
        name: name.to_owned(),
        bake_seconds,
        approvals_required: approvals,
        max_in_flight,
        gates: Vec::new(),
        control_nodes: Vec::new(),
        role: None,
        steps,
    }
}

/// A rollout of `release` under policy `p` (commit `c0ffee`, blob `b`), seed 1.
pub fn new_rollout(release: ReleaseId) -> NewRollout {
    NewRollout {
        release_id: release,
        policy_name: "p".into(),
        policy_commit: "c0ffee".into(),
        policy_blob: "b".into(),
        seed: 1,
    }
}

/// A plan of `waves` whose rollback assessment says rollback is possible.
pub fn plan(waves: Vec<NewWave>) -> NewPlan {
    NewPlan {
        waves,
        rollback_assessment: serde_json::json!({ "possible": true }),
    }
}

/// Stores [`new_rollout`] of `release` with [`plan`] of `waves`, without the planner, under the
/// policy text `name: p`, started by `actor`.
pub async fn store_rollout(
    db: &Db,
    release: ReleaseId,
    waves: Vec<NewWave>,
    actor: &str,
) -> Result<ExecRollout, DbError> {
    db.start_rollout(&new_rollout(release), "name: p\n", &plan(waves), actor)
        .await
}

/// An NVIDIA GPU (part 699-2G520-0200-000, slot `GPU_SXM_3`) in `node` that met `rule` now, with
/// no samples and no firmware suspicion: what a detector would open an RMA case for.
pub fn rma_candidate(
    serial: &str,
    node: &str,
    rule: &str,
    severity: orchestrator_rma::Severity,
) -> orchestrator_rma::Candidate {
    orchestrator_rma::Candidate {
        part: orchestrator_rma::PartRecord {
            serial: serial.into(),
            vendor: "nvidia".into(),
            part_kind: "gpu".into(),
            part_number: "699-2G520-0200-000".into(),
            node: node.into(),
            slot: "GPU_SXM_3".into(),
        },
        rule: rule.into(),
        failure_mode: rule.into(),
        severity,
        status: orchestrator_rma::CandidateStatus::Met,
        began_at: chrono::Utc::now(),
        samples: Vec::new(),
        firmware_suspected: None,
        document_edition: "NVIDIA GPU memory error management, r575".into(),
    }
}

/// The example NVIDIA GPU criteria (`policies/rma/nvidia-gpu.yaml`: a quota of 5 per week) put in
/// force as a policy sync would, so submissions have a quota to count against.
pub async fn put_example_rma_criteria(db: &Db) -> Result<(), DbError> {
    let source = include_str!("../../../../policies/rma/nvidia-gpu.yaml");
    db.replace_rma_criteria(
        &[crate::rma::CriteriaFile {
            path: "rma/nvidia-gpu.yaml".into(),
            commit_id: "local".into(),
            blob_id: orchestrator_rma::evidence::sha256_hex(source.as_bytes()),
            source: source.into(),
        }],
        "test",
    )
    .await
}

/// `count` NVIDIA GPUs (`<node>-GPU<i>`, slots `GPU_SXM_<i+1>`, part 699-2G520-0200-000) recorded
/// on `node` as discovery would, with firmware `96.00.5E.00.01` and health OK.
pub async fn record_example_parts(db: &Db, node: &str, count: usize) -> Result<Vec<String>, DbError> {
    let found: Vec<crate::parts::DiscoveredPart> = (0..count)
        .map(|i| crate::parts::DiscoveredPart {
            serial: format!("{node}-GPU{i}"),
            vendor: "nvidia".into(),
            part_kind: "gpu".into(),
            part_number: "699-2G520-0200-000".into(),
            model: Some("NVIDIA H100 80GB HBM3".into()),
            slot: format!("GPU_SXM_{}", i + 1),
            production_date: None,
            firmware_version: Some("96.00.5E.00.01".into()),
            health: Some("OK".into()),
        })
        .collect();
    db.record_node_parts(node, &found).await?;
    Ok(found.into_iter().map(|p| p.serial).collect())
}

/// Scans a made-up fleet of 600 GPUs over the 30 days from `period_start`, where lot `L7` of part
/// 699-2G520-0200-000 (60 GPUs) failed 18 times and the other 540 GPUs 9 times, and stores the
/// report: a scan that finds that lot, as the RMA monitor would store it.
pub async fn store_example_cluster_scan(
    db: &Db,
    period_start: chrono::DateTime<chrono::Utc>,
) -> Result<orchestrator_rma::ClusterReport, DbError> {
    use orchestrator_rma::{ClusterConfig, FleetPart, PartFailure};
    let parts: Vec<FleetPart> = (0..600)
        .map(|i| FleetPart {
            serial: format!("SN{i:05}"),
            node: format!("node-{}", i / 8),
            part_number: "699-2G520-0200-000".into(),
            lot: Some(if i < 60 { "L7".into() } else { format!("L{}", 1 + i % 5) }),
            platform: "hgx-h100".into(),
            age_days: 200.0,
            exposure_days: 30.0,
        })
        .collect();
    // Different nodes, hours apart: each failure is its own incident.
    let failures: Vec<PartFailure> = (0..18)
        .map(|k| k * 3)
        .chain((0..9).map(|k| 60 + k * 57))
        .enumerate()
        .map(|(n, i)| PartFailure {
            serial: format!("SN{i:05}"),
            at: period_start + chrono::TimeDelta::hours(5 + 13 * n as i64),
            firmware_suspected: false,
        })
        .collect();
    let report =
        orchestrator_rma::scan(&parts, &failures, &ClusterConfig::default()).map_err(|e| DbError::Invalid {
            field: "cluster scan".into(),
            reason: e.to_string(),
        })?;
    db.store_cluster_scan(period_start, period_start + chrono::TimeDelta::days(30), &report)
        .await?;
    Ok(report)
}
