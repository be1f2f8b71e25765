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

#[tokio::test]
async fn the_openapi_document_describes_the_rma_routes() {
    let t = TestDb::sqlite(Arc::new(orchestrator_types::SystemClock)).await;
    let f = fixture(&t).await;
    let (status, doc) = call_as(&f.app, &f.viewer, Method::GET, "/api/v1/openapi.json", None).await;
    assert_eq!(status, StatusCode::OK);
    for path in [
        "/api/v1/rma/cases",
        "/api/v1/rma/cases/{id}",
        "/api/v1/rma/cases/{id}/events",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} is documented");
    }
    assert!(doc["paths"]["/api/v1/rma/cases/{id}/events"]["post"]["responses"]["409"].is_object());
    for schema in ["CaseEventRequest", "RmaCaseSummary", "RmaCaseDetail", "RmaCandidate"] {
        assert!(
            doc["components"]["schemas"][schema].is_object(),
            "{schema} is documented"
        );
    }
    let request = doc["components"]["schemas"]["CaseEventRequest"].to_string();
    assert!(!request.contains("\"submit\""), "submission is not offered: {request}");
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
            "Submission to the vendor is not available here yet",
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
