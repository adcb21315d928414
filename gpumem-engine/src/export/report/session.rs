//! The report's head (a title that names the session: program, node,
//! start, duration; the full command below it) and its flame graphs.
use std::fmt::Write as _;

use base64::Engine as _;

use super::{escape, DrawError, ReportData};
use crate::export::flame::{self, Space, CACHE_FRAME, LEAK_FRAME};

impl ReportData {
    /// What the session was, in a few words (record::session_title).
    pub fn session_title(&self) -> String {
        let mut names: Vec<&str> = self.timeline.comm.values().map(String::as_str).collect();
        names.sort_unstable();
        names.dedup();
        crate::record::session_title(self.header.as_ref(), &names, self.footer.duration_s)
    }

    /// The page's head, title and what the recording was.
    pub(super) fn head(&self, h: &mut String) {
        let title = format!("gpumem report: {}", escape(&self.session_title()));
        let _ = write!(
            h,
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>\n<style>\
             body{{font-family:sans-serif;margin:24px;color:#222}}h1{{font-size:22px}}h2{{font-size:18px;margin-top:28px}}\
             table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:left}}\
             .num{{text-align:right}}pre{{background:#f6f6f6;padding:6px;font-size:12px;margin:2px 0}}.warn{{color:#b00}}\
             .row{{display:flex;gap:12px;flex-wrap:wrap}}.cmd{{color:#555;font-size:13px}}\
             object.flame{{width:100%;border:1px solid #ddd}}</style></head><body>\n<h1>{title}</h1>\n"
        );
        if let Some(c) = self.header.as_ref().and_then(|h| h.command.as_deref()) {
            let _ = writeln!(h, "<p class=\"cmd\">Command: <code>{}</code></p>", escape(c));
        }
        let f = &self.footer;
        let _ = writeln!(
            h,
            "<p>{:.1} s traced, {} events, {} lost, {} probes attached; recorded by gpumem {}.</p>",
            f.duration_s,
            self.timeline.events,
            f.lost.total(),
            f.probes_attached,
            escape(self.header.as_ref().map_or("?", |h| h.gpumem_version.as_str()))
        );
        if let Some(d) = &self.damage {
            let _ =
                writeln!(h, "<p class=\"warn\">The recording is damaged: {}. This report covers what was read before it.</p>", escape(d));
        }
    }

    /// Each flame graph, inferno's SVG embedded as a data URL (its script,
    /// search and zoom, runs inside it; nothing is fetched).
    pub(super) fn flame_section(&self, h: &mut String) -> Result<(), DrawError> {
        if self.flames.is_empty() {
            return Ok(());
        }
        let _ = writeln!(
            h,
            "<h2 id=\"flame-graphs\">Memory flame graphs</h2>\n<p>Bytes by allocation stack, per process and GPU (the two \
             lowest rows): click a frame to zoom, Ctrl+F or Search to find a function; a frame's tooltip gives its bytes. \
             Groups judged leaking end in a red <code>{LEAK_FRAME}</code> frame, those growing as a cache in an orange \
             <code>{CACHE_FRAME}</code> one.</p>"
        );
        for (space, folded) in &self.flames {
            let heading = match space {
                Space::Inuse => "Held at the end",
                Space::Alloc => "Allocated over the session",
            };
            let svg = flame::svg(folded, *space, &self.session_title()).map_err(|e| DrawError(e.to_string()))?;
            let height = svg_height(&svg).unwrap_or(400);
            let data = base64::engine::general_purpose::STANDARD.encode(svg.as_bytes());
            let _ = writeln!(
                h,
                "<h3 id=\"flame-{}\">{heading}</h3>\n<object class=\"flame\" type=\"image/svg+xml\" height=\"{height}\" \
                 title=\"{heading}: memory flame graph\" data=\"data:image/svg+xml;base64,{data}\">{} stack(s)</object>",
                space.name(),
                folded.lines().count()
            );
        }
        Ok(())
    }
}

/// The `height` of an SVG's root element.
fn svg_height(svg: &str) -> Option<u32> {
    let root = &svg[svg.find("<svg")?..];
    let root = &root[..root.find('>')?];
    let at = root.find(" height=\"")? + 9;
    root[at..].split('"').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_svg_says_its_height() {
        assert_eq!(svg_height("<?xml?><svg version=\"1.1\" width=\"1200\" height=\"342\" x=\"1\">"), Some(342));
    }
}
