//! Fuzz (issue 24): no scenario file makes the parser or its validation
//! panic: arbitrary text, and byte-level mutations of the shipped scenarios
//! (the inputs most likely to reach deep validation).

use bmc_sim::Scenario;
use proptest::prelude::*;

const SHIPPED: [&str; 3] = [
    include_str!("../scenarios/small.yaml"),
    include_str!("../scenarios/issue-3.yaml"),
    include_str!("../scenarios/simulate-1000.yaml"),
];

fn mutated() -> impl Strategy<Value = String> {
    (0..SHIPPED.len(), any::<prop::sample::Index>(), 0..24usize, ".{0,16}").prop_map(|(which, at, cut, insert)| {
        let base = SHIPPED[which];
        let mut start = at.index(base.len().max(1)).min(base.len());
        while !base.is_char_boundary(start) {
            start -= 1;
        }
        let mut end = (start + cut).min(base.len());
        while !base.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}{}{}", &base[..start], insert, &base[end..])
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in ".{0,512}") {
        let _ = Scenario::from_yaml_str(&text);
    }

    #[test]
    fn mutated_scenarios_never_panic(text in mutated()) {
        if let Err(err) = Scenario::from_yaml_str(&text) {
            prop_assert!(!err.to_string().is_empty());
        }
    }
}

#[test]
fn the_shipped_scenarios_parse() {
    for text in SHIPPED {
        Scenario::from_yaml_str(text).unwrap();
    }
}
