//! The datastore on every backend: SQLite always, PostgreSQL when
//! `WAVEGUARD_TEST_POSTGRES_URL` is set.

use orchestrator_db::model::{
    ComponentReading, NewGateResult, NewNode, NewRelease, NewRollout, NodeFilter, NodeLabels,
};
use orchestrator_db::testing::TestDb;
use orchestrator_db::{AuditFilter, DbError};
use orchestrator_types::{
    ComponentKind, FirmwareVersion, NodeState, ORDERED_EXAMPLES, QualificationState, ReleaseId, Role, RolloutId,
    TransitionRequest,
};

fn node(name: &str, rack: &str) -> NewNode {
    NewNode {
        name: name.into(),
        bmc_url: format!("https://{name}-bmc.example:8443"),
        credential_ref: "lab".into(),
        platform_sku: "hgx-h100-8gpu".into(),
        labels: NodeLabels {
            region: "us-east-1".into(),
            cluster: "c1".into(),
            rack: rack.into(),
            nvlink_domain: format!("{rack}-nvl"),
        },
    }
}

fn release(kind: ComponentKind, version: &str) -> NewRelease {
    NewRelease {
        component_kind: kind,
        version: version.parse().unwrap(),
        image_uri: format!("https://images.example/{kind}/{version}.fw").replace(' ', "_"),
        sha256: "ab".repeat(32),
        size_bytes: 1 << 20,
        platforms: vec!["hgx-h100-8gpu".into()],
        release_notes: String::new(),
    }
}

fn request(to: QualificationState, reason: Option<&str>) -> TransitionRequest {
    TransitionRequest {
        to,
        reason: reason.map(str::to_owned),
    }
}

#[tokio::test]
async fn versions_round_trip_exactly_and_keep_their_order() {
    for t in TestDb::all_backends().await {
        let mut versions: Vec<&str> = ORDERED_EXAMPLES.iter().flat_map(|(a, b)| [*a, *b]).collect();
        versions.sort();
        versions.dedup();
        for v in &versions {
            t.db.add_release(&release(ComponentKind::Gpu, v), "test").await.unwrap();
        }
        let stored = t.db.list_releases().await.unwrap();
        assert_eq!(stored.len(), versions.len(), "{:?}", t.backend());
        for (older, newer) in ORDERED_EXAMPLES {
            let find = |text: &str| {
                stored
                    .iter()
                    .find(|r| r.version.as_str() == text)
                    .unwrap_or_else(|| panic!("{text} not read back exactly on {:?}", t.backend()))
                    .version
                    .clone()
            };
            assert!(find(older) < find(newer), "{older} < {newer} on {:?}", t.backend());
        }
    }
}

