//! `gpumem top`: who holds GPU memory right now, live (ratatui), as one text
//! snapshot (`--once`), or from a recording (`--from`).
//!
//! One task owns the state: events are drained as they come, the screen is
//! redrawn every --interval (never per event, so a high event rate costs
//! draining only), and keys arrive from a thread of their own.
use std::{
    io::Write as _,
    path::Path,
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{anyhow, Context as _, Result};
use ratatui::{
    crossterm::event::{self, Event as TermEvent, KeyCode, KeyEventKind, KeyModifiers},
    layout::{Constraint, Layout},
    style::{Modifier, Style, Stylize as _},
    text::{Line, Text},
    widgets::{Block, Borders, Cell, Clear, Paragraph, Row as TableRow, Table, TableState, Wrap},
    Frame,
};
use tokio::{
    signal::unix::{signal, SignalKind},
    sync::mpsc,
};

use super::{
    load_agent,
    attach_discovered, attach_given,
    ingest::{self, Ingest, Ingested, Replayer},
    require_privileges,
};
use crate::{
    analysis::{
        health::Thresholds,
        leaks::{self, monotonic_ns, GrowthTracker},
    },
    cli::TopArgs,
    events::EventReader,
    export::{
        names::bytes,
        top::{self, device_name, growth, gpu_line, sparkline, SortKey, Snapshot},
    },
    nvml::monitor::Monitor,
    probes::ProbeSet,
    record,
    state::{Limits, State},
};

const DISCOVERY_INTERVAL: Duration = Duration::from_millis(500);
/// Samples per growth series: 10 minutes at the 1 s sampling interval.
const GROWTH_SAMPLES: usize = 600;
const GROWTH_INTERVAL: Duration = Duration::from_secs(1);
const NVML_INTERVAL: Duration = Duration::from_secs(5);

pub fn run(args: TopArgs) -> Result<ExitCode> {
    if let Some(path) = &args.from {
        return from_recording(&args, path);
    }
    require_privileges()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    rt.block_on(live(args))
}

/// What the screen shows besides the snapshot.
#[derive(Default)]
struct View {
    sort: SortKey,
    filter: String,
    /// Typing a filter (after '/').
    editing: bool,
    /// Index into the GPUs of the snapshot; None: all.
    gpu: Option<usize>,
    paused: bool,
    table: TableState,
    /// The selected process's top stacks, while shown.
    stacks: Option<(String, Vec<String>)>,
}

impl View {
    fn device(&self, snap: &Snapshot) -> Option<i32> {
        self.gpu.and_then(|i| snap.gpus.get(i)).map(|g| g.index)
    }
}

enum Key {
    Quit,
    Other(event::KeyEvent),
}

/// Keys, read on a thread of their own (crossterm's read blocks).
fn spawn_key_reader() -> mpsc::UnboundedReceiver<Key> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::Builder::new()
        .name("gpumem-keys".into())
        .spawn(move || loop {
            match event::read() {
                Ok(TermEvent::Key(k)) if k.kind == KeyEventKind::Press => {
                    let quit = k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if tx.send(if quit { Key::Quit } else { Key::Other(k) }).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(_) => return,
            }
        })
        .expect("starting the key reader");
    rx
}

async fn live(args: TopArgs) -> Result<ExitCode> {
    let quiet_say = |_m: String| {};
    let say = |m: String| eprintln!("gpumem: {m}");
    let mut agent = load_agent(&args.probes, false, ProbeSet::Full, gpumem_common::RINGBUF_BYTES)?;
    let mut reader = EventReader::new(agent.take_events()?).context("watching the ring buffer")?;
    attach_given(&mut agent, &args.probes, say)?;
    attach_discovered(&mut agent, &args.probes, true, if args.once { say } else { quiet_say });
    let mut ingest = Ingest::live(State::new(Limits { max_entries: args.max_allocations, ..Limits::default() }), false);
    let mut growth = GrowthTracker::with_capacity(GROWTH_SAMPLES);
    let thresholds = Thresholds::default();
    let mut gpus = Monitor::open(args.probes.nvml.as_ref().map(|p| p.as_os_str().to_os_string()));
    gpus.sample(&thresholds);
    let began = Instant::now();
    let mut discovery = tokio::time::interval_at(tokio::time::Instant::now() + DISCOVERY_INTERVAL, DISCOVERY_INTERVAL);
    let mut growth_tick = tokio::time::interval(GROWTH_INTERVAL);
    let mut nvml_tick = tokio::time::interval_at(tokio::time::Instant::now() + NVML_INTERVAL, NVML_INTERVAL);
    let mut redraw = tokio::time::interval(Duration::from_secs_f64(args.interval));
    let mut sigint = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(args.duration);
    let on_event = |ingest: &mut Ingest, ev: &gpumem_common::Event, stack: Option<&gpumem_common::StackEvent>| {
        ingest.event(ev, stack);
    };

    if args.once {
        say(format!("tracing for {} s, then one snapshot", args.duration));
        loop {
            tokio::select! {
                r = reader.readable() => {
                    r.context("reading events")?;
                    reader.drain_now(&mut |ev, stack| on_event(&mut ingest, ev, stack));
                }
                _ = growth_tick.tick() => growth.sample(&ingest.state, began.elapsed().as_secs_f64()),
                _ = discovery.tick() => attach_discovered(&mut agent, &args.probes, false, say),
                _ = tokio::time::sleep_until(deadline) => break,
                _ = sigint.recv() => break,
                _ = sigterm.recv() => break,
            }
        }
        reader.drain_now(&mut |ev, stack| on_event(&mut ingest, ev, stack));
        gpus.sample(&thresholds);
        let lost = agent.lost_events(reader.malformed)?.total();
        let snap = top::build(&ingest.state, &mut growth, &gpus.latest, &gpus.health, lost);
        let mut out = std::io::stdout().lock();
        snap.write_text(&mut out)?;
        out.flush()?;
        drop(reader);
        agent.detach_in_background();
        return Ok(ExitCode::SUCCESS);
    }

    let mut keys = spawn_key_reader();
    // ratatui::init restores the terminal on panic too.
    let mut terminal = ratatui::try_init().context("setting up the terminal (gpumem top needs one; use --once in scripts)")?;
    let mut view = View::default();
    let mut snap = Snapshot::default();
    let result: Result<()> = async {
        loop {
            tokio::select! {
                r = reader.readable() => {
                    r.context("reading events")?;
                    reader.drain_now(&mut |ev, stack| on_event(&mut ingest, ev, stack));
                    continue;
                }
                _ = growth_tick.tick() => growth.sample(&ingest.state, began.elapsed().as_secs_f64()),
                _ = nvml_tick.tick() => { gpus.sample(&thresholds); }
                _ = discovery.tick() => {
                    attach_discovered(&mut agent, &args.probes, false, quiet_say);
                    // Exited processes leave the table after a minute.
                    ingest.state.forget_exited_before(monotonic_ns().saturating_sub(60_000_000_000));
                    continue;
                }
                _ = redraw.tick() => {}
                k = keys.recv() => match k {
                    None | Some(Key::Quit) => return Ok(()),
                    Some(Key::Other(k)) => {
                        if handle_key(&mut view, &snap, k, &mut ingest) {
                            return Ok(());
                        }
                    }
                },
                _ = sigint.recv() => return Ok(()),
                _ = sigterm.recv() => return Ok(()),
            }
            if !view.paused {
                let lost = agent.lost_events(reader.malformed)?.total();
                snap = top::build(&ingest.state, &mut growth, &gpus.latest, &gpus.health, lost);
                snap.sort(view.sort);
            }
            terminal.draw(|f| draw(f, &snap, &mut view, agent.attached_probe_count()))?;
        }
    }
    .await;
    ratatui::restore();
    drop(reader);
    agent.detach_in_background();
    result.map(|()| ExitCode::SUCCESS)
}

/// True: quit.
fn handle_key(view: &mut View, snap: &Snapshot, k: event::KeyEvent, ingest: &mut Ingest) -> bool {
    if view.editing {
        match k.code {
            KeyCode::Enter | KeyCode::Esc => view.editing = false,
            KeyCode::Backspace => {
                view.filter.pop();
            }
            KeyCode::Char(c) if !c.is_control() => view.filter.push(c),
            _ => {}
        }
        view.table.select(Some(0));
        return false;
    }
    if view.stacks.is_some() {
        view.stacks = None;
        return matches!(k.code, KeyCode::Char('q'));
    }
    let rows = snap.visible(&view.filter, view.device(snap)).len();
    match k.code {
        KeyCode::Char('q') => return true,
        KeyCode::Char('s') => view.sort = view.sort.next(),
        KeyCode::Char('/') => {
            view.editing = true;
            view.filter.clear();
        }
        KeyCode::Char('g') => {
            view.gpu = match view.gpu {
                None if !snap.gpus.is_empty() => Some(0),
                Some(i) if i + 1 < snap.gpus.len() => Some(i + 1),
                _ => None,
            };
            view.table.select(Some(0));
        }
        KeyCode::Char('p') | KeyCode::Char(' ') => view.paused = !view.paused,
        KeyCode::Down | KeyCode::Char('j') => view.table.select(Some((view.table.selected().unwrap_or(0) + 1).min(rows.saturating_sub(1)))),
        KeyCode::Up | KeyCode::Char('k') => view.table.select(Some(view.table.selected().unwrap_or(0).saturating_sub(1))),
        KeyCode::Enter | KeyCode::Char('t') => {
            let visible = snap.visible(&view.filter, view.device(snap));
            if let Some(r) = visible.get(view.table.selected().unwrap_or(0)) {
                let title = format!("{} (pid {}) on GPU {}: largest live allocation stacks", r.comm, r.pid, device_name(r.device));
                let lines = match ingest.state.processes.get(&r.pid) {
                    Some(p) => {
                        let groups = leaks::top_stacks(p, r.device, &mut ingest.stacks, 5, monotonic_ns());
                        stack_lines(&groups)
                    }
                    None => vec!["the process is gone".into()],
                };
                view.stacks = Some((title, lines));
            }
        }
        _ => {}
    }
    false
}

fn stack_lines(groups: &[leaks::LeakGroup]) -> Vec<String> {
    if groups.is_empty() {
        return vec!["no live allocations with a stack".into()];
    }
    let mut lines = Vec::new();
    for g in groups {
        lines.push(format!("{} in {} allocation(s), oldest {:.0} s", bytes(g.bytes), g.count, g.oldest_age_s));
        if g.frames.is_empty() {
            lines.push("    (no stack)".into());
        }
        for f in g.frames.iter().take(12) {
            lines.push(format!("    {}", crate::export::names::printable(&f.display())));
        }
    }
    lines
}

fn draw(f: &mut Frame, snap: &Snapshot, view: &mut View, probes: usize) {
    let gpu_lines = snap.gpus.len().max(1) as u16;
    let [head, body, foot] = Layout::vertical([Constraint::Length(gpu_lines + 2), Constraint::Min(3), Constraint::Length(1)]).areas(f.area());
    let device = view.device(snap);
    let title = format!(
        " gpumem top · sort: {} · GPU: {} · filter: {}{} · {} events, {} lost, {} probes ",
        view.sort.name(),
        device.map_or("all".to_string(), device_name),
        if view.filter.is_empty() && !view.editing { "-".to_string() } else { format!("{}{}", view.filter, if view.editing { "▏" } else { "" }) },
        if view.paused { " · PAUSED" } else { "" },
        snap.events,
        snap.lost,
        probes
    );
    let gpus: Vec<Line> = if snap.gpus.is_empty() {
        vec![Line::from("no GPU seen yet (no NVML, no traced allocation)")]
    } else {
        snap.gpus.iter().map(|g| {
            let line = Line::from(gpu_line(g));
            if device == Some(g.index) { line.bold() } else { line }
        }).collect()
    };
    f.render_widget(Paragraph::new(gpus).block(Block::default().borders(Borders::ALL).title(title.bold())), head);

    let visible = snap.visible(&view.filter, device);
    let header = TableRow::new(["PID", "POD/CONTAINER", "COMM", "GPU", "LIVE", "ALLOCS", "GROWTH", "TREND", "VERDICT", "LAST FAILURE"])
        .style(Style::default().add_modifier(Modifier::BOLD | Modifier::REVERSED));
    let rows = visible.iter().map(|r| {
        let row = TableRow::new(vec![
            Cell::from(r.pid.to_string()),
            Cell::from(r.workload.clone()),
            Cell::from(r.comm.clone()),
            Cell::from(device_name(r.device)),
            Cell::from(bytes(r.live_bytes)),
            Cell::from(r.allocs.to_string()),
            Cell::from(growth(r.growth_bytes_per_s)),
            Cell::from(sparkline(&r.trend)),
            Cell::from(r.verdict.clone()),
            Cell::from(r.last_failure.clone().unwrap_or_else(|| "-".into())),
        ]);
        if r.leaking { row.red() } else { row }
    });
    let widths = [
        Constraint::Length(8),
        Constraint::Length(24),
        Constraint::Length(16),
        Constraint::Length(4),
        Constraint::Length(11),
        Constraint::Length(7),
        Constraint::Length(12),
        Constraint::Length(21),
        Constraint::Length(16),
        Constraint::Min(10),
    ];
    if view.table.selected().is_none() {
        view.table.select(Some(0));
    }
    let table = Table::new(rows, widths).header(header).row_highlight_style(Style::default().add_modifier(Modifier::REVERSED));
    f.render_stateful_widget(table, body, &mut view.table);
    let help = if view.editing {
        "type to filter by name, pod or pid · Enter done · Esc done"
    } else {
        "q quit · s sort · / filter · g GPU · p pause · ↑↓ select · Enter stacks"
    };
    f.render_widget(Paragraph::new(help).reversed(), foot);

    if let Some((title, lines)) = &view.stacks {
        let area = body.inner(ratatui::layout::Margin { horizontal: 4, vertical: 1 });
        f.render_widget(Clear, area);
        let text = Text::from(lines.iter().map(|l| Line::from(l.clone())).collect::<Vec<_>>());
        let popup = Paragraph::new(text)
            .wrap(Wrap { trim: false })
            .block(Block::default().borders(Borders::ALL).title(format!(" {title} (any key closes) ")));
        f.render_widget(popup, area);
    }
}

/// `--from FILE`: the recorded session's end state, as a snapshot (`--once`) or on screen.
fn from_recording(args: &TopArgs, path: &Path) -> Result<ExitCode> {
    struct Replay {
        ingest: Ingest,
        growth: GrowthTracker,
    }
    impl Replayer for Replay {
        fn parts(&mut self) -> (&mut Ingest, &mut GrowthTracker) {
            (&mut self.ingest, &mut self.growth)
        }
        fn after(&mut self, _: &gpumem_common::Event, _: Ingested) -> bool {
            true
        }
    }
    let mut reader = record::Reader::open(path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let mut r = Replay { ingest: Ingest::replay(State::new(Limits::default())), growth: GrowthTracker::default() };
    let end = ingest::replay(&mut reader, &mut r);
    let mut snap = top::build(&r.ingest.state, &mut r.growth, &[], &Default::default(), end.footer.lost.total());
    snap.sort(SortKey::Bytes);
    if let Some(e) = &end.damage {
        eprintln!("gpumem: {}: {e}; showing the state after the {} events before it", path.display(), end.events);
    }
    if args.once {
        let mut out = std::io::stdout().lock();
        snap.write_text(&mut out)?;
        out.flush()?;
    } else {
        let mut keys = spawn_key_reader();
        let mut terminal = ratatui::try_init().context("setting up the terminal (use --once in scripts)")?;
        let mut view = View::default();
        let result: Result<()> = (|| loop {
            terminal.draw(|f| draw(f, &snap, &mut view, end.footer.probes_attached))?;
            match keys.blocking_recv() {
                None | Some(Key::Quit) => return Ok(()),
                Some(Key::Other(k)) => {
                    if handle_key(&mut view, &snap, k, &mut r.ingest) {
                        return Ok(());
                    }
                    snap.sort(view.sort);
                }
            }
        })();
        ratatui::restore();
        result?;
    }
    Ok(if end.damage.is_some() || !end.complete { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
