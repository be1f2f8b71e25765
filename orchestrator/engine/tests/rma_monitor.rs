//! Issue 25 end to end: the RMA monitor against bmc-sim over loopback Redfish, on the simulated
//! clock, with NVIDIA's criteria as this repository ships them.
//!
//! - A 512-GPU fleet with one defective lot (8% of GPUs at 8x the rate) and scattered random
//!   failures over a week: every GPU that fell off the bus (ground truth from bmc-sim) becomes a case
//!   naming its serial and the XID samples that prove it, with the BMC's diagnostic data attached;
//!   nothing else does; and the week's defect-cluster scan reports the lot, as the most specific
//!   group, with its rate ratio and interval.
//! - A GPU whose failure began hours after its node was flashed with a release that was later
//!   blocked is firmware-suspected in its case (rollout and release named); one failing days later
//!   is not.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use bmc_sim::{HardwareFailureMode, SimClock};
use chrono::{TimeDelta, Utc};
use integration_tests::{GPU_FROM, GPU_TO, Harness, ScenarioYaml, policy};
use orchestrator_db::Db;
use orchestrator_db::execution::RolloutState;
use orchestrator_db::parts::parse_parts_manifest;
use orchestrator_db::rma::{AttachmentKind, RmaFilter};
use orchestrator_db::testing::fixtures::put_example_rma_criteria;
use orchestrator_engine::rma::{RmaConfig, RmaMonitor, period_start};
use orchestrator_rma::{CandidateStatus, ObservationKind};
use orchestrator_types::{QualificationState, TransitionRequest};

const BAD_LOT: &str = "LOT-2311";

async fn load_criteria(db: &Db) {
    // The repository's NVIDIA criteria, as a policy sync puts them in force.
    put_example_rma_criteria(db).await.unwrap();
}

