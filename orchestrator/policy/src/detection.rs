//! The policy keys of fleet-scale detection (issue 22): each wave's `max_bake`, and the rollout's
//! `detection` block (error budgets, soak and holdback). All optional, with defaults that keep an
//! existing policy's meaning: without `max_bake` a wave never extends beyond its bake, and without
//! `detection` the budgets are the detector's defaults (2% false rollback, 5% false pass).

use chrono::TimeDelta;

use crate::diag::Sink;
use crate::duration::{format_duration, parse_duration};
use crate::raw::{RawDetection, RawSoak, S, at};

/// Default rollout-level false-rollback budget (kept equal to `orchestrator_detect::fleet`'s).
pub const DEFAULT_FALSE_ROLLBACK: f64 = 0.02;
/// Default rollout-level false-pass budget.
pub const DEFAULT_FALSE_PASS: f64 = 0.05;
/// Default hours excluded after any reset of a node, on both sides of a comparison.
pub const DEFAULT_RESET_EXCLUSION_SECONDS: i64 = 3600;
/// Default soak power target: the rate ratio the soak must be able to catch (issue 22's example).
pub const DEFAULT_SOAK_DETECT: f64 = 1.5;
/// Default probability that the soak catches [`DEFAULT_SOAK_DETECT`] by `soak.max`.
pub const DEFAULT_SOAK_POWER: f64 = 0.75;

/// Longest `detection.pre_period`: the first flash waits for it, so a typo in the unit (`2d` for `2h`)
/// should not hold a rollout for weeks.
pub const MAX_PRE_PERIOD_DAYS: i64 = 7;

/// The rollout's detection settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Detection {
    /// The policy has a `detection` block: the engine judges its rollouts with fleet-scale detection
    /// (`orchestrator_detect::fleet`). Without the block a policy keeps the per-wave judge it was
    /// written for (policies are users' code), and the other fields are the defaults `policy power`
    /// quotes.
    pub enabled: bool,
    /// Probability of rolling back a healthy release anywhere in the rollout (all gates, waves, soak).
    pub false_rollback: f64,
    /// Probability of passing a release that is `must_detect` worse on some gate.
    pub false_pass: f64,
    /// Hours after a reset (a flash, a reboot) that count on neither side.
    pub reset_exclusion: TimeDelta,
    /// How long the first wave's nodes and the controls are watched before the first flash, so that
    /// a level gate compares each canary node with itself (`detection.pre_period`); `None`: the
    /// canary flashes at once and its level gates compare nodes with the controls as they are.
    /// Later waves need no such wait: their nodes were watched as controls during the earlier bakes.
    pub pre_period: Option<TimeDelta>,
    /// The soak against the holdback; `None`: no soak, the release is never fleet-proven by the detector.
    pub soak: Option<Soak>,
}

impl Default for Detection {
    fn default() -> Self {
        Self {
            enabled: false,
            false_rollback: DEFAULT_FALSE_ROLLBACK,
            false_pass: DEFAULT_FALSE_PASS,
            reset_exclusion: TimeDelta::seconds(DEFAULT_RESET_EXCLUSION_SECONDS),
            pre_period: None,
            soak: None,
        }
    }
}

/// The soak: after the last wave, the updated fleet against a stratified holdback on the old version.
#[derive(Clone, PartialEq)]
pub struct Soak {
    /// Shortest soak (the soak's bake).
    pub min: TimeDelta,
    /// Longest soak before a hold for a human.
    pub max: TimeDelta,
    /// Share of the eligible fleet held back, in percent, when the policy states it; `None`: the
    /// planner sizes the holdback from the power target below (`policy power` states the size).
    pub holdback_percent: Option<f64>,
    /// The soak's power target: the rate ratio it must be able to catch by `max` (default 1.5).
    pub detect: f64,
    /// ... with this probability (default 0.75).
    pub power: f64,
    /// The longest a regression may take to show after a flash, when the policy states it
    /// (`soak.onset`); `None`: the policy's longest planned wave `bake` stands for it (see
    /// [`Soak::plausible_onset`]).
    pub onset: Option<TimeDelta>,
}

