//! Parts and evidence on every backend: discovery keys GPUs by serial, a
//! parts manifest gives them lot and date code (unknown serials and
//! part-number mismatches reported, not guessed), and a case's evidence
//! package is byte-for-byte reproducible, names the part's samples, holds
//! no secret, and once recorded keeps serving the bytes its hash names
//! while discovery and sampling go on.

use chrono::{TimeDelta, Utc};
use orchestrator_db::DbError;
use orchestrator_db::parts::{DiscoveredPart, PartFilter, parse_parts_manifest};
use orchestrator_db::rma::AttachmentKind;
use orchestrator_db::testing::{TestDb, fixtures};
use orchestrator_rma::{Actor, CaseState, Observation, ObservationKind, Severity, secret_sweep};
use orchestrator_types::Role;

fn gpu(serial: &str, slot: usize, health: &str) -> DiscoveredPart {
    DiscoveredPart {
        serial: serial.into(),
        vendor: "nvidia".into(),
        part_kind: "gpu".into(),
        part_number: "699-2G520-0200-000".into(),
        model: Some("H100 SXM5".into()),
        slot: format!("GPU_SXM_{slot}"),
        production_date: None,
        firmware_version: Some("96.00.5E.00.01".into()),
        health: Some(health.into()),
    }
}

fn xid(serial: &str, minutes_ago: i64) -> (String, Observation) {
    (
        serial.to_owned(),
        Observation {
            at: Utc::now() - TimeDelta::minutes(minutes_ago),
            source_id: format!("/redfish/v1/Systems/HGX_Baseboard_0/LogServices/EventLog/Entries/{minutes_ago}"),
            kind: ObservationKind::Xid { code: 79 },
        },
    )
}

#[test]
fn manifest_errors_name_their_line() {
    let errors = parse_parts_manifest("serial,lot\nSN-1,L1\n,L2\nSN-3,L3,extra\n").unwrap_err();
    let lines: Vec<u64> = errors.iter().map(|e| e.line).collect();
    assert!(lines.contains(&3), "an empty serial is named at its line: {errors:?}");
    assert!(
        lines.contains(&4),
        "a row with too many fields is named at its line: {errors:?}"
    );
    let missing = parse_parts_manifest("part_number,lot\nX,L\n").unwrap_err();
    assert_eq!(missing[0].line, 1, "{missing:?}");
}

