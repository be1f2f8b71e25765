//! Runs a scheduler command: no shell (arguments are passed as they are, so
//! a node name cannot become a second command), a time limit after which the
//! child is killed, and bounded output (a runaway command cannot fill the
//! controller's memory).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

use crate::error::SchedulerError;

/// Most bytes read from a command's standard output: `sinfo --json` is
/// about 1.5 KiB per node, so this covers ~20,000 nodes.
pub const MAX_STDOUT_BYTES: usize = 32 * 1024 * 1024;
/// Most bytes kept of standard error (it only goes into error messages).
pub const MAX_STDERR_BYTES: usize = 64 * 1024;
/// Most characters of standard error quoted in an error.
const STDERR_QUOTE_CHARS: usize = 400;

/// A finished command.
#[derive(Debug)]
pub struct Output {
    /// Exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    /// Exit status as text, for messages.
    pub status: String,
    /// Standard output, as text (invalid UTF-8 replaced).
    pub stdout: String,
    /// Standard error, bounded and trimmed.
    pub stderr: String,
}

impl Output {
    /// Exited with 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// How to run commands: time limit and extra environment.
#[derive(Debug, Clone)]
pub struct Runner {
    /// Per-command limit.
    pub timeout: Duration,
    /// Extra environment (e.g. `SLURM_CONF`).
    pub env: Vec<(String, String)>,
}

impl Runner {
    /// Runs `program args...`.
    pub async fn run(&self, program: &Path, args: &[String]) -> Result<Output, SchedulerError> {
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Dropped on timeout: the child is killed rather than left running.
            .kill_on_drop(true);
        for (key, value) in &self.env {
            command.env(key, value);
        }
        let mut child = command.spawn().map_err(|source| SchedulerError::Spawn {
            program: program.to_owned(),
            source,
        })?;
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let work = async {
            let (out, err) = tokio::join!(
                read_bounded(program, stdout, MAX_STDOUT_BYTES, "stdout"),
                read_bounded(program, stderr, MAX_STDERR_BYTES, "stderr"),
            );
            let (out, err) = (out?, err?);
            let status = child.wait().await.map_err(|source| SchedulerError::Io {
                program: program.to_owned(),
                source,
            })?;
            Ok::<_, SchedulerError>((status, out, err))
        };
        let (status, stdout, stderr) = match tokio::time::timeout(self.timeout, work).await {
            Ok(result) => result?,
            Err(_) => {
                return Err(SchedulerError::Timeout {
                    program: program.to_owned(),
                    seconds: self.timeout.as_secs(),
                });
            }
        };
        Ok(Output {
            code: status.code(),
            status: status.to_string(),
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: quote(&String::from_utf8_lossy(&stderr)),
        })
    }
}

async fn read_bounded(
    program: &Path,
    stream: Option<impl AsyncRead + Unpin>,
    limit: usize,
    name: &'static str,
) -> Result<Vec<u8>, SchedulerError> {
    let Some(stream) = stream else {
        return Ok(Vec::new());
    };
    let mut buf = Vec::new();
    // One byte past the limit tells "exactly the limit" from "more".
    stream
        .take(limit as u64 + 1)
        .read_to_end(&mut buf)
        .await
        .map_err(|source| SchedulerError::Io {
            program: program.to_owned(),
            source,
        })?;
    if buf.len() > limit {
        return Err(SchedulerError::OutputTooLarge {
            program: PathBuf::from(program),
            stream: name,
            limit,
        });
    }
    Ok(buf)
}

/// Standard error as quoted in errors: trimmed, control characters
/// flattened, bounded.
fn quote(stderr: &str) -> String {
    let flat: String = stderr
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(STDERR_QUOTE_CHARS)
        .collect();
    if flat.is_empty() {
        "(no output on stderr)".to_owned()
    } else {
        flat
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runner(ms: u64) -> Runner {
        Runner {
            timeout: Duration::from_millis(ms),
            env: vec![("WG_TEST_VAR".into(), "hello".into())],
        }
    }

    fn sh(script: &str) -> Vec<String> {
        vec!["-c".into(), script.into()]
    }

    #[tokio::test]
    async fn output_exit_code_and_environment() {
        let out = runner(5_000)
            .run(Path::new("/bin/sh"), &sh("echo $WG_TEST_VAR; echo oops >&2; exit 3"))
            .await
            .unwrap();
        assert_eq!(out.code, Some(3));
        assert_eq!(out.stdout, "hello\n");
        assert_eq!(out.stderr, "oops");
        assert!(!out.success());
    }

    #[tokio::test]
    async fn a_hanging_command_is_killed() {
        let started = std::time::Instant::now();
        let err = runner(300)
            .run(Path::new("/bin/sh"), &sh("sleep 30"))
            .await
            .unwrap_err();
        assert!(matches!(err, SchedulerError::Timeout { .. }), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn a_flood_of_output_is_refused() {
        let err = runner(20_000)
            .run(Path::new("/bin/sh"), &sh("head -c 100000 /dev/zero >&2"))
            .await
            .unwrap_err();
        assert!(
            matches!(err, SchedulerError::OutputTooLarge { stream: "stderr", .. }),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn a_missing_program_is_a_spawn_error() {
        let err = runner(1_000)
            .run(Path::new("/nonexistent/scontrol"), &[])
            .await
            .unwrap_err();
        assert!(matches!(err, SchedulerError::Spawn { .. }), "{err:?}");
    }
}
