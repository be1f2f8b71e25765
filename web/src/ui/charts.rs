//! Charts drawn on the server as SVG, so they need no script and show in
//! a screenshot or a saved page.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use chrono::{DateTime, NaiveDate, Utc};
use orchestrator_db::health::{Cohort, HealthSample};
use orchestrator_db::overview::DailyOutcomes;

/// What the chart of a metric marks: the threshold (the control's level
/// moved by `min_effect`, or its rate times it), where a gate failed, and
/// when each look was evaluated.
#[derive(Debug, Clone, Default)]
pub(crate) struct ChartMarks {
    pub gate: String,
    pub min_effect: f64,
    pub rate: bool,
    pub lower_is_worse: bool,
    pub looks: Vec<DateTime<Utc>>,
    pub failed_at: Option<DateTime<Utc>>,
}

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

fn frame(svg: &mut String, title: &str, (y_min, y_max): (f64, f64), y_label: &dyn Fn(f64) -> String) {
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
            label = esc(&y_label(y_min + (y_max - y_min) * frac)),
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
    frame(&mut svg, "Failed updates per day (% of finished)", (0.0, y_max), &|v| {
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
/// nodes (events per exposure for counters, the mean reading for levels),
/// with the gate's marks where `marks` has the metric.
pub(crate) fn cohort_charts(samples: &[HealthSample], marks: &BTreeMap<String, ChartMarks>) -> Vec<String> {
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
        .filter_map(|(metric, windows)| cohort_chart(metric, &windows, marks.get(metric)))
        .collect()
}

/// The y range shown: from 0 when 0 is close enough not to flatten the
/// lines, else from just under the lowest value, so two cohorts a few
/// degrees apart at 70 °C do not draw as one line.
fn y_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !lo.is_finite() || !hi.is_finite() {
        return (0.0, 1.0);
    }
    if hi <= 0.0 && lo >= 0.0 {
        return (0.0, 1.0);
    }
    let spread = hi - lo;
    if lo >= 0.0 && lo <= hi * 0.25 {
        return (0.0, hi * 1.15);
    }
    let pad = if spread > 0.0 {
        spread * 0.15
    } else {
        hi.abs().max(1.0) * 0.05
    };
    (lo - pad, hi + pad)
}

fn y_text(step: f64) -> impl Fn(f64) -> String {
    move |v: f64| {
        if step >= 10.0 {
            format!("{v:.0}")
        } else if step >= 0.1 {
            format!("{v:.1}")
        } else if step >= 0.001 {
            format!("{v:.3}")
        } else {
            format!("{v:.2e}")
        }
    }
}

fn cohort_chart(metric: &str, windows: &Windows, marks: Option<&ChartMarks>) -> Option<String> {
    let first_window = *windows.keys().next()?;
    let last_window = *windows.keys().next_back()?;
    // The x axis covers the windows and every look, so a look after the
    // last stored window still shows.
    let times = marks
        .iter()
        .flat_map(|m| m.looks.iter().chain(m.failed_at.iter()))
        .copied();
    let first = times.clone().fold(first_window, std::cmp::min);
    let last = times.fold(last_window, std::cmp::max);
    let span = (last - first).num_seconds().max(1) as f64;
    let x_of = |at: DateTime<Utc>| (at - first).num_seconds() as f64 / span;
    let mut series: BTreeMap<Cohort, Vec<(f64, f64)>> = BTreeMap::new();
    let (mut control_num, mut control_den) = (0.0, 0.0);
    for (at, cohorts) in windows {
        for (cohort, (num, den, _)) in cohorts {
            if *den > 0.0 {
                series.entry(*cohort).or_default().push((x_of(*at), num / den));
                if *cohort == Cohort::Control {
                    control_num += num;
                    control_den += den;
                }
            }
        }
    }
    // The threshold: the control over the whole bake moved by min_effect,
    // the line the canary must stay under (or above, for lower-is-worse).
    let threshold = marks.filter(|_| control_den > 0.0).map(|m| {
        let control = control_num / control_den;
        if m.rate {
            control * m.min_effect
        } else if m.lower_is_worse {
            control - m.min_effect
        } else {
            control + m.min_effect
        }
    });
    let (y_min, y_max) = y_range(series.values().flatten().map(|(_, y)| *y).chain(threshold));
    let mut svg = String::new();
    let title = match marks {
        Some(m) => format!("{metric} (gate {}): canary vs control", m.gate),
        None => format!("{metric}: canary vs control"),
    };
    frame(&mut svg, &title, (y_min, y_max), &y_text((y_max - y_min) / 4.0));
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let y_px = |y: f64| TOP + plot_h * (1.0 - (y - y_min) / (y_max - y_min));
    for (cohort, points) in &series {
        let (color, label, dash) = match cohort {
            Cohort::Canary => ("#c8362d", "canary", ""),
            Cohort::Control => ("#2457c5", "control", r#" stroke-dasharray="5 3""#),
        };
        let path: Vec<String> = points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", LEFT + x * plot_w, y_px(*y)))
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
    if let (Some(m), Some(t)) = (marks, threshold) {
        let how = if m.rate {
            format!("control × {}", m.min_effect)
        } else if m.lower_is_worse {
            format!("control − {}", m.min_effect)
        } else {
            format!("control + {}", m.min_effect)
        };
        let _ = write!(
            svg,
            r##"<line class="threshold" x1="{LEFT}" x2="{x2}" y1="{y:.1}" y2="{y:.1}" stroke="#b26b00" stroke-width="1.5" stroke-dasharray="2 3"><title>threshold: {how} (min_effect)</title></line><text x="{x2}" y="{ty:.1}" text-anchor="end" fill="#b26b00">threshold ({how})</text>"##,
            x2 = WIDTH - RIGHT,
            y = y_px(t),
            ty = y_px(t) - 3.0,
        );
    }
    let axis = TOP + plot_h;
    if let Some(m) = marks {
        for (i, at) in m.looks.iter().enumerate() {
            let x = LEFT + x_of(*at) * plot_w;
            let _ = write!(
                svg,
                r##"<line class="look" x1="{x:.1}" x2="{x:.1}" y1="{axis:.1}" y2="{y2:.1}" stroke="#333" stroke-width="1.5"><title>look {n} at {t}</title></line>"##,
                y2 = axis + 6.0,
                n = i + 1,
                t = at.format("%H:%M UTC"),
            );
        }
        if let Some(at) = m.failed_at {
            let x = LEFT + x_of(at) * plot_w;
            let _ = write!(
                svg,
                r##"<line class="failed" x1="{x:.1}" x2="{x:.1}" y1="{TOP}" y2="{axis:.1}" stroke="#c8362d" stroke-width="2"><title>gate failed at {t}</title></line><text x="{tx:.1}" y="{ty}" fill="#c8362d" font-weight="600">failed</text>"##,
                t = at.format("%H:%M UTC"),
                tx = x + 3.0,
                ty = TOP + 10.0,
            );
        }
    }
    // Five time ticks along the x axis.
    for i in 0..=4 {
        let frac = f64::from(i) / 4.0;
        let at = first + chrono::TimeDelta::seconds((span * frac) as i64);
        let anchor = match i {
            0 => "start",
            4 => "end",
            _ => "middle",
        };
        let _ = write!(
            svg,
            r##"<text class="x-tick" x="{x:.1}" y="{y}" text-anchor="{anchor}" fill="#6b7385">{label}</text>"##,
            x = LEFT + frac * plot_w,
            y = HEIGHT - 4.0,
            label = at.format(if i == 4 { "%H:%M UTC" } else { "%H:%M" }),
        );
    }
    svg.push_str("</svg>");
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
        let charts = cohort_charts(&samples, &BTreeMap::new());
        assert_eq!(charts.len(), 1);
        let svg = &charts[0];
        assert!(svg.contains("xid_errors: canary vs control"), "{svg}");
        assert_eq!(svg.matches("<polyline").count(), 2, "{svg}");
        // The canary's second point (0.9) is the top of the plot; control stays low.
        assert!(svg.contains("<title>canary</title>") && svg.contains("<title>control</title>"));
        assert!(cohort_charts(&[], &BTreeMap::new()).is_empty());
    }

    fn level(cohort: Cohort, minute: i64, mean: f64) -> HealthSample {
        HealthSample {
            metric: "gpu_temp_c".into(),
            readings: 10,
            sum: mean * 10.0,
            ..sample(cohort, minute, 0, 0.0)
        }
    }

    #[test]
    fn a_gated_chart_has_an_honest_axis_its_threshold_looks_and_failure() {
        let at = |minute: i64| DateTime::<Utc>::UNIX_EPOCH + chrono::Duration::minutes(minute);
        let samples: Vec<HealthSample> = (0..6)
            .flat_map(|i| {
                [
                    level(Cohort::Canary, i * 10, 74.0 + i as f64),
                    level(Cohort::Control, i * 10, 70.0),
                ]
            })
            .collect();
        let marks = BTreeMap::from([(
            "gpu_temp_c".to_owned(),
            ChartMarks {
                gate: "temp".into(),
                min_effect: 3.0,
                rate: false,
                lower_is_worse: false,
                looks: vec![at(15), at(30), at(45)],
                failed_at: Some(at(45)),
            },
        )]);
        let svg = &cohort_charts(&samples, &marks)[0];
        // The axis starts near the data, not at 0, so 70 and 74 °C are apart.
        assert!(!svg.contains(r##"text-anchor="end" fill="#6b7385">0</text>"##), "{svg}");
        let lowest: f64 = svg
            .split(r##"text-anchor="end" fill="#6b7385">"##)
            .nth(1)
            .and_then(|rest| rest.split('<').next())
            .and_then(|label| label.parse().ok())
            .unwrap_or(0.0);
        assert!(lowest > 60.0 && lowest < 70.0, "lowest label {lowest}:\n{svg}");
        assert!(svg.contains("threshold (control + 3)"), "{svg}");
        assert_eq!(svg.matches(r#"class="look""#).count(), 3, "{svg}");
        assert_eq!(svg.matches(r#"class="failed""#).count(), 1, "{svg}");
        assert_eq!(svg.matches(r#"class="x-tick""#).count(), 5, "{svg}");
        // A rate that starts near 0 keeps 0 on the axis.
        let rates = [sample(Cohort::Canary, 0, 1, 10.0), sample(Cohort::Canary, 10, 9, 10.0)];
        let plain = &cohort_charts(&rates, &BTreeMap::new())[0];
        assert!(plain.contains(r##"fill="#6b7385">0.0</text>"##), "{plain}");
        assert!(!plain.contains("threshold"), "no gate, no threshold");
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
