//! Gathering a case's evidence package from the store: what the vendor's
//! RMA process asks for (inventory, the event-log entries and telemetry
//! around the failure, diagnostic data, the system-level causes ruled out,
//! the node's rollout history), packed by the pure
//! `orchestrator_rma::build_package` into a deterministic archive.
//!
//! Deterministic: every file is a function of stored records only, read in
//! a fixed order, inside a window fixed by the failure's start; the archive's
//! timestamp is the case's opening time. Two downloads of a case whose
//! records did not change are byte-for-byte equal.

use std::collections::{BTreeMap, BTreeSet};

use chrono::TimeDelta;
use orchestrator_rma::{
    Actor, Case, CaseEvent, CaseState, EvidenceFile, EvidencePackage, Manifest, Observation, ObservationKind,
    build_package,
};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde_json::{Value, json};

use crate::entity::{nodes, update_steps};
use crate::parts::PartFilter;
use crate::rma::AttachmentKind;
use crate::{Db, DbError};

/// The window of samples around the failure's first qualifying sample.
pub const EVIDENCE_WINDOW: TimeDelta = TimeDelta::hours(24);

/// Whether a sample shows something wrong with its part (the kind of sample
/// that, on another part at the same time, points at a shared cause).
pub fn is_fault_sample(o: &Observation) -> bool {
    match &o.kind {
        ObservationKind::Flag { set, .. } => *set,
        ObservationKind::Xid { .. } => true,
        ObservationKind::XidWindowCount { count, .. } => *count > 0,
        ObservationKind::FieldDiagnostic { passed } => !passed,
        ObservationKind::SeriesScrape { present } => !present,
        ObservationKind::BmcProbe { answered } => !answered,
    }
}

fn pretty(value: &Value) -> Result<Vec<u8>, DbError> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(|e| DbError::corrupt("evidence file", e))?;
    bytes.push(b'\n');
    Ok(bytes)
}

fn file(path: &str, value: &Value) -> Result<EvidenceFile, DbError> {
    Ok(EvidenceFile {
        path: path.to_owned(),
        bytes: pretty(value)?,
    })
}

impl Db {
    /// Builds case `id`'s evidence package. A secret found in any file
    /// refuses the whole package (`Invalid`, naming the file, never the secret).
    pub async fn rma_evidence_package(&self, id: &str) -> Result<EvidencePackage, DbError> {
        let stored = self.rma_case(id).await?;
        let case = &stored.case;
        let candidate = &stored.candidate;
        let from = candidate.began_at - EVIDENCE_WINDOW;
        let until = candidate.began_at + EVIDENCE_WINDOW;
        let in_window = |o: &&Observation| o.at >= from && o.at <= until;

        let node = nodes::Entity::find()
            .filter(nodes::Column::Name.eq(case.node.as_str()))
            .one(&self.reader)
            .await?;
        let node_parts = self
            .parts(&PartFilter {
                node: Some(case.node.clone()),
                include_removed: true,
                ..Default::default()
            })
            .await?;
        let mut files = Vec::new();
        // Only what was fixed when the case opened: its later transitions
        // (evidence recorded, submitted) must not change the package they name.
        files.push(file(
            "case.json",
            &json!({
                "id": case.id, "serial": case.serial, "node": case.node, "vendor": case.vendor,
                "rule": case.rule, "failure_mode": case.failure_mode, "severity": case.severity,
                "opened_at": case.opened_at,
            }),
        )?);
        files.push(file(
            "candidate.json",
            &serde_json::to_value(candidate).map_err(|e| DbError::corrupt("rma candidate", e))?,
        )?);
        files.push(file(
            "inventory.json",
            &json!({
                "node": node.as_ref().map(|n| json!({
                    "name": n.name, "platform_sku": n.platform_sku, "region": n.region,
                    "cluster": n.cluster, "rack": n.rack, "nvlink_domain": n.nvlink_domain,
                })),
                // Discovery's bookkeeping (last seen, current health) moves on
                // every pass; the samples carry health at the failure's time.
                "parts": node_parts.iter().map(|p| json!({
                    "serial": p.serial, "vendor": p.vendor, "part_kind": p.part_kind,
                    "part_number": p.part_number, "model": p.model, "slot": p.slot,
                    "production_date": p.production_date, "lot": p.lot, "date_code": p.date_code,
                    "firmware_version": p.firmware_version, "first_seen": p.first_seen,
                    "removed_at": p.removed_at,
                })).collect::<Vec<_>>(),
            }),
        )?);

        // The failed part's own samples, and every part of the node, in the window.
        let node_serials: Vec<String> = node_parts.iter().map(|p| p.serial.clone()).collect();
        let node_obs = self.part_observations(&node_serials, from).await?;
        let own: Vec<&Observation> = node_obs
            .get(&case.serial)
            .map(|v| v.iter().filter(in_window).collect())
            .unwrap_or_default();
        files.push(file(
            "event_log.json",
            &json!({ "serial": case.serial, "from": from, "until": until, "samples": own }),
        )?);
        let telemetry: BTreeMap<&str, Vec<&Observation>> = node_obs
            .iter()
            .map(|(serial, obs)| (serial.as_str(), obs.iter().filter(in_window).collect()))
            .collect();
        files.push(file(
            "telemetry_window.json",
            &json!({ "node": case.node, "from": from, "until": until, "by_serial": telemetry }),
        )?);

        files.push(file(
            "system_causes.json",
            &self.system_causes(case, node.as_ref(), &node_obs, from, until).await?,
        )?);

        let history = match &node {
            None => Vec::new(),
            Some(n) => update_steps::Entity::find()
                .filter(update_steps::Column::NodeId.eq(n.id))
                .order_by_asc(update_steps::Column::Id)
                .all(&self.reader)
                .await?
                .into_iter()
                .map(|s| {
                    json!({
                        "rollout": s.rollout_id, "wave": s.wave_id, "component": s.inventory_id,
                        "purpose": s.purpose, "from_version": s.previous_version.unwrap_or(s.expected_from_version),
                        "to_version": s.target_version, "state": s.state, "error": s.error,
                        "started_at": s.started_at, "finished_at": s.finished_at,
                    })
                })
                .collect(),
        };
        files.push(file(
            "rollout_history.json",
            &json!({ "node": case.node, "steps": history, "firmware_suspected": candidate.firmware_suspected }),
        )?);

        for attachment in self.rma_attachments(id).await? {
            let dir = match attachment.kind {
                AttachmentKind::RedfishDiagnostic => "diagnostics/redfish",
                AttachmentKind::FieldDiagnostic => "diagnostics/field",
                AttachmentKind::EvidencePackage => continue,
            };
            let (_, content) = self.rma_attachment_content(id, &attachment.name).await?;
            files.push(EvidenceFile {
                path: format!("{dir}/{}", attachment.name),
                bytes: content,
            });
        }

        build_package(
            &case.id,
            &case.serial,
            &candidate.document_edition,
            case.opened_at,
            files,
            &[],
        )
        .map_err(|e| DbError::Invalid {
            field: "evidence package".into(),
            reason: e.to_string(),
        })
    }

