//! Pure turning of Redfish readings into the policy's metrics: event-log
//! entries into rate-metric events, GPU sensors into per-GPU level
//! readings, time into exposure split across sample windows.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use orchestrator_bmc::{EventLogEntry, GpuUnit, SensorKind, SensorReading};
use orchestrator_db::health::{LevelAgg, SAMPLE_WINDOW, WindowDelta, window_start};
use orchestrator_policy::RedfishMetric;

/// Which rate metric an event-log entry counts towards, if any.
///
/// BMC vendors phrase these differently, so the entry's `MessageArgs`,
/// `Message` and `MessageId` are all searched: an XID (NVIDIA's GPU error
/// code), a PCIe AER (Advanced Error Reporting) error, or a link that
/// trained below its width or speed.
pub fn classify_event(entry: &EventLogEntry) -> Option<RedfishMetric> {
    let mut text = entry.message_args.join(" ");
    for part in [&entry.message, &entry.message_id].into_iter().flatten() {
        text.push(' ');
        text.push_str(part);
    }
    let text = text.to_ascii_lowercase();
    let words: Vec<&str> = text
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    if words.contains(&"xid") {
        Some(RedfishMetric::XidErrorsPerGpuHour)
    } else if words.contains(&"aer") {
        Some(RedfishMetric::PcieAerPerNodeHour)
    } else if text.contains("link degraded") || text.contains("linkdegraded") || text.contains("link width") {
        Some(RedfishMetric::LinkDegradedPerNodeDay)
    } else {
        None
    }
}

/// The XID code an event-log entry reports (`XID 79`, `Xid 79`, `XID: 79`), if it reports one.
pub fn xid_code(entry: &EventLogEntry) -> Option<u32> {
    let mut text = entry.message_args.join(" ");
    for part in [&entry.message, &entry.message_id].into_iter().flatten() {
        text.push(' ');
        text.push_str(part);
    }
    let words: Vec<&str> = text
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    words
        .windows(2)
        .find(|w| w[0].eq_ignore_ascii_case("xid"))
        .and_then(|w| w[1].parse().ok())
}

/// The GPU a Redfish resource link names: a GPU processor itself or something under it, the GPU's
/// chassis (`Links.Chassis` of the processor), or a resource whose last path segment ends in the
/// GPU's id (`.../Chassis/HGX_GPU_SXM_1` for `GPU_SXM_1`, when the processor does not link its chassis).
pub fn gpu_of_link<'a>(link: &str, gpus: &'a [GpuUnit]) -> Option<&'a GpuUnit> {
    let link = link.trim_end_matches('/');
    let under = |base: &str| link == base || link.strip_prefix(base).is_some_and(|rest| rest.starts_with('/'));
    if let Some(gpu) = gpus
        .iter()
        .find(|g| under(&g.uri) || g.chassis.as_deref().is_some_and(under))
    {
        return Some(gpu);
    }
    let last = link.rsplit('/').next().unwrap_or_default();
    // The longest id wins, so `GPU_SXM_1` never claims `HGX_GPU_SXM_11`'s link.
    gpus.iter()
        .filter(|g| last == g.id || last.ends_with(&format!("_{}", g.id)))
        .max_by_key(|g| g.id.len())
}

/// The digits-after-`GPU` rule for sensors without a `RelatedItem` (`GPU_3_Temp` -> `GPU_3`); a GPU
/// sensor without digits stands for the whole baseboard (`GPU`).
fn gpu_unit_by_id(sensor_id: &str) -> String {
    let upper = sensor_id.to_ascii_uppercase();
    let Some(start) = upper.find("GPU") else {
        return "GPU".to_owned();
    };
    let rest = &upper[start + 3..];
    let rest = rest.strip_prefix('_').unwrap_or(rest);
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    if digits.is_empty() {
        "GPU".to_owned()
    } else {
        format!("GPU_{digits}")
    }
}

