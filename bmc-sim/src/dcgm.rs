//! A simulated dcgm-exporter on every node: the GPU telemetry a real fleet reads through Prometheus, drawn
//! from the same seed, event log and firmware effects as the node's Redfish view, so a scenario's regression
//! shows in both.
//!
//! | Method + path                      | What                                                                 |
//! |------------------------------------|----------------------------------------------------------------------|
//! | `GET /sim/dcgm/metrics`            | every node's exporter in one exposition (one scrape target)          |
//! | `GET /sim/dcgm/{name}/metrics`     | one node's exporter (503 while it is stopped or the host reboots)    |
//! | `POST /sim/nodes/{name}/dcgm`      | body `{"action":"restart"\|"stop"\|"start"}`                          |
//!
//! Names, `# TYPE`s and labels follow dcgm-exporter (confirmed against `etc/default-counters.csv`,
//! `etc/dcp-metrics-included.csv`, the collector's exposition template `gpuMetricsFormat` and
//! `internal/pkg/collector/xid_collector.go` / `expcollector.go` / `const.go` in NVIDIA/dcgm-exporter):
//! every series carries `gpu`, `UUID`, `pci_bus_id`, `device` (`nvidia<gpu>`), `modelName` and `Hostname`
//! (the node's name, which the controller maps with `--prometheus-node-label Hostname`).
//!
//! | metric                                           | type    | drawn from                                      |
//! |--------------------------------------------------|---------|-------------------------------------------------|
//! | `DCGM_FI_DEV_GPU_TEMP`, `DCGM_FI_DEV_POWER_USAGE`| gauge   | the Redfish sensors' values                     |
//! | `DCGM_FI_DEV_XID_ERRORS`                         | gauge   | code of the GPU's last XID in the event log     |
//! | `DCGM_EXP_XID_ERRORS_COUNT{xid,window_size_in_ms}`| gauge  | XIDs per code in the last window (event log)    |
//! | `DCGM_FI_DEV_PCIE_REPLAY_COUNTER`                | counter | the node's PCIe AER log entries, spread on GPUs |
//! | `DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`                  | counter | `dcgm.ecc_dbe_per_gpu_hour` (+ effects)         |
//! | `DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL`  | counter | `dcgm.nvlink_crc_per_gpu_hour` (+ effects)      |
//! | `DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS`        | counter | `dcgm.remapped_rows_per_gpu_hour` (persistent)  |
//! | `DCGM_FI_DEV_ROW_REMAP_FAILURE`                  | gauge   | 1 once remapped rows reach `dcgm.row_remap_spares` |
//!
//! Counter semantics: volatile counters (PCIe replay, volatile ECC, NVLink CRC) and the exporter's own XID
//! state count from the later of the fleet's start, the node's last firmware activation (a host reboot
//! reloads the driver) and the exporter's last restart (modelled together with a driver reload, as when the
//! GPU operator restarts both pods), so Prometheus sees a reset. Remapped rows are persistent, as on the GPU
//! (a replacement GPU starts from zero).
//!
//! Hardware failures (`hardware:` in the scenario, [`crate::state::hardware`]): a GPU fallen off the bus has no
//! series at all until it is replaced; a row-remap failure sets `DCGM_FI_DEV_ROW_REMAP_FAILURE` 1 (and
//! remapped rows to the spares); an uncorrectable-ECC failure's XID 48s add to the volatile DBE counter.
//! While the exporter is stopped, or the host reboots, its series are absent: a scrape of the node fails
//! and the fleet-wide exposition leaves the node out, so the series go stale in Prometheus.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Duration, Utc};
use serde::Deserialize;
use serde_json::json;

use crate::rng::{self, Purpose};
use crate::scenario::{HardwareFailureMode, Metric};
use crate::state::{EventKind, Exporter, FleetState, Node, NodeMut, poisson_by_inversion};

