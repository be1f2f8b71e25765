//! Candidates, cases, the quota queue, velocity and the evidence package.

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use orchestrator_rma::*;
use orchestrator_types::Role;

const NVIDIA: &str = include_str!("../../../policies/rma/nvidia-gpu.yaml");
const ODM: &str = include_str!("../../../policies/rma/example-odm-baseboard.yaml");

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 2, 0, 0, 0).single().expect("valid time")
}

fn h(hours: i64) -> DateTime<Utc> {
    t0() + TimeDelta::hours(hours)
}

fn gpu(serial: &str) -> PartRecord {
    PartRecord {
        serial: serial.into(),
        vendor: "nvidia".into(),
        part_kind: "gpu".into(),
        part_number: "699-2G520-0200-000".into(),
        node: "node-7".into(),
        slot: "GPU_3".into(),
    }
}

fn obs(at: DateTime<Utc>, id: &str, kind: ObservationKind) -> Observation {
    Observation {
        at,
        source_id: id.into(),
        kind,
    }
}

fn criteria() -> Vec<Criteria> {
    vec![
        parse_criteria(NVIDIA).expect("valid"),
        parse_criteria(ODM).expect("valid"),
    ]
}

fn xid(at: DateTime<Utc>, n: u32) -> Observation {
    obs(at, &format!("sel/{n}"), ObservationKind::Xid { code: 79 })
}

fn diag(at: DateTime<Utc>, passed: bool) -> Observation {
    obs(at, "upload/fielddiag.log", ObservationKind::FieldDiagnostic { passed })
}

fn rules(found: &[Candidate]) -> Vec<(&str, CandidateStatus)> {
    found.iter().map(|c| (c.rule.as_str(), c.status)).collect()
}

#[test]
fn row_remap_failure_needs_a_failed_field_diagnostic() {
    let c = criteria();
    let flag = obs(
        h(5),
        "prom/DCGM_FI_DEV_ROW_REMAP_FAILURE@5h",
        ObservationKind::Flag {
            flag: HealthFlag::RowRemapFailure,
            set: true,
        },
    );
    let clear = obs(
        h(1),
        "prom/DCGM_FI_DEV_ROW_REMAP_FAILURE@1h",
        ObservationKind::Flag {
            flag: HealthFlag::RowRemapFailure,
            set: false,
        },
    );
    let now = h(100);
    let p = gpu("1654922001234");
    let found = find_candidates(&c, &p, std::slice::from_ref(&clear), &[], now);
    assert!(found.is_empty());
    let found = find_candidates(&c, &p, &[clear.clone(), flag.clone()], &[], now);
    assert_eq!(
        rules(&found),
        [("row_remap_failure", CandidateStatus::AwaitingConfirmation)]
    );
    let found = find_candidates(&c, &p, &[flag.clone(), diag(h(30), true)], &[], now);
    assert_eq!(
        rules(&found),
        [("row_remap_failure", CandidateStatus::DiagnosticPassed)]
    );
    // A failed diagnostic outside the 14 days does not confirm.
    let found = find_candidates(&c, &p, &[flag.clone(), diag(h(5 + 15 * 24), false)], &[], h(1000));
    assert_eq!(
        rules(&found),
        [("row_remap_failure", CandidateStatus::AwaitingConfirmation)]
    );
    let found = find_candidates(&c, &p, &[diag(h(30), false), flag.clone()], &[], now);
    assert_eq!(rules(&found), [("row_remap_failure", CandidateStatus::Met)]);
    let cand = &found[0];
    assert_eq!(cand.part.serial, "1654922001234");
    assert_eq!(cand.began_at, h(5));
    let ids: Vec<&str> = cand.samples.iter().map(|s| s.source_id.as_str()).collect();
    assert_eq!(ids, ["prom/DCGM_FI_DEV_ROW_REMAP_FAILURE@5h", "upload/fielddiag.log"]);
    assert!(
        cand.document_edition.contains("DA-09826-002"),
        "{}",
        cand.document_edition
    );
    assert!(cand.firmware_suspected.is_none());
    // Samples from the future are ignored.
    assert!(find_candidates(&c, &p, &[flag], &[], h(4)).is_empty());
    // Parts of other vendors or kinds are judged by their own criteria only.
    let mut other = gpu("X1");
    other.vendor = "amd".into();
    assert!(find_candidates(&c, &other, &[diag(h(30), false)], &[], now).is_empty());
}

