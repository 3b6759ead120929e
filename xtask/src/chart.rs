//! A small SVG line chart for benchmark figures. Text is emitted as SVG `<text>` for the viewer
//! to render, so no font engine is needed (plotters needs one to lay out its labels).

use std::fmt::Write as _;

/// One line of the chart: a value (or a gap) per x category.
pub(crate) struct Series {
    pub(crate) name: String,
    pub(crate) values: Vec<Option<f64>>,
}

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
const COLOURS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// Renders a chart with categorical x positions (evenly spaced, labelled `x_labels`).
pub(crate) fn line_chart(
    title: &str,
    x_title: &str,
    y_title: &str,
    x_labels: &[String],
    series: &[Series],
) -> String {
    let y_max = nice_ceiling(
        series
            .iter()
            .flat_map(|s| s.values.iter().flatten())
            .fold(0.0, |a: f64, &b| a.max(b)),
    );
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x_at = |i: usize| LEFT + plot_w * (i as f64 + 0.5) / x_labels.len().max(1) as f64;
    let y_at = |v: f64| TOP + plot_h * (1.0 - v / y_max);

    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>
"#,
        LEFT + plot_w / 2.0,
        escape(title)
    );
    for tick in 0..=5 {
        let v = y_max * f64::from(tick) / 5.0;
        let y = y_at(v);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            y + 4.0,
            trim(v)
        );
    }
    for (i, label) in x_labels.iter().enumerate() {
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            x_at(i),
            TOP + plot_h + 18.0,
            escape(label)
        );
    }
    let _ = writeln!(
        svg,
        r#"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{bottom}" stroke="black"/><line x1="{LEFT}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="black"/>
<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>
<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 18.0,
        escape(x_title),
        TOP + plot_h / 2.0,
        escape(y_title),
        bottom = TOP + plot_h,
        right = LEFT + plot_w,
    );
    for (k, s) in series.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        let points: Vec<String> = s
            .values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.map(|v| format!("{:.1},{:.1}", x_at(i), y_at(v))))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
            points.join(" ")
        );
        for p in &points {
            let (x, y) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(svg, r#"<circle cx="{x}" cy="{y}" r="3" fill="{colour}"/>"#);
        }
        let ly = TOP + 10.0 + 20.0 * k as f64;
        let lx = WIDTH - RIGHT + 15.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{colour}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
            lx + 20.0,
            lx + 26.0,
            ly + 4.0,
            escape(&s.name)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// The smallest of 1, 2, 2.5, 5 × 10^k at or above `v` (at least 1).
fn nice_ceiling(v: f64) -> f64 {
    if v <= 1.0 {
        return 1.0;
    }
    let magnitude = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|&c| c >= v)
        .unwrap_or(10.0 * magnitude)
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_ceiling_is_a_round_number_above_the_data() {
        assert_eq!(nice_ceiling(0.3), 1.0);
        assert_eq!(nice_ceiling(97.0), 100.0);
        assert_eq!(nice_ceiling(101.0), 200.0);
        assert_eq!(nice_ceiling(2.2), 2.5);
    }

    #[test]
    fn chart_has_one_line_per_series_and_skips_gaps() {
        let svg = line_chart(
            "t <x>",
            "x",
            "y",
            &["a".into(), "b".into(), "c".into()],
            &[
                Series {
                    name: "one".into(),
                    values: vec![Some(1.0), None, Some(3.0)],
                },
                Series {
                    name: "two".into(),
                    values: vec![Some(2.0), Some(2.0), Some(2.0)],
                },
            ],
        );
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 5);
        assert!(svg.contains("t &lt;x&gt;"));
    }
}