fn monitor(h: &Harness) -> RmaMonitor {
    RmaMonitor::new(
        h.db.clone(),
        h.redfish(),
        None,
        RmaConfig {
            cluster_period: TimeDelta::days(7),
            ..Default::default()
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_gpus_become_cases_with_evidence_and_the_defective_lot_is_reported() {
    // The fleet starts on a period boundary, so the first scanned week covers its whole life.
    let week = TimeDelta::days(7);
    let start = period_start(Utc::now() - week, week);
    let clock = Arc::new(SimClock::new(start, 2400.0));
    let scenario = ScenarioYaml::hgx(64)
        .seed(25)
        .baseline("xid_errors_per_gpu_hour: 0")
        .section(&format!(
            "parts:\n  part_numbers: [\"692-2G520-0200-000\"]\n  lots:\n    \
             - {{id: {BAD_LOT}, share: 0.08, production_date: \"2023-03-13\"}}\n    \
             - {{id: LOT-2320, production_date: \"2023-05-15\"}}\n    \
             - {{id: LOT-2332, production_date: \"2023-08-07\"}}"
        ))
        .section(&format!(
            "hardware:\n  failures_per_gpu_hour: 0.0003\n  horizon: 6d\n  \
             modes: {{fallen_off_bus: 1.0}}\n  defective_lots: [{{lot: {BAD_LOT}, multiply: 8}}]"
        ))
        .build();
    let Some(h) = Harness::builder(scenario).clock(clock.clone()).start().await else {
        return;
    };
    load_criteria(&h.db).await;
    let monitor = monitor(&h);

    let first = monitor.pass().await.unwrap();
    assert!(first.node_errors.is_empty(), "{:?}", first.node_errors);
    assert_eq!(first.parts_new, 512, "every GPU is a part, keyed by serial");
    let manifest = parse_parts_manifest(&h.fleet.parts_manifest_csv()).unwrap();
    let import = h.db.import_parts_manifest(&manifest, "test").await.unwrap();
    assert!(import.unknown.is_empty(), "{:?}", import.unknown);
    assert!(
        import.part_number_mismatch.is_empty(),
        "{:?}",
        import.part_number_mismatch
    );

    // A pass a simulated day, for eight days: the week and the scan of it.
    let mut opened = BTreeSet::new();
    let mut diagnostics = 0;
    let mut scanned = Vec::new();
    for day in 1..=8 {
        clock.skip_to(start + TimeDelta::days(day));
        let report = monitor.pass().await.unwrap();
        assert!(report.node_errors.is_empty(), "day {day}: {:?}", report.node_errors);
        opened.extend(report.cases_opened);
        diagnostics += report.diagnostics_collected;
        scanned.extend(report.periods_scanned);
    }

    let failures = h.fleet.hardware_failures();
    assert!(
        failures.len() >= 20,
        "the scenario should fail enough GPUs: {}",
        failures.len()
    );
    assert!(failures.iter().all(|f| f.mode == HardwareFailureMode::FallenOffBus));
    let failed: BTreeMap<&str, &bmc_sim::HardwareFailure> = failures.iter().map(|f| (f.serial.as_str(), f)).collect();

    let cases = h.db.rma_cases(&RmaFilter::default()).await.unwrap();
    let case_serials: BTreeSet<&str> = cases.iter().map(|c| c.case.serial.as_str()).collect();
    assert_eq!(
        case_serials,
        failed.keys().copied().collect::<BTreeSet<_>>(),
        "every GPU that fell off the bus is a case, and no other"
    );
    assert_eq!(opened.len(), cases.len(), "each case opened once");
    for c in &cases {
        let truth = failed[c.case.serial.as_str()];
        assert_eq!(c.case.rule, "fallen_off_bus", "{}", c.case.id);
        assert_eq!(c.case.node, truth.node);
        assert_eq!(
            c.candidate.status,
            CandidateStatus::AwaitingConfirmation,
            "NVIDIA wants the field diagnostic before a claim"
        );
        let xids: Vec<_> = c
            .candidate
            .samples
            .iter()
            .filter(|s| matches!(s.kind, ObservationKind::Xid { code: 79 }))
            .collect();
        assert!(
            xids.len() >= 3,
            "{}: the samples that prove it: {:?}",
            c.case.id,
            c.candidate.samples
        );
        assert!(
            xids.iter()
                .all(|s| s.source_id.starts_with(&format!("redfish:{}:", truth.node)))
        );
        let began = c.candidate.began_at;
        assert!(
            (began - truth.onset).num_minutes().abs() <= 1,
            "{}: began {began}, onset {}",
            c.case.id,
            truth.onset
        );
        assert!(c.candidate.firmware_suspected.is_none(), "nothing was flashed");
    }

    // Diagnostic data from the BMC in every case, and evidence that names the part and its samples.
    assert_eq!(diagnostics, cases.len());
    let sample = &cases[0];
    let attachments = h.db.rma_attachments(&sample.case.id).await.unwrap();
    assert!(
        attachments
            .iter()
            .any(|a| a.kind == AttachmentKind::RedfishDiagnostic && a.size_bytes > 0),
        "{attachments:?}"
    );
    let package = h.db.rma_evidence_package(&sample.case.id).await.unwrap();
    let text = String::from_utf8_lossy(&package.archive);
    assert!(text.contains(&sample.case.serial));
    for s in &sample.candidate.samples {
        assert!(text.contains(&s.source_id), "evidence cites {}", s.source_id);
    }
    assert!(
        package
            .manifest
            .files
            .iter()
            .any(|f| f.path.starts_with("diagnostics/redfish/"))
    );
    assert_eq!(orchestrator_rma::secret_sweep(&package.archive, &[]), None);
    assert_eq!(
        package.archive,
        h.db.rma_evidence_package(&sample.case.id).await.unwrap().archive
    );

    // NVIDIA support's field diagnostic fails the part: the next pass finds the rule met.
    h.db.add_rma_attachment(
        &sample.case.id,
        "fieldiag.log",
        AttachmentKind::FieldDiagnostic,
        b"fieldiag: GPU FAIL: PCIe link lost\n",
        "rita",
    )
    .await
    .unwrap();
    h.db.record_field_diagnostic(&sample.case.id, false, "fieldiag.log", "rita")
        .await
        .unwrap();
    monitor.pass().await.unwrap();
    let confirmed = h.db.rma_case(&sample.case.id).await.unwrap();
    assert_eq!(confirmed.candidate.status, CandidateStatus::Met);

    // The week's scan: the lot alone (the fleet has one part number, which has no rest to be
    // compared with), with its ratio and interval.
    assert!(scanned.contains(&start), "the first week was scanned: {scanned:?}");
    let scans = h.db.cluster_scans(10).await.unwrap();
    let scan = scans
        .iter()
        .find(|s| s.period_start == start)
        .expect("the week's scan is stored");
    let clusters = scan.report["clusters"].as_array().unwrap();
    assert_eq!(clusters.len(), 1, "{:#}", scan.report);
    let cluster = &clusters[0];
    assert_eq!(cluster["test"]["group"]["attribute"], "lot", "{cluster:#}");
    assert!(
        cluster["test"]["group"]["value"].as_str().unwrap().ends_with(BAD_LOT),
        "{cluster:#}"
    );
    let ratio = cluster["test"]["rate_ratio"].as_f64().unwrap();
    let lower = cluster["test"]["ci95_lower"].as_f64().unwrap();
    assert!(ratio > 3.0 && lower > 1.0, "ratio {ratio}, lower {lower}");
    let lot_failures: BTreeSet<String> = failures
        .iter()
        .filter(|f| f.lot == BAD_LOT && f.onset < start + TimeDelta::days(7))
        .map(|f| f.serial.clone())
        .collect();
    let reported: BTreeSet<String> = cluster["failed_serials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(reported, lot_failures, "the cluster lists the lot's failed parts");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_right_after_a_flash_is_firmware_suspected() {
    let scenario = ScenarioYaml::hgx(6)
        .baseline("xid_errors_per_gpu_hour: 0")
        .gpu_firmware(GPU_TO, "{min: 2m, max: 4m}")
        .gpu_firmware(GPU_FROM, "{min: 2m, max: 4m}")
        .section(
            "hardware:\n  failures:\n    \
             - {node: node-00001, gpu: 2, mode: fallen_off_bus, at: 8h}\n    \
             - {node: node-00004, gpu: 5, mode: fallen_off_bus, at: 5d}",
        )
        .build();
    let Some(mut h) = Harness::builder(scenario).start().await else {
        return;
    };
    load_criteria(&h.db).await;
    let monitor = monitor(&h);
    monitor.pass().await.unwrap();
    let fleet_start = h.now();

    let release = h.add_release(GPU_TO, true).await;
    h.add_release(GPU_FROM, true).await;
    let rollout = h.start_rollout(release.id, policy("10m", "approval: auto"), 3).await;
    h.start_engine();
    let done = h
        .wait_for(
            rollout.id,
            &[RolloutState::Completed, RolloutState::Halted],
            Duration::from_secs(300),
        )
        .await;
    assert_eq!(done.state, RolloutState::Completed, "{:?}", done.state_reason);
    h.stop_engine().await;
    assert!(
        h.now() < fleet_start + TimeDelta::hours(8),
        "the flash precedes the failure"
    );
    // Later, the release is blocked (its canary elsewhere went bad, say).
    h.db.transition_release(
        release.id,
        &TransitionRequest {
            to: QualificationState::Blocked,
            reason: Some("XID storms on the fleet".into()),
        },
        "rita",
    )
    .await
    .unwrap();

    for hours in [9, 24 * 5 + 1] {
        h.clock.skip_to(fleet_start + TimeDelta::hours(hours));
        let report = monitor.pass().await.unwrap();
        assert!(report.node_errors.is_empty(), "{:?}", report.node_errors);
    }
    let cases = h.db.rma_cases(&RmaFilter::default()).await.unwrap();
    let on = |node: &str| {
        cases
            .iter()
            .find(|c| c.case.node == node)
            .unwrap_or_else(|| panic!("a case on {node}: {cases:?}"))
    };
    let suspected = on("node-00001")
        .candidate
        .firmware_suspected
        .as_ref()
        .expect("failed hours after its flash");
    assert_eq!(
        suspected.change.rollout.as_deref(),
        Some(format!("rollout {}", rollout.id.0).as_str())
    );
    assert!(suspected.change.release.contains(GPU_TO), "{suspected:?}");
    assert!(
        suspected.after_seconds > 0 && suspected.after_seconds < 8 * 3600,
        "{suspected:?}"
    );
    assert!(
        on("node-00004").candidate.firmware_suspected.is_none(),
        "five days after the flash is past the criteria's 72h window"
    );
    h.shutdown().await;
}
