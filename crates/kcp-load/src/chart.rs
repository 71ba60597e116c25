//! Bar charts as SVG, for `scale --svg` and `agents --svg`: panels side
//! by side, each a group of bars per label (one bar per series), on a
//! linear or a logarithmic axis, each bar with an optional whisker (a
//! range, such as the min–max of several runs).

/// One panel.
#[derive(Debug, Clone, Default)]
pub struct Panel {
    pub title: String,
    /// A logarithmic axis (decades), for values spanning several orders
    /// of magnitude.
    pub log: bool,
    /// Groups of bars: the label under each, and one value per series
    /// (`None`: not measured, drawn as "n/a").
    pub groups: Vec<(String, Vec<Option<f64>>)>,
    /// A whisker per bar, `(low, high)`, drawn as a vertical line with
    /// caps over the bar's middle: the same shape as `groups`' values
    /// (a group or a bar without one: none). Empty: no whiskers.
    pub whiskers: Vec<Vec<Option<(f64, f64)>>>,
}

const COLORS: [&str; 3] = ["#4e79a7", "#f28e2b", "#e15759"];

/// `panels` in rows of `columns`, each `panel_w` by `panel_h` pixels with
/// `pad` around; a legend of `series` (their colors) on top when given.
pub fn bars(
    panels: &[Panel],
    series: &[&str],
    columns: usize,
    panel_w: f64,
    panel_h: f64,
) -> String {
    bars_with_note(panels, series, columns, panel_w, panel_h, "")
}

/// [`bars`], with text under the panels (none when empty; a line per
/// `\n`).
pub fn bars_with_note(
    panels: &[Panel],
    series: &[&str],
    columns: usize,
    panel_w: f64,
    panel_h: f64,
    note: &str,
) -> String {
    let pad = 50.0;
    let columns = columns.max(1);
    let rows = panels.len().div_ceil(columns).max(1);
    let legend = if series.is_empty() { 0.0 } else { 20.0 };
    let w = pad + columns as f64 * (panel_w + pad);
    let panels_h = legend + rows as f64 * (panel_h + pad);
    let lines: Vec<&str> = note.lines().collect();
    let h = panels_h + 16.0 * lines.len() as f64 + if lines.is_empty() { 0.0 } else { 4.0 };
    let mut out = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    for (i, name) in series.iter().enumerate() {
        let x = pad + i as f64 * 110.0;
        out.push_str(&format!(
            r#"<rect x="{x}" y="6" width="10" height="10" fill="{}"/><text x="{}" y="15">{name}</text>"#,
            COLORS[i % COLORS.len()],
            x + 14.0
        ));
    }
    for (p, panel) in panels.iter().enumerate() {
        let x0 = pad + (p % columns) as f64 * (panel_w + pad);
        let top = legend + (p / columns) as f64 * (panel_h + pad);
        out.push_str(&draw(panel, x0, top, panel_w, panel_h, pad));
    }
    for (i, line) in lines.iter().enumerate() {
        out.push_str(&format!(
            r#"<text x="{pad}" y="{}" font-size="11">{line}</text>"#,
            panels_h + 10.0 + 16.0 * i as f64
        ));
    }
    out.push_str("</svg>\n");
    out
}

/// One panel: its title at `top + 20`, its axis at `top + panel_h`, its
/// tallest bar `pad` below `top`, its labels under the axis.
fn draw(panel: &Panel, x0: f64, top: f64, panel_w: f64, panel_h: f64, pad: f64) -> String {
    let base = top + panel_h;
    let height = panel_h - pad;
    let values: Vec<f64> = panel
        .groups
        .iter()
        .flat_map(|(_, v)| v.iter().flatten().copied())
        .chain(
            panel
                .whiskers
                .iter()
                .flatten()
                .flatten()
                .flat_map(|&(lo, hi)| [lo, hi]),
        )
        .filter(|v| v.is_finite())
        .collect();
    let max = values.iter().copied().fold(0.0_f64, f64::max).max(1e-9);
    // Decades from the smallest positive value's to the largest's.
    let (lo, hi) = {
        let min = values
            .iter()
            .copied()
            .filter(|v| *v > 0.0)
            .fold(f64::INFINITY, f64::min);
        let lo = if min.is_finite() {
            min.log10().floor()
        } else {
            0.0
        };
        (lo, max.log10().ceil().max(lo + 1.0))
    };
    let scale = |v: f64| -> f64 {
        if panel.log {
            if v <= 0.0 {
                0.0
            } else {
                height * ((v.log10() - lo) / (hi - lo)).clamp(0.0, 1.0)
            }
        } else {
            height * v / max
        }
    };
    let mut out = format!(
        r#"<text x="{x0}" y="{}">{}</text>"#,
        top + 20.0,
        panel.title
    );
    if panel.log {
        let mut d = lo;
        while d <= hi {
            let y = base - scale(10f64.powf(d));
            out.push_str(&format!(
                r##"<line x1="{x0}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="9" text-anchor="end">{}</text>"##,
                x0 + panel_w,
                x0 - 3.0,
                y + 3.0,
                decade(d)
            ));
            d += 1.0;
        }
    }
    let group_w = panel_w / panel.groups.len().max(1) as f64;
    for (g, (label, bars)) in panel.groups.iter().enumerate() {
        let bar_w = group_w * 0.8 / bars.len().max(1) as f64;
        for (b, v) in bars.iter().enumerate() {
            let x = x0 + g as f64 * group_w + b as f64 * bar_w;
            let whisker = panel
                .whiskers
                .get(g)
                .and_then(|w| w.get(b).copied().flatten());
            match v {
                Some(v) => {
                    let bh = scale(*v);
                    let y = base - bh;
                    let mut label_y = y;
                    out.push_str(&format!(
                        r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{bh:.1}" fill="{}"/>"#,
                        bar_w * 0.95,
                        COLORS[b % COLORS.len()],
                    ));
                    if let Some((lo, hi)) = whisker.filter(|(lo, hi)| hi > lo) {
                        let (cx, cap) = (x + bar_w * 0.475, bar_w * 0.2);
                        let (y_lo, y_hi) = (base - scale(lo), base - scale(hi));
                        label_y = label_y.min(y_hi);
                        out.push_str(&format!(
                            r#"<path d="M{cx:.1} {y_lo:.1}V{y_hi:.1}M{:.1} {y_lo:.1}H{:.1}M{:.1} {y_hi:.1}H{:.1}" stroke="black" fill="none"/>"#,
                            cx - cap,
                            cx + cap,
                            cx - cap,
                            cx + cap
                        ));
                    }
                    out.push_str(&format!(
                        r#"<text x="{x:.1}" y="{:.1}" font-size="10">{}</text>"#,
                        label_y - 3.0,
                        compact(*v)
                    ));
                }
                None => out.push_str(&format!(
                    r#"<text x="{x:.1}" y="{:.1}" font-size="10">n/a</text>"#,
                    base - 3.0
                )),
            }
        }
        out.push_str(&format!(
            r#"<text x="{:.1}" y="{:.1}">{label}</text>"#,
            x0 + g as f64 * group_w,
            base + 16.0
        ));
    }
    out.push_str(&format!(
        r#"<line x1="{x0}" y1="{base}" x2="{}" y2="{base}" stroke="black"/>"#,
        x0 + panel_w
    ));
    out
}

