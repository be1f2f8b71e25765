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

use crate::entity::{rma_attachments, rma_cases, rma_cluster_scans, rma_criteria};
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
        Ok(self.open_or_refresh_rma_case(candidate, actor).await?.0)
    }

    /// [`Db::open_rma_case`], saying whether the case is new. An open case
    /// whose candidate changed status (a field diagnostic confirmed it) gets
    /// the new candidate, audited as `rma.candidate`.
    pub async fn open_or_refresh_rma_case(&self, candidate: &Candidate, actor: &str) -> Result<(Case, bool), DbError> {
        let now = self.clock.now();
        let serial = candidate.part.serial.trim();
        if serial.is_empty() {
            return Err(DbError::Invalid {
                field: "serial".into(),
                reason: "a case needs the part's serial number".into(),
            });
        }
        let txn = self.writer.begin().await?;
        let same = rma_cases::Entity::find()
            .filter(rma_cases::Column::Serial.eq(serial))
            .filter(rma_cases::Column::Rule.eq(candidate.rule.as_str()))
            .all(&txn)
            .await?;
        if let Some(open) = same.iter().find(|m| m.open) {
            let stored = to_case(open.clone())?;
            if stored.candidate.status != candidate.status {
                rma_cases::Entity::update_many()
                    .set(rma_cases::ActiveModel {
                        candidate_json: Set(
                            serde_json::to_value(candidate).map_err(|e| DbError::corrupt("rma candidate", e))?
                        ),
                        updated_at: Set(now),
                        ..Default::default()
                    })
                    .filter(rma_cases::Column::Id.eq(open.id.as_str()))
                    .exec(&txn)
                    .await?;
                audit::append(
                    &txn,
                    now,
                    actor,
                    "rma.candidate",
                    "rma_case",
                    &open.id,
                    serde_json::json!({ "from": stored.candidate.status, "to": candidate.status, "samples": candidate.samples.len() }),
                )
                .await?;
                txn.commit().await?;
            }
            return Ok((stored.case, false));
        }
        // A human ended a case of this part and rule: only evidence newer than that decision opens
        // another, or every pass would undo the decision and quarantine the node again.
        let latest_sample = candidate
            .samples
            .iter()
            .map(|o| o.at)
            .max()
            .unwrap_or(candidate.began_at);
        if let Some(decided) = same
            .iter()
            .filter(|m| m.updated_at >= latest_sample)
            .max_by_key(|m| m.updated_at)
        {
            return Ok((to_case(decided.clone())?.case, false));
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
        Ok((case, true))
    }

    /// One case.
    pub async fn rma_case(&self, id: &str) -> Result<RmaCase, DbError> {
        let model = rma_cases::Entity::find_by_id(id.to_owned())
            .one(&self.reader)
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
        query.all(&self.reader).await?.into_iter().map(to_case).collect()
    }

    /// How many cases are open.
    pub async fn open_rma_case_count(&self) -> Result<u64, DbError> {
        Ok(rma_cases::Entity::find()
            .filter(rma_cases::Column::Open.eq(true))
            .count(&self.reader)
            .await?)
    }

    /// Applies `event` to case `id` as `actor`: the pure machine decides,
    /// the row is written only if the case is still in the state read
    /// (`Stale` otherwise), with its audit entry. A refused event is
    /// `Invalid` (wrong state, missing field) or `NotPermitted` (role).
    pub async fn apply_rma_event(&self, id: &str, event: CaseEvent, actor: &Actor) -> Result<Case, DbError> {
        let current = self.rma_case(id).await?.case;
        let next = current.apply(event, actor, self.clock.now()).map_err(case_refusal)?;
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
        let txn = self.writer.begin().await?;
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

/// A criteria file in force, pinned to the commit it was read at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CriteriaFile {
    /// Path in the policy repository (`rma/nvidia-gpu.yaml`).
    pub path: String,
    /// Commit it was read at (`local` for files loaded from a directory).
    pub commit_id: String,
    /// Git blob id, or the sha256 of the text for local files.
    pub blob_id: String,
    pub source: String,
}

/// A file attached to a case.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Attachment {
    pub name: String,
    pub kind: AttachmentKind,
    pub sha256: String,
    pub size_bytes: u64,
    pub added_by: String,
    pub added_at: DateTime<Utc>,
}

