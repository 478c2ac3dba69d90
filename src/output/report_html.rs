//! `ktune report` (and `tune --report`) as one self-contained HTML page: inline
//! CSS and inline SVG charts drawn with plotters' SVG backend (text as SVG
//! `<text>`, so no font files and no system font libraries), no scripts and no
//! external resources. Sections: a summary, end to end (the combinations timed
//! against the runtime default), a roofline per device, the diff of each profile
//! with the first, then every slot's candidates (median and 95% interval, the
//! winner marked, rejections with their reasons) and the kernel choices. A
//! profile without a `tuning` section shows its choices and says it has no
//! measurements. [`write`] writes the page atomically.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use plotters::chart::MeshStyle;
use plotters::coord::Shift;
use plotters::coord::ranged1d::{SegmentedCoord, ValueFormatter};
use plotters::coord::types::{RangedCoordf64, RangedCoordusize};
use plotters::prelude::*;

use super::Report;
use crate::profile::diff::DiffReport;
use crate::profile::doc::{Candidate, SlotTuning, Throughput, Tuning};
use crate::report::{HtmlReport, ReportedProfile};
use crate::{Error, Result};

/// What drawing a chart can fail with (plotters reports backend and layout errors).
#[derive(Debug, thiserror::Error)]
pub enum ReportHtmlError {
    #[error("drawing a chart of the report failed: {0}")]
    Draw(String),
}

impl<E: std::error::Error + Send + Sync> From<DrawingAreaErrorKind<E>> for ReportHtmlError {
    fn from(e: DrawingAreaErrorKind<E>) -> ReportHtmlError {
        ReportHtmlError::Draw(e.to_string())
    }
}

impl From<ReportHtmlError> for Error {
    fn from(e: ReportHtmlError) -> Error {
        Error::Io(std::io::Error::other(e))
    }
}

type Chart<T> = std::result::Result<T, ReportHtmlError>;

impl Report for HtmlReport {
    /// The line `ktune report` prints once the page is written.
    fn table(&self) -> String {
        let measured = self.profiles.iter().filter(|p| p.profile.tuning.is_some()).count();
        let mut s = format!(
            "report: {} ({} profile{}, {measured} with measurements",
            self.output.display(),
            self.profiles.len(),
            if self.profiles.len() == 1 { "" } else { "s" }
        );
        if !self.diffs.is_empty() {
            let _ = write!(s, ", {} compared with the first", self.diffs.len());
        }
        s.push(')');
        s
    }
}

/// Draws the page and writes it to `path` whole (a temporary file renamed over
/// it, [`crate::atomic::write_output`]: never over one of the profiles it
/// draws), so a failed run leaves no half page.
pub fn write(report: &HtmlReport, path: &Path) -> Result<()> {
    let page = html(report)?;
    let inputs: Vec<(&str, &Path)> = report.profiles.iter().map(|p| ("the profile", Path::new(&p.origin))).collect();
    crate::atomic::write_output(path, &inputs, page.as_bytes())?;
    Ok(())
}

const WINNER: RGBColor = RGBColor(0x1a, 0x8f, 0x3c);
const MEASURED: RGBColor = RGBColor(0x25, 0x63, 0xa8);
const DROPPED: RGBColor = RGBColor(0x9a, 0xa0, 0xa6);
const WORSE: RGBColor = RGBColor(0xc6, 0x28, 0x28);
const GRID: RGBColor = RGBColor(0xe4, 0xe7, 0xeb);
const INK: RGBColor = RGBColor(0x33, 0x33, 0x33);
const PREFILL: RGBColor = RGBColor(0xd9, 0x6c, 0x06);
const DECODE: RGBColor = RGBColor(0x25, 0x63, 0xa8);
const FONT: &str = "sans-serif";
const WIDTH: u32 = 960;

