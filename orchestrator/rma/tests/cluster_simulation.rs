//! The defect-cluster scan on simulated fleets: the false-alarm rate on healthy fleets (with
//! correlated node failures, node-to-node variation, mixed ages and a bad flash), the power to find
//! one defective lot as the most specific group, and the pipeline end to end.
//!
//! The fleet: 1,250 nodes of 8 GPUs (10,000 GPUs) on two platform SKUs, ages 0-1,100 days at the
//! end of a 180-day period (younger nodes were installed during it, so their exposure is shorter).
//! Each node's GPUs come from one lot; lots are ~300 GPUs (3% of the fleet) built in age order
//! within two part numbers, and serial numbers encode part number and production week, so lots,
//! serial prefixes, part numbers and ages are all correlated, as in a real fleet.
//!
//! Failures: a per-GPU hazard with infant mortality (3x at age 0, decaying over ~60 days) and
//! wear-out after 700 days, times a per-node frailty (gamma, mean 1, CV 0.5); node-wide events
//! that take 2-8 GPUs at once; and a bad flash on one lot's nodes whose failures are
//! firmware-suspected. The defective lot fails at 5x.

use std::collections::BTreeSet;

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use orchestrator_rma::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const NODES: usize = 1_250;
const GPUS_PER_NODE: usize = 8;
const PERIOD_DAYS: f64 = 180.0;
const LOT_NODES: usize = 38;
/// Base hazard per GPU-day: with the age profile below a 300-GPU lot at 5x expects about 40
/// counted failures in the period (the Done-when asks for at least 30).
const BASE_HAZARD: f64 = 1.45e-4;
const NODE_EVENT_PROB: f64 = 0.04;
const DEFECT_FACTOR: f64 = 5.0;
const FLASH_DAY: f64 = 60.0;

fn start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).single().expect("valid")
}

fn at_day(day: f64) -> DateTime<Utc> {
    start() + TimeDelta::seconds((day * 86_400.0) as i64)
}

struct Fleet {
    parts: Vec<FleetPart>,
    failures: Vec<PartFailure>,
    /// Lot key (`part_number/lot`) of the defective lot, if any.
    defective: Option<String>,
    /// Expected counted failures of the defective lot.
    defective_expected: f64,
    /// Lot key of the lot that took the bad flash (at `FLASH_DAY`).
    flashed_lot: String,
}

fn hazard_multiplier(age: f64) -> f64 {
    1.0 + 2.0 * (-age / 60.0).exp() + (age - 700.0).max(0.0) / 600.0
}

/// Gamma(4, 1/4): mean 1, CV 0.5, as the sum of four exponentials.
fn frailty(rng: &mut ChaCha8Rng) -> f64 {
    (0..4).map(|_| -(1.0 - rng.random::<f64>()).ln()).sum::<f64>() / 4.0
}

