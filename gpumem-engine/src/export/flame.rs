//! Memory flame graphs: a heap profile (analysis::profile) as Brendan
//! Gregg's folded stacks (`process (pid);GPU 0;main;…;alloc_site bytes`,
//! what flamegraph.pl, inferno, speedscope and Pyroscope read) and as an
//! interactive SVG drawn by the inferno crate (searchable, click to zoom,
//! nothing fetched). Groups the leak detector judged leaking or growing as
//! a cache end in a red `[leak]` or orange `[cache growth]` frame.
use std::collections::HashMap;

use inferno::flamegraph::{self, color::BasicPalette, Options, Palette};

use crate::{
    analysis::{growth::Finding, leaks::ProcessLeaks, profile::HeapProfile},
    stacks::Frame,
};

/// The frame that marks a leaking group.
pub const LEAK_FRAME: &str = "[leak]";
/// The frame that marks a group growing as a cache does.
pub const CACHE_FRAME: &str = "[cache growth]";
/// The frame of bytes whose stack was not captured.
pub const NO_STACK_FRAME: &str = "[stack not captured]";

/// Which bytes a flame graph weighs its stacks by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Space {
    /// Bytes still held (outstanding) now.
    #[default]
    Inuse,
    /// Bytes allocated over the session, freed or not.
    Alloc,
}

impl Space {
    pub fn name(self) -> &'static str {
        match self {
            Space::Inuse => "inuse",
            Space::Alloc => "alloc",
        }
    }

    pub fn parse(s: &str) -> Option<Space> {
        [Space::Inuse, Space::Alloc].into_iter().find(|v| v.name() == s)
    }

    fn title(self) -> &'static str {
        match self {
            Space::Inuse => "GPU memory held now, by allocation stack",
            Space::Alloc => "GPU memory allocated over the session, by allocation stack",
        }
    }
}

/// What to draw: which bytes, and optionally one process.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FlameQuery {
    pub space: Space,
    pub pid: Option<u32>,
}

/// A frame's name in a folded line: no `;` (the separator) and nothing
/// that is not printable (names come from traced processes).
fn clean(s: &str) -> String {
    crate::names::printable(s).replace(';', ":")
}

fn frame_name(f: &Frame) -> String {
    match (f.python, &f.file, f.line) {
        (true, Some(file), Some(line)) => {
            let file = file.rsplit('/').next().unwrap_or(file);
            clean(&format!("{} ({file}:{line})", f.name()))
        }
        _ => clean(&f.name()),
    }
}

/// The verdict frame of each (pid, device, stack) a leak report judged.
fn verdict_frames(leaks: &[ProcessLeaks]) -> HashMap<(u32, i32, u64), &'static str> {
    let mut out = HashMap::new();
    for p in leaks {
        let Some(device) = p.device else { continue };
        for g in &p.stacks {
            let (Some(id), Some(v)) = (g.stack_id.as_deref(), g.verdict.as_ref()) else { continue };
            let Ok(id) = u64::from_str_radix(id, 16) else { continue };
            let frame = match v.verdict {
                Finding::Leak => LEAK_FRAME,
                Finding::CacheGrowth => CACHE_FRAME,
                _ => continue,
            };
            out.insert((p.pid, device, id), frame);
        }
    }
    out
}

/// The profile's stacks as folded lines, root first, one per (process,
/// device, stack), heaviest first; stacks of no bytes are left out.
pub fn folded(profile: &HeapProfile, leaks: &[ProcessLeaks], q: &FlameQuery) -> String {
    let verdicts = verdict_frames(leaks);
    let mut lines: Vec<(i64, String)> = Vec::new();
    for s in profile.samples.iter().filter(|s| q.pid.is_none_or(|p| p == s.pid)) {
        let weight = match q.space {
            Space::Inuse => s.inuse_space,
            Space::Alloc => s.alloc_space,
        };
        if weight <= 0 {
            continue;
        }
        let mut names = vec![clean(&format!("{} ({})", s.comm, s.pid))];
        names.push(if s.host { "pinned host memory".to_string() } else { format!("GPU {}", s.device) });
        if s.frames.is_empty() {
            names.push(NO_STACK_FRAME.to_string());
        }
        names.extend(s.frames.iter().rev().map(frame_name));
        if let Some(v) = s.stack.and_then(|id| verdicts.get(&(s.pid, s.device, id))) {
            names.push((*v).to_string());
        }
        lines.push((weight, format!("{} {weight}", names.join(";"))));
    }
    lines.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let mut out = String::new();
    for (_, l) in lines {
        out.push_str(&l);
        out.push('\n');
    }
    out
}

