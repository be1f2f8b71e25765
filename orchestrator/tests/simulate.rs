//! `waveguard simulate` as a user runs it: a real process, bmc-sim over
//! loopback HTTP, a temporary SQLite database, the real engine; the report is
//! read back and checked key by key.

use std::path::Path;
use std::process::{Command, Output};

use integration_tests::ScenarioYaml;
use integration_tests::fixtures::{PolicyYaml, WaveSize, WaveYaml, health_section, redfish_gate};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_waveguard");

const GPU_FROM: &str = "96.00.5E.00.01";
const GPU_GOOD: &str = "96.00.61.00.01";
const GPU_FAILS: &str = "96.00.66.00.01";
const GPU_XID_STORM: &str = "96.00.70.00.01";

fn scenario(nodes: usize) -> String {
    ScenarioYaml::hgx(nodes)
        .seed(5)
        .layout(6, 2)
        .nodes_per_nvlink_domain(2)
        .gpu_firmware(GPU_GOOD, "{min: 5m, max: 9m}")
        .firmware(&format!(
            "  - kind: gpu\n    version: \"{GPU_FAILS}\"\n    flash_time: {{min: 5m, max: 9m}}\n    flash_fail_rate: 1.0"
        ))
        .firmware(&format!(
            "  - kind: gpu\n    version: \"{GPU_XID_STORM}\"\n    flash_time: {{min: 5m, max: 9m}}\n    effects:\n      \
             - {{metric: xid_errors_per_gpu_hour, multiply: 4.0, share: 1.0, onset: 0s}}"
        ))
        .baseline("gpu_temp_c: {mean: 62, sd: 3}")
        .baseline("gpu_power_w: {mean: 550, sd: 40}")
        .baseline("xid_errors_per_gpu_hour: 0.5")
        .baseline("pcie_aer_per_node_hour: 0.5")
        .baseline("link_degraded_per_node_day: 0.1")
        .bmc_fault("unavailable_rate: 0.02")
        .bmc_faults("{min: 30s, max: 60s}", "{min: 2m, max: 4m}")
        .render()
}

/// Two waves with hours of bake; `approval` goes on the second wave.
fn policy(approval: &str) -> String {
    policy_with(approval, "")
}

/// An XID gate, so the detector judges the waves.
fn xid_gate() -> String {
    health_section(
        0.05,
        &[redfish_gate(
            "xid_errors",
            "xid_errors_per_gpu_hour",
            "rate",
            "1.5",
            "30m",
        )],
    )
}

fn policy_with(approval: &str, health: &str) -> String {
    let policy = PolicyYaml::two_waves("sim-test")
        .required_gates(&["burn_in"])
        .waves(vec![
            WaveYaml::new("canary", WaveSize::Count(4))
                .stratify_by(&["rack"])
                .bake("6h")
                .max_in_flight(4),
            WaveYaml::new("rest", WaveSize::Rest)
                .bake("2h")
                .line(approval)
                .max_in_flight(20),
        ])
        .concurrency(20, &["per_rack: 4"]);
    if health.is_empty() {
        policy.render()
    } else {
        policy.health(health).render()
    }
}

struct Run {
    output: Output,
    report: Option<Value>,
}

fn simulate(dir: &Path, nodes: usize, policy_text: &str, release: &str, extra: &[&str]) -> Run {
    let scenario_path = dir.join("scenario.yaml");
    let policy_path = dir.join("policy.yaml");
    let report_path = dir.join("out.json");
    std::fs::write(&scenario_path, scenario(nodes)).expect("write scenario");
    std::fs::write(&policy_path, policy_text).expect("write policy");
    let output = Command::new(BIN)
        .arg("simulate")
        .arg("--scenario")
        .arg(&scenario_path)
        .arg("--policy")
        .arg(&policy_path)
        .args(["--release", release])
        .arg("--report")
        .arg(&report_path)
        .args(extra)
        .current_dir(dir)
        .env_remove("WAVEGUARD_DATABASE_URL")
        .env_remove("WAVEGUARD_CONFIG")
        .output()
        .expect("waveguard runs");
    let report = std::fs::read_to_string(&report_path)
        .ok()
        .map(|text| serde_json::from_str(&text).expect("the report is JSON"));
    Run { output, report }
}

