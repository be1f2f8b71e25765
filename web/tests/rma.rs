//! RMA cases through the API and the pages, in-process (`oneshot`) on every
//! database backend. Cases are opened as the detector opens them and, where
//! a step needs the vendor's quota (submission, not offered by the web
//! layer), submitted through the datastore; every other step goes through
//! the API or a page's form as a user with a role.

mod common;

use std::sync::Arc;

use axum::Router;
use axum::http::{Method, StatusCode};
use chrono::{Duration, TimeDelta, TimeZone, Utc};
use common::{call_as, post_form};
use orchestrator_db::testing::TestDb;
use orchestrator_db::testing::fixtures::{plain_nodes, rma_candidate};
use orchestrator_db::{AuditFilter, Db};
use orchestrator_rma::{
    Actor, Candidate, FirmwareChange, FirmwareSuspicion, HealthFlag, Observation, ObservationKind, Quota, Severity,
};
use orchestrator_types::{ManualClock, Role};
use serde_json::{Value, json};
use web::AppState;
use web::auth::provision_api_token;

fn candidate(serial: &str, node: &str, samples: usize, firmware: bool) -> Candidate {
    let began = Utc.with_ymd_and_hms(2026, 11, 30, 8, 0, 0).unwrap();
    let mut observations = vec![
        Observation {
            at: began,
            source_id: format!("/redfish/v1/Systems/1/LogServices/EventLog/Entries/{serial}-1"),
            kind: ObservationKind::Xid { code: 79 },
        },
        Observation {
            at: began + Duration::minutes(5),
            source_id: format!("dcgm/{serial}/row_remap_failure"),
            kind: ObservationKind::Flag {
                flag: HealthFlag::RowRemapFailure,
                set: true,
            },
        },
    ];
    observations.extend((2..samples).map(|i| Observation {
        at: began + Duration::minutes(10 + i as i64),
        source_id: format!("dcgm/{serial}/xid/{i}"),
        kind: ObservationKind::Xid { code: 79 },
    }));
    Candidate {
        failure_mode: "pcie_fallen_off_bus".into(),
        began_at: began,
        samples: observations,
        firmware_suspected: firmware.then(|| FirmwareSuspicion {
            change: FirmwareChange {
                at: began - Duration::hours(2),
                component: "gpu".into(),
                from_version: "96.00.5E.00.01".into(),
                to_version: "96.00.61.00.01".into(),
                release: "gpu-96.00.61".into(),
                rollout: Some("7".into()),
            },
            after_seconds: 7200,
        }),
        document_edition: "NVIDIA GPU memory error management (r555, 2024-05), section 4".into(),
        ..rma_candidate(serial, node, "fallen_off_bus", Severity::High)
    }
}

struct Fixture {
    db: Db,
    app: Router,
    viewer: String,
    rita: String,
    sam: String,
    admin: String,
}

async fn fixture(t: &TestDb) -> Fixture {
    let db = t.db.clone();
    db.import_nodes(&plain_nodes(3), "test").await.unwrap();
    let token = |name: &'static str, role| {
        let db = db.clone();
        async move { provision_api_token(&db, name, role, "t", "test").await.unwrap() }
    };
    Fixture {
        viewer: token("vic", Role::Viewer).await,
        rita: token("rita", Role::ReleaseManager).await,
        sam: token("sam", Role::ReleaseManager).await,
        admin: token("ada", Role::Admin).await,
        app: web::app(AppState::new(db.clone())),
        db,
    }
}

fn events_uri(id: &str) -> String {
    format!("/api/v1/rma/cases/{id}/events")
}

fn message(body: &Value) -> String {
    body["error"]["message"].as_str().unwrap_or_default().to_owned()
}

/// A page as `token` sees it, with the slashes minijinja escapes in attributes read back.
async fn get_page(app: &Router, token: &str, uri: &str) -> (StatusCode, String) {
    let (status, body) = common::get_page(app, token, uri).await;
    (status, body.replace("&#x2f;", "/"))
}

const HASH: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// Submission needs the vendor's quota, which only the datastore call takes.
async fn submit(db: &Db, id: &str, reference: &str) {
    let quota = Quota {
        submissions: 5,
        period: TimeDelta::weeks(1),
    };
    let rita = Actor {
        name: "rita".into(),
        role: Role::ReleaseManager,
    };
    db.submit_rma_case(id, &quota, reference, &rita).await.unwrap();
}