#[test]
fn fallen_off_the_bus_counts_within_the_window() {
    let c = criteria();
    let p = gpu("S1");
    let d = diag(h(40), false);
    // Three in 25 hours is not three in 24.
    let spread = [xid(h(0), 1), xid(h(12), 2), xid(h(25), 3), d.clone()];
    assert!(find_candidates(&c, &p, &spread, &[], h(100)).is_empty());
    let mut close = spread.to_vec();
    close.push(xid(h(30), 4));
    let found = find_candidates(&c, &p, &close, &[], h(100));
    assert_eq!(rules(&found), [("fallen_off_bus", CandidateStatus::Met)]);
    let ids: Vec<&str> = found[0].samples.iter().map(|s| s.source_id.as_str()).collect();
    assert_eq!(ids, ["sel/2", "sel/3", "sel/4", "upload/fielddiag.log"]);
    assert_eq!(found[0].began_at, h(12));
    // Other XIDs do not count.
    let other = [0, 1, 2].map(|i| obs(h(i), "sel/x", ObservationKind::Xid { code: 48 }));
    assert!(find_candidates(&c, &p, &other, &[], h(100)).is_empty());
    // The exporter's windowed count: a count in its window, enough alone when the window is short enough.
    let windowed = |count, window_seconds| {
        obs(
            h(3),
            "prom/DCGM_EXP_XID_ERRORS_COUNT",
            ObservationKind::XidWindowCount {
                code: 79,
                count,
                window_seconds,
            },
        )
    };
    let found = find_candidates(&c, &p, &[windowed(3, 600), d.clone()], &[], h(100));
    assert_eq!(rules(&found), [("fallen_off_bus", CandidateStatus::Met)]);
    assert!(find_candidates(&c, &p, &[windowed(2, 600), d.clone()], &[], h(100)).is_empty());
    assert!(find_candidates(&c, &p, &[windowed(3, 2 * 86_400), d], &[], h(100)).is_empty());
}

#[test]
fn vanished_series_and_silent_bmc_are_proven_by_samples() {
    let c = criteria();
    let p = gpu("S2");
    let scrape = |min: i64, present| {
        obs(
            t0() + TimeDelta::minutes(min),
            &format!("scrape@{min}m"),
            ObservationKind::SeriesScrape { present },
        )
    };
    let d = diag(h(2), false);
    // 25 minutes absent, then back: no.
    let short: Vec<Observation> = (0..=5)
        .map(|i| scrape(i * 5, false))
        .chain([scrape(30, true), d.clone()])
        .collect();
    assert!(find_candidates(&c, &p, &short, &[], h(10)).is_empty());
    let long: Vec<Observation> = std::iter::once(scrape(0, true))
        .chain((1..=7).map(|i| scrape(i * 5, false)))
        .chain([d])
        .collect();
    let found = find_candidates(&c, &p, &long, &[], h(10));
    assert_eq!(rules(&found), [("series_vanished", CandidateStatus::Met)]);
    assert_eq!(found[0].began_at, t0() + TimeDelta::minutes(5));
    assert!(
        found[0].samples[1].source_id.contains("7 consecutive readings"),
        "{:?}",
        found[0].samples
    );

    // The BMC rule: silent from 10 minutes after the flash for 40 minutes.
    let mut board = gpu("BB-77");
    board.vendor = "example-odm".into();
    board.part_kind = "baseboard".into();
    let flash = FirmwareChange {
        at: h(1),
        component: "bmc".into(),
        from_version: "1.2.3".into(),
        to_version: "1.3.0".into(),
        release: "bmc-1.3.0".into(),
        rollout: Some("rollout-12".into()),
    };
    let probe = |min: i64, answered| {
        obs(
            h(1) + TimeDelta::minutes(min),
            &format!("probe@{min}m"),
            ObservationKind::BmcProbe { answered },
        )
    };
    let probes: Vec<Observation> = std::iter::once(probe(5, true))
        .chain((2..=10).map(|i| probe(i * 5, false)))
        .collect();
    let found = find_candidates(&c, &board, &probes, std::slice::from_ref(&flash), h(10));
    assert_eq!(rules(&found), [("bmc_silent_after_flash", CandidateStatus::Met)]);
    let fs = found[0].firmware_suspected.as_ref().expect("firmware-suspected");
    assert_eq!(
        (fs.change.release.as_str(), fs.change.rollout.as_deref()),
        ("bmc-1.3.0", Some("rollout-12"))
    );
    assert_eq!(fs.after_seconds, 600);
    // Without a flash, silence alone is not this rule.
    assert!(find_candidates(&c, &board, &probes, &[], h(10)).is_empty());
}

