//! `gpumem report`: a self-contained HTML page (inline SVG charts drawn with
//! plotters, no scripts, nothing fetched) and single SVG charts, from the
//! timeline a replay kept (analysis::timeline) and the leak suspects.
mod host;
mod session;

use std::fmt::Write as _;

use plotters::{coord::types::RangedCoordf64, prelude::*, style::full_palette};

use crate::names::bytes;
use crate::{
    analysis::{
        leaks::ProcessLeaks,
        timeline::{Mark, MarkKind, Timeline},
    },
    model::readings::NvmlPoint,
    record::{Footer, Header},
};

/// Drawing a chart failed (plotters' error, in words).
#[derive(Debug, thiserror::Error)]
#[error("drawing a chart: {0}")]
pub struct DrawError(String);

fn draw_err(e: impl std::fmt::Display) -> DrawError {
    DrawError(e.to_string())
}

/// A mark's words.
pub fn mark_label(m: &Mark) -> String {
    match m.kind {
        MarkKind::CudaOom { pid, requested } => format!("CUDA OOM pid {pid} ({})", bytes(requested)),
        MarkKind::OomKill { pid } => format!("OOM kill pid {pid}"),
        MarkKind::Xid { xid } => format!("XID {xid}"),
    }
}

/// Everything a report shows.
#[derive(Default)]
pub struct ReportData {
    pub timeline: Timeline,
    pub header: Option<Header>,
    pub footer: Footer,
    pub leaks: Vec<ProcessLeaks>,
    /// Why the recording could not be read to its end, if it could not.
    pub damage: Option<String>,
    /// Folded stacks of the bytes held at the end and of those allocated
    /// over the session (export::flame), drawn as flame graphs.
    pub flames: Vec<(crate::export::flame::Space, String)>,
}

const W: u32 = 1100;
const H: u32 = 360;

/// HTML text with the five special characters escaped (names and frames come
/// from traced processes).
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && c != '\n' => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

fn color(i: usize) -> RGBColor {
    const C: [RGBColor; 8] = [
        full_palette::BLUE_700,
        full_palette::ORANGE_700,
        full_palette::GREEN_700,
        full_palette::PURPLE_500,
        full_palette::BROWN_500,
        full_palette::PINK_400,
        full_palette::GREY_600,
        full_palette::CYAN_700,
    ];
    C[i % C.len()]
}

fn mib(b: u64) -> f64 {
    b as f64 / 1048576.0
}

/// A chart's size: the full-width timelines (MiB), or the half-width pairs.
#[derive(Clone, Copy)]
enum Frame {
    Full,
    Half,
}

type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A legend entry: a short stroke in the series' style.
fn legend(style: ShapeStyle) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], style)
}

/// OOM and XID marks: a red line each, with its words at the top; words
/// that would overlap earlier ones go a line lower (up to `LANES` lines,
/// then the least crowded).
fn draw_marks<'m>(chart: &mut Chart<'_, '_>, marks: impl Iterator<Item = &'m Mark>, top: f64) -> Result<(), DrawError> {
    const LANES: usize = 6;
    /// Sans-serif 12 px: about 7 px a character.
    const CHAR_PX: f64 = 7.0;
    let red = full_palette::RED_600;
    let (xs, _) = chart.plotting_area().get_pixel_range();
    let range = chart.x_range();
    let s_per_px = (range.end - range.start) / f64::from((xs.end - xs.start).max(1));
    let mut marks: Vec<&Mark> = marks.collect();
    marks.sort_by(|a, b| a.t_s.total_cmp(&b.t_s));
    // Where each lane's last words end, in seconds.
    let mut lanes = [f64::NEG_INFINITY; LANES];
    for m in marks {
        let label = mark_label(m);
        let width = (label.chars().count() as f64 * CHAR_PX + 6.0) * s_per_px;
        let lane = lanes
            .iter()
            .position(|&end| end < m.t_s)
            .unwrap_or_else(|| (0..LANES).min_by(|&a, &b| lanes[a].total_cmp(&lanes[b])).unwrap_or(0));
        lanes[lane] = m.t_s + width;
        chart.draw_series(std::iter::once(PathElement::new(vec![(m.t_s, 0.0), (m.t_s, top)], red.stroke_width(1)))).map_err(draw_err)?;
        let y = top * (0.97 - 0.055 * lane as f64);
        chart.draw_series(std::iter::once(Text::new(label, (m.t_s, y), ("sans-serif", 12).into_font().color(&red)))).map_err(draw_err)?;
    }
    Ok(())
}

