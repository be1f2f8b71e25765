//! HTTP to one BMC: authentication, per-attempt timeouts, retries with backoff, typed failures.
//!
//! Everything that can go wrong on the wire is decided here, once, so the Redfish operations in
//! `redfish_bmc` read as plain request/response code.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use base64::Engine as _;
use base64::prelude::BASE64_STANDARD;
use bytes::{Bytes, BytesMut};
use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use secrecy::{ExposeSecret, SecretString};
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use url::Url;

use crate::config::{AuthMode, BmcEndpoint, Credentials, RetryPolicy, Timeouts};
use crate::error::{BmcError, ControllerFault, redacted_snippet};

use crate::clients::HttpClients;
use crate::connections::{BmcLane, Slot};
use crate::limits::MAX_RESPONSE_BYTES;

/// A request body, kept as cheap-to-clone bytes so every retry can rebuild it.
#[derive(Debug, Clone)]
pub(crate) enum Body {
    Empty,
    Json(Bytes),
    /// A raw image for `HttpPushUri`.
    Octet(Bytes),
    Multipart {
        params: Bytes,
        image: Bytes,
        filename: String,
    },
}

impl Body {
    pub(crate) fn json(value: &serde_json::Value) -> Self {
        Body::Json(Bytes::from(value.to_string()))
    }
}

/// One logical request.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub method: Method,
    /// A path (`/redfish/v1/...`) or an absolute URL on the same BMC.
    pub uri: String,
    pub body: Body,
    /// Whether re-sending after an ambiguous failure is harmless. GETs are; update pushes are not.
    pub idempotent: bool,
    pub timeout: Duration,
    pub retry: RetryPolicy,
    /// `If-Match` for a conditional PATCH (the ETag read before it).
    pub if_match: Option<HeaderValue>,
}

/// Why one attempt produced no usable response.
#[derive(Debug)]
enum AttemptError {
    Http(reqwest::Error),
    /// The body went past [`MAX_RESPONSE_BYTES`].
    TooLarge {
        status: StatusCode,
        detail: String,
    },
}

impl From<reqwest::Error> for AttemptError {
    fn from(err: reqwest::Error) -> Self {
        AttemptError::Http(err)
    }
}

/// A response with its body read.
#[derive(Debug)]
pub(crate) struct Response {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub method: Method,
    pub path: String,
}

#[derive(Debug)]
struct Session {
    token: SecretString,
    location: Option<String>,
    generation: u64,
}

/// The authenticated HTTP channel to one BMC.
#[derive(Debug)]
pub(crate) struct Transport {
    /// This BMC's share of the controller's connection bound, and its client while it holds one.
    lane: Arc<BmcLane>,
    base: Url,
    label: String,
    credentials: Credentials,
    auth: AuthMode,
    pub(crate) timeouts: Timeouts,
    pub(crate) retry: RetryPolicy,
    session: RwLock<Option<Arc<Session>>>,
    /// Serialises logins so that many tasks seeing a 401 at once create one session, not many (BMCs
    /// allow only a handful of sessions).
    login_lock: tokio::sync::Mutex<u64>,
}

/// Fresh logins one request may make after its session is refused with 401 before it gives up with
/// [`BmcError::SessionLost`]. More than one: a session can be dropped between the login and the
/// request it was made for (a BMC timing sessions out, rebooting, or evicting the oldest session).
pub(crate) const MAX_SESSION_RENEWALS: u32 = 3;