/// The label of decade `d` (10^d): 0.01, 1, 100, 10k, 1M.
fn decade(d: f64) -> String {
    let v = 10f64.powf(d);
    if d < 0.0 {
        format!("{v:.*}", (-d) as usize)
    } else if d >= 6.0 {
        format!("{:.0}M", v / 1e6)
    } else if d >= 4.0 {
        format!("{:.0}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// A value in few characters: 12,345 as 12k, 0.25 as 0.25.
fn compact(v: f64) -> String {
    match v.abs() {
        a if a >= 1e6 => format!("{:.1}M", v / 1e6),
        a if a >= 1e4 => format!("{:.0}k", v / 1e3),
        a if a >= 100.0 => format!("{v:.0}"),
        a if a >= 10.0 => format!("{v:.1}"),
        _ => format!("{v:.2}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_every_bar_and_marks_what_is_missing() {
        let panels = [
            Panel {
                title: "watches".into(),
                log: true,
                groups: vec![
                    ("100".into(), vec![Some(2040.0), Some(1340.0), Some(76.0)]),
                    ("5000".into(), vec![None, Some(65_000.0), Some(76.0)]),
                ],
                whiskers: Vec::new(),
            },
            Panel {
                title: "p99 (ms)".into(),
                log: false,
                groups: vec![("100".into(), vec![Some(12.0), Some(0.5), Some(250.0)])],
                whiskers: Vec::new(),
            },
        ];
        let svg = bars(&panels, &["direct", "proxies", "tier"], 2, 300.0, 240.0);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<rect").count(), 3 + 5 + 3);
        assert_eq!(svg.matches(">n/a<").count(), 1);
        assert!(svg.contains(">65k<") && svg.contains(">2040<") && svg.contains(">0.50<"));
        // The log panel's decades, 10 to 100,000.
        assert!(svg.contains(">10<") && svg.contains(">100k<"));
        assert!(!svg.contains("<path"));
        assert_eq!(compact(1_500_000.0), "1.5M");
        assert_eq!(
            [-2.0, 0.0, 2.0, 4.0, 6.0].map(decade),
            ["0.01", "1", "100", "10k", "1M"]
        );
    }

    #[test]
    fn whiskers_span_their_range_and_raise_the_axis() {
        let panel = Panel {
            title: "s".into(),
            log: false,
            groups: vec![("direct".into(), vec![Some(1.0), Some(2.0)])],
            // The first bar's range reaches 4, above every bar: the axis
            // is its; the second's is empty (one run), and not drawn.
            whiskers: vec![vec![Some((0.5, 4.0)), Some((2.0, 2.0))]],
        };
        let svg = bars_with_note(&[panel], &[], 1, 200.0, 250.0, "bars: medians\nof 5");
        assert_eq!(svg.matches("<path").count(), 1, "{svg}");
        assert!(svg.contains(r#"height="336""#), "{svg}");
        assert!(svg.contains(">bars: medians<") && svg.contains(r#"y="326" font-size="11">of 5<"#));
        // 200 px of height for 4: the bar of 1 is 50 px high, the whisker
        // from 25 px above the axis (at 250) to 200 px above it.
        assert!(svg.contains(r#"height="50.0""#), "{svg}");
        assert!(svg.contains("V50.0"), "{svg}");
        assert!(svg.contains(" 225.0V"), "{svg}");
    }
}
