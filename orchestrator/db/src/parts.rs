//! Parts keyed by serial number, and the per-part samples the RMA candidate
//! rules judge.
//!
//! Discovery reads each node's parts over Redfish (`Processor.SerialNumber`,
//! `PartNumber`, the `Assembly`'s `ProductionDate`) and records them with
//! [`Db::record_node_parts`]; a part no longer found in its node is marked
//! removed (it was replaced), never deleted, so its cases and history stay
//! readable. The lot and date code come from a parts manifest
//! ([`parse_parts_manifest`], [`Db::import_parts_manifest`]): no Redfish
//! property names a manufacturing lot.
//!
//! Invariant: an observation is stored once per (serial, source id), so a
//! source read twice (a restart, an overlapping window) adds nothing.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, NaiveDate, Utc};
use orchestrator_rma::{FirmwareChange, Observation, PartRecord};
use sea_orm::sea_query::OnConflict;
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, Set, TransactionTrait};
use serde::Serialize;

use crate::entity::{part_observations, parts, releases, rollouts, update_steps};
use crate::{Db, DbError, audit};

/// What discovery read of one part on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredPart {
    pub serial: String,
    /// Vendor key as criteria files name it (`nvidia`).
    pub vendor: String,
    /// `gpu`, `baseboard`.
    pub part_kind: String,
    pub part_number: String,
    pub model: Option<String>,
    /// The part's Redfish id on the node (`GPU_SXM_1`).
    pub slot: String,
    pub production_date: Option<DateTime<Utc>>,
    pub firmware_version: Option<String>,
    /// Redfish `Status.Health` as read.
    pub health: Option<String>,
}

/// A stored part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Part {
    pub serial: String,
    pub vendor: String,
    pub part_kind: String,
    pub part_number: String,
    pub model: Option<String>,
    pub node: String,
    pub slot: String,
    pub production_date: Option<DateTime<Utc>>,
    pub lot: Option<String>,
    pub date_code: Option<String>,
    pub firmware_version: Option<String>,
    pub health: Option<String>,
    pub first_seen: DateTime<Utc>,
    pub last_seen: DateTime<Utc>,
    /// When discovery stopped finding it in its node.
    pub removed_at: Option<DateTime<Utc>>,
}

impl Part {
    /// The part as the candidate rules see it.
    pub fn record(&self) -> PartRecord {
        PartRecord {
            serial: self.serial.clone(),
            vendor: self.vendor.clone(),
            part_kind: self.part_kind.clone(),
            part_number: self.part_number.clone(),
            node: self.node.clone(),
            slot: self.slot.clone(),
        }
    }
}

pub(crate) fn to_part(m: parts::Model) -> Part {
    Part {
        serial: m.serial,
        vendor: m.vendor,
        part_kind: m.part_kind,
        part_number: m.part_number,
        model: m.model,
        node: m.node_name,
        slot: m.slot,
        production_date: m.production_date,
        lot: m.lot,
        date_code: m.date_code,
        firmware_version: m.firmware_version,
        health: m.health,
        first_seen: m.first_seen,
        last_seen: m.last_seen,
        removed_at: m.removed_at,
    }
}

/// Which parts to list.
#[derive(Debug, Clone, Default)]
pub struct PartFilter {
    pub node: Option<String>,
    pub lot: Option<String>,
    /// Also parts that were replaced.
    pub include_removed: bool,
}

/// What one node's discovery changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartsChange {
    /// Serials seen for the first time.
    pub new: Vec<String>,
    /// Serials that were on this node and are no longer found.
    pub removed: Vec<String>,
    /// Serials that were last seen on another node.
    pub moved: Vec<String>,
}

/// One row of a parts manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestRow {
    pub serial: String,
    pub part_number: Option<String>,
    pub lot: Option<String>,
    pub date_code: Option<String>,
    pub production_date: Option<NaiveDate>,
}

/// A problem in a parts manifest, with its 1-based line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestError {
    pub line: u64,
    pub message: String,
}

impl std::fmt::Display for ManifestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