/// Where an attachment came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttachmentKind {
    /// Collected from the BMC by `LogService.CollectDiagnosticData`.
    RedfishDiagnostic,
    /// The vendor's field diagnostic log, uploaded by a person.
    FieldDiagnostic,
    /// A snapshot of the case's evidence package (archive or manifest) as it
    /// was when evidence was recorded: what the case's manifest hash names.
    EvidencePackage,
}

impl AttachmentKind {
    fn as_str(self) -> &'static str {
        match self {
            AttachmentKind::RedfishDiagnostic => "redfish_diagnostic",
            AttachmentKind::FieldDiagnostic => "field_diagnostic",
            AttachmentKind::EvidencePackage => "evidence_package",
        }
    }

    fn parse(text: &str) -> Result<Self, DbError> {
        match text {
            "redfish_diagnostic" => Ok(AttachmentKind::RedfishDiagnostic),
            "field_diagnostic" => Ok(AttachmentKind::FieldDiagnostic),
            "evidence_package" => Ok(AttachmentKind::EvidencePackage),
            other => Err(DbError::corrupt("rma attachment kind", other)),
        }
    }
}

/// A transition the case machine refused: `NotPermitted` for a role, else `Invalid`.
pub(crate) fn case_refusal(err: orchestrator_rma::CaseError) -> DbError {
    match err {
        orchestrator_rma::CaseError::Forbidden { .. } => DbError::NotPermitted {
            action: "this RMA transition",
            reason: err.to_string(),
        },
        other => DbError::Invalid {
            field: "event".into(),
            reason: other.to_string(),
        },
    }
}

/// Largest attachment stored: diagnostic archives are a few MiB; vendor
/// portals cap uploads well below this.
pub const MAX_ATTACHMENT_BYTES: usize = 32 * 1024 * 1024;

fn attachment_of(m: &rma_attachments::Model) -> Result<Attachment, DbError> {
    Ok(Attachment {
        name: m.name.clone(),
        kind: AttachmentKind::parse(&m.kind)?,
        sha256: m.sha256.clone(),
        size_bytes: u64::try_from(m.size_bytes).unwrap_or(0),
        added_by: m.added_by.clone(),
        added_at: m.added_at,
    })
}

/// A stored defect-cluster scan of one period.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterScan {
    pub period_start: DateTime<Utc>,
    pub period_end: DateTime<Utc>,
    pub scanned_at: DateTime<Utc>,
    /// The `orchestrator_rma::ClusterReport`, as stored.
    pub report: serde_json::Value,
}

impl Db {
    /// Replaces the criteria in force with `files` (each already linted by
    /// the caller). Audited as `rma.criteria` with the paths and commits.
    pub async fn replace_rma_criteria(&self, files: &[CriteriaFile], actor: &str) -> Result<(), DbError> {
        for f in files {
            orchestrator_rma::parse_criteria(&f.source).map_err(|e| DbError::Invalid {
                field: f.path.clone(),
                reason: e.to_string(),
            })?;
        }
        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        rma_criteria::Entity::delete_many().exec(&txn).await?;
        for f in files {
            rma_criteria::ActiveModel {
                path: Set(f.path.clone()),
                commit_id: Set(f.commit_id.clone()),
                blob_id: Set(f.blob_id.clone()),
                source: Set(f.source.clone()),
                loaded_by: Set(actor.to_owned()),
                loaded_at: Set(now),
            }
            .insert(&txn)
            .await?;
        }
        audit::append(
            &txn,
            now,
            actor,
            "rma.criteria",
            "rma_criteria",
            "in force",
            serde_json::json!(
                files
                    .iter()
                    .map(|f| serde_json::json!({"path": f.path, "commit": f.commit_id, "blob": f.blob_id}))
                    .collect::<Vec<_>>()
            ),
        )
        .await?;
        txn.commit().await?;
        Ok(())
    }