/// Written out so that a soak without a stated `onset` reads as it did before the key existed: the
/// plan fingerprint hashes this text.
impl std::fmt::Debug for Soak {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = f.debug_struct("Soak");
        s.field("min", &self.min)
            .field("max", &self.max)
            .field("holdback_percent", &self.holdback_percent)
            .field("detect", &self.detect)
            .field("power", &self.power);
        if let Some(onset) = &self.onset {
            s.field("onset", onset);
        }
        s.finish()
    }
}

impl Soak {
    /// The plausible onset of a delayed regression: the stated `onset`, else `longest_bake` (the
    /// longest planned `bake` of the policy's waves), the policy's own statement of how long a
    /// regression may take to show before it trusts a wave. The soak is the last wave's only judge,
    /// so a `min` not longer than this may pass the soak before such a regression shows on the last
    /// wave's nodes (`policy lint` warns).
    pub fn plausible_onset(&self, longest_bake: TimeDelta) -> TimeDelta {
        self.onset.unwrap_or(longest_bake)
    }
}

fn budget(sink: &mut Sink, what: &str, raw: Option<&S<f64>>, default: f64) -> Option<f64> {
    let Some(raw) = raw else { return Some(default) };
    let v = raw.value;
    if v.is_finite() && v > 0.0 && v <= 0.5 {
        Some(v)
    } else {
        sink.error(
            at(raw),
            format!("detection.{what} is a probability and must be in (0, 0.5], got {v}"),
        );
        None
    }
}

fn duration(sink: &mut Sink, what: &str, raw: &S<String>) -> Option<TimeDelta> {
    match parse_duration(&raw.value) {
        Ok(d) => Some(d),
        Err(e) => {
            sink.error(at(raw), format!("{what}: {e}"));
            None
        }
    }
}

/// Validates the `detection` block (absent: the defaults).
pub(crate) fn detection(sink: &mut Sink, raw: Option<&S<RawDetection>>) -> Option<Detection> {
    let Some(raw) = raw else {
        return Some(Detection::default());
    };
    let d = &raw.value;
    let false_rollback = budget(
        sink,
        "false_rollback",
        d.false_rollback.as_ref(),
        DEFAULT_FALSE_ROLLBACK,
    );
    let false_pass = budget(sink, "false_pass", d.false_pass.as_ref(), DEFAULT_FALSE_PASS);
    let reset_exclusion = match &d.reset_exclusion {
        None => Some(TimeDelta::seconds(DEFAULT_RESET_EXCLUSION_SECONDS)),
        Some(r) => duration(sink, "detection.reset_exclusion", r),
    };
    let pre_period = match &d.pre_period {
        None => Some(None),
        Some(r) => duration(sink, "detection.pre_period", r).and_then(|p| {
            if p > TimeDelta::zero() && p <= TimeDelta::days(MAX_PRE_PERIOD_DAYS) {
                Some(Some(p))
            } else {
                sink.error(
                    at(r),
                    format!(
                        "detection.pre_period must be longer than 0 and at most {MAX_PRE_PERIOD_DAYS}d (the canary waits for it), got {}",
                        format_duration(p)
                    ),
                );
                None
            }
        }),
    };
    let soak = match &d.soak {
        None => Some(None),
        Some(s) => soak(sink, &s.value).map(Some),
    };
    Some(Detection {
        enabled: true,
        false_rollback: false_rollback?,
        false_pass: false_pass?,
        reset_exclusion: reset_exclusion?,
        pre_period: pre_period?,
        soak: soak?,
    })
}

