//! Read models of the RMA pipeline for the pages and the API: parts paged
//! and filtered in SQL, one part with its samples, firmware and cases, and
//! each vendor's quota with its queue. Nothing here writes; the pipeline's
//! rules stay in `orchestrator_rma` and the writes in `rma` and `parts`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use orchestrator_rma::{
    CaseState, FirmwareChange, Observation, QuotaStatus, Severity, Waiting, queue_order, quota_status, submissions_of,
};
use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder, QuerySelect};
use serde::Serialize;

use crate::entity::{part_observations, parts};
use crate::parts::{Part, to_part};
use crate::rma::{RmaCase, RmaFilter};
use crate::{Db, DbError};

/// Which parts to list, and which page of them.
#[derive(Debug, Clone, Default)]
pub struct PartsQuery {
    pub node: Option<String>,
    pub vendor: Option<String>,
    pub part_number: Option<String>,
    pub lot: Option<String>,
    /// Also parts that were replaced.
    pub include_removed: bool,
    pub limit: u64,
    pub offset: u64,
}

/// One page of parts and how many match in all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartsPage {
    pub total: u64,
    pub parts: Vec<Part>,
}

/// One part with what a person checks before claiming it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PartDetail {
    pub part: Part,
    /// The newest samples first, at most the number asked for.
    pub observations: Vec<Observation>,
    /// Samples stored for the part in all.
    pub observations_total: u64,
    /// Firmware flashed on the part's node for the part's kind, oldest first.
    pub firmware_history: Vec<FirmwareChange>,
    /// The part's RMA cases, oldest first.
    pub cases: Vec<RmaCase>,
}

/// A case waiting for a submission slot, with its place in the queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueuedCase {
    pub case_id: String,
    /// 1-based place in the vendor's queue.
    pub position: usize,
    pub severity: Severity,
    pub opened_at: DateTime<Utc>,
}

/// A vendor's quota this period and the cases waiting for it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VendorQuota {
    pub vendor: String,
    /// Length of the vendor's rolling period, in days.
    pub period_days: f64,
    pub status: QuotaStatus,
    /// Cases with their evidence collected, in submission order.
    pub queue: Vec<QueuedCase>,
}

/// The vendor's queue at `now` from every case of `vendor`.
pub fn vendor_queue(cases: &[orchestrator_rma::Case], vendor: &str) -> Vec<QueuedCase> {
    let waiting: Vec<Waiting> = cases
        .iter()
        .filter(|c| c.vendor == vendor && c.state == CaseState::EvidenceCollected)
        .map(|c| Waiting {
            case_id: c.id.clone(),
            severity: c.severity,
            opened_at: c.opened_at,
        })
        .collect();
    queue_order(&waiting)
        .into_iter()
        .enumerate()
        .map(|(i, w)| QueuedCase {
            case_id: w.case_id.clone(),
            position: i + 1,
            severity: w.severity,
            opened_at: w.opened_at,
        })
        .collect()
}

impl Db {
    /// Parts matching `query`, by node, slot and serial, one page of them.
    pub async fn parts_page(&self, query: &PartsQuery) -> Result<PartsPage, DbError> {
        let mut select = parts::Entity::find();
        if let Some(node) = &query.node {
            select = select.filter(parts::Column::NodeName.eq(node.as_str()));
        }
        if let Some(vendor) = &query.vendor {
            select = select.filter(parts::Column::Vendor.eq(vendor.as_str()));
        }
        if let Some(pn) = &query.part_number {
            select = select.filter(parts::Column::PartNumber.eq(pn.as_str()));
        }
        if let Some(lot) = &query.lot {
            select = select.filter(parts::Column::Lot.eq(lot.as_str()));
        }
        if !query.include_removed {
            select = select.filter(parts::Column::RemovedAt.is_null());
        }
        let total = select.clone().count(&self.reader).await?;
        let rows = select
            .order_by_asc(parts::Column::NodeName)
            .order_by_asc(parts::Column::Slot)
            .order_by_asc(parts::Column::Serial)
            .offset(query.offset)
            .limit(query.limit)
            .all(&self.reader)
            .await?;
        Ok(PartsPage {
            total,
            parts: rows.into_iter().map(to_part).collect(),
        })
    }

    /// One part with its newest `samples` observations, the firmware of its
    /// kind flashed on its node, and its cases.
    pub async fn part_detail(&self, serial: &str, samples: u64) -> Result<PartDetail, DbError> {
        let part = self.part(serial).await?;
        let select = part_observations::Entity::find().filter(part_observations::Column::Serial.eq(serial));
        let observations_total = select.clone().count(&self.reader).await?;
        let observations = select
            .order_by_desc(part_observations::Column::At)
            .order_by_desc(part_observations::Column::Id)
            .limit(samples)
            .all(&self.reader)
            .await?
            .into_iter()
            .map(|m| {
                Ok(Observation {
                    at: m.at,
                    source_id: m.source_id,
                    kind: serde_json::from_value(m.kind_json).map_err(|e| DbError::corrupt("observation", e))?,
                })
            })
            .collect::<Result<Vec<_>, DbError>>()?;
        // A part whose node is no longer in the fleet has no flash record to show.
        let firmware_history = match self.node_firmware_changes(&part.node).await {
            Ok(changes) => changes.into_iter().filter(|c| c.component == part.part_kind).collect(),
            Err(DbError::NotFound { .. }) => Vec::new(),
            Err(other) => return Err(other),
        };
        let cases = self
            .rma_cases(&RmaFilter {
                serial: Some(serial.to_owned()),
                ..Default::default()
            })
            .await?;
        Ok(PartDetail {
            part,
            observations,
            observations_total,
            firmware_history,
            cases,
        })
    }

    /// Every vendor with criteria in force: its quota used and left now and
    /// the cases waiting for a slot, by vendor.
    pub async fn rma_quotas(&self) -> Result<Vec<VendorQuota>, DbError> {
        let now = self.clock.now();
        let mut quotas: BTreeMap<String, orchestrator_rma::Quota> = BTreeMap::new();
        for criteria in self.rma_criteria().await? {
            // The first file of a vendor states its quota, as `Db::rma_quota` reads it.
            quotas.entry(criteria.vendor.clone()).or_insert(criteria.quota);
        }
        let cases: Vec<orchestrator_rma::Case> = self
            .rma_cases(&RmaFilter::default())
            .await?
            .into_iter()
            .map(|c| c.case)
            .collect();
        Ok(quotas
            .into_iter()
            .map(|(vendor, quota)| VendorQuota {
                period_days: quota.period.num_seconds() as f64 / 86_400.0,
                status: quota_status(&quota, &submissions_of(&cases, &vendor), now),
                queue: vendor_queue(&cases, &vendor),
                vendor,
            })
            .collect())
    }
}
