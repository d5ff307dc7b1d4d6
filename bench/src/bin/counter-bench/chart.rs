//! `--svg`: throughput against clients, one line per design. `buffered`
//! cells are listed under the legend rather than drawn: their increments
//! accepted per second are orders of magnitude above the others and would
//! flatten every other line.
//!
//! Written by hand rather than with a plotting crate: the chart is a few
//! lines and labels, and plotters' text layout needs a font backend
//! (system fonts or a bundled TTF) that a fresh clone should not require.

use std::fmt::Write as _;

use crate::{
    cli::{Design, Workload},
    writes::CellResult,
};

const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 520.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 280.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 8] = [
    "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
];

/// An SVG document charting the cells' throughput.
pub fn svg(backend: &str, cells: &[CellResult]) -> String {
    let (buffered, cells): (Vec<&CellResult>, Vec<&CellResult>) =
        cells.iter().partition(|c| c.design == Design::Buffered);
    let mut clients: Vec<usize> = cells.iter().map(|c| c.clients).collect();
    clients.sort_unstable();
    clients.dedup();
    let mut series: Vec<(String, Vec<(usize, f64)>)> = Vec::new();
    for cell in &cells {
        let name = series_name(cell);
        match series.iter_mut().find(|(n, _)| *n == name) {
            Some((_, points)) => points.push((cell.clients, cell.tx_per_s)),
            None => series.push((name, vec![(cell.clients, cell.tx_per_s)])),
        }
    }
    let top = nice_ceiling(cells.iter().map(|c| c.tx_per_s).fold(0.0, f64::max));
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |c: usize| {
        let i = clients.iter().position(|&v| v == c).unwrap_or(0) as f64;
        LEFT + if clients.len() > 1 {
            i * plot_w / (clients.len() - 1) as f64
        } else {
            plot_w / 2.0
        }
    };
    let y = |v: f64| TOP + plot_h - v / top * plot_h;

    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="28" font-size="16">counter-bench on {}: transactions per second</text>"#,
        escape(backend)
    );
    for i in 0..=5 {
        let v = top * i as f64 / 5.0;
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{v:.0}</text>"##,
            LEFT + plot_w,
            LEFT - 8.0,
            y(v) + 4.0,
            y = y(v),
        );
    }
    for &c in &clients {
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{c}</text>"#,
            x(c),
            TOP + plot_h + 20.0
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{}" text-anchor="middle">clients</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 15.0
    );
    for (i, (name, points)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> = points
            .iter()
            .map(|&(c, v)| format!("{:.1},{:.1}", x(c), y(v)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        for &(c, v) in points {
            let _ = writeln!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#,
                x(c),
                y(v)
            );
        }
        let ly = TOP + 10.0 + i as f64 * 20.0;
        let lx = WIDTH - RIGHT + 20.0;
        let _ = writeln!(
            out,
            r#"<line x1="{lx}" x2="{}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            lx + 20.0,
            lx + 26.0,
            ly + 4.0,
            escape(name)
        );
    }
    let lx = WIDTH - RIGHT + 20.0;
    let mut ly = TOP + 10.0 + series.len() as f64 * 20.0 + 10.0;
    if !buffered.is_empty() {
        let _ = writeln!(
            out,
            r#"<text x="{lx}" y="{ly}">not drawn, increments/s accepted:</text>"#
        );
    }
    for cell in buffered {
        ly += 18.0;
        let _ = writeln!(
            out,
            r#"<text x="{lx}" y="{ly}">{} x{}: {:.0}</text>"#,
            escape(&series_name(cell)),
            cell.clients,
            cell.tx_per_s
        );
    }
    out.push_str("</svg>\n");
    out
}

/// The workload and design, with the slot count unless the design's name
/// carries it (`zipf`'s `fixed16`) or is a ceiling (`adaptive`).
fn series_name(cell: &CellResult) -> String {
    let mut name = format!("{} {}", cell.workload, cell.name);
    if let Some(slots) = cell.slots.filter(|_| cell.workload != Workload::Zipf) {
        let _ = write!(name, " {slots} slots");
    }
    if let Some(strategy) = cell.slot_strategy {
        let _ = write!(name, " {strategy}");
    }
    name
}

/// The smallest round number (1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a
/// power of ten) at or above `v`, so the chart's top is near the data.
fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let magnitude = 10f64.powf(v.log10().floor());
    [1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|&c| c >= v)
        .unwrap_or(10.0 * magnitude)
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_top_is_a_round_number_just_above_the_data() {
        assert_eq!(nice_ceiling(2736.0), 3000.0);
        assert_eq!(nice_ceiling(4622.0), 5000.0);
        assert_eq!(nice_ceiling(190.0), 200.0);
        assert_eq!(nice_ceiling(1000.0), 1000.0);
        assert_eq!(nice_ceiling(0.0), 1.0);
    }

    #[test]
    fn labels_are_escaped() {
        assert_eq!(escape("a<b & c>"), "a&lt;b &amp; c&gt;");
    }
}
