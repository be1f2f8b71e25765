//! Redfish behaviour of simulated BMCs, over real loopback HTTP.

mod common;

use std::time::Duration;

use bmc_sim::ImageServer;
use bmc_sim::image;
use chrono::Duration as SimDuration;
use common::{Harness, PASS, SKU, SMALL, USER, start, start_with};
use orchestrator_types::ComponentKind;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const GPU_NEW: &str = "96.00.61.00.01";
const GPU_FAILS: &str = "96.00.66.00.01";
const GPU_BRICKS: &str = "96.00.99.00.01";
const BMC_NEW: &str = "24.04.2";

fn gpu_image(version: &str) -> Vec<u8> {
    image::build(
        ComponentKind::Gpu,
        version,
        &[SKU, "other-sku"],
        b"gpu firmware payload",
    )
}

async fn simple_update(h: &Harness, node: usize, uri: &str, targets: Value) -> String {
    let resp = h
        .post_json(
            node,
            "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
            json!({"ImageURI": uri, "TransferProtocol": "HTTP", "Targets": targets}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let monitor = resp
        .headers()
        .get("Location")
        .and_then(|v| v.to_str().ok())
        .expect("task monitor in Location")
        .to_owned();
    assert!(monitor.contains("/TaskMonitors/"), "{monitor}");
    // The task monitor is not the task: the body carries the Task resource.
    let task: Value = resp.json().await.expect("task body");
    task["@odata.id"].as_str().expect("task @odata.id").to_owned()
}

async fn multipart_update(h: &Harness, node: usize, params: Value, image: Vec<u8>) -> reqwest::Response {
    let form = reqwest::multipart::Form::new()
        .part(
            "UpdateParameters",
            reqwest::multipart::Part::text(params.to_string())
                .mime_str("application/json")
                .expect("mime"),
        )
        .part("UpdateFile", reqwest::multipart::Part::bytes(image).file_name("fw.bin"));
    h.http
        .post(h.url(node, "/redfish/v1/UpdateService/update-multipart"))
        .basic_auth(USER, Some(PASS))
        .multipart(form)
        .send()
        .await
        .expect("multipart request")
}

/// Waits (real time) for a SimpleUpdate download to finish, then returns the task.
async fn wait_task_state(h: &Harness, node: usize, loc: &str, want: &[&str]) -> Value {
    for _ in 0..100 {
        let t = h.task(node, loc).await;
        if want.contains(&t["TaskState"].as_str().unwrap_or_default()) {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("task {loc} never reached {want:?}");
}

fn message_ids(task: &Value) -> Vec<String> {
    task["Messages"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|m| m["MessageId"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn auth_basic_session_and_public_root() {
    let h = start(SMALL).await;
    // The service root is public; everything else needs credentials.
    let root = h.http.get(h.url(0, "/redfish/v1")).send().await.expect("root");
    assert_eq!(root.status(), 200);
    let root: Value = root.json().await.expect("json");
    assert_eq!(root["@odata.type"], "#ServiceRoot.v1_21_0.ServiceRoot");
    let anon = h.http.get(h.url(0, "/redfish/v1/Systems")).send().await.expect("anon");
    assert_eq!(anon.status(), StatusCode::UNAUTHORIZED);
    assert!(anon.headers().contains_key("www-authenticate"));
    let wrong = h
        .http
        .get(h.url(0, "/redfish/v1/Systems"))
        .basic_auth(USER, Some("nope"))
        .send()
        .await
        .expect("wrong");
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let body = wrong.text().await.expect("body");
    assert!(!body.contains(PASS), "error bodies never echo credentials");
    assert_eq!(h.get(0, "/redfish/v1/Systems").await.status(), 200);

    // Session login, use, logout.
    let bad = h
        .http
        .post(h.url(0, "/redfish/v1/SessionService/Sessions"))
        .json(&json!({"UserName": USER, "Password": "nope"}))
        .send()
        .await
        .expect("bad login");
    assert_eq!(bad.status(), StatusCode::UNAUTHORIZED);
    let login = h
        .http
        .post(h.url(0, "/redfish/v1/SessionService/Sessions"))
        .json(&json!({"UserName": USER, "Password": PASS}))
        .send()
        .await
        .expect("login");
    assert_eq!(login.status(), StatusCode::CREATED);
    let token = login.headers()["x-auth-token"].to_str().expect("token").to_owned();
    let session_uri = login.headers()["location"].to_str().expect("location").to_owned();
    let with_token = |path: &str| h.http.get(h.url(0, path)).header("X-Auth-Token", &token);
    assert_eq!(
        with_token("/redfish/v1/Managers/1").send().await.expect("req").status(),
        200
    );
    // Tokens are per BMC.
    let other = h
        .http
        .get(h.url(1, "/redfish/v1/Managers/1"))
        .header("X-Auth-Token", &token)
        .send()
        .await;
    assert_eq!(other.expect("req").status(), StatusCode::UNAUTHORIZED);
    let del = h
        .http
        .delete(h.url(0, &session_uri))
        .header("X-Auth-Token", &token)
        .send()
        .await
        .expect("logout");
    assert_eq!(del.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        with_token("/redfish/v1/Managers/1").send().await.expect("req").status(),
        StatusCode::UNAUTHORIZED
    );

    // Sessions expired through the control API force a re-login.
    let login = h
        .http
        .post(h.url(0, "/redfish/v1/SessionService/Sessions"))
        .json(&json!({"UserName": USER, "Password": PASS}))
        .send()
        .await
        .expect("login");
    let token = login.headers()["x-auth-token"].to_str().expect("token").to_owned();
    let expire = h
        .control(Method::POST, &format!("/sim/nodes/{}/expire-sessions", h.name(0)), None)
        .await;
    assert_eq!(expire.status(), StatusCode::NO_CONTENT);
    let after = h
        .http
        .get(h.url(0, "/redfish/v1/Managers/1"))
        .header("X-Auth-Token", &token)
        .send()
        .await;
    assert_eq!(after.expect("req").status(), StatusCode::UNAUTHORIZED);
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn simple_update_activates_only_after_system_reset() {
    let h = start(SMALL).await;
    let image_server = ImageServer::start([("gpu.bin".to_owned(), gpu_image(GPU_NEW))])
        .await
        .expect("image server");
    let base = image_server.base_url();
    let loc = simple_update(&h, 0, &format!("{base}/gpu.bin"), json!([])).await;
    let t = wait_task_state(&h, 0, &loc, &["New", "Running"]).await;
    assert_eq!(t["@odata.type"], "#Task.v1_7_4.Task");
    // The download is real; wait until the flash started (a message names the component).
    for _ in 0..100 {
        if message_ids(&h.task(0, &loc).await)
            .iter()
            .any(|m| m == "Update.1.0.ApplyingOnComponent")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.advance(SimDuration::minutes(2));
    let t = h.task(0, &loc).await;
    assert_eq!(t["TaskState"], "Running");
    let pct = t["PercentComplete"].as_u64().expect("percent");
    assert!((1..100).contains(&pct), "{pct}");

    h.advance(SimDuration::minutes(8)); // past the 9 minute maximum flash time
    let t = h.task(0, &loc).await;
    assert_eq!(t["TaskState"], "Completed", "{t}");
    assert_eq!(t["PercentComplete"], 100);
    let ids = message_ids(&t);
    assert!(ids.contains(&"Update.1.0.UpdateSuccessful".to_owned()), "{ids:?}");
    assert!(ids.contains(&"Update.1.0.AwaitToActivate".to_owned()), "{ids:?}");
    // Base.ResetRequired names the Reset action and the reset type, which clients POST.
    let reset_required = t["Messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["MessageId"] == "Base.1.18.ResetRequired")
        .expect("ResetRequired");
    assert_eq!(
        reset_required["MessageArgs"],
        json!(["/redfish/v1/Systems/1/Actions/ComputerSystem.Reset", "GracefulRestart"])
    );

    // Flashed but not active: inventory still shows the old version, the control API shows it pending.
    assert_eq!(h.version(0, "HGX_FW_GPU_3").await, "96.00.5E.00.01");
    let versions = h.fleet.versions(&h.name(0)).expect("node");
    let gpu3 = versions.iter().find(|c| c.id == "HGX_FW_GPU_3").expect("gpu3");
    assert_eq!(gpu3.pending.as_deref(), Some(GPU_NEW));
    // A manager reset does not activate GPU firmware.
    assert_eq!(h.version(0, "BMC_Firmware").await, "24.04.1");

    let reset = h
        .post_json(
            0,
            "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
            json!({"ResetType": "ForceRestart"}),
        )
        .await;
    assert_eq!(reset.status(), StatusCode::NO_CONTENT);
    let sys = h.get_json(0, "/redfish/v1/Systems/1").await;
    assert_eq!(sys["PowerState"], "PoweringOn");
    assert_eq!(
        h.version(0, "HGX_FW_GPU_3").await,
        "96.00.5E.00.01",
        "not active while rebooting"
    );
    h.advance(SimDuration::minutes(5));
    for g in 0..8 {
        assert_eq!(h.version(0, &format!("HGX_FW_GPU_{g}")).await, GPU_NEW);
    }
    let counts = h.fleet.flash_counts(&h.name(0)).expect("node");
    assert_eq!(counts.get(GPU_NEW), Some(&1));
    // Other nodes untouched.
    assert_eq!(h.version(1, "HGX_FW_GPU_3").await, "96.00.5E.00.01");
    let flash_counts: Value = h
        .control(Method::GET, "/sim/flash-counts", None)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(flash_counts, json!({ h.name(0): { GPU_NEW: 1 } }));
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn multipart_bmc_update_needs_manager_reset_and_bmc_goes_silent() {
    let h = start(SMALL).await;
    let img = image::build(ComponentKind::Bmc, BMC_NEW, &[SKU], b"bmc payload");
    let resp = multipart_update(
        &h,
        1,
        json!({"Targets": ["/redfish/v1/UpdateService/FirmwareInventory/BMC_Firmware"], "@Redfish.OperationApplyTime": "OnReset"}),
        img,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let loc = resp.headers()["location"].to_str().expect("location").to_owned();
    h.advance(SimDuration::minutes(3));
    let t = h.task(1, &loc).await;
    assert_eq!(t["TaskState"], "Completed", "{t}");
    assert_eq!(h.version(1, "BMC_Firmware").await, "24.04.1");
    // A system reset does not activate BMC firmware.
    let r = h
        .post_json(
            1,
            "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
            json!({"ResetType": "ForceRestart"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    h.advance(SimDuration::minutes(6));
    assert_eq!(h.version(1, "BMC_Firmware").await, "24.04.1");

    let r = h
        .post_json(
            1,
            "/redfish/v1/Managers/1/Actions/Manager.Reset",
            json!({"ResetType": "GracefulRestart"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    tokio::time::sleep(Duration::from_millis(150)).await;
    // The BMC does not answer at all while it resets.
    let silent = h
        .http
        .get(h.url(1, "/redfish/v1/"))
        .timeout(Duration::from_secs(2))
        .send()
        .await;
    assert!(silent.is_err(), "BMC answered during its reset: {silent:?}");
    let node: Value = h
        .control(Method::GET, &format!("/sim/nodes/{}", h.name(1)), None)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(node["answering"], false);
    // Other BMCs are unaffected.
    assert_eq!(h.get(0, "/redfish/v1/").await.status(), 200);
    h.advance(SimDuration::seconds(121));
    assert_eq!(h.version(1, "BMC_Firmware").await, BMC_NEW);
    let mgr = h.get_json(1, "/redfish/v1/Managers/1").await;
    assert_eq!(mgr["FirmwareVersion"], BMC_NEW);
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn corrupt_wrong_sku_and_wrong_target_images_end_in_exception() {
    let h = start(SMALL).await;
    let mut corrupt = gpu_image(GPU_NEW);
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff;
    let wrong_sku = image::build(ComponentKind::Gpu, GPU_NEW, &["gb200-nvl72"], b"payload");
    let bmc_img = image::build(ComponentKind::Bmc, BMC_NEW, &[SKU], b"payload");
    let image_server = ImageServer::start([
        ("corrupt.bin".to_owned(), corrupt.clone()),
        ("sku.bin".to_owned(), wrong_sku.clone()),
    ])
    .await
    .expect("image server");
    let base = image_server.base_url();

    // One node each: a second update of the same components while one runs is refused with 409.
    let cases: Vec<(&str, usize, String, &str)> = vec![
        (
            "corrupt (simple)",
            0,
            simple_update(&h, 0, &format!("{base}/corrupt.bin"), json!([])).await,
            "checksum",
        ),
        (
            "wrong sku (simple)",
            1,
            simple_update(&h, 1, &format!("{base}/sku.bin"), json!([])).await,
            "not applicable",
        ),
        (
            "missing image",
            2,
            simple_update(&h, 2, &format!("{base}/missing.bin"), json!([])).await,
            "HTTP 404",
        ),
    ];
    for (what, node, loc, needle) in cases {
        let t = wait_task_state(&h, node, &loc, &["Exception", "Completed"]).await;
        assert_eq!(t["TaskState"], "Exception", "{what}: {t}");
        let msg = t["Messages"][0]["Message"].as_str().unwrap_or_default();
        assert!(msg.contains(needle), "{what}: {msg}");
        let id = t["Messages"][0]["MessageId"].as_str().unwrap_or_default();
        assert!(
            id == "Update.1.0.VerificationFailed" || id == "Update.1.0.TransferFailed",
            "{what}: {id}"
        );
    }
    // A BMC image aimed at a GPU target.
    let resp = multipart_update(
        &h,
        0,
        json!({"Targets": ["/redfish/v1/UpdateService/FirmwareInventory/HGX_FW_GPU_0"]}),
        bmc_img,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let loc = resp.headers()["location"].to_str().expect("location").to_owned();
    assert_eq!(h.task(0, &loc).await["TaskState"], "Exception");
    // Unknown targets are refused up front.
    let resp = multipart_update(
        &h,
        0,
        json!({"Targets": ["/redfish/v1/UpdateService/FirmwareInventory/NOPE"]}),
        corrupt,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);

    h.advance(SimDuration::hours(1));
    let r = h
        .post_json(
            0,
            "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
            json!({"ResetType": "ForceRestart"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    h.advance(SimDuration::hours(1));
    assert_eq!(h.version(0, "HGX_FW_GPU_0").await, "96.00.5E.00.01");
    assert!(
        h.fleet.flash_counts(&h.name(0)).expect("node").is_empty(),
        "nothing was flashed"
    );
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn failed_flash_keeps_old_version() {
    let h = start(SMALL).await;
    let resp = multipart_update(&h, 2, json!({}), gpu_image(GPU_FAILS)).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let loc = resp.headers()["location"].to_str().expect("location").to_owned();
    h.advance(SimDuration::minutes(3));
    let t = h.task(2, &loc).await;
    assert_eq!(t["TaskState"], "Exception");
    assert_eq!(t["TaskStatus"], "Critical");
    assert!(message_ids(&t).contains(&"Update.1.0.ApplyFailed".to_owned()));
    let r = h
        .post_json(2, "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset", json!({}))
        .await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    h.advance(SimDuration::minutes(6));
    assert_eq!(h.version(2, "HGX_FW_GPU_0").await, "96.00.5E.00.01");
    // The attempt still counts as a flash.
    assert_eq!(h.fleet.flash_counts(&h.name(2)).expect("node").get(GPU_FAILS), Some(&1));
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn brick_flash_silences_the_bmc() {
    let h = start(SMALL).await;
    let resp = multipart_update(&h, 3, json!({}), gpu_image(GPU_BRICKS)).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    assert_eq!(h.get(3, "/redfish/v1/").await.status(), 200, "alive while flashing");
    h.advance(SimDuration::minutes(3));
    let dead = h
        .http
        .get(h.url(3, "/redfish/v1/"))
        .timeout(Duration::from_secs(2))
        .send()
        .await;
    assert!(dead.is_err(), "bricked BMC answered: {dead:?}");
    h.advance(SimDuration::days(1));
    let dead = h
        .http
        .get(h.url(3, "/redfish/v1/"))
        .timeout(Duration::from_secs(2))
        .send()
        .await;
    assert!(dead.is_err(), "bricked BMC came back");
    let node: Value = h
        .control(Method::GET, &format!("/sim/nodes/{}", h.name(3)), None)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(node["bricked"], true);
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn scenario_unavailable_rate_answers_503_with_retry_after() {
    let yaml = SMALL.replace("unavailable_rate: 0.0", "unavailable_rate: 1.0").replace(
        "reset_time: {min: 60s, max: 120s}",
        "reset_time: {min: 60s, max: 120s}\n  retry_after: 7s",
    );
    let h = start(&yaml).await;
    for path in ["/redfish/v1/", "/redfish/v1/Systems/1"] {
        let r = h.get(0, path).await;
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()["retry-after"], "7");
    }
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn scenario_fault_rates_are_roughly_honoured() {
    let yaml = SMALL.replace("unavailable_rate: 0.0", "unavailable_rate: 0.3");
    let h = start(&yaml).await;
    let mut unavailable = 0;
    for _ in 0..200 {
        if h.get(0, "/redfish/v1/").await.status() == StatusCode::SERVICE_UNAVAILABLE {
            unavailable += 1;
        }
    }
    assert!((35..=85).contains(&unavailable), "{unavailable} of 200");
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn injected_faults_unavailable_timeout_malformed_brick() {
    let h = start_with(SMALL, |o| o.hang_for = Duration::from_secs(3)).await;
    let name = h.name(0);
    let faults_path = format!("/sim/nodes/{name}/faults");
    let set = |f: Value| h.control(Method::PUT, &faults_path, Some(f));

    assert_eq!(set(json!({"unavailable": true})).await.status(), 200);
    let r = h.get(0, "/redfish/v1/").await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(h.get(1, "/redfish/v1/").await.status(), 200, "only the faulted node");

    set(json!({"timeout": true})).await;
    let started = std::time::Instant::now();
    let r = h
        .http
        .get(h.url(0, "/redfish/v1/"))
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(r.is_err_and(|e| e.is_timeout()), "request should time out");
    assert!(started.elapsed() < Duration::from_secs(2));

    set(json!({"malformed": true})).await;
    let r = h.get(0, "/redfish/v1/Systems/1").await;
    assert_eq!(r.status(), 200);
    assert!(r.json::<Value>().await.is_err(), "malformed body must not parse");

    set(json!({"brick": true})).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = h
        .http
        .get(h.url(0, "/redfish/v1/"))
        .timeout(Duration::from_secs(2))
        .send()
        .await;
    assert!(r.is_err(), "bricked BMC answered");

    let bad = h
        .control(
            Method::PUT,
            &format!("/sim/nodes/{name}/faults"),
            Some(json!({"explode": true})),
        )
        .await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        h.control(Method::DELETE, &format!("/sim/nodes/{name}/faults"), None)
            .await
            .status(),
        204
    );
    assert_eq!(h.get(0, "/redfish/v1/").await.status(), 200, "cleared faults");
    // Shutdown ends hung requests instead of waiting for them.
    set(json!({"timeout": true})).await;
    let hung = tokio::spawn({
        let url = h.url(0, "/redfish/v1/");
        let http = h.http.clone();
        async move { http.get(url).send().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    h.fleet.shutdown().await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "shutdown waited for a hung request"
    );
    let _ = hung.await;
}

#[tokio::test]
async fn health_is_deterministic_for_a_seed() {
    async fn snapshot(yaml: &str) -> (Value, Value, Value) {
        let h = start(yaml).await;
        h.advance(SimDuration::hours(30));
        let log = h
            .get_json(2, "/redfish/v1/Systems/1/LogServices/EventLog/Entries")
            .await;
        let thermal = h
            .get_json(2, "/redfish/v1/Chassis/1/ThermalSubsystem/ThermalMetrics")
            .await;
        let sensor = h.get_json(2, "/redfish/v1/Chassis/1/Sensors/GPU_5_Power").await;
        h.fleet.shutdown().await;
        (log, thermal, sensor)
    }
    let a = snapshot(SMALL).await;
    let b = snapshot(SMALL).await;
    assert_eq!(a, b);
    let count = a.0["Members@odata.count"].as_u64().expect("count");
    // 8 GPUs * 0.5/h + 1/h AER + 2/day link over 30 h: ~150 entries.
    assert!((80..260).contains(&count), "{count}");
    let kinds: Vec<String> = a.0["Members"]
        .as_array()
        .expect("members")
        .iter()
        .filter_map(|m| {
            m["MessageArgs"][1]
                .as_str()
                .map(|s| s.split_whitespace().next().unwrap_or("").to_owned())
        })
        .collect();
    for k in ["XID", "PCIe", "Link"] {
        assert!(kinds.iter().any(|x| x == k), "no {k} entries in {kinds:?}");
    }
    let c = snapshot(&SMALL.replace("seed: 42", "seed: 43")).await;
    assert_ne!(a.0, c.0, "another seed gives another history");
}

#[tokio::test]
async fn fleet_event_and_firmware_effect_move_temperatures() {
    let h = start(SMALL).await;
    let mean_temp = |v: &Value| {
        let r = v["TemperatureReadingsCelsius"].as_array().expect("readings");
        r.iter().filter_map(|x| x["Reading"].as_f64()).sum::<f64>() / r.len() as f64
    };
    // Average over many minutes to get past the noise.
    let mut before = 0.0;
    for _ in 0..30 {
        before += mean_temp(
            &h.get_json(0, "/redfish/v1/Chassis/1/ThermalSubsystem/ThermalMetrics")
                .await,
        );
        h.advance(SimDuration::minutes(1));
    }
    before /= 30.0;
    h.advance(SimDuration::hours(2)); // inside the +4 C fleet event window (2h..6h)
    let mut during = 0.0;
    for _ in 0..30 {
        during += mean_temp(
            &h.get_json(0, "/redfish/v1/Chassis/1/ThermalSubsystem/ThermalMetrics")
                .await,
        );
        h.advance(SimDuration::minutes(1));
    }
    during /= 30.0;
    assert!((during - before - 4.0).abs() < 1.0, "before {before} during {during}");
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn metrics_exposition_is_labelled_by_node_and_gpu() {
    let h = start(SMALL).await;
    h.advance(SimDuration::hours(10));
    let r = h.control(Method::GET, "/metrics", None).await;
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap_or_default()
            .starts_with("text/plain")
    );
    let text = r.text().await.expect("text");
    for family in [
        "bmcsim_gpu_temperature_celsius",
        "bmcsim_gpu_power_watts",
        "bmcsim_gpu_xid_errors_total",
        "bmcsim_pcie_aer_errors_total",
        "bmcsim_link_degraded_events_total",
        "bmcsim_bmc_up",
        "bmcsim_firmware_info",
    ] {
        assert!(text.contains(&format!("# TYPE {family} ")), "missing {family}");
    }
    let temps: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("bmcsim_gpu_temperature_celsius{"))
        .collect();
    assert_eq!(temps.len(), 4 * 8);
    let line = temps[0];
    assert!(
        line.contains(&format!("node=\"{}\"", h.name(0))) && line.contains("gpu=\"GPU_0\""),
        "{line}"
    );
    let value: f64 = line
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .expect("numeric sample");
    assert!((40.0..90.0).contains(&value), "{value}");
    // Counters agree with the event log.
    let log = h
        .get_json(1, "/redfish/v1/Systems/1/LogServices/EventLog/Entries")
        .await;
    let xid_log = log["Members"]
        .as_array()
        .expect("members")
        .iter()
        .filter(|m| m["MessageArgs"][1].as_str().unwrap_or_default().starts_with("XID"))
        .count() as u64;
    let xid_metric: u64 = text
        .lines()
        .filter(|l| l.starts_with(&format!("bmcsim_gpu_xid_errors_total{{node=\"{}\"", h.name(1))))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<u64>().ok()))
        .sum();
    assert_eq!(xid_log, xid_metric);
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn lowest_supported_version_is_reported_when_the_scenario_sets_it() {
    let from = "    - {id: \"HGX_FW_GPU_{0..7}\", kind: gpu, version: \"96.00.5E.00.01\"}";
    assert!(SMALL.contains(from), "test bug: the small scenario changed");
    let yaml = SMALL.replace(
        from,
        "    - {id: \"HGX_FW_GPU_{0..7}\", kind: gpu, version: \"96.00.5E.00.01\", lowest_supported_version: \"96.00.61.00.00\"}",
    );
    let h = start(&yaml).await;
    let gpu = h
        .get_json(0, "/redfish/v1/UpdateService/FirmwareInventory/HGX_FW_GPU_3")
        .await;
    assert_eq!(gpu["LowestSupportedVersion"], "96.00.61.00.00");
    assert_eq!(gpu["Version"], "96.00.5E.00.01");
    let bmc = h
        .get_json(0, "/redfish/v1/UpdateService/FirmwareInventory/BMC_Firmware")
        .await;
    assert!(
        bmc.get("LowestSupportedVersion").is_none(),
        "only the GPU entries set it"
    );
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn inventory_and_resources_have_redfish_shape() {
    let h = start(SMALL).await;
    let inv = h.get_json(0, "/redfish/v1/UpdateService/FirmwareInventory").await;
    assert_eq!(inv["Members@odata.count"], 10);
    let bmc = h
        .get_json(0, "/redfish/v1/UpdateService/FirmwareInventory/BMC_Firmware")
        .await;
    for key in ["Id", "Version", "Updateable", "SoftwareId", "Status"] {
        assert!(bmc.get(key).is_some(), "FirmwareInventory entry lacks {key}");
    }
    assert!(
        bmc.get("LowestSupportedVersion").is_none(),
        "left out unless the scenario sets it"
    );
    let us = h.get_json(0, "/redfish/v1/UpdateService").await;
    assert_eq!(us["MultipartHttpPushUri"], "/redfish/v1/UpdateService/update-multipart");
    let procs = h.get_json(0, "/redfish/v1/Systems/1/Processors").await;
    assert_eq!(procs["Members@odata.count"], 8);
    let gpu = h.get_json(0, "/redfish/v1/Systems/1/Processors/GPU_7").await;
    assert_eq!(gpu["ProcessorType"], "GPU");
    assert_eq!(gpu["Status"]["Health"], "OK");
    let pm = h
        .get_json(0, "/redfish/v1/Systems/1/Processors/GPU_7/ProcessorMetrics")
        .await;
    assert!(pm["PCIeErrors"].is_object());
    assert_eq!(
        h.get(0, "/redfish/v1/Systems/1/Processors/GPU_8").await.status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(h.get(0, "/redfish/v1/Nope").await.status(), StatusCode::NOT_FOUND);
    let md = h
        .http
        .get(h.url(0, "/redfish/v1/$metadata"))
        .send()
        .await
        .expect("metadata");
    assert_eq!(md.status(), 200);
    assert!(md.text().await.expect("xml").contains("ServiceRoot.v1_21_0"));
    let bad_reset = h
        .post_json(
            0,
            "/redfish/v1/Managers/1/Actions/Manager.Reset",
            json!({"ResetType": "Explode"}),
        )
        .await;
    assert_eq!(bad_reset.status(), StatusCode::BAD_REQUEST);
    // Endpoint labels.
    let eps = h.fleet.endpoints();
    assert_eq!(eps.len(), 4);
    assert_eq!(eps[0].labels.rack, "rack-0000");
    assert_eq!(eps[3].labels.rack, "rack-0001");
    assert_ne!(eps[0].labels.nvlink_domain, eps[1].labels.nvlink_domain);
    let csv = bmc_sim::endpoints_csv(eps, "sim");
    assert!(csv.starts_with("name,bmc_url,credential_ref,platform_sku,region,cluster,rack,nvlink_domain\n"));
    assert_eq!(csv.lines().count(), 5);
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn https_with_generated_ca() {
    let h = start_with(SMALL, |o| o.tls = true).await;
    let pem = h.fleet.ca_pem().expect("CA PEM when tls is on");
    let url = h.url(0, "/redfish/v1/");
    assert!(url.starts_with("https://"), "{url}");
    let ca = reqwest::Certificate::from_pem(pem.as_bytes()).expect("CA parses");
    let client = reqwest::Client::builder()
        .add_root_certificate(ca)
        .build()
        .expect("client");
    let r = client
        .get(&url)
        .send()
        .await
        .expect("TLS request verified against the CA");
    assert_eq!(r.status(), 200);
    // Without the CA, verification fails.
    let plain = reqwest::Client::new();
    assert!(plain.get(&url).send().await.is_err());
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn task_monitor_answers_202_while_running_then_200_and_a_second_update_is_409() {
    let h = start(SMALL).await;
    let image_server = ImageServer::start([("gpu.bin".to_owned(), gpu_image(GPU_NEW))])
        .await
        .expect("image server");
    let base = image_server.base_url();
    let resp = h
        .post_json(
            0,
            "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
            json!({"ImageURI": format!("{base}/gpu.bin"), "Targets": []}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let monitor = resp.headers()["Location"].to_str().unwrap().to_owned();
    let task: Value = resp.json().await.unwrap();
    let task_uri = task["@odata.id"].as_str().unwrap().to_owned();
    assert_ne!(monitor, task_uri, "the monitor is not the task");
    let running = h.get(0, &monitor).await;
    assert_eq!(running.status(), StatusCode::ACCEPTED);
    assert_eq!(h.get(0, &task_uri).await.status(), StatusCode::OK);

    let again = h
        .post_json(
            0,
            "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
            json!({"ImageURI": format!("{base}/gpu.bin"), "Targets": []}),
        )
        .await;
    assert_eq!(again.status(), StatusCode::CONFLICT);

    let t = wait_task_state(&h, 0, &task_uri, &["New", "Running"]).await;
    assert_eq!(t["TaskMonitor"], json!(monitor));
    h.advance(SimDuration::minutes(10));
    let done = h.get(0, &monitor).await;
    assert_eq!(done.status(), StatusCode::OK);
    let body: Value = done.json().await.unwrap();
    assert_eq!(body["TaskState"], "Completed", "{body}");
}

#[tokio::test]
async fn hgx_profile_refuses_targets_on_simple_update_and_guards_http_push_targets_with_etags() {
    let yaml = SMALL.replace("seed: 42", "seed: 42\nplatform: hgx-h100").replace(
        "  components:\n    - {id: BMC_Firmware, kind: bmc, version: \"24.04.1\"}\n    - {id: \"HGX_FW_GPU_{0..7}\", kind: gpu, version: \"96.00.5E.00.01\"}\n    - {id: BIOS, kind: bios, version: \"1.2.3\"}\n",
        "",
    );
    assert!(
        yaml.contains("platform: hgx-h100") && !yaml.contains("HGX_FW_GPU_{0..7}"),
        "{yaml}"
    );
    let h = start(&yaml).await;
    let svc = h.get(0, "/redfish/v1/UpdateService").await;
    let etag = svc.headers()["ETag"].to_str().unwrap().to_owned();
    let svc: Value = svc.json().await.unwrap();
    assert!(svc["HttpPushUriTargets"].is_array(), "{svc}");
    let info_uri = svc["Actions"]["#UpdateService.SimpleUpdate"]["@Redfish.ActionInfo"]
        .as_str()
        .expect("ActionInfo link")
        .to_owned();
    let info = h.get_json(0, &info_uri).await;
    let names: Vec<&str> = info["Parameters"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["Name"].as_str())
        .collect();
    assert!(!names.contains(&"Targets"), "{names:?}");

    let refused = h
        .post_json(
            0,
            "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
            json!({"ImageURI": "http://127.0.0.1:1/x", "TransferProtocol": "HTTP",
                   "Targets": ["/redfish/v1/UpdateService/FirmwareInventory/HGX_FW_GPU_SXM_1"]}),
        )
        .await;
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);

    let patch = |etag: String| {
        h.http
            .patch(h.url(0, "/redfish/v1/UpdateService"))
            .basic_auth(common::USER, Some(common::PASS))
            .header("If-Match", etag)
            .json(&json!({"HttpPushUriTargets": ["/redfish/v1/UpdateService/FirmwareInventory/HGX_FW_GPU_SXM_1"]}))
            .send()
    };
    assert_eq!(patch(etag.clone()).await.unwrap().status(), StatusCode::NO_CONTENT);
    // The same ETag again is stale now: 412, the setting is not overwritten.
    assert_eq!(patch(etag).await.unwrap().status(), StatusCode::PRECONDITION_FAILED);
}
