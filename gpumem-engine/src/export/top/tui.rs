//! `gpumem top`'s terminal UI (ratatui): the screen's own state (sort,
//! filter, GPU, pause, selection, the stacks popup), what a key does to it,
//! and drawing a snapshot: per-GPU gauges, the process table, the selected
//! row's memory over time and its stacks as bars (panes.rs).
use ratatui::{
    crossterm::event::{KeyCode, KeyEvent},
    layout::{Constraint, Layout, Margin},
    style::{Modifier, Style, Stylize as _},
    text::{Line, Text},
    widgets::{Block, Borders, Cell, Clear, Paragraph, Row as TableRow, Table, TableState, Wrap},
    Frame,
};

use super::{
    model::{allocated, allocs, device_name, growth, host_bytes, spark_tail, sparkline, Row, Snapshot, SortKey},
    panes,
};
use crate::{
    analysis::leaks::LeakGroup,
    names::{bytes, printable},
};

/// What the screen shows besides the snapshot.
#[derive(Default)]
pub struct Screen {
    pub sort: SortKey,
    pub filter: String,
    /// Typing a filter (after '/').
    pub editing: bool,
    /// Index into the GPUs of the snapshot; None: all.
    pub gpu: Option<usize>,
    pub paused: bool,
    pub table: TableState,
    /// The selected process's top stacks, while shown: (title, lines).
    pub stacks: Option<(String, Vec<String>)>,
    /// The selected row's largest stacks, for the bars pane: (pid, device,
    /// groups; None: the process is gone), refreshed with each snapshot.
    pub pane: Option<(u32, i32, Option<Vec<LeakGroup>>)>,
}

/// What a key asks for beyond changing the screen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    None,
    Quit,
    /// Show this row's largest live allocation stacks.
    Stacks {
        pid: u32,
        device: i32,
        title: String,
        /// The row's breakdown lines, shown above its stacks.
        breakdown: Vec<String>,
    },
}

impl Screen {
    pub fn device(&self, snap: &Snapshot) -> Option<i32> {
        self.gpu.and_then(|i| snap.gpus.get(i)).map(|g| g.index)
    }

    fn visible<'a>(&self, snap: &'a Snapshot) -> Vec<&'a Row> {
        snap.visible(&self.filter, self.device(snap))
    }

    /// The row under the cursor.
    pub fn selected_row<'a>(&self, snap: &'a Snapshot) -> Option<&'a Row> {
        let rows = self.visible(snap);
        rows.get(self.table.selected().unwrap_or(0).min(rows.len().saturating_sub(1))).copied()
    }

    pub fn key(&mut self, snap: &Snapshot, k: KeyEvent) -> Action {
        if self.editing {
            match k.code {
                KeyCode::Enter | KeyCode::Esc => self.editing = false,
                KeyCode::Backspace => {
                    self.filter.pop();
                }
                KeyCode::Char(c) if !c.is_control() => self.filter.push(c),
                _ => {}
            }
            self.table.select(Some(0));
            return Action::None;
        }
        if self.stacks.is_some() {
            self.stacks = None;
            return if matches!(k.code, KeyCode::Char('q')) { Action::Quit } else { Action::None };
        }
        let rows = self.visible(snap).len();
        match k.code {
            KeyCode::Char('q') => return Action::Quit,
            KeyCode::Char('s') => self.sort = self.sort.next(),
            KeyCode::Char('/') => {
                self.editing = true;
                self.filter.clear();
            }
            KeyCode::Char('g') => {
                self.gpu = match self.gpu {
                    None if !snap.gpus.is_empty() => Some(0),
                    Some(i) if i + 1 < snap.gpus.len() => Some(i + 1),
                    _ => None,
                };
                self.table.select(Some(0));
            }
            KeyCode::Char('p') | KeyCode::Char(' ') => self.paused = !self.paused,
            KeyCode::Down | KeyCode::Char('j') => {
                self.table.select(Some((self.table.selected().unwrap_or(0) + 1).min(rows.saturating_sub(1))))
            }
            KeyCode::Up | KeyCode::Char('k') => self.table.select(Some(self.table.selected().unwrap_or(0).saturating_sub(1))),
            KeyCode::Enter | KeyCode::Char('t') => {
                if let Some(r) = self.visible(snap).get(self.table.selected().unwrap_or(0)) {
                    let title = format!(
                        "{} (pid {}) on GPU {}: where its memory went, its largest live allocation stacks",
                        r.comm,
                        r.pid,
                        device_name(r.device)
                    );
                    return Action::Stacks { pid: r.pid, device: r.device, title, breakdown: r.breakdown.clone() };
                }
            }
            _ => {}
        }
        Action::None
    }
}

/// A row's popup: where its memory went, then its stacks; None: the process is gone.
pub fn stack_lines(breakdown: &[String], groups: Option<&[LeakGroup]>) -> Vec<String> {
    let Some(groups) = groups else { return vec!["the process is gone".into()] };
    let mut lines: Vec<String> = breakdown.to_vec();
    if !lines.is_empty() {
        lines.push(String::new());
    }
    if groups.is_empty() {
        lines.push("no live allocations with a stack".into());
        return lines;
    }
    for g in groups {
        lines.push(format!("{}, oldest {:.0} s{}", crate::export::group_figures(g), g.oldest_age_s, crate::export::group_verdict(g)));
        if g.frames.is_empty() {
            lines.push("    (no stack)".into());
        }
        for f in g.frames.iter().take(12) {
            lines.push(format!("    {}", printable(&f.display())));
        }
    }
    lines
}