#[test]
fn failure_right_after_a_flash_is_firmware_suspected() {
    let c = criteria();
    let p = gpu("S3");
    let flash = |at| FirmwareChange {
        at,
        component: "gpu".into(),
        from_version: "96.00.5E.00.01".into(),
        to_version: "96.00.61.00.01".into(),
        release: "gpu-96.00.61".into(),
        rollout: Some("rollout-9".into()),
    };
    let signals = [xid(h(100), 1), xid(h(101), 2), xid(h(102), 3), diag(h(110), false)];
    let found = find_candidates(&c, &p, &signals, &[flash(h(50))], h(200));
    let fs = found[0].firmware_suspected.as_ref().expect("within 72h of the flash");
    assert_eq!(fs.change.release, "gpu-96.00.61");
    assert_eq!(fs.after_seconds, 50 * 3600);
    // A flash 80 hours before, or after the failure began, does not make it suspected.
    assert!(
        find_candidates(&c, &p, &signals, &[flash(h(20))], h(200))[0]
            .firmware_suspected
            .is_none()
    );
    assert!(
        find_candidates(&c, &p, &signals, &[flash(h(101))], h(200))[0]
            .firmware_suspected
            .is_none()
    );
}

fn rm(name: &str) -> Actor {
    Actor {
        name: name.into(),
        role: Role::ReleaseManager,
    }
}

fn candidate(serial: &str, severity: Severity) -> Candidate {
    Candidate {
        part: gpu(serial),
        rule: "fallen_off_bus".into(),
        failure_mode: "pcie_fallen_off_bus".into(),
        severity,
        status: CandidateStatus::Met,
        began_at: t0(),
        samples: Vec::new(),
        firmware_suspected: None,
        document_edition: String::new(),
    }
}