    /// Records case `id`'s evidence as collected (from `candidate`, or anew
    /// from `rejected`): builds the package, keeps it as the case's snapshot
    /// and moves the case on with its manifest hash. The snapshot is what
    /// later downloads serve, so the hash a vendor was given keeps naming
    /// the bytes they received while samples and attachments grow.
    pub async fn record_rma_evidence(&self, id: &str, actor: &Actor) -> Result<(Case, EvidencePackage), DbError> {
        let state = self.rma_case(id).await?.case.state;
        let package = self.rma_evidence_package(id).await?;
        let event = match state {
            CaseState::Rejected => CaseEvent::Resubmit {
                manifest_sha256: package.manifest_sha256.clone(),
            },
            _ => CaseEvent::CollectEvidence {
                manifest_sha256: package.manifest_sha256.clone(),
            },
        };
        // Checked before the snapshot is stored, so a refused transition
        // leaves no orphan snapshot behind.
        self.rma_case(id)
            .await?
            .case
            .apply(event.clone(), actor, self.clock.now())
            .map_err(crate::rma::case_refusal)?;
        let (archive_name, manifest_name) = snapshot_names(&package.manifest_sha256);
        let manifest = serde_json::to_vec(&package.manifest).map_err(|e| DbError::corrupt("evidence manifest", e))?;
        for (name, bytes) in [(&archive_name, &package.archive), (&manifest_name, &manifest)] {
            match self
                .add_rma_attachment(id, name, AttachmentKind::EvidencePackage, bytes, &actor.name)
                .await
            {
                // The same package recorded again (a retried request): same bytes by construction.
                Ok(_) | Err(DbError::AlreadyExists { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        let case = self.apply_rma_event(id, event, actor).await?;
        Ok((case, package))
    }

    /// The package a download of case `id` serves: the snapshot its
    /// manifest hash names once evidence is recorded, else a fresh build.
    pub async fn rma_evidence_download(&self, id: &str) -> Result<EvidencePackage, DbError> {
        let stored = self.rma_case(id).await?;
        let Some(sha) = stored.case.manifest_sha256.as_deref() else {
            return self.rma_evidence_package(id).await;
        };
        let (archive_name, manifest_name) = snapshot_names(sha);
        let snapshot = async {
            let (_, archive) = self.rma_attachment_content(id, &archive_name).await?;
            let (_, manifest) = self.rma_attachment_content(id, &manifest_name).await?;
            let manifest: Manifest =
                serde_json::from_slice(&manifest).map_err(|e| DbError::corrupt("evidence manifest", e))?;
            Ok::<_, DbError>(EvidencePackage {
                manifest,
                manifest_sha256: sha.to_owned(),
                archive,
            })
        };
        match snapshot.await {
            Ok(p) => Ok(p),
            // A hash recorded by hand (the API's explicit event) has no snapshot.
            Err(DbError::NotFound { .. }) => self.rma_evidence_package(id).await,
            Err(e) => Err(e),
        }
    }

    /// Node-, rack- and fleet-level causes, each with what was found and
    /// whether it is ruled out: a failure shared by the node's other GPUs,
    /// its rack or the fleet at the same time points at power, cooling,
    /// the baseboard or a fleet event rather than at this part.
    async fn system_causes(
        &self,
        case: &orchestrator_rma::Case,
        node: Option<&nodes::Model>,
        node_obs: &BTreeMap<String, Vec<Observation>>,
        from: chrono::DateTime<chrono::Utc>,
        until: chrono::DateTime<chrono::Utc>,
    ) -> Result<Value, DbError> {
        let faulty = |obs: &[Observation]| obs.iter().any(|o| o.at >= from && o.at <= until && is_fault_sample(o));
        let node_others: Vec<&str> = node_obs
            .iter()
            .filter(|(serial, obs)| **serial != case.serial && faulty(obs))
            .map(|(serial, _)| serial.as_str())
            .collect();

        let (rack, rack_nodes) = match node {
            None => (String::new(), Vec::new()),
            Some(n) => {
                let peers: Vec<String> = nodes::Entity::find()
                    .filter(nodes::Column::Rack.eq(n.rack.as_str()))
                    .filter(nodes::Column::Name.ne(n.name.as_str()))
                    .order_by_asc(nodes::Column::Name)
                    .all(&self.reader)
                    .await?
                    .into_iter()
                    .map(|m| m.name)
                    .collect();
                (n.rack.clone(), peers)
            }
        };
        let mut rack_faulty: BTreeSet<String> = BTreeSet::new();
        let mut rack_parts = 0usize;
        for peer in &rack_nodes {
            let parts = self
                .parts(&PartFilter {
                    node: Some(peer.clone()),
                    ..Default::default()
                })
                .await?;
            rack_parts += parts.len();
            let serials: Vec<String> = parts.iter().map(|p| p.serial.clone()).collect();
            let obs = self.part_observations(&serials, from).await?;
            if obs.values().any(|o| faulty(o)) {
                rack_faulty.insert(peer.clone());
            }
        }

        let fleet_parts = self.parts(&PartFilter::default()).await?.len();
        let observed = self.observed_serials(from).await?;
        let fleet_obs = self.part_observations(&observed, from).await?;
        let fleet_faulty = fleet_obs.values().filter(|o| faulty(o)).count();
        let fleet_share = if fleet_parts == 0 {
            0.0
        } else {
            fleet_faulty as f64 / fleet_parts as f64
        };
        // A fleet event shows as many parts failing at once; 1% of the fleet
        // in a two-day window is far above the hardware failure rates the
        // criteria exist for.
        let fleet_event = fleet_share > 0.01 && fleet_faulty > 3;
        Ok(json!({
            "window": { "from": from, "until": until },
            "node": {
                "name": case.node,
                "other_parts_with_faults": node_others,
                "ruled_out": node_others.is_empty(),
                "meaning": "another part of the same node failing in the window points at the node (baseboard, power, cooling, a bad reset) rather than this part",
            },
            "rack": {
                "rack": rack,
                "other_nodes": rack_nodes.len(),
                "parts_checked": rack_parts,
                "nodes_with_faults": rack_faulty,
                "ruled_out": rack_faulty.is_empty(),
                "meaning": "faults on other nodes of the rack in the window point at rack power or cooling",
            },
            "fleet": {
                "parts": fleet_parts,
                "parts_with_faults": fleet_faulty,
                "share": fleet_share,
                "ruled_out": !fleet_event,
                "meaning": "more than 1% of the fleet's parts faulting in the window is a fleet event (driver, firmware, facility), not a part defect",
            },
        }))
    }
}

fn snapshot_names(manifest_sha256: &str) -> (String, String) {
    let short = manifest_sha256.get(..16).unwrap_or(manifest_sha256);
    (
        format!("evidence-{short}.tar"),
        format!("evidence-{short}.manifest.json"),
    )
}
