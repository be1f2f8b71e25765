//! Deciding, from a new snapshot, which version of each policy is in force.
//! Pure: the caller reads the snapshot and stores the result.
//!
//! Rules:
//! - a valid file at the new commit becomes the policy in force;
//! - an invalid file is reported, and the policy previously in force from the
//!   same path (or with the same name) stays in force: a bad commit never
//!   takes a working policy away;
//! - a policy whose file is gone from the commit is no longer in force for
//!   new rollouts (running rollouts keep their pinned blob either way).

use std::collections::{BTreeMap, BTreeSet};

use orchestrator_db::rma::CriteriaFile;
use orchestrator_policy::lint_files;

use crate::source::Snapshot;

/// A policy version in force (or pinned by a rollout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InForce {
    /// The policy's `name`.
    pub name: String,
    /// Path of its file in the repository.
    pub path: String,
    /// Commit it was read at.
    pub commit_id: String,
    /// Blob id of the file.
    pub blob_id: String,
    /// The file's text.
    pub source: String,
}

/// A file at the new commit that was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// Path in the repository.
    pub path: String,
    /// Blob id of the refused file.
    pub blob_id: String,
    /// `path:line:col: message` lines (errors and warnings).
    pub diagnostics: Vec<String>,
    /// The version that stays in force instead, if there was one.
    pub kept: Option<InForce>,
}

/// What a sync decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncReport {
    /// The commit synced.
    pub commit_id: String,
    /// The complete set in force after the sync, by name.
    pub in_force: BTreeMap<String, InForce>,
    /// Names whose in-force version changed (new or updated).
    pub changed: Vec<String>,
    /// Files refused at this commit.
    pub rejected: Vec<Rejection>,
    /// Names no longer in force because their file is gone.
    pub removed: Vec<String>,
    /// Warnings on accepted files, as `path:line:col: warning: ...`.
    pub warnings: Vec<String>,
}

/// Computes the policies in force after syncing `snapshot`, given those in
/// force before.
pub fn plan_sync(previous: &BTreeMap<String, InForce>, snapshot: &Snapshot) -> SyncReport {
    let reports = lint_files(snapshot.files.iter().map(|f| (f.path.clone(), f.content.clone())));
    let mut in_force = BTreeMap::new();
    let mut changed = Vec::new();
    let mut rejected = Vec::new();
    let mut warnings = Vec::new();
    for (file, report) in snapshot.files.iter().zip(&reports) {
        let rendered = report.rendered();
        match &report.checked.policy {
            Some(policy) => {
                warnings.extend(rendered);
                let entry = InForce {
                    name: policy.name.clone(),
                    path: file.path.clone(),
                    commit_id: snapshot.commit_id.clone(),
                    // Accepted files passed UTF-8 validation.
                    source: String::from_utf8_lossy(&file.content).into_owned(),
                    blob_id: file.blob_id.clone(),
                };
                match previous.get(&policy.name) {
                    // Same content: keep the commit it was first seen at, so
                    // unrelated commits do not churn the record.
                    Some(prev) if prev.blob_id == entry.blob_id && prev.path == entry.path => {
                        in_force.insert(entry.name.clone(), prev.clone());
                    }
                    _ => {
                        changed.push(entry.name.clone());
                        in_force.insert(entry.name.clone(), entry);
                    }
                }
            }
            None => {
                let kept = previous.values().find(|p| p.path == file.path).cloned();
                rejected.push(Rejection {
                    path: file.path.clone(),
                    blob_id: file.blob_id.clone(),
                    diagnostics: rendered,
                    kept,
                });
            }
        }
    }
    // Keep the last good version for refused files, unless a valid file at
    // this commit now provides that name.
    for r in &rejected {
        if let Some(kept) = &r.kept {
            in_force.entry(kept.name.clone()).or_insert_with(|| kept.clone());
        }
    }
    let present: BTreeSet<&str> = snapshot.files.iter().map(|f| f.path.as_str()).collect();
    let removed = previous
        .values()
        .filter(|p| !in_force.contains_key(&p.name) && !present.contains(p.path.as_str()))
        .map(|p| p.name.clone())
        .collect();
    SyncReport {
        commit_id: snapshot.commit_id.clone(),
        in_force,
        changed,
        rejected,
        removed,
        warnings,
    }
}

/// An RMA criteria file offered for the set in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CriteriaCandidate {
    /// Path (in the repository, or as given on the command line).
    pub path: String,
    /// Commit it was read at (`local` for a directory).
    pub commit_id: String,
    /// Blob id (or a content hash).
    pub blob_id: String,
    /// The file's bytes.
    pub content: Vec<u8>,
}

/// What to keep in force for RMA criteria, by the policies' rule: a valid file replaces the
/// version of its path; an invalid one is reported and the previous version of the same path stays;
/// a path gone from the set is dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CriteriaPlan {
    /// The set in force after the sync, by path.
    pub in_force: Vec<CriteriaFile>,
    /// `path:line:col: message` lines of refused files.
    pub rejected: Vec<String>,
    /// Whether `in_force` differs from what was stored.
    pub changed: bool,
}