    /// The criteria files in force, by path.
    pub async fn rma_criteria_files(&self) -> Result<Vec<CriteriaFile>, DbError> {
        Ok(rma_criteria::Entity::find()
            .order_by_asc(rma_criteria::Column::Path)
            .all(&self.reader)
            .await?
            .into_iter()
            .map(|m| CriteriaFile {
                path: m.path,
                commit_id: m.commit_id,
                blob_id: m.blob_id,
                source: m.source,
            })
            .collect())
    }

    /// The criteria in force, parsed.
    pub async fn rma_criteria(&self) -> Result<Vec<orchestrator_rma::Criteria>, DbError> {
        self.rma_criteria_files()
            .await?
            .iter()
            .map(|f| orchestrator_rma::parse_criteria(&f.source).map_err(|e| DbError::corrupt("rma criteria", e)))
            .collect()
    }

    /// The quota of `vendor` from the criteria in force (the first file of
    /// that vendor that states one).
    pub async fn rma_quota(&self, vendor: &str) -> Result<Quota, DbError> {
        self.rma_criteria()
            .await?
            .into_iter()
            .find(|c| c.vendor == vendor)
            .map(|c| c.quota)
            .ok_or_else(|| DbError::NotFound {
                what: "rma criteria for vendor",
                key: vendor.to_owned(),
            })
    }

    /// Attaches a file to case `id`. The same name twice is refused (an
    /// attachment is evidence: it is never overwritten). Audited as
    /// `rma.attachment` with its hash, never its content.
    pub async fn add_rma_attachment(
        &self,
        id: &str,
        name: &str,
        kind: AttachmentKind,
        content: &[u8],
        actor: &str,
    ) -> Result<Attachment, DbError> {
        let name = name.trim();
        let bad = |reason: &str| DbError::Invalid {
            field: "attachment name".into(),
            reason: reason.to_owned(),
        };
        if name.is_empty() || name.len() > 100 {
            return Err(bad("must be 1-100 bytes"));
        }
        if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
            || name.starts_with('.')
        {
            return Err(bad(
                "may hold only letters, digits, '.', '_' and '-', and not start with '.'",
            ));
        }
        if content.len() > MAX_ATTACHMENT_BYTES {
            return Err(DbError::Invalid {
                field: "attachment".into(),
                reason: format!("is larger than {MAX_ATTACHMENT_BYTES} bytes"),
            });
        }
        if let Some(what) = orchestrator_rma::secret_sweep(content, &[]) {
            return Err(DbError::Invalid {
                field: "attachment".into(),
                reason: format!("contains {what}; remove it before attaching"),
            });
        }
        self.rma_case(id).await?;
        let now = self.clock.now();
        let sha256 = orchestrator_rma::evidence::sha256_hex(content);
        let txn = self.writer.begin().await?;
        let exists = rma_attachments::Entity::find()
            .filter(rma_attachments::Column::CaseId.eq(id))
            .filter(rma_attachments::Column::Name.eq(name))
            .one(&txn)
            .await?;
        if exists.is_some() {
            return Err(DbError::AlreadyExists {
                what: "rma attachment",
                key: format!("{id}/{name}"),
            });
        }
        let model = rma_attachments::ActiveModel {
            case_id: Set(id.to_owned()),
            name: Set(name.to_owned()),
            kind: Set(kind.as_str().to_owned()),
            content: Set(content.to_vec()),
            sha256: Set(sha256.clone()),
            size_bytes: Set(i64::try_from(content.len()).unwrap_or(i64::MAX)),
            added_by: Set(actor.to_owned()),
            added_at: Set(now),
            ..Default::default()
        }
        .insert(&txn)
        .await?;
        audit::append(
            &txn,
            now,
            actor,
            "rma.attachment",
            "rma_case",
            id,
            serde_json::json!({ "name": name, "kind": kind.as_str(), "sha256": sha256, "size_bytes": content.len() }),
        )
        .await?;
        txn.commit().await?;
        attachment_of(&model)
    }

