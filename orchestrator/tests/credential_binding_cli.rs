//! Issue 24 #1, unbound profiles: a credential profile whose configuration
//! lists no `hosts` is bound to the hosts of the nodes it was first imported
//! with, durably (in the database); a later node on a new host gets no
//! password until an admin extends the binding. A real process on a real
//! SQLite file; the BMC addresses are closed loopback ports, so the only
//! question is whether the password would have been sent.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use orchestrator_db::Db;
use orchestrator_types::SystemClock;

const BIN: &str = env!("CARGO_BIN_EXE_waveguard");
const REFUSED: &str = "may not be sent to";

fn waveguard(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(["--config", "waveguard.toml"])
        .args(args)
        .current_dir(dir)
        .env_remove("WAVEGUARD_DATABASE_URL")
        .env("USER", "ops")
        .env("LAB_BMC_PASSWORD", "fleet-secret")
        .output()
        .expect("waveguard runs")
}

fn ok(output: Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{what}: stdout {stdout} stderr {}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn csv(dir: &Path, file: &str, rows: &[(&str, &str)]) {
    let mut text = "name,bmc_url,credential_ref,platform_sku,region,cluster,rack,nvlink_domain\n".to_owned();
    for (name, url) in rows {
        text.push_str(&format!("{name},{url},lab,hgx-h100-8gpu,r1,c1,k1,nvl1\n"));
    }
    std::fs::write(dir.join(file), text).unwrap();
}

fn discover(dir: &Path, node: &str) -> String {
    ok(
        waveguard(dir, &["fleet", "discover", "--node", node, "--node-timeout-secs", "1"]),
        "discover",
    )
}

#[tokio::test]
async fn a_new_host_gets_no_password_until_an_admin_extends_the_binding() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("waveguard.toml"),
        "database_url = \"sqlite://wg.db\"\n[credentials.lab]\nusername = \"admin\"\npassword_env = \"LAB_BMC_PASSWORD\"\n\
         insecure_skip_verify = \"closed loopback ports in a test\"\n",
    )
    .unwrap();
    csv(
        d,
        "first.csv",
        &[("node-a", "https://127.0.0.1:9"), ("node-b", "https://127.0.0.2:9")],
    );
    ok(waveguard(d, &["fleet", "import", "first.csv"]), "first import");
    // Later, a node on a host the profile has never been sent to.
    csv(d, "later.csv", &[("node-c", "https://127.0.0.3:9")]);
    ok(waveguard(d, &["fleet", "import", "later.csv"]), "later import");

    let known = discover(d, "node-a");
    assert!(!known.contains(REFUSED), "{known}");
    let new = discover(d, "node-c");
    assert!(new.contains(REFUSED) && new.contains("127.0.0.3"), "{new}");
    assert!(!new.contains("fleet-secret"), "{new}");

    // The binding is in the database, with its audit trail.
    let db = Db::connect_and_migrate(
        &format!("sqlite://{}", d.join("wg.db").display()),
        Arc::new(SystemClock),
    )
    .await
    .unwrap();
    let bound = db.credential_host_bindings().await.unwrap();
    assert_eq!(bound["lab"], ["127.0.0.1", "127.0.0.2"]);

    // A write with an implausible OS user is refused; the admin's is taken.
    let forged = Command::new(BIN)
        .args([
            "--config",
            "waveguard.toml",
            "fleet",
            "bind-host",
            "--profile",
            "lab",
            "127.0.0.3",
        ])
        .current_dir(d)
        .env("USER", "a:b")
        .output()
        .unwrap();
    assert_eq!(forged.status.code(), Some(2));
    let extended = ok(
        waveguard(d, &["fleet", "bind-host", "--profile", "lab", "127.0.0.3"]),
        "bind-host",
    );
    assert!(extended.contains("127.0.0.3"), "{extended}");
    let admitted = discover(d, "node-c");
    assert!(!admitted.contains(REFUSED), "{admitted}");

    let audit = db
        .audit_entries(&orchestrator_db::AuditFilter {
            subject_type: Some("credential_profile".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let actions: Vec<(&str, &str)> = audit.iter().map(|e| (e.action.as_str(), e.actor.as_str())).collect();
    assert_eq!(
        actions,
        [
            ("credential.binding_extended", "local-admin:ops"),
            ("credential.bound_on_first_import", "local-admin:ops"),
        ]
    );
    db.close().await.unwrap();
}