#[test]
fn case_transitions_need_the_right_state_role_and_people() {
    let case = Case::open("case-1", &candidate("S9", Severity::High), t0());
    assert!(case.quarantine_reason().expect("open").contains("case-1"));
    let viewer = Actor {
        name: "vic".into(),
        role: Role::Viewer,
    };
    let collect = CaseEvent::CollectEvidence {
        manifest_sha256: "ab".repeat(32),
    };
    assert!(matches!(
        case.apply(collect.clone(), &viewer, h(1)),
        Err(CaseError::Forbidden { .. })
    ));
    assert!(matches!(
        case.apply(CaseEvent::VendorAccepted, &rm("rita"), h(1)),
        Err(CaseError::NotAllowed { .. })
    ));
    let blank = CaseEvent::CollectEvidence {
        manifest_sha256: " ".into(),
    };
    assert!(matches!(
        case.apply(blank, &rm("rita"), h(1)),
        Err(CaseError::Missing { .. })
    ));
    let c = case.apply(collect, &rm("rita"), h(1)).expect("collect");
    assert_eq!(c.state, CaseState::EvidenceCollected);
    assert_eq!(case.state, CaseState::Candidate, "apply returns a new case");

    let quota = Quota {
        submissions: 5,
        period: TimeDelta::weeks(1),
    };
    let waiting = [Waiting {
        case_id: "case-1".into(),
        severity: Severity::High,
        opened_at: t0(),
    }];
    let admission = request_submission(&quota, "nvidia", &[], &waiting, "case-1", h(2)).expect("free quota");
    let other = Case {
        id: "case-2".into(),
        ..c.clone()
    };
    let wrong = CaseEvent::Submit {
        admission: admission.clone(),
        vendor_reference: "NV-1".into(),
    };
    assert!(matches!(
        other.apply(wrong, &rm("rita"), h(2)),
        Err(CaseError::WrongAdmission { .. })
    ));
    let c = c
        .apply(
            CaseEvent::Submit {
                admission,
                vendor_reference: "NV-1".into(),
            },
            &rm("rita"),
            h(2),
        )
        .expect("submit");
    // An admin may not close a claim the vendor still has to answer.
    let close = CaseEvent::Close {
        reason: "changed my mind".into(),
    };
    let admin = Actor {
        name: "ada".into(),
        role: Role::Admin,
    };
    assert!(matches!(
        c.apply(close.clone(), &admin, h(3)),
        Err(CaseError::NotAllowed { .. })
    ));
    let rejected = c
        .apply(
            CaseEvent::VendorRejected {
                reason: "field diagnostic log missing".into(),
            },
            &rm("rita"),
            h(30),
        )
        .expect("reject");
    assert_eq!(
        rejected.rejection_reason.as_deref(),
        Some("field diagnostic log missing")
    );
    // Still quarantined until a human decides: a release manager may not close it, an admin may.
    assert!(rejected.quarantine_reason().is_some());
    assert!(matches!(
        rejected.apply(close.clone(), &rm("rita"), h(31)),
        Err(CaseError::Forbidden { .. })
    ));
    let closed = rejected.apply(close, &admin, h(31)).expect("admin closes");
    assert!(closed.quarantine_reason().is_none());
    // The planner's view: the node is out while a case on it is open, with the reason.
    let mut elsewhere = Case::open("case-0", &candidate("S8", Severity::Low), t0());
    elsewhere.node = "node-9".into();
    let q = quarantined_nodes(&[rejected.clone(), elsewhere.clone()]);
    assert_eq!(q.keys().collect::<Vec<_>>(), ["node-7", "node-9"]);
    assert!(
        q["node-7"].contains("RMA case case-1 for GPU S9") && q["node-7"].contains("Rejected"),
        "{q:?}"
    );
    assert_eq!(quarantined_nodes(&[closed.clone(), elsewhere]).len(), 1);
    assert_eq!(closed.rejection_reason.as_deref(), Some("field diagnostic log missing"));

    // The other way: resubmit, accept, replace, verify by someone else.
    let again = rejected
        .apply(
            CaseEvent::Resubmit {
                manifest_sha256: "cd".repeat(32),
            },
            &rm("rita"),
            h(40),
        )
        .expect("resubmit");
    let waiting = [Waiting {
        case_id: "case-1".into(),
        severity: Severity::High,
        opened_at: t0(),
    }];
    let admission = request_submission(&quota, "nvidia", &[h(2)], &waiting, "case-1", h(41)).expect("quota left");
    let done = again
        .apply(
            CaseEvent::Submit {
                admission,
                vendor_reference: "NV-2".into(),
            },
            &rm("rita"),
            h(41),
        )
        .and_then(|c| c.apply(CaseEvent::VendorAccepted, &rm("rita"), h(60)))
        .and_then(|c| {
            c.apply(
                CaseEvent::Replaced {
                    new_serial: "S9-NEW".into(),
                },
                &rm("tom"),
                h(100),
            )
        })
        .expect("accepted and replaced");
    assert!(matches!(
        done.apply(CaseEvent::Verified, &rm("tom"), h(101)),
        Err(CaseError::SameActor { .. })
    ));
    let verified = done
        .apply(CaseEvent::Verified, &rm("rita"), h(101))
        .expect("verified by another");
    assert_eq!(verified.state, CaseState::Verified);
    assert!(verified.quarantine_reason().is_none());
    let trail: Vec<(CaseState, CaseState, &str)> = verified
        .history
        .iter()
        .map(|t| (t.from, t.to, t.actor.as_str()))
        .collect();
    use CaseState as S;
    assert_eq!(
        trail,
        [
            (S::Candidate, S::EvidenceCollected, "rita"),
            (S::EvidenceCollected, S::Submitted, "rita"),
            (S::Submitted, S::Rejected, "rita"),
            (S::Rejected, S::EvidenceCollected, "rita"),
            (S::EvidenceCollected, S::Submitted, "rita"),
            (S::Submitted, S::Accepted, "rita"),
            (S::Accepted, S::Replaced, "tom"),
            (S::Replaced, S::Verified, "rita"),
        ]
    );

    // Velocity over this one case: two vendor answers, one each way.
    let crit = criteria();
    let v = velocity(&[verified], &crit, h(102));
    assert_eq!(v.acceptance.len(), 1);
    let a = &v.acceptance[0];
    assert_eq!((a.accepted, a.rejected, a.rate), (1, 1, Some(0.5)));
    let submitted = v.days_in_state.iter().find(|d| d.state == S::Submitted).expect("row");
    // Stays in Submitted: 28 h and 19 h.
    assert_eq!(submitted.stays, 2);
    assert!((submitted.p50_days.expect("p50") - 23.5 / 24.0).abs() < 1e-9);
    assert_eq!(v.quota["nvidia"].used, 2);
    assert_eq!(v.quota["nvidia"].left, 3);
    assert!(v.open_by_state.is_empty());
}