/// The GPU a sensor belongs to, `None` for non-GPU sensors.
///
/// By its `RelatedItem` first (the DMTF way to say what a sensor measures): a link to one of `gpus`
/// names that GPU's id (`HGX_GPU_SXM_1_TEMP_0` -> `GPU_SXM_1`); a link to something else on a GPU
/// sensor names the device it points at (its last path segment). Only a sensor without any
/// `RelatedItem` falls back to the digits in its id (`GPU_3_Temp` -> `GPU_3`), because ids such as
/// `HGX_GPU_SXM_1_TEMP_0` carry other numbers too.
pub fn gpu_unit(sensor: &SensorReading, gpus: &[GpuUnit]) -> Option<String> {
    if let Some(gpu) = sensor.related.iter().find_map(|r| gpu_of_link(r, gpus)) {
        return Some(gpu.id.clone());
    }
    if !sensor.is_gpu() {
        return None;
    }
    match sensor.related.first() {
        Some(related) => Some(related.rsplit('/').next().unwrap_or(related).to_owned()),
        None => Some(gpu_unit_by_id(&sensor.id)),
    }
}

/// The GPU an event-log entry is about: by `Links.OriginOfCondition` first (HGX points it at the GPU's
/// chassis or processor and often says nothing else), then by a `MessageArgs` value that is a GPU's
/// id (`GPU_SXM_3`). `None`: not attributable to one GPU.
pub fn event_gpu(entry: &EventLogEntry, gpus: &[GpuUnit]) -> Option<String> {
    if let Some(gpu) = entry.origin.as_deref().and_then(|o| gpu_of_link(o, gpus)) {
        return Some(gpu.id.clone());
    }
    entry
        .message_args
        .iter()
        .find_map(|arg| gpus.iter().find(|g| g.id.eq_ignore_ascii_case(arg.trim())))
        .map(|g| g.id.clone())
}

/// Level readings of one poll: metric name → unit → reading.
pub type LevelReadings = BTreeMap<&'static str, BTreeMap<String, f64>>;

