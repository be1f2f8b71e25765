//! The Prometheus collector: runs a health gate's PromQL through
//! Prometheus' HTTP query API (`/api/v1/query`, `/api/v1/query_range`) and
//! maps the returned series to fleet nodes by one label (`node` by default).
//!
//! The health watch calls [`PrometheusClient::node_samples`] (one value per
//! series at an instant, e.g. `avg by (node) (avg_over_time(x[30m]))` at the
//! end of a window) or [`PrometheusClient::node_series`] (a range, for
//! charts and evidence). Series whose node label is missing or names no node
//! the caller knows are returned apart, never silently dropped, so a typo in
//! a query's `by (...)` shows up as "no data" with the reason.
//!
//! Every request carries a client-side timeout and the same timeout as
//! Prometheus' own `timeout` parameter, so a slow query is cancelled on the
//! server too instead of piling up.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use orchestrator_types::NodeId;
use serde::Deserialize;
use url::Url;

/// Prometheus refuses range queries of more than 11,000 points per series;
/// checking first gives a clear error instead of its `bad_data`.
pub const MAX_POINTS_PER_SERIES: i64 = 11_000;

/// Default per-query timeout: gate evaluations run every few minutes, and a
/// query slower than this is better reported than waited for.
pub const DEFAULT_QUERY_TIMEOUT: Duration = Duration::from_secs(30);

/// Prometheus' default lookback: a series without a sample for this long
/// is stale (gone) at an instant query.
pub const STALENESS: TimeDelta = TimeDelta::minutes(5);

/// Longest error body quoted in an error: enough for Prometheus' message,
/// bounded against a proxy's HTML page.
const MAX_QUOTED_BODY: usize = 512;

/// Where Prometheus is and how series name their node.
#[derive(Clone)]
pub struct PrometheusConfig {
    /// Base URL, e.g. `http://prometheus:9090` or `https://host/prometheus/`.
    pub base_url: Url,
    /// Per-request timeout, client and server side.
    pub timeout: Duration,
    /// The label whose value is a node's name.
    pub node_label: String,
    /// Sent as `Authorization: Bearer ...` when set; never logged.
    pub bearer_token: Option<String>,
    /// A counter series without a sample for longer than this is gone: its
    /// node vanished (a canary) or is left out (a control), and the gap adds
    /// no exposure. Prometheus' own lookback (5 min) suits scrape intervals
    /// of up to a minute or so; a few scrape intervals is the floor.
    pub staleness: chrono::TimeDelta,
}

impl fmt::Debug for PrometheusConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrometheusConfig")
            .field("base_url", &self.base_url.as_str())
            .field("timeout", &self.timeout)
            .field("node_label", &self.node_label)
            .field("bearer_token", &self.bearer_token.as_ref().map(|_| "<redacted>"))
            .field("staleness", &self.staleness)
            .finish()
    }
}

impl PrometheusConfig {
    /// Defaults for a base URL: 30 s timeout, label `node`, no token, and
    /// Prometheus' 5-minute lookback as the staleness bound.
    pub fn new(base_url: Url) -> Self {
        Self {
            base_url,
            timeout: DEFAULT_QUERY_TIMEOUT,
            node_label: "node".to_owned(),
            bearer_token: None,
            staleness: STALENESS,
        }
    }
}