/// The columns of the parts manifest (a contract: factories' exports are
/// mapped to it). `serial` is required; the others may be empty or absent.
pub const MANIFEST_COLUMNS: [&str; 5] = ["serial", "part_number", "lot", "date_code", "production_date"];

/// Parses a parts manifest: CSV with a header naming [`MANIFEST_COLUMNS`]
/// (any order, `serial` required), `production_date` as `YYYY-MM-DD`. Every
/// bad row is reported at once.
pub fn parse_parts_manifest(text: &str) -> Result<Vec<ManifestRow>, Vec<ManifestError>> {
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .flexible(false)
        .from_reader(text.as_bytes());
    let header = reader
        .headers()
        .map_err(|e| {
            vec![ManifestError {
                line: 1,
                message: format!("cannot read the header row: {e}"),
            }]
        })?
        .clone();
    let index = crate::fleet_file::csv_header_index(&header, &MANIFEST_COLUMNS, &["serial"]).map_err(|messages| {
        messages
            .into_iter()
            .map(|message| ManifestError { line: 1, message })
            .collect::<Vec<_>>()
    })?;
    let mut errors = Vec::new();
    let mut rows = Vec::new();
    let mut seen: HashMap<String, u64> = HashMap::new();
    for record in reader.records() {
        let record = match record {
            Ok(r) => r,
            Err(err) => {
                errors.push(ManifestError {
                    line: err.position().map_or(0, csv::Position::line),
                    message: err.to_string(),
                });
                continue;
            }
        };
        let line = record.position().map_or(0, csv::Position::line);
        let field = |name: &str| {
            index
                .get(name)
                .and_then(|&i| record.get(i))
                .map(str::to_owned)
                .filter(|v| !v.is_empty())
        };
        let Some(serial) = field("serial") else {
            errors.push(ManifestError {
                line,
                message: "serial is empty".into(),
            });
            continue;
        };
        if let Some(first) = seen.insert(serial.clone(), line) {
            errors.push(ManifestError {
                line,
                message: format!("serial {serial:?} is also on line {first}"),
            });
            continue;
        }
        let production_date = match field("production_date") {
            None => None,
            Some(text) => match NaiveDate::parse_from_str(&text, "%Y-%m-%d") {
                Ok(d) => Some(d),
                Err(_) => {
                    errors.push(ManifestError {
                        line,
                        message: format!("production_date {text:?} is not a date (YYYY-MM-DD)"),
                    });
                    continue;
                }
            },
        };
        rows.push(ManifestRow {
            serial,
            part_number: field("part_number"),
            lot: field("lot"),
            date_code: field("date_code"),
            production_date,
        });
    }
    if errors.is_empty() { Ok(rows) } else { Err(errors) }
}

/// What a manifest import did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ManifestImport {
    /// Parts whose lot, date code or dates were set or changed.
    pub updated: u64,
    /// Rows that already matched.
    pub unchanged: u64,
    /// Serials not discovered yet (kept out: import again after discovery).
    pub unknown: Vec<String>,
    /// Serials whose manifest part number differs from the one the part reports.
    pub part_number_mismatch: Vec<String>,
}

