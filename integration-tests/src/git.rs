//! The `git` program for tests of policy sync: whether it is there (a loud skip, or a failure
//! under `WAVEGUARD_REQUIRE_ALL=1`), and running it as a fixed test identity without signing.
//!
//! Only `std`: the policy-git crate's tests include this file by path, so they get it without the
//! whole kit as a dev-dependency.

use std::path::Path;
use std::process::Command;

/// Whether `git` runs; when not, says loudly that `what` is skipped, or fails the test under
/// `WAVEGUARD_REQUIRE_ALL=1`.
pub fn git_available(what: &str) -> bool {
    let ok = Command::new("git")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("WAVEGUARD_REQUIRE_ALL").as_deref() != Ok("1"),
            "git is required (WAVEGUARD_REQUIRE_ALL=1) but not found"
        );
        eprintln!("\n*** SKIPPING {what}: the `git` program is not installed ***\n");
    }
    ok
}

/// Runs `git ARGS` in `dir` as `Test <test@example.com>`, unsigned; panics with git's stderr when
/// it fails.
pub fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=Test",
            "-c",
            "user.email=test@example.com",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
