//! The growth chart: each cost at each size divided by its cost at the
//! smallest size, on log-log axes, as a self-contained SVG (no script, no
//! fonts beyond the reader's sans-serif).

use std::fmt::Write;

use serde_json::Value;

/// The figures drawn, with their legend names.
const SERIES: [(&str, &str, &str); 6] = [
    ("page_read_us", "page read (100 owners)", "#1f77b4"),
    ("cached_page_read_us", "page read, cached", "#17becf"),
    ("increment_p50_us", "one increment (p50)", "#2ca02c"),
    ("bytes_per_counter", "bytes per counter", "#7f7f7f"),
    ("top_page_ms", "top page", "#d62728"),
    ("compact_s", "full compaction", "#ff7f0e"),
];

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 440.0;
/// Margins: the y axis's labels, the legend, the title, the x axis's labels.
const LEFT: f64 = 70.0;
const RIGHT: f64 = 250.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

/// One drawn line: its legend, its color, its (owners, ratio) points.
struct Line {
    name: &'static str,
    color: &'static str,
    points: Vec<(f64, f64)>,
}

/// The chart of `rows` (the growth section's `owners` figures, smallest
/// first) on `backend`.
pub(crate) fn svg(backend: &str, rows: &[Value]) -> String {
    let owners: Vec<f64> = rows.iter().filter_map(|r| r["owners"].as_f64()).collect();
    let lines: Vec<Line> = SERIES
        .iter()
        .filter_map(|(field, name, color)| {
            let base = rows.first()?[*field].as_f64().filter(|b| *b > 0.0)?;
            let points = rows
                .iter()
                .filter_map(|r| Some((r["owners"].as_f64()?, r[*field].as_f64()? / base)))
                .collect();
            Some(Line {
                name,
                color,
                points,
            })
        })
        .collect();
    let (x_lo, x_hi) = (
        owners.first().copied().unwrap_or(1.0).log10().floor(),
        owners
            .last()
            .copied()
            .unwrap_or(10.0)
            .log10()
            .ceil()
            .max(1.0),
    );
    let ratios = || lines.iter().flat_map(|l| l.points.iter().map(|(_, y)| *y));
    let y_lo = ratios().fold(1.0_f64, f64::min).log10().floor().min(0.0);
    let y_hi = ratios().fold(1.0_f64, f64::max).log10().ceil().max(1.0);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |v: f64| LEFT + (v.log10() - x_lo) / (x_hi - x_lo).max(1e-9) * plot_w;
    let y = |v: f64| TOP + plot_h - (v.log10() - y_lo) / (y_hi - y_lo).max(1e-9) * plot_h;

    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="22" font-size="14">How each cost grows with the owners ({backend}; 1 = its cost at {} owners)</text>"#,
        owners.first().copied().unwrap_or(0.0)
    );
    for e in x_lo as i32..=x_hi as i32 {
        let px = x(10f64.powi(e));
        let _ = writeln!(
            out,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#ddd"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">10^{e}</text>"##,
            TOP + plot_h,
            TOP + plot_h + 18.0
        );
    }
    for e in y_lo as i32..=y_hi as i32 {
        let py = y(10f64.powi(e));
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}x</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            py + 4.0,
            10f64.powi(e)
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">owners (x 4 keys)</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 12.0
    );
    for (
        i,
        Line {
            name,
            color,
            points,
        },
    ) in lines.iter().enumerate()
    {
        let path: Vec<String> = points
            .iter()
            .map(|(px, py)| format!("{:.1},{:.1}", x(*px), y(*py)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        for (px, py) in points {
            let _ = writeln!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#,
                x(*px),
                y(*py)
            );
        }
        let ly = TOP + 10.0 + i as f64 * 20.0;
        let lx = LEFT + plot_w + 16.0;
        let last = points.last().map_or(0.0, |(_, v)| *v);
        let _ = writeln!(
            out,
            r#"<line x1="{lx}" y1="{ly}" x2="{:.1}" y2="{ly}" stroke="{color}" stroke-width="2"/><text x="{:.1}" y="{:.1}">{name} ({last:.1}x)</text>"#,
            lx + 18.0,
            lx + 24.0,
            ly + 4.0
        );
    }
    out.push_str("</svg>\n");
    out
}