const WIDTHS: [Constraint; 13] = [
    Constraint::Length(8),
    Constraint::Length(24),
    Constraint::Length(16),
    Constraint::Length(4),
    Constraint::Length(11),
    Constraint::Length(7),
    Constraint::Length(11),
    Constraint::Length(11),
    Constraint::Length(11),
    Constraint::Length(12),
    Constraint::Length(21),
    Constraint::Length(16),
    Constraint::Min(10),
];

/// Rows of the chart and bars panes, when the terminal has room for them.
const PANES_HEIGHT: u16 = 12;

pub fn draw(f: &mut Frame, snap: &Snapshot, screen: &mut Screen, probes: usize) {
    let gpu_lines = snap.gpus.len().max(1) as u16;
    let panes_height = if f.area().height >= gpu_lines + 2 + 8 + PANES_HEIGHT { PANES_HEIGHT } else { 0 };
    let [head, body, panes_area, foot] =
        Layout::vertical([Constraint::Length(gpu_lines + 2), Constraint::Min(3), Constraint::Length(panes_height), Constraint::Length(1)])
            .areas(f.area());
    let device = screen.device(snap);
    let filter = if screen.filter.is_empty() && !screen.editing {
        "-".to_string()
    } else {
        format!("{}{}", screen.filter, if screen.editing { "▏" } else { "" })
    };
    let title = format!(
        " gpumem top · sort: {} · GPU: {} · filter: {filter}{} · {} events, {} lost, {} probes ",
        screen.sort.name(),
        device.map_or("all".to_string(), device_name),
        if screen.paused { " · PAUSED" } else { "" },
        snap.events,
        snap.lost,
        probes
    );
    let block = Block::default().borders(Borders::ALL).title(title.bold());
    let gauges = block.inner(head);
    f.render_widget(block, head);
    panes::draw_gauges(f, gauges, snap, device);

    let header = TableRow::new([
        "PID",
        "POD/CONTAINER",
        "COMM",
        "GPU",
        "LIVE",
        "ALLOCS",
        "TENSORS",
        "HOST",
        "SWAP",
        "GROWTH",
        "TREND",
        "VERDICT",
        "LAST FAILURE",
    ])
    .style(Style::default().add_modifier(Modifier::BOLD | Modifier::REVERSED));
    let rows = screen.visible(snap).into_iter().map(table_row);
    if screen.table.selected().is_none() {
        screen.table.select(Some(0));
    }
    let table = Table::new(rows, WIDTHS).header(header).row_highlight_style(Style::default().add_modifier(Modifier::REVERSED));
    f.render_stateful_widget(table, body, &mut screen.table);
    if panes_height > 0 {
        let [chart, bars] = Layout::horizontal([Constraint::Percentage(45), Constraint::Percentage(55)]).areas(panes_area);
        let row = screen.selected_row(snap);
        panes::draw_chart(f, chart, row, crate::analysis::growth::SAMPLE_INTERVAL_S);
        let groups = match (&screen.pane, row) {
            (Some((pid, dev, g)), Some(r)) if *pid == r.pid && *dev == r.device => Some(g.as_deref().unwrap_or(&[])),
            _ => None,
        };
        let title = row
            .map_or("largest stacks".to_string(), |r| format!("pid {} on GPU {}: largest stacks by bytes", r.pid, device_name(r.device)));
        panes::draw_bars(f, bars, &title, groups);
    }
    let help = if screen.editing {
        "type to filter by name, pod or pid · Enter done · Esc done"
    } else {
        "q quit · s sort · / filter · g GPU · p pause · ↑↓ select · Enter stacks"
    };
    f.render_widget(Paragraph::new(help).reversed(), foot);

    if let Some((title, lines)) = &screen.stacks {
        let area = body.inner(Margin { horizontal: 4, vertical: 1 });
        f.render_widget(Clear, area);
        let text = Text::from(lines.iter().map(|l| Line::from(l.clone())).collect::<Vec<_>>());
        let popup = Paragraph::new(text)
            .wrap(Wrap { trim: false })
            .block(Block::default().borders(Borders::ALL).title(format!(" {title} (any key closes) ")));
        f.render_widget(popup, area);
    }
}

/// One process row of the table, red while it leaks.
fn table_row(r: &Row) -> TableRow<'static> {
    let row = TableRow::new(vec![
        Cell::from(r.pid.to_string()),
        Cell::from(r.workload.clone()),
        Cell::from(r.comm.clone()),
        Cell::from(device_name(r.device)),
        Cell::from(bytes(r.live_bytes)),
        Cell::from(allocs(r)),
        Cell::from(allocated(r)),
        Cell::from(host_bytes(r.host_resident_bytes)),
        Cell::from(host_bytes(r.host_swap_bytes)),
        Cell::from(growth(r.growth_bytes_per_s)),
        Cell::from(sparkline(spark_tail(&r.trend))),
        Cell::from(r.verdict.clone()).style(panes::verdict_style(r.leaking, &r.verdict)),
        Cell::from(r.last_failure.clone().unwrap_or_else(|| "-".into())),
    ]);
    if r.leaking {
        row.red()
    } else {
        row
    }
}