/// Drawing a flame graph failed (inferno's error, in words).
#[derive(Debug, thiserror::Error)]
#[error("drawing the flame graph: {0}")]
pub struct FlameError(String);

/// The folded lines as inferno's SVG; `subtitle` says whose session it is.
/// An empty profile is a small SVG that says so (inferno refuses one).
pub fn svg(folded: &str, space: Space, subtitle: &str) -> Result<String, FlameError> {
    if folded.trim().is_empty() {
        return Ok(empty_svg(space));
    }
    let mut palette = flamegraph::color::PaletteMap::default();
    palette.insert(LEAK_FRAME, flamegraph::color::Color { r: 220, g: 30, b: 30 });
    palette.insert(CACHE_FRAME, flamegraph::color::Color { r: 240, g: 150, b: 20 });
    let mut opts = Options::default();
    opts.colors = Palette::Basic(BasicPalette::Mem);
    opts.palette_map = Some(&mut palette);
    opts.title = space.title().to_string();
    opts.subtitle = (!subtitle.is_empty()).then(|| clean(subtitle));
    opts.count_name = "bytes".to_string();
    opts.name_type = "Frame:".to_string();
    opts.deterministic = true;
    opts.min_width = 0.05;
    let mut out = Vec::new();
    flamegraph::from_lines(&mut opts, folded.lines(), &mut out).map_err(|e| FlameError(e.to_string()))?;
    String::from_utf8(out).map_err(|e| FlameError(e.to_string()))
}

fn empty_svg(space: Space) -> String {
    format!(
        "<?xml version=\"1.0\" standalone=\"no\"?>\n<svg version=\"1.1\" width=\"1200\" height=\"60\" xmlns=\"http://www.w3.org/2000/svg\">\
         <text x=\"600\" y=\"24\" text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"17\">{}</text>\
         <text x=\"600\" y=\"48\" text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"12\">no bytes to show</text></svg>\n",
        space.title()
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::analysis::{history::Layer, profile::HeapSample};

    fn frame(function: &str) -> Frame {
        Frame {
            function: Some(function.into()),
            offset: None,
            file: None,
            line: None,
            module: Arc::from("/bin/train"),
            module_offset: 0x10,
            python: false,
        }
    }

    fn sample(pid: u32, stack: u64, frames: Vec<Frame>, inuse: i64, alloc: i64) -> HeapSample {
        HeapSample {
            pid,
            comm: "train;evil\nname".into(),
            container: None,
            pod: None,
            device: 0,
            host: false,
            layer: Layer::Driver,
            stack: Some(stack),
            frames,
            alloc_objects: 1,
            alloc_space: alloc,
            inuse_objects: 1,
            inuse_space: inuse,
            estimated: false,
        }
    }

    #[test]
    fn folded_lines_are_root_first_cleaned_and_weighed_by_the_space_asked() {
        let profile = HeapProfile {
            samples: vec![
                sample(7, 1, vec![frame("leak_buffer"), frame("train_step"), frame("main")], 4096, 8192),
                sample(7, 2, vec![frame("scratch"), frame("main")], 0, 1 << 20),
            ],
            ..Default::default()
        };
        let held = folded(&profile, &[], &FlameQuery { space: Space::Inuse, pid: None });
        assert_eq!(held, "train:evil?name (7);GPU 0;main;train_step;leak_buffer 4096\n");
        let made = folded(&profile, &[], &FlameQuery { space: Space::Alloc, pid: Some(7) });
        assert_eq!(made.lines().count(), 2);
        assert!(made.starts_with("train:evil?name (7);GPU 0;main;scratch 1048576\n"), "{made}");
        assert_eq!(folded(&profile, &[], &FlameQuery { space: Space::Alloc, pid: Some(8) }), "");
    }

    #[test]
    fn the_svg_names_each_frame_with_its_bytes_and_an_empty_profile_says_so() {
        let drawn = svg("p (1);GPU 0;main;leak_buffer 4096\np (1);GPU 0;main;other 1024\n", Space::Inuse, "test").unwrap();
        assert!(drawn.contains("<title>leak_buffer (4,096 bytes, 80.00%)</title>"), "{drawn}");
        assert!(drawn.contains("<title>main (5,120 bytes, 100.00%)</title>"));
        let empty = svg("", Space::Alloc, "").unwrap();
        assert!(empty.contains("no bytes to show"));
    }
}