    /// Records the result of the vendor's field diagnostic for case `id`'s part, as the sample the
    /// criteria's `confirmed_by` reads (the monitor's next pass moves the candidate to met, or to
    /// diagnostic passed). `evidence` names the uploaded log it comes from. Recording the same
    /// log's result twice is one sample. Audited as `rma.field_diagnostic`.
    pub async fn record_field_diagnostic(
        &self,
        id: &str,
        passed: bool,
        evidence: &str,
        actor: &str,
    ) -> Result<(), DbError> {
        let case = self.rma_case(id).await?.case;
        if !case.state.is_open() {
            return Err(DbError::Invalid {
                field: "case".into(),
                reason: format!("case {id} is closed; a diagnostic result no longer changes it"),
            });
        }
        let now = self.clock.now();
        let observation = orchestrator_rma::Observation {
            at: now,
            source_id: format!("field-diagnostic:{id}:{evidence}"),
            kind: orchestrator_rma::ObservationKind::FieldDiagnostic { passed },
        };
        self.record_part_observations(&[(case.serial.clone(), observation)])
            .await?;
        audit::append(
            &self.writer,
            now,
            actor,
            "rma.field_diagnostic",
            "rma_case",
            id,
            serde_json::json!({ "serial": case.serial, "passed": passed, "evidence": evidence }),
        )
        .await
    }

    /// The attachments of case `id`, by name.
    pub async fn rma_attachments(&self, id: &str) -> Result<Vec<Attachment>, DbError> {
        rma_attachments::Entity::find()
            .filter(rma_attachments::Column::CaseId.eq(id))
            .order_by_asc(rma_attachments::Column::Name)
            .all(&self.reader)
            .await?
            .iter()
            .map(attachment_of)
            .collect()
    }

    /// One attachment's content.
    pub async fn rma_attachment_content(&self, id: &str, name: &str) -> Result<(Attachment, Vec<u8>), DbError> {
        let m = rma_attachments::Entity::find()
            .filter(rma_attachments::Column::CaseId.eq(id))
            .filter(rma_attachments::Column::Name.eq(name))
            .one(&self.reader)
            .await?
            .ok_or_else(|| DbError::NotFound {
                what: "rma attachment",
                key: format!("{id}/{name}"),
            })?;
        Ok((attachment_of(&m)?, m.content))
    }

    /// Stores the scan of one period (a later scan of the same period
    /// replaces it: the period's data may have grown until its end).
    pub async fn store_cluster_scan(
        &self,
        period_start: DateTime<Utc>,
        period_end: DateTime<Utc>,
        report: &orchestrator_rma::ClusterReport,
    ) -> Result<(), DbError> {
        let now = self.clock.now();
        let report = serde_json::to_value(report).map_err(|e| DbError::corrupt("cluster report", e))?;
        let txn = self.writer.begin().await?;
        rma_cluster_scans::Entity::delete_many()
            .filter(rma_cluster_scans::Column::PeriodStart.eq(period_start))
            .exec(&txn)
            .await?;
        rma_cluster_scans::ActiveModel {
            period_start: Set(period_start),
            period_end: Set(period_end),
            scanned_at: Set(now),
            report_json: Set(report),
            ..Default::default()
        }
        .insert(&txn)
        .await?;
        txn.commit().await?;
        Ok(())
    }

    /// The most recent scans, newest period first.
    pub async fn cluster_scans(&self, limit: u64) -> Result<Vec<ClusterScan>, DbError> {
        use sea_orm::QuerySelect;
        Ok(rma_cluster_scans::Entity::find()
            .order_by_desc(rma_cluster_scans::Column::PeriodStart)
            .limit(limit)
            .all(&self.reader)
            .await?
            .into_iter()
            .map(|m| ClusterScan {
                period_start: m.period_start,
                period_end: m.period_end,
                scanned_at: m.scanned_at,
                report: m.report_json,
            })
            .collect())
    }
}
