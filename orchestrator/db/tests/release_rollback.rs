//! Rollback metadata on every backend: a release's `downgrade_forbidden` and
//! `rollback_floor`, and a component's `LowestSupportedVersion`, stored and
//! read back exactly, validated, and audited.

use orchestrator_db::model::{ComponentReading, DiscoveredComponent, NewNode, NewRelease, NodeLabels, ReleaseRollback};
use orchestrator_db::testing::TestDb;
use orchestrator_db::{AuditFilter, DbError};
use orchestrator_types::{ComponentKind, FirmwareVersion};

fn release(version: &str) -> NewRelease {
    NewRelease {
        component_kind: ComponentKind::Gpu,
        version: version.parse().unwrap(),
        image_uri: format!("https://images.example/gpu/{version}.fw"),
        sha256: "cd".repeat(32),
        size_bytes: 1 << 20,
        platforms: vec!["hgx-h100-8gpu".into()],
        release_notes: String::new(),
    }
}

fn version(text: &str) -> FirmwareVersion {
    text.parse().unwrap()
}

#[tokio::test]
async fn release_rollback_metadata_round_trips_and_is_audited() {
    for t in TestDb::all_backends().await {
        let rollback = ReleaseRollback {
            downgrade_forbidden: Some("  burns anti-rollback fuse SVN 4 ".into()),
            rollback_floor: Some(version("96.00.5A.00.00")),
        };
        let added =
            t.db.add_release_with(&release("96.00.61.00.01"), &rollback, "alice")
                .await
                .unwrap();
        assert_eq!(
            added.downgrade_forbidden.as_deref(),
            Some("burns anti-rollback fuse SVN 4")
        );
        assert_eq!(
            added.rollback_floor.as_ref().map(FirmwareVersion::as_str),
            Some("96.00.5A.00.00")
        );

        let read = t.db.release(added.id).await.unwrap();
        assert_eq!(read, added, "{:?}", t.backend());
        let listed = t.db.list_releases().await.unwrap();
        assert_eq!(listed, vec![added.clone()]);

        // Without metadata, both stay empty: nothing known forbids a rollback.
        let plain = t.db.add_release(&release("96.00.66.00.01"), "alice").await.unwrap();
        let plain = t.db.release(plain.id).await.unwrap();
        assert_eq!((plain.downgrade_forbidden, plain.rollback_floor), (None, None));

        let audit =
            t.db.audit_entries(&AuditFilter {
                action: Some("release.add".into()),
                subject_id: Some(added.id.to_string()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(audit.len(), 1);
        assert_eq!(
            audit[0].details["downgrade_forbidden"],
            "burns anti-rollback fuse SVN 4"
        );
        assert_eq!(audit[0].details["rollback_floor"], "96.00.5A.00.00");
    }
}

#[tokio::test]
async fn release_rollback_metadata_is_validated() {
    for t in TestDb::all_backends().await {
        let cases = [
            (
                ReleaseRollback {
                    downgrade_forbidden: Some("   ".into()),
                    rollback_floor: None,
                },
                "downgrade_forbidden",
            ),
            (
                ReleaseRollback {
                    downgrade_forbidden: Some("x".repeat(1001)),
                    rollback_floor: None,
                },
                "downgrade_forbidden",
            ),
            (
                // A floor above the image's own version would refuse the image.
                ReleaseRollback {
                    downgrade_forbidden: None,
                    rollback_floor: Some(version("96.00.62.00.00")),
                },
                "rollback_floor",
            ),
        ];
        for (rollback, expected) in cases {
            match t
                .db
                .add_release_with(&release("96.00.61.00.01"), &rollback, "alice")
                .await
            {
                Err(DbError::Invalid { field, .. }) => assert_eq!(field, expected, "{rollback:?}"),
                other => panic!("{rollback:?} accepted on {:?}: {other:?}", t.backend()),
            }
        }
        assert!(t.db.list_releases().await.unwrap().is_empty(), "nothing stored");
        // The floor may equal the release's version.
        let at = ReleaseRollback {
            downgrade_forbidden: None,
            rollback_floor: Some(version("96.00.61.00.01")),
        };
        t.db.add_release_with(&release("96.00.61.00.01"), &at, "alice")
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn lowest_supported_version_is_recorded_and_cleared_by_a_reading_without_it() {
    for t in TestDb::all_backends().await {
        t.db.import_nodes(
            &[NewNode {
                name: "n1".into(),
                bmc_url: "https://n1-bmc.example:8443".into(),
                credential_ref: "lab".into(),
                platform_sku: "hgx-h100-8gpu".into(),
                labels: NodeLabels {
                    region: "r".into(),
                    cluster: "c".into(),
                    rack: "k".into(),
                    nvlink_domain: "k-nvl".into(),
                },
            }],
            "cli",
        )
        .await
        .unwrap();
        let n1 = t.db.node_by_name("n1").await.unwrap();
        let reading = |inventory_id: &str| ComponentReading {
            inventory_id: inventory_id.into(),
            kind: ComponentKind::Gpu,
            version: version("96.00.5E.00.01"),
            updateable: true,
            software_id: None,
            health: Some("OK".into()),
        };
        t.db.record_discovered_inventory(
            n1.id,
            &[
                DiscoveredComponent {
                    reading: reading("HGX_FW_GPU_0"),
                    lowest_supported_version: Some("96.00.61.00.00".into()),
                },
                DiscoveredComponent {
                    reading: reading("HGX_FW_GPU_1"),
                    lowest_supported_version: None,
                },
            ],
        )
        .await
        .unwrap();
        let components = t.db.node_components(n1.id).await.unwrap();
        let lowest: Vec<Option<&str>> = components
            .iter()
            .map(|c| c.lowest_supported_version.as_deref())
            .collect();
        assert_eq!(lowest, [Some("96.00.61.00.00"), None], "{:?}", t.backend());

        // A reading that did not ask the BMC says nothing about the floor.
        t.db.record_inventory(n1.id, &[reading("HGX_FW_GPU_0")]).await.unwrap();
        let components = t.db.node_components(n1.id).await.unwrap();
        assert_eq!(components[0].lowest_supported_version, None);
    }
}