fn soak(sink: &mut Sink, raw: &RawSoak) -> Option<Soak> {
    let min = duration(sink, "detection.soak.min", &raw.min);
    let max = duration(sink, "detection.soak.max", &raw.max);
    if let (Some(min), Some(max)) = (min, max)
        && max < min
    {
        sink.error(
            at(&raw.max),
            format!(
                "detection.soak.max {} is shorter than detection.soak.min {}",
                format_duration(max),
                format_duration(min)
            ),
        );
        return None;
    }
    let mut ok = true;
    let holdback_percent = raw.holdback_percent.as_ref().map(|raw| raw.value);
    if let (Some(raw), Some(p)) = (&raw.holdback_percent, holdback_percent)
        && !(p.is_finite() && p > 0.0 && p < 50.0)
    {
        sink.error(
            at(raw),
            format!("detection.soak.holdback_percent must be a percentage in (0, 50), got {p}"),
        );
        ok = false;
    }
    let detect = raw.detect.as_ref().map_or(DEFAULT_SOAK_DETECT, |d| d.value);
    if let Some(raw) = &raw.detect
        && !(detect.is_finite() && detect > 1.0 && detect <= 100.0)
    {
        sink.error(
            at(raw),
            format!("detection.soak.detect is a rate ratio and must be in (1, 100], got {detect}"),
        );
        ok = false;
    }
    let power = raw.power.as_ref().map_or(DEFAULT_SOAK_POWER, |d| d.value);
    if let Some(raw) = &raw.power
        && !(power.is_finite() && power > 0.5 && power < 1.0)
    {
        sink.error(
            at(raw),
            format!("detection.soak.power is a probability and must be in (0.5, 1), got {power}"),
        );
        ok = false;
    }
    let onset = match &raw.onset {
        None => Some(None),
        Some(r) => duration(sink, "detection.soak.onset", r).map(Some),
    };
    if !ok {
        return None;
    }
    Some(Soak {
        min: min?,
        max: max?,
        holdback_percent,
        detect,
        power,
        onset: onset?,
    })
}

/// A wave's `max_bake`: at least its bake (absent: the bake, so the wave never extends).
pub(crate) fn max_bake(
    sink: &mut Sink,
    wave: &str,
    raw: Option<&S<String>>,
    bake: Option<TimeDelta>,
) -> Option<TimeDelta> {
    let Some(raw) = raw else { return bake };
    let max = duration(sink, &format!("wave {wave:?} max_bake"), raw)?;
    if let Some(bake) = bake
        && max < bake
    {
        sink.error(
            at(raw),
            format!(
                "wave {wave:?} max_bake {} is shorter than its bake {}: the bake is a minimum and max_bake the most it may extend to",
                format_duration(max),
                format_duration(bake)
            ),
        );
        return None;
    }
    Some(max)
}

#[cfg(test)]
mod tests {
    use crate::lint::check_source;

    const BASE: &str = "name: p
target:
  component: gpu
  platforms: [hgx]
waves:
  - name: canary
    count: 8
    bake: 12h
    max_bake: MAXBAKE
  - name: rest
    rest: true
    bake: 4h
concurrency:
  max_in_flight: 4
failure_budget:
  max_failed: 1
rollback:
  automatic: true
  scope: wave
DETECTION";

    fn check(max_bake: &str, detection: &str, expected: &[&str]) {
        let source = BASE.replace("MAXBAKE", max_bake).replace("DETECTION", detection);
        let checked = check_source(&source);
        let errors: Vec<String> = checked
            .diagnostics
            .iter()
            .filter(|d| d.is_error())
            .map(|d| d.render("p.yaml"))
            .collect();
        // Every expected fragment is in the one error, or there is no error when none is expected.
        assert_eq!(errors.len(), usize::from(!expected.is_empty()), "{errors:#?}");
        for want in expected {
            assert!(errors[0].contains(want), "{} does not contain {want}", errors[0]);
        }
    }

