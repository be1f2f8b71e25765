//! Charts drawn on the server as SVG, so they need no script and show in
//! a screenshot or a saved page.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use chrono::{DateTime, NaiveDate, Utc};
use orchestrator_db::health::{Cohort, HealthSample};
use orchestrator_db::overview::DailyOutcomes;

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 200.0;
const LEFT: f64 = 48.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 24.0;
const BOTTOM: f64 = 28.0;

fn esc(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn frame(svg: &mut String, title: &str, y_max: f64, y_label: &dyn Fn(f64) -> String) {
    let _ = write!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{t}" font-family="system-ui, sans-serif" font-size="11">"##,
        t = esc(title)
    );
    let _ = write!(
        svg,
        r##"<text x="{LEFT}" y="14" font-weight="600">{}</text>"##,
        esc(title)
    );
    let plot_h = HEIGHT - TOP - BOTTOM;
    for i in 0..=4 {
        let frac = f64::from(i) / 4.0;
        let y = TOP + plot_h * (1.0 - frac);
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" x2="{x2}" y1="{y:.1}" y2="{y:.1}" stroke="#e2e6ee"/><text x="{lx}" y="{ty:.1}" text-anchor="end" fill="#6b7385">{label}</text>"##,
            x2 = WIDTH - RIGHT,
            lx = LEFT - 4.0,
            ty = y + 4.0,
            label = esc(&y_label(y_max * frac)),
        );
    }
}

/// Bars of the daily update failure rate (failed / finished), one per day
/// from `since`, with the number of finished updates under each.
pub(crate) fn failure_trend(outcomes: &[DailyOutcomes], since: NaiveDate, days: i64) -> String {
    let by_day: BTreeMap<NaiveDate, &DailyOutcomes> = outcomes.iter().map(|o| (o.day, o)).collect();
    let rates: Vec<(NaiveDate, Option<f64>, u64)> = (0..days)
        .map(|i| {
            let day = since + chrono::Duration::days(i);
            match by_day.get(&day) {
                Some(o) if o.succeeded + o.failed > 0 => {
                    let finished = o.succeeded + o.failed;
                    (day, Some(o.failed as f64 / finished as f64), finished)
                }
                _ => (day, None, 0),
            }
        })
        .collect();
    let peak = rates.iter().filter_map(|(_, r, _)| *r).fold(0.0_f64, f64::max);
    // Round the axis up to a readable ceiling, at least 5%.
    let y_max = [0.05, 0.1, 0.2, 0.5, 1.0]
        .into_iter()
        .find(|m| peak <= *m)
        .unwrap_or(1.0);
    let mut svg = String::new();
    frame(&mut svg, "Failed updates per day (% of finished)", y_max, &|v| {
        format!("{:.0}%", v * 100.0)
    });
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let slot = plot_w / days.max(1) as f64;
    for (i, (day, rate, finished)) in rates.iter().enumerate() {
        let x = LEFT + slot * i as f64 + slot * 0.15;
        let w = slot * 0.7;
        if let Some(rate) = rate {
            let h = (rate / y_max).min(1.0) * plot_h;
            let color = if *rate > 0.05 { "#c8362d" } else { "#1f8f4e" };
            let _ = write!(
                svg,
                r##"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" fill="{color}"><title>{day}: {pct:.1}% of {finished} failed</title></rect>"##,
                y = TOP + plot_h - h.max(1.0),
                h = h.max(1.0),
                pct = rate * 100.0,
            );
        }
        if i % 2 == 0 {
            let _ = write!(
                svg,
                r##"<text x="{cx:.1}" y="{ty}" text-anchor="middle" fill="#6b7385">{label}</text>"##,
                cx = x + w / 2.0,
                ty = HEIGHT - 10.0,
                label = day.format("%m-%d"),
            );
        }
    }
    if rates.iter().all(|(_, r, _)| r.is_none()) {
        let _ = write!(
            svg,
            r##"<text x="{x}" y="{y}" text-anchor="middle" fill="#6b7385">no updates finished in this period</text>"##,
            x = LEFT + plot_w / 2.0,
            y = TOP + plot_h / 2.0
        );
    }
    svg.push_str("</svg>");
    svg
}

/// Per window, per cohort: (numerator, denominator, is a rate).
type Windows = BTreeMap<DateTime<Utc>, BTreeMap<Cohort, (f64, f64, bool)>>;

