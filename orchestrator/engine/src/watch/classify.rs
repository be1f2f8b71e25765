//! Pure turning of Redfish readings into the policy's metrics: event-log
//! entries into rate-metric events, GPU sensors into per-GPU level
//! readings, time into exposure split across sample windows.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use orchestrator_bmc::{EventLogEntry, SensorKind, SensorReading};
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

/// The GPU a sensor belongs to (`GPU_3` for `GPU_3_Temp`), by the id's
/// `GPU_<n>` prefix; `None` for non-GPU sensors.
pub fn gpu_unit(sensor: &SensorReading) -> Option<String> {
    if !sensor.is_gpu() {
        return None;
    }
    let upper = sensor.id.to_ascii_uppercase();
    let start = upper.find("GPU")?;
    let rest = &upper[start + 3..];
    let rest = rest.strip_prefix('_').unwrap_or(rest);
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    if digits.is_empty() {
        // A GPU sensor without an index: the whole baseboard is one unit.
        Some("GPU".to_owned())
    } else {
        Some(format!("GPU_{digits}"))
    }
}

/// Level readings of one poll: metric name → unit → reading.
pub type LevelReadings = BTreeMap<&'static str, BTreeMap<String, f64>>;

/// GPU level readings of one poll. Sensors without
/// a reading (absent, not ready) are left out rather than read as zero.
pub fn gpu_levels(sensors: &[SensorReading]) -> LevelReadings {
    let mut out = LevelReadings::new();
    for sensor in sensors {
        let metric = match sensor.kind {
            SensorKind::Temperature => RedfishMetric::GpuTempC,
            SensorKind::Power => RedfishMetric::GpuPowerW,
            SensorKind::Other(_) => continue,
        };
        let (Some(unit), Some(value)) = (gpu_unit(sensor), sensor.reading) else {
            continue;
        };
        if value.is_finite() {
            out.entry(metric.as_str()).or_default().insert(unit, value);
        }
    }
    out
}

/// GPUs on the node, as its GPU sensors show them.
pub fn gpu_count(sensors: &[SensorReading]) -> u32 {
    let units: std::collections::BTreeSet<String> = sensors.iter().filter_map(gpu_unit).collect();
    u32::try_from(units.len()).unwrap_or(u32::MAX)
}

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

/// Builds one poll's window deltas from the classified events (already
/// filtered to the node's exposure period), the exposure period, and the
/// level readings taken at `now`.
pub fn poll_deltas(
    metrics: &[RedfishMetric],
    events: &[(RedfishMetric, DateTime<Utc>)],
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
                for (_, at) in events.iter().filter(|(m, _)| *m == metric) {
                    entry(&mut deltas, metric, window_start(*at)).events += 1;
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
        }
    }

    #[test]
    fn gpu_sensors_become_one_reading_per_gpu() {
        let sensors = [
            sensor("GPU_0_Temp", SensorKind::Temperature, Some(60.0)),
            sensor("GPU_1_Temp", SensorKind::Temperature, Some(62.0)),
            sensor("GPU_1_Power", SensorKind::Power, Some(500.0)),
            sensor("GPU_2_Temp", SensorKind::Temperature, None),
        ];
        let levels = gpu_levels(&sensors);
        assert_eq!(levels["gpu_temp_c"].len(), 2);
        assert_eq!(levels["gpu_temp_c"]["GPU_1"], 62.0);
        assert_eq!(levels["gpu_power_w"]["GPU_1"], 500.0);
        assert_eq!(gpu_count(&sensors), 3);
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
    fn deltas_put_events_in_their_windows() {
        let from = Utc.with_ymd_and_hms(2026, 1, 1, 0, 30, 0).unwrap();
        let now = Utc.with_ymd_and_hms(2026, 1, 1, 1, 30, 0).unwrap();
        let events = [
            (RedfishMetric::XidErrorsPerGpuHour, from + chrono::Duration::minutes(5)),
            (RedfishMetric::XidErrorsPerGpuHour, now - chrono::Duration::minutes(5)),
            (RedfishMetric::PcieAerPerNodeHour, now),
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
        assert!((xid.iter().map(|d| d.exposure).sum::<f64>() - 8.0).abs() < 1e-9);
        // AER is not watched here, so its event is not stored.
        assert!(deltas.iter().all(|d| d.metric != "pcie_aer_per_node_hour"));
        let temp: Vec<_> = deltas.iter().filter(|d| d.metric == "gpu_temp_c").collect();
        assert_eq!(temp.len(), 1);
        assert_eq!(temp[0].units["GPU_0"].n, 1);
    }
}
