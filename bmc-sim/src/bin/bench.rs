//! Benchmark (not a test): starts N simulated BMCs (default 10,000) and reports start time, resident memory
//! and Redfish requests per second over loopback. Client and fleet share this process and its 2 cores, so
//! the request rate is a floor for what a separate client would see.
//!
//! `cargo run --release -p bmc-sim --bin bmc-sim-bench -- --nodes 10000 --requests 20000`

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bmc_sim::{Fleet, FleetOptions, Scenario, SimClock};
use clap::Parser;
use futures::StreamExt;

/// Start a big simulated fleet and measure it.
#[derive(Debug, Parser)]
struct Args {
    /// Number of BMCs.
    #[arg(long, default_value_t = 10_000)]
    nodes: usize,
    /// Requests in the keep-alive throughput phase.
    #[arg(long, default_value_t = 20_000)]
    requests: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// BMCs the keep-alive phase cycles over (each keeps one pooled connection).
    #[arg(long, default_value_t = 1_000)]
    hot_nodes: usize,
}

fn rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut scenario =
        Scenario::from_yaml_str(include_str!("../../scenarios/issue-3.yaml")).context("built-in scenario")?;
    // Measure the service, not the injected faults.
    scenario.bmc_faults.unavailable_rate = 0.0;
    scenario.bmc_faults.timeout_rate = 0.0;
    let mut options = FleetOptions::new(Arc::new(SimClock::starting_now(1.0)));
    options.nodes = Some(args.nodes);
    let rss_before = rss_mib();
    let started = Instant::now();
    let fleet = Fleet::start(scenario, options).await.context("starting the fleet")?;
    let start_time = started.elapsed();
    let rss_started = rss_mib();
    println!("started {} BMCs in {:.2?}", fleet.endpoints().len(), start_time);
    println!(
        "RSS: {:.1} MiB before, {:.1} MiB after start ({:.1} KiB per BMC)",
        rss_before.unwrap_or(f64::NAN),
        rss_started.unwrap_or(f64::NAN),
        (rss_started.unwrap_or(f64::NAN) - rss_before.unwrap_or(f64::NAN)) * 1024.0 / args.nodes as f64
    );

    // Phase 1: every BMC answers (fresh connection each; no pooling so file descriptors stay bounded).
    let cold = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(30))
        .build()?;
    let urls: Vec<String> = fleet
        .endpoints()
        .iter()
        .map(|e| format!("{}/redfish/v1/UpdateService/FirmwareInventory", e.bmc_url))
        .collect();
    let t = Instant::now();
    let failures = futures::stream::iter(urls.iter().cloned())
        .map(|url| {
            let cold = cold.clone();
            async move {
                cold.get(url)
                    .basic_auth("admin", Some("admin"))
                    .send()
                    .await
                    .map(|r| r.status().is_success())
            }
        })
        .buffer_unordered(args.concurrency)
        .filter(|r| std::future::ready(!matches!(r, Ok(true))))
        .count()
        .await;
    let cold_time = t.elapsed();
    println!(
        "phase 1: GET FirmwareInventory once on each of {} BMCs (new connection each): {:.2?}, {:.0} req/s, {failures} failures",
        urls.len(),
        cold_time,
        urls.len() as f64 / cold_time.as_secs_f64()
    );
    if failures > 0 {
        bail!("{failures} BMCs did not answer");
    }

    // Phase 2: keep-alive throughput over a hot subset.
    let hot = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
    let hot_urls: Vec<String> = urls.iter().take(args.hot_nodes.max(1)).cloned().collect();
    let t = Instant::now();
    let failures = futures::stream::iter((0..args.requests).map(|i| hot_urls[i % hot_urls.len()].clone()))
        .map(|url| {
            let hot = hot.clone();
            async move {
                hot.get(url)
                    .basic_auth("admin", Some("admin"))
                    .send()
                    .await
                    .map(|r| r.status().is_success())
            }
        })
        .buffer_unordered(args.concurrency)
        .filter(|r| std::future::ready(!matches!(r, Ok(true))))
        .count()
        .await;
    let hot_time = t.elapsed();
    println!(
        "phase 2: {} GET FirmwareInventory over {} BMCs (keep-alive, {} in flight): {:.2?}, {:.0} req/s, {failures} failures",
        args.requests,
        hot_urls.len(),
        args.concurrency,
        hot_time,
        args.requests as f64 / hot_time.as_secs_f64()
    );
    println!("RSS after load: {:.1} MiB", rss_mib().unwrap_or(f64::NAN));
    let t = Instant::now();
    fleet.shutdown().await;
    println!("shutdown in {:.2?}", t.elapsed());
    Ok(())
}
