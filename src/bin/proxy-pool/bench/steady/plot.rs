//! `bench --steady --plot FILE.svg`: the run's timeline as a picture, one
//! panel a measure, second by second: each side's share of Redis time,
//! extraction p99 beside the bystander's `PING` p99, the backlog of spent
//! entries, and memory. The extraction rate asked for heads each step.

use std::path::Path;

use plotters::prelude::*;

use super::summary::{SteadyReport, SteadySecond};

/// Pixels of the picture: wide enough for a ten-minute run's seconds.
const SIZE: (u32, u32) = (1200, 1100);

/// One line of a panel: its legend and colour, and its value in a second.
type Series<'a> = (&'a str, RGBColor, &'a dyn Fn(&SteadySecond) -> f64);

/// Draws `report`'s timeline into an SVG file at `path`.
pub fn draw(report: &SteadyReport, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(40);
    title.titled(
        &format!(
            "bench --steady: {} proxies, {} combinations, Redis {}; steps (calls/s): {}",
            report.pool,
            report.shape,
            report.redis_version,
            steps(report)
        ),
        ("sans-serif", 18),
    )?;
    let panels = body.split_evenly((4, 1));
    let seconds = &report.seconds;
    let share = |f: fn(&SteadySecond) -> f64| move |s: &SteadySecond| 100.0 * f(s);
    let extract = share(|s| s.shares.extract);
    let writers = share(|s| s.shares.writers);
    panel(
        &panels[0],
        seconds,
        "share of Redis time, %",
        &[("extraction", BLUE, &extract), ("writers", RED, &writers)],
    )?;
    panel(
        &panels[1],
        seconds,
        "99th percentile, ms",
        &[
            ("extraction", BLUE, &|s| s.p99_us as f64 / 1000.0),
            ("bystander PING", MAGENTA, &|s| {
                s.ping_p99_us as f64 / 1000.0
            }),
        ],
    )?;
    panel(
        &panels[2],
        seconds,
        "spent index entries not yet pruned",
        &[("backlog", BLACK, &|s| s.backlog as f64)],
    )?;
    panel(
        &panels[3],
        seconds,
        "Redis used_memory, MB",
        &[("memory", GREEN, &|s| s.memory as f64 / 1e6)],
    )?;
    root.present()?;
    Ok(())
}

/// The steps' rates in order, the quiet phase (no writers) marked.
fn steps(report: &SteadyReport) -> String {
    report
        .steps
        .iter()
        .map(|s| {
            if s.writers {
                s.rate.to_string()
            } else {
                format!("{} alone", s.rate)
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// One panel: `series` over the seconds, with its caption and legend.
fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    seconds: &[SteadySecond],
    caption: &str,
    series: &[Series],
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    let last = seconds.last().map_or(1, |s| s.t.max(1)) as f64;
    let top = series
        .iter()
        .flat_map(|(_, _, value)| seconds.iter().map(value))
        .fold(0.0_f64, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 15))
        .margin(8)
        .x_label_area_size(24)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..last, 0.0..(top * 1.1).max(1.0))?;
    chart.configure_mesh().x_desc("s").draw()?;
    for &(name, colour, value) in series {
        chart
            .draw_series(LineSeries::new(
                seconds.iter().map(|s| (s.t as f64, value(s))),
                colour.stroke_width(2),
            ))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], colour));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}
