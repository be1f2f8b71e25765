//! Running the binary as a user does: one command to its exit, or `serve` until its address line,
//! and stopping it with SIGTERM. Shared by the CLI tests so the spawning rules (which environment
//! is cleared, how the address is read, how long a graceful stop may take) are written once.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output};
use std::time::Duration;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_waveguard");

/// Output bytes as text, for messages and `contains` checks.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Asserts the exit status, quoting both streams when it differs.
pub fn expect_exit(output: &Output, code: i32, what: &str) {
    assert_eq!(
        output.status.code(),
        Some(code),
        "{what}: stdout {} stderr {}",
        text(&output.stdout),
        text(&output.stderr)
    );
}

/// `waveguard --database-url URL ARGS` in `dir` as OS user `carol` (the local admin the CLI names),
/// with no configuration file.
pub fn waveguard_as_carol(dir: &Path, url: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("--database-url")
        .arg(url)
        .args(args)
        .current_dir(dir)
        .env_remove("WAVEGUARD_CONFIG")
        .env("USER", "carol")
        .output()
        .expect("waveguard runs")
}

/// Reads a spawned `serve`'s stdout (which must be piped) up to its `waveguard listening on URL`
/// line and returns the URL.
pub fn listening_url(child: &mut Child) -> String {
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut lines = BufReader::new(stdout).lines();
    loop {
        let line = lines
            .next()
            .expect("serve prints its address")
            .expect("readable stdout");
        if let Some(url) = line.strip_prefix("waveguard listening on ") {
            return url.trim().to_owned();
        }
    }
}

/// SIGTERM, then a graceful exit (status 0) within 10 s, or the test fails.
pub fn terminate_and_wait(mut child: Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    for _ in 0..100 {
        if let Some(status) = child.try_wait().expect("wait works") {
            assert!(status.success(), "graceful shutdown exits 0, got {status}");
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    panic!("serve did not stop within 10 s of SIGTERM");
}