impl Db {
    /// Records the parts discovery found on `node` now: new serials are
    /// added, known ones refreshed (and moved if they were elsewhere), and
    /// parts of this node of the same kinds that were not found are marked
    /// removed.
    pub async fn record_node_parts(&self, node: &str, found: &[DiscoveredPart]) -> Result<PartsChange, DbError> {
        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        let serials: Vec<&str> = found.iter().map(|p| p.serial.as_str()).collect();
        let known: HashMap<String, parts::Model> = parts::Entity::find()
            .filter(parts::Column::Serial.is_in(serials.iter().copied()))
            .all(&txn)
            .await?
            .into_iter()
            .map(|m| (m.serial.clone(), m))
            .collect();
        let mut change = PartsChange::default();
        for p in found {
            if p.serial.trim().is_empty() {
                continue;
            }
            match known.get(&p.serial) {
                None => {
                    change.new.push(p.serial.clone());
                    parts::ActiveModel {
                        serial: Set(p.serial.clone()),
                        vendor: Set(p.vendor.clone()),
                        part_kind: Set(p.part_kind.clone()),
                        part_number: Set(p.part_number.clone()),
                        model: Set(p.model.clone()),
                        node_name: Set(node.to_owned()),
                        slot: Set(p.slot.clone()),
                        production_date: Set(p.production_date),
                        lot: Set(None),
                        date_code: Set(None),
                        firmware_version: Set(p.firmware_version.clone()),
                        health: Set(p.health.clone()),
                        first_seen: Set(now),
                        last_seen: Set(now),
                        removed_at: Set(None),
                    }
                    .insert(&txn)
                    .await?;
                }
                Some(m) => {
                    if m.node_name != node {
                        change.moved.push(p.serial.clone());
                    }
                    let mut am: parts::ActiveModel = m.clone().into();
                    am.vendor = Set(p.vendor.clone());
                    am.part_kind = Set(p.part_kind.clone());
                    am.part_number = Set(p.part_number.clone());
                    am.model = Set(p.model.clone());
                    am.node_name = Set(node.to_owned());
                    am.slot = Set(p.slot.clone());
                    if p.production_date.is_some() {
                        am.production_date = Set(p.production_date);
                    }
                    am.firmware_version = Set(p.firmware_version.clone());
                    am.health = Set(p.health.clone());
                    am.last_seen = Set(now);
                    am.removed_at = Set(None);
                    am.update(&txn).await?;
                }
            }
        }
        let kinds: Vec<&str> = {
            let mut k: Vec<&str> = found.iter().map(|p| p.part_kind.as_str()).collect();
            k.sort_unstable();
            k.dedup();
            k
        };
        let gone = parts::Entity::find()
            .filter(parts::Column::NodeName.eq(node))
            .filter(parts::Column::RemovedAt.is_null())
            .filter(parts::Column::PartKind.is_in(kinds))
            .all(&txn)
            .await?
            .into_iter()
            .filter(|m| !serials.contains(&m.serial.as_str()));
        for m in gone {
            change.removed.push(m.serial.clone());
            let mut am: parts::ActiveModel = m.into();
            am.removed_at = Set(Some(now));
            am.update(&txn).await?;
        }
        if !change.removed.is_empty() || !change.moved.is_empty() {
            audit::append(
                &txn,
                now,
                "controller",
                "parts.changed",
                "node",
                node,
                serde_json::json!({ "removed": change.removed, "moved": change.moved, "new": change.new }),
            )
            .await?;
        }
        txn.commit().await?;
        Ok(change)
    }

    /// Sets lot, date code and production date from a manifest. Rows for
    /// serials not discovered yet are reported, not stored. Audited as
    /// `parts.manifest`.
    pub async fn import_parts_manifest(&self, rows: &[ManifestRow], actor: &str) -> Result<ManifestImport, DbError> {
        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        let mut out = ManifestImport::default();
        for chunk in rows.chunks(500) {
            let known: HashMap<String, parts::Model> = parts::Entity::find()
                .filter(parts::Column::Serial.is_in(chunk.iter().map(|r| r.serial.as_str())))
                .all(&txn)
                .await?
                .into_iter()
                .map(|m| (m.serial.clone(), m))
                .collect();
            for row in chunk {
                let Some(m) = known.get(&row.serial) else {
                    out.unknown.push(row.serial.clone());
                    continue;
                };
                if row.part_number.as_ref().is_some_and(|pn| *pn != m.part_number) {
                    out.part_number_mismatch.push(row.serial.clone());
                }
                let production_date = row
                    .production_date
                    .and_then(|d| d.and_hms_opt(0, 0, 0))
                    .map(|d| d.and_utc())
                    .or(m.production_date);
                let lot = row.lot.clone().or_else(|| m.lot.clone());
                let date_code = row.date_code.clone().or_else(|| m.date_code.clone());
                if lot == m.lot && date_code == m.date_code && production_date == m.production_date {
                    out.unchanged += 1;
                    continue;
                }
                let mut am: parts::ActiveModel = m.clone().into();
                am.lot = Set(lot);
                am.date_code = Set(date_code);
                am.production_date = Set(production_date);
                am.update(&txn).await?;
                out.updated += 1;
            }
        }
        audit::append(
            &txn,
            now,
            actor,
            "parts.manifest",
            "parts",
            "manifest",
            serde_json::json!({
                "rows": rows.len(), "updated": out.updated, "unchanged": out.unchanged,
                "unknown": out.unknown.len(), "part_number_mismatch": out.part_number_mismatch.len(),
            }),
        )
        .await?;
        txn.commit().await?;
        Ok(out)
    }