impl crate::source::Snapshot {
    /// The snapshot's RMA criteria files, each pinned to the snapshot's commit.
    pub fn criteria_candidates(&self) -> Vec<CriteriaCandidate> {
        self.rma_files
            .iter()
            .map(|f| CriteriaCandidate {
                path: f.path.clone(),
                commit_id: self.commit_id.clone(),
                blob_id: f.blob_id.clone(),
                content: f.content.clone(),
            })
            .collect()
    }
}

/// Decides the criteria in force from `offered` against `previous`.
pub fn plan_criteria(previous: &[CriteriaFile], offered: &[CriteriaCandidate]) -> CriteriaPlan {
    let texts: Vec<(String, String)> = offered
        .iter()
        .map(|f| (f.path.clone(), String::from_utf8_lossy(&f.content).into_owned()))
        .collect();
    let reports = orchestrator_rma::lint_files(texts.clone());
    let mut in_force = Vec::new();
    let mut rejected = Vec::new();
    for ((file, report), (_, text)) in offered.iter().zip(&reports).zip(texts) {
        if report.checked.criteria.is_some() {
            in_force.push(CriteriaFile {
                path: file.path.clone(),
                commit_id: file.commit_id.clone(),
                blob_id: file.blob_id.clone(),
                source: text,
            });
        } else {
            rejected.extend(report.rendered());
            if let Some(kept) = previous.iter().find(|p| p.path == file.path) {
                in_force.push(kept.clone());
            }
        }
    }
    in_force.sort_by(|a, b| a.path.cmp(&b.path));
    let mut before = previous.to_vec();
    before.sort_by(|a, b| a.path.cmp(&b.path));
    let same = |a: &CriteriaFile, b: &CriteriaFile| a.path == b.path && a.blob_id == b.blob_id;
    let changed = before.len() != in_force.len() || before.iter().zip(&in_force).any(|(a, b)| !same(a, b));
    CriteriaPlan {
        in_force,
        rejected,
        changed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::PolicyFile;

    const GOOD: &str = include_str!("../../../policies/bmc-firmware.yaml");

    fn snapshot(commit: &str, files: &[(&str, &str, &str)]) -> Snapshot {
        Snapshot {
            commit_id: commit.into(),
            files: files
                .iter()
                .map(|(path, blob, text)| PolicyFile {
                    path: (*path).into(),
                    blob_id: (*blob).into(),
                    content: text.as_bytes().to_vec(),
                })
                .collect(),
            rma_files: Vec::new(),
        }
    }

    #[test]
    fn bad_commit_keeps_the_last_good_version() {
        let first = plan_sync(&BTreeMap::new(), &snapshot("c1", &[("bmc-firmware.yaml", "b1", GOOD)]));
        assert_eq!(first.changed, vec!["bmc-firmware"]);
        assert!(first.rejected.is_empty());

        let broken = GOOD.replace("max_failed: 0", "max_failed: -3");
        let second = plan_sync(
            &first.in_force,
            &snapshot("c2", &[("bmc-firmware.yaml", "b2", &broken)]),
        );
        assert!(second.changed.is_empty());
        assert_eq!(second.rejected.len(), 1);
        let rejection = &second.rejected[0];
        assert_eq!(rejection.kept.as_ref().map(|k| k.commit_id.as_str()), Some("c1"));
        assert!(
            rejection.diagnostics[0].starts_with("bmc-firmware.yaml:")
                && rejection.diagnostics[0].contains("max_failed"),
            "{:?}",
            rejection.diagnostics
        );
        assert_eq!(second.in_force["bmc-firmware"].blob_id, "b1");

        let fixed = GOOD.replace("max_failed: 0", "max_failed: 1");
        let third = plan_sync(
            &second.in_force,
            &snapshot("c3", &[("bmc-firmware.yaml", "b3", &fixed)]),
        );
        assert_eq!(third.changed, vec!["bmc-firmware"]);
        assert_eq!(third.in_force["bmc-firmware"].commit_id, "c3");
    }

    #[test]
    fn unchanged_content_keeps_its_commit_and_removed_files_leave() {
        let first = plan_sync(&BTreeMap::new(), &snapshot("c1", &[("bmc-firmware.yaml", "b1", GOOD)]));
        let second = plan_sync(&first.in_force, &snapshot("c2", &[("bmc-firmware.yaml", "b1", GOOD)]));
        assert!(second.changed.is_empty());
        assert_eq!(second.in_force["bmc-firmware"].commit_id, "c1");
        let third = plan_sync(&second.in_force, &snapshot("c3", &[]));
        assert_eq!(third.removed, vec!["bmc-firmware"]);
        assert!(third.in_force.is_empty());
    }
}