#[tokio::test]
async fn the_api_lists_shows_and_moves_cases_as_each_role_may() {
    for t in TestDb::all_backends().await {
        let f = fixture(&t).await;
        let backend = format!("{:?}", t.backend());
        let one =
            f.db.open_rma_case(&candidate("SN-A", "node-1", 3, false), "detector")
                .await
                .unwrap();
        let two =
            f.db.open_rma_case(&candidate("SN-B", "node-2", 2, true), "detector")
                .await
                .unwrap();

        // Lists: every filter, empty parameters filter nothing.
        let (status, all) = call_as(
            &f.app,
            &f.viewer,
            Method::GET,
            "/api/v1/rma/cases?open=true&node=&vendor=",
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{backend}: {all}");
        assert_eq!(all.as_array().unwrap().len(), 2, "{backend}: {all}");
        assert_eq!(all[0]["state"], "candidate");
        assert_eq!(all[0]["slot"], "GPU_SXM_3");
        assert_eq!(all[1]["firmware_suspected"], true);
        let (_, node1) = call_as(&f.app, &f.viewer, Method::GET, "/api/v1/rma/cases?node=node-1", None).await;
        assert_eq!(node1.as_array().unwrap().len(), 1, "{backend}: {node1}");
        assert_eq!(node1[0]["id"], one.id.as_str());
        let (_, other_vendor) = call_as(&f.app, &f.viewer, Method::GET, "/api/v1/rma/cases?vendor=amd", None).await;
        assert_eq!(other_vendor, json!([]));
        for bad in [
            "/api/v1/rma/cases?state=lost",
            "/api/v1/rma/cases?open=maybe",
            "/api/v1/rma/cases?colour=red",
        ] {
            let (status, body) = call_as(&f.app, &f.viewer, Method::GET, bad, None).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{backend} {bad}: {body}");
            assert!(!message(&body).is_empty(), "{bad}: {body}");
        }

        // One case, with its candidate.
        let (status, shown) = call_as(
            &f.app,
            &f.viewer,
            Method::GET,
            &format!("/api/v1/rma/cases/{}", two.id),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{backend}: {shown}");
        assert_eq!(shown["candidate"]["part"]["serial"], "SN-B");
        assert_eq!(shown["candidate"]["samples"].as_array().unwrap().len(), 2);
        assert_eq!(shown["candidate"]["samples"][0]["kind"]["code"], 79);
        assert_eq!(shown["candidate"]["firmware_suspected"]["release"], "gpu-96.00.61");
        assert_eq!(shown["history"], json!([]));
        let (status, missing) = call_as(&f.app, &f.viewer, Method::GET, "/api/v1/rma/cases/RMA-nope", None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{missing}");

        // A viewer may not write; a release manager may not close; bad bodies are 4xx with a message.
        let collect = json!({ "event": "collect_evidence", "manifest_sha256": HASH }).to_string();
        let (status, body) = call_as(&f.app, &f.viewer, Method::POST, &events_uri(&one.id), Some(&collect)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{backend}: {body}");
        let cases = [
            ("{\"event\":", StatusCode::BAD_REQUEST),
            (
                r#"{"event":"submit","vendor_reference":"NV-1"}"#,
                StatusCode::UNPROCESSABLE_ENTITY,
            ),
            (r#"{"event":"collect_evidence"}"#, StatusCode::UNPROCESSABLE_ENTITY),
            (
                r#"{"event":"collect_evidence","manifest_sha256":"abc"}"#,
                StatusCode::UNPROCESSABLE_ENTITY,
            ),
            (
                r#"{"event":"vendor_accepted","note":"x"}"#,
                StatusCode::UNPROCESSABLE_ENTITY,
            ),
        ];
        for (body, want) in cases {
            let (status, answer) = call_as(&f.app, &f.rita, Method::POST, &events_uri(&one.id), Some(body)).await;
            assert_eq!(status, want, "{backend} {body}: {answer}");
            assert!(!message(&answer).is_empty(), "{body}: {answer}");
        }
        // A step the state does not allow: 409 naming the state and what is allowed.
        let (status, body) = call_as(
            &f.app,
            &f.rita,
            Method::POST,
            &events_uri(&one.id),
            Some(r#"{"event":"vendor_accepted"}"#),
        )
        .await;
        assert_eq!(status, StatusCode::CONFLICT, "{backend}: {body}");
        assert!(
            message(&body).contains("is candidate") && message(&body).contains("collect_evidence"),
            "{body}"
        );

        let (status, moved) = call_as(&f.app, &f.rita, Method::POST, &events_uri(&one.id), Some(&collect)).await;
        assert_eq!(status, StatusCode::OK, "{backend}: {moved}");
        assert_eq!(moved["state"], "evidence_collected");
        assert_eq!(moved["manifest_sha256"], HASH);
        assert_eq!(moved["history"][0]["actor"], "rita");
        let close = json!({ "event": "close", "reason": "false candidate: the bus error was a riser" }).to_string();
        let (status, body) = call_as(&f.app, &f.rita, Method::POST, &events_uri(&one.id), Some(&close)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{backend}: {body}");
        assert!(message(&body).contains("admin"), "{body}");
        let (status, closed) = call_as(&f.app, &f.admin, Method::POST, &events_uri(&one.id), Some(&close)).await;
        assert_eq!(status, StatusCode::OK, "{backend}: {closed}");
        assert_eq!(closed["state"], "closed");
        assert_eq!(closed["open"], false);
        let (status, body) = call_as(&f.app, &f.admin, Method::POST, &events_uri(&one.id), Some(&close)).await;
        assert_eq!(status, StatusCode::CONFLICT, "{backend}: {body}");
        assert!(message(&body).contains("the case is over"), "{body}");
        let (_, open) = call_as(&f.app, &f.viewer, Method::GET, "/api/v1/rma/cases?open=true", None).await;
        assert_eq!(
            open.as_array().unwrap().len(),
            1,
            "{backend}: the closed case is not open"
        );

        // The whole pipeline of the other case: rejected (reason kept), new evidence, accepted,
        // replaced, and verified by someone else than who recorded the replacement.
        let post = |token: &str, body: Value| {
            let (app, token, uri) = (f.app.clone(), token.to_owned(), events_uri(&two.id));
            async move { call_as(&app, &token, Method::POST, &uri, Some(&body.to_string())).await }
        };
        let (status, _) = post(&f.rita, json!({ "event": "collect_evidence", "manifest_sha256": HASH })).await;
        assert_eq!(status, StatusCode::OK);
        submit(&f.db, &two.id, "NV-100").await;
        let (status, rejected) = post(
            &f.rita,
            json!({ "event": "vendor_rejected", "reason": "field diagnostic passed" }),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{backend}: {rejected}");
        assert_eq!(rejected["rejection_reason"], "field diagnostic passed");
        assert_eq!(rejected["open"], true, "a rejected case still holds its node");
        let (status, _) = post(&f.rita, json!({ "event": "resubmit", "manifest_sha256": HASH })).await;
        assert_eq!(status, StatusCode::OK);
        submit(&f.db, &two.id, "NV-101").await;
        let (status, _) = post(&f.rita, json!({ "event": "vendor_accepted" })).await;
        assert_eq!(status, StatusCode::OK);
        let (status, replaced) = post(&f.rita, json!({ "event": "replaced", "new_serial": "SN-B2" })).await;
        assert_eq!(status, StatusCode::OK, "{backend}: {replaced}");
        assert_eq!(replaced["replacement_serial"], "SN-B2");
        let (status, body) = post(&f.rita, json!({ "event": "verified" })).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{backend}: four eyes: {body}");
        assert!(message(&body).contains("another person"), "{body}");
        let (status, verified) = post(&f.sam, json!({ "event": "verified" })).await;
        assert_eq!(status, StatusCode::OK, "{backend}: {verified}");
        assert_eq!(verified["state"], "verified");
        assert!(
            f.db.rma_holds().await.unwrap().is_empty(),
            "{backend}: no case holds a node"
        );

        // Every step is audited as its user.
        let audit =
            f.db.audit_entries(&AuditFilter {
                action: Some("rma.transition".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        let actors: Vec<&str> = audit.iter().map(|e| e.actor.as_str()).collect();
        assert!(
            actors.contains(&"ada") && actors.contains(&"sam") && actors.contains(&"rita"),
            "{backend}: {actors:?}"
        );
    }
}

/// A page's visible text never carries serialized records.
fn assert_no_raw_json(uri: &str, body: &str) {
    for raw in [
        "{\"",
        "{&quot;",
        "\"kind\":",
        "&quot;kind&quot;",
        "Some(",
        "EvidenceCollected",
    ] {
        assert!(!body.contains(raw), "{uri} shows raw data ({raw}):\n{body}");
    }
}

#[tokio::test]
async fn the_pages_show_cases_in_words_and_offer_only_the_steps_allowed() {
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 12, 2, 12, 0, 0).unwrap()));
    for t in TestDb::all_backends_with_clock(clock.clone()).await {
        let f = fixture(&t).await;
        let backend = format!("{:?}", t.backend());
        let held =
            f.db.open_rma_case(&candidate("SN-P1", "node-1", 250, true), "detector")
                .await
                .unwrap();
        let done =
            f.db.open_rma_case(&candidate("SN-P2", "node-2", 2, false), "detector")
                .await
                .unwrap();
        let admin = Actor {
            name: "ada".into(),
            role: Role::Admin,
        };
        f.db.apply_rma_event(
            &held.id,
            orchestrator_rma::CaseEvent::CollectEvidence {
                manifest_sha256: HASH.into(),
            },
            &admin,
        )
        .await
        .unwrap();
        f.db.apply_rma_event(
            &done.id,
            orchestrator_rma::CaseEvent::Close {
                reason: "cleared by the field diagnostic".into(),
            },
            &admin,
        )
        .await
        .unwrap();
        clock.advance(Duration::days(2));

        // The list: open cases by default, states in words, the filters work.
        let (status, list) = get_page(&f.app, &f.viewer, "/rma").await;
        assert_eq!(status, StatusCode::OK, "{backend}: {list}");
        for want in [
            held.id.as_str(),
            ">evidence collected</span>",
            "href=\"/nodes/node-1\"",
            "SN-P1",
            "GPU_SXM_3",
            "fallen_off_bus",
            "pcie fallen off bus",
            "firmware suspected",
            ">2.0</td>",
            "href=\"/rma\" class=\"on\"",
        ] {
            assert!(list.contains(want), "{backend} /rma should show {want:?}:\n{list}");
        }
        assert!(!list.contains(&done.id), "{backend}: a closed case is not open");
        assert_no_raw_json("/rma", &list);
        let (_, all) = get_page(&f.app, &f.viewer, "/rma?open=false").await;
        assert!(
            all.contains(&done.id) && all.contains(">closed</span>"),
            "{backend}: {all}"
        );
        let (_, closed) = get_page(&f.app, &f.viewer, "/rma?state=closed").await;
        assert!(
            closed.contains(&done.id) && !closed.contains(&held.id),
            "{backend}: {closed}"
        );
        let (_, by_node) = get_page(&f.app, &f.viewer, "/rma?open=false&node=node-2").await;
        assert!(
            by_node.contains(&done.id) && !by_node.contains(&held.id),
            "{backend}: {by_node}"
        );
        let (status, _) = get_page(&f.app, &f.viewer, "/rma?state=lost").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);

        // The case page as a viewer: everything in words, no forms.
        let case_uri = format!("/rma/{}", held.id);
        let (status, page) = get_page(&f.app, &f.viewer, &case_uri).await;
        assert_eq!(status, StatusCode::OK, "{backend}: {page}");
        for want in [
            "evidence collected",
            "is held out of rollouts by this case",
            "699-2G520-0200-000",
            "NVIDIA GPU memory error management (r555, 2024-05), section 4",
            "XID 79 logged",
            "row-remapping failure flag set",
            "Firmware suspected:",
            "2 h after the gpu firmware changed",
            "href=\"/rollouts/7\">#7</a>",
            "50 more of 250 samples not shown",
            "No criteria for nvidia are in force",
            "collect evidence",
            "Close without replacement: needs the admin role.",
        ] {
            assert!(
                page.contains(want),
                "{backend} {case_uri} should show {want:?}:\n{page}"
            );
        }
        assert!(!page.contains("action=\"/rma/"), "{backend}: a viewer gets no form");
        assert_eq!(
            page.matches("<tr><td class=\"nowrap\">").count(),
            200 + 1,
            "200 samples and 1 step"
        );
        assert_no_raw_json(&case_uri, &page);
        let (status, _) = get_page(&f.app, &f.viewer, "/rma/RMA-nope").await;
        assert_eq!(status, StatusCode::NOT_FOUND);

        // As an admin: only close is allowed in this state (submission is not offered).
        let (_, page) = get_page(&f.app, &f.admin, &case_uri).await;
        assert!(
            page.contains(&format!("action=\"/rma/{}/close\"", held.id)),
            "{backend}: {page}"
        );
        assert!(!page.contains("/collect_evidence\""), "{backend}: not in this state");

        // The node page says the node is held, and lists its cases.
        let (_, node) = get_page(&f.app, &f.viewer, "/nodes/node-1").await;
        assert!(
            node.contains("Held out of rollouts by RMA case") && node.contains(&held.id),
            "{backend}: {node}"
        );
        let (_, free) = get_page(&f.app, &f.viewer, "/nodes/node-2").await;
        assert!(
            !free.contains("Held out of rollouts"),
            "{backend}: the closed case holds nothing"
        );
        assert!(
            free.contains(&done.id) && free.contains(">closed</span>"),
            "{backend}: {free}"
        );

        // The dashboard's pipeline panel.
        let (_, overview) = get_page(&f.app, &f.viewer, "/").await;
        for want in [
            "Replacement pipeline",
            "<b>1</b> open RMA case(s)",
            "href=\"/rma?state=evidence_collected\">1</a>",
            &held.id,
            "(2.0 days)",
            "no vendor answer recorded yet",
        ] {
            assert!(overview.contains(want), "{backend} / should show {want:?}:\n{overview}");
        }
    }
}

#[tokio::test]
async fn the_case_page_steps_confirm_then_act_and_refusals_say_why() {
    for t in TestDb::all_backends().await {
        let f = fixture(&t).await;
        let backend = format!("{:?}", t.backend());
        let case =
            f.db.open_rma_case(&candidate("SN-F", "node-0", 2, false), "detector")
                .await
                .unwrap();
        let case_uri = format!("/rma/{}", case.id);
        let (_, page) = get_page(&f.app, &f.rita, &case_uri).await;
        assert!(
            page.contains(&format!("action=\"/rma/{}/collect_evidence\"", case.id)),
            "{backend}: {page}"
        );
        assert!(
            page.contains("Close without replacement: needs the admin role."),
            "{page}"
        );

        // Without a script: a confirmation page carrying the field, then the step.
        let uri = format!("/rma/{}/collect_evidence", case.id);
        let form = format!("csrf=x&manifest_sha256={HASH}");
        let (status, _, confirm) = post_form(&f.app, &f.rita, &uri, &form, false).await;
        assert_eq!(status, StatusCode::OK, "{backend}: {confirm}");
        assert!(confirm.contains("Confirm: Record evidence collected"), "{confirm}");
        assert!(
            confirm.contains(&format!("name=\"manifest_sha256\" value=\"{HASH}\"")),
            "{confirm}"
        );
        let (status, location, _) = post_form(&f.app, &f.rita, &uri, &format!("{form}&confirmed=yes"), false).await;
        assert_eq!(status, StatusCode::SEE_OTHER, "{backend}");
        let location = location.unwrap();
        assert!(location.starts_with(&format!("{case_uri}?msg=")), "{location}");
        let (_, after) = get_page(&f.app, &f.rita, &location).await;
        assert!(after.contains("is now evidence collected"), "{backend}: {after}");
        assert!(
            after.contains(">evidence collected</span></td><td>rita</td>"),
            "{backend}: {after}"
        );

        // Refused with a reason a person reads: the wrong state, a viewer, a release manager closing.
        let (status, _, body) = post_form(
            &f.app,
            &f.rita,
            &format!("/rma/{}/vendor_accepted", case.id),
            "confirmed=yes",
            true,
        )
        .await;
        assert_eq!(status, StatusCode::CONFLICT, "{backend}: {body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert!(message(&body).contains("evidence collected"), "{body}");
        let (status, _, _) = post_form(
            &f.app,
            &f.viewer,
            &format!("/rma/{}/close", case.id),
            "reason=x&confirmed=yes",
            true,
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{backend}");
        let (status, _, body) = post_form(
            &f.app,
            &f.rita,
            &format!("/rma/{}/close", case.id),
            "reason=x&confirmed=yes",
            true,
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{backend}: {body}");
        let (status, _, body) = post_form(&f.app, &f.rita, &format!("/rma/{}/teleport", case.id), "", true).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{backend}: {body}");

        // Closing asks for the reason on the confirmation page, once; then the node is free.
        let close = format!("/rma/{}/close", case.id);
        let (status, _, confirm) = post_form(&f.app, &f.admin, &close, "reason=riser+reseated", false).await;
        assert_eq!(status, StatusCode::OK, "{backend}: {confirm}");
        assert_eq!(confirm.matches("name=\"reason\"").count(), 1, "{confirm}");
        assert!(confirm.contains("value=\"riser reseated\""), "{confirm}");
        let (status, _, empty) = post_form(&f.app, &f.admin, &close, "reason=+&confirmed=yes", true).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{backend}: {empty}");
        let (status, _, body) = post_form(&f.app, &f.admin, &close, "reason=riser+reseated&confirmed=yes", true).await;
        assert_eq!(status, StatusCode::OK, "{backend}: {body}");
        assert!(
            body.contains("is now closed") && body.contains("node-0 is no longer held"),
            "{body}"
        );
        let (_, page) = get_page(&f.app, &f.admin, &case_uri).await;
        assert!(page.contains("This case is over"), "{backend}: {page}");
        assert!(!page.contains("action=\"/rma/"), "{backend}: nothing left to do");

        // The audit log reads the steps as sentences linked to the case.
        let (_, audit) = get_page(&f.app, &f.viewer, "/audit?action=rma.transition").await;
        assert!(
            audit.contains("RMA step close: evidence collected → closed: riser reseated")
                && audit.contains(&format!("href=\"/rma/{}\"", case.id)),
            "{backend}: {audit}"
        );
    }
}

/// A multipart body with `fields` (name, value) and one file, and its content type.
fn multipart(fields: &[(&str, &str)], file: Option<(&str, &[u8])>) -> (String, Vec<u8>) {
    let boundary = "wg-test-boundary-7MA4YWxkTrZu0gW";
    let mut body = Vec::new();
    for (name, value) in fields {
        body.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n").as_bytes(),
        );
    }
    if let Some((name, bytes)) = file {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n\
                 Content-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// A raw request: status, headers and body bytes.
async fn raw(
    app: &Router,
    request: axum::http::request::Builder,
    body: Vec<u8>,
) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let response = app
        .clone()
        .oneshot(request.body(axum::body::Body::from(body)).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    (
        parts.status,
        parts.headers,
        body.collect().await.unwrap().to_bytes().to_vec(),
    )
}

async fn upload(
    app: &Router,
    token: &str,
    id: &str,
    fields: &[(&str, &str)],
    file: Option<(&str, &[u8])>,
) -> (StatusCode, Value) {
    let (content_type, body) = multipart(fields, file);
    let request = axum::http::Request::post(format!("/api/v1/rma/cases/{id}/attachments"))
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", content_type);
    let (status, _, bytes) = raw(app, request, body).await;
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into())),
    )
}

async fn get_bytes(app: &Router, token: &str, uri: &str) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
    let request = axum::http::Request::get(uri).header("authorization", format!("Bearer {token}"));
    raw(app, request, Vec::new()).await
}

/// The BMC password the fleet's credential profile would hold: it must never reach a package.
const BMC_PASSWORD: &str = "0penBmc-s3cret!";

#[tokio::test]
async fn evidence_downloads_are_stable_secret_free_and_recorded_by_role() {
    for t in TestDb::all_backends().await {
        let f = fixture(&t).await;
        let backend = format!("{:?}", t.backend());
        orchestrator_db::testing::fixtures::record_example_parts(&f.db, "node-1", 4)
            .await
            .unwrap();
        let case =
            f.db.open_rma_case(&candidate("node-1-GPU2", "node-1", 3, false), "detector")
                .await
                .unwrap();
        let uri = format!("/api/v1/rma/cases/{}/evidence", case.id);

        // The archive: a tar named after the case, the same bytes twice, no secret.
        let (status, headers, first) = get_bytes(&f.app, &f.viewer, &uri).await;
        assert_eq!(status, StatusCode::OK, "{backend}: {}", String::from_utf8_lossy(&first));
        assert_eq!(headers["content-type"], "application/x-tar");
        assert_eq!(
            headers["content-disposition"],
            format!("attachment; filename=\"{}-evidence.tar\"", case.id).as_str()
        );
        let (_, _, second) = get_bytes(&f.app, &f.viewer, &uri).await;
        assert!(first == second, "{backend}: two downloads differ");
        assert_eq!(
            orchestrator_rma::secret_sweep(&first, &[BMC_PASSWORD]),
            None,
            "{backend}"
        );
        let mut names = Vec::new();
        let mut archive = tar::Archive::new(first.as_slice());
        for entry in archive.entries().unwrap() {
            names.push(entry.unwrap().path().unwrap().display().to_string());
        }
        for want in [
            "manifest.json",
            "inventory.json",
            "system_causes.json",
            "event_log.json",
        ] {
            assert!(names.iter().any(|n| n == want), "{backend}: {want} in {names:?}");
        }

        // The manifest: every file with its hash, the hash a case records.
        let (status, manifest) = call_as(&f.app, &f.viewer, Method::GET, &format!("{uri}/manifest"), None).await;
        assert_eq!(status, StatusCode::OK, "{backend}: {manifest}");
        assert_eq!(manifest["case_id"], case.id.as_str());
        assert_eq!(manifest["recorded_sha256"], Value::Null);
        assert!(manifest["files"].as_array().unwrap().len() >= 7, "{manifest}");
        let sha = manifest["manifest_sha256"].as_str().unwrap().to_owned();
        assert_eq!(sha.len(), 64);

        // Recording it: a viewer may not; a release manager moves the case with the hash; not twice.
        let (status, body) = call_as(&f.app, &f.viewer, Method::POST, &uri, None).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{backend}: {body}");
        let (status, body) = call_as(&f.app, &f.rita, Method::POST, &uri, None).await;
        assert_eq!(status, StatusCode::OK, "{backend}: {body}");
        assert_eq!(body["case"]["state"], "evidence_collected");
        assert_eq!(body["case"]["manifest_sha256"], sha.as_str());
        assert_eq!(body["manifest"]["recorded_sha256"], sha.as_str());
        // From now on a download is the recorded package, whatever the records do next.
        upload(
            &f.app,
            &f.rita,
            &case.id,
            &[("kind", "field_diagnostic")],
            Some(("late.log", b"fieldiag: FAIL\n")),
        )
        .await;
        let (_, _, recorded) = get_bytes(&f.app, &f.viewer, &uri).await;
        assert!(recorded == first, "{backend}: the recorded package is served");
        let (_, manifest) = call_as(&f.app, &f.viewer, Method::GET, &format!("{uri}/manifest"), None).await;
        assert_eq!(manifest["manifest_sha256"], sha.as_str(), "{backend}");
        let (status, body) = call_as(&f.app, &f.rita, Method::POST, &uri, None).await;
        assert_eq!(status, StatusCode::CONFLICT, "{backend}: {body}");
        assert!(message(&body).contains("evidence collected"), "{body}");
        let (status, _) = call_as(
            &f.app,
            &f.rita,
            Method::POST,
            "/api/v1/rma/cases/RMA-nope/evidence",
            None,
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let (status, _, _) = get_bytes(&f.app, &f.viewer, "/api/v1/rma/cases/RMA-nope/evidence").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let audit =
            f.db.audit_entries(&AuditFilter {
                action: Some("rma.transition".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(audit.iter().any(|e| e.actor == "rita"), "{backend}: audited");
    }
}

#[tokio::test]
async fn vendor_diagnostics_upload_list_download_and_refuse_bad_input() {
    for t in TestDb::all_backends().await {
        let f = fixture(&t).await;
        let backend = format!("{:?}", t.backend());
        let case =
            f.db.open_rma_case(&candidate("SN-U", "node-1", 2, false), "detector")
                .await
                .unwrap();
        let log = b"dcgmi diag -r 3\nMemory: FAIL (row remapping failure)\n".to_vec();
        let (status, added) = upload(
            &f.app,
            &f.rita,
            &case.id,
            &[("kind", "field_diagnostic"), ("result", "failed")],
            Some(("dcgm-diag.log", &log)),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{backend}: {added}");
        assert_eq!(added["name"], "dcgm-diag.log");
        // Its verdict is the sample the criteria's `confirmed_by` reads.
        let samples =
            f.db.part_observations(&["SN-U".to_owned()], chrono::Utc::now() - chrono::TimeDelta::hours(1))
                .await
                .unwrap();
        assert!(
            samples["SN-U"]
                .iter()
                .any(|o| o.kind == orchestrator_rma::ObservationKind::FieldDiagnostic { passed: false }),
            "{backend}: {samples:?}"
        );
        assert_eq!(added["kind"], "field_diagnostic");
        assert_eq!(added["size_bytes"], log.len());

        let (status, list) = call_as(
            &f.app,
            &f.viewer,
            Method::GET,
            &format!("/api/v1/rma/cases/{}/attachments", case.id),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{backend}: {list}");
        assert_eq!(list.as_array().unwrap().len(), 1);
        let (status, headers, bytes) = get_bytes(&f.app, &f.viewer, list[0]["href"].as_str().unwrap()).await;
        assert_eq!(status, StatusCode::OK, "{backend}");
        assert_eq!(bytes, log);
        assert_eq!(headers["content-disposition"], "attachment; filename=\"dcgm-diag.log\"");
        let (status, _, _) = get_bytes(
            &f.app,
            &f.viewer,
            &format!("/api/v1/rma/cases/{}/attachments/nope.log", case.id),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        // The package carries it.
        let (_, manifest) = call_as(
            &f.app,
            &f.viewer,
            Method::GET,
            &format!("/api/v1/rma/cases/{}/evidence/manifest", case.id),
            None,
        )
        .await;
        assert!(
            manifest.to_string().contains("diagnostics/field/dcgm-diag.log"),
            "{backend}: {manifest}"
        );

        // Refusals: a viewer, the same name twice, a secret, bad fields, not multipart, too large.
        let one = Some(("x.log", &b"x"[..]));
        let (status, _) = upload(&f.app, &f.viewer, &case.id, &[], one).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{backend}");
        let (status, body) = upload(&f.app, &f.rita, &case.id, &[], Some(("dcgm-diag.log", &b"again"[..]))).await;
        assert_eq!(status, StatusCode::CONFLICT, "{backend}: {body}");
        let secret = format!("{{\"UserName\": \"root\", \"Password\": \"{BMC_PASSWORD}\"}}");
        let (status, body) = upload(&f.app, &f.rita, &case.id, &[], Some(("creds.json", secret.as_bytes()))).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{backend}: {body}");
        assert!(
            !body.to_string().contains(BMC_PASSWORD),
            "the refusal never repeats the secret"
        );
        for (fields, file) in [
            (vec![("kind", "photo")], one),
            (vec![("result", "maybe")], one),
            (vec![("kind", "redfish_diagnostic"), ("result", "failed")], one),
            (vec![], None),
            (vec![("name", "../etc/passwd")], one),
            (vec![("colour", "red")], one),
            (vec![], Some(("empty.log", &b""[..]))),
        ] {
            let (status, body) = upload(&f.app, &f.rita, &case.id, &fields, file).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{backend} {fields:?}: {body}");
            assert!(!message(&body).is_empty(), "{body}");
        }
        let (status, body) = call_as(
            &f.app,
            &f.rita,
            Method::POST,
            &format!("/api/v1/rma/cases/{}/attachments", case.id),
            Some("{}"),
        )
        .await;
        assert!(status.is_client_error(), "{backend}: {status} {body}");
        let (status, _) = upload(&f.app, &f.rita, "RMA-nope", &[], one).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let big = vec![b'a'; orchestrator_db::rma::MAX_ATTACHMENT_BYTES + 1];
        let (status, body) = upload(&f.app, &f.rita, &case.id, &[], Some(("big.log", &big))).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{backend}: {body}");
        let (_, list) = call_as(
            &f.app,
            &f.viewer,
            Method::GET,
            &format!("/api/v1/rma/cases/{}/attachments", case.id),
            None,
        )
        .await;
        assert_eq!(list.as_array().unwrap().len(), 1, "{backend}: nothing else stored");
    }
}

/// A browser session of `user` (password `pw`): its cookie and the CSRF token of its pages.
async fn session(app: &Router, db: &Db, user: &str) -> (String, String) {
    let hash = web::auth::hash_password("pw").unwrap();
    db.add_user(user, user, Role::ReleaseManager, Some(&hash), "test")
        .await
        .unwrap();
    let (_, headers, page) = raw(app, axum::http::Request::get("/login"), Vec::new()).await;
    let login_cookie = headers["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let field = |html: &str| -> String {
        let marker = "name=\"csrf\" value=\"";
        let start = html.find(marker).unwrap() + marker.len();
        html[start..].split('"').next().unwrap().to_owned()
    };
    let csrf = field(&String::from_utf8_lossy(&page));
    let mut request = axum::http::Request::post("/login")
        .header("cookie", login_cookie)
        .header("content-type", "application/x-www-form-urlencoded");
    request = request.extension(axum::extract::ConnectInfo(std::net::SocketAddr::from((
        [10, 0, 0, 9],
        1,
    ))));
    let (status, headers, _) = raw(
        app,
        request,
        format!("csrf={csrf}&username={user}&password=pw&next=%2F").into(),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let cookie = headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|v| v.starts_with("wg_session="))
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let (_, _, page) = raw(app, axum::http::Request::get("/").header("cookie", &cookie), Vec::new()).await;
    (cookie, field(&String::from_utf8_lossy(&page)))
}

#[tokio::test]
async fn the_case_page_upload_form_carries_its_csrf_token() {
    let t = TestDb::sqlite(Arc::new(orchestrator_types::SystemClock)).await;
    let f = fixture(&t).await;
    let case =
        f.db.open_rma_case(&candidate("SN-C", "node-1", 2, false), "detector")
            .await
            .unwrap();
    let (cookie, csrf) = session(&f.app, &f.db, "uma").await;
    let post = |fields: Vec<(&'static str, String)>| {
        let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (content_type, body) = multipart(&fields, Some(("diag.log", b"FAIL")));
        let request = axum::http::Request::post(format!("/rma/{}/attachments", case.id))
            .header("cookie", &cookie)
            .header("content-type", content_type);
        raw(&f.app, request, body)
    };
    let (status, _, _) = post(vec![]).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "no token, no upload");
    let (status, _, _) = post(vec![("csrf", "wrong".into())]).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a wrong token, no upload");
    assert!(f.db.rma_attachments(&case.id).await.unwrap().is_empty());
    let (status, headers, body) = post(vec![("csrf", csrf.clone())]).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{}", String::from_utf8_lossy(&body));
    assert!(
        headers["location"].to_str().unwrap().contains("Attached%20diag.log"),
        "{headers:?}"
    );
    assert_eq!(f.db.rma_attachments(&case.id).await.unwrap()[0].added_by, "uma");
    let (_, _, page) = raw(
        &f.app,
        axum::http::Request::get(format!("/rma/{}", case.id)).header("cookie", &cookie),
        Vec::new(),
    )
    .await;
    let page = String::from_utf8_lossy(&page);
    let form = &page[page.find("id=\"upload-form\"").expect("an upload form")..];
    assert!(
        page.contains("enctype=\"multipart/form-data\" id=\"upload-form\"")
            && form.contains(&format!("name=\"csrf\" value=\"{csrf}\"")),
        "{form}"
    );
    assert!(page.contains("diag.log"), "{page}");
}

#[tokio::test]
async fn submission_keeps_the_vendors_quota_and_says_the_queue_position() {
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 12, 2, 12, 0, 0).unwrap()));
    for t in TestDb::all_backends_with_clock(clock.clone()).await {
        let f = fixture(&t).await;
        let backend = format!("{:?}", t.backend());
        let admin = Actor {
            name: "ada".into(),
            role: Role::Admin,
        };
        let mut ids = Vec::new();
        for i in 0..7 {
            let case =
                f.db.open_rma_case(&candidate(&format!("SN-Q{i}"), "node-1", 2, false), "detector")
                    .await
                    .unwrap();
            clock.advance(Duration::minutes(1));
            ids.push(case.id);
        }
        for id in &ids[..6] {
            f.db.apply_rma_event(
                id,
                orchestrator_rma::CaseEvent::CollectEvidence {
                    manifest_sha256: HASH.into(),
                },
                &admin,
            )
            .await
            .unwrap();
        }
        let submit_uri = |id: &str| format!("/api/v1/rma/cases/{id}/submit");
        let reference = |n: usize| json!({ "vendor_reference": format!("NV-{n}") }).to_string();

        // Without criteria in force there is no quota to submit within.
        let (status, body) = call_as(&f.app, &f.rita, Method::POST, &submit_uri(&ids[0]), Some(&reference(0))).await;
        assert_eq!(status, StatusCode::CONFLICT, "{backend}: {body}");
        assert!(message(&body).contains("no criteria for vendor nvidia"), "{body}");
        let (_, quota) = call_as(&f.app, &f.viewer, Method::GET, "/api/v1/rma/quota", None).await;
        assert_eq!(quota, json!([]));
        orchestrator_db::testing::fixtures::put_example_rma_criteria(&f.db)
            .await
            .unwrap();

        // Refusals: a viewer, a bad reference, a case without evidence.
        let (status, _) = call_as(
            &f.app,
            &f.viewer,
            Method::POST,
            &submit_uri(&ids[0]),
            Some(&reference(0)),
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{backend}");
        for bad in [
            r#"{"vendor_reference":" "}"#,
            r#"{}"#,
            r#"{"vendor_reference":"x","more":1}"#,
        ] {
            let (status, body) = call_as(&f.app, &f.rita, Method::POST, &submit_uri(&ids[0]), Some(bad)).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{backend} {bad}: {body}");
        }
        let long = json!({ "vendor_reference": "x".repeat(129) }).to_string();
        let (status, _) = call_as(&f.app, &f.rita, Method::POST, &submit_uri(&ids[0]), Some(&long)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        let (status, body) = call_as(&f.app, &f.rita, Method::POST, &submit_uri(&ids[6]), Some(&reference(6))).await;
        assert_eq!(status, StatusCode::CONFLICT, "{backend}: {body}");
        assert!(message(&body).contains("evidence collected"), "{body}");
        let (status, _) = call_as(
            &f.app,
            &f.rita,
            Method::POST,
            &submit_uri("RMA-nope"),
            Some(&reference(0)),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);

        // Five per week: five are admitted in queue order, the sixth waits with its position.
        for (n, id) in ids[..5].iter().enumerate() {
            let (status, body) = call_as(&f.app, &f.rita, Method::POST, &submit_uri(id), Some(&reference(n))).await;
            assert_eq!(status, StatusCode::OK, "{backend} {id}: {body}");
            assert_eq!(body["state"], "submitted");
            assert_eq!(body["vendor_reference"], format!("NV-{n}"));
        }
        let (status, body) = call_as(&f.app, &f.rita, Method::POST, &submit_uri(&ids[5]), Some(&reference(5))).await;
        assert_eq!(status, StatusCode::CONFLICT, "{backend}: {body}");
        assert!(message(&body).contains("position 1 of 1"), "{body}");
        let (status, quota) = call_as(&f.app, &f.viewer, Method::GET, "/api/v1/rma/quota", None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(quota[0]["vendor"], "nvidia", "{backend}: {quota}");
        assert_eq!(
            (
                quota[0]["quota"].as_u64(),
                quota[0]["used"].as_u64(),
                quota[0]["left"].as_u64()
            ),
            (Some(5), Some(5), Some(0))
        );
        assert_eq!(quota[0]["period_days"], 7.0);
        assert_eq!(quota[0]["queue"][0]["case_id"], ids[5].as_str());
        assert_eq!(quota[0]["queue"][0]["position"], 1);
        assert!(quota[0]["next_slot_at"].is_string(), "{quota}");

        // The case page says where it waits; after a week the slot is free again.
        let (_, page) = get_page(&f.app, &f.rita, &format!("/rma/{}", ids[5])).await;
        assert!(
            page.contains("<b>5</b> used, <b>0</b> left") && page.contains("number 1</b> of 1 in the queue"),
            "{backend}: {page}"
        );
        assert!(page.contains(&format!("action=\"/rma/{}/submit\"", ids[5])), "{page}");
        clock.advance(Duration::days(8));
        let form = "vendor_reference=NV-5&confirmed=yes";
        let (status, _, body) = post_form(&f.app, &f.rita, &format!("/rma/{}/submit", ids[5]), form, true).await;
        assert_eq!(status, StatusCode::OK, "{backend}: {body}");
        assert!(body.contains("is now submitted (vendor reference NV-5)"), "{body}");
    }
}

#[tokio::test]
async fn cluster_scans_are_listed_and_exported_for_the_vendor() {
    let t = TestDb::sqlite(Arc::new(orchestrator_types::SystemClock)).await;
    let f = fixture(&t).await;
    let (status, body) = call_as(&f.app, &f.viewer, Method::GET, "/api/v1/rma/clusters/report", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (_, none) = call_as(&f.app, &f.viewer, Method::GET, "/api/v1/rma/clusters", None).await;
    assert_eq!(none, json!([]));
    let start = Utc.with_ymd_and_hms(2026, 10, 1, 0, 0, 0).unwrap();
    let report = orchestrator_db::testing::fixtures::store_example_cluster_scan(&f.db, start)
        .await
        .unwrap();
    assert!(!report.clusters.is_empty(), "the example lot is a cluster: {report:?}");

    let (status, scans) = call_as(&f.app, &f.viewer, Method::GET, "/api/v1/rma/clusters?limit=5", None).await;
    assert_eq!(status, StatusCode::OK, "{scans}");
    let cluster = &scans[0]["clusters"][0];
    assert_eq!(cluster["attribute"], "lot", "{scans}");
    assert_eq!(cluster["value"], "699-2G520-0200-000/L7");
    assert!(
        cluster["rate_ratio"].as_f64().unwrap() > 1.0 && cluster["ci95_lower"].is_number(),
        "{cluster}"
    );
    assert_eq!(cluster["failed_serials"].as_array().unwrap().len(), 18);
    assert!(scans[0]["groups_tested"].as_u64().unwrap() > 1);

    let (status, headers, csv) = get_bytes(&f.app, &f.viewer, "/api/v1/rma/clusters/report?format=csv").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "text/csv; charset=utf-8");
    assert_eq!(
        headers["content-disposition"],
        "attachment; filename=\"cluster-report-2026-10-01.csv\""
    );
    let csv = String::from_utf8(csv).unwrap();
    assert!(
        csv.starts_with("period_start,period_end,groups_tested,attribute,value,parts,failures"),
        "{csv}"
    );
    assert!(csv.contains(",lot,699-2G520-0200-000/L7,60,18,"), "{csv}");
    let (status, json_report) = call_as(
        &f.app,
        &f.viewer,
        Method::GET,
        "/api/v1/rma/clusters/report?period_start=2026-10-01T00:00:00Z",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json_report["report"]["groups_tested"], report.groups_tested);
    for (bad, want) in [
        ("/api/v1/rma/clusters/report?format=xml", StatusCode::BAD_REQUEST),
        (
            "/api/v1/rma/clusters/report?period_start=yesterday",
            StatusCode::BAD_REQUEST,
        ),
        (
            "/api/v1/rma/clusters/report?period_start=2020-01-01T00:00:00Z",
            StatusCode::NOT_FOUND,
        ),
        ("/api/v1/rma/clusters?limit=0", StatusCode::BAD_REQUEST),
    ] {
        let (status, body) = call_as(&f.app, &f.viewer, Method::GET, bad, None).await;
        assert_eq!(status, want, "{bad}: {body}");
        assert!(!message(&body).is_empty(), "{bad}: {body}");
    }

    // `/rma` shows the latest report and links its export.
    let (_, page) = get_page(&f.app, &f.viewer, "/rma").await;
    assert!(
        page.contains("lot 699-2G520-0200-000/L7") && page.contains("format=csv") && page.contains("95% interval"),
        "{page}"
    );
}

#[tokio::test]
async fn parts_are_paged_filtered_and_shown_with_their_cases() {
    for t in TestDb::all_backends().await {
        let f = fixture(&t).await;
        let backend = format!("{:?}", t.backend());
        use orchestrator_db::testing::fixtures::record_example_parts;
        record_example_parts(&f.db, "node-1", 4).await.unwrap();
        record_example_parts(&f.db, "node-2", 2).await.unwrap();
        let case =
            f.db.open_rma_case(&candidate("node-1-GPU2", "node-1", 2, false), "detector")
                .await
                .unwrap();

        let (status, page) = call_as(&f.app, &f.viewer, Method::GET, "/api/v1/parts?limit=4&offset=2", None).await;
        assert_eq!(status, StatusCode::OK, "{backend}: {page}");
        assert_eq!(page["total"], 6);
        assert_eq!(page["parts"].as_array().unwrap().len(), 4);
        assert_eq!(page["parts"][0]["serial"], "node-1-GPU2");
        for (query, want) in [
            ("node=node-2", 2),
            ("vendor=nvidia&part_number=699-2G520-0200-000", 6),
            ("vendor=amd", 0),
            ("lot=L7", 0),
            ("node=&vendor=", 6),
        ] {
            let (status, body) = call_as(&f.app, &f.viewer, Method::GET, &format!("/api/v1/parts?{query}"), None).await;
            assert_eq!(status, StatusCode::OK, "{query}: {body}");
            assert_eq!(body["total"], want, "{backend} {query}: {body}");
        }
        for bad in [
            "limit=0",
            "limit=1001",
            "offset=-1",
            "colour=red",
            "include_removed=maybe",
        ] {
            let (status, body) = call_as(&f.app, &f.viewer, Method::GET, &format!("/api/v1/parts?{bad}"), None).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        }

        let (status, part) = call_as(&f.app, &f.viewer, Method::GET, "/api/v1/parts/node-1-GPU2", None).await;
        assert_eq!(status, StatusCode::OK, "{backend}: {part}");
        assert_eq!(part["part"]["slot"], "GPU_SXM_3");
        assert_eq!(part["part"]["health"], "OK");
        assert_eq!(part["cases"][0]["id"], case.id.as_str());
        assert_eq!(part["firmware_history"], json!([]));
        let (status, _) = call_as(&f.app, &f.viewer, Method::GET, "/api/v1/parts/SN-nope", None).await;
        assert_eq!(status, StatusCode::NOT_FOUND);

        // The node page lists its parts with their cases.
        let (_, node) = get_page(&f.app, &f.viewer, "/nodes/node-1").await;
        for want in [
            "id=\"parts\"",
            "node-1-GPU3",
            "GPU_SXM_4",
            "96.00.5E.00.01",
            ">OK</span>",
            &case.id,
        ] {
            assert!(
                node.contains(want),
                "{backend}: node page should show {want:?}:\n{node}"
            );
        }
    }
}

#[tokio::test]
async fn the_openapi_document_describes_every_rma_and_parts_route() {
    let t = TestDb::sqlite(Arc::new(orchestrator_types::SystemClock)).await;
    let f = fixture(&t).await;
    let (status, doc) = call_as(&f.app, &f.viewer, Method::GET, "/api/v1/openapi.json", None).await;
    assert_eq!(status, StatusCode::OK);
    for schema in ["CaseEventRequest", "RmaCaseSummary", "RmaCaseDetail", "RmaCandidate"] {
        assert!(
            doc["components"]["schemas"][schema].is_object(),
            "{schema} is documented"
        );
    }
    let request = doc["components"]["schemas"]["CaseEventRequest"].to_string();
    assert!(
        !request.contains("\"submit\""),
        "submission has its own route, under the quota: {request}"
    );
    for (path, method, statuses) in [
        ("/api/v1/rma/cases", "get", &["200"][..]),
        ("/api/v1/rma/cases/{id}", "get", &["200", "404"]),
        ("/api/v1/rma/cases/{id}/events", "post", &["200", "409"]),
        ("/api/v1/rma/cases/{id}/evidence", "get", &["200", "404", "422"]),
        (
            "/api/v1/rma/cases/{id}/evidence",
            "post",
            &["200", "403", "404", "409", "422"],
        ),
        ("/api/v1/rma/cases/{id}/evidence/manifest", "get", &["200", "404"]),
        (
            "/api/v1/rma/cases/{id}/attachments",
            "post",
            &["201", "403", "409", "413", "422"],
        ),
        ("/api/v1/rma/cases/{id}/attachments", "get", &["200", "404"]),
        ("/api/v1/rma/cases/{id}/attachments/{name}", "get", &["200", "404"]),
        (
            "/api/v1/rma/cases/{id}/submit",
            "post",
            &["200", "403", "404", "409", "422"],
        ),
        ("/api/v1/rma/quota", "get", &["200"]),
        ("/api/v1/rma/clusters", "get", &["200", "400"]),
        ("/api/v1/rma/clusters/report", "get", &["200", "400", "404"]),
        ("/api/v1/parts", "get", &["200", "400"]),
        ("/api/v1/parts/{serial}", "get", &["200", "404"]),
    ] {
        for status in statuses {
            assert!(
                doc["paths"][path][method]["responses"][*status].is_object(),
                "{method} {path} documents {status}"
            );
        }
    }
    let upload = &doc["paths"]["/api/v1/rma/cases/{id}/attachments"]["post"]["requestBody"]["content"];
    assert!(upload["multipart/form-data"].is_object(), "{upload}");
    assert_eq!(
        doc["paths"]["/api/v1/rma/cases/{id}/evidence"]["get"]["responses"]["200"]["content"]["application/x-tar"],
        json!({})
    );
}
