//! The detection bench's cells at reduced seeds, for iterating on the fleet method without building the
//! `waveguard` binary: `cargo run --release -p orchestrator-detect --example detection_cells -- [EFFECT_SEEDS]
//! [HEALTHY_SEEDS] [FILTER]`. Same simulation (`fleet::sim`), cells and seeds (0..N) as
//! `waveguard bench --only detection`; prints the fleet method's figures only (the current method is
//! unchanged by work on the fleet method) and the calibration of `policy power` against them.

use orchestrator_detect::fleet::sim::{self, BenchPolicy, Cell, End, Run};
use orchestrator_detect::stats::{clopper_pearson_lower, clopper_pearson_upper};

fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    let index = ((sorted.len().checked_sub(1)?) as f64 * q).round() as usize;
    sorted.get(index).copied()
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

fn pct(hits: usize, n: usize) -> f64 {
    100.0 * hits as f64 / n.max(1) as f64
}

fn caught_within(runs: &[Run], nodes: usize) -> usize {
    runs.iter()
        .filter(|r| matches!(r.end, End::Detected { exposed, .. } if exposed <= nodes))
        .count()
}

fn calibration(predicted: f64, hits: usize, n: usize) -> (String, bool) {
    let lower = clopper_pearson_lower(hits as u64, n as u64, 0.005);
    let upper = clopper_pearson_upper(hits as u64, n as u64, 0.005);
    let inside = (lower..=upper).contains(&predicted);
    let text = format!(
        "{:>5.1}% {:>5.1}% [{:>5.1},{:>5.1}] {:<3}",
        predicted * 100.0,
        pct(hits, n),
        lower * 100.0,
        upper * 100.0,
        if inside { "in" } else { "OUT" }
    );
    (text, inside)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let effect_seeds = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(50);
    let healthy_seeds = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(200);
    let filter = args.get(3).cloned().unwrap_or_default();
    let policy = BenchPolicy::default();
    let [canary_nodes, early_nodes] = sim::wave_exposure(&policy);
    let cells: Vec<Cell> = sim::cells(effect_seeds, healthy_seeds)
        .into_iter()
        .filter(|c| c.label.contains(&filter))
        .collect();
    let started = std::time::Instant::now();
    let (mut inside, mut checked) = (0, 0);
    println!(
        "{:<28} {:>6} {:>6} {:>6} {:>9} {:>9} {:>14} {:>6}  calibration canary | 10%",
        "cell", "caught", "canary", "<15%", "nodes50/90", "hours50/95", "x bound (50%)", "held"
    );
    for cell in &cells {
        let runs: Vec<Run> = (0..u64::from(cell.seeds))
            .map(|seed| sim::run_fleet_method(cell, &policy, seed))
            .collect();
        let n = runs.len();
        let (mut detect_h, mut exposed, mut holds, mut before_15) = (Vec::new(), Vec::new(), 0, 0);
        for run in &runs {
            match run.end {
                End::Detected { hour, exposed: e } => {
                    detect_h.push(hour);
                    exposed.push(e as f64);
                    before_15 += usize::from(e * 100 < 15 * sim::NODES);
                }
                End::Held { .. } => holds += 1,
                _ => {}
            }
        }
        let detect_h = sorted(detect_h);
        let exposed = sorted(exposed);
        let fmt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0}"));
        if cell.harmful() {
            let mut line = format!(
                "{:<28} {:>5.1}% {:>5.1}% {:>5.1}% {:>9} {:>9} {:>14} {:>5.1}%",
                cell.label,
                pct(detect_h.len(), n),
                pct(caught_within(&runs, canary_nodes), n),
                pct(before_15, n),
                format!("{}/{}", fmt(quantile(&exposed, 0.5)), fmt(quantile(&exposed, 0.9))),
                format!("{}/{}", fmt(quantile(&detect_h, 0.5)), fmt(quantile(&detect_h, 0.95))),
                sim::bound_ratios(&runs).text(),
                pct(holds, n),
            );
            if let Some([a, b]) = sim::predicted_catch(cell, &policy) {
                let (ta, ia) = calibration(a, caught_within(&runs, canary_nodes), n);
                let (tb, ib) = calibration(b, caught_within(&runs, early_nodes), n);
                inside += usize::from(ia) + usize::from(ib);
                checked += 2;
                line.push_str(&format!("  {ta}| {tb}"));
            }
            println!("{line}");
        } else {
            let fails = detect_h.len();
            let canary_pass = sorted(runs.iter().filter_map(|r| r.wave_pass_h[0]).collect());
            println!(
                "{:<28} rollback {:>5.1}% (up95 {:>4.1}%) held {:>5.1}% canary pass h {}/{}",
                cell.label,
                pct(fails, n),
                100.0 * clopper_pearson_upper(fails as u64, n as u64, 0.05),
                pct(holds, n),
                fmt(quantile(&canary_pass, 0.5)),
                fmt(quantile(&canary_pass, 0.95)),
            );
        }
    }
    println!(
        "calibration inside 99%: {inside} of {checked}; {:.0} s",
        started.elapsed().as_secs_f64()
    );
}