fn simulate(seed: u64, defective_lot: bool) -> Fleet {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // Nodes: age at the end of the period, platform, frailty.
    let mut nodes: Vec<(f64, &str, f64)> = (0..NODES)
        .map(|_| {
            let age_end = rng.random::<f64>() * 1_100.0;
            let platform = if rng.random::<f64>() < 0.6 {
                "hgx-h100-a"
            } else {
                "hgx-h100-b"
            };
            (age_end, platform, frailty(&mut rng))
        })
        .collect();
    nodes.sort_by(|a, b| b.0.total_cmp(&a.0));
    // Lots in production order within each part number (older generation first).
    let mut lots: Vec<(String, String)> = Vec::with_capacity(NODES);
    let mut lot_index = 0;
    let mut in_lot = 0;
    let mut last_pn = "";
    for node in &nodes {
        let pn = if node.0 > 550.0 {
            "699-2G520-0200"
        } else {
            "699-2G520-0210"
        };
        if pn != last_pn || in_lot == LOT_NODES {
            lot_index += 1;
            in_lot = 0;
            last_pn = pn;
        }
        in_lot += 1;
        lots.push((pn.to_owned(), format!("L{lot_index:03}")));
    }
    // Lots in service for the whole period (installed before it began): the defective lot is one of
    // them, so that it expects at least 30 failures; the bad flash hits one of them too.
    let mut lot_sizes = std::collections::HashMap::new();
    for (pn, l) in &lots {
        *lot_sizes.entry(format!("{pn}/{l}")).or_insert(0) += 1;
    }
    let full_period: Vec<String> = nodes
        .iter()
        .zip(&lots)
        .map(|(n, (pn, l))| (n.0 >= PERIOD_DAYS, format!("{pn}/{l}")))
        .filter(|(_, key)| lot_sizes.get(key) == Some(&LOT_NODES))
        .fold(BTreeSet::new(), |mut all, (full, key)| {
            all.insert((key, full));
            all
        })
        .into_iter()
        .fold(Vec::<(String, bool)>::new(), |mut acc, (key, full)| {
            match acc.last_mut() {
                Some(last) if last.0 == key => last.1 &= full,
                _ => acc.push((key, full)),
            }
            acc
        })
        .into_iter()
        .filter(|(_, full)| *full)
        .map(|(key, _)| key)
        .collect();
    let defective = defective_lot.then(|| full_period[rng.random_range(0..full_period.len())].clone());
    let flashed_lot = full_period[rng.random_range(0..full_period.len())].clone();
    let flash_day = FLASH_DAY;

    let mut parts = Vec::with_capacity(NODES * GPUS_PER_NODE);
    let mut failures = Vec::new();
    let mut defective_expected = 0.0;
    for (n, ((age_end, platform, frail), (pn, lot))) in nodes.iter().zip(&lots).enumerate() {
        let node = format!("node-{n:04}");
        let lot_key = format!("{pn}/{lot}");
        let exposure = age_end.min(PERIOD_DAYS);
        let age_start = (age_end - PERIOD_DAYS).max(0.0);
        let installed_day = PERIOD_DAYS - exposure;
        let week = ((1_200.0 - age_end) / 7.0) as u32;
        let pn_digit = if pn.ends_with("0200") { 0 } else { 1 };
        let node_event = rng.random::<f64>() < NODE_EVENT_PROB;
        let event_day = installed_day + rng.random::<f64>() * exposure;
        let event_gpus = rng.random_range(2..=GPUS_PER_NODE);
        let factor = if defective.as_deref() == Some(lot_key.as_str()) {
            DEFECT_FACTOR
        } else {
            1.0
        };
        for g in 0..GPUS_PER_NODE {
            let serial = format!("{pn_digit}{week:03}{n:04}{g}");
            let mid_age = age_start + exposure / 2.0;
            let rate = BASE_HAZARD * hazard_multiplier(mid_age) * frail * factor;
            let p_fail = 1.0 - (-rate * exposure).exp();
            if factor > 1.0 {
                defective_expected += 1.0 - (-BASE_HAZARD * hazard_multiplier(mid_age) * factor * exposure).exp();
            }
            if rng.random::<f64>() < p_fail {
                failures.push(PartFailure {
                    serial: serial.clone(),
                    at: at_day(installed_day + rng.random::<f64>() * exposure),
                    firmware_suspected: false,
                });
            }
            if node_event && g < event_gpus {
                // All at once (seconds apart): one system-level incident.
                failures.push(PartFailure {
                    serial: serial.clone(),
                    at: at_day(event_day) + TimeDelta::seconds(g as i64 * 7),
                    firmware_suspected: false,
                });
            }
            if lot_key == flashed_lot && installed_day < flash_day && rng.random::<f64>() < 0.12 {
                failures.push(PartFailure {
                    serial: serial.clone(),
                    at: at_day(flash_day + rng.random::<f64>() * 2.0),
                    firmware_suspected: true,
                });
            }
            parts.push(FleetPart {
                serial,
                node: node.clone(),
                part_number: pn.clone(),
                lot: Some(lot.clone()),
                platform: (*platform).to_owned(),
                age_days: age_start,
                exposure_days: exposure,
            });
        }
    }
    Fleet {
        parts,
        failures,
        defective,
        defective_expected,
        flashed_lot,
    }
}

fn config() -> ClusterConfig {
    ClusterConfig {
        // Plant digit + the first two digits of the production week: ten-week ranges.
        serial_prefix_len: 3,
        ..ClusterConfig::default()
    }
}

