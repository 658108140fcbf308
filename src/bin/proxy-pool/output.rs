//! Standard output of every command. Rust's `println!` panics when the
//! reader has gone (`proxy-pool stats | head`); these writes report it
//! instead, as [`OutputClosed`], which `main` turns into a quiet exit 0.

use std::fmt;
use std::io::{self, BufWriter, StdoutLock, Write};

/// The reader of standard output went away: not a failure of the command,
/// which stops and exits 0 without a message.
#[derive(Debug, thiserror::Error)]
#[error("standard output was closed")]
pub struct OutputClosed;

/// What a failed write to standard output means for the command: the
/// reader left ([`OutputClosed`]), or a real error.
pub fn write_error(e: io::Error) -> Box<dyn std::error::Error> {
    if e.kind() == io::ErrorKind::BrokenPipe {
        Box::new(OutputClosed)
    } else {
        Box::new(e)
    }
}

/// Writes one line to standard output.
pub fn line(args: fmt::Arguments<'_>) -> Result<(), Box<dyn std::error::Error>> {
    let mut out = io::stdout().lock();
    writeln!(out, "{args}")
        .and_then(|()| out.flush())
        .map_err(write_error)
}

/// Standard output, buffered, for many lines (a table); [`Buffered::finish`]
/// flushes it.
pub struct Buffered(BufWriter<StdoutLock<'static>>);

impl Buffered {
    /// Locks standard output for this command's lines.
    pub fn new() -> Self {
        Self(BufWriter::new(io::stdout().lock()))
    }

    /// Writes one line.
    pub fn line(&mut self, args: fmt::Arguments<'_>) -> Result<(), Box<dyn std::error::Error>> {
        writeln!(self.0, "{args}").map_err(write_error)
    }

    /// Flushes what is buffered.
    pub fn finish(mut self) -> Result<(), Box<dyn std::error::Error>> {
        self.0.flush().map_err(write_error)
    }
}

/// Prints `rows` under `header` in aligned columns: the first `left`
/// left-aligned, the rest (numbers) right-aligned.
pub fn table<H: AsRef<str>>(
    header: &[H],
    rows: &[Vec<String>],
    left: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let header: Vec<&str> = header.iter().map(AsRef::as_ref).collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = Buffered::new();
    let rows = rows.iter().map(|r| r.iter().map(String::as_str).collect());
    for row in std::iter::once(header).chain(rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i < left {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect();
        out.line(format_args!("{}", cells.join("  ").trim_end()))?;
    }
    out.finish()
}

/// `println!` that returns [`OutputClosed`] (with `?`) instead of panicking.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))?
    };
}

pub(crate) use say;
