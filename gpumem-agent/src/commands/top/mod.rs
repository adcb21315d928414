//! `gpumem top`: who holds GPU memory right now, live (ratatui), as one text
//! snapshot (`--once`), or from a recording (`--from`).
//!
//! Events are applied as they come; the screen is redrawn every --interval
//! (never per event, so a high event rate costs applying only), and keys
//! arrive from a thread of their own.
use std::{io::Write as _, process::ExitCode, time::Duration};

use anyhow::{Context as _, Result};
use ratatui::{
    crossterm::event::{self, Event as TermEvent, KeyCode, KeyEvent, KeyEventKind, KeyModifiers},
    DefaultTerminal,
};
use tokio::sync::mpsc;

use super::trace::replay_outcome;
use crate::{
    cli::TopArgs,
    runtime::{self, Ctx, End, Flow, Output, Session},
};
use gpumem_engine::{
    clock::monotonic_ns,
    export::top::{
        tui::{self, Action, Screen},
        Snapshot,
    },
    query::{self, Query},
};

mod daemon;

const NVML_INTERVAL: Duration = Duration::from_secs(5);

pub enum Input {
    Key(KeyEvent),
    Quit,
    Redraw,
}

/// Keys, read on a thread of their own (crossterm's read blocks).
fn spawn_key_reader(tx: mpsc::Sender<Input>) -> Result<()> {
    std::thread::Builder::new()
        .name("gpumem-keys".into())
        .spawn(move || loop {
            let input = match event::read() {
                Ok(TermEvent::Key(k)) if k.kind == KeyEventKind::Press => {
                    let quit = k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if quit {
                        Input::Quit
                    } else {
                        Input::Key(k)
                    }
                }
                Ok(_) => continue,
                Err(_) => return,
            };
            if tx.blocking_send(input).is_err() {
                return;
            }
        })
        .context("starting the key reader")?;
    Ok(())
}

/// The terminal in the UI's mode; restored when dropped, on every path
/// (an error that ends the session included; ratatui restores on panic).
struct Screenful(DefaultTerminal);

impl Screenful {
    fn init() -> Result<Self> {
        Ok(Screenful(ratatui::try_init().context("setting up the terminal (gpumem top needs one; use --once in scripts)")?))
    }
}

impl Drop for Screenful {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

pub struct Top {
    once: bool,
    interval: Duration,
    duration: f64,
    /// Replaying this recording (None: live).
    from: Option<std::path::PathBuf>,
    screen: Screen,
    snap: Snapshot,
    terminal: Option<Screenful>,
    tx: mpsc::Sender<Input>,
    rx: Option<mpsc::Receiver<Input>>,
    /// In a replay, the recording's end: stacks' ages are taken at it.
    replay_now_ns: Option<u64>,
}

impl Top {
    fn new(args: &TopArgs) -> Self {
        let (tx, rx) = mpsc::channel(64);
        Top {
            once: args.once,
            interval: Duration::from_secs_f64(args.interval),
            duration: args.duration,
            from: args.from.clone(),
            screen: Screen::default(),
            snap: Snapshot::default(),
            terminal: None,
            tx,
            rx: Some(rx),
            replay_now_ns: None,
        }
    }

    fn snapshot(&mut self, ctx: &mut Ctx<'_>) {
        ctx.pipeline.note_kept();
        ctx.pipeline.refresh_host();
        // The same snapshot a daemon answers (query::top), in this session's sort.
        self.snap = query::top::snapshot(ctx.pipeline, monotonic_ns(), ctx.agent.kernel.lost.total());
        self.snap.sort(self.screen.sort);
        self.refresh_pane(ctx);
    }

    /// The selected row's stacks, for the bars pane.
    fn refresh_pane(&mut self, ctx: &mut Ctx<'_>) {
        let now = self.replay_now_ns.unwrap_or_else(monotonic_ns);
        self.screen.pane =
            self.screen.selected_row(&self.snap).map(|r| (r.pid, r.device, query::top::stacks(ctx.pipeline, r.pid, r.device, now)));
    }

    fn draw(&mut self, probes: usize) -> Result<()> {
        if let Some(t) = self.terminal.as_mut() {
            t.0.draw(|f| tui::draw(f, &self.snap, &mut self.screen, probes))?;
        }
        Ok(())
    }