#[test]
fn healthy_fleets_rarely_report_a_cluster() {
    let fleets = std::env::var("RMA_SIM_FLEETS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300u64)
        .max(300);
    let mut with_cluster = 0;
    let mut groups_tested = Vec::new();
    for seed in 0..fleets {
        let fleet = simulate(1_000 + seed, false);
        let report = scan(&fleet.parts, &fleet.failures, &config()).expect("scan");
        assert!(report.firmware_suspected_excluded > 0 && report.system_incidents > 0);
        groups_tested.push(report.groups_tested);
        if !report.clusters.is_empty() {
            with_cluster += 1;
            eprintln!(
                "seed {seed}: false cluster {:?}",
                report.clusters.iter().map(|c| &c.test).collect::<Vec<_>>()
            );
        }
    }
    let (lo, hi) = (groups_tested.iter().min().copied(), groups_tested.iter().max().copied());
    eprintln!("healthy fleets: {with_cluster}/{fleets} reported a cluster; groups tested per fleet {lo:?}..{hi:?}");
    assert!(
        with_cluster <= 3,
        "{with_cluster} of {fleets} healthy fleets reported a cluster"
    );
}

#[test]
fn a_defective_lot_is_found_as_the_most_specific_group() {
    let fleets = 100;
    let mut found = 0;
    let mut extra = 0;
    let mut expected = Vec::new();
    let mut ratios = Vec::new();
    for seed in 0..fleets {
        let fleet = simulate(50_000 + seed, true);
        let lot = fleet.defective.clone().expect("defective lot");
        expected.push(fleet.defective_expected);
        let report = scan(&fleet.parts, &fleet.failures, &config()).expect("scan");
        let is_lot = |k: &GroupKey| k.attribute == Attribute::Lot && k.value == lot;
        let hit = report
            .clusters
            .iter()
            .find(|c| is_lot(&c.test.group) || c.test.aliases.iter().any(is_lot));
        if let Some(c) = hit {
            found += 1;
            ratios.push(c.test.rate_ratio.unwrap_or(f64::NAN));
            // Its interval is finite and excludes 1.
            assert!(c.test.ci95_lower.is_some_and(|l| l > 1.0), "{:?}", c.test);
            assert!(c.test.ci95_upper.is_some());
            assert!(!c.failed_serials.is_empty());
            // No reported cluster is a parent of the lot with the lot still in it.
            for other in report.clusters.iter().filter(|o| !std::ptr::eq(*o, c)) {
                assert!(
                    !c.parents.contains(&other.test.group) || other.excluding.iter().any(is_lot),
                    "parent {:?} reported as a second cluster",
                    other.test.group
                );
            }
        } else {
            let t = report
                .tests
                .iter()
                .find(|t| is_lot(&t.group) || t.aliases.iter().any(is_lot));
            eprintln!(
                "seed {seed}: lot {lot} missed (failures {:?}, expected {:?}, p {:?}); clusters {:?}",
                t.map(|t| t.failures),
                t.map(|t| t.expected),
                t.map(|t| t.p_value),
                report.clusters.iter().map(|c| &c.test.group).collect::<Vec<_>>()
            );
        }
        extra += report.clusters.len().saturating_sub(usize::from(hit.is_some()));
    }
    expected.sort_by(f64::total_cmp);
    ratios.sort_by(f64::total_cmp);
    eprintln!(
        "defective lot found in {found}/{fleets} fleets; other clusters reported: {extra}; lot expected failures min {:.1} median {:.1}; rate ratio median {:.2}",
        expected[0],
        expected[expected.len() / 2],
        ratios.get(ratios.len() / 2).copied().unwrap_or(f64::NAN)
    );
    assert!(
        expected[0] >= 30.0,
        "the fleet must give the lot at least 30 expected failures"
    );
    assert!(found >= 95, "lot found in only {found} of {fleets}");
}

const NVIDIA: &str = include_str!("../../../policies/rma/nvidia-gpu.yaml");

/// End to end on one simulated fleet: every failure shows as three XID 79s within hours and a
/// failed field diagnostic the next day; healthy GPUs show scattered single XID 79s; the flashed
/// lot's GPUs carry the flash in their firmware history. Every failed GPU (and no other) becomes a
/// candidate naming its serial and samples; the bad flash's failures are firmware-suspected; the
/// candidates, as failures, show the defective lot with its rate ratio and interval.
#[test]
fn end_to_end_candidates_to_cluster_report() {
    let fleet = simulate(777, true);
    let lot = fleet.defective.clone().expect("defective lot");
    let criteria = vec![parse_criteria(NVIDIA).expect("valid criteria")];
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let mut observations: std::collections::HashMap<&str, Vec<Observation>> = std::collections::HashMap::new();
    for f in &fleet.failures {
        let obs = observations.entry(f.serial.as_str()).or_default();
        for k in 0..3 {
            let at = f.at + TimeDelta::minutes(k * 90);
            obs.push(Observation {
                at,
                source_id: format!(
                    "redfish/Systems/1/LogServices/SEL/Entries/{}-{}",
                    f.serial,
                    at.timestamp()
                ),
                kind: ObservationKind::Xid { code: 79 },
            });
        }
        obs.push(Observation {
            at: f.at + TimeDelta::days(1),
            source_id: format!("upload/fielddiag-{}.log", f.serial),
            kind: ObservationKind::FieldDiagnostic { passed: false },
        });
    }
    // Scattered noise: one XID 79 on about 5% of GPUs, below the rule's three a day.
    for p in &fleet.parts {
        if rng.random::<f64>() < 0.05 {
            observations.entry(p.serial.as_str()).or_default().push(Observation {
                at: at_day(rng.random::<f64>() * PERIOD_DAYS),
                source_id: format!("noise/{}", p.serial),
                kind: ObservationKind::Xid { code: 79 },
            });
        }
    }
    let now = at_day(PERIOD_DAYS + 2.0);
    let mut candidates = Vec::new();
    for p in &fleet.parts {
        let record = PartRecord {
            serial: p.serial.clone(),
            vendor: "nvidia".into(),
            part_kind: "gpu".into(),
            part_number: p.part_number.clone(),
            node: p.node.clone(),
            slot: "GPU".into(),
        };
        let lot_key = p.lot.as_ref().map(|l| format!("{}/{l}", p.part_number));
        let firmware = if lot_key.as_deref() == Some(fleet.flashed_lot.as_str()) {
            vec![FirmwareChange {
                at: at_day(FLASH_DAY),
                component: "gpu".into(),
                from_version: "96.00.5E.00.01".into(),
                to_version: "96.00.61.00.01".into(),
                release: "gpu-96.00.61".into(),
                rollout: Some("rollout-3".into()),
            }]
        } else {
            Vec::new()
        };
        let obs = observations.get(p.serial.as_str()).map_or(&[][..], |v| &v[..]);
        candidates.extend(find_candidates(&criteria, &record, obs, &firmware, now));
    }
    let failed: BTreeSet<&str> = fleet.failures.iter().map(|f| f.serial.as_str()).collect();
    let found: BTreeSet<&str> = candidates.iter().map(|c| c.part.serial.as_str()).collect();
    assert_eq!(found, failed, "every failed GPU and no other is a candidate");
    for c in &candidates {
        assert_eq!((c.rule.as_str(), c.status), ("fallen_off_bus", CandidateStatus::Met));
        assert!(
            c.samples.len() >= 4 && c.samples.iter().all(|s| s.source_id.contains(&c.part.serial)),
            "{c:?}"
        );
    }
    let suspected = candidates.iter().filter(|c| c.firmware_suspected.is_some()).count();
    // A GPU whose first failure came from the bad flash is firmware-suspected, naming the release.
    for c in &candidates {
        let first = fleet
            .failures
            .iter()
            .filter(|f| f.serial == c.part.serial)
            .min_by_key(|f| f.at)
            .expect("failure");
        if first.firmware_suspected {
            let fs = c.firmware_suspected.as_ref().expect("firmware-suspected");
            assert_eq!(
                (fs.change.release.as_str(), fs.change.rollout.as_deref()),
                ("gpu-96.00.61", Some("rollout-3"))
            );
        }
    }
    assert!(suspected > 0);

    let as_failures: Vec<PartFailure> = candidates
        .iter()
        .map(|c| PartFailure {
            serial: c.part.serial.clone(),
            at: c.began_at,
            firmware_suspected: c.firmware_suspected.is_some(),
        })
        .collect();
    let report = scan(&fleet.parts, &as_failures, &config()).expect("scan");
    assert_eq!(report.clusters.len(), 1, "{:?}", report.clusters);
    let cluster = &report.clusters[0];
    assert_eq!(
        (cluster.test.group.attribute, cluster.test.group.value.as_str()),
        (Attribute::Lot, lot.as_str())
    );
    let (ratio, lo, hi) = (
        cluster.test.rate_ratio.expect("ratio"),
        cluster.test.ci95_lower.expect("lower"),
        cluster.test.ci95_upper.expect("upper"),
    );
    assert!(lo > 1.0 && lo < ratio && ratio < hi, "{lo} {ratio} {hi}");
    assert!(!cluster.failed_serials.is_empty());
    eprintln!(
        "end to end: {} candidates ({} firmware-suspected), {} system incidents; cluster {} ratio {ratio:.2} [{lo:.2}, {hi:.2}], {} of {} groups",
        candidates.len(),
        suspected,
        report.system_incidents,
        cluster.test.group,
        report.clusters.len(),
        report.groups_tested
    );
    // The report exports as JSON for the vendor conversation.
    let json = serde_json::to_string(&report).expect("json");
    assert!(json.contains(&lot));
}