const CSS: &str = r#"
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: #222; margin: 0 auto; max-width: 1000px; padding: 16px 24px 48px; line-height: 1.4; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { border-bottom: 2px solid #dde; padding-bottom: 4px; margin-top: 2em; }
h3 { margin-top: 1.6em; }
h4 { margin: 1.4em 0 0.3em; font-size: 1em; }
.muted, .meta { color: #666; font-size: 0.9em; }
.note { background: #fff8e1; border-left: 4px solid #f0b400; padding: 6px 10px; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.88em; }
th, td { border: 1px solid #dde; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f5f8; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.winner td { background: #e7f6ec; font-weight: 600; }
.better { color: #1a8f3c; font-weight: 600; }
.worse { color: #c62828; font-weight: 600; }
figure { margin: 0.6em 0; }
figure svg { display: block; max-width: 100%; height: auto; }
figcaption { color: #555; font-size: 0.85em; margin-top: 2px; }
code { background: #f3f5f8; padding: 0 3px; border-radius: 3px; }
nav ul { columns: 2; }
details > summary { cursor: pointer; color: #25a; font-size: 0.9em; }
ul.rejected { font-size: 0.88em; margin-top: 0.2em; }
"#;

/// The whole page.
pub fn html(r: &HtmlReport) -> Result<String> {
    let mut h = String::new();
    let names: Vec<&str> = r.profiles.iter().map(|p| p.profile.name.as_str()).collect();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>ktune report: {}</title>\n<style>{CSS}</style>\n</head>\n<body>\n",
        esc(&names.join(", "))
    );
    let _ = write!(
        h,
        "<h1>ktune report</h1>\n<p class=\"meta\">ktune {}; {} profile{}: ",
        esc(&r.ktune_version),
        r.profiles.len(),
        plural(r.profiles.len())
    );
    let origins: Vec<String> = r.profiles.iter().map(|p| format!("<code>{}</code>", esc(&p.origin))).collect();
    h.push_str(&origins.join(", "));
    h.push_str("</p>\n");
    nav(&mut h, r);
    summary(&mut h, r);
    end_to_end(&mut h, r)?;
    rooflines(&mut h, r)?;
    for (i, d) in r.diffs.iter().enumerate() {
        diff_section(&mut h, i, d)?;
    }
    for (i, p) in r.profiles.iter().enumerate() {
        profile_section(&mut h, i, p)?;
    }
    h.push_str("</body>\n</html>\n");
    Ok(h)
}

fn nav(h: &mut String, r: &HtmlReport) {
    h.push_str("<nav><ul>\n<li><a href=\"#summary\">Summary</a></li>\n<li><a href=\"#end-to-end\">End to end</a></li>\n<li><a href=\"#roofline\">Roofline</a></li>\n");
    for (i, d) in r.diffs.iter().enumerate() {
        let _ = writeln!(h, "<li><a href=\"#diff-{i}\">Diff: {} → {}</a></li>", esc(&short_origin(&d.a)), esc(&short_origin(&d.b)));
    }
    for (i, p) in r.profiles.iter().enumerate() {
        let _ = writeln!(h, "<li><a href=\"#profile-{i}\">Slots and choices: {}</a></li>", esc(&p.profile.name));
    }
    h.push_str("</ul></nav>\n");
}

fn summary(h: &mut String, r: &HtmlReport) {
    h.push_str("<h2 id=\"summary\">Summary</h2>\n<table>\n<tr><th>#</th><th>profile</th><th>model</th><th>device</th><th>tuned</th><th>prefill tok/s<br>tuned / default</th><th>decode tok/s<br>tuned / default</th></tr>\n");
    for (i, p) in r.profiles.iter().enumerate() {
        let d = &p.profile;
        let backend = d.device.backend.as_ref().map(|b| b.value.as_str()).unwrap_or("any");
        match &d.tuning {
            Some(t) => {
                let e = &t.end_to_end;
                let _ = writeln!(
                    h,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{} <span class=\"muted\">({backend}, {}…)</span></td><td>{}<br><span class=\"muted\">{}, {:.0} of {:.0} s</span></td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
                    i + 1,
                    esc(&d.name),
                    esc(&d.model),
                    esc(&t.device_name),
                    esc(crate::text::prefix(&t.fingerprint, 12)),
                    esc(&t.date),
                    esc(&t.strategy),
                    t.used_s,
                    t.budget_s,
                    vs(e.tuned.prefill_tok_s, e.default.prefill_tok_s),
                    vs(e.tuned.decode_tok_s, e.default.decode_tok_s),
                );
            }
            None => {
                let _ = writeln!(
                    h,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td colspan=\"3\" class=\"muted\">no measurements (no <code>tuning</code> section)</td></tr>",
                    i + 1,
                    esc(&d.name),
                    esc(&d.model),
                    esc(backend)
                );
            }
        }
    }
    h.push_str("</table>\n");
}

/// `tuned / default (+x%)`.
fn vs(tuned: f64, default: f64) -> String {
    if default > 0.0 {
        let pct = (tuned / default - 1.0) * 100.0;
        let class = if pct >= 0.0 { "better" } else { "worse" };
        format!("{} / {} <span class=\"{class}\">({pct:+.1}%)</span>", num(tuned), num(default))
    } else {
        format!("{} / -", num(tuned))
    }
}

fn end_to_end(h: &mut String, r: &HtmlReport) -> Result<()> {
    h.push_str("<h2 id=\"end-to-end\">End to end</h2>\n");
    let mut any = false;
    for p in &r.profiles {
        let Some(t) = &p.profile.tuning else { continue };
        any = true;
        let e = &t.end_to_end;
        let _ = writeln!(h, "<h3>{}</h3>", esc(&p.profile.name));
        let rows = e2e_rows(t);
        let svg = e2e_chart(&rows)?;
        let _ = writeln!(
            h,
            "<figure>{svg}<figcaption>Throughput of every combination of fusions and execution flags timed end to end ({} prompt tokens, then {} decoded tokens), against the runtime default; the tuned choice in green. Whiskers: 95% confidence interval of the median time, as tok/s.</figcaption></figure>",
            e.prefill_tokens, e.decode_tokens
        );
        accuracy(h, e);
        if let Some(v) = e.vision.as_ref().filter(|v| v.rounds == 0) {
            let _ = writeln!(
                h,
                "<p>One image per request ({}): about {:.1} ms with the raced vision kernels; {}.</p>",
                esc(&v.image),
                v.tuned_ms,
                esc(&v.reason)
            );
        } else if let Some(v) = &e.vision {
            let _ = writeln!(
                h,
                "<p>One image per request ({}): {:.3} ms (95% CI {:.3}–{:.3}) with the raced vision kernels, {:.3} ms ({:.3}–{:.3}) with the runtime's defaults, over {} interleaved rounds; {}: {}.</p>",
                esc(&v.image),
                v.tuned_ms,
                v.tuned_ci_ms[0],
                v.tuned_ci_ms[1],
                v.default_ms,
                v.default_ci_ms[0],
                v.default_ci_ms[1],
                v.rounds,
                if v.kept { "the raced kernels are kept" } else { "the defaults stay" },
                esc(&v.reason)
            );
        }
    }
    if !any {
        h.push_str("<p class=\"note\">No profile has measurements (a <code>tuning</code> section, written by <code>ktune tune</code>): nothing to compare end to end.</p>\n");
    }
    Ok(())
}

/// Each combination's divergence from the CPU's f32 reference beside its speed,
/// and what the accuracy budget refused (nothing for profiles without it).
fn accuracy(h: &mut String, e: &crate::profile::doc::EndToEnd) {
    if e.combinations.iter().all(|c| c.kld.is_none()) {
        return;
    }
    let budget = e.max_kld.map(|b| format!("budget {b:.3e} nats")).unwrap_or_else(|| "no budget recorded".into());
    let _ = writeln!(
        h,
        "<table>\n<tr><th>combination</th><th>decode tok/s</th><th>prefill tok/s</th><th>mean KL vs f32 ({})</th><th>accuracy budget</th></tr>",
        esc(&budget)
    );
    for c in &e.combinations {
        let kld = c.kld.map(|k| format!("{k:.3e}")).unwrap_or_else(|| "-".into());
        let verdict = match (&c.refused, c.chosen) {
            (Some(why), _) => format!("<span class=\"worse\">refused: {}</span>", esc(why)),
            (None, true) => "<span class=\"better\">within (tuned)</span>".to_string(),
            (None, false) => "within".to_string(),
        };
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{kld}</td><td>{verdict}</td></tr>",
            esc(&c.label),
            num(c.result.decode_tok_s),
            num(c.result.prefill_tok_s)
        );
    }
    h.push_str("</table>\n");
}

/// A row of the end-to-end chart: label, throughput, default?, chosen?
struct E2eRow<'a> {
    label: String,
    t: &'a Throughput,
    default: bool,
    chosen: bool,
}

fn e2e_rows(t: &Tuning) -> Vec<E2eRow<'_>> {
    let e = &t.end_to_end;
    let mut rows: Vec<E2eRow<'_>> = e
        .combinations
        .iter()
        .map(|c| E2eRow {
            label: if c.chosen { format!("✓ {} (tuned)", c.label) } else { c.label.clone() },
            t: &c.result,
            default: c.label == "runtime default",
            chosen: c.chosen,
        })
        .collect();
    if !rows.iter().any(|r| r.default) {
        rows.insert(0, E2eRow { label: "runtime default".into(), t: &e.default, default: true, chosen: false });
    }
    if !rows.iter().any(|r| r.chosen) {
        rows.push(E2eRow { label: "✓ tuned".into(), t: &e.tuned, default: false, chosen: true });
    }
    rows
}

/// tok/s at the ends of a time interval (ms) around `ms`.
fn rate_ci(tok_s: f64, ms: f64, ci_ms: [f64; 2]) -> (f64, f64) {
    if ms > 0.0 && ci_ms[0] > 0.0 && ci_ms[1] > 0.0 { (tok_s * ms / ci_ms[1], tok_s * ms / ci_ms[0]) } else { (tok_s, tok_s) }
}

fn e2e_chart(rows: &[E2eRow<'_>]) -> Chart<String> {
    let n = rows.len();
    let label_w = label_width(rows.iter().map(|r| r.label.as_str()), 140, 380);
    svg(40 + 26 * n as u32 + 36, |root| {
        let (left, right) = root.split_horizontally(label_w + (WIDTH - label_w) / 2);
        let pre: Vec<(f64, (f64, f64))> =
            rows.iter().map(|r| (r.t.prefill_tok_s, rate_ci(r.t.prefill_tok_s, r.t.prefill_ms, r.t.prefill_ci_ms))).collect();
        let dec: Vec<(f64, (f64, f64))> =
            rows.iter().map(|r| (r.t.decode_tok_s, rate_ci(r.t.decode_tok_s, r.t.decode_ms, r.t.decode_ci_ms))).collect();
        let color = |i: usize| {
            if rows[i].chosen {
                WINNER
            } else if rows[i].default {
                INK
            } else {
                MEASURED
            }
        };
        let labels: Vec<String> = rows.iter().map(|r| r.label.clone()).collect();
        bar_panel(&left, "prefill tok/s", &pre, &labels, label_w, &color)?;
        bar_panel(&right, "decode tok/s", &dec, &[], 12, &color)?;
        Ok(())
    })
}

/// Horizontal bars (value, whisker) one per row, the first row on top; labels
/// drawn when given.
fn bar_panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    title: &str,
    vals: &[(f64, (f64, f64))],
    labels: &[String],
    label_w: u32,
    color: &dyn Fn(usize) -> RGBColor,
) -> Chart<()> {
    let n = vals.len();
    let top = vals.iter().map(|(v, (_, hi))| v.max(*hi)).fold(0.0, f64::max);
    let xmax = axis(0.0, top * 1.15).end;
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 17))
        .margin(8)
        .margin_right(16)
        .x_label_area_size(28)
        .y_label_area_size(label_w)
        .build_cartesian_2d(axis(0.0, xmax), (0..n).into_segmented())?;
    let fmt = row_labels(labels, n);
    mesh(&mut chart).disable_y_mesh().y_labels(2 * n + 2).x_labels(6).y_label_formatter(&fmt).x_label_formatter(&|v| tick(*v)).draw()?;
    for (i, (v, (lo, hi))) in vals.iter().enumerate() {
        let y = n - 1 - i;
        let c = color(i);
        let mut bar = Rectangle::new([(0.0, SegmentValue::Exact(y)), (*v, SegmentValue::Exact(y + 1))], c.mix(0.75).filled());
        bar.set_margin(3, 3, 0, 0);
        chart.draw_series(std::iter::once(bar))?;
        if hi > lo {
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(*lo, SegmentValue::CenterOf(y)), (*hi, SegmentValue::CenterOf(y))],
                INK.stroke_width(1),
            )))?;
        }
        let text = Text::new(num(*v), (4, -7), TextStyle::from((FONT, 13).into_font()).color(&INK));
        chart.draw_series(std::iter::once(EmptyElement::at((v.max(*hi), SegmentValue::CenterOf(y))) + text))?;
    }
    Ok(())
}

