//! Rates over time as an inline SVG line chart: server-rendered, no script, one polyline per
//! series over the minutes of the last hour, scaled to the largest count, with its legend and
//! the totals as a table (what a screen reader and a test read).

use std::fmt::Write as _;

use super::super::html::{esc, table};
use crate::store::{RATE_SERIES, Rates};

const WIDTH: usize = 720;
const HEIGHT: usize = 180;
/// Room for the y-axis labels on the left and the x-axis labels below.
const LEFT: usize = 48;
const BOTTOM: usize = 24;
const TOP: usize = 8;

/// One colour per series of `RATE_SERIES`, told apart in the legend by name as well.
const COLOURS: &[&str] = &[
    "#1f77b4", "#9467bd", "#2ca02c", "#17becf", "#d62728", "#ff7f0e",
];

/// The chart of `rates` (`RATE_SERIES`, per minute, oldest left) and its totals.
pub fn rates_chart(rates: &Rates) -> String {
    let minutes = rates.series.first().map_or(0, Vec::len);
    let top = rates
        .series
        .iter()
        .flatten()
        .copied()
        .max()
        .unwrap_or(0)
        .max(1);
    let plot_w = WIDTH - LEFT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |i: usize| LEFT + i * plot_w / minutes.saturating_sub(1).max(1);
    let y = |n: u64| TOP + plot_h - (n.min(top) as usize * plot_h / top as usize);
    let mut svg = format!(
        "<svg class=\"chart\" role=\"img\" aria-labelledby=\"rates-title\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         xmlns=\"http://www.w3.org/2000/svg\"><title id=\"rates-title\">Messages per minute \
         over the last hour</title>"
    );
    // Axes, the largest count and the time labels.
    let _ = write!(
        svg,
        "<line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{b}\" stroke=\"#888\"/>\
         <line x1=\"{LEFT}\" y1=\"{b}\" x2=\"{WIDTH}\" y2=\"{b}\" stroke=\"#888\"/>\
         <text x=\"{lx}\" y=\"{ty}\" text-anchor=\"end\" font-size=\"11\">{top}</text>\
         <text x=\"{lx}\" y=\"{b}\" text-anchor=\"end\" font-size=\"11\">0</text>\
         <text x=\"{LEFT}\" y=\"{HEIGHT}\" font-size=\"11\">−{m} min</text>\
         <text x=\"{WIDTH}\" y=\"{HEIGHT}\" text-anchor=\"end\" font-size=\"11\">now</text>",
        b = TOP + plot_h,
        lx = LEFT - 4,
        ty = TOP + 10,
        m = minutes.saturating_sub(1),
    );
    for (series, colour) in rates.series.iter().zip(COLOURS) {
        let points: Vec<String> = series
            .iter()
            .enumerate()
            .map(|(i, n)| format!("{},{}", x(i), y(*n)))
            .collect();
        let _ = write!(
            svg,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>",
            points.join(" ")
        );
    }
    svg.push_str("</svg>");
    let mut legend = String::from("<ul class=\"legend\">");
    for (name, colour) in RATE_SERIES.iter().zip(COLOURS) {
        let _ = write!(
            legend,
            "<li><svg width=\"12\" height=\"12\" aria-hidden=\"true\"><rect width=\"12\" \
             height=\"12\" fill=\"{colour}\"/></svg> {}</li>",
            esc(name)
        );
    }
    legend.push_str("</ul>");
    let floor = if rates.capped { "≥ " } else { "" };
    let rows: Vec<Vec<String>> = RATE_SERIES
        .iter()
        .zip(&rates.series)
        .map(|(name, series)| {
            let last_minute = series.last().copied().unwrap_or(0);
            let hour: u64 = series.iter().sum();
            let busiest = series.iter().copied().max().unwrap_or(0);
            vec![
                esc(name),
                last_minute.to_string(),
                format!("{floor}{hour}"),
                busiest.to_string(),
            ]
        })
        .collect();
    let totals = table(
        "Per minute, last hour",
        &["Messages", "This minute", "Last hour", "Busiest minute"],
        &rows,
    );
    format!("<h2>Rates over time</h2>{svg}{legend}{totals}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_has_a_line_per_series_scaled_to_the_largest_count() {
        let mut series = vec![vec![0u64; 60]; RATE_SERIES.len()];
        series[0][59] = 30;
        series[2][0] = 15;
        let rates = Rates {
            since_minute: 0,
            series,
            capped: false,
        };
        let html = rates_chart(&rates);
        assert_eq!(html.matches("<polyline").count(), RATE_SERIES.len());
        // The largest count is the top label; the received line ends at the top right.
        assert!(html.contains(">30</text>"), "{html}");
        assert!(html.contains(&format!("{WIDTH},{TOP}")), "{html}");
        // Sent's first minute is half way up.
        let half = TOP + (HEIGHT - TOP - BOTTOM) / 2;
        assert!(html.contains(&format!("{LEFT},{half}")), "{html}");
        assert!(html.contains("<td>30</td>"), "totals: {html}");
        assert!(!html.contains('≥'), "{html}");
    }
}