#[test]
fn quota_of_five_a_week_queues_the_sixth_by_severity_and_age() {
    let quota = Quota {
        submissions: 5,
        period: TimeDelta::weeks(1),
    };
    let mut waiting: Vec<Waiting> = (0..8)
        .map(|i| Waiting {
            case_id: format!("case-{i}"),
            // case-5 is critical but newest; the rest high, older first.
            severity: if i == 5 { Severity::Critical } else { Severity::High },
            opened_at: h(i),
        })
        .collect();
    let order: Vec<&str> = queue_order(&waiting).iter().map(|w| w.case_id.as_str()).collect();
    assert_eq!(
        order,
        [
            "case-5", "case-0", "case-1", "case-2", "case-3", "case-4", "case-6", "case-7"
        ]
    );
    // A case behind the free slots cannot jump the queue while slots are free.
    let err = request_submission(&quota, "nvidia", &[], &waiting, "case-6", h(10)).expect_err("behind");
    assert!(matches!(err, QuotaError::Refused { position: 7, .. }), "{err}");

    let mut submissions = Vec::new();
    for (k, id) in ["case-5", "case-0", "case-1", "case-2", "case-3"].iter().enumerate() {
        let now = h(10 + k as i64);
        let a = request_submission(&quota, "nvidia", &submissions, &waiting, id, now).expect("within quota");
        assert_eq!(a.case_id(), *id);
        submissions.push(a.at());
        waiting.retain(|w| w.case_id != *id);
    }
    let status = quota_status(&quota, &submissions, h(20));
    assert_eq!((status.used, status.left), (5, 0));
    assert_eq!(status.next_slot_at, Some(h(10) + TimeDelta::weeks(1)));
    // The sixth is refused with its place in the queue, and the one behind it too.
    let err = request_submission(&quota, "nvidia", &submissions, &waiting, "case-4", h(20)).expect_err("quota used");
    assert_eq!(
        err,
        QuotaError::Refused {
            case_id: "case-4".into(),
            vendor: "nvidia".into(),
            position: 1,
            queue_len: 3,
            used: 5,
            limit: 5,
            next_slot_at: Some(h(10) + TimeDelta::weeks(1)),
        }
    );
    assert!(err.to_string().contains("position 1 of 3"), "{err}");
    let err = request_submission(&quota, "nvidia", &submissions, &waiting, "case-7", h(20)).expect_err("quota used");
    assert!(matches!(err, QuotaError::Refused { position: 3, .. }));
    // When the first slot frees, the head of the queue goes, and only it.
    let later = h(10) + TimeDelta::weeks(1) + TimeDelta::seconds(1);
    assert!(request_submission(&quota, "nvidia", &submissions, &waiting, "case-4", later).is_ok());
    assert!(request_submission(&quota, "nvidia", &submissions, &waiting, "case-6", later).is_err());
    assert!(matches!(
        request_submission(&quota, "nvidia", &submissions, &waiting, "case-0", later),
        Err(QuotaError::NotWaiting { .. })
    ));
}

fn files() -> Vec<EvidenceFile> {
    vec![
        EvidenceFile {
            path: "logs/sel.json".into(),
            bytes: br#"[{"Id":"12","Message":"XID 79"}]"#.to_vec(),
        },
        EvidenceFile {
            path: "inventory.json".into(),
            bytes: br#"{"serial":"S9","part_number":"699-2G520-0200-000","UserName":"svc","Password":null}"#.to_vec(),
        },
        EvidenceFile {
            path: "diagnostics/fielddiag.log".into(),
            bytes: b"FAIL: PCIe link\n".to_vec(),
        },
    ]
}