/// Why a query produced no samples.
#[derive(Debug, thiserror::Error)]
pub enum PrometheusError {
    /// The base URL cannot carry an API path (e.g. `mailto:`).
    #[error("Prometheus base URL {url} cannot be used for the HTTP API")]
    BadBaseUrl {
        /// The URL as configured.
        url: String,
    },
    /// The HTTP client could not be built.
    #[error("cannot build the Prometheus HTTP client")]
    Client(#[source] reqwest::Error),
    /// The range asks for more points than Prometheus returns, or ends
    /// before it starts, or has a zero step.
    #[error("invalid query range: {reason}")]
    BadRange {
        /// What is wrong with it.
        reason: String,
    },
    /// No answer within the timeout.
    #[error("Prometheus did not answer query {query:?} within {timeout:?}")]
    Timeout {
        /// The PromQL.
        query: String,
        /// The configured timeout.
        timeout: Duration,
    },
    /// Connection refused, reset, DNS, TLS.
    #[error("cannot reach Prometheus at {endpoint}")]
    Transport {
        /// The API URL.
        endpoint: String,
        /// The client's error.
        #[source]
        source: reqwest::Error,
    },
    /// Prometheus refused the query (bad PromQL, execution error, overload).
    #[error("Prometheus refused query {query:?} (HTTP {status}, {error_type}): {message}")]
    Api {
        /// HTTP status.
        status: u16,
        /// Prometheus' `errorType` (`bad_data`, `execution`, `timeout`, ...).
        error_type: String,
        /// Prometheus' `error`.
        message: String,
        /// The PromQL.
        query: String,
    },
    /// A non-API error answer (a proxy's page, an auth failure).
    #[error("Prometheus answered HTTP {status} to query {query:?}: {body}")]
    Http {
        /// HTTP status.
        status: u16,
        /// The start of the body.
        body: String,
        /// The PromQL.
        query: String,
    },
    /// The body is not the API's JSON.
    #[error("unexpected answer from Prometheus to query {query:?}")]
    Decode {
        /// The PromQL.
        query: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// A vector was needed and something else came back (or the reverse).
    #[error("query {query:?} returned a {got} result; a {expected} is needed")]
    ResultType {
        /// What the caller needs.
        expected: &'static str,
        /// What Prometheus returned.
        got: &'static str,
        /// The PromQL.
        query: String,
    },
    /// A sample value or timestamp that is not a number.
    #[error("query {query:?} returned an unreadable sample {value:?}")]
    BadSample {
        /// The value as sent.
        value: String,
        /// The PromQL.
        query: String,
    },
}

/// One value of one series at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The series' labels (`__name__` included when Prometheus keeps it).
    pub labels: BTreeMap<String, String>,
    /// The evaluation time.
    pub at: DateTime<Utc>,
    /// May be NaN or infinite, as PromQL allows.
    pub value: f64,
}

/// One series over a range.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// The series' labels.
    pub labels: BTreeMap<String, String>,
    /// Points in time order.
    pub points: Vec<(DateTime<Utc>, f64)>,
}

/// A query's result, by Prometheus' `resultType`.
#[derive(Debug, Clone, PartialEq)]
pub enum QueryData {
    /// An instant vector (instant queries).
    Vector(Vec<Sample>),
    /// A range matrix (range queries, or instant queries of a range selector).
    Matrix(Vec<Series>),
    /// A scalar.
    Scalar {
        /// Evaluation time.
        at: DateTime<Utc>,
        /// The value.
        value: f64,
    },
    /// A string literal.
    String {
        /// Evaluation time.
        at: DateTime<Utc>,
        /// The value.
        value: String,
    },
}

impl QueryData {
    fn kind(&self) -> &'static str {
        match self {
            QueryData::Vector(_) => "vector",
            QueryData::Matrix(_) => "matrix",
            QueryData::Scalar { .. } => "scalar",
            QueryData::String { .. } => "string",
        }
    }
}

/// Nodes by name, as the caller knows them (e.g. a wave and its control
/// cohort); the collector maps series to these only.
#[derive(Debug, Clone, Default)]
pub struct NodeIndex {
    by_name: HashMap<String, NodeId>,
}