    /// Parts matching `filter`, by node then slot.
    pub async fn parts(&self, filter: &PartFilter) -> Result<Vec<Part>, DbError> {
        let mut query = parts::Entity::find()
            .order_by_asc(parts::Column::NodeName)
            .order_by_asc(parts::Column::Slot)
            .order_by_asc(parts::Column::Serial);
        if let Some(node) = &filter.node {
            query = query.filter(parts::Column::NodeName.eq(node.as_str()));
        }
        if let Some(lot) = &filter.lot {
            query = query.filter(parts::Column::Lot.eq(lot.as_str()));
        }
        if !filter.include_removed {
            query = query.filter(parts::Column::RemovedAt.is_null());
        }
        Ok(query.all(&self.reader).await?.into_iter().map(to_part).collect())
    }

    /// One part by serial.
    pub async fn part(&self, serial: &str) -> Result<Part, DbError> {
        parts::Entity::find_by_id(serial.to_owned())
            .one(&self.reader)
            .await?
            .map(to_part)
            .ok_or_else(|| DbError::NotFound {
                what: "part",
                key: serial.to_owned(),
            })
    }

    /// Stores observations; one already stored under the same (serial,
    /// source id) is skipped. Returns how many were new.
    pub async fn record_part_observations(&self, observed: &[(String, Observation)]) -> Result<u64, DbError> {
        let mut inserted = 0;
        for chunk in observed.chunks(200) {
            let models: Vec<part_observations::ActiveModel> = chunk
                .iter()
                .map(|(serial, o)| {
                    Ok(part_observations::ActiveModel {
                        serial: Set(serial.clone()),
                        at: Set(o.at),
                        source_id: Set(o.source_id.clone()),
                        kind_json: Set(serde_json::to_value(&o.kind).map_err(|e| DbError::corrupt("observation", e))?),
                        ..Default::default()
                    })
                })
                .collect::<Result<_, DbError>>()?;
            let result = part_observations::Entity::insert_many(models)
                .on_conflict(
                    OnConflict::columns([part_observations::Column::Serial, part_observations::Column::SourceId])
                        .do_nothing()
                        .to_owned(),
                )
                .exec_without_returning(&self.writer)
                .await?;
            inserted += result;
        }
        Ok(inserted)
    }

    /// Observations of the given parts at or after `since`, by serial, oldest first.
    pub async fn part_observations(
        &self,
        serials: &[String],
        since: DateTime<Utc>,
    ) -> Result<BTreeMap<String, Vec<Observation>>, DbError> {
        let mut out: BTreeMap<String, Vec<Observation>> = BTreeMap::new();
        for chunk in serials.chunks(500) {
            let rows = part_observations::Entity::find()
                .filter(part_observations::Column::Serial.is_in(chunk.iter().map(String::as_str)))
                .filter(part_observations::Column::At.gte(since))
                .order_by_asc(part_observations::Column::At)
                .order_by_asc(part_observations::Column::Id)
                .all(&self.reader)
                .await?;
            for m in rows {
                out.entry(m.serial).or_default().push(Observation {
                    at: m.at,
                    source_id: m.source_id,
                    kind: serde_json::from_value(m.kind_json).map_err(|e| DbError::corrupt("observation", e))?,
                });
            }
        }
        Ok(out)
    }

    /// Serials with an observation stored at or after `since`.
    pub async fn observed_serials(&self, since: DateTime<Utc>) -> Result<Vec<String>, DbError> {
        use sea_orm::QuerySelect;
        let rows: Vec<String> = part_observations::Entity::find()
            .select_only()
            .column(part_observations::Column::Serial)
            .filter(part_observations::Column::At.gte(since))
            .distinct()
            .into_tuple()
            .all(&self.reader)
            .await?;
        Ok(rows)
    }