    fn key(&mut self, ctx: &mut Ctx<'_>, k: KeyEvent) -> Flow {
        match self.screen.key(&self.snap, k) {
            Action::Quit => return Flow::Stop,
            Action::Stacks { pid, device, title, breakdown } => {
                let p = &mut *ctx.pipeline;
                let now = self.replay_now_ns.unwrap_or_else(monotonic_ns);
                let groups = query::top::stacks(p, pid, device, now);
                self.screen.stacks = Some((title, tui::stack_lines(&breakdown, groups.as_deref())));
            }
            Action::None => {}
        }
        self.snap.sort(self.screen.sort);
        self.refresh_pane(ctx);
        Flow::Continue
    }

    fn print_once(&self) -> Result<()> {
        let mut out = std::io::stdout().lock();
        self.snap.write_text(&mut out)?;
        Ok(out.flush()?)
    }

    /// After a replay: the end of the recording on screen, until q.
    fn show_until_quit(&mut self, ctx: &mut Ctx<'_>, probes: usize) -> Result<()> {
        let mut rx = self.rx.take().expect("inputs not taken in a replay");
        spawn_key_reader(self.tx.clone())?;
        self.terminal = Some(Screenful::init()?);
        loop {
            self.draw(probes)?;
            match rx.blocking_recv() {
                None | Some(Input::Quit) => break,
                Some(Input::Redraw) => {}
                Some(Input::Key(k)) => {
                    if self.key(ctx, k) == Flow::Stop {
                        break;
                    }
                }
            }
        }
        self.terminal = None;
        Ok(())
    }
}

impl Output for Top {
    type Input = Input;

    fn inputs(&mut self) -> Option<mpsc::Receiver<Input>> {
        if self.once || self.from.is_some() {
            return None;
        }
        self.rx.take()
    }

    fn started(&mut self, ctx: &mut Ctx<'_>) -> Result<()> {
        if self.from.is_some() {
            return Ok(());
        }
        if self.once {
            eprintln!("gpumem: tracing for {} s, then one snapshot", self.duration);
            return Ok(());
        }
        spawn_key_reader(self.tx.clone())?;
        let (tx, every) = (self.tx.clone(), self.interval);
        tokio::spawn(async move {
            let mut redraw = tokio::time::interval(every);
            while tx.send(Input::Redraw).await.is_ok() {
                redraw.tick().await;
            }
        });
        self.terminal = Some(Screenful::init()?);
        self.snapshot(ctx);
        Ok(())
    }

    fn input(&mut self, ctx: &mut Ctx<'_>, input: Input) -> Result<Flow> {
        let flow = match input {
            Input::Quit => Flow::Stop,
            Input::Key(k) => self.key(ctx, k),
            Input::Redraw => Flow::Continue,
        };
        if flow == Flow::Stop {
            return Ok(flow);
        }
        if !self.screen.paused {
            let selected = self.screen.stacks.take();
            self.snapshot(ctx);
            self.screen.stacks = selected;
        }
        self.draw(ctx.agent.probes_attached)?;
        Ok(Flow::Continue)
    }

    fn finish(&mut self, ctx: &mut Ctx<'_>, end: &End) -> Result<ExitCode> {
        if self.terminal.take().is_some() {
            return Ok(ExitCode::SUCCESS);
        }
        self.snapshot(ctx);
        let code = replay_outcome(self.from.as_deref(), end, "showing the state after");
        if self.once {
            self.print_once()?;
        } else {
            self.replay_now_ns = Some(end.footer.ended_ns);
            self.show_until_quit(ctx, end.footer.probes_attached)?;
        }
        Ok(code)
    }
}

pub fn run(args: TopArgs) -> Result<ExitCode> {
    if args.from.is_none() {
        // A running daemon has seen every allocation since it started.
        if args.once {
            if let Some(text) = args.daemon.daemon().ask_text(&Query::Top)? {
                let mut out = std::io::stdout().lock();
                out.write_all(text.as_bytes())?;
                out.flush()?;
                return Ok(ExitCode::SUCCESS);
            }
        } else if let Some(first) = args.daemon.daemon().ask_typed(&Query::Snapshot)? {
            return daemon::run(&args, first);
        }
    }
    let mut top = Top::new(&args);
    if let Some(path) = &args.from {
        return runtime::replay(&mut super::open_recording(path)?, super::replay_options(args.max_allocations), &mut top);
    }
    let mut s = Session::new(args.probes.probing());
    s.pipeline.limits.max_entries = args.max_allocations;
    s.growth_every = Some(runtime::GROWTH_SAMPLE_INTERVAL);
    s.nvml_every = NVML_INTERVAL;
    s.forget_after = Some(Duration::from_secs_f64(args.exited_grace));
    s.announce = args.once;
    if args.once {
        s.duration = Some(Duration::from_secs_f64(args.duration));
        // NVML as it is when the snapshot is taken.
        s.reconcile_at_end = true;
    }
    runtime::run(s, &mut top)
}
