//! The DMTF Redfish protocol rules (DSP0266) that hold for every resource, applied in one middleware
//! so the resource handlers in [`crate::redfish`] stay about resources:
//!
//! - a request's `OData-Version` other than `4.0` is refused with 412 (DSP0266 "Request headers");
//! - query parameters: `$top`/`$skip` are honoured on every collection (advertised as
//!   `ProtocolFeaturesSupported.TopSkipQuery`); any other parameter starting with `$` (`$expand`,
//!   `$select`, `$filter`, ...) is answered 501 with a `Base.QueryNotSupported` extended error unless
//!   [`SUPPORTED_DOLLAR_QUERIES`] lists it; parameters without `$` are ignored, as the spec requires;
//! - every response carries `Cache-Control`; GET and HEAD answers carry `Allow` (the methods the route
//!   table really accepts, found by asking the router, so it cannot drift from the routes) and, for a
//!   typed resource, `Link: <schema>; rel=describedby` naming the JSON schema of its `@odata.type`;
//! - a 405 gets a Redfish extended error beside the `Allow` header axum already sets;
//! - HEAD is answered as GET without the body, so its headers equal GET's.
//!
//! Checked by DMTF's redfish-protocol-validator in `tests/protocol_validator.rs` and by
//! `tests/protocol.rs`.

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tower::ServiceExt;

use super::response::RfError;

/// `$` query parameters this service implements. Everything else starting with `$` gets 501; the
/// service root's `ProtocolFeaturesSupported` is built from this list too ([`protocol_features`]), so
/// the advertisement and the behaviour cannot disagree.
pub(crate) const SUPPORTED_DOLLAR_QUERIES: &[&str] = &["$top", "$skip"];

/// The only OData version this service speaks.
const ODATA_VERSION: &str = "4.0";

/// Where DMTF publishes the JSON schemas named by `Link: rel=describedby`. bmc-sim hosts no schema
/// store; DSP0266 allows the link to name the DMTF copy (as `$metadata` already does for CSDL).
const SCHEMA_BASE: &str = "https://redfish.dmtf.org/schemas/v1/";

/// Largest response body this layer reads to add headers or page a collection (a log page of 500
/// entries is a few hundred KiB; firmware images are never answered by GET).
const MAX_BODY: usize = 32 * 1024 * 1024;

/// A method no route accepts: asking the router with it yields the route's 405 and its `Allow`.
const PROBE_METHOD: &[u8] = b"X-WAVEGUARD-ALLOW-PROBE";

/// The route table, without middleware, used to learn each path's allowed methods.
pub(crate) struct Protocol {
    routes: Router,
    /// Whether the layout honours `$expand` (one level, on the collections that inline members).
    expand: bool,
}

impl Protocol {
    pub(crate) fn new(routes: Router, expand: bool) -> Arc<Self> {
        Arc::new(Self { routes, expand })
    }

    /// The `Allow` value for `path`, as the router's 405 states it; `None` when no route matches.
    async fn allow(&self, path: &str) -> Option<HeaderValue> {
        let method = Method::from_bytes(PROBE_METHOD).ok()?;
        let probe = Request::builder().method(method).uri(path).body(Body::empty()).ok()?;
        let resp = self.routes.clone().oneshot(probe).await.ok()?;
        if resp.status() != StatusCode::METHOD_NOT_ALLOWED {
            return None;
        }
        resp.headers().get(header::ALLOW).cloned()
    }
}

/// Query parameters a layout that honours `$expand` accepts besides [`SUPPORTED_DOLLAR_QUERIES`].
const EXPAND_QUERIES: &[&str] = &["$expand", "$levels"];

/// Whether `key` is a `$` parameter this service answers, given whether the layout honours `$expand`.
fn supported(key: &str, expand: bool) -> bool {
    SUPPORTED_DOLLAR_QUERIES.contains(&key) || (expand && EXPAND_QUERIES.contains(&key))
}

/// `ProtocolFeaturesSupported` for the service root: what [`layer`] accepts, so the advertisement and
/// the answers agree. `$expand` (of subordinate resources `.` and of all `*`, one level) only where the
/// layout honours it.
pub(crate) fn protocol_features(expand: bool) -> Value {
    let has = |q: &str| supported(q, expand);
    let mut expand_query = json!({
        "ExpandAll": has("$expand"),
        "Levels": has("$levels"),
        "Links": false,
        "NoLinks": has("$expand"),
    });
    if has("$levels") {
        // The schema's minimum is 1: present only where levels are honoured at all.
        expand_query["MaxLevels"] = json!(1);
    }
    json!({
        "ExpandQuery": expand_query,
        "FilterQuery": has("$filter"),
        "SelectQuery": has("$select"),
        "TopSkipQuery": has("$top") && has("$skip"),
        "OnlyMemberQuery": false,
        "ExcerptQuery": false,
        "MultipleHTTPRequests": true,
    })
}

/// `$top` / `$skip` of a request, validated.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Paging {
    top: Option<usize>,
    skip: Option<usize>,
}

