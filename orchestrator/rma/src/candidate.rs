//! Candidate rules over per-part observations: which parts meet a vendor criterion, by which rule,
//! proven by which samples, and whether the failure began right after the part's firmware changed.
//!
//! The observations are what the collector already reads for the rollout gates (Redfish log entries
//! and probes, DCGM series through Prometheus); this module only judges them, so the same history
//! always yields the same candidates.

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

use crate::criteria::{Condition, Criteria, HealthFlag, Rule, Severity};

/// A part as inventoried: keyed by serial number, which Redfish keeps on `Processor`, `Assembly` or
/// `Chassis`; the lot comes from a parts manifest since no Redfish property names a lot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartRecord {
    /// Serial number (the key).
    pub serial: String,
    /// Vendor key, as in criteria files.
    pub vendor: String,
    /// Part kind, as in criteria files.
    pub part_kind: String,
    /// Vendor part number.
    pub part_number: String,
    /// Node (host) name.
    pub node: String,
    /// Slot on the node (GPU index / Redfish id).
    pub slot: String,
}

/// What one observation saw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum ObservationKind {
    /// A reading of a sticky health flag.
    Flag {
        /// Which flag.
        flag: HealthFlag,
        /// Whether it read set.
        set: bool,
    },
    /// One XID from a log entry.
    Xid {
        /// The XID code.
        code: u32,
    },
    /// The exporter's count of an XID within its own sliding window (a count in the window, not a
    /// total, so readings are never summed).
    XidWindowCount {
        /// The XID code.
        code: u32,
        /// Occurrences in the window.
        count: u64,
        /// The exporter's window length in seconds.
        window_seconds: i64,
    },
    /// A field diagnostic result (run locally or uploaded from vendor support).
    FieldDiagnostic {
        /// Whether the part passed.
        passed: bool,
    },
    /// One scrape of the node: whether this part's series was present while the node reported.
    SeriesScrape {
        /// Present or not.
        present: bool,
    },
    /// One probe of the node's BMC.
    BmcProbe {
        /// Whether it answered.
        answered: bool,
    },
}

/// One sample, named so that evidence can cite it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// When it was observed.
    pub at: DateTime<Utc>,
    /// Stable id of the sample at its source (log entry URI, series and timestamp).
    pub source_id: String,
    /// What it saw.
    pub kind: ObservationKind,
}

/// A firmware change of the part (or of the node's BMC, for BMC rules).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirmwareChange {
    /// When the new version was read back.
    pub at: DateTime<Utc>,
    /// Firmware component (`gpu`, `bmc`).
    pub component: String,
    /// Version before.
    pub from_version: String,
    /// Version after.
    pub to_version: String,
    /// Release that was flashed.
    pub release: String,
    /// Rollout that flashed it, if any.
    pub rollout: Option<String>,
}

/// Why a failure is suspected to be the firmware's rather than the silicon's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirmwareSuspicion {
    /// The change that preceded the failure.
    pub change: FirmwareChange,
    /// Time from the change to the first qualifying sample.
    pub after_seconds: i64,
}

/// Whether a rule is met.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CandidateStatus {
    /// Every condition holds, including the field diagnostic confirmation where required.
    Met,
    /// The signal holds; the vendor requires a failed field diagnostic that is not there yet.
    AwaitingConfirmation,
    /// The signal holds but the field diagnostic passed: the vendor will not accept the claim.
    DiagnosticPassed,
}

/// A part that met (or is close to meeting) a rule, with the proof.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// The part.
    pub part: PartRecord,
    /// Rule name.
    pub rule: String,
    /// Failure mode of the rule.
    pub failure_mode: String,
    /// Severity of the rule.
    pub severity: Severity,
    /// Whether the rule is met.
    pub status: CandidateStatus,
    /// First qualifying sample.
    pub began_at: DateTime<Utc>,
    /// The samples that prove it (signal samples, then the diagnostic if any).
    pub samples: Vec<Observation>,
    /// Set when the failure began right after a firmware change.
    pub firmware_suspected: Option<FirmwareSuspicion>,
    /// The vendor document and edition the rule comes from.
    pub document_edition: String,
}

struct Hit {
    began_at: DateTime<Utc>,
    samples: Vec<Observation>,
}

/// Finds every rule a part meets. `observations` may be in any order; `now` is unused by the rules
/// (every condition is proven by samples, never by the absence of data up to the present) but keeps
/// the door shut on future samples: observations after `now` are ignored.
pub fn find_candidates(
    criteria: &[Criteria],
    part: &PartRecord,
    observations: &[Observation],
    firmware: &[FirmwareChange],
    now: DateTime<Utc>,
) -> Vec<Candidate> {
    let mut obs: Vec<&Observation> = observations.iter().filter(|o| o.at <= now).collect();
    obs.sort_by_key(|o| o.at);
    let mut out = Vec::new();
    for c in criteria
        .iter()
        .filter(|c| c.covers(&part.vendor, &part.part_kind, &part.part_number))
    {
        for rule in &c.rules {
            let Some(hit) = evaluate(&rule.condition, &obs, firmware) else {
                continue;
            };
            let (status, diag) = confirmation(rule, &obs, hit.began_at);
            let mut samples = hit.samples;
            samples.extend(diag);
            let firmware_suspected = suspicion(firmware, hit.began_at, c.firmware_suspect_window);
            out.push(Candidate {
                part: part.clone(),
                rule: rule.name.clone(),
                failure_mode: rule.failure_mode.clone(),
                severity: rule.severity,
                status,
                began_at: hit.began_at,
                samples,
                firmware_suspected,
                document_edition: c
                    .documents
                    .get(&rule.document)
                    .map(|d| format!("{} ({}), {}", d.title, d.edition, rule.section))
                    .unwrap_or_default(),
            });
        }
    }
    out
}