/// A series of bytes as MiB steps: a value holds until the next change
/// (and to `end`).
fn steps(points: &[(f64, u64)], end: f64) -> Vec<(f64, f64)> {
    let mut steps = Vec::with_capacity(points.len() * 2 + 1);
    let mut last = 0.0;
    for &(t, b) in points {
        steps.push((t, last));
        last = mib(b);
        steps.push((t, last));
    }
    steps.push((end, last));
    steps
}

impl ReportData {
    fn duration(&self) -> f64 {
        let t = &self.timeline;
        let last = t.series.values().chain(t.resident.values()).flat_map(|s| s.last()).map(|&(t, _)| t).fold(0.0, f64::max);
        self.footer.duration_s.max(last).max(1e-3)
    }

    fn label(&self, pid: u32) -> String {
        format!("{} ({pid})", self.timeline.comm.get(&pid).map(String::as_str).unwrap_or("?"))
    }

    /// Live MiB of each process over time on `device` (None: all GPUs), with
    /// OOM and XID marks.
    pub fn timeline_svg(&self, device: Option<i32>) -> Result<String, DrawError> {
        type Series<'a> = (&'a (u32, i32), &'a Vec<(f64, u64)>);
        let series: Vec<Series> = self.timeline.series.iter().filter(|((_, d), _)| device.is_none_or(|x| *d == x)).collect();
        let top = series.iter().flat_map(|(_, s)| s.iter().map(|&(_, b)| mib(b))).fold(1.0, f64::max) * 1.1;
        let title = match device {
            Some(d) => format!("GPU {d}: live memory per process (MiB)"),
            None => "Live GPU memory per process and GPU (MiB)".to_string(),
        };
        self.chart(Frame::Full, &title, top, |chart| {
            for (i, ((pid, dev), points)) in series.iter().enumerate() {
                let style = color(i).stroke_width(2);
                let name = if device.is_some() { self.label(*pid) } else { format!("{} GPU {dev}", self.label(*pid)) };
                chart
                    .draw_series(LineSeries::new(steps(points, self.duration()), style))
                    .map_err(draw_err)?
                    .label(name)
                    .legend(legend(style));
            }
            let marks = self.timeline.marks.iter().filter(|m| device.is_none() || m.device.is_none() || m.device == device);
            draw_marks(chart, marks, top)
        })
    }