/// HGX H100 baseboard bus ids, in GPU order (as `nvidia-smi` lists them on a DGX H100).
const PCI_BUS_IDS: [&str; 8] = [
    "00000000:18:00.0",
    "00000000:2A:00.0",
    "00000000:3A:00.0",
    "00000000:5D:00.0",
    "00000000:9A:00.0",
    "00000000:AB:00.0",
    "00000000:BA:00.0",
    "00000000:DB:00.0",
];

fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn uuid(seed: u64, node: usize, gpu: usize) -> String {
    let a = rng::key(seed, node as u64, Purpose::DcgmUuid, gpu as u64, 0);
    let b = rng::key(seed, node as u64, Purpose::DcgmUuid, gpu as u64, 1);
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

/// Times of a Poisson process's events in `[from, to]` for one GPU and signal, drawn per event bucket with the
/// rate (baseline and firmware effects) at the bucket's start, like the event log.
fn poisson_events(
    s: &FleetState,
    node: &Node,
    m: &NodeMut,
    signal: (Metric, Purpose, f64),
    gpu: usize,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> u64 {
    use rand::Rng;
    let (metric, purpose, base) = signal;
    if to <= from || to <= s.epoch {
        return 0;
    }
    let bucket = s.event_bucket();
    let bucket_ms = bucket.num_milliseconds();
    let first = ((from.max(s.epoch) - s.epoch).num_milliseconds() / bucket_ms) as u64;
    let last = ((to - s.epoch).num_milliseconds() / bucket_ms) as u64;
    let hours = bucket_ms as f64 / 3_600_000.0;
    let mut count = 0;
    for b in first..=last {
        let start = s.epoch + bucket * (b as i32);
        let (mul, add) = s.adjust(node, m, metric, Some(gpu), start);
        let lambda = ((base * mul + add).max(0.0)) * hours;
        let n = poisson_by_inversion(
            rng::unit(s.scenario.seed, node.index as u64, purpose, gpu as u64, b),
            lambda,
        );
        if n == 0 {
            continue;
        }
        let mut r = rng::stream(s.scenario.seed, node.index as u64, purpose, gpu as u64, b);
        for _ in 0..n {
            let at = start + Duration::milliseconds((r.random::<f64>() * bucket_ms as f64) as i64);
            if at > from && at <= to {
                count += 1;
            }
        }
    }
    count
}

/// When the node's volatile counters last started from zero.
fn counters_since(s: &FleetState, m: &NodeMut, exporter: Exporter, now: DateTime<Utc>) -> DateTime<Utc> {
    let activation = m
        .components
        .iter()
        .flat_map(|c| c.history.iter().map(|(t, _)| *t))
        .filter(|t| *t <= now)
        .max();
    [Some(s.epoch), activation, exporter.restarted]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(s.epoch)
}

struct Section {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    body: String,
}

/// The families in exposition order, with the help text dcgm-exporter's CSVs give.
fn sections() -> Vec<Section> {
    [
        ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
        ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
        (
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
            "counter",
            "Total number of PCIe retries.",
        ),
        (
            "DCGM_FI_DEV_XID_ERRORS",
            "gauge",
            "Value of the last XID error encountered.",
        ),
        (
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "counter",
            "Total number of double-bit volatile ECC errors.",
        ),
        (
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
            "counter",
            "Total number of NVLink flow-control CRC errors.",
        ),
        (
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            "counter",
            "Number of remapped rows for uncorrectable errors",
        ),
        (
            "DCGM_FI_DEV_ROW_REMAP_FAILURE",
            "gauge",
            "Whether remapping of rows has failed",
        ),
        (
            "DCGM_EXP_XID_ERRORS_COUNT",
            "gauge",
            "Count of XID Errors within user-specified time window (see xid-count-window-size param).",
        ),
    ]
    .into_iter()
    .map(|(name, kind, help)| Section {
        name,
        kind,
        help,
        body: String::new(),
    })
    .collect()
}

/// Appends one node's series to the sections; `None` (nothing appended) while its exporter is down.
fn render_node(s: &FleetState, node: &Node, out: &mut [Section]) -> Option<()> {
    let now = s.now();
    let exporter = s.dcgm.get(node.index);
    let mut m = node.lock();
    node.settle(&mut m, now);
    if exporter.stopped || m.reboot_until.is_some_and(|u| u > now) {
        return None;
    }
    let spec = &s.scenario.dcgm;
    let since = counters_since(s, &m, exporter, now);
    let window = Duration::from_std(spec.xid_count_window).unwrap_or(Duration::minutes(5));
    let events = s.events_until(node, &mut m, now);
    let gpus = s.gpus.max(1);
    let mut last_xid = vec![0u16; gpus];
    let mut xid_window: Vec<BTreeMap<u16, u64>> = vec![BTreeMap::new(); gpus];
    let mut replays = vec![0u64; gpus];
    for e in events.iter().filter(|e| e.created > since) {
        match e.kind {
            EventKind::Xid { gpu, code } => {
                let g = gpu as usize;
                if let Some(last) = last_xid.get_mut(g) {
                    *last = code;
                }
                if e.created > now - window
                    && let Some(w) = xid_window.get_mut(g)
                {
                    *w.entry(code).or_default() += 1;
                }
            }
            // A PCIe link replay shows in the host's AER log; the log entry does not say which GPU's link, so
            // entries are spread over the GPUs by their id.
            EventKind::Aer { .. } => replays[(e.id % gpus as u64) as usize] += 1,
            EventKind::LinkDegraded { .. } => {}
        }
    }
    let hostname = label(&node.name);
    let model = label(&spec.model_name);
    let window_ms = window.num_milliseconds();
    // Uncorrectable ECC failures count into the volatile DBE counter like the XID 48s they log.
    let hardware = s.hardware_events(&m, since, now + Duration::milliseconds(1));
    for g in 0..gpus {
        let failure = s.failure_at(&m, g, now);
        // dcgm-exporter cannot read a GPU the driver lost, so its series vanish until the GPU is replaced.
        if failure.is_some_and(|f| f.mode == HardwareFailureMode::FallenOffBus) {
            continue;
        }
        // A replacement GPU's persistent counters are its own, from the day it went in.
        let installed = s.part_at(&m, g, now).map_or(s.epoch, |p| p.installed_at.max(s.epoch));
        let hardware_dbe = hardware
            .iter()
            .filter(|(at, kind)| {
                *at > since
                    && *at >= installed
                    && matches!(kind, EventKind::Xid { gpu, code: 48 } if *gpu as usize == g)
            })
            .count() as u64;
        let base = format!(
            "gpu=\"{g}\",UUID=\"{}\",pci_bus_id=\"{}\",device=\"nvidia{g}\",modelName=\"{model}\",Hostname=\"{hostname}\"",
            uuid(s.scenario.seed, node.index, g),
            PCI_BUS_IDS[g % PCI_BUS_IDS.len()],
        );
        let (temp, power) = s.gpu_gauges(node, &m, g, now);
        let ecc = poisson_events(
            s,
            node,
            &m,
            (Metric::EccDbePerGpuHour, Purpose::DcgmEcc, spec.ecc_dbe_per_gpu_hour),
            g,
            since,
            now,
        );
        let crc = poisson_events(
            s,
            node,
            &m,
            (
                Metric::NvlinkCrcPerGpuHour,
                Purpose::DcgmNvlink,
                spec.nvlink_crc_per_gpu_hour,
            ),
            g,
            since,
            now,
        );
        // Persistent: remapped rows survive reboots and restarts.
        let rows = poisson_events(
            s,
            node,
            &m,
            (
                Metric::RemappedRowsPerGpuHour,
                Purpose::DcgmRows,
                spec.remapped_rows_per_gpu_hour,
            ),
            g,
            installed,
            now,
        );
        let rows = if failure.is_some_and(|f| f.mode == HardwareFailureMode::RowRemapFailure) {
            // Remapping failed: the spare rows are used up.
            rows.max(spec.row_remap_spares)
        } else {
            rows
        };
        let values: [String; 8] = [
            format!("{temp}"),
            format!("{power}"),
            replays[g].to_string(),
            last_xid[g].to_string(),
            (ecc + hardware_dbe).to_string(),
            crc.to_string(),
            rows.to_string(),
            u8::from(rows >= spec.row_remap_spares).to_string(),
        ];
        for (section, value) in out.iter_mut().zip(values.iter()) {
            let _ = writeln!(section.body, "{}{{{base}}} {value}", section.name);
        }
        let xid = &mut out[8];
        if xid_window[g].is_empty() {
            // As the exporter does: one zero series without an `xid` label when the window holds none.
            let _ = writeln!(xid.body, "{}{{{base},window_size_in_ms=\"{window_ms}\"}} 0", xid.name);
        }
        for (code, count) in &xid_window[g] {
            let _ = writeln!(
                xid.body,
                "{}{{{base},window_size_in_ms=\"{window_ms}\",xid=\"{code}\"}} {count}",
                xid.name
            );
        }
    }
    Some(())
}

fn finish(sections: Vec<Section>) -> String {
    let mut out = String::new();
    for s in sections {
        let _ = writeln!(out, "# HELP {} {}\n# TYPE {} {}", s.name, s.help, s.name, s.kind);
        out.push_str(&s.body);
    }
    out
}

/// One node's exposition, `None` while its exporter is down.
pub(crate) fn render_one(s: &FleetState, node: &Node) -> Option<String> {
    let mut sections = sections();
    render_node(s, node, &mut sections)?;
    Some(finish(sections))
}

/// Every node whose exporter is up, in one exposition.
pub(crate) fn render_all(s: &FleetState) -> String {
    let mut sections = sections();
    for n in &s.nodes {
        let _ = render_node(s, n, &mut sections);
    }
    finish(sections)
}

fn text(body: String) -> Response {
    let mut resp = body.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

pub(crate) async fn all_metrics(State(s): State<Arc<FleetState>>) -> Response {
    match tokio::task::spawn_blocking(move || render_all(&s)).await {
        Ok(body) => text(body),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

pub(crate) async fn node_metrics(State(s): State<Arc<FleetState>>, Path(name): Path<String>) -> Response {
    let rendered = tokio::task::spawn_blocking(move || {
        let node = s.node_by_name(&name)?;
        Some(render_one(&s, node))
    })
    .await;
    match rendered {
        Ok(Some(Some(body))) => text(body),
        Ok(Some(None)) => (StatusCode::SERVICE_UNAVAILABLE, "exporter down\n").into_response(),
        Ok(None) => (StatusCode::NOT_FOUND, "no such node\n").into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Action {
    action: String,
}

pub(crate) async fn control(
    State(s): State<Arc<FleetState>>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let Some(node) = s.node_by_name(&name) else {
        return (StatusCode::NOT_FOUND, Json(json!({"error": format!("no node {name}")}))).into_response();
    };
    let action: Action = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => return (StatusCode::BAD_REQUEST, Json(json!({"error": e.to_string()}))).into_response(),
    };
    let now = s.now();
    match action.action.as_str() {
        "restart" => s.dcgm.update(node.index, |e| {
            e.restarted = Some(now);
            e.stopped = false;
        }),
        "stop" => s.dcgm.update(node.index, |e| e.stopped = true),
        "start" => s.dcgm.update(node.index, |e| {
            // A started exporter is a fresh process.
            e.restarted = Some(now);
            e.stopped = false;
        }),
        other => {
            return (
                StatusCode::BAD_REQUEST,
                Json(json!({"error": format!("unknown action {other:?}; expected restart, stop or start")})),
            )
                .into_response();
        }
    }
    Json(json!({"node": name, "action": action.action, "at": now.to_rfc3339()})).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_look_like_nvidia_ones_and_are_stable() {
        let u = uuid(42, 3, 5);
        assert_eq!(u, uuid(42, 3, 5));
        assert_ne!(u, uuid(42, 3, 6));
        assert_eq!(u.len(), "GPU-".len() + 36, "{u}");
        assert!(u.starts_with("GPU-"));
    }
}
