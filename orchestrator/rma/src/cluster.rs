//! Defect clusters (manufacturing escapes): does a group of parts sharing an attribute (part number,
//! lot, serial prefix, platform SKU) fail faster than the rest of the fleet?
//!
//! Method (details and reasons in this crate's README):
//! 1. Failures whose part's firmware changed just before are left out (they may be the firmware's).
//! 2. Failures on one node within a coincidence window are one incident; an incident touching two or
//!    more parts points at the node (baseboard, power, cooling), not at a part, and is left out of
//!    the part statistics (NVIDIA's RMA process asks to rule out such system-level causes). Each
//!    part counts at most once: the statistic is the rate of *failed parts*.
//! 3. Every level of every attribute is a group; identical groups are tested once. Each is
//!    compared with the rest of the fleet within strata of age band and platform (a lot is built
//!    at one time, so infant mortality or wear-out would otherwise be blamed on it) by the exact
//!    conditional test of a common rate ratio: given each stratum's failures, the group's share is
//!    binomial with the exposure split, and the p-value is the tail of the sum over strata against
//!    the smallest ratio that matters. With one stratum this is the detector's two-rate test
//!    (`orchestrator_detect::stats::poisson_rate_test`), which it calls. The estimate is the
//!    Mantel-Haenszel rate ratio, the interval the exact one from inverting the same test.
//! 4. Holm's step-down procedure over every group tested controls the family-wise error rate under
//!    any dependence (the groups overlap).
//! 5. Of rejected groups, the most specific are reported (attribute order: lot, serial prefix, part
//!    number, platform): a coarser rejected group sharing parts with a reported one is its parent,
//!    not a second cluster, unless its remainder (without the more specific rejected groups) is
//!    itself significant at the Bonferroni level `alpha / m`.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, TimeDelta, Utc};
use orchestrator_detect::stats::{binom_sf_ge, poisson_rate_test};
use serde::Serialize;
use statrs::distribution::{Binomial, Discrete};

/// A part attribute that groups parts. Declared from most to least specific: identical groups keep
/// the most specific name, and reports prefer it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Attribute {
    /// Manufacturing lot or date code (from the parts manifest), within a part number.
    Lot,
    /// Leading characters of the serial number (often plant and production week).
    SerialPrefix,
    /// Vendor part number.
    PartNumber,
    /// Platform SKU of the node.
    Platform,
}

/// One group: an attribute and its value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct GroupKey {
    /// The attribute.
    pub attribute: Attribute,
    /// Its value (for a lot: `part_number/lot`).
    pub value: String,
}

impl std::fmt::Display for GroupKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} {}", self.attribute, self.value)
    }
}

/// One part of the fleet over the period.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetPart {
    /// Serial number.
    pub serial: String,
    /// Node it is in.
    pub node: String,
    /// Part number.
    pub part_number: String,
    /// Lot or date code, when the manifest has one.
    pub lot: Option<String>,
    /// Platform SKU of the node.
    pub platform: String,
    /// Age in days at the start of the period (from `ProductionDate` or installation).
    pub age_days: f64,
    /// Days in service during the period.
    pub exposure_days: f64,
}

/// One failure of one part in the period.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PartFailure {
    /// Serial of the failed part.
    pub serial: String,
    /// When it began.
    pub at: DateTime<Utc>,
    /// Began right after a firmware change (left out).
    pub firmware_suspected: bool,
}

/// Parameters of the scan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterConfig {
    /// Family-wise error rate over all groups of one period.
    pub alpha: f64,
    /// Smallest rate ratio worth a vendor claim; the test is of `ratio <= min_rate_ratio`. Above 1
    /// it also absorbs what the Poisson model ignores (node-to-node variation, residual age effects
    /// within a band), which would otherwise inflate false clusters in a large fleet.
    pub min_rate_ratio: f64,
    /// A group needs at least this many failed parts to be a cluster (a handful of failures cannot
    /// carry a vendor conversation; removing rejections keeps the error rate within alpha).
    pub min_failures: u64,
    /// Groups with fewer parts are not tested (decided before looking at failures).
    pub min_group_parts: usize,
    /// Characters of the serial number that form its prefix group; 0 turns the attribute off.
    pub serial_prefix_len: usize,
    /// Upper edges of the age bands in days (ascending), applied to the age at the middle of each
    /// part's exposure; the last band is open. Infant mortality and wear-out are the age effects a
    /// lot (built at one time) would otherwise be blamed for; more bands mean smaller comparison
    /// groups and less power.
    pub age_band_edges_days: Vec<f64>,
    /// Failures on one node closer than this are one incident.
    pub coincidence_window: TimeDelta,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            alpha: 0.01,
            min_rate_ratio: 1.25,
            min_failures: 5,
            min_group_parts: 30,
            serial_prefix_len: 5,
            age_band_edges_days: vec![60.0, 180.0, 365.0, 730.0],
            coincidence_window: TimeDelta::hours(1),
        }
    }
}

