//! RMA cases behind typed functions. The pipeline's rules are the pure
//! `orchestrator_rma` crate: a case moves only by [`Case::apply`] (role,
//! state and required fields checked there), a submission only with an
//! [`orchestrator_rma::Admission`] from the vendor's quota. This module
//! stores what those return, conditionally on the state it read, with an
//! audit entry per transition (`rma.transition`, the case's
//! [`TransitionRecord`]).
//!
//! Invariant: at most one open case per (serial, rule); a node with an open
//! case is kept out of rollouts ([`Db::rma_holds`], read by the planner's
//! fleet snapshot).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use orchestrator_rma::{Actor, Candidate, Case, CaseEvent, CaseState, Quota, QuotaError, Waiting};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder, Set, TransactionTrait,
};
use serde::Serialize;

use crate::entity::rma_cases;
use crate::{Db, DbError, audit};

/// One stored case with the candidate that opened it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RmaCase {
    pub case: Case,
    /// The rule met, the samples proving it, any firmware suspicion.
    pub candidate: Candidate,
    pub updated_at: DateTime<Utc>,
}

/// Which cases to list.
#[derive(Debug, Clone, Default)]
pub struct RmaFilter {
    /// Only cases not verified or closed.
    pub open_only: bool,
    pub vendor: Option<String>,
    pub node: Option<String>,
    pub serial: Option<String>,
}

fn state_text(state: CaseState) -> String {
    // The serde spelling is the stored one (snake_case).
    serde_json::to_value(state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn to_case(m: rma_cases::Model) -> Result<RmaCase, DbError> {
    Ok(RmaCase {
        case: serde_json::from_value(m.case_json).map_err(|e| DbError::corrupt("rma case", e))?,
        candidate: serde_json::from_value(m.candidate_json).map_err(|e| DbError::corrupt("rma candidate", e))?,
        updated_at: m.updated_at,
    })
}

/// A case id safe in a URL and a file name: `RMA-<serial>-<rule>-<n>`.
fn case_id(serial: &str, rule: &str, n: u64) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                    c
                } else {
                    '-'
                }
            })
            .collect()
    };
    format!("RMA-{}-{}-{n}", clean(serial), clean(rule))
}

impl Db {
    /// Opens a case for `candidate` (idempotent: an open case of the same
    /// serial and rule is returned unchanged). Audited as `rma.open`.
    pub async fn open_rma_case(&self, candidate: &Candidate, actor: &str) -> Result<Case, DbError> {
        let now = self.clock.now();
        let serial = candidate.part.serial.trim();
        if serial.is_empty() {
            return Err(DbError::Invalid {
                field: "serial".into(),
                reason: "a case needs the part's serial number".into(),
            });
        }
        let txn = self.conn.begin().await?;
        let same = rma_cases::Entity::find()
            .filter(rma_cases::Column::Serial.eq(serial))
            .filter(rma_cases::Column::Rule.eq(candidate.rule.as_str()))
            .all(&txn)
            .await?;
        if let Some(open) = same.iter().find(|m| m.open) {
            return to_case(open.clone()).map(|c| c.case);
        }
        let id = case_id(serial, &candidate.rule, same.len() as u64 + 1);
        let case = Case::open(id.clone(), candidate, now);
        let as_json =
            |v: serde_json::Result<serde_json::Value>, what: &'static str| v.map_err(|e| DbError::corrupt(what, e));
        rma_cases::ActiveModel {
            id: Set(id.clone()),
            serial: Set(serial.to_owned()),
            rule: Set(candidate.rule.clone()),
            node_name: Set(case.node.clone()),
            vendor: Set(case.vendor.clone()),
            state: Set(state_text(case.state)),
            open: Set(true),
            case_json: Set(as_json(serde_json::to_value(&case), "rma case")?),
            candidate_json: Set(as_json(serde_json::to_value(candidate), "rma candidate")?),
            opened_at: Set(now),
            updated_at: Set(now),
        }
        .insert(&txn)
        .await?;
        audit::append(
            &txn,
            now,
            actor,
            "rma.open",
            "rma_case",
            &id,
            serde_json::json!({
                "serial": serial,
                "node": case.node,
                "vendor": case.vendor,
                "rule": case.rule,
                "failure_mode": case.failure_mode,
                "firmware_suspected": candidate.firmware_suspected,
            }),
        )
        .await?;
        txn.commit().await?;
        Ok(case)
    }

    /// One case.
    pub async fn rma_case(&self, id: &str) -> Result<RmaCase, DbError> {
        let model = rma_cases::Entity::find_by_id(id.to_owned())
            .one(&self.conn)
            .await?
            .ok_or_else(|| DbError::NotFound {
                what: "rma case",
                key: id.to_owned(),
            })?;
        to_case(model)
    }