/// Reads the query string: paging, or the error to answer instead.
fn parse_query(query: Option<&str>, expand: bool) -> Result<Paging, RfError> {
    let mut paging = Paging::default();
    let Some(query) = query else {
        return Ok(paging);
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (raw_key, value) = pair.split_once('=').unwrap_or((pair, ""));
        // `%24top` is `$top` too.
        let key = raw_key.replace("%24", "$");
        if !key.starts_with('$') {
            // DSP0266: unsupported query parameters that do not start with `$` are ignored.
            continue;
        }
        if !supported(&key, expand) {
            return Err(RfError::new(
                StatusCode::NOT_IMPLEMENTED,
                "Base.1.18.QueryNotSupported",
                format!("Querying with the query parameter {key} is not supported by the implementation."),
            ));
        }
        if EXPAND_QUERIES.contains(&key.as_str()) {
            // Read by the collections that inline members; not paging.
            continue;
        }
        let n: usize = value.parse().map_err(|_| {
            RfError::new(
                StatusCode::BAD_REQUEST,
                "Base.1.18.QueryParameterValueTypeError",
                format!("The value '{value}' for the query parameter {key} is not a non-negative integer."),
            )
        })?;
        match key.as_str() {
            "$top" => paging.top = Some(n),
            _ => paging.skip = Some(n),
        }
    }
    Ok(paging)
}

/// The one property of a response body the Link header needs.
#[derive(serde::Deserialize)]
struct Typed {
    #[serde(rename = "@odata.type")]
    odata_type: Option<String>,
}

/// The JSON schema a resource of `odata_type` is described by: `#Chassis.v1_28_0.Chassis` ->
/// `Chassis.v1_28_0.json`, `#ChassisCollection.ChassisCollection` -> `ChassisCollection.json`.
fn schema_link(odata_type: &str) -> Option<String> {
    let t = odata_type.strip_prefix('#')?;
    let (namespace, _) = t.rsplit_once('.')?;
    if namespace.is_empty() {
        return None;
    }
    Some(format!("<{SCHEMA_BASE}{namespace}.json>; rel=describedby"))
}

/// Applies `$skip`/`$top` to a collection that the handler returned whole (a handler that pages
/// itself, like the event log, returns fewer members than `Members@odata.count` and is left alone).
fn page_collection(body: &mut Value, paging: Paging, path: &str) -> bool {
    if paging == Paging::default() {
        return false;
    }
    let count = body.get("Members@odata.count").and_then(Value::as_u64);
    let Some(members) = body.get_mut("Members").and_then(Value::as_array_mut) else {
        return false;
    };
    if count != Some(members.len() as u64) {
        return false;
    }
    let total = members.len();
    let skip = paging.skip.unwrap_or(0).min(total);
    let top = paging.top.unwrap_or(total);
    let page: Vec<Value> = members.drain(..).skip(skip).take(top).collect();
    *members = page;
    if skip + top < total {
        body["Members@odata.nextLink"] = json!(format!("{path}?$skip={}&$top={top}", skip + top));
    }
    true
}

/// The middleware; see the module docs.
pub(crate) async fn layer(State(p): State<Arc<Protocol>>, mut req: Request, next: Next) -> Response {
    if let Some(v) = req.headers().get("OData-Version")
        && v.as_bytes() != ODATA_VERSION.as_bytes()
    {
        let shown = String::from_utf8_lossy(v.as_bytes()).into_owned();
        return finish(
            RfError::new(
                StatusCode::PRECONDITION_FAILED,
                "Base.1.18.HeaderInvalid",
                format!("Header 'OData-Version: {shown}' is invalid: this service supports OData-Version {ODATA_VERSION} only."),
            )
            .into_response(),
        );
    }
    let paging = match parse_query(req.uri().query(), p.expand) {
        Ok(p) => p,
        Err(e) => return finish(e.into_response()),
    };
    let path = req.uri().path().to_owned();
    let head = req.method() == Method::HEAD;
    if head {
        // Answer HEAD as GET and drop the body at the end, so both carry the same headers.
        *req.method_mut() = Method::GET;
    }
    let is_get = req.method() == Method::GET;
    let resp = next.run(req).await;

    if resp.status() == StatusCode::METHOD_NOT_ALLOWED {
        let allow = resp.headers().get(header::ALLOW).cloned();
        let mut r = RfError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "Base.1.18.OperationNotAllowed",
            "The HTTP method is not allowed on this resource.",
        )
        .into_response();
        if let Some(a) = allow {
            r.headers_mut().insert(header::ALLOW, a);
        }
        return finish(r);
    }
    if !is_get || !resp.status().is_success() {
        return finish(resp);
    }

    let (mut parts, body) = resp.into_parts();
    let is_json = parts
        .headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    let mut bytes = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            return finish(
                RfError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "Base.1.18.InternalError",
                    format!("response body could not be read: {e}"),
                )
                .into_response(),
            );
        }
    };
    if is_json {
        // Only `@odata.type` is needed for the Link; a typed read skips the rest without building a tree.
        if let Ok(Typed { odata_type: Some(t) }) = serde_json::from_slice::<Typed>(&bytes)
            && let Some(link) = schema_link(&t).and_then(|l| HeaderValue::from_str(&l).ok())
        {
            parts.headers.insert(header::LINK, link);
        }
        if paging != Paging::default()
            && let Ok(mut doc) = serde_json::from_slice::<Value>(&bytes)
            && page_collection(&mut doc, paging, &path)
            && let Ok(v) = serde_json::to_vec(&doc)
        {
            bytes = Bytes::from(v);
        }
    }
    if let Some(allow) = p.allow(&path).await {
        parts.headers.insert(header::ALLOW, allow);
    }
    if let Ok(len) = HeaderValue::from_str(&bytes.len().to_string()) {
        parts.headers.insert(header::CONTENT_LENGTH, len);
    }
    let body = if head { Body::empty() } else { Body::from(bytes) };
    finish(Response::from_parts(parts, body))
}

