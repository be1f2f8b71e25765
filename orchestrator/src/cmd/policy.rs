//! `waveguard policy ...`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use orchestrator_policy::{FileReport, Severity, lint_files};

use crate::Context;

/// Deepest directory nesting `lint` descends into; policy repositories are
/// flat, and a bound stops symlink loops.
const MAX_LINT_DEPTH: usize = 16;

/// Policy commands.
#[derive(Debug, clap::Subcommand)]
pub enum PolicyCommand {
    /// Check policy files; print every finding as `file:line:col: message`.
    ///
    /// Directories are searched for `*.yaml` / `*.yml`. Exit status 1 when
    /// any error was found, 0 otherwise (warnings alone exit 0). Needs no
    /// database; usable in the CI of a policy repository.
    Lint {
        /// Files or directories (default: the current directory).
        paths: Vec<PathBuf>,
    },
}

/// Runs a policy command.
pub async fn run(command: PolicyCommand, _context: &Context) -> anyhow::Result<ExitCode> {
    match command {
        PolicyCommand::Lint { paths } => {
            let paths = if paths.is_empty() {
                vec![PathBuf::from(".")]
            } else {
                paths
            };
            let (code, output) = lint(&paths)?;
            print!("{output}");
            Ok(code)
        }
    }
}

/// Lints the given paths; returns the exit code and the text to print.
fn lint(paths: &[PathBuf]) -> anyhow::Result<(ExitCode, String)> {
    let mut files = Vec::new();
    for path in paths {
        collect(path, 0, &mut files)?;
    }
    files.sort();
    files.dedup();
    let mut inputs = Vec::new();
    for file in &files {
        let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
        inputs.push((file.display().to_string(), bytes));
    }
    let reports = lint_files(inputs);
    Ok(render(&reports))
}

fn render(reports: &[FileReport]) -> (ExitCode, String) {
    let mut out = String::new();
    let (mut errors, mut warnings) = (0usize, 0usize);
    for report in reports {
        for d in &report.checked.diagnostics {
            match d.severity {
                Severity::Error => errors += 1,
                Severity::Warning => warnings += 1,
            }
        }
        for line in report.rendered() {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out.push_str(&format!(
        "{} file(s) checked: {errors} error(s), {warnings} warning(s)\n",
        reports.len()
    ));
    let code = if errors > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    };
    (code, out)
}

fn collect(path: &Path, depth: usize, files: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let meta = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    if meta.is_file() {
        files.push(path.to_owned());
        return Ok(());
    }
    if depth >= MAX_LINT_DEPTH {
        anyhow::bail!("{} is nested deeper than {MAX_LINT_DEPTH} directories", path.display());
    }
    let entries = std::fs::read_dir(path).with_context(|| format!("cannot list {}", path.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot list {}", path.display()))?;
        let child = entry.path();
        let hidden = child
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.'));
        if hidden {
            continue;
        }
        if child.is_dir() {
            collect(&child, depth + 1, files)?;
        } else if child.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            files.push(child);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn examples() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../policies")
    }

    #[test]
    fn examples_directory_lints_clean() {
        let (code, out) = lint(&[examples()]).unwrap();
        assert_eq!(code, ExitCode::SUCCESS, "{out}");
        assert!(out.ends_with("2 file(s) checked: 0 error(s), 0 warning(s)\n"), "{out}");
    }

    #[test]
    fn broken_file_exits_1_with_file_line_col() {
        let dir = tempfile::tempdir().unwrap();
        let text = std::fs::read_to_string(examples().join("bmc-firmware.yaml"))
            .unwrap()
            .replace("bake: 6h", "bake: soon");
        let file = dir.path().join("bmc-firmware.yaml");
        std::fs::write(&file, text).unwrap();
        let (code, out) = lint(&[file.clone()]).unwrap();
        assert_eq!(code, ExitCode::FAILURE);
        let first = out.lines().next().unwrap();
        assert!(
            first.starts_with(&format!("{}:", file.display()))
                && first.contains(": wave \"canary\" bake: invalid duration"),
            "{out}"
        );
    }
}
