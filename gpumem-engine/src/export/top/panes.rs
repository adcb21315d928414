//! `gpumem top`'s pictures (ratatui widgets): a gauge per GPU (NVML's used
//! of total, with what gpumem traced and what PyTorch allocated and
//! reserved), the selected row's memory over time (a chart of its growth
//! samples) and its largest stacks as horizontal bars by bytes.
use ratatui::{
    layout::{Constraint, Layout, Rect},
    style::{Color, Style, Stylize as _},
    symbols,
    text::Line,
    widgets::{Axis, Bar, BarChart, Block, Borders, Chart, Dataset, GraphType, LineGauge, Paragraph},
    Frame,
};

use super::model::{device_name, GpuHeader, Row, Snapshot};
use crate::{
    analysis::{growth::Finding, leaks::LeakGroup},
    names::{bytes, printable},
};

/// A verdict's colour: red for a leak, yellow for a cache that grows, grey
/// while there is not enough data to judge.
pub fn verdict_style(leaking: bool, verdict: &str) -> Style {
    if leaking {
        Style::default().fg(Color::Red).bold()
    } else if verdict.contains("cache") {
        Style::default().fg(Color::Yellow)
    } else if verdict.contains("not enough") || verdict.contains("insufficient") {
        Style::default().fg(Color::DarkGray)
    } else {
        Style::default().fg(Color::Green)
    }
}

/// PyTorch's allocated and reserved bytes on a GPU: the tensors of the rows
/// whose allocator probes fired, and those rows' driver bytes.
fn torch_on(snap: &Snapshot, device: i32) -> Option<(u64, u64)> {
    let rows: Vec<&Row> = snap.rows.iter().filter(|r| r.device == device && r.allocated_bytes.is_some()).collect();
    (!rows.is_empty()).then(|| (rows.iter().filter_map(|r| r.allocated_bytes).sum(), rows.iter().map(|r| r.live_bytes).sum()))
}

/// The words beside a GPU's gauge.
pub fn gauge_words(g: &GpuHeader, torch: Option<(u64, u64)>) -> String {
    let mut words = match g.nvml {
        Some((used, total)) => format!("{} of {} used · traced {}", bytes(used), bytes(total), bytes(g.traced_bytes)),
        None => format!("NVML n/a · traced {}", bytes(g.traced_bytes)),
    };
    if let Some((allocated, reserved)) = torch {
        words.push_str(&format!(" · PyTorch {} allocated of {} reserved", bytes(allocated), bytes(reserved)));
    }
    if let Some(t) = g.temp_c {
        words.push_str(&format!(" · {t} °C"));
    }
    if let Some(h) = g.health {
        words.push_str(&format!(" · health {h}"));
    }
    words
}

/// One line per GPU: its name, a gauge of used (NVML) or traced bytes of
/// its total, and the figures.
pub fn draw_gauges(f: &mut Frame, area: Rect, snap: &Snapshot, selected: Option<i32>) {
    if snap.gpus.is_empty() {
        f.render_widget(Paragraph::new("no GPU seen yet (no NVML, no traced allocation)"), area);
        return;
    }
    let lines = Layout::vertical(vec![Constraint::Length(1); snap.gpus.len()]).split(area);
    for (g, line) in snap.gpus.iter().zip(lines.iter()) {
        let [name, gauge, words] = Layout::horizontal([Constraint::Length(22), Constraint::Length(32), Constraint::Min(10)]).areas(*line);
        let title = printable(&format!("GPU {} {}", g.index, g.name));
        let title = if selected == Some(g.index) { Line::from(title).bold() } else { Line::from(title) };
        f.render_widget(Paragraph::new(title), name);
        let (held, total) = g.nvml.unwrap_or((g.traced_bytes, g.traced_bytes.max(1)));
        let ratio = (held as f64 / total.max(1) as f64).clamp(0.0, 1.0);
        let colour = if ratio > 0.9 {
            Color::Red
        } else if ratio > 0.75 {
            Color::Yellow
        } else {
            Color::Cyan
        };
        let gauge_widget = LineGauge::default()
            .ratio(ratio)
            .label(format!("{:>3.0}%", ratio * 100.0))
            .filled_style(Style::default().fg(colour))
            .unfilled_style(Style::default().fg(Color::DarkGray))
            .filled_symbol(symbols::line::THICK.horizontal)
            .unfilled_symbol(symbols::line::THICK.horizontal);
        f.render_widget(gauge_widget, gauge);
        f.render_widget(Paragraph::new(format!(" {}", gauge_words(g, torch_on(snap, g.index)))), words);
    }
}