#[test]
fn evidence_package_is_reproducible_byte_for_byte() {
    let a = build_package(
        "case-1",
        "S9",
        "NVIDIA RMA Process vR525",
        t0(),
        files(),
        &["hunter2-bmc"],
    )
    .expect("build");
    let mut reversed = files();
    reversed.reverse();
    let b = build_package(
        "case-1",
        "S9",
        "NVIDIA RMA Process vR525",
        t0(),
        reversed,
        &["hunter2-bmc"],
    )
    .expect("build");
    assert_eq!(a.archive, b.archive);
    assert_eq!(a.manifest_sha256, b.manifest_sha256);
    let paths: Vec<&str> = a.manifest.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["diagnostics/fielddiag.log", "inventory.json", "logs/sel.json"]);
    // sha256("FAIL: PCIe link\n"), computed independently with `sha256sum`.
    assert_eq!(
        a.manifest.files[0].sha256,
        "b9057e638dd804a5b35352a01d28e06ce28276b3cf1a92ef7b8efc02b141e670"
    );
    // The archive reads back: manifest first, then the files, each as given.
    let mut archive = tar::Archive::new(&a.archive[..]);
    let mut names = Vec::new();
    for entry in archive.entries().expect("entries") {
        let mut entry = entry.expect("entry");
        let mut body = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut body).expect("read");
        let name = entry.path().expect("path").to_string_lossy().into_owned();
        assert_eq!(entry.header().mtime().expect("mtime"), t0().timestamp() as u64);
        if name == "manifest.json" {
            use sha2::Digest;
            assert_eq!(hex::encode(sha2::Sha256::digest(&body)), a.manifest_sha256);
        }
        names.push(name);
    }
    assert_eq!(
        names,
        [
            "manifest.json",
            "diagnostics/fielddiag.log",
            "inventory.json",
            "logs/sel.json"
        ]
    );
    // A changed file changes the manifest hash.
    let mut changed = files();
    changed[2].bytes.push(b'!');
    let c = build_package("case-1", "S9", "NVIDIA RMA Process vR525", t0(), changed, &[]).expect("build");
    assert_ne!(c.manifest_sha256, a.manifest_sha256);
}