fn rooflines(h: &mut String, r: &HtmlReport) -> Result<()> {
    h.push_str("<h2 id=\"roofline\">Roofline</h2>\n");
    // Per device (fingerprint), every measured profile tuned on it.
    let mut by_device: BTreeMap<&str, Vec<(usize, &ReportedProfile, &Tuning)>> = BTreeMap::new();
    for (i, p) in r.profiles.iter().enumerate() {
        if let Some(t) = &p.profile.tuning {
            by_device.entry(t.fingerprint.as_str()).or_default().push((i, p, t));
        }
    }
    if by_device.is_empty() {
        h.push_str("<p class=\"note\">No profile has measurements: no roofline.</p>\n");
        return Ok(());
    }
    for (fp, ps) in by_device {
        let _ = writeln!(h, "<h3>{} <span class=\"muted\">({}…)</span></h3>", esc(&ps[0].2.device_name), esc(crate::text::prefix(fp, 12)));
        let mut points = Vec::new();
        for (pi, (_, _, t)) in ps.iter().enumerate() {
            for s in &t.slots {
                if let Some(c) = chosen(s)
                    && c.gbps > 0.0
                    && c.gflops > 0.0
                    && c.gbps.is_finite()
                    && c.gflops.is_finite()
                {
                    points.push(RoofPoint { profile: pi, slot: s, c });
                }
            }
        }
        let limits: Vec<(String, f64, String)> =
            ps.iter().map(|(_, p, t)| (p.profile.name.clone(), t.limits.read_gbps, t.limits.read_source.clone())).collect();
        if points.is_empty() {
            h.push_str("<p class=\"note\">No chosen kernel recorded its bytes and FLOPs: nothing to place on the roofline.</p>\n");
            continue;
        }
        let svg = roofline_chart(&points, &limits, ps.len())?;
        let bw: Vec<String> = limits.iter().map(|(n, g, src)| format!("{} GB/s ({}; {})", num(*g), esc(src), esc(n))).collect();
        let _ = writeln!(
            h,
            "<figure>{svg}<figcaption>Each chosen kernel (one point per slot, regime and shape; numbers index the table below) at its achieved GFLOP/s against its arithmetic intensity, both as the profile records them: the slot problem's FLOPs and bytes moved over the kernel's median time. The diagonal is the measured read bandwidth: {}. The profile records no compute peak, so there is no flat roof: a point's height below the diagonal is what memory traffic leaves unexplained.</figcaption></figure>",
            bw.join("; ")
        );
        h.push_str("<details><summary>the points as numbers</summary>\n<table>\n<tr><th>#</th><th>profile</th><th>slot</th><th>regime</th><th>problem</th><th>kernel</th><th>GB/s</th><th>% of read bandwidth</th><th>GFLOP/s</th><th>FLOP/byte</th></tr>\n");
        for (k, pt) in points.iter().enumerate() {
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{:.0}%</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
                k + 1,
                esc(&ps[pt.profile].1.profile.name),
                esc(&pt.slot.slot),
                esc(&pt.slot.regime),
                esc(&pt.slot.problem),
                esc(&pt.slot.chosen),
                num(pt.c.gbps),
                pt.c.pct_of_bandwidth,
                num(pt.c.gflops),
                num(pt.c.gflops / pt.c.gbps)
            );
        }
        h.push_str("</table></details>\n");
    }
    Ok(())
}

