//! Reading node lists for `waveguard fleet import`: CSV with a header row,
//! or YAML (a list of nodes, or a map with a `nodes:` list). Every bad row is
//! reported with its line number, all at once, so one run fixes a file.
//!
//! The import format lives beside the records it produces ([`NewNode`]),
//! validated by the same rules the datastore applies, so every crate that
//! reads fleet files (the binary's `fleet import`, `policy lint`/`power`)
//! reaches it without a dependency on the binary.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use crate::model::{NewNode, NodeLabels};
use serde::Deserialize;

/// The columns of the CSV format, in the order written by `bmc-sim`.
pub const CSV_COLUMNS: [&str; 8] = [
    "name",
    "bmc_url",
    "credential_ref",
    "platform_sku",
    "region",
    "cluster",
    "rack",
    "nvlink_domain",
];

/// Largest file accepted; 100,000 nodes are about 15 MB of CSV.
const MAX_FILE_BYTES: u64 = 256 * 1024 * 1024;

/// One problem in a fleet file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowError {
    /// 1-based line in the file; 0 when the problem is the whole file.
    pub line: u64,
    /// 1-based column, when known; 0 otherwise.
    pub column: u64,
    pub message: String,
}

/// Everything wrong with a fleet file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct FleetFileError {
    pub file: String,
    pub errors: Vec<RowError>,
}

impl fmt::Display for FleetFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} has {} error(s); nothing was imported:",
            self.file,
            self.errors.len()
        )?;
        for error in &self.errors {
            match (error.line, error.column) {
                (0, _) => writeln!(f, "{}: {}", self.file, error.message)?,
                (line, 0) => writeln!(f, "{}:{line}: {}", self.file, error.message)?,
                (line, column) => writeln!(f, "{}:{line}:{column}: {}", self.file, error.message)?,
            }
        }
        Ok(())
    }
}

/// Reads and validates a fleet file; the format follows the extension
/// (`.csv`, `.yaml`, `.yml`).
pub fn read(path: &Path) -> Result<Vec<NewNode>, FleetFileError> {
    let file = path.display().to_string();
    let whole = |message: String| FleetFileError {
        file: file.clone(),
        errors: vec![RowError {
            line: 0,
            column: 0,
            message,
        }],
    };
    let size = std::fs::metadata(path)
        .map_err(|e| whole(format!("cannot read: {e}")))?
        .len();
    if size > MAX_FILE_BYTES {
        return Err(whole(format!("larger than {MAX_FILE_BYTES} bytes")));
    }
    let text = std::fs::read_to_string(path).map_err(|e| whole(format!("cannot read: {e}")))?;
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let parsed = match extension.as_str() {
        "csv" => parse_csv(&text),
        "yaml" | "yml" => parse_yaml(&text),
        _ => Err(vec![RowError {
            line: 0,
            column: 0,
            message: "unknown format: use a .csv, .yaml or .yml file".into(),
        }]),
    };
    parsed.map_err(|errors| FleetFileError { file, errors })
}

/// The position of each column a CSV header names, every problem at once: a column not in `known`,
/// one named twice, one of `required` missing. Shared by the fleet file and the parts manifest.
pub(crate) fn csv_header_index(
    header: &csv::StringRecord,
    known: &[&str],
    required: &[&str],
) -> Result<HashMap<String, usize>, Vec<String>> {
    let mut index = HashMap::new();
    let mut errors = Vec::new();
    for (position, column) in header.iter().enumerate() {
        if !known.contains(&column) {
            errors.push(format!("unknown column {column:?}; expected: {}", known.join(",")));
        } else if index.insert(column.to_owned(), position).is_some() {
            errors.push(format!("column {column:?} appears twice"));
        }
    }
    for column in required {
        if !index.contains_key(*column) {
            errors.push(format!("missing column {column:?}"));
        }
    }
    if errors.is_empty() { Ok(index) } else { Err(errors) }
}