    /// Allocation sizes, count per power-of-4 bucket.
    pub fn sizes_svg(&self) -> Result<String, DrawError> {
        let buckets: Vec<(u64, u64)> = self.timeline.size_buckets.iter().map(|(&k, &v)| (k, v)).collect();
        let n = buckets.len().max(1);
        let top = buckets.iter().map(|&(_, c)| c).max().unwrap_or(1) as f64 * 1.15;
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (W, 300)).into_drawing_area();
            root.fill(&WHITE).map_err(draw_err)?;
            let labels: Vec<String> =
                buckets.iter().map(|&(k, _)| if k == u64::MAX { "more".to_string() } else { format!("≤{}", bytes(k)) }).collect();
            let mut chart = ChartBuilder::on(&root)
                .caption("Allocation sizes (successful allocations)", ("sans-serif", 18))
                .margin(10)
                .x_label_area_size(35)
                .y_label_area_size(60)
                .build_cartesian_2d(0f64..n as f64, 0f64..top)
                .map_err(draw_err)?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(n)
                .x_label_formatter(&|x| labels.get(x.floor() as usize).cloned().unwrap_or_default())
                .y_desc("allocations")
                .draw()
                .map_err(draw_err)?;
            chart
                .draw_series(buckets.iter().enumerate().map(|(i, &(_, c))| {
                    Rectangle::new([(i as f64 + 0.1, 0.0), (i as f64 + 0.9, c as f64)], full_palette::BLUE_600.filled())
                }))
                .map_err(draw_err)?;
            root.present().map_err(draw_err)?;
        }
        Ok(svg)
    }

    /// One NVML reading over time for one GPU: ECC errors or temperatures.
    pub fn nvml_svg(&self, gpu: u32, what: &str) -> Result<Option<String>, DrawError> {
        let points: Vec<&NvmlPoint> = self.timeline.nvml.iter().filter(|p| p.gpu == gpu).collect();
        type Pick = fn(&NvmlPoint) -> Option<f64>;
        let lines: Vec<(&str, Pick)> = match what {
            "ecc" => vec![
                ("corrected ECC (volatile)", |p| p.ecc_corrected.map(|v| v as f64)),
                ("uncorrected ECC (volatile)", |p| p.ecc_uncorrected.map(|v| v as f64)),
            ],
            _ => vec![("GPU °C", |p| p.gpu_temp_c.map(f64::from)), ("memory (HBM) °C", |p| p.memory_temp_c.map(f64::from))],
        };
        let data: Vec<(&str, Vec<(f64, f64)>)> = lines
            .iter()
            .map(|(n, f)| (*n, points.iter().filter_map(|p| Some((p.t_s, f(p)?))).collect::<Vec<_>>()))
            .filter(|(_, v)| !v.is_empty())
            .collect();
        if data.is_empty() {
            return Ok(None);
        }
        let top = data.iter().flat_map(|(_, v)| v.iter().map(|&(_, y)| y)).fold(1.0, f64::max) * 1.15;
        let title = if what == "ecc" { format!("GPU {gpu}: ECC errors") } else { format!("GPU {gpu}: temperatures") };
        self.chart(Frame::Half, &title, top, |chart| {
            for (i, (name, v)) in data.into_iter().enumerate() {
                let style = color(i + 1).stroke_width(2);
                chart.draw_series(LineSeries::new(v, style)).map_err(draw_err)?.label(name).legend(legend(style));
            }
            Ok(())
        })
        .map(Some)
    }

    /// A chart on the session's time axis (MiB, or `top` of what `draw`
    /// draws), with its legend.
    fn chart<F>(&self, frame: Frame, title: &str, top: f64, draw: F) -> Result<String, DrawError>
    where
        F: FnOnce(&mut Chart<'_, '_>) -> Result<(), DrawError>,
    {
        let (size, font, margin, x_area, y_area) = match frame {
            Frame::Full => ((W, H), 18, 10, 35, 70),
            Frame::Half => ((W / 2 - 10, 260), 16, 8, 30, 50),
        };
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
            root.fill(&WHITE).map_err(draw_err)?;
            let mut chart = ChartBuilder::on(&root)
                .caption(title, ("sans-serif", font))
                .margin(margin)
                .x_label_area_size(x_area)
                .y_label_area_size(y_area)
                .build_cartesian_2d(0f64..self.duration(), 0f64..top)
                .map_err(draw_err)?;
            let mut mesh = chart.configure_mesh();
            mesh.x_desc("seconds");
            if matches!(frame, Frame::Full) {
                mesh.y_desc("MiB");
            }
            mesh.draw().map_err(draw_err)?;
            draw(&mut chart)?;
            chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(draw_err)?;
            root.present().map_err(draw_err)?;
        }
        Ok(svg)
    }

    /// The whole page.
    pub fn html(&self) -> Result<String, DrawError> {
        let mut h = String::new();
        self.head(&mut h);
        h.push_str("<h2>Live memory over time</h2>\n");
        h.push_str(&self.timeline_svg(None)?);
        self.host_section(&mut h)?;
        for dev in self.timeline.devices() {
            self.gpu_section(&mut h, dev)?;
        }
        self.marks_table(&mut h);
        h.push_str("<h2>Allocation sizes</h2>\n");
        h.push_str(&self.sizes_svg()?);
        self.leak_suspects(&mut h);
        self.flame_section(&mut h)?;
        h.push_str("</body></html>\n");
        Ok(h)
    }

    /// One GPU: NVML's identity and memory, its timeline, ECC and temperatures.
    fn gpu_section(&self, h: &mut String, dev: i32) -> Result<(), DrawError> {
        let _ = writeln!(h, "<h2 id=\"gpu-{dev}\">GPU {dev}</h2>");
        // NVML's used memory counts every process and the driver: next to
        // the traced lines it would flatten them, so it is given as text.
        if let Some(p) = self.timeline.nvml.iter().rev().find(|p| p.gpu as i32 == dev) {
            let used = match (p.used_bytes, p.total_bytes) {
                (Some(u), Some(t)) => format!(": NVML {} used of {} at the last reading", bytes(u), bytes(t)),
                _ => String::new(),
            };
            let _ = writeln!(h, "<p>{} {}{used}</p>", escape(&p.name), escape(&p.uuid));
        }
        h.push_str(&self.timeline_svg(Some(dev))?);
        if dev >= 0 {
            h.push_str("<div class=\"row\">");
            for what in ["ecc", "temperature"] {
                if let Some(svg) = self.nvml_svg(dev as u32, what)? {
                    h.push_str(&svg);
                }
            }
            h.push_str("</div>\n");
        }
        Ok(())
    }

    fn marks_table(&self, h: &mut String) {
        if self.timeline.marks.is_empty() {
            return;
        }
        h.push_str("<h2>Out-of-memory and XID events</h2>\n<table><tr><th>seconds</th><th>GPU</th><th>event</th></tr>\n");
        for m in &self.timeline.marks {
            let dev = m.device.map_or("host".to_string(), |d| d.to_string());
            let _ = writeln!(h, "<tr><td class=\"num\">{:.3}</td><td>{dev}</td><td>{}</td></tr>", m.t_s, escape(&mark_label(m)));
        }
        h.push_str("</table>\n");
    }

    fn leak_suspects(&self, h: &mut String) {
        h.push_str("<h2>Leak suspects (live allocations at the end of the recording)</h2>\n");
        if self.leaks.iter().all(|p| p.outstanding_allocs == 0) {
            h.push_str("<p>None: every process had freed its memory or exited.</p>\n");
        }
        for p in self.leaks.iter().filter(|p| p.outstanding_allocs > 0) {
            let verdict = p.growth.as_ref().map_or("not enough data".to_string(), |g| {
                if g.leaking {
                    format!("growing {}/s (confidence {:.2})", bytes(g.rate_bytes_per_s.max(0.0) as u64), g.confidence)
                } else {
                    format!("{} ({})", g.verdict.name(), super::verdict_figures(g))
                }
            });
            let _ = writeln!(
                h,
                "<h3>{} on GPU {}: {} in {} allocation(s); growth: {}</h3>",
                escape(&self.label(p.pid)),
                p.device.map_or("?".to_string(), |d| d.to_string()),
                bytes(p.outstanding_bytes),
                p.outstanding_allocs,
                escape(&verdict)
            );
            if !p.breakdown.by_owner.is_empty() {
                let _ = writeln!(h, "<p>By owner (who asked the driver): {}</p>", escape(&super::owners_line(&p.breakdown.by_owner)));
            }
            for line in super::breakdown::beyond_owners(&p.breakdown) {
                let _ = writeln!(h, "<p>{}</p>", escape(&line));
            }
            for g in &p.stacks {
                let frames: Vec<String> = g.frames.iter().map(|f| escape(&f.display())).collect();
                let _ = writeln!(
                    h,
                    "<p>{}{}, oldest {:.1} s{}</p><pre>{}</pre>",
                    spark_svg(&g.trend, g.verdict.as_ref().is_some_and(|v| v.leaking)),
                    escape(&super::group_figures(g)),
                    g.oldest_age_s,
                    escape(&super::group_verdict(g)),
                    if frames.is_empty() { "(no stack)".to_string() } else { frames.join("\n") }
                );
            }
            if let Some(note) = super::not_sampled_note(p.not_sampled_allocs, p.not_sampled_bytes) {
                let _ = writeln!(h, "<p>{}</p>", escape(&note));
            }
        }
    }
}