#[tokio::test]
async fn only_a_soak_makes_a_release_fleet_proven_once_and_audited() {
    use QualificationState::{FleetProven, Qualified, Registered};
    for t in TestDb::all_backends().await {
        let created =
            t.db.add_release(&release(ComponentKind::Gpu, "96.1.0"), "test")
                .await
                .unwrap();
        // Not qualified: a soak proves nothing, and nothing changes.
        let err =
            t.db.mark_fleet_proven(created.id, RolloutId(7), "engine")
                .await
                .unwrap_err();
        assert!(matches!(err, DbError::Transition(_)), "{err}");
        assert_eq!(t.db.release(created.id).await.unwrap().qualification_state, Registered);
        for step in path_to(Qualified) {
            t.db.transition_release(created.id, &step, "setup").await.unwrap();
        }
        assert!(
            t.db.mark_fleet_proven(created.id, RolloutId(7), "engine")
                .await
                .unwrap()
        );
        let proven = t.db.release(created.id).await.unwrap();
        assert_eq!(proven.qualification_state, FleetProven);
        assert_eq!(proven.fleet_proven_by, Some(RolloutId(7)));
        // A replay (a crash between proving and promoting) changes nothing and records nothing.
        assert!(
            !t.db
                .mark_fleet_proven(created.id, RolloutId(7), "engine")
                .await
                .unwrap()
        );
        let audit =
            t.db.audit_entries(&AuditFilter {
                subject_type: Some("release".into()),
                subject_id: Some(created.id.to_string()),
                actor: Some("engine".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(audit.len(), 1, "{audit:#?}");
        assert_eq!(audit[0].action, "release.fleet_proven");
        assert_eq!(audit[0].details["rollout"], 7);
        // A person moves it on to the default; the proof is kept.
        let default =
            t.db.transition_release(created.id, &request(QualificationState::Default, None), "alice")
                .await
                .unwrap();
        assert_eq!(default.qualification_state, QualificationState::Default);
        assert_eq!(default.fleet_proven_by, Some(RolloutId(7)));
        assert!(
            !t.db
                .mark_fleet_proven(created.id, RolloutId(8), "engine")
                .await
                .unwrap()
        );
    }
}

/// Each state is reached from `registered` by legal steps.
fn path_to(state: QualificationState) -> Vec<TransitionRequest> {
    use QualificationState::*;
    let steps: &[QualificationState] = match state {
        Registered => &[],
        Qualifying => &[Qualifying],
        Qualified => &[Qualifying, Qualified],
        // Then proven by a soak (`Db::mark_fleet_proven`): no person's transition reaches it.
        FleetProven => &[Qualifying, Qualified],
        Default => &[Qualifying, Qualified, Default],
        Deprecated => &[Qualifying, Qualified, Default, Deprecated],
        Blocked => &[Blocked],
    };
    steps.iter().map(|s| request(*s, Some("set-up"))).collect()
}

#[tokio::test]
async fn every_qualification_transition_matches_the_state_machine_and_is_audited() {
    for t in TestDb::all_backends().await {
        let mut n = 0;
        for from in QualificationState::ALL {
            for to in QualificationState::ALL {
                for reason in [None, Some("canary XID rate 3x control")] {
                    n += 1;
                    let created =
                        t.db.add_release(&release(ComponentKind::Bmc, &format!("1.0.{n}")), "test")
                            .await
                            .unwrap();
                    for step in path_to(*from) {
                        t.db.transition_release(created.id, &step, "setup").await.unwrap();
                    }
                    if *from == QualificationState::FleetProven {
                        assert!(t.db.mark_fleet_proven(created.id, RolloutId(1), "setup").await.unwrap());
                    }
                    let expected = from.transition(*to, reason);
                    let outcome =
                        t.db.transition_release(created.id, &request(*to, reason), "user:alice")
                            .await;
                    let stored = t.db.release(created.id).await.unwrap();
                    match expected {
                        Ok(next) => {
                            let updated = outcome.unwrap_or_else(|e| panic!("{from} -> {to}: {e}"));
                            assert_eq!(updated.qualification_state, next);
                            assert_eq!(stored.qualification_state, next);
                            let audit =
                                t.db.audit_entries(&AuditFilter {
                                    subject_type: Some("release".into()),
                                    subject_id: Some(created.id.to_string()),
                                    actor: Some("user:alice".into()),
                                    ..Default::default()
                                })
                                .await
                                .unwrap();
                            assert_eq!(audit.len(), 1, "{from} -> {to} audited once");
                            assert_eq!(audit[0].details["from"], from.as_str());
                            assert_eq!(audit[0].details["to"], to.as_str());
                        }
                        Err(err) => {
                            match outcome {
                                Err(DbError::Transition(got)) => assert_eq!(got, err, "{from} -> {to}"),
                                other => panic!("{from} -> {to}: expected {err}, got {other:?}"),
                            }
                            assert_eq!(
                                stored.qualification_state, *from,
                                "a refused transition changes nothing"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[tokio::test]
async fn duplicate_and_invalid_releases_are_refused() {
    for t in TestDb::all_backends().await {
        t.db.add_release(&release(ComponentKind::Gpu, "96.00.61.00.01"), "test")
            .await
            .unwrap();
        let dup =
            t.db.add_release(&release(ComponentKind::Gpu, "96.00.61.00.01"), "test")
                .await;
        assert!(matches!(dup, Err(DbError::AlreadyExists { .. })), "{dup:?}");
        let mut bad = release(ComponentKind::Gpu, "96.00.62.00.01");
        bad.sha256 = "xyz".into();
        let err = t.db.add_release(&bad, "test").await.unwrap_err();
        assert_eq!(err.to_string(), "invalid sha256: must be 64 hexadecimal characters");
        assert_eq!(t.db.list_releases().await.unwrap().len(), 1);
        let missing = t.db.release(ReleaseId(999_999)).await.unwrap_err();
        assert!(missing.is_caller_error());
    }
}

#[tokio::test]
async fn gate_results_are_appended_and_audited() {
    for t in TestDb::all_backends().await {
        let r =
            t.db.add_release(&release(ComponentKind::Gpu, "96.00.61.00.01"), "test")
                .await
                .unwrap();
        let gate = |passed| NewGateResult {
            gate: "burn-in".into(),
            passed,
            evidence: "https://ci/run/7".into(),
        };
        t.db.record_gate_result(r.id, &gate(false), "user:qa").await.unwrap();
        t.db.record_gate_result(r.id, &gate(true), "user:qa").await.unwrap();
        let results = t.db.gate_results(r.id).await.unwrap();
        assert_eq!(results.iter().map(|g| g.passed).collect::<Vec<_>>(), [false, true]);
        assert_eq!(results[0].recorded_by, "user:qa");
        let audit =
            t.db.audit_entries(&AuditFilter {
                action: Some("release.gate_result".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(audit.len(), 2);
        let bad =
            t.db.record_gate_result(
                r.id,
                &NewGateResult {
                    gate: " ".into(),
                    passed: true,
                    evidence: String::new(),
                },
                "x",
            )
            .await;
        assert!(matches!(bad, Err(DbError::Invalid { .. })));
        let nowhere = t.db.record_gate_result(ReleaseId(424_242), &gate(true), "x").await;
        assert!(matches!(nowhere, Err(DbError::NotFound { .. })));
    }
}

#[tokio::test]
async fn node_import_is_all_or_nothing_and_keeps_node_state() {
    for t in TestDb::all_backends().await {
        let batch: Vec<NewNode> = (0..1200)
            .map(|i| node(&format!("gpu-{i:04}"), &format!("r{}", i % 40)))
            .collect();
        let summary = t.db.import_nodes(&batch, "cli").await.unwrap();
        assert_eq!((summary.created, summary.updated, summary.unchanged), (1200, 0, 0));

        let quarantined = t.db.node_by_name("gpu-0007").await.unwrap();
        t.db.set_node_state(quarantined.id, NodeState::Quarantined, Some("bricked BMC"), "engine")
            .await
            .unwrap();

        let mut again = batch.clone();
        again[7].labels.rack = "r99".into();
        let summary = t.db.import_nodes(&again, "cli").await.unwrap();
        assert_eq!((summary.created, summary.updated, summary.unchanged), (0, 1, 1199));
        let moved = t.db.node_by_name("gpu-0007").await.unwrap();
        assert_eq!(moved.labels.rack, "r99");
        assert_eq!(
            moved.state,
            NodeState::Quarantined,
            "an import never returns a node to service"
        );

        let mut broken = again.clone();
        broken.push(node("gpu-new", "r1"));
        broken[3].bmc_url = "not a url".into();
        let err = t.db.import_nodes(&broken, "cli").await.unwrap_err();
        assert!(err.to_string().starts_with("invalid nodes[3].bmc_url"), "{err}");
        assert!(t.db.node_by_name("gpu-new").await.is_err(), "nothing imported on error");

        let mut dup = vec![node("a", "r1"), node("a", "r2")];
        assert!(t.db.import_nodes(&dup, "cli").await.is_err());
        dup.pop();
        dup[0].bmc_url = "https://root:hunter2@bmc.example".into();
        let err = t.db.import_nodes(&dup, "cli").await.unwrap_err().to_string();
        assert!(!err.contains("hunter2"), "{err}");
        assert_eq!(t.db.count_nodes().await.unwrap(), 1200);

        let rack =
            t.db.list_nodes(&NodeFilter {
                rack: Some("r5".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(rack.len(), 30);
        let page =
            t.db.list_nodes(&NodeFilter {
                limit: Some(10),
                offset: Some(10),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(page.first().map(|n| n.name.as_str()), Some("gpu-0010"));
    }
}

#[tokio::test]
async fn inventory_readings_replace_previous_ones() {
    for t in TestDb::all_backends().await {
        t.db.import_nodes(&[node("n1", "r1")], "cli").await.unwrap();
        let n1 = t.db.node_by_name("n1").await.unwrap();
        let reading = |version: &str| ComponentReading {
            inventory_id: "HGX_FW_GPU_0".into(),
            kind: ComponentKind::Gpu,
            version: version.parse::<FirmwareVersion>().unwrap(),
            updateable: true,
            software_id: Some("GPU".into()),
            health: Some("OK".into()),
        };
        t.db.record_inventory(n1.id, &[reading("96.00.5E.00.01")])
            .await
            .unwrap();
        t.db.record_discovery_error(n1.id, "connection refused").await.unwrap();
        assert_eq!(
            t.db.node(n1.id).await.unwrap().last_discovery_error.as_deref(),
            Some("connection refused")
        );
        t.db.record_inventory(n1.id, &[reading("96.00.61.00.01")])
            .await
            .unwrap();
        let components = t.db.node_components(n1.id).await.unwrap();
        assert_eq!(components.len(), 1);
        assert_eq!(components[0].reading.version.as_str(), "96.00.61.00.01");
        assert_eq!(t.db.node(n1.id).await.unwrap().last_discovery_error, None);
        // A component listed twice in one reading keeps its last version.
        t.db.record_inventory(n1.id, &[reading("96.00.70.00.01"), reading("96.00.71.00.01")])
            .await
            .unwrap();
        let components = t.db.node_components(n1.id).await.unwrap();
        assert_eq!(components.len(), 1);
        assert_eq!(components[0].reading.version.as_str(), "96.00.71.00.01");
    }
}

#[tokio::test]
async fn the_audit_log_is_append_only_in_the_schema_itself() {
    for t in TestDb::all_backends().await {
        t.db.record_audit("test", "probe", "fleet", "x", serde_json::json!({}))
            .await
            .unwrap();
        let update = t.execute_raw("UPDATE audit_log SET actor = 'mallory'").await;
        assert!(update.is_err(), "update refused on {:?}", t.backend());
        let delete = t.execute_raw("DELETE FROM audit_log").await;
        assert!(delete.is_err(), "delete refused on {:?}", t.backend());
        let entries = t.db.audit_entries(&AuditFilter::default()).await.unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].actor, "test");
    }
}

#[tokio::test]
async fn rollouts_are_pinned_to_their_policy_commit() {
    for t in TestDb::all_backends().await {
        let r =
            t.db.add_release(&release(ComponentKind::Bmc, "24.04.1"), "test")
                .await
                .unwrap();
        let rollout =
            t.db.create_rollout(
                &NewRollout {
                    release_id: r.id,
                    policy_name: "bmc-firmware".into(),
                    policy_commit: "a".repeat(40),
                    policy_blob: "b".repeat(40),
                    seed: 7,
                },
                "user:alice",
            )
            .await
            .unwrap();
        let read = t.db.rollout(rollout.id).await.unwrap();
        assert_eq!(read.policy_commit, "a".repeat(40));
        assert_eq!(t.db.list_rollouts().await.unwrap().len(), 1);
    }
}

#[tokio::test]
async fn users_are_unique_and_never_expose_their_hash() {
    for t in TestDb::all_backends().await {
        let user =
            t.db.add_user(
                "alice",
                "Alice",
                Role::ReleaseManager,
                Some("$argon2id$v=19$..."),
                "cli",
            )
            .await
            .unwrap();
        assert!(!serde_json::to_string(&user).unwrap().contains("argon2"));
        assert!(matches!(
            t.db.add_user("alice", "Alice 2", Role::Viewer, None, "cli").await,
            Err(DbError::AlreadyExists { .. })
        ));
        assert!(matches!(
            t.db.add_user("bad name", "x", Role::Viewer, None, "cli").await,
            Err(DbError::Invalid { .. })
        ));
        let (_, hash) = t.db.user_with_password_hash("alice").await.unwrap();
        assert_eq!(hash.as_deref(), Some("$argon2id$v=19$..."));
    }
}

#[tokio::test]
async fn migrations_are_idempotent() {
    for t in TestDb::all_backends().await {
        t.db.migrate().await.unwrap();
        assert_eq!(
            t.db.applied_migrations().await.unwrap(),
            [
                "m0001_foundation",
                "m0002_policies",
                "m0003_execution",
                "m0004_health",
                "m0005_alerts",
                "m0006_auth",
                "m0007_release_rollback",
                "m0008_wave_decisions",
                "m0009_hardening",
                "m0010_credential_bindings",
                "m0011_scheduler_drains",
                "m0012_rma_cases",
                "m0013_rma_parts",
                "m0014_page_indexes",
                "m0015_health_retention",
                "m0016_soak",
                "m0017_control_rate_indexes"
            ]
        );
    }
}
