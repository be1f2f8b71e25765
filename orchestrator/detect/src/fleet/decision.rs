//! The three outcomes with the right nulls, for a wave and for the soak.
//!
//! - **Fail** at any look when a gate's anytime lower bound exceeds its null (`min_effect`, or 1):
//!   the data reject "no regression that matters". The null is never `must_detect`: that would let an
//!   effect at `must_detect` through with probability 1 - alpha.
//! - **Pass** only once the planned bake has run (the bake is a minimum) and every gate's anytime
//!   upper bound is below its `must_detect`: the data rule out every effect that must be caught.
//! - Otherwise **Extend** the bake, up to `max_bake`, then **Hold** for a human with a plain statement
//!   of what the data rule out and what they cannot. Promote-anyway is the human's recorded decision,
//!   not the detector's.
//!
//! Worst wins: one failing gate fails the wave whatever the others say.

/// One gate's facts at a look, from [`super::RateEProcess::look`] / [`super::LevelEProcess::look`].
#[derive(Debug, Clone, PartialEq)]
pub struct GateLook {
    /// Gate name (the metric).
    pub gate: String,
    /// The lower bound exceeds the null.
    pub fail: bool,
    /// The upper bound is below `must_detect`.
    pub pass_ready: bool,
    /// Anytime lower bound of the effect (ratio or shift).
    pub lower: f64,
    /// Anytime upper bound of the effect.
    pub upper: f64,
    /// The null a Fail must exceed.
    pub null: f64,
    /// The effect a Pass must rule out.
    pub must_detect: f64,
}

/// Where a wave (or the soak) stands in time, in hours since its bake started.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WaveTiming {
    /// Hours since the wave's last node finished its flash (or the soak started).
    pub elapsed_hours: f64,
    /// The planned bake: a minimum.
    pub bake_hours: f64,
    /// The longest the bake may extend before a human decides (>= the bake).
    pub max_bake_hours: f64,
}

/// A wave's decision.
#[derive(Debug, Clone, PartialEq)]
pub enum WaveDecision {
    /// Roll back per the policy: these gates show a regression that matters.
    Fail {
        /// The failing gates.
        gates: Vec<String>,
    },
    /// Promote: the bake has run and every effect that must be caught is ruled out.
    Pass,
    /// Keep baking.
    Extend {
        /// Gates whose evidence is not yet enough to pass (empty while the planned bake runs).
        waiting_on: Vec<String>,
        /// Whether the planned bake itself is still running.
        in_planned_bake: bool,
    },
    /// `max_bake` reached without enough evidence: a human decides, with this statement.
    Hold {
        /// What the data rule out and what they cannot, per gate.
        statement: String,
    },
}

/// The wave's decision at this look; see the module documentation.
pub fn decide_wave(timing: WaveTiming, gates: &[GateLook]) -> WaveDecision {
    let failing: Vec<String> = gates.iter().filter(|g| g.fail).map(|g| g.gate.clone()).collect();
    if !failing.is_empty() {
        return WaveDecision::Fail { gates: failing };
    }
    // NaN elapsed time is treated as "not yet": never a reason to pass.
    let bake_over = timing.elapsed_hours >= timing.bake_hours;
    if !bake_over {
        return WaveDecision::Extend {
            waiting_on: Vec::new(),
            in_planned_bake: true,
        };
    }
    let waiting: Vec<&GateLook> = gates.iter().filter(|g| !g.pass_ready).collect();
    if waiting.is_empty() {
        return WaveDecision::Pass;
    }
    if timing.elapsed_hours >= timing.max_bake_hours {
        return WaveDecision::Hold {
            statement: statement(timing, &waiting),
        };
    }
    WaveDecision::Extend {
        waiting_on: waiting.iter().map(|g| g.gate.clone()).collect(),
        in_planned_bake: false,
    }
}

fn statement(timing: WaveTiming, waiting: &[&GateLook]) -> String {
    let mut out = format!(
        "after {:.0} h (max_bake {:.0} h) the evidence is not enough to pass: ",
        timing.elapsed_hours, timing.max_bake_hours
    );
    let parts: Vec<String> = waiting
        .iter()
        .map(|g| {
            let above = if g.upper.is_finite() {
                format!("rules out an effect above {:.2}", g.upper)
            } else {
                "rules out no effect yet".to_owned()
            };
            format!(
                "{}: {above} but cannot rule out {:.2} (must_detect); no regression beyond {:.2} (min_effect) is shown",
                g.gate, g.must_detect, g.null
            )
        })
        .collect();
    out.push_str(&parts.join("; "));
    out.push_str(". Promoting anyway is a recorded human decision.");
    out
}

