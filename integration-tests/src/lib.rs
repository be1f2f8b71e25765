//! The shared test kit: one harness for controller + bmc-sim + database (SQLite and PostgreSQL) +
//! image server ([`Harness`]), scenario and fixture builders ([`ScenarioYaml`], and re-exported from
//! `orchestrator_db::testing`: [`TestDb`] and [`fixtures`] for policies, nodes and releases), and the
//! external programs the end-to-end tests drive ([`process`], and [`browser`]: headless Chromium over
//! WebDriver).
//!
//! Test suites of other crates (engine, the binary's process tests) take this crate as a
//! dev-dependency; its own `tests/` are the end-to-end tests with real external programs.

use std::path::PathBuf;

use anyhow::Context as _;

pub mod browser;
pub mod git;
mod harness;
pub mod process;
mod scenario;

pub use harness::{
    GateEvidence, Harness, HarnessBuilder, SPEEDUP, gpu_image, init_tracing, scenario, scenario_with, sim_endpoint,
};
pub use orchestrator_db::testing::fixtures::{self, GPU_FROM, GPU_TO, SKU};
pub use orchestrator_db::testing::{REQUIRE_ALL_ENV, TestDb, require_all};
pub use scenario::ScenarioYaml;

/// The first of `names` found on `PATH`, directory by directory.
pub fn find_program(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

/// A port that was free a moment ago. The programs take an address, not a
/// listening socket, so there is a small window in which another process
/// could take it; a clash fails start-up loudly rather than silently.
pub fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("bind a probe port")?;
    Ok(listener.local_addr()?.port())
}

/// The engine tests' policy, `test-gpu`: [`fixtures::PolicyYaml::three_waves`] baking `bake`, with
/// `middle_approval` (e.g. `approval: auto`) on the middle wave.
pub fn policy(bake: &str, middle_approval: &str) -> String {
    fixtures::PolicyYaml::three_waves("test-gpu", bake, middle_approval).render()
}