impl NodeIndex {
    /// The node of this name, if known.
    pub fn get(&self, name: &str) -> Option<NodeId> {
        self.by_name.get(name).copied()
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// No nodes.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

impl FromIterator<(NodeId, String)> for NodeIndex {
    fn from_iter<T: IntoIterator<Item = (NodeId, String)>>(iter: T) -> Self {
        Self {
            by_name: iter.into_iter().map(|(id, name)| (name, id)).collect(),
        }
    }
}

/// A sample attributed to a node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSample {
    /// The node.
    pub node: NodeId,
    /// Its name (the label value).
    pub node_name: String,
    /// All labels of the series: several series per node (one per GPU)
    /// stay apart.
    pub labels: BTreeMap<String, String>,
    /// Evaluation time.
    pub at: DateTime<Utc>,
    /// The value.
    pub value: f64,
}

/// A series attributed to a node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSeries {
    /// The node.
    pub node: NodeId,
    /// Its name (the label value).
    pub node_name: String,
    /// All labels of the series.
    pub labels: BTreeMap<String, String>,
    /// Points in time order.
    pub points: Vec<(DateTime<Utc>, f64)>,
}

/// Results split into those attributed to a known node and those not.
#[derive(Debug, Clone, PartialEq)]
pub struct Mapped<T> {
    /// Attributed to a node of the index.
    pub matched: Vec<T>,
    /// Labels of series without the node label or naming an unknown node.
    pub unmatched: Vec<BTreeMap<String, String>>,
}

/// A Prometheus HTTP API client.
#[derive(Debug, Clone)]
pub struct PrometheusClient {
    config: PrometheusConfig,
    http: reqwest::Client,
    query_url: Url,
    range_url: Url,
}

#[derive(Deserialize)]
struct ApiResponse {
    status: String,
    #[serde(default)]
    data: Option<RawData>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    warnings: Vec<String>,
}

#[derive(Deserialize)]
#[serde(tag = "resultType", content = "result", rename_all = "lowercase")]
enum RawData {
    Vector(Vec<RawSample>),
    Matrix(Vec<RawSeries>),
    Scalar((f64, String)),
    String((f64, String)),
}

#[derive(Deserialize)]
struct RawSample {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    // Native histograms come as `histogram` instead; they have no single
    // value, so such samples are skipped.
    #[serde(default)]
    value: Option<(f64, String)>,
}

#[derive(Deserialize)]
struct RawSeries {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    #[serde(default)]
    values: Vec<(f64, String)>,
}

fn api_url(base: &Url, tail: &str) -> Result<Url, PrometheusError> {
    let mut url = base.clone();
    {
        let mut segments = url
            .path_segments_mut()
            .map_err(|()| PrometheusError::BadBaseUrl { url: base.to_string() })?;
        segments.pop_if_empty().extend(["api", "v1", tail]);
    }
    Ok(url)
}

fn instant(seconds: f64) -> Option<DateTime<Utc>> {
    if !seconds.is_finite() {
        return None;
    }
    // Prometheus timestamps have millisecond resolution.
    DateTime::from_timestamp_millis((seconds * 1000.0).round() as i64)
}