struct RoofPoint<'a> {
    profile: usize,
    slot: &'a SlotTuning,
    c: &'a Candidate,
}

fn roofline_chart(points: &[RoofPoint<'_>], limits: &[(String, f64, String)], profiles: usize) -> Chart<String> {
    let ai = |p: &RoofPoint<'_>| p.c.gflops / p.c.gbps;
    let (x0, x1) = points.iter().map(ai).fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    let (y0, y1) = points.iter().map(|p| p.c.gflops).fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    let (x0, x1) = decade_span(x0 / 2.0, x1 * 2.0);
    let bw_max = limits.iter().map(|l| l.1).fold(0.0, f64::max);
    let (y0, y1) = decade_span(y0 / 2.0, (y1 * 3.0).max(bw_max * x0 * 2.0));
    svg(460, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption("roofline: chosen kernels", (FONT, 17))
            .margin(10)
            .margin_right(24)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())?;
        mesh(&mut chart)
            .x_desc("arithmetic intensity, FLOP/byte")
            .y_desc("GFLOP/s")
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| tick(*v))
            .draw()?;
        for (k, (name, bw, _)) in limits.iter().enumerate() {
            if *bw <= 0.0 {
                continue;
            }
            // y = bw · x, inside the plot.
            let xe = x1.min(y1 / bw);
            let xs = x0.max(y0 / bw);
            if xs >= xe {
                continue;
            }
            let style = if k == 0 { INK.stroke_width(2) } else { DROPPED.stroke_width(2) };
            let label = if limits.len() > 1 {
                format!("read bandwidth {} GB/s ({name})", num(*bw))
            } else {
                format!("read bandwidth {} GB/s", num(*bw))
            };
            chart
                .draw_series(std::iter::once(PathElement::new(vec![(xs, bw * xs), (xe, bw * xe)], style)))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
        }
        for (regime, color) in [("prefill", PREFILL), ("decode", DECODE)] {
            for pi in 0..profiles {
                let mine: Vec<(usize, &RoofPoint<'_>)> =
                    points.iter().enumerate().filter(|(_, p)| p.profile == pi && p.slot.regime == regime).collect();
                if mine.is_empty() {
                    continue;
                }
                let style = if pi == 0 { color.filled() } else { color.stroke_width(2) };
                let series = chart.draw_series(mine.iter().map(|(k, p)| {
                    let label = Text::new(format!("{}", k + 1), (6, -12), TextStyle::from((FONT, 12).into_font()).color(&INK));
                    EmptyElement::at((ai(p), p.c.gflops)) + Circle::new((0, 0), 5, style) + label
                }))?;
                let name = if profiles > 1 { format!("{regime} (profile {})", pi + 1) } else { regime.to_string() };
                series.label(name).legend(move |(x, y)| Circle::new((x + 9, y), 5, style));
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .border_style(GRID)
            .background_style(WHITE.mix(0.9))
            .label_font((FONT, 14))
            .draw()?;
        Ok(())
    })
}

fn diff_section(h: &mut String, i: usize, d: &DiffReport) -> Result<()> {
    let _ = writeln!(
        h,
        "<h2 id=\"diff-{i}\">Diff: {} → {}</h2>\n<p class=\"meta\"><code>{}</code> (reference) → <code>{}</code>; a change counts as a regression or an improvement beyond {}% and beyond the noise (the intervals apart).</p>",
        esc(&short_origin(&d.a)),
        esc(&short_origin(&d.b)),
        esc(&d.a),
        esc(&d.b),
        tick(d.threshold_pct)
    );
    let verdict = if d.regressed {
        "<p class=\"worse\">regression</p>"
    } else if d.changed {
        "<p>choices changed, no regression</p>"
    } else {
        "<p class=\"better\">no change of choices, no regression</p>"
    };
    h.push_str(verdict);
    h.push('\n');
    for n in &d.notes {
        let _ = writeln!(h, "<p class=\"note\">{}</p>", esc(n));
    }
    if d.changes.is_empty() {
        h.push_str("<p>No kernel or execution choice changed.</p>\n");
    } else {
        let _ = writeln!(h, "<h3>Changed choices ({})</h3>\n<table>\n<tr><th>what</th><th>old</th><th>new</th></tr>", d.changes.len());
        for c in &d.changes {
            let _ = writeln!(h, "<tr><td>{}</td><td>{}</td><td>{}</td></tr>", esc(&c.what), esc(&c.old), esc(&c.new));
        }
        h.push_str("</table>\n");
    }
    let deltas: Vec<&crate::profile::diff::TimeDelta> = d.end_to_end.iter().chain(&d.slots).collect();
    if !deltas.is_empty() {
        let svg = diff_chart(&deltas)?;
        let _ = writeln!(
            h,
            "<h3>Time changes</h3>\n<figure>{svg}<figcaption>Change of each time (end to end first, then each slot's chosen kernel) from the reference to the new profile: right is slower. Whiskers: the noise (both intervals' relative half-widths together); red a regression, green an improvement.</figcaption></figure>"
        );
    }
    Ok(())
}

fn diff_chart(ds: &[&crate::profile::diff::TimeDelta]) -> Chart<String> {
    let n = ds.len();
    let labels: Vec<String> = ds.iter().map(|d| d.what.clone()).collect();
    let label_w = label_width(labels.iter().map(String::as_str), 160, 440);
    let lim = ds.iter().map(|d| d.delta_pct.abs() + d.noise_pct).filter(|v| v.is_finite()).fold(5.0, f64::max) * 1.15;
    svg(rows_height(n), |root| {
        let mut chart = rows_chart(root, (10, 60), label_w, axis(-lim, lim), n)?;
        let fmt = row_labels(&labels, n);
        mesh(&mut chart)
            .disable_y_mesh()
            .y_labels(2 * n + 2)
            .y_label_formatter(&fmt)
            .x_label_formatter(&|v| format!("{v:+.0}%"))
            .x_desc("time change, % (positive: slower)")
            .draw()?;
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(0.0, SegmentValue::Exact(0)), (0.0, SegmentValue::Last)],
            INK.stroke_width(1),
        )))?;
        for (i, d) in ds.iter().enumerate() {
            let y = n - 1 - i;
            let c = if d.regressed {
                WORSE
            } else if d.improved {
                WINNER
            } else {
                DROPPED
            };
            let v = d.delta_pct.clamp(-lim, lim);
            let mut bar = Rectangle::new([(0.0, SegmentValue::Exact(y)), (v, SegmentValue::Exact(y + 1))], c.mix(0.8).filled());
            bar.set_margin(3, 3, 0, 0);
            chart.draw_series(std::iter::once(bar))?;
            let (lo, hi) = ((v - d.noise_pct).max(-lim), (v + d.noise_pct).min(lim));
            if hi > lo {
                chart.draw_series(std::iter::once(PathElement::new(
                    vec![(lo, SegmentValue::CenterOf(y)), (hi, SegmentValue::CenterOf(y))],
                    INK.stroke_width(1),
                )))?;
            }
            let text = Text::new(format!("{:+.1}%", d.delta_pct), (4, -7), TextStyle::from((FONT, 13).into_font()).color(&INK));
            chart.draw_series(std::iter::once(EmptyElement::at((hi.max(v).min(lim * 0.9), SegmentValue::CenterOf(y))) + text))?;
        }
        Ok(())
    })
}