/// The selected row's live bytes over its growth samples (MiB), or the
/// selected GPU's traced bytes summed over its rows when no row is selected.
pub fn draw_chart(f: &mut Frame, area: Rect, row: Option<&Row>, sample_s: f64) {
    let Some(r) = row else {
        f.render_widget(
            Paragraph::new("no process selected").block(Block::default().borders(Borders::ALL).title(" memory over time ")),
            area,
        );
        return;
    };
    let points: Vec<(f64, f64)> =
        r.trend.iter().enumerate().map(|(i, &b)| ((i as f64 - (r.trend.len() as f64 - 1.0)) * sample_s, b as f64 / 1048576.0)).collect();
    let (lo, hi) = points.iter().fold((f64::MAX, 0.0f64), |(lo, hi), p| (lo.min(p.1), hi.max(p.1)));
    let lo = if lo == f64::MAX { 0.0 } else { (lo * 0.9).floor() };
    let hi = (hi * 1.05).max(lo + 1.0).ceil();
    let start = points.first().map_or(-1.0, |p| p.0.min(-1.0));
    let data = Dataset::default()
        .marker(symbols::Marker::Braille)
        .graph_type(GraphType::Line)
        .style(verdict_style(r.leaking, &r.verdict))
        .data(&points);
    let title = format!(" {} (pid {}) on GPU {}: live MiB, last {:.0} s ", printable(&r.comm), r.pid, device_name(r.device), -start);
    let chart = Chart::new(vec![data])
        .block(Block::default().borders(Borders::ALL).title(title))
        .x_axis(Axis::default().bounds([start, 0.0]).labels([format!("{start:.0} s"), "now".to_string()]))
        .y_axis(Axis::default().bounds([lo, hi]).labels([format!("{lo:.0}"), format!("{hi:.0}")]));
    f.render_widget(chart, area);
}

/// A stack's bar label: its innermost frames, innermost first.
fn bar_label(g: &LeakGroup) -> String {
    if g.frames.is_empty() {
        return "(no stack)".into();
    }
    let names: Vec<String> = g.frames.iter().take(3).map(|f| printable(&f.name())).collect();
    let label = names.join(" ← ");
    if label.chars().count() > 40 {
        format!("{}…", label.chars().take(39).collect::<String>())
    } else {
        label
    }
}

/// The selected row's largest stacks as horizontal bars by bytes (a text
/// flame: each bar a stack, named by its innermost frames), coloured by verdict.
pub fn draw_bars(f: &mut Frame, area: Rect, title: &str, groups: Option<&[LeakGroup]>) {
    let block = Block::default().borders(Borders::ALL).title(format!(" {title} "));
    let groups = match groups {
        Some(g) if !g.is_empty() => g,
        Some(_) => return f.render_widget(Paragraph::new("no live allocations with a stack").block(block), area),
        None => return f.render_widget(Paragraph::new("no process selected (↑↓ to select)").block(block), area),
    };
    let bars: Vec<Bar> = groups
        .iter()
        .map(|g| {
            let (leaking, word) = match g.verdict.as_ref().map(|v| v.verdict) {
                Some(Finding::Leak) => (true, "leak"),
                Some(Finding::CacheGrowth) => (false, "cache"),
                Some(Finding::Plateau) | Some(Finding::None) => (false, "ok"),
                _ => (false, "not enough"),
            };
            Bar::with_label(bar_label(g), g.bytes)
                .text_value(format!("{} in {}", bytes(g.bytes), g.count))
                .style(verdict_style(leaking, word))
        })
        .collect();
    let chart = BarChart::horizontal(bars).block(block).bar_width(1).bar_gap(0);
    f.render_widget(chart, area);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gauge_says_used_traced_and_pytorch() {
        let g = GpuHeader {
            index: 0,
            name: "H200".into(),
            uuid: String::new(),
            nvml: Some((20 << 30, 144 << 30)),
            traced_bytes: 9 << 20,
            temp_c: Some(60),
            memory_temp_c: None,
            health: Some(100),
        };
        assert_eq!(
            gauge_words(&g, Some((3 << 20, 8 << 20))),
            "20.0 GiB of 144.0 GiB used · traced 9.0 MiB · PyTorch 3.0 MiB allocated of 8.0 MiB reserved · 60 °C · health 100"
        );
        assert_eq!(verdict_style(true, "leak").fg, Some(Color::Red));
        assert_eq!(verdict_style(false, "cache growth").fg, Some(Color::Yellow));
    }
}
