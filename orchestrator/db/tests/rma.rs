//! RMA cases on every backend: a case is opened once per part and rule,
//! moves only as the pure machine allows (audited), is submitted only within
//! its vendor's quota (the sixth of five a week waits with its queue
//! position), keeps the vendor's rejection reason, and holds its node out of
//! rollouts until a human verifies or closes it.

use chrono::TimeDelta;
use orchestrator_db::rma::RmaFilter;
use orchestrator_db::testing::TestDb;
use orchestrator_db::testing::fixtures::rma_candidate;
use orchestrator_db::{AuditFilter, DbError};
use orchestrator_rma::{Actor, Candidate, CaseEvent, CaseState, Quota, Severity};
use orchestrator_types::Role;

fn candidate(serial: &str, node: &str, severity: Severity) -> Candidate {
    rma_candidate(serial, node, "fallen_off_bus", severity)
}

fn actor(name: &str, role: Role) -> Actor {
    Actor {
        name: name.into(),
        role,
    }
}

fn collect() -> CaseEvent {
    CaseEvent::CollectEvidence {
        manifest_sha256: "ab".repeat(32),
    }
}

#[tokio::test]
async fn cases_move_by_the_pipeline_within_the_quota_and_hold_their_nodes() {
    for t in TestDb::all_backends().await {
        let db = &t.db;
        let rita = actor("rita", Role::ReleaseManager);
        let quota = Quota {
            submissions: 5,
            period: TimeDelta::weeks(1),
        };

        let first = db
            .open_rma_case(&candidate("SN-1", "gpu-01", Severity::High), "detector")
            .await
            .unwrap();
        assert_eq!(first.state, CaseState::Candidate);
        let again = db
            .open_rma_case(&candidate("SN-1", "gpu-01", Severity::High), "detector")
            .await
            .unwrap();
        assert_eq!(again.id, first.id, "one open case per part and rule");
        let holds = db.rma_holds().await.unwrap();
        assert!(holds["gpu-01"].contains(&first.id), "{holds:?}");

        // A viewer may not move it; a submission needs the evidence first.
        let refused = db
            .apply_rma_event(&first.id, collect(), &actor("vic", Role::Viewer))
            .await
            .unwrap_err();
        assert!(matches!(refused, DbError::NotPermitted { .. }), "{refused:?}");
        let early = db.submit_rma_case(&first.id, &quota, "NV-1", &rita).await.unwrap_err();
        assert!(matches!(early, DbError::Invalid { .. }), "{early:?}");

        // Six cases ready; five submissions fill the week; the sixth waits.
        let mut ids = vec![first.id.clone()];
        for n in 2..=6 {
            let severity = if n == 6 { Severity::Low } else { Severity::High };
            let case = db
                .open_rma_case(
                    &candidate(&format!("SN-{n}"), &format!("gpu-0{n}"), severity),
                    "detector",
                )
                .await
                .unwrap();
            ids.push(case.id);
        }
        for id in &ids {
            db.apply_rma_event(id, collect(), &rita).await.unwrap();
        }
        for (i, id) in ids.iter().take(5).enumerate() {
            let submitted = db.submit_rma_case(id, &quota, &format!("NV-{i}"), &rita).await.unwrap();
            assert_eq!(submitted.state, CaseState::Submitted);
        }
        let sixth = db.submit_rma_case(&ids[5], &quota, "NV-6", &rita).await.unwrap_err();
        let DbError::Conflict { reason, .. } = &sixth else {
            panic!("{sixth:?}");
        };
        assert!(
            reason.contains("position 1 of 1") && reason.contains("5 of 5"),
            "{reason}"
        );
        assert_eq!(
            db.rma_case(&ids[5]).await.unwrap().case.state,
            CaseState::EvidenceCollected
        );

        // A rejection keeps the vendor's reason; the node stays held.
        let rejected = db
            .apply_rma_event(
                &ids[0],
                CaseEvent::VendorRejected {
                    reason: "field diagnostic passed".into(),
                },
                &rita,
            )
            .await
            .unwrap();
        assert_eq!(rejected.rejection_reason.as_deref(), Some("field diagnostic passed"));
        assert!(db.rma_holds().await.unwrap().contains_key("gpu-01"));
        // Closing it (an admin's decision) returns the node.
        db.apply_rma_event(
            &ids[0],
            CaseEvent::Close {
                reason: "vendor stands by its diagnostic; part kept".into(),
            },
            &actor("ada", Role::Admin),
        )
        .await
        .unwrap();
        assert!(!db.rma_holds().await.unwrap().contains_key("gpu-01"));
        let open = db
            .rma_cases(&RmaFilter {
                open_only: true,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(open.len(), 5);

        let audit = db
            .audit_entries(&AuditFilter {
                action: Some("rma.transition".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        // 6 collections, 5 submissions, a rejection, a close.
        assert_eq!(audit.len(), 13);
    }
}

/// A human's decision holds: a case closed without a replacement is not reopened by the monitor's
/// next pass on the same evidence, only by a sample newer than the decision.
#[tokio::test]
async fn a_closed_case_is_reopened_only_by_newer_evidence() {
    for t in TestDb::all_backends().await {
        let db = &t.db;
        let first = candidate("SN-C", "gpu-09", Severity::High);
        let (case, new) = db.open_or_refresh_rma_case(&first, "detector").await.unwrap();
        assert!(new);
        db.apply_rma_event(
            &case.id,
            CaseEvent::Close {
                reason: "riser reseated; not the GPU".into(),
            },
            &actor("ada", Role::Admin),
        )
        .await
        .unwrap();
        let (same, new) = db.open_or_refresh_rma_case(&first, "detector").await.unwrap();
        assert!(!new, "the same evidence does not undo the decision");
        assert_eq!(same.id, case.id);
        assert!(
            !db.rma_holds().await.unwrap().contains_key("gpu-09"),
            "the node is back"
        );

        let mut later = first.clone();
        later.samples.push(orchestrator_rma::Observation {
            at: chrono::Utc::now() + TimeDelta::seconds(5),
            source_id: "redfish:gpu-09:77".into(),
            kind: orchestrator_rma::ObservationKind::Xid { code: 79 },
        });
        let (reopened, new) = db.open_or_refresh_rma_case(&later, "detector").await.unwrap();
        assert!(new, "a failure after the decision is a new case");
        assert_ne!(reopened.id, case.id);
    }
}