fn profile_section(h: &mut String, i: usize, p: &ReportedProfile) -> Result<()> {
    let d = &p.profile;
    let _ = writeln!(h, "<h2 id=\"profile-{i}\">{}: slots and choices</h2>", esc(&d.name));
    let _ = writeln!(h, "<p class=\"meta\">model <code>{}</code>, from <code>{}</code></p>", esc(&d.model), esc(&p.origin));
    match &d.tuning {
        None => {
            h.push_str("<p class=\"note\">No measurements: this profile has no <code>tuning</code> section (written by hand, or stripped), so only its kernel choices are shown.</p>\n");
        }
        Some(t) => {
            let _ = writeln!(
                h,
                "<p class=\"meta\">{} on {}; timing {}; {} strategy, {:.0} of {:.0} s; prefill tuned at {} tokens, decode at a {}-token context; {} valid variants, {} combinations; read bandwidth {} GB/s ({}).</p>",
                esc(&t.date),
                esc(&t.device_name),
                esc(&t.timing),
                esc(&t.strategy),
                t.used_s,
                t.budget_s,
                t.prefill_tokens,
                t.context,
                t.space.variants,
                esc(&t.space.combinations),
                num(t.limits.read_gbps),
                esc(&t.limits.read_source)
            );
            let _ = writeln!(h, "<h3>Slots ({})</h3>", t.slots.len());
            for s in &t.slots {
                slot(h, s)?;
            }
        }
    }
    let _ = writeln!(h, "<h3>Kernel choices ({})</h3>", p.choices.len());
    if p.choices.is_empty() {
        h.push_str("<p>The profile chooses no kernel: every slot takes the runtime's default.</p>\n");
    } else {
        h.push_str("<table>\n<tr><th>slot</th><th>kernel</th></tr>\n");
        for (slot, k) in &p.choices {
            let _ = writeln!(h, "<tr><td>{}</td><td><code>{}</code></td></tr>", esc(slot), esc(k));
        }
        h.push_str("</table>\n");
    }
    let e = &d.execution;
    let _ = writeln!(
        h,
        "<p class=\"meta\">execution: weights {:?}, KV cache {:?}, fused QKV {}, fused gate/up {}, fused q/k-norm+RoPE {}, fused residual+norm {}, fused norm+matmul {}, one submit per pass {}{}</p>",
        e.weight_dtype,
        e.kv_cache_dtype,
        yes_no(e.fused_qkv),
        yes_no(e.fused_gate_up),
        yes_no(e.fused_qk_norm_rope),
        yes_no(e.fused_residual_norm),
        yes_no(e.fused_norm_matmul),
        yes_no(e.batch_commands),
        if e.cpu_threads > 0 { format!(", {} CPU threads", e.cpu_threads) } else { String::new() }
            + &if e.cpu_spin_us > 0 { format!(", workers spin {} µs", e.cpu_spin_us) } else { String::new() }
            + &e.cpu_prefetch_bytes.map(|b| format!(", decode dots prefetch {b} B ahead")).unwrap_or_default()
            + &if e.cpu_repack.is_empty() { String::new() } else { format!(", {} repacked at load", e.cpu_repack.join(", ")) }
    );
    Ok(())
}