    #[test]
    fn valid_keys_and_defaults() {
        check("120h", "", &[]);
        check(
            "5d",
            "detection:\n  false_rollback: 0.02\n  false_pass: 0.05\n  reset_exclusion: 1h\n  soak:\n    min: 24h\n    max: 14d\n    holdback_percent: 5\n",
            &[],
        );
        let source = BASE.replace("    max_bake: MAXBAKE\n", "").replace("DETECTION", "");
        let policy = crate::parse_policy(&source).unwrap();
        assert_eq!(policy.waves[0].max_bake, policy.waves[0].bake);
        assert_eq!(policy.detection, super::Detection::default());
        let source = BASE.replace("MAXBAKE", "3d").replace(
            "DETECTION",
            "detection:\n  soak: {min: 1d, max: 10d, holdback_percent: 2}\n",
        );
        let policy = crate::parse_policy(&source).unwrap();
        assert_eq!(policy.waves[0].max_bake, chrono::TimeDelta::days(3));
        let soak = policy.detection.soak.unwrap();
        assert_eq!(soak.holdback_percent, Some(2.0));
        // The power target defaults to issue 22's example.
        assert_eq!((soak.detect, soak.power), (1.5, 0.75));
        // Without holdback_percent the planner sizes the holdback from the power target.
        let source = BASE.replace("MAXBAKE", "3d").replace(
            "DETECTION",
            "detection:\n  soak: {min: 1d, max: 10d, detect: 2, power: 0.9}\n",
        );
        let soak = crate::parse_policy(&source).unwrap().detection.soak.unwrap();
        assert_eq!((soak.holdback_percent, soak.detect, soak.power), (None, 2.0, 0.9));
        // No pre-period unless the policy asks for one.
        assert_eq!(crate::parse_policy(&source).unwrap().detection.pre_period, None);
        let source = BASE
            .replace("MAXBAKE", "3d")
            .replace("DETECTION", "detection:\n  pre_period: 2h\n");
        let detection = crate::parse_policy(&source).unwrap().detection;
        assert_eq!(detection.pre_period, Some(chrono::TimeDelta::hours(2)));
    }

    #[test]
    fn a_wave_may_not_take_the_holdback_name_when_there_is_a_soak() {
        let soak = "detection:\n  soak: {min: 1d, max: 10d}\n";
        let source = BASE.replace("MAXBAKE", "3d").replace("DETECTION", soak);
        assert!(crate::parse_policy(&source).is_ok());
        let named = source.replace("name: rest", "name: holdback");
        let checked = check_source(&named);
        assert!(
            checked
                .diagnostics
                .iter()
                .any(|d| d.is_error() && d.render("p.yaml").contains("the holdback wave's name")),
            "{:#?}",
            checked.diagnostics
        );
        // Without a soak the name keeps its meaning.
        let plain = BASE
            .replace("MAXBAKE", "3d")
            .replace("DETECTION", "")
            .replace("name: rest", "name: holdback");
        assert!(crate::parse_policy(&plain).is_ok());
    }

    #[test]
    fn errors_point_at_the_key() {
        check("6h", "", &["p.yaml:9:15", "max_bake 6h is shorter than its bake 12h"]);
        check("soon", "", &["p.yaml:9:15"]);
        check(
            "12h",
            "detection:\n  false_rollback: 0.9\n",
            &["p.yaml:21:19: detection.false_rollback"],
        );
        check(
            "12h",
            "detection:\n  soak:\n    min: 2d\n    max: 1d\n    holdback_percent: 5\n",
            &["p.yaml:23:10", "soak.max 1d is shorter"],
        );
        check(
            "12h",
            "detection:\n  soak:\n    min: 1d\n    max: 2d\n    holdback_percent: 70\n",
            &["holdback_percent must be a percentage in (0, 50)"],
        );
        check(
            "12h",
            "detection:\n  soak:\n    min: 1d\n    max: 2d\n    detect: 1\n",
            &["p.yaml:24:13", "detection.soak.detect is a rate ratio"],
        );
        check(
            "12h",
            "detection:\n  soak:\n    min: 1d\n    max: 2d\n    power: 0.3\n",
            &["detection.soak.power is a probability"],
        );
        check(
            "12h",
            "detection:\n  pre_period: 0h\n",
            &["p.yaml:21:15", "detection.pre_period", "must be positive"],
        );
        check("12h", "detection:\n  pre_period: 30d\n", &["at most 7d", "got 30d"]);
        check(
            "12h",
            "detection:\n  pre_period: 2 hours\n",
            &["p.yaml:21:15", "detection.pre_period:"],
        );
    }
}
