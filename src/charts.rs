//! SVG charts for `day0 run --plot` and `day0 scale --plot`: a stacked bar of where a step's time
//! goes, and a scaling curve. Written directly as SVG: two chart kinds with axes, bars, a line and a
//! legend do not need a plotting library's font and backend stack.

use std::fmt::Write;

const W: f64 = 760.0;
const COLORS: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f",
];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn header(out: &mut String, h: f64, title: &str) {
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"20\" y=\"24\" font-size=\"15\">{}</text>\n",
        escape(title)
    );
}

/// One horizontal bar per row (`label`, its parts `(name, milliseconds)`), each bar's parts
/// stacked and scaled to the row's total; a legend names the parts.
pub fn breakdown(title: &str, rows: &[(String, Vec<(String, f64)>)]) -> String {
    // Each bar under its label.
    let (left, bar_h, gap, top) = (20.0, 28.0, 30.0, 60.0);
    let names: Vec<String> = rows
        .first()
        .map(|r| r.1.iter().map(|p| p.0.clone()).collect())
        .unwrap_or_default();
    let h = top + rows.len() as f64 * (bar_h + gap) + 30.0 + 20.0 * names.len().div_ceil(4) as f64;
    let mut out = String::new();
    header(&mut out, h, title);
    let width = W - left - 40.0;
    for (i, (label, parts)) in rows.iter().enumerate() {
        let y = top + i as f64 * (bar_h + gap);
        let total: f64 = parts.iter().map(|p| p.1.max(0.0)).sum::<f64>().max(1e-12);
        let _ = writeln!(
            out,
            "<text x=\"{left}\" y=\"{:.1}\">{} ({:.1} ms)</text>",
            y - 6.0,
            escape(label),
            total
        );
        let mut x = left;
        for (j, (name, ms)) in parts.iter().enumerate() {
            let w = ms.max(0.0) / total * width;
            let _ = writeln!(
                out,
                "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{bar_h}\" fill=\"{}\"><title>{}: {ms:.2} ms</title></rect>",
                COLORS[j % COLORS.len()],
                escape(name)
            );
            x += w;
        }
    }
    let ly = top + rows.len() as f64 * (bar_h + gap) + 10.0;
    for (j, name) in names.iter().enumerate() {
        let (x, y) = (20.0 + (j % 4) as f64 * 180.0, ly + (j / 4) as f64 * 20.0);
        let _ = writeln!(
            out,
            "<rect x=\"{x}\" y=\"{y}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>",
            COLORS[j % COLORS.len()],
            x + 18.0,
            y + 11.0,
            escape(name)
        );
    }
    out.push_str("</svg>\n");
    out
}

/// A line of `(x, y)` points on linear axes from 0, with the points marked and labelled by
/// `note` (e.g. the scaling efficiency).
pub fn line(title: &str, x_label: &str, y_label: &str, points: &[(f64, f64, String)]) -> String {
    let (left, right, top, bottom, h) = (80.0, 30.0, 50.0, 50.0, 420.0);
    let mut out = String::new();
    header(&mut out, h, title);
    let xmax = points.iter().map(|p| p.0).fold(0.0, f64::max).max(1e-12) * 1.05;
    let ymax = points.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-12) * 1.1;
    let (pw, ph) = (W - left - right, h - top - bottom);
    let px = |x: f64| left + x / xmax * pw;
    let py = |y: f64| top + ph - y / ymax * ph;
    let _ = writeln!(
        out,
        "<line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/><line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{}\" stroke=\"black\"/>",
        top + ph,
        left + pw,
        top + ph,
        top + ph
    );
    for i in 0..=4 {
        let (xv, yv) = (xmax * i as f64 / 4.0, ymax * i as f64 / 4.0);
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{:.0}</text><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{:.0}</text>",
            px(xv),
            top + ph + 16.0,
            xv,
            left - 6.0,
            py(yv) + 4.0,
            yv
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text><text x=\"16\" y=\"{:.1}\" transform=\"rotate(-90 16 {:.1})\" text-anchor=\"middle\">{}</text>",
        left + pw / 2.0,
        h - 12.0,
        escape(x_label),
        top + ph / 2.0,
        top + ph / 2.0,
        escape(y_label)
    );
    let path: Vec<String> = points
        .iter()
        .map(|p| format!("{:.1},{:.1}", px(p.0), py(p.1)))
        .collect();
    let _ = writeln!(
        out,
        "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>",
        path.join(" "),
        COLORS[0]
    );
    for p in points {
        let _ = writeln!(
            out,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            px(p.0),
            py(p.1),
            COLORS[0],
            px(p.0) + 6.0,
            py(p.1) - 6.0,
            escape(&p.2)
        );
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_svg_with_one_shape_per_part_and_point() {
        let rows = vec![
            (
                "prefill".to_string(),
                vec![("attention".to_string(), 3.0), ("experts".to_string(), 1.0)],
            ),
            (
                "decode".to_string(),
                vec![("attention".to_string(), 1.0), ("experts".to_string(), 2.0)],
            ),
        ];
        let svg = breakdown("t <&>", &rows);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("t &lt;&amp;&gt;"));
        // Two bars of two parts, plus two legend swatches and the background.
        assert_eq!(svg.matches("<rect").count(), 4 + 2 + 1);
        let svg = line(
            "s",
            "cards",
            "tokens/s",
            &[(16.0, 1.0, "100%".into()), (32.0, 1.8, "90%".into())],
        );
        assert_eq!(svg.matches("<circle").count(), 2);
        assert!(svg.contains("<polyline"));
    }
}