/// A group's bytes over its last samples as a small inline line (red where
/// it leaks); nothing for fewer than two samples.
fn spark_svg(trend: &[u64], leaking: bool) -> String {
    if trend.len() < 2 {
        return String::new();
    }
    let (w, hgt) = (120.0, 24.0);
    let (lo, hi) = (*trend.iter().min().unwrap_or(&0), *trend.iter().max().unwrap_or(&0));
    let span = (hi - lo).max(1) as f64;
    let points: Vec<String> = trend
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let x = i as f64 * w / (trend.len() - 1) as f64;
            let y = hgt - 2.0 - (v - lo) as f64 / span * (hgt - 4.0);
            format!("{x:.1},{y:.1}")
        })
        .collect();
    let color = if leaking { "#c0392b" } else { "#555" };
    format!(
        "<svg class=\"spark\" width=\"{w}\" height=\"{hgt}\" viewBox=\"0 0 {w} {hgt}\"><polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/></svg> ",
        points.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_sparkline_is_an_svg_line_through_its_samples() {
        let s = spark_svg(&[0, 5, 10], true);
        assert!(
            s.starts_with("<svg class=\"spark\"") && s.contains("points=\"0.0,22.0 60.0,12.0 120.0,2.0\"") && s.contains("#c0392b"),
            "{s}"
        );
        assert_eq!(spark_svg(&[7], false), "");
    }

    #[test]
    fn escaping() {
        assert_eq!(escape("<script>alert('x')</script>&\u{1b}"), "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;?");
    }

    #[test]
    fn a_chart_is_an_svg_document_with_its_series() {
        let mut d = ReportData::default();
        d.footer.duration_s = 2.0;
        d.timeline.comm.insert(7, "train<1>".into());
        d.timeline.series.insert((7, 0), vec![(0.5, 4 << 20), (1.5, 8 << 20)]);
        d.timeline.marks.push(Mark { t_s: 1.0, device: Some(0), kind: MarkKind::CudaOom { pid: 7, requested: 1 << 20 } });
        let svg = d.timeline_svg(Some(0)).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.contains("train&lt;1&gt; (7)"), "labels are escaped: {svg}");
        assert!(svg.contains("CUDA OOM pid 7"));
        let html = d.html().unwrap();
        assert!(html.contains("<h2 id=\"gpu-0\">GPU 0</h2>") && html.ends_with("</body></html>\n"));
    }
}