/// Parses CSV text with a header row naming [`CSV_COLUMNS`] in any order.
pub fn parse_csv(text: &str) -> Result<Vec<NewNode>, Vec<RowError>> {
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .flexible(false)
        .from_reader(text.as_bytes());
    let header = reader
        .headers()
        .map_err(|e| {
            vec![RowError {
                line: 1,
                column: 0,
                message: format!("cannot read the header row: {e}"),
            }]
        })?
        .clone();
    let index = csv_header_index(&header, &CSV_COLUMNS, &CSV_COLUMNS).map_err(|messages| {
        messages
            .into_iter()
            .map(|message| RowError {
                line: 1,
                column: 0,
                message,
            })
            .collect::<Vec<_>>()
    })?;
    let mut errors = Vec::new();
    let mut nodes = Vec::new();
    for record in reader.records() {
        let record = match record {
            Ok(record) => record,
            Err(err) => {
                let line = err.position().map_or(0, csv::Position::line);
                errors.push(RowError {
                    line,
                    column: 0,
                    message: csv_error_message(&err),
                });
                continue;
            }
        };
        let line = record.position().map_or(0, csv::Position::line);
        let field = |name: &str| {
            index
                .get(name)
                .and_then(|&i| record.get(i))
                .unwrap_or_default()
                .to_owned()
        };
        let node = NewNode {
            name: field("name"),
            bmc_url: field("bmc_url"),
            credential_ref: field("credential_ref"),
            platform_sku: field("platform_sku"),
            labels: NodeLabels {
                region: field("region"),
                cluster: field("cluster"),
                rack: field("rack"),
                nvlink_domain: field("nvlink_domain"),
            },
        };
        push_validated(node, line, &mut nodes, &mut errors);
    }
    check_duplicates(&nodes, &mut errors);
    finish(nodes, errors)
}

