//! External programs the end-to-end tests drive (Prometheus, Alertmanager): started on loopback with
//! their output in a log file, killed when dropped (pass or fail), and their log's tail quoted when they
//! fail to come up.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// A child process killed on drop, with its combined output in `<dir>/<name>.log`.
#[derive(Debug)]
pub struct ChildProcess {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl ChildProcess {
    /// Starts `program` with `args` in `dir`.
    pub fn spawn(name: &'static str, program: &Path, args: &[String], dir: &Path) -> anyhow::Result<Self> {
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let err = out.try_clone().context("clone log handle")?;
        let child = Command::new(program)
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("start {}", program.display()))?;
        Ok(Self { name, child, log })
    }

    /// The last 40 lines of its output.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits up to 30 s for `url` to answer 2xx; an error quoting the log if the program exits first or
    /// never gets there.
    pub async fn wait_ready(&mut self, http: &reqwest::Client, url: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.exited() {
                bail!(
                    "{} exited with {status} before it was ready:\n{}",
                    self.name,
                    self.log_tail()
                );
            }
            if let Ok(response) = http.get(url).send().await
                && response.status().is_success()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{} not ready at {url} after 30 s:\n{}", self.name, self.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Prometheus on `127.0.0.1:<port>` with `config` (a `prometheus.yml`) and its data in `dir`, ready to
/// answer queries.
pub async fn start_prometheus(binary: &Path, dir: &Path, config: &str) -> anyhow::Result<(ChildProcess, u16)> {
    let port = crate::free_port()?;
    std::fs::write(dir.join("prometheus.yml"), config).context("write prometheus.yml")?;
    let mut prometheus = ChildProcess::spawn(
        "prometheus",
        binary,
        &[
            format!("--config.file={}", dir.join("prometheus.yml").display()),
            format!("--storage.tsdb.path={}", dir.join("prom-data").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
        ],
        dir,
    )?;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    prometheus
        .wait_ready(&http, &format!("http://127.0.0.1:{port}/-/ready"))
        .await?;
    Ok((prometheus, port))
}

/// `program` (the first of `names` on `PATH`), or `None` after a loud skip message; panics instead when
/// [`crate::REQUIRE_ALL_ENV`] is `1`, since CI must run every test.
pub fn required_program(names: &[&str], test: &str, install: &str) -> Option<PathBuf> {
    if let Some(found) = crate::find_program(names) {
        return Some(found);
    }
    assert!(
        !crate::require_all(),
        "{}=1 but none of {names:?} is on PATH; run {install}",
        crate::REQUIRE_ALL_ENV
    );
    eprintln!("\n\n*** SKIPPED {test}: none of {names:?} on PATH (run {install}) ***\n\n");
    None
}