fn time_param(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Longest metadata answer read from Prometheus; a few MB covers every
/// metric of a large server, and the bound keeps a wrong URL cheap.
pub const MAX_METADATA_BYTES: usize = 32 * 1024 * 1024;

/// Timeout of the metadata request (`policy lint --prometheus`).
const METADATA_TIMEOUT: Duration = Duration::from_secs(30);

/// Why Prometheus' metric metadata could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// The base URL cannot carry an API path.
    #[error("Prometheus URL {url} cannot carry an API path")]
    BadBaseUrl {
        /// The URL as given.
        url: String,
    },
    /// The HTTP client could not be built.
    #[error("cannot build an HTTP client")]
    Client(#[source] reqwest::Error),
    /// Connection refused, reset, DNS, TLS, timeout.
    #[error("cannot reach Prometheus at {url}")]
    Transport {
        /// The metadata URL.
        url: String,
        /// The client's error.
        #[source]
        source: reqwest::Error,
    },
    /// The body could not be read.
    #[error("cannot read Prometheus' answer from {url}")]
    Read {
        /// The metadata URL.
        url: String,
        /// The client's error.
        #[source]
        source: reqwest::Error,
    },
    /// The answer is over [`MAX_METADATA_BYTES`].
    #[error("Prometheus metadata from {url} is larger than {MAX_METADATA_BYTES} bytes")]
    TooLarge {
        /// The metadata URL.
        url: String,
    },
    /// Not a success status.
    #[error("Prometheus answered HTTP {status} at {url}")]
    Http {
        /// HTTP status.
        status: reqwest::StatusCode,
        /// The metadata URL.
        url: String,
    },
    /// Not the API's JSON.
    #[error("unexpected metadata answer from {url}")]
    Decode {
        /// The metadata URL.
        url: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// The API said it failed.
    #[error("Prometheus metadata status {0:?}")]
    Status(String),
}

/// Metric name to type (`counter`, `gauge`, ...) from Prometheus'
/// `/api/v1/metadata`. A metric with several types across targets keeps the
/// first that is not `counter`, so a disagreement is never read as a counter.
pub async fn metric_types(base: &Url) -> Result<BTreeMap<String, String>, MetadataError> {
    #[derive(Deserialize)]
    struct Answer {
        status: String,
        #[serde(default)]
        data: BTreeMap<String, Vec<Entry>>,
    }
    #[derive(Deserialize)]
    struct Entry {
        #[serde(rename = "type")]
        kind: String,
    }
    let url = api_url(base, "metadata").map_err(|_| MetadataError::BadBaseUrl { url: base.to_string() })?;
    let client = reqwest::Client::builder()
        .timeout(METADATA_TIMEOUT)
        .build()
        .map_err(MetadataError::Client)?;
    let response = client
        .get(url.clone())
        .send()
        .await
        .map_err(|source| MetadataError::Transport {
            url: url.to_string(),
            source,
        })?;
    let status = response.status();
    let bytes = response.bytes().await.map_err(|source| MetadataError::Read {
        url: url.to_string(),
        source,
    })?;
    if bytes.len() > MAX_METADATA_BYTES {
        return Err(MetadataError::TooLarge { url: url.to_string() });
    }
    if !status.is_success() {
        return Err(MetadataError::Http {
            status,
            url: url.to_string(),
        });
    }
    let answer: Answer = serde_json::from_slice(&bytes).map_err(|source| MetadataError::Decode {
        url: url.to_string(),
        source,
    })?;
    if answer.status != "success" {
        return Err(MetadataError::Status(answer.status));
    }
    Ok(answer
        .data
        .into_iter()
        .filter_map(|(name, entries)| {
            let kind = entries
                .iter()
                .find(|e| e.kind != "counter")
                .or(entries.first())
                .map(|e| e.kind.clone())?;
            Some((name, kind))
        })
        .collect())
}

impl PrometheusClient {
    /// A client for `config`; no request is made until a query.
    pub fn new(config: PrometheusConfig) -> Result<Self, PrometheusError> {
        let http = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout.min(Duration::from_secs(10)))
            .build()
            .map_err(PrometheusError::Client)?;
        Ok(Self {
            query_url: api_url(&config.base_url, "query")?,
            range_url: api_url(&config.base_url, "query_range")?,
            config,
            http,
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &PrometheusConfig {
        &self.config
    }

    /// An instant query evaluated at `at`.
    pub async fn query(&self, promql: &str, at: DateTime<Utc>) -> Result<QueryData, PrometheusError> {
        let params = [("query", promql.to_owned()), ("time", time_param(at))];
        self.post(&self.query_url, promql, &params).await
    }

    /// A range query from `start` to `end` every `step`.
    pub async fn query_range(
        &self,
        promql: &str,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
        step: Duration,
    ) -> Result<QueryData, PrometheusError> {
        let step_ms = i64::try_from(step.as_millis()).unwrap_or(i64::MAX);
        if step_ms <= 0 {
            return Err(PrometheusError::BadRange {
                reason: "the step must be at least a millisecond".into(),
            });
        }
        let span_ms = (end - start).num_milliseconds();
        if span_ms < 0 {
            return Err(PrometheusError::BadRange {
                reason: format!("the range ends ({end}) before it starts ({start})"),
            });
        }
        let points = span_ms / step_ms + 1;
        if points > MAX_POINTS_PER_SERIES {
            return Err(PrometheusError::BadRange {
                reason: format!(
                    "{points} points per series; Prometheus returns at most {MAX_POINTS_PER_SERIES} (use a longer step)"
                ),
            });
        }
        let params = [
            ("query", promql.to_owned()),
            ("start", time_param(start)),
            ("end", time_param(end)),
            ("step", format!("{}", step.as_secs_f64())),
        ];
        self.post(&self.range_url, promql, &params).await
    }

    /// An instant query whose result must be a vector, attributed to nodes.
    pub async fn node_samples(
        &self,
        promql: &str,
        at: DateTime<Utc>,
        nodes: &NodeIndex,
    ) -> Result<Mapped<NodeSample>, PrometheusError> {
        match self.query(promql, at).await? {
            QueryData::Vector(samples) => Ok(self.map_samples(samples, nodes)),
            other => Err(PrometheusError::ResultType {
                expected: "vector",
                got: other.kind(),
                query: promql.to_owned(),
            }),
        }
    }

    /// A range query attributed to nodes.
    pub async fn node_series(
        &self,
        promql: &str,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
        step: Duration,
        nodes: &NodeIndex,
    ) -> Result<Mapped<NodeSeries>, PrometheusError> {
        match self.query_range(promql, start, end, step).await? {
            QueryData::Matrix(series) => Ok(self.map_series(series, nodes)),
            other => Err(PrometheusError::ResultType {
                expected: "matrix",
                got: other.kind(),
                query: promql.to_owned(),
            }),
        }
    }

    fn node_of(&self, labels: &BTreeMap<String, String>, nodes: &NodeIndex) -> Option<(NodeId, String)> {
        let name = labels.get(&self.config.node_label)?;
        nodes.get(name).map(|id| (id, name.clone()))
    }

    /// Attributes samples to nodes by the configured label.
    pub fn map_samples(&self, samples: Vec<Sample>, nodes: &NodeIndex) -> Mapped<NodeSample> {
        let mut mapped = Mapped {
            matched: Vec::new(),
            unmatched: Vec::new(),
        };
        for sample in samples {
            match self.node_of(&sample.labels, nodes) {
                Some((node, node_name)) => mapped.matched.push(NodeSample {
                    node,
                    node_name,
                    labels: sample.labels,
                    at: sample.at,
                    value: sample.value,
                }),
                None => mapped.unmatched.push(sample.labels),
            }
        }
        mapped
    }

    /// Attributes series to nodes by the configured label.
    pub fn map_series(&self, series: Vec<Series>, nodes: &NodeIndex) -> Mapped<NodeSeries> {
        let mut mapped = Mapped {
            matched: Vec::new(),
            unmatched: Vec::new(),
        };
        for s in series {
            match self.node_of(&s.labels, nodes) {
                Some((node, node_name)) => mapped.matched.push(NodeSeries {
                    node,
                    node_name,
                    labels: s.labels,
                    points: s.points,
                }),
                None => mapped.unmatched.push(s.labels),
            }
        }
        mapped
    }

    async fn post(&self, url: &Url, promql: &str, params: &[(&str, String)]) -> Result<QueryData, PrometheusError> {
        let timeout_ms = self.config.timeout.as_millis().max(1);
        let body = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params.iter().map(|(k, v)| (*k, v.as_str())))
            .append_pair("timeout", &format!("{timeout_ms}ms"))
            .finish();
        let mut request = self
            .http
            .post(url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(body);
        if let Some(token) = &self.config.bearer_token {
            request = request.bearer_auth(token);
        }
        let transport = |source: reqwest::Error| {
            if source.is_timeout() {
                PrometheusError::Timeout {
                    query: promql.to_owned(),
                    timeout: self.config.timeout,
                }
            } else {
                PrometheusError::Transport {
                    endpoint: url.to_string(),
                    source,
                }
            }
        };
        let response = request.send().await.map_err(transport)?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(transport)?;
        let parsed: Result<ApiResponse, _> = serde_json::from_slice(&bytes);
        let parsed = match parsed {
            Ok(parsed) => parsed,
            Err(source) if status.is_success() => {
                return Err(PrometheusError::Decode {
                    query: promql.to_owned(),
                    source,
                });
            }
            Err(_) => {
                let text = String::from_utf8_lossy(&bytes);
                let body: String = text.chars().take(MAX_QUOTED_BODY).collect();
                return Err(PrometheusError::Http {
                    status: status.as_u16(),
                    body,
                    query: promql.to_owned(),
                });
            }
        };
        for warning in &parsed.warnings {
            tracing::warn!(query = %promql, %warning, "Prometheus warned about a query");
        }
        if parsed.status != "success" || !status.is_success() {
            return Err(PrometheusError::Api {
                status: status.as_u16(),
                error_type: parsed.error_type.unwrap_or_else(|| "unknown".into()),
                message: parsed.error.unwrap_or_else(|| format!("status {:?}", parsed.status)),
                query: promql.to_owned(),
            });
        }
        let data = parsed.data.ok_or_else(|| PrometheusError::Api {
            status: status.as_u16(),
            error_type: "missing_data".into(),
            message: "a success answer without data".into(),
            query: promql.to_owned(),
        })?;
        convert(data, promql)
    }
}

fn convert(data: RawData, promql: &str) -> Result<QueryData, PrometheusError> {
    let point = |(t, v): (f64, String)| -> Result<(DateTime<Utc>, f64), PrometheusError> {
        let bad = || PrometheusError::BadSample {
            value: format!("[{t}, {v:?}]"),
            query: promql.to_owned(),
        };
        let at = instant(t).ok_or_else(bad)?;
        // Prometheus writes NaN, +Inf and -Inf, which Rust parses.
        let value: f64 = v.parse().map_err(|_| bad())?;
        Ok((at, value))
    };
    Ok(match data {
        RawData::Vector(samples) => QueryData::Vector(
            samples
                .into_iter()
                .filter_map(|s| s.value.map(|v| (s.metric, v)))
                .map(|(labels, v)| point(v).map(|(at, value)| Sample { labels, at, value }))
                .collect::<Result<_, _>>()?,
        ),
        RawData::Matrix(series) => QueryData::Matrix(
            series
                .into_iter()
                .map(|s| {
                    Ok(Series {
                        labels: s.metric,
                        points: s.values.into_iter().map(point).collect::<Result<_, _>>()?,
                    })
                })
                .collect::<Result<_, PrometheusError>>()?,
        ),
        RawData::Scalar(v) => {
            let (at, value) = point(v)?;
            QueryData::Scalar { at, value }
        }
        RawData::String((t, value)) => QueryData::String {
            at: instant(t).ok_or_else(|| PrometheusError::BadSample {
                value: t.to_string(),
                query: promql.to_owned(),
            })?,
            value,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_paths_keep_a_base_path_prefix() {
        let cases = [
            ("http://p:9090", "http://p:9090/api/v1/query"),
            ("http://p:9090/", "http://p:9090/api/v1/query"),
            ("https://h/prometheus/", "https://h/prometheus/api/v1/query"),
            ("https://h/prometheus", "https://h/prometheus/api/v1/query"),
        ];
        for (base, expected) in cases {
            let url = api_url(&Url::parse(base).expect("url"), "query").expect("api url");
            assert_eq!(url.as_str(), expected, "{base}");
        }
        assert!(matches!(
            api_url(&Url::parse("mailto:a@b").expect("url"), "query"),
            Err(PrometheusError::BadBaseUrl { .. })
        ));
    }

    #[test]
    fn the_token_stays_out_of_debug_output() {
        let mut config = PrometheusConfig::new(Url::parse("http://p:9090").expect("url"));
        config.bearer_token = Some("s3cr3t-token".into());
        assert!(!format!("{config:?}").contains("s3cr3t"));
    }
}