/// Input that cannot be scanned.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClusterError {
    /// A parameter is out of range.
    #[error("cluster scan parameter {name} = {value} is invalid: {expected}")]
    Parameter {
        /// Which.
        name: &'static str,
        /// Value given.
        value: f64,
        /// What is accepted.
        expected: &'static str,
    },
    /// A part's exposure or age is negative or not finite.
    #[error("part {serial}: {field} = {value} must be finite and >= 0")]
    Part {
        /// Serial.
        serial: String,
        /// Which field.
        field: &'static str,
        /// Value given.
        value: f64,
    },
    /// A serial appears twice in the fleet.
    #[error("serial {serial} appears twice in the fleet")]
    DuplicateSerial {
        /// Serial.
        serial: String,
    },
}

/// The test of one group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupTest {
    /// The group.
    pub group: GroupKey,
    /// Other names of the same set of parts.
    pub aliases: Vec<GroupKey>,
    /// Parts in it.
    pub parts: usize,
    /// Failed parts counted (in strata where the rest of the fleet has parts to compare with).
    pub failures: u64,
    /// Failures expected at the rest of the fleet's rates, stratum by stratum.
    pub expected: f64,
    /// Standardised rate ratio, group over rest; None when the rest had no failures.
    pub rate_ratio: Option<f64>,
    /// Exact 95% interval of the ratio.
    pub ci95_lower: Option<f64>,
    /// Upper end; None when unbounded.
    pub ci95_upper: Option<f64>,
    /// One-sided p-value against `min_rate_ratio`.
    pub p_value: f64,
    /// Holm-adjusted p-value (compare with alpha).
    pub adjusted_p: f64,
    /// Rejected by Holm.
    pub rejected: bool,
}

/// A reported cluster.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cluster {
    /// The test that found it (for a remainder: the remainder's test).
    pub test: GroupTest,
    /// Rejected groups inside it that were taken out before testing it (empty unless a remainder).
    pub excluding: Vec<GroupKey>,
    /// Rejected coarser groups that contain or overlap it (flagged because of it, not separate
    /// clusters).
    pub parents: Vec<GroupKey>,
    /// Serials of its failed parts, sorted.
    pub failed_serials: Vec<String>,
}

/// The outcome of one scan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterReport {
    /// Groups tested (the size of the family Holm controls).
    pub groups_tested: usize,
    /// The configuration used.
    pub config: ClusterConfig,
    /// Failed parts counted.
    pub counted_failures: u64,
    /// Failures left out as firmware-suspected.
    pub firmware_suspected_excluded: usize,
    /// Multi-part incidents left out as system-level.
    pub system_incidents: usize,
    /// Failures inside those incidents.
    pub system_incident_failures: usize,
    /// Failures whose serial is not in the fleet (ignored; the inventory is behind).
    pub unknown_serials: usize,
    /// The clusters, most significant first.
    pub clusters: Vec<Cluster>,
    /// Every group test, by p-value (the export for the vendor conversation).
    pub tests: Vec<GroupTest>,
}

struct Group {
    key: GroupKey,
    aliases: Vec<GroupKey>,
    members: Vec<u32>,
}