fn stderr(run: &Run) -> String {
    String::from_utf8_lossy(&run.output.stderr).into_owned()
}

fn keys(value: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = value
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    keys
}

/// Every key of the contract is present, with the contract's shape.
fn check_contract(report: &Value) {
    for key in [
        "outcome",
        "release_state",
        "waves",
        "detection",
        "exposure",
        "final_versions",
        "updates",
        "sim_seconds",
        "wall_seconds",
    ] {
        assert!(report.get(key).is_some(), "report lacks {key}: {report:#}");
    }
    for wave in report["waves"].as_array().expect("waves is a list") {
        for key in ["name", "nodes", "started_at_s", "ended_at_s", "decision", "verdicts"] {
            assert!(wave.get(key).is_some(), "wave lacks {key}: {wave}");
        }
        for verdict in wave["verdicts"].as_array().expect("verdicts is a list") {
            assert_eq!(keys(verdict), ["effect", "metric", "p_value", "verdict"]);
        }
    }
    assert_eq!(keys(&report["detection"]), ["at_s", "detected", "metric"]);
    assert_eq!(
        keys(&report["exposure"]),
        ["max_nodes_on_release", "nodes_on_release_at_detection"]
    );
    assert_eq!(
        keys(&report["updates"]),
        [
            "attempted",
            "bricked",
            "failed",
            "max_flashes_per_node_step",
            "rolled_back",
            "succeeded"
        ]
    );
    assert!(report["sim_seconds"].is_i64(), "{}", report["sim_seconds"]);
    assert!(report["wall_seconds"].is_f64(), "{}", report["wall_seconds"]);
}

#[test]
fn good_firmware_completes_with_automatic_approvals() {
    let dir = tempfile::tempdir().unwrap();
    let run = simulate(
        dir.path(),
        24,
        &policy("approval: manual\n    approvers: 2"),
        &format!("gpu@{GPU_GOOD}"),
        &["--approve", "auto"],
    );
    assert!(
        run.output.status.success(),
        "exit {:?}: {}",
        run.output.status,
        stderr(&run)
    );
    let report = run.report.as_ref().expect("a report is written");
    check_contract(report);
    assert_eq!(report["outcome"], "completed", "{report:#}");
    assert_eq!(report["release_state"], "qualified");
    let waves = report["waves"].as_array().unwrap();
    let summary: Vec<(&str, i64, &str)> = waves
        .iter()
        .map(|w| {
            (
                w["name"].as_str().unwrap(),
                w["nodes"].as_i64().unwrap(),
                w["decision"].as_str().unwrap_or("-"),
            )
        })
        .collect();
    assert_eq!(summary, [("canary", 4, "promote"), ("rest", 20, "promote")]);
    // Hours of bake passed in simulated time, in order.
    let canary_end = waves[0]["ended_at_s"].as_i64().unwrap();
    let rest_start = waves[1]["started_at_s"].as_i64().unwrap();
    assert!(canary_end >= 6 * 3600, "the canary baked 6 h: {canary_end}");
    assert!(rest_start >= canary_end, "{rest_start} < {canary_end}");
    assert!(report["sim_seconds"].as_i64().unwrap() >= 8 * 3600);
    assert_eq!(report["final_versions"], serde_json::json!({ GPU_GOOD: 24 }));
    let updates = &report["updates"];
    assert_eq!(updates["attempted"], 24);
    assert_eq!(updates["succeeded"], 24);
    assert_eq!(updates["failed"], 0);
    assert_eq!(updates["bricked"], 0);
    assert_eq!(updates["rolled_back"], 0);
    assert_eq!(updates["max_flashes_per_node_step"], 1);
    assert_eq!(report["exposure"]["max_nodes_on_release"], 24);
    assert_eq!(report["detection"]["detected"], false);
    assert!(report["detection"]["at_s"].is_null());
    // Two distinct synthetic approvers satisfied the two-person rule.
    assert_eq!(report["approvals_given"], 2, "{report:#}");
}

