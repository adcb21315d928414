//! gpumem: who holds GPU memory on this host, and why.
use std::process::ExitCode;

use clap::Parser as _;
use gpumem_agent::{
    cli::{Cli, Command},
    commands,
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Trace(args) => commands::trace::run(args),
        Command::Leaks(args) => commands::leaks::run(args),
        Command::Report(args) => commands::report::run(args),
        Command::Export(args) => commands::export::run(args),
        Command::Top(args) => commands::top::run(args),
        Command::Record(args) => commands::record::run(args),
        Command::Replay(args) => commands::replay::run(args),
        Command::Health(args) => commands::health::run(args),
        Command::Preflight(args) => commands::preflight::run(args),
        Command::Serve(args) => gpumem_agent::serve::run(*args),
        Command::Status(args) => commands::status::run(args).map(|()| ExitCode::SUCCESS),
        Command::Kube(args) => commands::kube::run(args),
        Command::Bench(args) => commands::bench::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpumem: {e:#}");
            ExitCode::FAILURE
        }
    }
}
