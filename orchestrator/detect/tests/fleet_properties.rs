//! Properties of the fleet-scale method: no panic on any input, and replaying the stored cells
//! rebuilds exactly the same evidence (what makes "a bin is observed once" crash-safe).

use orchestrator_detect::fleet::{
    LevelEConfig, LevelEProcess, NodeCount, RateCell, RateEConfig, RateEProcess, quasi_poisson_dispersion,
};
use proptest::prelude::*;

fn any_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(-1.0),
        Just(0.0),
        Just(1e300),
        0.0..1e6f64,
    ]
}

fn cell() -> impl Strategy<Value = RateCell> {
    (any::<u64>(), any_f64(), any::<u64>(), any_f64()).prop_map(|(a, b, c, d)| RateCell {
        updated_events: a,
        updated_exposure: b,
        control_events: c,
        control_exposure: d,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn rate_evidence_never_panics(
        bins in prop::collection::vec(prop::collection::vec(cell(), 0..4), 0..6),
        null in any_f64(), must in any_f64(), alpha in any_f64(), beta in any_f64(), phi in any_f64(),
    ) {
        let mut p = RateEProcess::new(RateEConfig { restart_every_bins: 2, max_restarts: 2, node_look_share: 0.0 });
        for b in &bins {
            let _ = p.observe_bin(b);
        }
        // Invalid parameters are errors; valid ones give a decision. Neither panics.
        let _ = p.look(null, must, alpha, beta, phi);
        let (lower, upper) = p.bounds(0.01, 0.05, 1.0);
        prop_assert!(lower <= upper);
    }

    #[test]
    fn level_evidence_and_dispersion_never_panic(
        diffs in prop::collection::vec(any_f64(), 0..20), sd in any_f64(), controls in 0usize..100,
        counts in prop::collection::vec((any::<u32>(), any::<u64>(), any_f64()), 0..20),
    ) {
        let mut p = LevelEProcess::new(LevelEConfig::default());
        let _ = p.observe_batch(&diffs, sd, controls);
        let _ = p.look(0.5, 2.0, 0.01, 0.05);
        let nodes: Vec<NodeCount> = counts
            .into_iter()
            .map(|(stratum, events, exposure)| NodeCount { stratum, events, exposure })
            .collect();
        if let Some(phi) = quasi_poisson_dispersion(&nodes) {
            prop_assert!(phi >= 1.0 && phi.is_finite());
        }
    }

    #[test]
    fn replaying_stored_cells_rebuilds_the_same_evidence(
        bins in prop::collection::vec(prop::collection::vec((0u64..50, 1.0..500f64, 0u64..50, 1.0..500f64), 1..4), 1..30),
    ) {
        let cells: Vec<Vec<RateCell>> = bins
            .iter()
            .map(|b| b.iter().map(|&(a, e1, c, e0)| RateCell {
                updated_events: a, updated_exposure: e1, control_events: c, control_exposure: e0,
            }).collect())
            .collect();
        let mut live = RateEProcess::new(RateEConfig::default());
        for b in &cells {
            live.observe_bin(b).unwrap();
        }
        // A controller that crashed rebuilds from the stored cells: same state, same decisions.
        let mut replayed = RateEProcess::new(RateEConfig::default());
        for b in &cells {
            replayed.observe_bin(b).unwrap();
        }
        prop_assert_eq!(&live, &replayed);
        prop_assert_eq!(live.look(1.1, 2.0, 0.005, 0.0125, 1.0), replayed.look(1.1, 2.0, 0.005, 0.0125, 1.0));
        prop_assert_eq!(live.bins() as usize, cells.len());
    }
}