#[test]
fn a_manual_wave_without_auto_approval_ends_halted_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let run = simulate(
        dir.path(),
        12,
        &policy("approval: manual"),
        &format!("gpu@{GPU_GOOD}"),
        &[],
    );
    assert!(run.output.status.success(), "{}", stderr(&run));
    let report = run.report.as_ref().expect("a report is written");
    check_contract(report);
    assert_eq!(report["outcome"], "halted");
    let reason = report["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("approval") && reason.contains("canary"), "{reason}");
    assert_eq!(report["waves"][0]["decision"], "hold");
    assert_eq!(report["final_versions"][GPU_GOOD], 4, "{report:#}");
    assert_eq!(report["final_versions"][GPU_FROM], 8, "{report:#}");
}

#[test]
fn failing_flashes_halt_on_the_failure_budget_and_never_flash_twice() {
    let dir = tempfile::tempdir().unwrap();
    let run = simulate(
        dir.path(),
        12,
        &policy("approval: auto"),
        &format!("gpu@{GPU_FAILS}"),
        &["--approve", "auto"],
    );
    assert!(
        run.output.status.success(),
        "exit 0 whatever the outcome: {}",
        stderr(&run)
    );
    let report = run.report.as_ref().expect("a report is written");
    check_contract(report);
    assert_eq!(report["outcome"], "halted", "{report:#}");
    assert!(
        report["reason"].as_str().unwrap_or_default().contains("failure budget"),
        "{report:#}"
    );
    assert_eq!(report["waves"][0]["decision"], "halt");
    assert!(report["waves"][1]["started_at_s"].is_null(), "no later wave started");
    let updates = &report["updates"];
    assert_eq!(updates["succeeded"], 0);
    assert!(updates["failed"].as_u64().unwrap() >= 2, "{updates}");
    assert_eq!(updates["max_flashes_per_node_step"], 1);
    assert_eq!(report["final_versions"], serde_json::json!({ GPU_FROM: 12 }));
}

