//! The append-only NDJSON file sink, rotated by size.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Bytes buffered before a write reaches the file.
const BUFFER_BYTES: usize = 64 * 1024;

/// Writes lines to `path`, appending; moves it to `path.1` (and `path.1` to `path.2`,
/// …, dropping `path.{max_files}`) before a line would take it past `max_bytes`.
#[derive(Debug)]
pub(super) struct FileSink {
    path: PathBuf,
    max_bytes: u64,
    max_files: u32,
    /// `None` after a failure, until the next write reopens the file.
    file: Option<File>,
    /// Lines not yet written to `file`.
    buffer: Vec<u8>,
    /// Entries in `buffer`.
    buffered_entries: u64,
    /// Bytes of the active file, counting the buffer.
    size: u64,
}

impl FileSink {
    /// Opens (or creates) `path` for appending.
    pub(super) fn open(path: PathBuf, max_bytes: u64, max_files: u32) -> io::Result<FileSink> {
        let mut sink = FileSink {
            path,
            max_bytes,
            max_files,
            file: None,
            buffer: Vec::with_capacity(BUFFER_BYTES),
            buffered_entries: 0,
            size: 0,
        };
        sink.reopen()?;
        Ok(sink)
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes of the active file, counting what is buffered.
    pub(super) fn size(&self) -> u64 {
        self.size
    }

    /// Appends one line (which ends with `\n`), rotating first if it would not fit.
    ///
    /// On error, returns how many entries were lost with it (this one and any that
    /// were buffered), and the sink reopens the file on the next write.
    pub(super) fn write_line(&mut self, line: &[u8]) -> Result<(), (io::Error, u64)> {
        if self.file.is_none() {
            self.reopen().map_err(|e| (e, 1))?;
        }
        let len = line.len() as u64;
        if self.size > 0 && self.size + len > self.max_bytes {
            self.rotate().map_err(|(e, lost)| (e, lost + 1))?;
        }
        self.buffer.extend_from_slice(line);
        self.buffered_entries += 1;
        self.size += len;
        if self.buffer.len() >= BUFFER_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the buffer to the file. On error, returns how many buffered entries were
    /// lost.
    pub(super) fn flush(&mut self) -> Result<(), (io::Error, u64)> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let result = match self.file.as_mut() {
            Some(file) => file.write_all(&self.buffer),
            None => Err(io::Error::other("the audit file is not open")),
        };
        let entries = self.buffered_entries;
        self.buffer.clear();
        self.buffered_entries = 0;
        result.map_err(|e| {
            self.file = None;
            (e, entries)
        })
    }

    fn rotate(&mut self) -> Result<(), (io::Error, u64)> {
        self.flush()?;
        self.file = None;
        let rotated = |n: u32| {
            let mut name = self.path.clone().into_os_string();
            name.push(format!(".{n}"));
            PathBuf::from(name)
        };
        let step = || -> io::Result<()> {
            ignore_missing(fs::remove_file(rotated(self.max_files)))?;
            for n in (1..self.max_files).rev() {
                ignore_missing(fs::rename(rotated(n), rotated(n + 1)))?;
            }
            fs::rename(&self.path, rotated(1))
        };
        step().map_err(|e| (e, 0))?;
        self.reopen().map_err(|e| (e, 0))
    }

    /// Opens the active file for appending. If a failed write left a partial line at
    /// its end, the next line starts on a fresh line so every complete line stays
    /// valid JSON.
    fn reopen(&mut self) -> io::Result<()> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .mode(0o600)
            .open(&self.path)?;
        let len = file.metadata()?.len();
        if len > 0 {
            let mut last = [0u8; 1];
            file.read_exact_at(&mut last, len - 1)?;
            if last[0] != b'\n' {
                (&file).write_all(b"\n")?;
            }
        }
        self.size = file.metadata()?.len() + self.buffer.len() as u64;
        self.file = Some(file);
        Ok(())
    }
}

impl Drop for FileSink {
    fn drop(&mut self) {
        // Best effort: whoever needed to know about a failure asked `flush` first.
        let _ = self.flush();
    }
}

fn ignore_missing(r: io::Result<()>) -> io::Result<()> {
    match r {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}
