//! `waveguard rma` as an operator runs it: real processes against a real
//! SQLite file holding a case the detector opened.

use std::process::{Command, Output};
use std::sync::Arc;

use orchestrator_db::testing::fixtures::rma_candidate;
use orchestrator_db::{AuditFilter, Db};
use orchestrator_rma::Severity;
use orchestrator_types::SystemClock;

const BIN: &str = env!("CARGO_BIN_EXE_waveguard");

fn waveguard(db_url: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("WAVEGUARD_DATABASE_URL", db_url)
        .env("USER", "olga")
        .env_remove("WAVEGUARD_CONFIG")
        .output()
        .expect("waveguard runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn an_operator_lists_a_case_records_the_vendors_answer_and_closes_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("w.db").display());
    let db = Db::connect_and_migrate(&url, Arc::new(SystemClock)).await.unwrap();
    let candidate = rma_candidate("1654922001234", "gpu-r1-n07", "row_remap_failure", Severity::Critical);
    let case = db.open_rma_case(&candidate, "detector").await.unwrap();

    let out = waveguard(&url, &["rma", "list", "--open"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = text(&out.stdout);
    assert!(
        listed.contains(&case.id) && listed.contains("gpu-r1-n07") && listed.contains("candidate"),
        "{listed}"
    );

    let out = waveguard(&url, &["rma", "show", &case.id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("row_remap_failure"), "{}", text(&out.stdout));

    // A move the pipeline does not allow is the user's to fix (exit 2).
    let out = waveguard(&url, &["rma", "record", &case.id, "accepted"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let out = waveguard(&url, &["rma", "show", "RMA-nope"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));

    let out = waveguard(
        &url,
        &[
            "rma",
            "record",
            &case.id,
            "close",
            "--reason",
            "field diagnostic passed twice",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("no longer held out of rollouts"),
        "{}",
        text(&out.stdout)
    );
    let out = waveguard(&url, &["rma", "list", "--open"]);
    assert!(!text(&out.stdout).contains(&case.id));
    assert!(db.rma_holds().await.unwrap().is_empty());
    let audit = db
        .audit_entries(&AuditFilter {
            action: Some("rma.transition".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].actor, "local-admin:olga");
}