fn validate(config: &ClusterConfig, parts: &[FleetPart]) -> Result<(), ClusterError> {
    if !(config.alpha > 0.0 && config.alpha < 1.0) {
        return Err(ClusterError::Parameter {
            name: "alpha",
            value: config.alpha,
            expected: "0 < alpha < 1",
        });
    }
    if !(config.min_rate_ratio >= 1.0 && config.min_rate_ratio.is_finite()) {
        return Err(ClusterError::Parameter {
            name: "min_rate_ratio",
            value: config.min_rate_ratio,
            expected: "finite and >= 1",
        });
    }
    if config.age_band_edges_days.windows(2).any(|w| w[0] >= w[1])
        || config.age_band_edges_days.iter().any(|e| !e.is_finite())
    {
        return Err(ClusterError::Parameter {
            name: "age_band_edges_days",
            value: f64::NAN,
            expected: "finite and strictly ascending",
        });
    }
    let mut seen = std::collections::HashSet::with_capacity(parts.len());
    for p in parts {
        for (field, value) in [("exposure_days", p.exposure_days), ("age_days", p.age_days)] {
            if !(value >= 0.0 && value.is_finite()) {
                return Err(ClusterError::Part {
                    serial: p.serial.clone(),
                    field,
                    value,
                });
            }
        }
        if !seen.insert(p.serial.as_str()) {
            return Err(ClusterError::DuplicateSerial {
                serial: p.serial.clone(),
            });
        }
    }
    Ok(())
}

/// Which parts count as failed, after leaving out firmware-suspected failures and multi-part
/// incidents. Returns the per-part flag and the counts left out.
fn counted_failures(
    parts: &[FleetPart],
    index: &HashMap<&str, u32>,
    failures: &[PartFailure],
    window: TimeDelta,
) -> (Vec<bool>, usize, usize, usize, usize) {
    let mut failed = vec![false; parts.len()];
    let mut fw = 0;
    let mut unknown = 0;
    let mut by_node: BTreeMap<&str, Vec<(DateTime<Utc>, u32)>> = BTreeMap::new();
    for f in failures {
        let Some(&i) = index.get(f.serial.as_str()) else {
            unknown += 1;
            continue;
        };
        if f.firmware_suspected {
            fw += 1;
            continue;
        }
        by_node
            .entry(parts[i as usize].node.as_str())
            .or_default()
            .push((f.at, i));
    }
    let (mut incidents, mut incident_failures) = (0, 0);
    for events in by_node.values_mut() {
        events.sort();
        let mut start = 0;
        while start < events.len() {
            // Chain failures closer than the window into one incident.
            let mut end = start + 1;
            while end < events.len() && events[end].0 - events[end - 1].0 <= window {
                end += 1;
            }
            let mut distinct: Vec<u32> = events[start..end].iter().map(|e| e.1).collect();
            distinct.sort_unstable();
            distinct.dedup();
            if distinct.len() >= 2 {
                incidents += 1;
                incident_failures += end - start;
            } else {
                failed[distinct[0] as usize] = true;
            }
            start = end;
        }
    }
    (failed, fw, incidents, incident_failures, unknown)
}

fn band(edges: &[f64], age: f64) -> usize {
    edges.iter().position(|e| age < *e).unwrap_or(edges.len())
}

/// Each part's stratum (age band, plus platform when `with_platform`) and the fleet's failures and
/// exposure per stratum.
struct Strata {
    of_part: Vec<usize>,
    failures: Vec<u64>,
    exposure: Vec<f64>,
}

impl Strata {
    fn new(parts: &[FleetPart], failed: &[bool], edges: &[f64], with_platform: bool) -> Strata {
        let mut ids: HashMap<(usize, &str), usize> = HashMap::new();
        let mut of_part = Vec::with_capacity(parts.len());
        let (mut failures, mut exposure) = (Vec::new(), Vec::new());
        for (p, f) in parts.iter().zip(failed) {
            // The age that matters is the age the part had while exposed, so the band is taken at
            // the middle of its exposure (a part installed mid-period is young all through it).
            let key = (
                band(edges, p.age_days + p.exposure_days / 2.0),
                if with_platform { p.platform.as_str() } else { "" },
            );
            let next = ids.len();
            let id = *ids.entry(key).or_insert(next);
            if id == failures.len() {
                failures.push(0);
                exposure.push(0.0);
            }
            failures[id] += u64::from(*f);
            exposure[id] += p.exposure_days;
            of_part.push(id);
        }
        Strata {
            of_part,
            failures,
            exposure,
        }
    }
}

