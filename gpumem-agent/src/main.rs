//! gpumem: who holds GPU memory on this host, and why.
mod analysis;
mod cli;
mod commands;
#[cfg(test)]
mod fuzz;
mod events;
mod export;
mod nvml;
mod privileges;
mod probes;
mod record;
mod selfstat;
mod stacks;
mod state;

use std::process::ExitCode;

use clap::Parser as _;
use cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Trace(args) => commands::trace::run(commands::trace::Session::from_args(args)),
        Command::Leaks(args) => commands::trace::run(commands::trace::Session::for_leaks(args)),
        Command::Report(args) => commands::report::run(args),
        Command::Top(args) => commands::top::run(args),
        Command::Record(args) => commands::trace::run(commands::trace::Session::for_record(args)),
        Command::Replay(args) => commands::trace::run(commands::trace::Session::for_replay(args)),
        Command::Health(args) => commands::health::run(args),
        Command::Serve(args) => commands::serve::run(args),
        Command::BenchEngine(args) => commands::bench::engine(args).map(|()| ExitCode::SUCCESS),
        Command::BenchStacks(args) => commands::bench::stacks(args).map(|()| ExitCode::SUCCESS),
        Command::BenchRender(args) => commands::bench::render(args).map(|()| ExitCode::SUCCESS),
        Command::Status(args) => commands::status::run(args).map(|()| ExitCode::SUCCESS),
        Command::Bench(args) => commands::trace::run(commands::trace::Session::for_bench(args)),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpumem: {e:#}");
            ExitCode::FAILURE
        }
    }
}
