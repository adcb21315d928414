//! The live `gpumem top` over a running daemon: the snapshot the daemon
//! builds (every allocation since it started, its pinned state adopted)
//! redrawn every --interval; a row's stacks asked of it on Enter. Keys and
//! the screen are the same as with probes of its own.
use std::process::ExitCode;

use anyhow::{Context as _, Result};
use gpumem_engine::{
    analysis::leaks::LeakGroup,
    export::top::tui::{self, Action, Screen},
    query::{top::SnapshotAnswer, Query},
};
use tokio::sync::mpsc;

use super::{spawn_key_reader, Input, Screenful};
use crate::cli::TopArgs;

fn fetch(args: &TopArgs) -> Result<Option<SnapshotAnswer>> {
    args.daemon.daemon().ask_typed(&Query::Snapshot)
}

pub fn run(args: &TopArgs, mut answer: SnapshotAnswer) -> Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    rt.block_on(async {
        let (tx, mut rx) = mpsc::channel(64);
        spawn_key_reader(tx)?;
        let mut terminal = Screenful::init()?;
        let mut screen = Screen::default();
        let mut redraw = tokio::time::interval(std::time::Duration::from_secs_f64(args.interval));
        loop {
            answer.snapshot.sort(screen.sort);
            let selected = screen.selected_row(&answer.snapshot).map(|r| (r.pid, r.device));
            if selected != screen.pane.as_ref().map(|p| (p.0, p.1)) || screen.pane.is_none() {
                screen.pane = selected.map(|(pid, device)| (pid, device, stacks(args, pid, device)));
            }
            terminal.0.draw(|f| tui::draw(f, &answer.snapshot, &mut screen, answer.probes_attached))?;
            tokio::select! {
                _ = redraw.tick() => {
                    if !screen.paused {
                        // The daemon gone: the last snapshot stays, and says so in its footer.
                        match fetch(args) {
                            Ok(Some(a)) => {
                                answer = a;
                                // Asked again with the new snapshot.
                                screen.pane = None;
                            }
                            Ok(None) | Err(_) => screen.stacks = Some(("gpumem serve".into(), vec!["the daemon no longer answers".into()])),
                        }
                    }
                }
                input = rx.recv() => match input {
                    None | Some(Input::Quit) => break,
                    Some(Input::Redraw) => {}
                    Some(Input::Key(k)) => match screen.key(&answer.snapshot, k) {
                        Action::Quit => break,
                        Action::Stacks { pid, device, title, breakdown } => {
                            let groups = stacks(args, pid, device);
                            screen.stacks = Some((title, tui::stack_lines(&breakdown, groups.as_deref())));
                        }
                        Action::None => {}
                    },
                },
            }
        }
        drop(terminal);
        Ok(ExitCode::SUCCESS)
    })
}

fn stacks(args: &TopArgs, pid: u32, device: i32) -> Option<Vec<LeakGroup>> {
    args.daemon.daemon().ask_typed::<Option<Vec<LeakGroup>>>(&Query::Stacks { pid, device }).ok()??
}