fn slot(h: &mut String, s: &SlotTuning) -> Result<()> {
    let _ = writeln!(
        h,
        "<h4>{} <span class=\"muted\">({}) {} · {}× per pass</span></h4>",
        esc(&s.slot),
        esc(&s.regime),
        esc(&s.problem),
        s.count
    );
    if s.candidates.is_empty() {
        h.push_str("<p class=\"note\">No candidate was timed for this slot.</p>\n");
    } else {
        let svg = candidates_chart(s)?;
        let _ = writeln!(
            h,
            "<figure>{svg}<figcaption>Median time of each candidate (dot) and the 95% confidence interval of the median (whisker), fastest on top; ✓ the winner (<code>{}</code>) in green, grey: dropped in an early round of the race (fewer samples).</figcaption></figure>",
            esc(&s.chosen)
        );
        h.push_str("<details><summary>the candidates as numbers</summary>\n<table>\n<tr><th>candidate</th><th>median µs</th><th>95% CI µs</th><th>samples</th><th>GB/s</th><th>GFLOP/s</th><th>status</th></tr>\n");
        for c in sorted(s) {
            let win = c.variant.to_string() == s.chosen;
            let _ = writeln!(
                h,
                "<tr{}><td>{}{}</td><td class=\"num\">{}</td><td class=\"num\">{} – {}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
                if win { " class=\"winner\"" } else { "" },
                if win { "✓ " } else { "" },
                esc(&c.variant.to_string()),
                num(c.median_us),
                num(c.ci_us[0]),
                num(c.ci_us[1]),
                c.samples,
                num(c.gbps),
                num(c.gflops),
                esc(&c.status)
            );
        }
        h.push_str("</table></details>\n");
    }
    if !s.rejected.is_empty() {
        let mut by_reason: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for r in &s.rejected {
            by_reason.entry(r.reason.as_str()).or_default().push(r.variant.as_str());
        }
        let _ = writeln!(h, "<p class=\"muted\">Rejected before timing ({}), by reason:</p>\n<ul class=\"rejected\">", s.rejected.len());
        for (reason, vs) in by_reason {
            let list: Vec<String> = vs.iter().map(|v| format!("<code>{}</code>", esc(v))).collect();
            let _ = writeln!(h, "<li><b>{}</b> ({}): {}</li>", esc(reason), vs.len(), list.join(", "));
        }
        h.push_str("</ul>\n");
    }
    Ok(())
}

fn chosen(s: &SlotTuning) -> Option<&Candidate> {
    s.candidates.iter().find(|c| c.variant.to_string() == s.chosen)
}

/// Candidates fastest first.
fn sorted(s: &SlotTuning) -> Vec<&Candidate> {
    let mut v: Vec<&Candidate> = s.candidates.iter().collect();
    v.sort_by(|a, b| a.median_us.total_cmp(&b.median_us));
    v
}

