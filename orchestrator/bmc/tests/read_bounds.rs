//! Issue 24 item 4: a hostile BMC that offers 64 pages of 16 MiB each cannot push the controller's
//! memory past a fixed cap. Before the per-operation bound this peaked at 2.86 GB at 16 pages and
//! aborted on allocation at 64.
//!
//! The peak is the process's peak resident set (`VmHWM`), reset just before the read by writing `5`
//! to `/proc/self/clear_refs` (Linux). The server streams one shared 16 MiB pad into every page, so
//! it adds one page to the baseline and nothing to the peak.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::response::IntoResponse;
use bytes::Bytes;
use orchestrator_bmc::limits::{MAX_OPERATION_BYTES, MAX_RESPONSE_BYTES};
use orchestrator_bmc::{AuthMode, Bmc, BmcEndpoint, BmcError, Credentials, HttpClients, RedfishBmc, Timeouts};

fn peak_rss_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("Linux /proc");
    let kib: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/self/status");
    kib * 1024
}

fn reset_peak_rss() {
    std::fs::write("/proc/self/clear_refs", "5").expect("reset the peak RSS");
}

const PAGES: usize = 64;

/// Fixed memory cap for reading the whole hostile collection, over the baseline before the read.
/// Four maximal responses: the body being read, its parsed form, and the members kept so far are
/// each bounded by the per-response and per-operation limits. Without them: 64 x 16 MiB = 1 GiB+.
const MEMORY_CAP: usize = 4 * MAX_RESPONSE_BYTES + MAX_OPERATION_BYTES;

#[derive(serde::Deserialize)]
struct PageQuery {
    page: Option<usize>,
}

/// Page `i`: a small head and tail around the shared pad, so every page is just under the
/// per-response bound and only the per-operation bound can stop the read.
async fn page(State(pad): State<Bytes>, Query(q): Query<PageQuery>) -> impl IntoResponse {
    let i = q.page.unwrap_or(0).min(PAGES - 1);
    let head = Bytes::from(format!(
        r#"{{"Members":[{{"@odata.id":"/x/{i}","Id":"{i}","Version":"1","Pad":""#
    ));
    let next = if i + 1 < PAGES {
        format!(
            r#","Members@odata.nextLink":"/redfish/v1/UpdateService/FirmwareInventory?page={}""#,
            i + 1
        )
    } else {
        String::new()
    };
    let tail = Bytes::from(format!(r#""}}]{next}}}"#));
    let chunks = [head, pad, tail].map(Ok::<_, Infallible>);
    (
        [("content-type", "application/json")],
        Body::from_stream(futures::stream::iter(chunks)),
    )
}

#[tokio::test(flavor = "current_thread")]
async fn sixty_four_pages_of_sixteen_mib_stay_under_a_fixed_memory_cap() {
    let pad = Bytes::from("A".repeat(MAX_RESPONSE_BYTES - 4096));
    let app = Router::new()
        .route("/redfish/v1/UpdateService/FirmwareInventory", axum::routing::get(page))
        .with_state(pad);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let endpoint = BmcEndpoint::new(
        format!("http://{addr}").parse().unwrap(),
        Credentials::new("root", "pw"),
    )
    .with_auth(AuthMode::Basic)
    .with_timeouts(Timeouts {
        connect: Duration::from_secs(2),
        request: Duration::from_secs(30),
        upload: Duration::from_secs(30),
        probe: Duration::from_secs(2),
    });
    let bmc = RedfishBmc::new(&endpoint, &HttpClients::new()).unwrap();

    reset_peak_rss();
    let baseline = peak_rss_bytes();
    let err = bmc.firmware_inventory().await.unwrap_err();
    let peak = peak_rss_bytes().saturating_sub(baseline);

    assert!(matches!(err, BmcError::ReadLimit { limit: "bytes", .. }), "{err:?}");
    assert!(
        peak < MEMORY_CAP,
        "peak {} MiB over baseline, cap {} MiB",
        peak >> 20,
        MEMORY_CAP >> 20
    );
    eprintln!(
        "peak {} MiB over baseline (cap {} MiB): {err}",
        peak >> 20,
        MEMORY_CAP >> 20
    );
}