fn groups(parts: &[FleetPart], config: &ClusterConfig) -> Vec<Group> {
    let mut by_key: BTreeMap<GroupKey, Vec<u32>> = BTreeMap::new();
    for (i, p) in parts.iter().enumerate() {
        let i = i as u32;
        let mut add = |attribute, value: String| by_key.entry(GroupKey { attribute, value }).or_default().push(i);
        add(Attribute::PartNumber, p.part_number.clone());
        add(Attribute::Platform, p.platform.clone());
        if let Some(lot) = &p.lot {
            add(Attribute::Lot, format!("{}/{lot}", p.part_number));
        }
        if config.serial_prefix_len > 0 && p.serial.chars().count() > config.serial_prefix_len {
            add(
                Attribute::SerialPrefix,
                p.serial.chars().take(config.serial_prefix_len).collect(),
            );
        }
    }
    // Identical member sets are one hypothesis; BTreeMap order puts the most specific name first.
    let mut by_members: BTreeMap<Vec<u32>, Group> = BTreeMap::new();
    for (key, members) in by_key {
        if members.len() < config.min_group_parts || members.len() == parts.len() {
            continue;
        }
        match by_members.get_mut(&members) {
            Some(g) => g.aliases.push(key),
            None => {
                by_members.insert(
                    members.clone(),
                    Group {
                        key,
                        aliases: Vec::new(),
                        members,
                    },
                );
            }
        }
    }
    let mut out: Vec<Group> = by_members.into_values().collect();
    out.sort_by(|a, b| a.key.cmp(&b.key));
    out
}

/// One stratum of a comparison: failures on both sides and each side's exposure.
#[derive(Debug, Clone, Copy)]
struct Stratum {
    events: u64,
    set_exposure: f64,
    rest_exposure: f64,
}

/// `P(X >= x)` where `X` is the set's failure count summed over strata and, conditional on each
/// stratum's total, `X_s ~ Binomial(n_s, r e_set / (r e_set + e_rest))`: the exact conditional test
/// of "the set's rate is at most `ratio` times the rest's in every stratum". The distribution is
/// convolved only up to `x` (everything at or above `x` in one bucket), so the cost is
/// O(strata * x * min(n_s, x)).
fn stratified_sf(x: u64, table: &[Stratum], ratio: f64) -> f64 {
    if x == 0 {
        return 1.0;
    }
    let total: u64 = table.iter().map(|s| s.events).sum();
    if x > total {
        return 0.0;
    }
    if let [only] = table {
        // One stratum: exactly the detector's two-rate test.
        return poisson_rate_test(x, only.set_exposure, only.events - x, only.rest_exposure, ratio);
    }
    let cap = usize::try_from(x).unwrap_or(usize::MAX);
    let mut dist = vec![0.0_f64; cap + 1];
    dist[0] = 1.0;
    for st in table.iter().filter(|s| s.events > 0) {
        let p = (ratio * st.set_exposure / (ratio * st.set_exposure + st.rest_exposure)).clamp(0.0, 1.0);
        let Ok(b) = Binomial::new(p, st.events) else {
            return 1.0;
        };
        // The pmf below the cap, and the tail at the cap taken exactly (not as 1 - sum, which
        // would lose the small tails that decisions use).
        let pmf: Vec<f64> = if st.events < cap as u64 {
            (0..=st.events).map(|k| b.pmf(k)).collect()
        } else {
            (0..cap as u64)
                .map(|k| b.pmf(k))
                .chain(std::iter::once(binom_sf_ge(cap as u64, st.events, p)))
                .collect()
        };
        let mut next = vec![0.0_f64; cap + 1];
        for (i, &d) in dist.iter().enumerate().filter(|(_, d)| **d > 0.0) {
            for (k, &q) in pmf.iter().enumerate() {
                next[(i + k).min(cap)] += d * q;
            }
        }
        dist = next;
    }
    dist[cap].clamp(0.0, 1.0)
}

/// The `r` where `f(r)`, increasing in `r`, crosses `target` (bisection on ln r over e^-20..e^20);
/// `None` when it does not cross there (an unbounded ratio).
fn solve_ratio(f: impl Fn(f64) -> f64, target: f64) -> Option<f64> {
    let (mut lo, mut hi) = (-20.0_f64, 20.0_f64);
    if f(lo.exp()) > target || f(hi.exp()) < target {
        return None;
    }
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if f(mid.exp()) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some((0.5 * (lo + hi)).exp())
}

