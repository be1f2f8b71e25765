//! A real headless Chromium over WebDriver (chromedriver + fantoccini) against the web app on a
//! loopback port: the pieces every browser test needs (finding the programs or skipping loudly,
//! the web server, users of every role, logging in and out, waiting on the page, screenshots).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use fantoccini::{Client, ClientBuilder, Locator};
use orchestrator_db::Db;
use orchestrator_types::{Role, WaveId};
use serde_json::json;

use crate::{REQUIRE_ALL_ENV, find_program, free_port, require_all};

/// Every test user's password.
pub const PASSWORD: &str = "correct horse battery staple";
/// How long a test waits for something to show in the browser.
pub const UI_WAIT: Duration = Duration::from_secs(20);

/// `chromium` and `chromedriver`, or `None` after saying loudly that `test` is skipped; panics
/// instead when [`REQUIRE_ALL_ENV`] is set.
pub fn programs_or_skip(test: &str) -> Option<(PathBuf, PathBuf)> {
    let chromium = find_program(&["chromium", "chromium-browser", "google-chrome"]);
    let driver = find_program(&["chromedriver"]);
    if let (Some(chromium), Some(driver)) = (chromium, driver) {
        return Some((chromium, driver));
    }
    assert!(
        !require_all(),
        "{REQUIRE_ALL_ENV}=1 but `chromium` and/or `chromedriver` are not on PATH; run web/ci-setup.sh"
    );
    eprintln!(
        "\n\n*** SKIPPED browser test {test}: `chromium` and/or `chromedriver` not on PATH (run web/ci-setup.sh) ***\n\n"
    );
    None
}

/// Users of every role, all with [`PASSWORD`]: `rita` and `sam` (release managers), `vera`
/// (viewer), `ada` (admin), and the release managers in `more`.
pub async fn add_users(db: &Db, more: &[&str]) -> anyhow::Result<()> {
    let hash = web::auth::hash_password(PASSWORD)?;
    let named = [
        ("rita", "Rita Manager", Role::ReleaseManager),
        ("sam", "Sam Second", Role::ReleaseManager),
        ("vera", "Vera Viewer", Role::Viewer),
        ("ada", "Ada Admin", Role::Admin),
    ];
    for (name, display, role) in named {
        db.add_user(name, display, role, Some(&hash), "test").await?;
    }
    for name in more {
        db.add_user(name, name, Role::ReleaseManager, Some(&hash), "test")
            .await?;
    }
    Ok(())
}

/// The web app serving `state` on a loopback port until [`WebServer::stop`].
#[derive(Debug)]
pub struct WebServer {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl WebServer {
    pub async fn start(state: web::AppState) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr: SocketAddr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(web::serve(listener, state, async move {
            let _ = stopped.await;
        }));
        Ok(Self {
            base: format!("http://{addr}"),
            stop,
            task,
        })
    }

    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// A headless Chromium driven through its own chromedriver, with a throw-away profile.
#[derive(Debug)]
pub struct Browser {
    pub client: Client,
    driver: tokio::process::Child,
    _profile: tempfile::TempDir,
}

impl Browser {
    pub async fn start(chromium: &Path, driver_bin: &Path) -> anyhow::Result<Self> {
        let port = free_port()?;
        let mut driver = tokio::process::Command::new(driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start chromedriver")?;
        let profile = tempfile::tempdir()?;
        let connected = async {
            wait_for_port(port).await?;
            let mut caps = serde_json::Map::new();
            caps.insert(
                "goog:chromeOptions".into(),
                json!({
                    "binary": chromium.display().to_string(),
                    "args": [
                        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        "--disable-dev-shm-usage", "--window-size=1400,1000",
                        format!("--user-data-dir={}", profile.path().display()),
                    ],
                }),
            );
            // Both rustls providers are linked in this workspace, so pick one; the
            // WebDriver connection is plain HTTP on loopback anyway.
            let _ = rustls::crypto::ring::default_provider().install_default();
            ClientBuilder::rustls()?
                .capabilities(caps)
                .connect(&format!("http://127.0.0.1:{port}"))
                .await
                .context("cannot open a WebDriver session")
        }
        .await;
        match connected {
            Ok(client) => Ok(Self {
                client,
                driver,
                _profile: profile,
            }),
            Err(err) => {
                let _ = driver.kill().await;
                Err(err)
            }
        }
    }

    /// Ends the session and chromedriver.
    pub async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill().await;
    }
}

async fn wait_for_port(port: u16) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("chromedriver did not listen on port {port}")
}