    /// Deletes observations older than `before`, except those of parts with
    /// an open RMA case (their samples are the case's evidence). Returns how
    /// many were deleted.
    pub async fn prune_part_observations(&self, before: DateTime<Utc>) -> Result<u64, DbError> {
        let keep: Vec<String> = self
            .rma_cases(&crate::rma::RmaFilter {
                open_only: true,
                ..Default::default()
            })
            .await?
            .into_iter()
            .map(|c| c.case.serial)
            .collect();
        let result = part_observations::Entity::delete_many()
            .filter(part_observations::Column::At.lt(before))
            .filter(part_observations::Column::Serial.is_not_in(keep))
            .exec(&self.writer)
            .await?;
        Ok(result.rows_affected)
    }

    /// The firmware changes of `node`'s components: each succeeded step, oldest first, with its
    /// rollout and release named.
    pub async fn node_firmware_changes(&self, node: &str) -> Result<Vec<FirmwareChange>, DbError> {
        let node = self.node_by_name(node).await?;
        let mut by_node = self.firmware_changes_by_node(&[(node.id.0, node.name.clone())]).await?;
        Ok(by_node.remove(&node.name).unwrap_or_default())
    }

    /// [`Db::node_firmware_changes`] of many nodes (`(id, name)`) in a few queries: what a pass
    /// over the fleet reads, instead of three queries a node.
    pub async fn firmware_changes_by_node(
        &self,
        nodes: &[(i64, String)],
    ) -> Result<HashMap<String, Vec<FirmwareChange>>, DbError> {
        let names: HashMap<i64, &str> = nodes.iter().map(|(id, name)| (*id, name.as_str())).collect();
        let mut steps = Vec::new();
        for chunk in nodes.chunks(500) {
            steps.extend(
                update_steps::Entity::find()
                    .filter(update_steps::Column::NodeId.is_in(chunk.iter().map(|(id, _)| *id)))
                    .filter(update_steps::Column::State.eq("succeeded"))
                    .order_by_asc(update_steps::Column::FinishedAt)
                    .order_by_asc(update_steps::Column::Id)
                    .all(&self.reader)
                    .await?,
            );
        }
        steps.sort_by(|a, b| {
            a.finished_at
                .unwrap_or(a.updated_at)
                .cmp(&b.finished_at.unwrap_or(b.updated_at))
                .then(a.id.cmp(&b.id))
        });
        let mut rollout_ids: Vec<i64> = steps.iter().map(|s| s.rollout_id).collect();
        rollout_ids.sort_unstable();
        rollout_ids.dedup();
        let rollouts: HashMap<i64, rollouts::Model> = rollouts::Entity::find()
            .filter(rollouts::Column::Id.is_in(rollout_ids))
            .all(&self.reader)
            .await?
            .into_iter()
            .map(|r| (r.id, r))
            .collect();
        let release_ids: Vec<i64> = rollouts.values().map(|r| r.release_id).collect();
        let releases: HashMap<i64, releases::Model> = releases::Entity::find()
            .filter(releases::Column::Id.is_in(release_ids))
            .all(&self.reader)
            .await?
            .into_iter()
            .map(|r| (r.id, r))
            .collect();
        let mut out: HashMap<String, Vec<FirmwareChange>> = HashMap::new();
        for s in steps {
            let (Some(rollout), Some(name)) = (rollouts.get(&s.rollout_id), names.get(&s.node_id)) else {
                continue;
            };
            let Some(release) = releases.get(&rollout.release_id) else {
                continue;
            };
            out.entry((*name).to_owned()).or_default().push(FirmwareChange {
                at: s.finished_at.unwrap_or(s.updated_at),
                component: release.component_kind.clone(),
                from_version: s.previous_version.clone().unwrap_or(s.expected_from_version.clone()),
                to_version: s.target_version.clone(),
                release: format!("{} {}", release.component_kind, release.version),
                rollout: Some(format!("rollout {}", s.rollout_id)),
            });
        }
        Ok(out)
    }
}