#[test]
fn a_regression_is_detected_in_the_canary_and_rolled_back() {
    let dir = tempfile::tempdir().unwrap();
    let run = simulate(
        dir.path(),
        24,
        &policy_with("approval: auto", &xid_gate()),
        &format!("gpu@{GPU_XID_STORM}"),
        &["--approve", "auto"],
    );
    assert!(run.output.status.success(), "{}", stderr(&run));
    let report = run.report.as_ref().expect("a report is written");
    check_contract(report);
    assert_eq!(report["outcome"], "rolled_back", "{report:#}");
    assert_eq!(report["release_state"], "blocked", "{report:#}");
    assert_eq!(report["detection"]["detected"], true);
    assert_eq!(report["detection"]["metric"], "xid_errors_per_gpu_hour");
    let at = report["detection"]["at_s"].as_i64().expect("a detection time");
    let canary = &report["waves"][0];
    assert_eq!(canary["decision"], "rollback");
    assert!(at >= canary["started_at_s"].as_i64().unwrap(), "{report:#}");
    let failed: Vec<&Value> = canary["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["verdict"] == "fail")
        .collect();
    assert_eq!(failed.len(), 1, "{canary:#}");
    assert_eq!(failed[0]["metric"], "xid_errors_per_gpu_hour");
    assert!(failed[0]["p_value"].as_f64().unwrap() < 0.05);
    assert!(failed[0]["effect"].as_f64().unwrap() > 1.5);
    // Only the canary ever ran the release, and every node is back.
    assert!(report["waves"][1]["started_at_s"].is_null());
    assert_eq!(report["exposure"]["max_nodes_on_release"], 4);
    assert_eq!(report["exposure"]["nodes_on_release_at_detection"], 4);
    assert_eq!(report["updates"]["rolled_back"], 4);
    assert_eq!(report["updates"]["max_flashes_per_node_step"], 1);
    assert_eq!(report["final_versions"], serde_json::json!({ GPU_FROM: 24 }));
}

#[test]
fn bad_input_exits_2_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let good_policy = policy("approval: auto");
    let bmc_policy = good_policy
        .replace("component: gpu", "component: bmc")
        .replace("inventory_id: \"HGX_FW_GPU_*\"", "inventory_id: BMC_Firmware");
    let cases: [(&str, String, String, &str); 5] = [
        ("no @", good_policy.clone(), GPU_GOOD.into(), "KIND@VERSION"),
        (
            "unknown kind",
            good_policy.clone(),
            format!("fpga@{GPU_GOOD}"),
            "unknown component kind",
        ),
        (
            "kind mismatch",
            bmc_policy,
            format!("gpu@{GPU_GOOD}"),
            "updates bmc firmware",
        ),
        (
            "invalid policy",
            "name: x\nwaves: 3\n".into(),
            format!("gpu@{GPU_GOOD}"),
            "policy",
        ),
        (
            "nothing eligible",
            good_policy.replace("[hgx-h100-8gpu]", "[hgx-b200-8gpu]"),
            format!("gpu@{GPU_GOOD}"),
            "",
        ),
    ];
    for (name, policy_text, release, expected) in cases {
        let run = simulate(dir.path(), 4, &policy_text, &release, &[]);
        assert_eq!(run.output.status.code(), Some(2), "{name}: {}", stderr(&run));
        assert!(stderr(&run).contains(expected), "{name}: {}", stderr(&run));
        assert!(!stderr(&run).contains("panicked"), "{name}: {}", stderr(&run));
    }
    // A missing scenario file.
    let output = Command::new(BIN)
        .args(["simulate", "--scenario", "/nonexistent/s.yaml", "--policy"])
        .arg(dir.path().join("policy.yaml"))
        .args(["--release", "gpu@1.2.3", "--report"])
        .arg(dir.path().join("r.json"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot read the scenario"));
}

/// `waveguard demo` tells its whole story on a small fleet: the BMC release
/// completes after one approval, the bad GPU release is rolled back and
/// blocked; the web UI answers and the demo user can log in; SIGTERM stops it and removes its
/// temporary database.
#[test]
fn the_demo_tells_its_story_and_stops_on_sigterm() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    let mut child = Command::new(BIN)
        .args([
            "demo",
            "--listen",
            "127.0.0.1:0",
            "--nodes",
            "60",
            "--approve-after",
            "1",
        ])
        .env_remove("WAVEGUARD_DATABASE_URL")
        .env_remove("WAVEGUARD_CONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("waveguard demo starts");
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(150);
    let mut lines = Vec::new();
    let mut url = None;
    let mut password = None;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    // A session opened as the story starts, to use again when it ends.
    let mut early_session: Option<(String, Instant)> = None;
    while !lines.iter().any(|l: &String| l.starts_with("The story is over")) {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = rx.recv_timeout(left) else {
            let _ = child.kill();
            panic!("the story did not end in time:\n{}", lines.join("\n"));
        };
        if let Some(rest) = line.strip_prefix("Waveguard demo is running at ") {
            url = Some(rest.trim().to_owned());
        }
        if let Some(rest) = line.trim().strip_prefix("log in as \"demo\" with password \"") {
            password = Some(rest.trim_end_matches('"').to_owned());
        }
        if let (None, Some(url), Some(password)) = (&early_session, &url, &password) {
            let cookie = runtime
                .block_on(demo_login(&http, url, password))
                .expect("the printed password logs in");
            early_session = Some((cookie, Instant::now()));
        }
        lines.push(line);
    }
    let story = lines.join("\n");
    assert!(story.contains("BMC 24.04.2 rollout completed"), "{story}");
    assert!(story.contains("demo-autopilot approved"), "{story}");
    assert!(story.contains("GPU 96.00.66.00.01 rollout rolled_back"), "{story}");
    assert!(story.contains("GPU 96.00.66.00.01 release is now blocked"), "{story}");
    // The fleet's workload scheduler (the command adapter): a busy node drains
    // before its flash, one never empties and is given back, an operator's
    // drain is left alone.
    assert!(story.contains("waits for its job to end before the flash"), "{story}");
    assert!(
        story.contains("did not empty within the wave's drain_timeout"),
        "{story}"
    );
    assert!(
        story.contains("node-00007 left alone: drained by someone else in the workload scheduler"),
        "{story}"
    );
    let url = url.expect("the URL is printed");
    let password = password.expect("the password is printed");
    assert_eq!(password.len(), 16);
    // The database is named, with a CLI command that reads it.
    let database = lines
        .iter()
        .find_map(|l| l.trim().strip_prefix("database: "))
        .and_then(|rest| rest.split(" (").next())
        .map(std::path::PathBuf::from)
        .expect("the database path is printed");
    assert!(database.is_file(), "{}", database.display());
    let example = lines
        .iter()
        .map(|l| l.trim())
        .find(|l| {
            l.ends_with(&format!(
                "--database-url sqlite://{} rollout show 1",
                database.display()
            ))
        })
        .unwrap_or_else(|| panic!("a read-only CLI example against the database:\n{story}"));
    // The example runs as printed (the binary's own path first) and reads the
    // demo's rollout in words.
    let words: Vec<&str> = example.split_whitespace().collect();
    let shown = Command::new(words[0])
        .args(&words[1..])
        .env_remove("WAVEGUARD_CONFIG")
        .output()
        .unwrap();
    assert!(shown.status.success(), "{}", String::from_utf8_lossy(&shown.stderr));
    let shown_text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown_text.contains("rollout 1: bmc@24.04.2") && shown_text.contains("APPROVALS"),
        "{shown_text}"
    );
    // A command that writes would record the real time among the demo's
    // accelerated times: refused, saying why; nothing is changed.
    let db_url = format!("sqlite://{}", database.display());
    for write in [
        &["rollout", "pause", "1", "--reason", "look"][..],
        &["release", "transition", "1", "--to", "deprecated"][..],
    ] {
        let refused = Command::new(BIN)
            .args(["--database-url", &db_url])
            .args(write)
            .env_remove("WAVEGUARD_CONFIG")
            .env("USER", "carol")
            .output()
            .unwrap();
        assert_eq!(
            refused.status.code(),
            Some(2),
            "{write:?}: {}",
            String::from_utf8_lossy(&refused.stderr)
        );
        assert!(
            String::from_utf8_lossy(&refused.stderr)
                .contains("this database belongs to a running demo on an accelerated clock (1200x"),
            "{write:?}: {}",
            String::from_utf8_lossy(&refused.stderr)
        );
    }

    runtime.block_on(async {
        let health = http.get(format!("{url}/healthz")).send().await.expect("healthz");
        assert!(health.status().is_success());
        assert!(
            demo_login(&http, &url, "not-the-password").await.is_none(),
            "a wrong password opens no session"
        );
        // Sessions run on real time: 12 simulated hours pass in 36 real
        // seconds at 1,200x, and the session opened at the start still works.
        let (cookie, opened) = early_session.expect("logged in as the story started");
        let twelve_hours_at_1200x = Duration::from_secs(40);
        if let Some(wait) = twelve_hours_at_1200x.checked_sub(opened.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        let page = http
            .get(format!("{url}/rollouts"))
            .header("cookie", &cookie)
            .send()
            .await
            .expect("rollouts page");
        assert_eq!(
            page.status(),
            reqwest::StatusCode::OK,
            "still logged in: {:?}",
            page.headers()
        );
    });

    // SIGTERM, as `kill`, systemd and container runtimes stop it (Ctrl-C's SIGINT takes the same
    // path): the temporary database goes however the demo is stopped.
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
            break exit;
        }
        assert!(Instant::now() < deadline + Duration::from_secs(20), "demo did not stop");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(exit.success(), "{exit:?}");
    assert!(!database.exists(), "the temporary database is removed on exit");
}

/// The controller under a real `ulimit -n` (soft 256, set by the shell for this process only) with a
/// fleet larger than that limit allows at one connection per BMC, the fleet in processes of its own
/// (which raise their own soft limit): the connection bound sized from the limit queues the BMCs, and
/// the rollout completes with no node failed.
#[test]
fn under_a_low_open_file_limit_the_bound_queues_bmcs_and_no_node_fails() {
    let dir = tempfile::tempdir().expect("temp dir");
    let nodes = 300;
    std::fs::write(dir.path().join("scenario.yaml"), scenario(nodes)).expect("write scenario");
    let policy_text = PolicyYaml::two_waves("ulimit-test")
        .required_gates(&["burn_in"])
        .waves(vec![
            WaveYaml::new("canary", WaveSize::Count(4)).bake("20m").max_in_flight(4),
            WaveYaml::new("rest", WaveSize::Rest).bake("20m").max_in_flight(200),
        ])
        .concurrency(200, &[])
        .render();
    std::fs::write(dir.path().join("policy.yaml"), policy_text).expect("write policy");
    let script = format!(
        "ulimit -Sn 256 && exec '{BIN}' simulate --scenario scenario.yaml --policy policy.yaml \
         --release gpu@{GPU_GOOD} --report out.json --approve auto --fleet-processes 2 --speedup 600"
    );
    let output = Command::new("sh")
        .args(["-c", &script])
        .current_dir(dir.path())
        .env_remove("WAVEGUARD_DATABASE_URL")
        .env_remove("WAVEGUARD_CONFIG")
        .output()
        .expect("sh runs");
    let err = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{err}");
    assert!(
        err.contains("the controller keeps at most 192 BMC connections open"),
        "the bound comes from the soft limit (256 less a quarter): {err}"
    );
    assert!(!err.contains("Too many open files"), "{err}");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("out.json")).expect("report")).expect("JSON");
    assert_eq!(report["outcome"], "completed", "{report:#}\n{err}");
    assert_eq!(report["updates"]["succeeded"], nodes, "{report:#}");
    assert_eq!(report["updates"]["failed"], 0, "{report:#}");
    assert_eq!(report["updates"]["bricked"], 0, "{report:#}");
    // No node failed or quarantined for a controller reason: whatever faults of its own the
    // controller met (`controller.faults`, allowed), none reached a node.
    assert_eq!(report["nodes_quarantined"], 0, "{report:#}");
    assert!(report["controller"]["faults"].is_u64(), "{report:#}");
    assert_eq!(report["updates"]["max_flashes_per_node_step"], 1, "{report:#}");
    for refused in ["auth_failed", "rejected the credentials", "session_lost"] {
        assert!(!err.contains(refused), "{refused}: {err}");
    }
}

/// Logs in to the demo as `demo` through its form (CSRF by double submit:
/// the token in a cookie set with the form and the same token in the form);
/// the session cookie (`name=value`), or `None` when the login is refused.
async fn demo_login(http: &reqwest::Client, url: &str, password: &str) -> Option<String> {
    let page = http.get(format!("{url}/login")).send().await.expect("login page");
    let csrf = page
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| v.strip_prefix("wg_login_csrf="))
        .and_then(|v| v.split(';').next())
        .expect("the login page sets its CSRF cookie")
        .to_owned();
    let login = http
        .post(format!("{url}/login"))
        .header("cookie", format!("wg_login_csrf={csrf}"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(
            url::form_urlencoded::Serializer::new(String::new())
                .append_pair("username", "demo")
                .append_pair("password", password)
                .append_pair("csrf", &csrf)
                .finish(),
        )
        .send()
        .await
        .expect("login");
    let cookie = login
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| !v.starts_with("wg_login_csrf="))
        .and_then(|v| v.split(';').next())
        .map(str::to_owned);
    cookie.filter(|_| login.status().is_redirection())
}