    /// Cases matching `filter`, oldest first.
    pub async fn rma_cases(&self, filter: &RmaFilter) -> Result<Vec<RmaCase>, DbError> {
        let mut query = rma_cases::Entity::find().order_by_asc(rma_cases::Column::OpenedAt);
        if filter.open_only {
            query = query.filter(rma_cases::Column::Open.eq(true));
        }
        if let Some(vendor) = &filter.vendor {
            query = query.filter(rma_cases::Column::Vendor.eq(vendor.as_str()));
        }
        if let Some(node) = &filter.node {
            query = query.filter(rma_cases::Column::NodeName.eq(node.as_str()));
        }
        if let Some(serial) = &filter.serial {
            query = query.filter(rma_cases::Column::Serial.eq(serial.as_str()));
        }
        query.all(&self.conn).await?.into_iter().map(to_case).collect()
    }

    /// How many cases are open.
    pub async fn open_rma_case_count(&self) -> Result<u64, DbError> {
        Ok(rma_cases::Entity::find()
            .filter(rma_cases::Column::Open.eq(true))
            .count(&self.conn)
            .await?)
    }

    /// Applies `event` to case `id` as `actor`: the pure machine decides,
    /// the row is written only if the case is still in the state read
    /// (`Stale` otherwise), with its audit entry. A refused event is
    /// `Invalid` (wrong state, missing field) or `NotPermitted` (role).
    pub async fn apply_rma_event(&self, id: &str, event: CaseEvent, actor: &Actor) -> Result<Case, DbError> {
        let current = self.rma_case(id).await?.case;
        let next = current.apply(event, actor, self.clock.now()).map_err(|err| match err {
            orchestrator_rma::CaseError::Forbidden { .. } => DbError::NotPermitted {
                action: "this RMA transition",
                reason: err.to_string(),
            },
            other => DbError::Invalid {
                field: "event".into(),
                reason: other.to_string(),
            },
        })?;
        self.store_rma_transition(&current, &next, &actor.name).await?;
        Ok(next)
    }

    /// Submits case `id` to its vendor under `quota`: admitted when the case
    /// is within the quota left this period in queue order (severity, then
    /// age); otherwise `Conflict` saying its position in the queue and when
    /// the next slot opens, and the case keeps waiting.
    pub async fn submit_rma_case(
        &self,
        id: &str,
        quota: &Quota,
        vendor_reference: &str,
        actor: &Actor,
    ) -> Result<Case, DbError> {
        let current = self.rma_case(id).await?.case;
        let vendor_cases: Vec<Case> = self
            .rma_cases(&RmaFilter {
                vendor: Some(current.vendor.clone()),
                ..Default::default()
            })
            .await?
            .into_iter()
            .map(|c| c.case)
            .collect();
        let submissions = orchestrator_rma::submissions_of(&vendor_cases, &current.vendor);
        let waiting: Vec<Waiting> = vendor_cases
            .iter()
            .filter(|c| c.state == CaseState::EvidenceCollected)
            .map(|c| Waiting {
                case_id: c.id.clone(),
                severity: c.severity,
                opened_at: c.opened_at,
            })
            .collect();
        let now = self.clock.now();
        let admission = orchestrator_rma::request_submission(quota, &current.vendor, &submissions, &waiting, id, now)
            .map_err(|err| match err {
            QuotaError::Refused { .. } => DbError::Conflict {
                what: "rma case",
                key: id.to_owned(),
                reason: err.to_string(),
            },
            QuotaError::NotWaiting { .. } => DbError::Invalid {
                field: "state".into(),
                reason: format!("{err}: only a case with its evidence collected can be submitted"),
            },
        })?;
        self.apply_rma_event(
            id,
            CaseEvent::Submit {
                admission,
                vendor_reference: vendor_reference.to_owned(),
            },
            actor,
        )
        .await
    }

    async fn store_rma_transition(&self, current: &Case, next: &Case, actor: &str) -> Result<(), DbError> {
        let now = self.clock.now();
        let txn = self.conn.begin().await?;
        let result = rma_cases::Entity::update_many()
            .set(rma_cases::ActiveModel {
                state: Set(state_text(next.state)),
                open: Set(next.state.is_open()),
                case_json: Set(serde_json::to_value(next).map_err(|e| DbError::corrupt("rma case", e))?),
                updated_at: Set(now),
                ..Default::default()
            })
            .filter(rma_cases::Column::Id.eq(current.id.as_str()))
            .filter(rma_cases::Column::State.eq(state_text(current.state)))
            .exec(&txn)
            .await?;
        if result.rows_affected != 1 {
            return Err(DbError::Stale {
                what: "rma case",
                key: current.id.clone(),
                expected: state_text(current.state),
            });
        }
        let record = next.history.last();
        audit::append(
            &txn,
            now,
            actor,
            "rma.transition",
            "rma_case",
            &current.id,
            serde_json::to_value(record).unwrap_or_default(),
        )
        .await?;
        txn.commit().await?;
        Ok(())
    }

    /// Nodes kept out of rollouts by an open case, with the reason the plan
    /// shows (several cases on one node listed together).
    pub async fn rma_holds(&self) -> Result<BTreeMap<String, String>, DbError> {
        let open: Vec<Case> = self
            .rma_cases(&RmaFilter {
                open_only: true,
                ..Default::default()
            })
            .await?
            .into_iter()
            .map(|c| c.case)
            .collect();
        Ok(orchestrator_rma::quarantined_nodes(&open))
    }
}