impl Transport {
    pub(crate) fn new(endpoint: &BmcEndpoint, clients: &HttpClients) -> Result<Self, BmcError> {
        let url = &endpoint.base_url;
        let label = format!(
            "{}://{}{}",
            url.scheme(),
            url.host_str().unwrap_or(""),
            url.port().map(|p| format!(":{p}")).unwrap_or_default()
        );
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(BmcError::Config {
                endpoint: label,
                reason: "base URL must be http(s)://host[:port]".to_string(),
                source: None,
            });
        }
        if !url.username().is_empty() || url.password().is_some() {
            // Credentials in the URL would end up in every error message and log line.
            return Err(BmcError::Config {
                endpoint: label,
                reason: "base URL must not contain credentials; use the credentials field".to_string(),
                source: None,
            });
        }
        let mut base = url.clone();
        base.set_path("/");
        base.set_query(None);
        base.set_fragment(None);
        Ok(Self {
            lane: clients.lane(endpoint, &label)?,
            base,
            label,
            credentials: endpoint.credentials.clone(),
            auth: endpoint.auth,
            timeouts: endpoint.timeouts,
            retry: endpoint.retry,
            session: RwLock::new(None),
            login_lock: tokio::sync::Mutex::new(0),
        })
    }

    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    /// A GET with the default timeout and retry policy.
    pub(crate) fn get_call(&self, uri: &str) -> Call {
        Call {
            method: Method::GET,
            uri: uri.to_string(),
            body: Body::Empty,
            idempotent: true,
            timeout: self.timeouts.request,
            retry: self.retry,
            if_match: None,
        }
    }

    /// GETs `uri` and decodes the JSON body.
    pub(crate) async fn get_json<T: DeserializeOwned>(&self, uri: &str) -> Result<T, BmcError> {
        let resp = self.send(self.get_call(uri)).await?;
        let resp = self.expect_success(resp)?;
        self.decode(&resp)
    }

    /// Sends an authenticated request, logging in (again) as needed. Returns any final status,
    /// including 4xx/5xx other than auth failures, for the caller to judge.
    pub(crate) async fn send(&self, call: Call) -> Result<Response, BmcError> {
        // One slot for the login and the request: a queue between them could outlast the session.
        let slot = self.lane.acquire().await?;
        let mut renewals = 0u32;
        loop {
            let (header, generation) = self.auth_header(&slot).await?;
            let resp = self.execute_in(&slot, &call, Some(&header)).await?;
            if resp.status == StatusCode::UNAUTHORIZED && self.auth == AuthMode::Session {
                // Sessions expire (timeouts, BMC reboots), so a 401 with a token asks for a fresh
                // login. The credentials are judged only by the login itself (a refused login is
                // `AuthFailed` and never retried, so the account cannot be locked); a 401 on a session
                // the BMC has just issued says the session was dropped, not that the password is
                // wrong. A few renewals, then a transient failure for the caller's own backoff.
                if renewals >= MAX_SESSION_RENEWALS {
                    return Err(BmcError::SessionLost {
                        endpoint: self.label.clone(),
                        method: call.method.to_string(),
                        path: resp.path.clone(),
                        logins: renewals,
                    });
                }
                renewals += 1;
                tracing::debug!(endpoint = %self.label, path = %resp.path, renewals, "401; logging in again");
                self.invalidate_session(generation);
                continue;
            }
            if resp.status == StatusCode::UNAUTHORIZED && renewals == 0 {
                // Basic authentication: one more try in case the BMC's account service was busy;
                // a second 401 means the credentials themselves are wrong.
                renewals += 1;
                tracing::debug!(endpoint = %self.label, path = %resp.path, "401 with Basic; trying once more");
                continue;
            }
            if matches!(resp.status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
                return Err(BmcError::AuthFailed {
                    endpoint: self.label.clone(),
                    username: self.credentials.username().to_string(),
                    status: resp.status.as_u16(),
                });
            }
            return Ok(resp);
        }
    }

    /// Sends without credentials (the service root is readable anonymously per the spec).
    pub(crate) async fn send_anonymous(&self, call: Call) -> Result<Response, BmcError> {
        self.execute(&call, None).await
    }

    /// Deletes the current session on the BMC, if any. BMCs cap concurrent sessions, so a controller
    /// that just walks away from its sessions can lock itself out until they expire.
    pub(crate) async fn logout(&self) -> Result<(), BmcError> {
        let session = self.session.write().unwrap_or_else(|p| p.into_inner()).take();
        let Some(session) = session else { return Ok(()) };
        let Some(location) = session.location.clone() else {
            return Ok(());
        };
        let header = (
            reqwest::header::HeaderName::from_static("x-auth-token"),
            token_header(&session.token),
        );
        let call = Call {
            method: Method::DELETE,
            uri: location,
            body: Body::Empty,
            idempotent: true,
            timeout: self.timeouts.request,
            retry: RetryPolicy::no_retries(),
            if_match: None,
        };
        let resp = self.execute(&call, Some(&header)).await?;
        // 404: the session already expired, which is the state we wanted.
        if resp.status.is_success() || resp.status == StatusCode::NOT_FOUND {
            Ok(())
        } else {
            Err(self.rejected(&resp))
        }
    }

    async fn auth_header(
        &self,
        slot: &Slot<'_>,
    ) -> Result<((reqwest::header::HeaderName, HeaderValue), u64), BmcError> {
        match self.auth {
            AuthMode::Basic => {
                let header = basic_header(&self.credentials);
                Ok(((reqwest::header::AUTHORIZATION, header), 0))
            }
            AuthMode::Session => {
                let session = self.current_session();
                let session = match session {
                    Some(s) => s,
                    None => self.login(slot).await?,
                };
                let name = reqwest::header::HeaderName::from_static("x-auth-token");
                Ok(((name, token_header(&session.token)), session.generation))
            }
        }
    }

    fn current_session(&self) -> Option<Arc<Session>> {
        self.session.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn invalidate_session(&self, generation: u64) {
        let mut slot = self.session.write().unwrap_or_else(|p| p.into_inner());
        // Only drop the session that failed; another task may already have replaced it.
        if slot.as_ref().is_some_and(|s| s.generation == generation) {
            *slot = None;
        }
    }

    async fn login(&self, slot: &Slot<'_>) -> Result<Arc<Session>, BmcError> {
        let mut generation = self.login_lock.lock().await;
        if let Some(session) = self.current_session() {
            // Someone else logged in while we waited for the lock.
            return Ok(session);
        }
        let body = serde_json::json!({
            "UserName": self.credentials.username(),
            "Password": self.credentials.password(),
        });
        let call = Call {
            method: Method::POST,
            uri: "/redfish/v1/SessionService/Sessions".to_string(),
            body: Body::json(&body),
            // Creating two sessions is harmless (both expire), so a lost answer may be retried.
            idempotent: true,
            timeout: self.timeouts.request,
            retry: self.retry,
            if_match: None,
        };
        let resp = self.execute_in(slot, &call, None).await?;
        if matches!(resp.status, StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED) {
            // Not a credentials problem: this service has no session login at all.
            return Err(BmcError::Unsupported {
                endpoint: self.label.clone(),
                feature: format!(
                    "session login (POST /redfish/v1/SessionService/Sessions answered HTTP {}); \
                     set this BMC's auth mode to basic",
                    resp.status.as_u16()
                ),
            });
        }
        if matches!(
            resp.status,
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::BAD_REQUEST
        ) {
            return Err(BmcError::AuthFailed {
                endpoint: self.label.clone(),
                username: self.credentials.username().to_string(),
                status: resp.status.as_u16(),
            });
        }
        let resp = self.expect_success(resp)?;
        let token = resp
            .headers
            .get("x-auth-token")
            .and_then(|v| v.to_str().ok())
            .filter(|t| !t.is_empty())
            .ok_or_else(|| self.protocol(&resp, "session created without an X-Auth-Token header"))?;
        let location = resp
            .headers
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        *generation += 1;
        let session = Arc::new(Session {
            token: SecretString::from(token.to_string()),
            location,
            generation: *generation,
        });
        *self.session.write().unwrap_or_else(|p| p.into_inner()) = Some(session.clone());
        Ok(session)
    }

    /// Resolves a path or same-origin absolute URI. Refuses other origins: a BMC handing out a task
    /// monitor on another host must not receive our credentials there.
    fn resolve(&self, uri: &str) -> Result<Url, BmcError> {
        let url = self.base.join(uri).map_err(|e| BmcError::Protocol {
            endpoint: self.label.clone(),
            method: "-".to_string(),
            path: uri.chars().take(200).collect(),
            status: None,
            reason: format!("unusable URI: {e}"),
            body_snippet: String::new(),
        })?;
        if url.origin() != self.base.origin() {
            return Err(BmcError::Protocol {
                endpoint: self.label.clone(),
                method: "-".to_string(),
                path: uri.chars().take(200).collect(),
                status: None,
                reason: "URI points at a different host than the BMC".to_string(),
                body_snippet: String::new(),
            });
        }
        Ok(url)
    }

    /// The retry loop in a slot of its own.
    async fn execute(
        &self,
        call: &Call,
        auth: Option<&(reqwest::header::HeaderName, HeaderValue)>,
    ) -> Result<Response, BmcError> {
        // Queueing for the controller's own connection bound comes first: no timeout or retry
        // deadline runs while we wait, so a queue here is never the BMC's slowness.
        let slot = self.lane.acquire().await?;
        self.execute_in(&slot, call, auth).await
    }

    /// The retry loop: one call, possibly several attempts, in `slot`.
    async fn execute_in(
        &self,
        slot: &Slot<'_>,
        call: &Call,
        auth: Option<&(reqwest::header::HeaderName, HeaderValue)>,
    ) -> Result<Response, BmcError> {
        let url = self.resolve(&call.uri)?;
        let path = url.path().to_string();
        let started = Instant::now();
        let deadline = started + call.retry.deadline;
        let mut attempt: u32 = 0;
        loop {
            attempt += 1;
            let remaining = deadline.saturating_duration_since(Instant::now());
            let per_try = call.timeout.min(remaining).max(Duration::from_millis(1));
            let outcome = match self.attempt(slot.client(), call, &url, auth, per_try).await {
                Ok(resp) => Ok(resp),
                Err(AttemptError::Http(err)) => Err(err),
                Err(AttemptError::TooLarge { status, detail }) => {
                    // Not retried: the same BMC would send the same flood again.
                    return Err(BmcError::ReadLimit {
                        endpoint: self.label.clone(),
                        operation: format!("{} {path} (HTTP {})", call.method, status.as_u16()),
                        limit: "response_bytes",
                        detail,
                    });
                }
            };
            let retries_left = attempt <= call.retry.max_retries;
            match outcome {
                Ok(resp) if is_busy(resp.status) => {
                    let retry_after = parse_retry_after(&resp.headers).map(|d| d.min(call.retry.max_retry_after));
                    let delay = retry_after.unwrap_or_else(|| backoff(&call.retry, attempt));
                    if !retries_left || Instant::now() + delay > deadline {
                        return Err(BmcError::Unavailable {
                            endpoint: self.label.clone(),
                            method: call.method.to_string(),
                            path,
                            status: resp.status.as_u16(),
                            retry_after,
                            attempts: attempt,
                        });
                    }
                    tracing::debug!(endpoint = %self.label, %path, status = resp.status.as_u16(), ?delay, "BMC busy; retrying");
                    tokio::time::sleep(delay).await;
                }
                Ok(resp) => {
                    // One line per answered request at trace level: what an operator counts when
                    // asking how many round trips a node-update or a health poll costs.
                    tracing::trace!(endpoint = %self.label, method = %call.method, %path, status = resp.status.as_u16(), attempt, "redfish request");
                    return Ok(resp);
                }
                Err(err) if is_certificate_error(&err) => {
                    return Err(BmcError::CertificateRejected {
                        endpoint: self.label.clone(),
                        method: call.method.to_string(),
                        path,
                        source: err,
                    });
                }
                Err(err) => {
                    // A connect failure means nothing was sent, so even an update push may be resent.
                    let never_sent = err.is_connect();
                    // The controller's own exhaustion says nothing about the BMC: report it at once
                    // (no retries here, which would only deepen a descriptor storm) so the engine
                    // can pause instead of charging the node. A non-idempotent call that may have
                    // been sent stays `OutcomeUnknown` below: that ambiguity is about the BMC.
                    if let Some(resource) = ControllerFault::find_in(&err)
                        && (call.idempotent || never_sent)
                    {
                        return Err(BmcError::ControllerResource {
                            endpoint: self.label.clone(),
                            method: call.method.to_string(),
                            path,
                            resource,
                            source: err,
                        });
                    }
                    if !call.idempotent && !never_sent {
                        return Err(BmcError::OutcomeUnknown {
                            endpoint: self.label.clone(),
                            method: call.method.to_string(),
                            path,
                            source: err,
                        });
                    }
                    let delay = backoff(&call.retry, attempt);
                    if !retries_left || Instant::now() + delay > deadline {
                        return Err(if err.is_timeout() {
                            BmcError::Timeout {
                                endpoint: self.label.clone(),
                                method: call.method.to_string(),
                                path,
                                attempts: attempt,
                            }
                        } else {
                            BmcError::Unreachable {
                                endpoint: self.label.clone(),
                                method: call.method.to_string(),
                                path,
                                source: err,
                            }
                        });
                    }
                    tracing::debug!(endpoint = %self.label, %path, error = %err, ?delay, "request failed; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    async fn attempt(
        &self,
        http: &reqwest::Client,
        call: &Call,
        url: &Url,
        auth: Option<&(reqwest::header::HeaderName, HeaderValue)>,
        timeout: Duration,
    ) -> Result<Response, AttemptError> {
        let mut req = http
            .request(call.method.clone(), url.clone())
            .timeout(timeout)
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some((name, value)) = auth {
            req = req.header(name.clone(), value.clone());
        }
        if let Some(etag) = &call.if_match {
            req = req.header(reqwest::header::IF_MATCH, etag.clone());
        }
        req = match &call.body {
            Body::Empty => req,
            Body::Json(bytes) => req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(bytes.clone()),
            Body::Octet(bytes) => req
                .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                .body(bytes.clone()),
            Body::Multipart {
                params,
                image,
                filename,
            } => {
                let params = reqwest::multipart::Part::stream_with_length(params.clone(), params.len() as u64)
                    .mime_str("application/json")?;
                let file = reqwest::multipart::Part::stream_with_length(image.clone(), image.len() as u64)
                    .file_name(filename.clone())
                    .mime_str("application/octet-stream")?;
                let form = reqwest::multipart::Form::new()
                    .part("UpdateParameters", params)
                    .part("UpdateFile", file);
                req.multipart(form)
            }
        };
        let mut resp = req.send().await?;
        let status = resp.status();
        let headers = resp.headers().clone();
        // Reserve what the BMC announces (within the bound) so the buffer does not double past it.
        let announced = resp.content_length().and_then(|n| usize::try_from(n).ok()).unwrap_or(0);
        if announced > MAX_RESPONSE_BYTES {
            return Err(AttemptError::TooLarge {
                status,
                detail: format!("Content-Length {announced}, bound {MAX_RESPONSE_BYTES}"),
            });
        }
        let mut body = BytesMut::with_capacity(announced);
        while let Some(chunk) = resp.chunk().await? {
            if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
                // Refused, not truncated: a cut document would fail later with a misleading reason.
                return Err(AttemptError::TooLarge {
                    status,
                    detail: format!("more than {MAX_RESPONSE_BYTES} bytes"),
                });
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Response {
            status,
            headers,
            body: body.freeze(),
            method: call.method.clone(),
            path: url.path().to_string(),
        })
    }

    /// Downloads an image the controller is to push, without any BMC credential (the image server is
    /// another host), refusing more than `limit` bytes.
    pub(crate) async fn fetch_image(&self, image_uri: &str, limit: usize) -> Result<Bytes, BmcError> {
        let unavailable = |reason: String| BmcError::ImageUnavailable {
            endpoint: self.label.clone(),
            image_uri: image_uri.to_string(),
            reason,
        };
        let url = Url::parse(image_uri).map_err(|e| unavailable(format!("not a URL: {e}")))?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err(unavailable("the image URI carries credentials".to_string()));
        }
        let slot = self.lane.acquire().await?;
        let mut resp = slot
            .client()
            .get(url)
            // Another host than the BMC: not kept in the BMC's pool, whose size its lease covers.
            .header(reqwest::header::CONNECTION, "close")
            .timeout(self.timeouts.upload)
            .send()
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        if !resp.status().is_success() {
            return Err(unavailable(format!("HTTP {}", resp.status().as_u16())));
        }
        let announced = resp.content_length().and_then(|n| usize::try_from(n).ok()).unwrap_or(0);
        if announced > limit {
            return Err(unavailable(format!("{announced} bytes, bound {limit}")));
        }
        let mut body = BytesMut::with_capacity(announced);
        while let Some(chunk) = resp.chunk().await.map_err(|e| unavailable(e.to_string()))? {
            if body.len() + chunk.len() > limit {
                return Err(unavailable(format!("more than {limit} bytes")));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body.freeze())
    }

    /// Turns a non-2xx response into `Rejected`.
    pub(crate) fn expect_success(&self, resp: Response) -> Result<Response, BmcError> {
        if resp.status.is_success() {
            Ok(resp)
        } else {
            Err(self.rejected(&resp))
        }
    }

    pub(crate) fn rejected(&self, resp: &Response) -> BmcError {
        BmcError::Rejected {
            endpoint: self.label.clone(),
            method: resp.method.to_string(),
            path: resp.path.clone(),
            status: resp.status.as_u16(),
            message_ids: error_message_ids(&resp.body),
            body_snippet: self.snippet(&resp.body),
        }
    }

    pub(crate) fn decode<T: DeserializeOwned>(&self, resp: &Response) -> Result<T, BmcError> {
        serde_json::from_slice(&resp.body)
            .map_err(|e| self.protocol(resp, &format!("response is not the expected JSON: {e}")))
    }

    pub(crate) fn protocol(&self, resp: &Response, reason: &str) -> BmcError {
        BmcError::Protocol {
            endpoint: self.label.clone(),
            method: resp.method.to_string(),
            path: resp.path.clone(),
            status: Some(resp.status.as_u16()),
            reason: reason.to_string(),
            body_snippet: self.snippet(&resp.body),
        }
    }

    fn snippet(&self, body: &[u8]) -> String {
        let session = self.current_session();
        let token = session.as_ref().map(|s| s.token.expose_secret().to_string());
        let mut secrets = vec![self.credentials.password()];
        if let Some(t) = token.as_deref() {
            secrets.push(t);
        }
        redacted_snippet(body, &secrets)
    }
}

fn basic_header(credentials: &Credentials) -> HeaderValue {
    let raw = format!("{}:{}", credentials.username(), credentials.password());
    let mut value = HeaderValue::from_str(&format!("Basic {}", BASE64_STANDARD.encode(raw.as_bytes())))
        .unwrap_or_else(|_| HeaderValue::from_static("Basic"));
    value.set_sensitive(true);
    value
}

fn token_header(token: &SecretString) -> HeaderValue {
    // A token with bytes illegal in a header can only come from a broken BMC; sending an empty value
    // makes the next request fail with 401, which re-logs in, which reports AuthFailed if it persists.
    let mut value = HeaderValue::from_str(token.expose_secret()).unwrap_or_else(|_| HeaderValue::from_static(""));
    value.set_sensitive(true);
    value
}

/// Whether a transport error is rustls refusing the peer's certificate. The verdict is buried in
/// `io::Error` wrappers (hyper-util wraps rustls' error twice), which `source()` skips over, so each
/// `io::Error` is opened with `get_ref`.
fn is_certificate_error(err: &reqwest::Error) -> bool {
    fn check(e: &(dyn std::error::Error + 'static)) -> bool {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return matches!(
                tls,
                rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented
            );
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
            && check(inner)
        {
            return true;
        }
        e.source().is_some_and(check)
    }
    check(err)
}

fn is_busy(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::TOO_MANY_REQUESTS
            | StatusCode::BAD_GATEWAY
            | StatusCode::GATEWAY_TIMEOUT
    )
}

/// `Retry-After` as delta-seconds (what BMCs send). HTTP-date values are ignored: a BMC's clock is
/// often wrong by hours, so a date from it would be meaningless; backoff applies instead.
pub(crate) fn parse_retry_after(headers: &HeaderMap) -> Option<Duration> {
    let raw = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    raw.parse::<u64>().ok().map(Duration::from_secs)
}

/// Exponential backoff with "equal jitter": half fixed, half random, so retries from many workers
/// spread out but never collapse to an immediate hammering retry.
pub(crate) fn backoff(policy: &RetryPolicy, attempt: u32) -> Duration {
    use rand::Rng;
    let exp = attempt.saturating_sub(1).min(20);
    let full = policy.base_delay.saturating_mul(1u32 << exp).min(policy.max_delay);
    let half = full / 2;
    let jitter_ms = u64::try_from(half.as_millis()).unwrap_or(u64::MAX);
    let extra = if jitter_ms == 0 {
        Duration::ZERO
    } else {
        Duration::from_millis(rand::rng().random_range(0..=jitter_ms))
    };
    half + extra
}

/// Registry message ids from a Redfish error body (`error.@Message.ExtendedInfo[].MessageId`).
pub(crate) fn error_message_ids(body: &[u8]) -> Vec<String> {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Vec::new();
    };
    value
        .pointer("/error/@Message.ExtendedInfo")
        .and_then(|v| v.as_array())
        .map(|infos| {
            infos
                .iter()
                .filter_map(|i| i.get("MessageId").and_then(|m| m.as_str()).map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TlsTrust;

    #[test]
    fn basic_header_is_rfc7617_base64_and_sensitive() {
        for (user, password, expected) in [
            ("root", "0penBmc", "Basic cm9vdDowcGVuQm1j"),
            ("a", "", "Basic YTo="),
            ("admin", "pä$$", "Basic YWRtaW46cMOkJCQ="),
        ] {
            let header = basic_header(&Credentials::new(user, password));
            assert_eq!(header.to_str().unwrap(), expected, "{user}");
            assert!(
                header.is_sensitive(),
                "the password must not show in header debug output"
            );
        }
    }

    #[test]
    fn backoff_grows_is_capped_and_jittered_within_bounds() {
        let policy = RetryPolicy {
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(1000),
            ..RetryPolicy::default()
        };
        for attempt in 1..=10u32 {
            let full = Duration::from_millis(100 * (1u64 << (attempt - 1))).min(Duration::from_millis(1000));
            for _ in 0..50 {
                let d = backoff(&policy, attempt);
                assert!(
                    d >= full / 2 && d <= full,
                    "attempt {attempt}: {d:?} outside [{:?}, {full:?}]",
                    full / 2
                );
            }
        }
        let samples: std::collections::HashSet<_> = (0..50).map(|_| backoff(&policy, 4)).collect();
        assert!(samples.len() > 1, "no jitter");
    }

    #[test]
    fn retry_after_parses_seconds_only() {
        let mut h = HeaderMap::new();
        assert_eq!(parse_retry_after(&h), None);
        h.insert(RETRY_AFTER, HeaderValue::from_static(" 7 "));
        assert_eq!(parse_retry_after(&h), Some(Duration::from_secs(7)));
        h.insert(RETRY_AFTER, HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"));
        assert_eq!(parse_retry_after(&h), None);
    }

    #[test]
    fn message_ids_from_error_body() {
        let body = br#"{"error":{"code":"Base.1.8.GeneralError","@Message.ExtendedInfo":[{"MessageId":"Base.1.8.ActionParameterMissing"},{"Message":"x"}]}}"#;
        assert_eq!(
            error_message_ids(body),
            vec!["Base.1.8.ActionParameterMissing".to_string()]
        );
        assert!(error_message_ids(b"<html>").is_empty());
    }

    #[test]
    fn base_url_with_credentials_is_refused() {
        let endpoint = BmcEndpoint::new(
            Url::parse("https://root:pw@10.0.0.1").unwrap(),
            Credentials::new("root", "pw"),
        );
        let err = Transport::new(&endpoint, &HttpClients::new()).unwrap_err();
        assert_eq!(err.kind(), "config");
        assert!(!format!("{err} {err:?}").contains(":pw"));
    }

    #[test]
    fn missing_ca_bundle_is_a_config_error() {
        let endpoint = BmcEndpoint::new(Url::parse("https://10.0.0.1").unwrap(), Credentials::new("root", "pw"))
            .with_tls(TlsTrust::CaBundle {
                path: "/nonexistent/ca.pem".into(),
            });
        let err = Transport::new(&endpoint, &HttpClients::new()).unwrap_err();
        assert_eq!(err.kind(), "config");
    }
}
