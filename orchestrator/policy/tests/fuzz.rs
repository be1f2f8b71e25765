//! No input makes parsing or validation panic: arbitrary bytes, arbitrary
//! YAML-ish text, and mutations of a valid policy (the inputs most likely to
//! reach deep validation code).

use orchestrator_policy::{check_bytes, check_source};
use proptest::prelude::*;

const VALID: &str = include_str!("../../../policies/hgx-gpu-firmware.yaml");

/// Tokens that steer random text towards the policy grammar.
fn yamlish() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("\n".to_owned()),
        Just("  ".to_owned()),
        Just("- ".to_owned()),
        Just(": ".to_owned()),
        Just("[".to_owned()),
        Just("]".to_owned()),
        Just("{".to_owned()),
        Just("}".to_owned()),
        Just("&a ".to_owned()),
        Just("*a".to_owned()),
        Just("<<: ".to_owned()),
        Just("!!str ".to_owned()),
        Just("'".to_owned()),
        Just("\"".to_owned()),
        Just("|\n".to_owned()),
        Just("name".to_owned()),
        Just("waves".to_owned()),
        Just("count".to_owned()),
        Just("percent".to_owned()),
        Just("rest: true".to_owned()),
        Just("cron".to_owned()),
        Just("0 0 2 * * *".to_owned()),
        Just("matchers".to_owned()),
        Just("=~".to_owned()),
        "[a-z_]{1,12}",
        "-?[0-9]{1,25}(\\.[0-9]{1,5})?",
        "[0-9]{1,4}[smhdw]",
        any::<char>().prop_map(|c| c.to_string()),
    ];
    prop::collection::vec(token, 0..200).prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let _ = check_bytes(&bytes);
    }

    #[test]
    fn yamlish_text_never_panics(text in yamlish()) {
        let checked = check_source(&text);
        // Either a policy or at least one error, never neither.
        prop_assert!(checked.policy.is_some() || checked.has_errors());
    }

    #[test]
    fn mutated_valid_policy_never_panics(
        cut in 0usize..VALID.len(),
        len in 0usize..40,
        insert in "[ -~\n]{0,20}",
    ) {
        let mut text: Vec<char> = VALID.chars().collect();
        let cut = cut.min(text.len());
        let end = (cut + len).min(text.len());
        text.splice(cut..end, insert.chars());
        let text: String = text.into_iter().collect();
        let checked = check_source(&text);
        prop_assert!(checked.policy.is_some() || checked.has_errors());
    }

    #[test]
    fn value_substitutions_never_panic(value in prop_oneof![
        "[ -~]{0,30}",
        Just("\"\"".to_owned()),
        Just("-1".to_owned()),
        Just("1e309".to_owned()),
        Just(".nan".to_owned()),
        Just("99999999999999999999999".to_owned()),
        Just("0 0 0 31 2 *".to_owned()),
    ], line in 0usize..200) {
        // Replace the value of one `key: value` line with the generated one.
        let mut lines: Vec<String> = VALID.lines().map(str::to_owned).collect();
        let idx = line % lines.len();
        if let Some(colon) = lines[idx].find(": ") {
            lines[idx] = format!("{}: {}", &lines[idx][..colon], value);
        }
        let checked = check_source(&lines.join("\n"));
        prop_assert!(checked.policy.is_some() || checked.has_errors());
    }
}
