//! The report's host side, on the GPU charts' time axis: each traced
//! process's resident, swapped-out and pinned host memory (with the host OOM
//! kills), the node's swap traffic and the containers' memory cgroups
//! against their limits. When VRAM fills, frameworks spill to host memory
//! and the host swaps: read together, these tell a GPU leak from a host one.
use std::fmt::Write as _;

use plotters::prelude::*;

use super::{color, draw_err, draw_marks, escape, legend, mib, steps, DrawError, Frame, ReportData};
use crate::{analysis::timeline::MarkKind, names::bytes};

/// What one line of the host chart shows.
#[derive(Clone, Copy)]
enum Line {
    Resident,
    Swapped,
    Pinned,
}

impl Line {
    fn name(self) -> &'static str {
        match self {
            Line::Resident => "resident",
            Line::Swapped => "swapped out",
            Line::Pinned => "pinned (CUDA)",
        }
    }

    /// The process's colour: resident bold, swapped out pale, pinned thin
    /// with a dot at each change. (No dashes: plotters draws them with
    /// hypotf, whose current symbol needs glibc 2.35, above gpumem's floor.)
    fn style(self, c: RGBColor) -> ShapeStyle {
        match self {
            Line::Resident => c.stroke_width(2),
            Line::Swapped => c.mix(0.45).stroke_width(3),
            Line::Pinned => c.stroke_width(1),
        }
    }
}

/// A cgroup path's last component, at most 32 characters (a container id's
/// cgroup is a long hash).
fn short_cgroup(path: &str) -> String {
    let last = path.rsplit('/').find(|c| !c.is_empty()).unwrap_or(path);
    match last.char_indices().nth(32) {
        Some((cut, _)) => format!("{}…", &last[..cut]),
        None => last.to_string(),
    }
}

/// One line of the host chart: whose, which, its points.
type HostSeries<'a> = (u32, Line, &'a [(f64, u64)]);

impl ReportData {
    /// Whether the recording has any host side to show.
    pub fn has_host(&self) -> bool {
        let t = &self.timeline;
        !t.resident.is_empty() || !t.pinned.is_empty() || t.node_swap.len() > 1 || !t.cgroups.is_empty()
    }