/// The soak's decision: the whole updated fleet against the stratified holdback.
#[derive(Debug, Clone, PartialEq)]
pub enum SoakDecision {
    /// Roll back per the policy's scope and block the release.
    RollBackAndBlock {
        /// The failing gates.
        gates: Vec<String>,
    },
    /// The release becomes fleet-proven; the holdback is updated afterwards (it is the last wave).
    FleetProvenThenUpdateHoldback,
    /// Keep soaking.
    Extend {
        /// Gates not yet ready to pass.
        waiting_on: Vec<String>,
    },
    /// The soak's maximum is reached without enough evidence: a human decides.
    Hold {
        /// What the data rule out and what they cannot.
        statement: String,
    },
}

/// The soak's decision at this look: the same rules as a wave, with the soak's outcomes. The soak is
/// what judges the last wave, which has no control of its own left; its evidence is the same rollout
/// process continued, so it spends the same budget.
pub fn decide_soak(timing: WaveTiming, gates: &[GateLook]) -> SoakDecision {
    match decide_wave(timing, gates) {
        WaveDecision::Fail { gates } => SoakDecision::RollBackAndBlock { gates },
        WaveDecision::Pass => SoakDecision::FleetProvenThenUpdateHoldback,
        WaveDecision::Extend { waiting_on, .. } => SoakDecision::Extend { waiting_on },
        WaveDecision::Hold { statement } => SoakDecision::Hold { statement },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(name: &str, fail: bool, pass_ready: bool) -> GateLook {
        GateLook {
            gate: name.into(),
            fail,
            pass_ready,
            lower: 0.8,
            upper: if pass_ready { 1.6 } else { 3.1 },
            null: 1.25,
            must_detect: 2.0,
        }
    }

    fn at(elapsed: f64) -> WaveTiming {
        WaveTiming {
            elapsed_hours: elapsed,
            bake_hours: 12.0,
            max_bake_hours: 48.0,
        }
    }

    fn check(timing: WaveTiming, gates: &[GateLook], expected: &str) {
        let got = match decide_wave(timing, gates) {
            WaveDecision::Fail { gates } => format!("fail {}", gates.join(",")),
            WaveDecision::Pass => "pass".into(),
            WaveDecision::Extend {
                waiting_on,
                in_planned_bake,
            } => format!("extend {in_planned_bake} {}", waiting_on.join(",")),
            WaveDecision::Hold { .. } => "hold".into(),
        };
        assert_eq!(got, expected, "{timing:?} {gates:?}");
    }

    #[test]
    fn each_decision() {
        let (ok, open, bad) = (
            gate("xid", false, true),
            gate("aer", false, false),
            gate("temp", true, false),
        );
        // Fail at any look, even inside the planned bake, and worst wins.
        check(at(1.0), &[ok.clone(), bad.clone()], "fail temp");
        check(at(100.0), &[bad.clone(), open.clone()], "fail temp");
        // The bake is a minimum: ready evidence does not pass early.
        check(at(11.9), std::slice::from_ref(&ok), "extend true ");
        check(at(f64::NAN), std::slice::from_ref(&ok), "extend true ");
        check(at(12.0), std::slice::from_ref(&ok), "pass");
        // Not ready after the bake: extend, up to max_bake, then hold.
        check(at(12.0), &[ok.clone(), open.clone()], "extend false aer");
        check(at(47.9), &[ok.clone(), open.clone()], "extend false aer");
        check(at(48.0), &[ok, open], "hold");
    }

    #[test]
    fn hold_states_what_is_and_is_not_ruled_out() {
        let WaveDecision::Hold { statement } = decide_wave(at(48.0), &[gate("xid", false, false)]) else {
            panic!("expected a hold");
        };
        assert!(statement.contains("xid: rules out an effect above 3.10"), "{statement}");
        assert!(statement.contains("cannot rule out 2.00 (must_detect)"), "{statement}");
        assert!(statement.contains("recorded human decision"), "{statement}");
    }

    #[test]
    fn soak_failure_rolls_back_and_a_soak_pass_updates_the_holdback() {
        assert_eq!(
            decide_soak(at(30.0), &[gate("xid", true, false)]),
            SoakDecision::RollBackAndBlock {
                gates: vec!["xid".into()]
            }
        );
        assert_eq!(
            decide_soak(at(30.0), &[gate("xid", false, true)]),
            SoakDecision::FleetProvenThenUpdateHoldback
        );
        assert!(matches!(
            decide_soak(at(60.0), &[gate("xid", false, false)]),
            SoakDecision::Hold { .. }
        ));
        assert!(matches!(
            decide_soak(at(6.0), &[gate("xid", false, true)]),
            SoakDecision::Extend { .. }
        ));
    }
}