/// One slot's candidates: a dot (median) and a whisker (95% interval) each,
/// fastest on top; times past five times the winner's are drawn at the edge with
/// their value.
fn candidates_chart(s: &SlotTuning) -> Chart<String> {
    let rows = sorted(s);
    let n = rows.len();
    let win = |c: &Candidate| c.variant.to_string() == s.chosen;
    let best = rows.iter().find(|c| win(c)).or(rows.first()).map(|c| c.median_us).unwrap_or(0.0);
    let max_hi = rows.iter().map(|c| c.ci_us[1].max(c.median_us)).filter(|v| v.is_finite()).fold(0.0, f64::max);
    let cap = if best > 0.0 { best * 5.0 } else { max_hi };
    let top = max_hi.min(cap).max(best);
    // Milliseconds for long kernels.
    let (unit, scale) = if top >= 20_000.0 { ("ms", 1e-3) } else { ("µs", 1.0) };
    // Zoomed onto the data when it sits far from zero (dots, not bars).
    let min_lo = rows.iter().map(|c| c.ci_us[0].min(c.median_us)).filter(|v| v.is_finite()).fold(top, f64::min).max(0.0);
    let xmin = if top > 0.0 && min_lo > 0.4 * top { (min_lo - 0.08 * (top - min_lo)).max(0.0) * scale } else { 0.0 };
    let x = axis(xmin, xmin + (top * scale - xmin) * 1.12);
    let (xmin, xmax) = (x.start, x.end);
    let labels: Vec<String> = rows
        .iter()
        .map(|c| {
            let v = c.variant.to_string();
            if win(c) {
                format!("✓ {v}")
            } else if c.status.starts_with("dropped") {
                format!("{v} · {}", c.status)
            } else {
                v
            }
        })
        .collect();
    let label_w = label_width(labels.iter().map(String::as_str), 140, 470);
    svg(rows_height(n), |root| {
        let mut chart = rows_chart(root, (8, 70), label_w, axis(xmin, xmax), n)?;
        let fmt = row_labels(&labels, n);
        let desc = if xmin > 0.0 {
            format!("{unit} per dispatch (median; whisker: 95% interval); the axis starts at {}", tick(xmin))
        } else {
            format!("{unit} per dispatch (median; whisker: 95% interval)")
        };
        mesh(&mut chart).y_labels(2 * n + 2).x_labels(8).y_label_formatter(&fmt).x_label_formatter(&|v| tick(*v)).x_desc(desc).draw()?;
        if best > 0.0 {
            let b = best * scale;
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(b, SegmentValue::Exact(0)), (b, SegmentValue::Last)],
                WINNER.mix(0.5).stroke_width(1),
            )))?;
        }
        for (i, c) in rows.iter().enumerate() {
            let y = n - 1 - i;
            let color = if win(c) {
                WINNER
            } else if c.status.starts_with("dropped") {
                DROPPED
            } else {
                MEASURED
            };
            let (lo, hi) = ((c.ci_us[0] * scale).clamp(xmin, xmax), (c.ci_us[1] * scale).clamp(xmin, xmax));
            if hi > lo {
                chart.draw_series(std::iter::once(PathElement::new(
                    vec![(lo, SegmentValue::CenterOf(y)), (hi, SegmentValue::CenterOf(y))],
                    color.stroke_width(2),
                )))?;
            }
            let m = c.median_us * scale;
            let value = TextStyle::from((FONT, 13).into_font()).color(&INK);
            if m.is_finite() && m <= xmax {
                let r = if win(c) { 5 } else { 4 };
                chart.draw_series(std::iter::once(Circle::new((m.max(xmin), SegmentValue::CenterOf(y)), r, color.filled())))?;
                let at = (hi.max(m), SegmentValue::CenterOf(y));
                chart.draw_series(std::iter::once(EmptyElement::at(at) + Text::new(num(m), (5, -6), value)))?;
            } else {
                let at = (xmax, SegmentValue::CenterOf(y));
                let mark = EmptyElement::at(at) + TriangleMarker::new((0, 0), 5, color.filled());
                chart.draw_series(std::iter::once(mark + Text::new(format!("→ {}", num(m)), (8, -6), value)))?;
            }
        }
        Ok(())
    })
}

/// A chart drawn by `draw` on a white page `height` pixels high and [`WIDTH`]
/// wide, as the SVG text the page inlines.
fn svg(height: u32, draw: impl FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> Chart<()>) -> Chart<String> {
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE)?;
        draw(&root)?;
        root.present()?;
    }
    Ok(strip_xmlns(buf))
}

/// `chart`'s mesh in the page's style (grid lines, no minor lines, its fonts),
/// for the caller's axes and labels.
fn mesh<'a, 'b, 'c, X, Y, XT, YT>(
    chart: &'b mut ChartContext<'a, SVGBackend<'c>, Cartesian2d<X, Y>>,
) -> MeshStyle<'a, 'b, X, Y, SVGBackend<'c>>
where
    X: Ranged<ValueType = XT> + ValueFormatter<XT>,
    Y: Ranged<ValueType = YT> + ValueFormatter<YT>,
{
    let mut m = chart.configure_mesh();
    m.bold_line_style(GRID).light_line_style(WHITE).label_style((FONT, 14)).axis_desc_style((FONT, 15));
    m
}

/// A chart of `n` rows drawn as horizontal bands, the first on top, over `x`:
/// `label_w` pixels at the left for the rows' labels, 40 below for the x axis,
/// `margin` around and `margin_right` at the right (room for values written past
/// the end of a band).
fn rows_chart<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    (margin, margin_right): (u32, u32),
    label_w: u32,
    x: std::ops::Range<f64>,
    n: usize,
) -> Chart<ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, SegmentedCoord<RangedCoordusize>>>> {
    let mut builder = ChartBuilder::on(root);
    builder.margin(margin).margin_right(margin_right).x_label_area_size(40).y_label_area_size(label_w);
    Ok(builder.build_cartesian_2d(x, (0..n).into_segmented())?)
}

/// The height of a [`rows_chart`] page of `n` rows: 22 pixels a row, room above
/// and for the x axis below.
fn rows_height(n: usize) -> u32 {
    24 + 22 * n as u32 + 48
}

/// The y labels of a chart with a band per row, the first of `n` rows on top:
/// `labels[i]` at the middle of row i's band (none where `labels` has no i).
fn row_labels(labels: &[String], n: usize) -> impl Fn(&SegmentValue<usize>) -> String + '_ {
    move |v| match v {
        SegmentValue::CenterOf(i) if *i < n => labels.get(n - 1 - i).cloned().unwrap_or_default(),
        _ => String::new(),
    }
}

/// A linear axis range plotters can lay out: finite and not empty (plotters
/// never returns from laying out an infinite or NaN range).
fn axis(lo: f64, hi: f64) -> std::ops::Range<f64> {
    if lo.is_finite() && hi.is_finite() && hi > lo {
        lo..hi
    } else if lo.is_finite() {
        lo..lo + 1.0
    } else {
        0.0..1.0
    }
}

