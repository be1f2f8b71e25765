//! A throw-away Slurm cluster on loopback for tests (feature `testing`):
//! Debian's 22.05 packages started by `integration-tests/slurm/start.sh`,
//! one `slurmd -N` per node on its own port, everything in a temporary
//! directory that `stop.sh` cleans up when the [`LoopbackSlurm`] drops.
//!
//! Shared by this crate's adapter tests and the engine's rollout tests.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};

use crate::slurm::{SlurmConfig, SlurmScheduler, StateSource};

/// Same variable as `integration_tests::REQUIRE_ALL_ENV` (not a dependency:
/// that crate pulls in the whole controller).
const REQUIRE_ALL_ENV: &str = "WAVEGUARD_REQUIRE_ALL";
const PROGRAMS: [&str; 8] = [
    "munged",
    "slurmctld",
    "slurmd",
    "scontrol",
    "sinfo",
    "sbatch",
    "squeue",
    "scancel",
];

fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../integration-tests/slurm")
}

/// True when the Slurm programs are present and we are root; otherwise
/// skips loudly (or panics under `WAVEGUARD_REQUIRE_ALL=1`).
pub fn slurm_present(test: &str) -> bool {
    let missing: Vec<&str> = PROGRAMS.iter().copied().filter(|p| find_program(p).is_none()).collect();
    let problem = if !missing.is_empty() {
        format!("{missing:?} not on PATH (run integration-tests/ci-setup.sh)")
    } else if !is_root() {
        // start.sh runs every daemon as SlurmUser=root, as CI does.
        "not running as root (the loopback cluster runs its daemons as root)".to_owned()
    } else {
        return true;
    };
    let require_all = std::env::var(REQUIRE_ALL_ENV).is_ok_and(|v| v == "1");
    assert!(!require_all, "{REQUIRE_ALL_ENV}=1 but {problem}");
    eprintln!("\n\n*** SKIPPED {test}: {problem} ***\n\n");
    false
}

/// A running loopback cluster; dropping it stops every daemon it started.
#[derive(Debug)]
pub struct LoopbackSlurm {
    /// Where its state, logs and configuration live.
    pub dir: tempfile::TempDir,
    /// Its `slurm.conf` (export as `SLURM_CONF`).
    pub conf: PathBuf,
}

impl LoopbackSlurm {
    /// Starts a cluster of `nodes` with `ReturnToService=return_to_service`
    /// and waits until every node has registered.
    pub fn start(nodes: &[&str], return_to_service: u8) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("waveguard-slurm-").tempdir()?;
        let ports: Vec<String> = nodes
            .iter()
            .map(|_| free_port().map(|p| p.to_string()))
            .collect::<Result<_, _>>()?;
        let out = Command::new("bash")
            .arg(scripts().join("start.sh"))
            .arg(dir.path())
            .env("SLURM_NODES", nodes.join(" "))
            .env("SLURMCTLD_PORT", free_port()?.to_string())
            .env("SLURMD_PORTS", ports.join(" "))
            .env("SLURM_RETURN_TO_SERVICE", return_to_service.to_string())
            .output()
            .context("running start.sh")?;
        let cluster = Self {
            conf: dir.path().join("slurm.conf"),
            dir,
        };
        if !out.status.success() {
            bail!(
                "start.sh failed ({}):\n{}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(cluster)
    }

    /// The Slurm adapter for this cluster, reading state from `source`.
    pub fn scheduler(&self, source: StateSource) -> SlurmScheduler {
        SlurmScheduler::new(SlurmConfig {
            slurm_conf: Some(self.conf.clone()),
            state_source: source,
            timeout: Duration::from_secs(20),
            ..SlurmConfig::default()
        })
    }

    /// Runs a Slurm client command as an operator would, returning stdout.
    /// (Jobs here write to `/dev/null`: sbatch's default `slurm-<id>.out`
    /// would land in the crate directory.)
    pub fn client(&self, program: &str, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(program)
            .args(args)
            .env("SLURM_CONF", &self.conf)
            .output()
            .with_context(|| format!("running {program}"))?;
        ensure!(
            out.status.success(),
            "{program} {args:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// The last lines of every daemon's log, for a failing test's message.
    pub fn logs(&self) -> String {
        let mut text = String::new();
        for entry in std::fs::read_dir(self.dir.path()).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "log") {
                let body = std::fs::read_to_string(&path).unwrap_or_default();
                let tail: Vec<&str> = body.lines().rev().take(15).collect();
                text.push_str(&format!("--- {}\n", path.display()));
                for line in tail.into_iter().rev() {
                    text.push_str(line);
                    text.push('\n');
                }
            }
        }
        text
    }
}

impl Drop for LoopbackSlurm {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(scripts().join("stop.sh"))
            .arg(self.dir.path())
            .status();
    }
}