/// Exact 95% interval for the common rate ratio, by inverting the stratified test in each tail:
/// the lower bound is where `P(X >= x)` reaches 2.5%, the upper where `P(X <= x)` falls to 2.5%.
fn stratified_interval(x: u64, table: &[Stratum]) -> (Option<f64>, Option<f64>) {
    let total: u64 = table.iter().map(|s| s.events).sum();
    let lower = if x == 0 {
        Some(0.0)
    } else {
        solve_ratio(|r| stratified_sf(x, table, r), 0.025)
    };
    let upper = if x >= total {
        None
    } else {
        solve_ratio(|r| stratified_sf(x + 1, table, r), 0.975)
    };
    (lower, upper)
}

/// The comparison of a set of parts with the rest of the fleet (minus `excluded`), stratum by
/// stratum (age band, platform), so that a set that is younger or sits on another platform is
/// compared with like parts and its own failures never inflate the rate it is compared with. The
/// test is the exact conditional test of [`stratified_sf`] (the detector's two-rate test when there
/// is one stratum); the estimate is the Mantel-Haenszel rate ratio; `expected` is the set's
/// exposure at the rest's rates per stratum.
fn make_test(
    group: &Group,
    members: &[u32],
    excluded: Option<&[bool]>,
    parts: &[FleetPart],
    failed: &[bool],
    strata: &Strata,
    config: &ClusterConfig,
) -> (GroupTest, Vec<Stratum>) {
    let n = strata.failures.len();
    // Per stratum: the set's failures and exposure, and those of the parts left out of the comparison.
    let (mut set_f, mut set_e) = (vec![0u64; n], vec![0.0_f64; n]);
    let (mut out_f, mut out_e) = (vec![0u64; n], vec![0.0_f64; n]);
    for &i in members {
        let i = i as usize;
        set_f[strata.of_part[i]] += u64::from(failed[i]);
        set_e[strata.of_part[i]] += parts[i].exposure_days;
    }
    if let Some(excluded) = excluded {
        for (i, _) in excluded.iter().enumerate().filter(|(_, x)| **x) {
            out_f[strata.of_part[i]] += u64::from(failed[i]);
            out_e[strata.of_part[i]] += parts[i].exposure_days;
        }
    }
    let mut table = Vec::with_capacity(n);
    let (mut failures, mut expected) = (0u64, 0.0_f64);
    let (mut mh_num, mut mh_den) = (0.0_f64, 0.0_f64);
    for s in 0..n {
        let rest_f = strata.failures[s].saturating_sub(set_f[s] + out_f[s]);
        let rest_e = strata.exposure[s] - set_e[s] - out_e[s];
        // A stratum with no comparable parts on one side says nothing about the set's rate: it
        // leaves the comparison on both sides (an age band holding only one part number).
        if rest_e <= 0.0 || set_e[s] <= 0.0 {
            continue;
        }
        failures += set_f[s];
        expected += set_e[s] * rest_f as f64 / rest_e;
        let total_e = set_e[s] + rest_e;
        mh_num += set_f[s] as f64 * rest_e / total_e;
        mh_den += rest_f as f64 * set_e[s] / total_e;
        table.push(Stratum {
            events: set_f[s] + rest_f,
            set_exposure: set_e[s],
            rest_exposure: rest_e,
        });
    }
    let p = stratified_sf(failures, &table, config.min_rate_ratio);
    let rate_ratio = (mh_den > 0.0).then(|| mh_num / mh_den).filter(|r| r.is_finite());
    let test = GroupTest {
        group: group.key.clone(),
        aliases: group.aliases.clone(),
        parts: members.len(),
        failures,
        expected,
        rate_ratio,
        // Filled in for clusters only: inverting the stratified test costs dozens of evaluations.
        ci95_lower: None,
        ci95_upper: None,
        // A group below the failure floor cannot be a cluster: its p-value is taken as 1, which
        // only removes rejections.
        p_value: if failures >= config.min_failures { p } else { 1.0 },
        adjusted_p: 1.0,
        rejected: false,
    };
    (test, table)
}

/// Fills in the exact interval of a reported cluster.
fn with_interval(mut test: GroupTest, table: &[Stratum]) -> GroupTest {
    (test.ci95_lower, test.ci95_upper) = stratified_interval(test.failures, table);
    test
}

/// Size of the intersection of two sorted sets.
fn intersection(a: &[u32], b: &[u32]) -> usize {
    let (mut i, mut j, mut n) = (0, 0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                n += 1;
                i += 1;
                j += 1;
            }
        }
    }
    n
}