/// A log axis range holding `lo..hi` and at least two decades, centred on them.
fn decade_span(lo: f64, hi: f64) -> (f64, f64) {
    let (lo, hi) = if lo > 0.0 && hi > lo && hi.is_finite() { (lo, hi) } else { (0.1, 10.0) };
    // At most twelve decades (a near-zero value must not stretch the axis forever).
    let lo = lo.max(hi / 1e12);
    let ratio = hi / lo;
    if ratio >= 100.0 {
        return (lo, hi);
    }
    let grow = (100.0 / ratio).sqrt();
    (lo / grow, hi * grow)
}

/// Pixels for a label column: about 6.6 px per character at 12 px, within bounds.
fn label_width<'a>(labels: impl Iterator<Item = &'a str>, min: u32, max: u32) -> u32 {
    let chars = labels.map(|l| l.chars().count()).max().unwrap_or(0) as u32;
    (chars * 75 / 10 + 18).clamp(min, max)
}

/// An inline `<svg>` needs no namespace in HTML; dropping it keeps the page free
/// of any URL.
fn strip_xmlns(svg: String) -> String {
    svg.replacen(" xmlns=\"http://www.w3.org/2000/svg\"", "", 1)
}

/// A number with three significant digits or so.
fn num(v: f64) -> String {
    let a = v.abs();
    if !v.is_finite() {
        "-".into()
    } else if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a >= 0.01 {
        format!("{v:.3}")
    } else {
        format!("{v:.1e}")
    }
}

/// An axis tick: up to three significant digits, no trailing zeros.
fn tick(v: f64) -> String {
    if !v.is_finite() {
        return String::new();
    }
    let t = if v == 0.0 || v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{:.*}", (2 - v.abs().log10().floor() as i32).max(0) as usize, v)
    };
    if t.contains('.') { t.trim_end_matches('0').trim_end_matches('.').to_string() } else { t }
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The file name of a profile path.
fn short_origin(o: &str) -> String {
    Path::new(o).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| o.to_string())
}

/// HTML text and attribute escaping.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_escapes() {
        assert_eq!(num(1234.5), "1234");
        assert_eq!(num(12.34), "12.3");
        assert_eq!(num(0.5), "0.500");
        assert_eq!(esc("<a & \"b\">"), "&lt;a &amp; &quot;b&quot;&gt;");
        assert_eq!(label_width(["x"].into_iter(), 100, 200), 100);
        assert_eq!(tick(9.0), "9");
        assert_eq!(tick(0.25), "0.25");
        assert_eq!(tick(30.0), "30");
        assert_eq!(tick(1500.0), "1500");
        let (lo, hi) = decade_span(1.0, 2.0);
        assert!((hi / lo - 100.0).abs() < 1e-9 && lo < 1.0 && hi > 2.0);
        assert_eq!(decade_span(0.0, -1.0), (0.1, 10.0));
    }

    #[test]
    fn accuracy_stands_beside_speed_with_what_the_budget_refused() {
        use crate::profile::doc::{Combination, EndToEnd};
        let comb = |label: &str, kld: Option<f64>, refused: Option<&str>, chosen: bool| Combination {
            label: label.into(),
            kld,
            refused: refused.map(String::from),
            chosen,
            result: Throughput { decode_tok_s: 50.0, prefill_tok_s: 900.0, ..Throughput::default() },
            ..Combination::default()
        };
        let mut e = EndToEnd { combinations: vec![comb("runtime default", None, None, false)], ..EndToEnd::default() };
        let mut h = String::new();
        accuracy(&mut h, &e);
        assert!(h.is_empty(), "a profile without divergences gets no accuracy table: {h}");
        e.max_kld = Some(2.5e-3);
        e.combinations = vec![
            comb("runtime default", Some(2e-3), None, false),
            comb("fused_qkv", Some(1.9e-3), None, true),
            comb("int8 <all>", Some(9e-3), Some("KL 9.000e-3 over the budget 2.500e-3"), false),
        ];
        accuracy(&mut h, &e);
        assert!(h.contains("budget 2.500e-3 nats") && h.contains("1.900e-3") && h.contains("within (tuned)"), "{h}");
        assert!(h.contains("refused: KL 9.000e-3 over the budget 2.500e-3") && h.contains("int8 &lt;all&gt;"), "{h}");
        assert_eq!(h.matches("<tr><td>").count(), 3, "{h}");
    }

    #[test]
    fn degenerate_numbers_draw_without_panicking() {
        let cand = |median: f64, ci: [f64; 2]| Candidate {
            variant: crate::profile::VariantDoc::id("k"),
            median_us: median,
            ci_us: ci,
            status: "measured".into(),
            ..Candidate::default()
        };
        for c in [cand(0.0, [0.0, 0.0]), cand(f64::NAN, [f64::NAN, f64::NAN]), cand(1e12, [0.0, f64::INFINITY])] {
            let s = SlotTuning { slot: "norm".into(), chosen: "k".into(), candidates: vec![c.clone(), c], ..SlotTuning::default() };
            let svg = candidates_chart(&s).expect("drawn");
            assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
        }
        let t = Tuning::default();
        assert!(e2e_chart(&e2e_rows(&t)).is_ok(), "an empty end_to_end still draws");
        let slot = SlotTuning::default();
        let odd = [
            Candidate { gbps: 1e-300, gflops: 1e300, ..cand(1.0, [1.0, 1.0]) },
            Candidate { gbps: 5.0, gflops: 1e-310, ..cand(1.0, [1.0, 1.0]) },
        ];
        let points: Vec<RoofPoint<'_>> = odd.iter().map(|c| RoofPoint { profile: 0, slot: &slot, c }).collect();
        for bw in [f64::INFINITY, f64::NAN, 0.0, 30.0] {
            assert!(roofline_chart(&points, &[("p".into(), bw, "x".into())], 1).is_ok(), "bandwidth {bw}");
        }
    }
}