fn evaluate(cond: &Condition, obs: &[&Observation], firmware: &[FirmwareChange]) -> Option<Hit> {
    match cond {
        Condition::Flag(flag) => obs
            .iter()
            .find(|o| matches!(o.kind, ObservationKind::Flag { flag: f, set: true } if f == *flag))
            .map(|o| Hit {
                began_at: o.at,
                samples: vec![(*o).clone()],
            }),
        Condition::Xid {
            codes,
            at_least,
            within,
        } => xid(obs, codes, *at_least, *within),
        Condition::SeriesVanished { for_ } => silent_run(obs, *for_, None, |k| match k {
            ObservationKind::SeriesScrape { present } => Some(!present),
            _ => None,
        }),
        Condition::BmcSilentAfterFlash { within, for_ } => firmware.iter().find_map(|change| {
            let first_silence = obs
                .iter()
                .find(|o| o.at >= change.at && matches!(o.kind, ObservationKind::BmcProbe { answered: false }))?;
            if first_silence.at - change.at > *within {
                return None;
            }
            silent_run(obs, *for_, Some(first_silence.at), |k| match k {
                ObservationKind::BmcProbe { answered } => Some(!answered),
                _ => None,
            })
        }),
    }
}

/// The first window of `within` holding `at_least` of the XIDs (two-pointer scan), or an exporter
/// reading that alone shows as many in a window no longer than `within`.
fn xid(obs: &[&Observation], codes: &[u32], at_least: u64, within: TimeDelta) -> Option<Hit> {
    let events: Vec<&Observation> = obs
        .iter()
        .copied()
        .filter(|o| matches!(o.kind, ObservationKind::Xid { code } if codes.contains(&code)))
        .collect();
    let need = usize::try_from(at_least).unwrap_or(usize::MAX);
    let mut from_logs = None;
    let mut lo = 0;
    for hi in 0..events.len() {
        while events[hi].at - events[lo].at > within {
            lo += 1;
        }
        if hi + 1 - lo >= need {
            from_logs = Some(Hit {
                began_at: events[lo].at,
                samples: events[lo..=hi].iter().map(|o| (*o).clone()).collect(),
            });
            break;
        }
    }
    let from_exporter = obs.iter().find(|o| {
        matches!(o.kind, ObservationKind::XidWindowCount { code, count, window_seconds }
            if codes.contains(&code) && count >= at_least && TimeDelta::try_seconds(window_seconds).is_some_and(|w| w <= within))
    });
    let from_exporter = from_exporter.map(|o| Hit {
        began_at: o.at,
        samples: vec![(*o).clone()],
    });
    match (from_logs, from_exporter) {
        (Some(a), Some(b)) => Some(if b.began_at < a.began_at { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// The first run of consecutive "silent" readings (per `silent`, which ignores other kinds by
/// returning `None`) starting at or after `from` that spans at least `length`. The run is proven by
/// its first and last silent sample, never by a gap in the data.
fn silent_run(
    obs: &[&Observation],
    length: TimeDelta,
    from: Option<DateTime<Utc>>,
    silent: impl Fn(&ObservationKind) -> Option<bool>,
) -> Option<Hit> {
    let mut start: Option<&Observation> = None;
    let mut count = 0u64;
    for o in obs.iter().filter(|o| from.is_none_or(|f| o.at >= f)) {
        match silent(&o.kind) {
            Some(true) => {
                let first = *start.get_or_insert(o);
                count += 1;
                if o.at - first.at >= length {
                    let mut last = (*o).clone();
                    last.source_id = format!("{} ({count} consecutive readings)", last.source_id);
                    return Some(Hit {
                        began_at: first.at,
                        samples: vec![first.clone(), last],
                    });
                }
            }
            Some(false) => {
                start = None;
                count = 0;
            }
            None => {}
        }
    }
    None
}

fn confirmation(rule: &Rule, obs: &[&Observation], began: DateTime<Utc>) -> (CandidateStatus, Option<Observation>) {
    let Some(within) = rule.confirm_within else {
        return (CandidateStatus::Met, None);
    };
    // A diagnostic shortly before the flag counts too: operators often run it on the first symptom.
    let near: Vec<&&Observation> = obs
        .iter()
        .filter(|o| (o.at - began).abs() <= within && matches!(o.kind, ObservationKind::FieldDiagnostic { .. }))
        .collect();
    if let Some(failed) = near
        .iter()
        .find(|o| matches!(o.kind, ObservationKind::FieldDiagnostic { passed: false }))
    {
        return (CandidateStatus::Met, Some((**failed).clone()));
    }
    match near.last() {
        Some(passed) => (CandidateStatus::DiagnosticPassed, Some((**passed).clone())),
        None => (CandidateStatus::AwaitingConfirmation, None),
    }
}

/// The latest firmware change at or before `began` and no more than `window` before it.
fn suspicion(firmware: &[FirmwareChange], began: DateTime<Utc>, window: TimeDelta) -> Option<FirmwareSuspicion> {
    firmware
        .iter()
        .filter(|c| c.at <= began && began - c.at <= window)
        .max_by_key(|c| c.at)
        .map(|c| FirmwareSuspicion {
            change: c.clone(),
            after_seconds: (began - c.at).num_seconds(),
        })
}