#[test]
fn evidence_package_refuses_secrets_and_bad_paths() {
    let with = |path: &str, bytes: &[u8]| {
        let mut f = files();
        f.push(EvidenceFile {
            path: path.into(),
            bytes: bytes.to_vec(),
        });
        build_package("case-1", "S9", "ed", t0(), f, &["hunter2-bmc"])
    };
    for (bytes, what) in [
        (&br#"{"UserName":"root","Password": "calvin"}"#[..], "a password value"),
        (
            b"GET /redfish/v1\r\nAuthorization: Basic cm9vdDpjYWx2aW4=\r\n",
            "an HTTP credential header",
        ),
        (b"X-Auth-Token: 0123456789abcdef\n", "an HTTP credential header"),
        (b"-----BEGIN RSA PRIVATE KEY-----\nMIIE\n", "a private key"),
        (b"bmc password was hunter2-bmc", "a known credential"),
    ] {
        let err = with("extra.txt", bytes).expect_err("secret");
        assert!(
            matches!(err, EvidenceError::SecretFound { what: w, .. } if w == what),
            "{err}"
        );
        assert!(!err.to_string().contains("calvin") && !err.to_string().contains("hunter2"));
    }
    // Redacted password fields are fine.
    assert!(with("extra.json", br#"{"Password": "", "password":null}"#).is_ok());
    for path in ["/etc/passwd", "../x", "a//b", "a/./b", "manifest.json", ""] {
        assert!(
            matches!(with(path, b"x"), Err(EvidenceError::InvalidPath { .. })),
            "{path}"
        );
    }
    assert!(matches!(
        with("inventory.json", b"x"),
        Err(EvidenceError::DuplicatePath { .. })
    ));
    // The sweep itself, on a whole archive: nothing in a clean package.
    let clean = build_package("case-1", "S9", "ed", t0(), files(), &["hunter2-bmc"]).expect("build");
    assert_eq!(secret_sweep(&clean.archive, &["hunter2-bmc"]), None);
}

/// Every state against every event: which transitions exist and where they lead.
#[test]
fn state_event_table() {
    use CaseState as S;
    let quota = Quota {
        submissions: 100,
        period: TimeDelta::weeks(1),
    };
    let admission = || {
        let waiting = [Waiting {
            case_id: "case-t".into(),
            severity: Severity::High,
            opened_at: t0(),
        }];
        request_submission(&quota, "nvidia", &[], &waiting, "case-t", h(1)).expect("admitted")
    };
    let events: Vec<(&str, CaseEvent)> = vec![
        (
            "collect",
            CaseEvent::CollectEvidence {
                manifest_sha256: "ab".into(),
            },
        ),
        (
            "submit",
            CaseEvent::Submit {
                admission: admission(),
                vendor_reference: "NV-9".into(),
            },
        ),
        ("accepted", CaseEvent::VendorAccepted),
        (
            "rejected",
            CaseEvent::VendorRejected {
                reason: "no diag".into(),
            },
        ),
        (
            "resubmit",
            CaseEvent::Resubmit {
                manifest_sha256: "cd".into(),
            },
        ),
        (
            "replaced",
            CaseEvent::Replaced {
                new_serial: "NEW".into(),
            },
        ),
        ("verified", CaseEvent::Verified),
        (
            "close",
            CaseEvent::Close {
                reason: "false candidate".into(),
            },
        ),
    ];
    // (state, event) -> next state; every pair not listed is refused.
    let allowed: &[(S, &str, S)] = &[
        (S::Candidate, "collect", S::EvidenceCollected),
        (S::Candidate, "close", S::Closed),
        (S::EvidenceCollected, "submit", S::Submitted),
        (S::EvidenceCollected, "close", S::Closed),
        (S::Submitted, "accepted", S::Accepted),
        (S::Submitted, "rejected", S::Rejected),
        (S::Accepted, "replaced", S::Replaced),
        (S::Accepted, "close", S::Closed),
        (S::Rejected, "resubmit", S::EvidenceCollected),
        (S::Rejected, "close", S::Closed),
        (S::Replaced, "verified", S::Verified),
    ];
    let admin = Actor {
        name: "ada".into(),
        role: Role::Admin,
    };
    for state in CaseState::ALL {
        let mut case = Case::open("case-t", &candidate("ST", Severity::High), t0());
        case.state = state;
        for (name, event) in &events {
            let got = case.apply(event.clone(), &admin, h(2));
            let want = allowed
                .iter()
                .find(|(s, e, _)| *s == state && e == name)
                .map(|(_, _, to)| *to);
            match (got, want) {
                (Ok(next), Some(to)) => {
                    assert_eq!(next.state, to, "{state:?} --{name}-->");
                    assert_eq!(next.history.last().map(|t| (t.from, t.to)), Some((state, to)));
                    assert_eq!(next.state.is_open(), !matches!(to, S::Verified | S::Closed));
                }
                (Err(CaseError::NotAllowed { .. }), None) => {}
                (got, want) => panic!("{state:?} --{name}--> got {got:?}, want {want:?}"),
            }
        }
    }
}

/// Logs and config dumps write credentials as text, not JSON: those forms are found too, and a
/// masked or absent value is not a finding.
#[test]
fn the_sweep_reads_text_credentials() {
    for found in [
        &b"ipmitool -U admin -P x; bmc Password: hunter2\n"[..],
        b"[redfish]\npasswd=s3cret\n",
        b"{\"UserName\": \"root\", \"Password\": \"calvin\"}",
    ] {
        assert_eq!(
            secret_sweep(found, &[]),
            Some("a password value"),
            "{}",
            String::from_utf8_lossy(found)
        );
    }
    for clean in [
        &b"Password: ********\n"[..],
        b"password=<redacted>\n",
        b"{\"Password\": null, \"PasswordChangeRequired\": false}",
        b"Password:\n",
        b"the password expired",
    ] {
        assert_eq!(secret_sweep(clean, &[]), None, "{}", String::from_utf8_lossy(clean));
    }
}