fn csv_error_message(err: &csv::Error) -> String {
    match err.kind() {
        csv::ErrorKind::UnequalLengths { expected_len, len, .. } => {
            format!("has {len} fields, the header has {expected_len}")
        }
        _ => err.to_string(),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlNode {
    name: String,
    bmc_url: String,
    credential_ref: String,
    platform_sku: String,
    region: String,
    cluster: String,
    rack: String,
    nvlink_domain: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlFleetMap {
    nodes: Vec<serde_saphyr::Spanned<YamlNode>>,
}

/// Parses YAML: a list of nodes, or `nodes:` with that list.
pub fn parse_yaml(text: &str) -> Result<Vec<NewNode>, Vec<RowError>> {
    // Untagged enums lose the position of the real error, so the shape is
    // chosen by the first non-comment token and parsed strictly.
    let is_list = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#') && *l != "---")
        .is_some_and(|l| l.starts_with('-') || l.starts_with('['));
    let parsed = if is_list {
        serde_saphyr::from_str::<Vec<serde_saphyr::Spanned<YamlNode>>>(text)
    } else {
        serde_saphyr::from_str::<YamlFleetMap>(text).map(|fleet| fleet.nodes)
    };
    let entries = parsed.map_err(|err| vec![yaml_error(&err)])?;
    let mut nodes = Vec::new();
    let mut errors = Vec::new();
    for entry in entries {
        let line = entry.referenced.line();
        let raw = entry.value;
        let node = NewNode {
            name: raw.name,
            bmc_url: raw.bmc_url,
            credential_ref: raw.credential_ref,
            platform_sku: raw.platform_sku,
            labels: NodeLabels {
                region: raw.region,
                cluster: raw.cluster,
                rack: raw.rack,
                nvlink_domain: raw.nvlink_domain,
            },
        };
        push_validated(node, line, &mut nodes, &mut errors);
    }
    check_duplicates(&nodes, &mut errors);
    finish(nodes, errors)
}

fn yaml_error(err: &serde_saphyr::Error) -> RowError {
    use serde_saphyr::MessageFormatter as _;
    let message = serde_saphyr::UserMessageFormatter.format_message(err.without_snippet());
    let message = message.lines().next().unwrap_or_default().to_owned();
    match err.location() {
        Some(location) => RowError {
            line: location.line(),
            column: location.column(),
            message,
        },
        None => RowError {
            line: 0,
            column: 0,
            message,
        },
    }
}

fn push_validated(node: NewNode, line: u64, nodes: &mut Vec<(u64, NewNode)>, errors: &mut Vec<RowError>) {
    let problems = node.validate();
    if problems.is_empty() {
        nodes.push((line, node));
    } else {
        for problem in problems {
            errors.push(RowError {
                line,
                column: 0,
                message: problem.to_string(),
            });
        }
    }
}

fn check_duplicates(nodes: &[(u64, NewNode)], errors: &mut Vec<RowError>) {
    let mut first_seen: HashMap<&str, u64> = HashMap::new();
    for (line, node) in nodes {
        if let Some(first) = first_seen.insert(node.name.as_str(), *line) {
            errors.push(RowError {
                line: *line,
                column: 0,
                message: format!("node {:?} already appears on line {first}", node.name),
            });
            first_seen.insert(node.name.as_str(), first);
        }
    }
}

fn finish(nodes: Vec<(u64, NewNode)>, mut errors: Vec<RowError>) -> Result<Vec<NewNode>, Vec<RowError>> {
    if errors.is_empty() {
        Ok(nodes.into_iter().map(|(_, node)| node).collect())
    } else {
        errors.sort_by_key(|e| e.line);
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "name,bmc_url,credential_ref,platform_sku,region,cluster,rack,nvlink_domain\n";

    fn errors_of(result: Result<Vec<NewNode>, Vec<RowError>>) -> Vec<String> {
        result
            .unwrap_err()
            .into_iter()
            .map(|e| format!("{}: {}", e.line, e.message))
            .collect()
    }

    #[test]
    fn good_csv_is_read_in_any_column_order() {
        let text = "rack,name,bmc_url,credential_ref,platform_sku,region,cluster,nvlink_domain\n\
                    r1, n1 ,http://127.0.0.1:9001,sim,hgx-h100-8gpu,us-east-1,c1,nvl1\n";
        let nodes = parse_csv(text).unwrap();
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0].name, "n1");
        assert_eq!(nodes[0].labels.rack, "r1");
    }

    #[test]
    fn bad_csv_rows_are_all_reported_with_line_numbers() {
        let cases: &[(&str, &[&str])] = &[
            (
                "name,bmc_url\nn1,http://x\n",
                &[
                    "1: missing column \"credential_ref\"",
                    "1: missing column \"platform_sku\"",
                    "1: missing column \"region\"",
                    "1: missing column \"cluster\"",
                    "1: missing column \"rack\"",
                    "1: missing column \"nvlink_domain\"",
                ],
            ),
            (
                "name,bmc_url,credential_ref,platform_sku,region,cluster,rack,nvlink_domain,colour\n",
                &[
                    "1: unknown column \"colour\"; expected: name,bmc_url,credential_ref,platform_sku,region,cluster,rack,nvlink_domain",
                ],
            ),
            (
                "n1,http://a,c,s,r,c,r,d\nn2,not-a-url,c,s,r,c,r,d\nn3,http://c,c,s,r,c,r\n,http://d,c,s,r,c,r,d\nn1,http://e,c,s,r,c,r,d\n",
                &[
                    "3: bmc_url: not a URL: relative URL without a base",
                    "4: has 7 fields, the header has 8",
                    "5: name: must not be empty",
                    "6: node \"n1\" already appears on line 2",
                ],
            ),
        ];
        for (text, expected) in cases {
            let text = if text.starts_with("name") || text.starts_with("rack") {
                text.to_string()
            } else {
                format!("{HEADER}{text}")
            };
            assert_eq!(errors_of(parse_csv(&text)), *expected, "{text}");
        }
    }

    #[test]
    fn yaml_lists_and_maps_are_read_with_line_numbers_for_errors() {
        let good = "nodes:\n  - {name: n1, bmc_url: 'http://127.0.0.1:1', credential_ref: sim, platform_sku: s, region: r, cluster: c, rack: r1, nvlink_domain: d}\n";
        assert_eq!(parse_yaml(good).unwrap().len(), 1);
        let list = "# fleet\n- name: n1\n  bmc_url: http://127.0.0.1:1\n  credential_ref: sim\n  platform_sku: s\n  region: r\n  cluster: c\n  rack: r1\n  nvlink_domain: d\n\
                    - name: n2\n  bmc_url: ftp://x\n  credential_ref: sim\n  platform_sku: s\n  region: r\n  cluster: c\n  rack: r1\n  nvlink_domain: d\n";
        assert_eq!(
            errors_of(parse_yaml(list)),
            ["10: bmc_url: must be an http or https URL with a host"]
        );
        let typo = "- name: n1\n  bmc_url: http://x\n  credential_ref: sim\n  platfrom_sku: s\n";
        let errors = parse_yaml(typo).unwrap_err();
        assert_eq!(
            (errors.len(), errors[0].line, errors[0].column),
            (1, 4, 3),
            "{errors:?}"
        );
        assert!(errors[0].message.contains("platfrom_sku"), "{errors:?}");
        assert!(parse_yaml("nodes: 7\n").is_err());
        assert!(parse_yaml(": : :\n").is_err());
    }

    /// Fuzz (issue 24): no fleet file makes the parsers panic, and every
    /// error names a line inside the file (or 0 for the whole file).
    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        const GOOD_CSV: &str = "name,bmc_url,credential_ref,platform_sku,region,cluster,rack,nvlink_domain\n\
            n1,https://10.0.0.1,lab,hgx,us,c1,r1,d1\nn2,https://10.0.0.2,lab,hgx,us,c1,r2,d1\n";
        const GOOD_YAML: &str = "nodes:\n  - name: n1\n    bmc_url: https://10.0.0.1\n    credential_ref: lab\n    \
            platform_sku: hgx\n    region: us\n    cluster: c1\n    rack: r1\n    nvlink_domain: d1\n";

        fn lines_ok(text: &str, result: Result<Vec<NewNode>, Vec<RowError>>) -> Result<(), TestCaseError> {
            if let Err(errors) = result {
                prop_assert!(!errors.is_empty());
                // YAML counts a lone CR as a line break too (found by this
                // target: `"a\r \r\0` errs on line 3), so count both.
                let lines = text.matches(['\n', '\r']).count() as u64 + 1;
                for error in errors {
                    prop_assert!(error.line <= lines, "line {} of {lines}: {}", error.line, error.message);
                    prop_assert!(!error.message.is_empty());
                }
            }
            Ok(())
        }

        fn mutate(base: &'static str) -> impl Strategy<Value = String> {
            (0..base.len(), 0..16usize, ".{0,12}").prop_map(move |(at, cut, insert)| {
                let mut at = at;
                while !base.is_char_boundary(at) {
                    at -= 1;
                }
                let mut end = (at + cut).min(base.len());
                while !base.is_char_boundary(end) {
                    end -= 1;
                }
                format!("{}{}{}", &base[..at], insert, &base[end..])
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

            #[test]
            fn arbitrary_text_never_panics(text in ".{0,400}") {
                lines_ok(&text, parse_csv(&text))?;
                lines_ok(&text, parse_yaml(&text))?;
            }

            #[test]
            fn mutated_csv_never_panics(text in mutate(GOOD_CSV)) {
                lines_ok(&text, parse_csv(&text))?;
            }

            #[test]
            fn mutated_yaml_never_panics(text in mutate(GOOD_YAML)) {
                lines_ok(&text, parse_yaml(&text))?;
            }
        }
    }
}