/// Headers every answer carries.
fn finish(mut resp: Response) -> Response {
    // BMC state changes under the client (tasks, versions, sensors): never serve a stored copy.
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err_status(q: &str) -> StatusCode {
        match parse_query(Some(q), false) {
            Ok(_) => StatusCode::OK,
            Err(e) => e.into_response().status(),
        }
    }

    #[test]
    fn dollar_parameters_are_checked_and_others_ignored() {
        assert_eq!(
            parse_query(Some("$top=5&$skip=10&only&excerpt=x"), false).ok(),
            Some(Paging {
                top: Some(5),
                skip: Some(10)
            })
        );
        assert_eq!(
            parse_query(Some("%24top=2"), false).ok(),
            Some(Paging {
                top: Some(2),
                skip: None
            })
        );
        assert_eq!(parse_query(Some("rpvunknown"), false).ok(), Some(Paging::default()));
        for q in ["$expand=*", "$select=Id", "$filter=Id eq 1", "$levels=2", "$rpvunknown"] {
            assert_eq!(err_status(q), StatusCode::NOT_IMPLEMENTED, "{q}");
        }
        for q in ["$top=-1", "$top=", "$skip=ten"] {
            assert_eq!(err_status(q), StatusCode::BAD_REQUEST, "{q}");
        }
    }

    #[test]
    fn expand_is_accepted_only_where_the_layout_honours_it() {
        let q = Some("$expand=.($levels=1)");
        assert!(parse_query(q, false).is_err());
        assert_eq!(parse_query(q, true).ok(), Some(Paging::default()));
        assert_eq!(protocol_features(true)["ExpandQuery"]["ExpandAll"], true);
        assert_eq!(protocol_features(false)["ExpandQuery"]["ExpandAll"], false);
        assert_eq!(protocol_features(true)["TopSkipQuery"], true);
    }

    #[test]
    fn schema_links_follow_the_odata_type() {
        assert_eq!(
            schema_link("#ServiceRoot.v1_21_0.ServiceRoot").as_deref(),
            Some("<https://redfish.dmtf.org/schemas/v1/ServiceRoot.v1_21_0.json>; rel=describedby")
        );
        assert_eq!(
            schema_link("#SessionCollection.SessionCollection").as_deref(),
            Some("<https://redfish.dmtf.org/schemas/v1/SessionCollection.json>; rel=describedby")
        );
        assert_eq!(schema_link("ServiceRoot"), None);
        assert_eq!(schema_link("#Nothing"), None);
    }

    #[test]
    fn whole_collections_are_paged_and_paged_ones_left_alone() {
        let members: Vec<Value> = (0..5).map(|i| json!({"@odata.id": format!("/x/{i}")})).collect();
        let mut whole = json!({"Members@odata.count": 5, "Members": members});
        let paging = Paging {
            top: Some(2),
            skip: Some(1),
        };
        assert!(page_collection(&mut whole, paging, "/x"));
        assert_eq!(whole["Members"].as_array().map(Vec::len), Some(2));
        assert_eq!(whole["Members"][0]["@odata.id"], "/x/1");
        assert_eq!(whole["Members@odata.count"], 5);
        assert_eq!(whole["Members@odata.nextLink"], "/x?$skip=3&$top=2");

        let mut last = json!({"Members@odata.count": 5, "Members": (0..5).map(|i| json!(i)).collect::<Vec<_>>()});
        let tail = Paging {
            top: Some(2),
            skip: Some(4),
        };
        assert!(page_collection(&mut last, tail, "/x"));
        assert_eq!(last["Members"], json!([4]));
        assert!(last.get("Members@odata.nextLink").is_none());

        // Already a page (the handler paged it): untouched.
        let mut paged = json!({"Members@odata.count": 900, "Members": [1, 2, 3]});
        assert!(!page_collection(&mut paged, paging, "/x"));
        assert_eq!(paged["Members"], json!([1, 2, 3]));
    }
}