/// Where screenshots go: `target/ui-screenshots/` (under `CARGO_TARGET_DIR` when set).
pub fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("target"));
    target.join("ui-screenshots")
}

/// Removes an earlier run's pictures that `owned` says are this test's (by file name), so a
/// reviewer never mistakes a stale one for this run's and other tests' pictures stay.
pub fn clear_screenshots(owned: impl Fn(&str) -> bool) -> anyhow::Result<()> {
    let dir = screenshot_dir();
    std::fs::create_dir_all(&dir)?;
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if path.extension().is_some_and(|e| e == "png") && owned(name) {
            std::fs::remove_file(&path).with_context(|| format!("remove {}", path.display()))?;
        }
    }
    Ok(())
}

/// Saves the current window as `<name>.png` in [`screenshot_dir`].
pub async fn shot(client: &Client, name: &str) -> anyhow::Result<()> {
    let dir = screenshot_dir();
    std::fs::create_dir_all(&dir)?;
    let png = client.screenshot().await?;
    std::fs::write(dir.join(format!("{name}.png")), png)?;
    Ok(())
}

/// Waits until `script`, evaluated in the page, returns true.
pub async fn wait_until(client: &Client, what: &str, script: &str, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let value = client.execute(script, vec![]).await?;
        if value.as_bool() == Some(true) {
            return Ok(());
        }
        if Instant::now() > deadline {
            let source = client.source().await.unwrap_or_default();
            bail!("timed out after {limit:?} waiting for {what}; page:\n{source}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Types `text` into the field with id `id`. A live update may swap the field for its fresh copy
/// between finding it and typing (a field nobody has touched yet is not guarded), which WebDriver
/// reports as stale or not interactable: find it again, as a person would click again. Nothing
/// was typed when either error comes, so a retry never types twice.
pub async fn type_into(client: &Client, id: &str, text: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + UI_WAIT;
    loop {
        let typed = match client.find(Locator::Id(id)).await {
            Ok(field) => field.send_keys(text).await,
            Err(e) => Err(e),
        };
        match typed {
            Ok(()) => return Ok(()),
            Err(e)
                if (e.is_stale_element_reference() || e.is_element_not_interactable() || e.is_no_such_element())
                    && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e).with_context(|| format!("typing into #{id}")),
        }
    }
}

/// Logs `user` in through the login form.
pub async fn login(client: &Client, base: &str, user: &str) -> anyhow::Result<()> {
    client.goto(&format!("{base}/login")).await?;
    type_into(client, "username", user).await?;
    type_into(client, "password", PASSWORD).await?;
    client.find(Locator::Id("login")).await?.click().await?;
    wait_until(
        client,
        "the logged-in page",
        "return !!document.getElementById('whoami');",
        UI_WAIT,
    )
    .await?;
    let who = client.find(Locator::Id("whoami")).await?.text().await?;
    ensure!(who.contains(user), "logged in as {who:?}, wanted {user}");
    Ok(())
}

/// Logs out with the header's button.
pub async fn logout(client: &Client, base: &str) -> anyhow::Result<()> {
    client.goto(&format!("{base}/")).await?;
    client.find(Locator::Css("form.who button")).await?.click().await?;
    wait_until(
        client,
        "the login page",
        "return !!document.getElementById('login');",
        UI_WAIT,
    )
    .await
}

/// A script for [`wait_until`]: the rollout page shows `wave` in `state`.
pub fn wave_state_is(wave: WaveId, state: &str) -> String {
    format!(
        "const w = document.querySelector('#wave-{wave} .wave-state'); \
         return !!w && w.textContent.trim() === '{state}';"
    )
}