/// One line per cohort: the metric per window, pooled over the cohort's
/// nodes (events per exposure for counters, the mean reading for levels).
pub(crate) fn cohort_charts(samples: &[HealthSample]) -> Vec<String> {
    let mut metrics: BTreeMap<&str, Windows> = BTreeMap::new();
    for s in samples {
        let entry = metrics
            .entry(s.metric.as_str())
            .or_default()
            .entry(s.window_start)
            .or_default()
            .entry(s.cohort)
            .or_insert((0.0, 0.0, false));
        if s.readings > 0 {
            entry.0 += s.sum;
            entry.1 += s.readings as f64;
        } else {
            entry.0 += s.events as f64;
            entry.1 += s.exposure;
            entry.2 = true;
        }
    }
    metrics
        .into_iter()
        .filter_map(|(metric, windows)| cohort_chart(metric, &windows))
        .collect()
}

fn cohort_chart(metric: &str, windows: &Windows) -> Option<String> {
    let first = *windows.keys().next()?;
    let last = *windows.keys().next_back()?;
    let span = (last - first).num_seconds().max(1) as f64;
    let mut series: BTreeMap<Cohort, Vec<(f64, f64)>> = BTreeMap::new();
    for (at, cohorts) in windows {
        for (cohort, (num, den, _)) in cohorts {
            if *den > 0.0 {
                let x = (*at - first).num_seconds() as f64 / span;
                series.entry(*cohort).or_default().push((x, num / den));
            }
        }
    }
    let y_peak = series.values().flatten().map(|(_, y)| *y).fold(0.0_f64, f64::max);
    let y_max = if y_peak > 0.0 { y_peak * 1.15 } else { 1.0 };
    let mut svg = String::new();
    frame(&mut svg, &format!("{metric}: canary vs control"), y_max, &|v| {
        if v.abs() >= 100.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.2}")
        }
    });
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    for (cohort, points) in &series {
        let (color, label, dash) = match cohort {
            Cohort::Canary => ("#c8362d", "canary", ""),
            Cohort::Control => ("#2457c5", "control", r#" stroke-dasharray="5 3""#),
        };
        let path: Vec<String> = points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", LEFT + x * plot_w, TOP + plot_h * (1.0 - y / y_max)))
            .collect();
        let _ = write!(
            svg,
            r##"<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{}"><title>{label}</title></polyline>"##,
            path.join(" ")
        );
        let legend_x = if matches!(cohort, Cohort::Canary) {
            WIDTH - 150.0
        } else {
            WIDTH - 80.0
        };
        let _ = write!(
            svg,
            r##"<rect x="{legend_x}" y="6" width="10" height="3" fill="{color}"/><text x="{tx}" y="12">{label}</text>"##,
            tx = legend_x + 14.0
        );
    }
    let _ = write!(
        svg,
        r##"<text x="{LEFT}" y="{y}" fill="#6b7385">{from}</text><text x="{x}" y="{y}" text-anchor="end" fill="#6b7385">{to}</text></svg>"##,
        y = HEIGHT - 10.0,
        x = WIDTH - RIGHT,
        from = first.format("%H:%M"),
        to = last.format("%H:%M UTC"),
    );
    Some(svg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use orchestrator_types::{NodeId, RolloutId, WaveId};

    fn sample(cohort: Cohort, minute: i64, events: u64, exposure: f64) -> HealthSample {
        HealthSample {
            rollout_id: RolloutId(1),
            wave_id: WaveId(1),
            node_id: NodeId(1),
            cohort,
            metric: "xid_errors".into(),
            window_start: DateTime::<Utc>::UNIX_EPOCH + chrono::Duration::minutes(minute),
            events,
            exposure,
            readings: 0,
            sum: 0.0,
            min: None,
            max: None,
            units: BTreeMap::new(),
        }
    }

    #[test]
    fn cohort_chart_draws_canary_and_control_per_metric() {
        let samples = [
            sample(Cohort::Canary, 0, 1, 10.0),
            sample(Cohort::Canary, 10, 9, 10.0),
            sample(Cohort::Control, 0, 1, 10.0),
            sample(Cohort::Control, 10, 1, 10.0),
        ];
        let charts = cohort_charts(&samples);
        assert_eq!(charts.len(), 1);
        let svg = &charts[0];
        assert!(svg.contains("xid_errors: canary vs control"), "{svg}");
        assert_eq!(svg.matches("<polyline").count(), 2, "{svg}");
        // The canary's second point (0.9) is the top of the plot; control stays low.
        assert!(svg.contains("<title>canary</title>") && svg.contains("<title>control</title>"));
        assert!(cohort_charts(&[]).is_empty());
    }

    #[test]
    fn trend_marks_days_without_data() {
        let day = NaiveDate::from_ymd_opt(2026, 12, 1).unwrap_or_default();
        let svg = failure_trend(
            &[DailyOutcomes {
                day,
                succeeded: 9,
                failed: 1,
            }],
            day,
            3,
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert_eq!(svg.matches("<rect").count(), 1, "{svg}");
        assert!(svg.contains("10.0% of 10 failed"), "{svg}");
        let empty = failure_trend(&[], day, 3);
        assert!(empty.contains("no updates finished"));
    }
}
