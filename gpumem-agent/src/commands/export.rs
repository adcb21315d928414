//! `gpumem export --format F [RECORDING] -o FILE`: what the analyses found,
//! in a format another tool reads, from a recording replayed through the
//! usual pipeline or from a running daemon. The file appears whole or not
//! at all (written under a temporary name, then renamed).
use std::{convert::Infallible, io::Write as _, path::Path, process::ExitCode};

use anyhow::{bail, Context as _, Result};

use gpumem_engine::{
    analysis::history,
    pipeline,
    query::{
        export::{render, ExportQuery, Format, Span},
        Query,
    },
};

use crate::{
    cli::export::ExportArgs,
    runtime::{self, Ctx, End, Output},
};

/// What the command line asks of an export, besides the file.
fn query(a: &ExportArgs) -> ExportQuery {
    ExportQuery { format: a.format, pid: a.pid, layers: a.layers, older_than_s: a.older_than, space: a.space }
}

/// Writes `bytes` to `path` whole: a temporary file beside it, renamed.
pub fn write_whole(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path.file_name().with_context(|| format!("{} names no file", path.display()))?;
    let tmp = path.with_file_name(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
    let written = std::fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    let done = written.and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = done {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", path.display()));
    }
    Ok(())
}

struct Export<'a> {
    args: &'a ExportArgs,
}

impl Output for Export<'_> {
    type Input = Infallible;

    fn finish(&mut self, ctx: &mut Ctx<'_>, end: &End) -> Result<ExitCode> {
        let file = self.args.file.as_deref().unwrap_or(Path::new("-"));
        // A damaged recording would give a profile that looks whole and is not.
        if let Some(e) = &end.damage {
            bail!("{}: {e}; nothing written (`gpumem report` shows what the {} events before it say)", file.display(), end.events);
        }
        if !end.complete {
            eprintln!(
                "gpumem: {}: the recording has no footer (its session did not finish); exporting its {} events",
                file.display(),
                end.events
            );
        }
        let wall_end_ns = std::fs::metadata(file)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as i64);
        let recorded_by = end.header.as_ref().map_or_else(String::new, |h| match &h.command {
            Some(c) => format!("recorded by gpumem {} ({}): {c}", h.gpumem_version, h.recorded_by),
            None => format!("recorded by gpumem {} ({})", h.gpumem_version, h.recorded_by),
        });
        let mut names: Vec<&str> = ctx.pipeline.state.processes.values().map(|p| p.comm.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        let title = gpumem_engine::record::session_title(end.header.as_ref(), &names, end.footer.duration_s);
        let span = Span { ended_ns: end.footer.ended_ns, duration_s: end.footer.duration_s, wall_end_ns, recorded_by, title };
        let r = render(ctx.pipeline, &query(self.args), &span)?;
        write_whole(&self.args.output, &r.bytes)?;
        eprintln!(
            "gpumem: wrote {} ({}, {}, {} KiB)",
            self.args.output.display(),
            self.args.format.name(),
            r.what,
            r.bytes.len().div_ceil(1024)
        );
        Ok(ExitCode::SUCCESS)
    }
}

pub fn run(args: ExportArgs) -> Result<ExitCode> {
    let Some(file) = &args.file else { return from_daemon(&args) };
    let mut reader = super::open_recording(file)?;
    let options = pipeline::Options { timeline: args.format == Format::Perfetto, history: Some(history::TRACE_CAP), ..Default::default() };
    runtime::replay(&mut reader, options, &mut Export { args: &args })
}

/// The export of a running daemon: what it knows now.
fn from_daemon(args: &ExportArgs) -> Result<ExitCode> {
    let Some(bytes) = args.daemon.daemon().ask(&Query::Export(query(args)))? else {
        bail!(
            "no RECORDING given and no gpumem serve answers at {}: export a recording (gpumem record -o FILE ...), or start gpumem serve",
            args.daemon.socket.display()
        )
    };
    write_whole(&args.output, &bytes)?;
    eprintln!(
        "gpumem: wrote {} ({}, from the daemon at {}, {} KiB)",
        args.output.display(),
        args.format.name(),
        args.daemon.socket.display(),
        bytes.len().div_ceil(1024)
    );
    Ok(ExitCode::SUCCESS)
}