    /// The (process, line, points) series of the host chart: a process's
    /// swap and pinned lines only where they were ever above zero.
    fn host_series(&self) -> Vec<HostSeries<'_>> {
        let t = &self.timeline;
        let mut pids: Vec<u32> = t.resident.keys().chain(t.pinned.keys()).copied().collect();
        pids.sort_unstable();
        pids.dedup();
        let mut out = Vec::new();
        for pid in pids {
            for (line, series) in [(Line::Resident, &t.resident), (Line::Swapped, &t.swapped), (Line::Pinned, &t.pinned)] {
                match series.get(&pid) {
                    Some(s) if matches!(line, Line::Resident) || s.iter().any(|p| p.1 > 0) => out.push((pid, line, s.as_slice())),
                    _ => {}
                }
            }
        }
        out
    }

    /// Host MiB of each traced process over time: resident, swapped out and
    /// pinned by CUDA, with the host OOM kills marked.
    pub fn host_svg(&self) -> Result<String, DrawError> {
        let series = self.host_series();
        let top = series.iter().flat_map(|(_, _, s)| s.iter().map(|&(_, b)| mib(b))).fold(1.0, f64::max) * 1.1;
        let end = self.duration();
        self.chart(Frame::Full, "Host memory per process (MiB)", top, |chart| {
            let mut colours: Vec<u32> = Vec::new();
            for (pid, line, points) in series {
                let i = colours.iter().position(|&p| p == pid).unwrap_or_else(|| {
                    colours.push(pid);
                    colours.len() - 1
                });
                let style = line.style(color(i));
                let name = format!("{} {}", self.label(pid), line.name());
                let series = LineSeries::new(steps(points, end), style);
                let series = if matches!(line, Line::Pinned) { series.point_size(2) } else { series };
                chart.draw_series(series).map_err(draw_err)?.label(name).legend(legend(style));
            }
            draw_marks(chart, self.timeline.marks.iter().filter(|m| matches!(m.kind, MarkKind::OomKill { .. })), top)
        })
    }

    /// The node's swap traffic between readings, MiB/s in and out; None
    /// with fewer than two readings.
    pub fn swap_svg(&self) -> Result<Option<String>, DrawError> {
        let s = &self.timeline.node_swap;
        if s.len() < 2 {
            return Ok(None);
        }
        let rate = |a: (f64, u64), b: (f64, u64)| if b.0 > a.0 { mib(b.1.saturating_sub(a.1)) / (b.0 - a.0) } else { 0.0 };
        let lines: [(&str, Vec<(f64, f64)>); 2] = [
            ("swapped in", s.windows(2).map(|w| (w[1].0, rate((w[0].0, w[0].1), (w[1].0, w[1].1)))).collect()),
            ("swapped out", s.windows(2).map(|w| (w[1].0, rate((w[0].0, w[0].2), (w[1].0, w[1].2)))).collect()),
        ];
        let top = lines.iter().flat_map(|(_, v)| v.iter().map(|p| p.1)).fold(1.0, f64::max) * 1.15;
        self.chart(Frame::Half, "Node swap traffic (MiB/s)", top, |chart| {
            for (i, (name, v)) in lines.into_iter().enumerate() {
                let style = color(i + 3).stroke_width(2);
                chart.draw_series(LineSeries::new(v, style)).map_err(draw_err)?.label(name).legend(legend(style));
            }
            Ok(())
        })
        .map(Some)
    }

    /// Each traced process's limited memory cgroup (its container's), usage
    /// in MiB and its limit (pale); None without any.
    pub fn cgroups_svg(&self) -> Result<Option<String>, DrawError> {
        let cgroups = &self.timeline.cgroups;
        if cgroups.is_empty() {
            return Ok(None);
        }
        let top = cgroups.values().flat_map(|c| c.usage.iter().map(|&(_, b)| mib(b)).chain(c.limit.map(mib))).fold(1.0, f64::max) * 1.1;
        let end = self.duration();
        self.chart(Frame::Half, "Memory cgroups (MiB)", top, |chart| {
            for (i, (path, c)) in cgroups.iter().enumerate() {
                let style = color(i).stroke_width(2);
                chart
                    .draw_series(LineSeries::new(steps(&c.usage, end), style))
                    .map_err(draw_err)?
                    .label(format!("{} ({})", short_cgroup(path), self.label(c.pid)))
                    .legend(legend(style));
                if let Some(limit) = c.limit {
                    let (at, pale) = (mib(limit), color(i).mix(0.45).stroke_width(3));
                    chart
                        .draw_series(LineSeries::new([(0.0, at), (end, at)], pale))
                        .map_err(draw_err)?
                        .label(format!("limit {}", bytes(limit)))
                        .legend(legend(pale));
                }
            }
            Ok(())
        })
        .map(Some)
    }

    /// The section: the charts, and each process's host memory at its last reading.
    pub(super) fn host_section(&self, h: &mut String) -> Result<(), DrawError> {
        h.push_str("<h2 id=\"host\">Host memory (same time axis)</h2>\n");
        if !self.has_host() {
            h.push_str(
                "<p>No host-memory readings in this recording: an older gpumem wrote it, or no traced process was alive at a reading.</p>\n",
            );
            return Ok(());
        }
        h.push_str(&self.host_svg()?);
        h.push_str("<div class=\"row\">");
        for svg in [self.swap_svg()?, self.cgroups_svg()?].into_iter().flatten() {
            h.push_str(&svg);
        }
        h.push_str("</div>\n");
        let t = &self.timeline;
        if t.resident.is_empty() {
            return Ok(());
        }
        h.push_str("<table><tr><th>process</th><th>resident</th><th>swapped out</th><th>pinned (CUDA)</th><th>since</th></tr>\n");
        for (pid, resident) in &t.resident {
            // Its last value while alive (an exited one's last is 0), and since when it held.
            let Some(&(at, r)) = resident.iter().rev().find(|p| p.1 > 0) else { continue };
            let before = |s: Option<&Vec<(f64, u64)>>| s.and_then(|s| s.iter().rev().find(|p| p.0 <= at)).map_or(0, |p| p.1);
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{at:.1} s</td></tr>",
                escape(&self.label(*pid)),
                bytes(r),
                bytes(before(t.swapped.get(pid))),
                bytes(before(t.pinned.get(pid))),
            );
        }
        h.push_str("</table>\n");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{analysis::timeline::CgroupSeries, model::host::ProcessHost};

    #[test]
    fn the_host_section_has_each_processs_lines_and_its_last_reading() {
        let mut d = ReportData::default();
        d.footer.duration_s = 3.0;
        d.timeline.comm.insert(7, "train".into());
        let mut h = crate::model::host::HostMemory { swap_in_bytes: Some(0), swap_out_bytes: Some(0), ..Default::default() };
        h.processes.insert(7, ProcessHost { resident_bytes: 5 << 20, swap_bytes: 1 << 20 });
        d.timeline.host(1.0, &h);
        h.swap_out_bytes = Some(2 << 20);
        d.timeline.host(2.0, &h);
        d.timeline.pinned.insert(7, vec![(0.5, 3 << 20)]);
        let path = "/kubepods/burstable/pod1/0123456789abcdef0123456789abcdef0123456789abcdef";
        d.timeline.cgroups.insert(path.into(), CgroupSeries { pid: 7, usage: vec![(1.0, 64 << 20)], limit: Some(256 << 20) });
        let svg = d.host_svg().unwrap();
        for want in ["train (7) resident", "train (7) swapped out", "train (7) pinned (CUDA)"] {
            assert!(svg.contains(want), "{want}: {svg}");
        }
        assert!(d.swap_svg().unwrap().unwrap().contains("swapped out"));
        assert!(d.cgroups_svg().unwrap().unwrap().contains("0123456789abcdef0123456789abcdef… (train (7))"));
        let mut html = String::new();
        d.host_section(&mut html).unwrap();
        assert!(html.contains("<tr><td>train (7)</td><td class=\"num\">5.0 MiB</td><td class=\"num\">1.0 MiB</td><td class=\"num\">3.0 MiB</td><td class=\"num\">1.0 s</td></tr>"), "{html}");
        let empty = ReportData::default();
        let mut html = String::new();
        empty.host_section(&mut html).unwrap();
        assert!(html.contains("No host-memory readings"), "{html}");
    }
}