#[tokio::test]
async fn parts_manifest_and_a_reproducible_evidence_snapshot() {
    for t in TestDb::all_backends().await {
        let db = &t.db;
        db.import_nodes(
            &[fixtures::node("gpu-01").build(), fixtures::node("gpu-02").build()],
            "test",
        )
        .await
        .unwrap();
        let parts: Vec<DiscoveredPart> = (0..8).map(|i| gpu(&format!("SN-A{i}"), i, "OK")).collect();
        let change = db.record_node_parts("gpu-01", &parts).await.unwrap();
        assert_eq!(change.new.len(), 8);
        db.record_node_parts("gpu-02", &[gpu("SN-B0", 0, "OK")]).await.unwrap();

        // The manifest places lots; an unknown serial and a part-number mismatch are reported.
        let manifest = "serial,part_number,lot,date_code,production_date\n\
                        SN-A3,699-2G520-0200-000,LOT-2301,2301,2024-03-11\n\
                        SN-B0,699-0000-WRONG,LOT-2302,2302,2024-04-02\n\
                        SN-NOPE,699-2G520-0200-000,LOT-2301,2301,2024-03-11\n";
        let rows = parse_parts_manifest(manifest).unwrap();
        let import = db.import_parts_manifest(&rows, "test").await.unwrap();
        assert_eq!(import.unknown, vec!["SN-NOPE".to_owned()]);
        assert_eq!(import.part_number_mismatch, vec!["SN-B0".to_owned()]);
        let placed = db.part("SN-A3").await.unwrap();
        assert_eq!(placed.lot.as_deref(), Some("LOT-2301"));
        assert_eq!(placed.node, "gpu-01");
        let in_lot = db
            .parts(&PartFilter {
                lot: Some("LOT-2301".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(in_lot.len(), 1, "{in_lot:?}");

        // The failing GPU's samples, and one on another GPU of the node.
        db.record_part_observations(&[xid("SN-A3", 50), xid("SN-A3", 40), xid("SN-A3", 25), xid("SN-A5", 45)])
            .await
            .unwrap();
        let mut candidate = fixtures::rma_candidate("SN-A3", "gpu-01", "fallen_off_bus", Severity::High);
        candidate.began_at = Utc::now() - TimeDelta::minutes(50);
        let case = db.open_rma_case(&candidate, "detector").await.unwrap();

        // Uploaded vendor diagnostics: a secret is refused, a log is kept.
        let refused = db
            .add_rma_attachment(
                &case.id,
                "fielddiag.log",
                AttachmentKind::FieldDiagnostic,
                b"bmc Password: hunter2\n",
                "rita",
            )
            .await
            .unwrap_err();
        assert!(matches!(refused, DbError::Invalid { .. }), "{refused:?}");
        db.add_rma_attachment(
            &case.id,
            "fielddiag.log",
            AttachmentKind::FieldDiagnostic,
            b"FieldDiag 535: GPU 3 FAIL (row remap)\n",
            "rita",
        )
        .await
        .unwrap();

        let first = db.rma_evidence_package(&case.id).await.unwrap();
        let second = db.rma_evidence_package(&case.id).await.unwrap();
        assert_eq!(first.archive, second.archive, "two builds are byte-for-byte equal");
        assert_eq!(first.manifest_sha256, second.manifest_sha256);
        let paths: Vec<&str> = first.manifest.files.iter().map(|f| f.path.as_str()).collect();
        for expected in [
            "case.json",
            "candidate.json",
            "inventory.json",
            "event_log.json",
            "telemetry_window.json",
            "system_causes.json",
            "rollout_history.json",
            "diagnostics/field/fielddiag.log",
        ] {
            assert!(paths.contains(&expected), "{expected} missing from {paths:?}");
        }
        let text = String::from_utf8_lossy(&first.archive);
        assert!(text.contains("SN-A3"), "the package names the serial");
        assert!(text.contains("LogServices/EventLog/Entries/25"), "and the samples");
        assert_eq!(secret_sweep(&first.archive, &["hunter2"]), None);

        // Recorded: the case names the package, and the snapshot is what is served even after
        // discovery and sampling move on (last seen, health, new samples in the window).
        let rita = Actor {
            name: "rita".into(),
            role: Role::ReleaseManager,
        };
        let (recorded, package) = db.record_rma_evidence(&case.id, &rita).await.unwrap();
        assert_eq!(recorded.state, CaseState::EvidenceCollected);
        assert_eq!(
            recorded.manifest_sha256.as_deref(),
            Some(package.manifest_sha256.as_str())
        );
        assert_eq!(package.archive, first.archive, "recording builds the same package");
        let mut moved: Vec<DiscoveredPart> = (0..8).map(|i| gpu(&format!("SN-A{i}"), i, "OK")).collect();
        moved[3].health = Some("Critical".into());
        db.record_node_parts("gpu-01", &moved).await.unwrap();
        db.record_part_observations(&[xid("SN-A3", 5)]).await.unwrap();
        let served = db.rma_evidence_download(&case.id).await.unwrap();
        assert_eq!(served.archive, first.archive, "the recorded snapshot is served");
        assert_eq!(served.manifest, first.manifest);
        let rebuilt = db.rma_evidence_package(&case.id).await.unwrap();
        assert_ne!(rebuilt.archive, first.archive, "a fresh build sees the new sample");

        // The snapshot is not evidence of itself: a later build does not contain it.
        let attachments = db.rma_attachments(&case.id).await.unwrap();
        assert_eq!(
            attachments
                .iter()
                .filter(|a| a.kind == AttachmentKind::EvidencePackage)
                .count(),
            2,
            "archive and manifest: {attachments:?}"
        );
        assert!(
            rebuilt.manifest.files.iter().all(|f| !f.path.contains("evidence-")),
            "{:?}",
            rebuilt.manifest.files
        );

        // A viewer cannot record evidence, and the case did not move.
        let viewer = Actor {
            name: "vic".into(),
            role: Role::Viewer,
        };
        let err = db.record_rma_evidence(&case.id, &viewer).await.unwrap_err();
        assert!(
            matches!(err, DbError::NotPermitted { .. } | DbError::Invalid { .. }),
            "{err:?}"
        );
    }
}