/// Whether rejected group `h` is more specific than rejected group `g` and shares parts with it.
/// Specificity follows the attribute order (lot, serial prefix, part number, platform): a lot is
/// the unit a vendor traces a defect to, so a lot is reported rather than a serial range inside
/// it or the part number around it.
fn is_child(h: &Group, g: &Group) -> bool {
    h.key.attribute < g.key.attribute && intersection(&h.members, &g.members) > 0
}

/// Scans one period of the fleet for defect clusters. Run it on fixed, non-overlapping periods:
/// each scan spends the whole alpha once (repeated scans over overlapping data would need alpha
/// spending across scans).
pub fn scan(
    parts: &[FleetPart],
    failures: &[PartFailure],
    config: &ClusterConfig,
) -> Result<ClusterReport, ClusterError> {
    validate(config, parts)?;
    let index: HashMap<&str, u32> = parts
        .iter()
        .enumerate()
        .map(|(i, p)| (p.serial.as_str(), i as u32))
        .collect();
    let (failed, fw, system_incidents, system_incident_failures, unknown) =
        counted_failures(parts, &index, failures, config.coincidence_window);
    let with_platform = Strata::new(parts, &failed, &config.age_band_edges_days, true);
    let without_platform = Strata::new(parts, &failed, &config.age_band_edges_days, false);
    let counted = failed.iter().filter(|f| **f).count() as u64;
    // Testing platform SKUs under platform stratification would compare each SKU with itself.
    let strata_for = |g: &Group| {
        if g.key.attribute == Attribute::Platform {
            &without_platform
        } else {
            &with_platform
        }
    };

    let groups = groups(parts, config);
    let (mut tests, tables): (Vec<(usize, GroupTest)>, Vec<Vec<Stratum>>) = groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let (test, table) = make_test(g, &g.members, None, parts, &failed, strata_for(g), config);
            ((i, test), table)
        })
        .unzip();
    let m = tests.len();
    // Holm: step down through the sorted p-values; adjusted p is the running maximum of (m-k)p.
    tests.sort_by(|a, b| a.1.p_value.total_cmp(&b.1.p_value).then(a.1.group.cmp(&b.1.group)));
    let mut running = 0.0_f64;
    let mut still_rejecting = true;
    for (k, (_, t)) in tests.iter_mut().enumerate() {
        running = running.max(((m - k) as f64 * t.p_value).min(1.0));
        t.adjusted_p = running;
        still_rejecting &= t.p_value <= config.alpha / (m - k) as f64;
        t.rejected = still_rejecting;
    }

    let rejected: Vec<usize> = tests.iter().filter(|(_, t)| t.rejected).map(|(i, _)| *i).collect();
    let failed_serials = |members: &[u32]| {
        let mut s: Vec<String> = members
            .iter()
            .filter(|&&i| failed[i as usize])
            .map(|&i| parts[i as usize].serial.clone())
            .collect();
        s.sort();
        s
    };
    let mut clusters = Vec::new();
    for (i, t) in tests.iter().filter(|(_, t)| t.rejected) {
        let g = &groups[*i];
        let children: Vec<usize> = rejected
            .iter()
            .copied()
            .filter(|&j| j != *i && is_child(&groups[j], g))
            .collect();
        let parents: Vec<GroupKey> = rejected
            .iter()
            .filter(|&&j| j != *i && is_child(g, &groups[j]))
            .map(|&j| groups[j].key.clone())
            .collect();
        if children.is_empty() {
            clusters.push(Cluster {
                test: with_interval(t.clone(), &tables[*i]),
                excluding: Vec::new(),
                parents,
                failed_serials: failed_serials(&g.members),
            });
            continue;
        }
        // A parent of a cluster (or a coarser group overlapping it) is a cluster of its own only if
        // what remains without the more specific rejected groups still fails faster than the rest
        // of the fleet. The remainder is an extra hypothesis, tested at the Bonferroni level.
        let mut inside = vec![false; parts.len()];
        for &j in &children {
            for &x in &groups[j].members {
                inside[x as usize] = true;
            }
        }
        let remainder: Vec<u32> = g.members.iter().copied().filter(|&x| !inside[x as usize]).collect();
        if remainder.len() < config.min_group_parts {
            continue;
        }
        // The children leave the comparison entirely: they are neither the remainder nor "the rest".
        let (mut rt, table) = make_test(g, &remainder, Some(&inside), parts, &failed, strata_for(g), config);
        rt.adjusted_p = (rt.p_value * m as f64).min(1.0);
        rt.rejected = rt.p_value <= config.alpha / m as f64;
        if rt.rejected {
            clusters.push(Cluster {
                failed_serials: failed_serials(&remainder),
                test: with_interval(rt, &table),
                excluding: children.iter().map(|&j| groups[j].key.clone()).collect(),
                parents,
            });
        }
    }
    Ok(ClusterReport {
        groups_tested: m,
        config: config.clone(),
        counted_failures: counted,
        firmware_suspected_excluded: fw,
        system_incidents,
        system_incident_failures,
        unknown_serials: unknown,
        clusters,
        tests: tests.into_iter().map(|(_, t)| t).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(events: u64, set_exposure: f64, rest_exposure: f64) -> Stratum {
        Stratum {
            events,
            set_exposure,
            rest_exposure,
        }
    }

    #[test]
    fn one_stratum_is_the_detector_test() {
        let t = [st(40, 300.0, 9_700.0)];
        assert_eq!(
            stratified_sf(12, &t, 1.25),
            poisson_rate_test(12, 300.0, 28, 9_700.0, 1.25)
        );
        assert_eq!(stratified_sf(41, &t, 1.0), 0.0);
        assert_eq!(stratified_sf(0, &t, 1.0), 1.0);
    }

    #[test]
    fn two_strata_match_brute_force() {
        // X = X1 + X2, X1 ~ Bin(3, p1), X2 ~ Bin(4, p2), enumerated by hand.
        let t = [st(3, 1.0, 3.0), st(4, 2.0, 2.0)];
        let r = 1.5;
        let p1 = r * 1.0 / (r * 1.0 + 3.0);
        let p2 = r * 2.0 / (r * 2.0 + 2.0);
        let choose = |n: u64, k: u64| (1..=k).fold(1.0, |acc, i| acc * (n - k + i) as f64 / i as f64);
        let pmf = |n: u64, p: f64, k: u64| choose(n, k) * p.powi(k as i32) * (1.0 - p).powi((n - k) as i32);
        for x in 0..=8 {
            let mut want = 0.0;
            for a in 0..=3 {
                for b in 0..=4 {
                    if a + b >= x {
                        want += pmf(3, p1, a) * pmf(4, p2, b);
                    }
                }
            }
            let got = stratified_sf(x, &t, r);
            assert!((got - want).abs() < 1e-12, "x = {x}: {got} vs {want}");
        }
    }

    #[test]
    fn interval_brackets_the_estimate_and_matches_one_stratum() {
        // One stratum: the same as the detector's Clopper-Pearson based interval.
        let t = [st(50, 300.0, 9_700.0)];
        let (lo, hi) = stratified_interval(20, &t);
        let want = orchestrator_detect::stats::rate_ratio_interval(20, 300.0, 30, 9_700.0, 0.025, 0.025);
        assert!((lo.expect("lower") / want.lower.expect("lower") - 1.0).abs() < 1e-6);
        assert!((hi.expect("upper") / want.upper.expect("upper") - 1.0).abs() < 1e-6);
        // All failures in the set: no upper bound.
        assert_eq!(stratified_interval(50, &t).1, None);
    }

    #[test]
    fn invalid_input_is_refused() {
        let part = |serial: &str, exposure_days: f64| FleetPart {
            serial: serial.into(),
            node: "n".into(),
            part_number: "pn".into(),
            lot: None,
            platform: "p".into(),
            age_days: 1.0,
            exposure_days,
        };
        let c = ClusterConfig::default();
        assert!(matches!(
            scan(&[part("a", f64::NAN)], &[], &c),
            Err(ClusterError::Part { .. })
        ));
        assert!(matches!(
            scan(&[part("a", 1.0), part("a", 1.0)], &[], &c),
            Err(ClusterError::DuplicateSerial { .. })
        ));
        let bad = ClusterConfig {
            alpha: 0.0,
            ..c.clone()
        };
        assert!(matches!(scan(&[], &[], &bad), Err(ClusterError::Parameter { .. })));
        let bad = ClusterConfig {
            min_rate_ratio: 0.5,
            ..c
        };
        assert!(matches!(scan(&[], &[], &bad), Err(ClusterError::Parameter { .. })));
    }
}