/// GPU level readings of one poll, one per GPU and metric. Sensors without a reading (absent, not
/// ready) are left out rather than read as zero. A GPU with several temperature sensors (HGX has the
/// GPU's and its memory's, both related to the GPU) is read from the one whose `PhysicalContext` is
/// `GPU`, then from the lowest id, so the same sensor is used at every poll.
pub fn gpu_levels(sensors: &[SensorReading], gpus: &[GpuUnit]) -> LevelReadings {
    // (metric, unit) -> (not the GPU's own context, sensor id, value): the smallest key wins.
    let mut best: BTreeMap<(&'static str, String), (bool, &str, f64)> = BTreeMap::new();
    for sensor in sensors {
        let metric = match sensor.kind {
            SensorKind::Temperature => RedfishMetric::GpuTempC,
            SensorKind::Power => RedfishMetric::GpuPowerW,
            SensorKind::Other(_) => continue,
        };
        let (Some(unit), Some(value)) = (gpu_unit(sensor, gpus), sensor.reading) else {
            continue;
        };
        if !value.is_finite() {
            continue;
        }
        let rank = (
            sensor.physical_context.as_deref() != Some("GPU"),
            sensor.id.as_str(),
            value,
        );
        best.entry((metric.as_str(), unit))
            .and_modify(|b| {
                if (rank.0, rank.1) < (b.0, b.1) {
                    *b = rank;
                }
            })
            .or_insert(rank);
    }
    let mut out = LevelReadings::new();
    for ((metric, unit), (_, _, value)) in best {
        out.entry(metric).or_default().insert(unit, value);
    }
    out
}

/// GPUs on the node: the inventory's GPU processors when the BMC lists them, else the GPUs its
/// sensors show.
pub fn gpu_count(sensors: &[SensorReading], gpus: &[GpuUnit]) -> u32 {
    if !gpus.is_empty() {
        return u32::try_from(gpus.len()).unwrap_or(u32::MAX);
    }
    let units: std::collections::BTreeSet<String> = sensors.iter().filter_map(|s| gpu_unit(s, gpus)).collect();
    u32::try_from(units.len()).unwrap_or(u32::MAX)
}

/// A classified event: its metric, when it happened, and the GPU it is about (if known).
pub type ClassifiedEvent = (RedfishMetric, DateTime<Utc>, Option<String>);

/// Exposure of one node over `[from, to)` in `metric`'s unit, split at
/// sample-window boundaries: `(window start, exposure)`.
pub fn exposure_by_window(
    metric: RedfishMetric,
    gpus: u32,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Vec<(DateTime<Utc>, f64)> {
    let per_second = match metric {
        RedfishMetric::XidErrorsPerGpuHour => f64::from(gpus) / 3600.0,
        RedfishMetric::PcieAerPerNodeHour => 1.0 / 3600.0,
        RedfishMetric::LinkDegradedPerNodeDay => 1.0 / 86_400.0,
        _ => return Vec::new(),
    };
    let mut out = Vec::new();
    let mut at = from;
    while at < to {
        let window = window_start(at);
        let end = (window + SAMPLE_WINDOW).min(to);
        let seconds = (end - at).num_milliseconds() as f64 / 1000.0;
        out.push((window, seconds * per_second));
        at = end;
    }
    out
}

/// How close XID entries of one node must be to the first of their episode to be counted with it.
///
/// XIDs burst and cascade over a node's GPUs (one NVLink or power fault logs an XID on several GPUs
/// within a second or two), so counting log entries makes the counts over-dispersed and a
/// GPU-level Poisson test anti-conservative (issue 22). Counting episodes makes the unit the fault.
/// 5 s covers a cascade with second-resolution `Created` stamps and merges independent XIDs rarely:
/// at a base of 0.002 per GPU-hour on 8 GPUs the chance that another falls within 5 s is about 2e-5.
/// A cascade split across two polls counts twice (the poll cursor keeps no time of the last XID);
/// with 30 min polls that is rare.
pub const XID_EPISODE: chrono::TimeDelta = chrono::TimeDelta::seconds(5);

/// Builds one poll's window deltas from the classified events (already
/// filtered to the node's exposure period), the exposure period, and the
/// level readings taken at `now`. XID entries count once per episode ([`XID_EPISODE`]). An event attributed to a GPU is also
/// counted in that GPU's unit of its window (a reading of 1, so the unit's
/// `n` is the GPU's event count): the evidence then shows which GPU erred.
pub fn poll_deltas(
    metrics: &[RedfishMetric],
    events: &[ClassifiedEvent],
    gpus: u32,
    exposure_from: DateTime<Utc>,
    now: DateTime<Utc>,
    levels: &LevelReadings,
) -> Vec<WindowDelta> {
    type Deltas = BTreeMap<(&'static str, DateTime<Utc>), WindowDelta>;
    fn entry(deltas: &mut Deltas, metric: RedfishMetric, window: DateTime<Utc>) -> &mut WindowDelta {
        deltas.entry((metric.as_str(), window)).or_insert_with(|| WindowDelta {
            metric: metric.as_str().to_owned(),
            window_start: window,
            ..Default::default()
        })
    }
    let mut deltas = Deltas::new();
    for &metric in metrics {
        match metric {
            RedfishMetric::XidErrorsPerGpuHour
            | RedfishMetric::PcieAerPerNodeHour
            | RedfishMetric::LinkDegradedPerNodeDay => {
                for (window, exposure) in exposure_by_window(metric, gpus, exposure_from, now) {
                    entry(&mut deltas, metric, window).exposure += exposure;
                }
                let mut times: Vec<(DateTime<Utc>, Option<&String>)> = events
                    .iter()
                    .filter(|(m, _, _)| *m == metric)
                    .map(|(_, at, gpu)| (*at, gpu.as_ref()))
                    .collect();
                times.sort_by_key(|(at, _)| *at);
                let mut episode_start: Option<DateTime<Utc>> = None;
                for (at, gpu) in times {
                    let delta = entry(&mut deltas, metric, window_start(at));
                    // An XID cascade over a node's GPUs is one episode (one event); every other
                    // metric counts each entry. The unit counts below still show each GPU's entries.
                    let new_episode = metric != RedfishMetric::XidErrorsPerGpuHour
                        || episode_start.is_none_or(|start| at - start > XID_EPISODE);
                    if new_episode {
                        episode_start = Some(at);
                        delta.events += 1;
                    }
                    if let Some(gpu) = gpu {
                        delta
                            .units
                            .entry(gpu.clone())
                            .and_modify(|a| a.merge(&LevelAgg::of(1.0)))
                            .or_insert_with(|| LevelAgg::of(1.0));
                    }
                }
            }
            RedfishMetric::GpuTempC | RedfishMetric::GpuPowerW => {
                if let Some(units) = levels.get(metric.as_str()).filter(|u| !u.is_empty()) {
                    let delta = entry(&mut deltas, metric, window_start(now));
                    for (unit, value) in units {
                        delta.units.insert(unit.clone(), LevelAgg::of(*value));
                    }
                }
            }
            RedfishMetric::FlashFailures => {}
        }
    }
    deltas.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn entry(args: &[&str], message: &str) -> EventLogEntry {
        EventLogEntry {
            id: "1".into(),
            created: Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap(),
            severity: None,
            message: Some(message.into()),
            message_id: Some("ResourceEvent.1.3.ResourceErrorsDetected".into()),
            message_args: args.iter().map(|s| s.to_string()).collect(),
            entry_type: None,
            sensor_type: None,
            origin: None,
        }
    }

    #[test]
    fn events_are_classified_into_policy_metrics() {
        let cases = [
            (
                entry(&["GPU_3", "XID 79"], "GPU_3 reported XID 79."),
                Some(RedfishMetric::XidErrorsPerGpuHour),
            ),
            (
                entry(&["PCIe_Root_Port_0", "PCIe AER Correctable"], "x"),
                Some(RedfishMetric::PcieAerPerNodeHour),
            ),
            (
                entry(&["PCIe_Root_Port_0", "Link degraded to x8"], "x"),
                Some(RedfishMetric::LinkDegradedPerNodeDay),
            ),
            (entry(&[], "Fan 3 speed low"), None),
            // "Xidian" is not an XID: words, not substrings.
            (entry(&[], "Xidian power supply"), None),
        ];
        for (e, expected) in cases {
            assert_eq!(classify_event(&e), expected, "{:?}", e.message_args);
        }
    }

    fn sensor(id: &str, kind: SensorKind, reading: Option<f64>) -> SensorReading {
        SensorReading {
            chassis_id: "1".into(),
            id: id.into(),
            kind,
            reading,
            units: None,
            physical_context: Some("GPU".into()),
            health: None,
            related: Vec::new(),
        }
    }

    fn hgx_gpus() -> Vec<GpuUnit> {
        (1..=8)
            .map(|n| GpuUnit {
                id: format!("GPU_SXM_{n}"),
                uri: format!("/redfish/v1/Systems/HGX_Baseboard_0/Processors/GPU_SXM_{n}"),
                chassis: None,
            })
            .collect()
    }

    fn hgx_sensor(id: &str, kind: SensorKind, context: &str, reading: f64, related: &str) -> SensorReading {
        SensorReading {
            chassis_id: "HGX_GPU_SXM_1".into(),
            id: id.into(),
            kind,
            reading: Some(reading),
            units: None,
            physical_context: Some(context.into()),
            health: None,
            related: vec![related.into()],
        }
    }

    #[test]
    fn hgx_sensors_map_to_gpus_by_related_item_not_by_digits_in_the_id() {
        let gpus = hgx_gpus();
        let proc = |n: u32| format!("/redfish/v1/Systems/HGX_Baseboard_0/Processors/GPU_SXM_{n}");
        let sensors = [
            hgx_sensor("HGX_GPU_SXM_1_TEMP_0", SensorKind::Temperature, "GPU", 61.0, &proc(1)),
            // The memory's temperature, related to the same GPU: not the GPU's reading.
            hgx_sensor(
                "HGX_GPU_SXM_1_DRAM_0_Temp_0",
                SensorKind::Temperature,
                "Memory",
                67.0,
                &proc(1),
            ),
            hgx_sensor("HGX_GPU_SXM_11_TEMP_0", SensorKind::Temperature, "GPU", 63.0, &proc(8)),
            // Related to the GPU's chassis rather than its processor.
            hgx_sensor(
                "HGX_GPU_SXM_3_Power_0",
                SensorKind::Power,
                "GPU",
                410.0,
                "/redfish/v1/Chassis/HGX_GPU_SXM_3",
            ),
        ];
        assert_eq!(gpu_unit(&sensors[0], &gpus).as_deref(), Some("GPU_SXM_1"));
        assert_eq!(
            gpu_unit(&sensors[2], &gpus).as_deref(),
            Some("GPU_SXM_8"),
            "RelatedItem wins over the id"
        );
        let levels = gpu_levels(&sensors, &gpus);
        assert_eq!(levels["gpu_temp_c"]["GPU_SXM_1"], 61.0);
        assert_eq!(levels["gpu_temp_c"]["GPU_SXM_8"], 63.0);
        assert_eq!(levels["gpu_power_w"]["GPU_SXM_3"], 410.0);
        assert_eq!(gpu_count(&sensors, &gpus), 8, "from the inventory, not the sensors");
        assert_eq!(
            gpu_count(&sensors, &[]),
            3,
            "without an inventory: the devices the sensors name"
        );
        assert_eq!(
            gpu_unit(&sensors[3], &[]).as_deref(),
            Some("HGX_GPU_SXM_3"),
            "a related item that is no known GPU still names one device"
        );
    }

    #[test]
    fn xid_entries_are_attributed_by_origin_of_condition_first() {
        let gpus = hgx_gpus();
        let mut e = entry(&["GPU_SXM_2", "XID 79"], "GPU_SXM_2 reported XID 79.");
        e.origin = Some("/redfish/v1/Chassis/HGX_GPU_SXM_3".into());
        assert_eq!(event_gpu(&e, &gpus).as_deref(), Some("GPU_SXM_3"));
        e.origin = Some("/redfish/v1/Systems/HGX_Baseboard_0/Processors/GPU_SXM_5".into());
        assert_eq!(event_gpu(&e, &gpus).as_deref(), Some("GPU_SXM_5"));
        e.origin = Some("/redfish/v1/Systems/HGX_Baseboard_0".into());
        assert_eq!(event_gpu(&e, &gpus).as_deref(), Some("GPU_SXM_2"), "then MessageArgs");
        e.message_args.clear();
        assert_eq!(event_gpu(&e, &gpus), None);
    }

    #[test]
    fn gpu_sensors_become_one_reading_per_gpu() {
        let sensors = [
            sensor("GPU_0_Temp", SensorKind::Temperature, Some(60.0)),
            sensor("GPU_1_Temp", SensorKind::Temperature, Some(62.0)),
            sensor("GPU_1_Power", SensorKind::Power, Some(500.0)),
            sensor("GPU_2_Temp", SensorKind::Temperature, None),
        ];
        let levels = gpu_levels(&sensors, &[]);
        assert_eq!(levels["gpu_temp_c"].len(), 2);
        assert_eq!(levels["gpu_temp_c"]["GPU_1"], 62.0);
        assert_eq!(levels["gpu_power_w"]["GPU_1"], 500.0);
        assert_eq!(gpu_count(&sensors, &[]), 3);
    }

    #[test]
    fn exposure_is_split_at_window_boundaries() {
        let from = Utc.with_ymd_and_hms(2026, 1, 1, 0, 30, 0).unwrap();
        let to = Utc.with_ymd_and_hms(2026, 1, 1, 2, 0, 0).unwrap();
        let parts = exposure_by_window(RedfishMetric::XidErrorsPerGpuHour, 8, from, to);
        assert_eq!(parts.len(), 2);
        assert!((parts[0].1 - 4.0).abs() < 1e-9, "{parts:?}");
        assert!((parts[1].1 - 8.0).abs() < 1e-9, "{parts:?}");
        let day = exposure_by_window(RedfishMetric::LinkDegradedPerNodeDay, 8, from, to);
        let total: f64 = day.iter().map(|p| p.1).sum();
        assert!((total - 1.5 / 24.0).abs() < 1e-9);
        assert!(exposure_by_window(RedfishMetric::GpuTempC, 8, from, to).is_empty());
    }

    #[test]
    fn an_xid_cascade_over_a_nodes_gpus_counts_as_one_episode() {
        let from = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let now = from + chrono::Duration::hours(1);
        let xid = |at: DateTime<Utc>, gpu: &str| (RedfishMetric::XidErrorsPerGpuHour, at, Some(gpu.to_owned()));
        let aer = |at: DateTime<Utc>| (RedfishMetric::PcieAerPerNodeHour, at, None);
        let t = from + chrono::Duration::minutes(10);
        let events = [
            // One cascade over four GPUs within two seconds, listed out of order ...
            xid(t + chrono::Duration::seconds(2), "GPU_SXM_3"),
            xid(t, "GPU_SXM_1"),
            xid(t + chrono::Duration::seconds(1), "GPU_SXM_2"),
            xid(t + chrono::Duration::seconds(2), "GPU_SXM_4"),
            // ... an XID 6 s after the cascade began is a new episode, and so is one 20 minutes later.
            xid(t + chrono::Duration::seconds(6), "GPU_SXM_1"),
            xid(t + chrono::Duration::minutes(20), "GPU_SXM_5"),
            // AER entries are not de-duplicated: two at the same second are two events.
            aer(t),
            aer(t),
        ];
        let deltas = poll_deltas(
            &[RedfishMetric::XidErrorsPerGpuHour, RedfishMetric::PcieAerPerNodeHour],
            &events,
            8,
            from,
            now,
            &BTreeMap::new(),
        );
        let of = |metric: &str| {
            deltas
                .iter()
                .filter(|d| d.metric == metric)
                .map(|d| d.events)
                .sum::<u64>()
        };
        assert_eq!(of("xid_errors_per_gpu_hour"), 3);
        assert_eq!(of("pcie_aer_per_node_hour"), 2);
        // Each GPU's entries are still shown under it.
        let units: u64 = deltas
            .iter()
            .filter(|d| d.metric == "xid_errors_per_gpu_hour")
            .flat_map(|d| d.units.values())
            .map(|a| a.n)
            .sum();
        assert_eq!(units, 6);
    }

    #[test]
    fn deltas_put_events_in_their_windows() {
        let from = Utc.with_ymd_and_hms(2026, 1, 1, 0, 30, 0).unwrap();
        let now = Utc.with_ymd_and_hms(2026, 1, 1, 1, 30, 0).unwrap();
        let events = [
            (
                RedfishMetric::XidErrorsPerGpuHour,
                from + chrono::Duration::minutes(5),
                Some("GPU_SXM_2".to_owned()),
            ),
            (
                RedfishMetric::XidErrorsPerGpuHour,
                now - chrono::Duration::minutes(5),
                None,
            ),
            (RedfishMetric::PcieAerPerNodeHour, now, None),
        ];
        let mut levels = BTreeMap::new();
        levels.insert("gpu_temp_c", BTreeMap::from([("GPU_0".to_owned(), 70.0)]));
        let deltas = poll_deltas(
            &[RedfishMetric::XidErrorsPerGpuHour, RedfishMetric::GpuTempC],
            &events,
            8,
            from,
            now,
            &levels,
        );
        let xid: Vec<_> = deltas
            .iter()
            .filter(|d| d.metric == "xid_errors_per_gpu_hour")
            .collect();
        assert_eq!(xid.len(), 2);
        assert_eq!(xid.iter().map(|d| d.events).sum::<u64>(), 2);
        let attributed: u64 = xid.iter().filter_map(|d| d.units.get("GPU_SXM_2")).map(|a| a.n).sum();
        assert_eq!(attributed, 1, "the attributed XID is counted under its GPU");
        assert!((xid.iter().map(|d| d.exposure).sum::<f64>() - 8.0).abs() < 1e-9);
        // AER is not watched here, so its event is not stored.
        assert!(deltas.iter().all(|d| d.metric != "pcie_aer_per_node_hour"));
        let temp: Vec<_> = deltas.iter().filter(|d| d.metric == "gpu_temp_c").collect();
        assert_eq!(temp.len(), 1);
        assert_eq!(temp[0].units["GPU_0"].n, 1);
    }
}
