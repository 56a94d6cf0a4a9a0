//! The sink of a local attempt's output: the workload writes its stdout and stderr into a pipe,
//! never into a file of the state dir, and this process (`managed-jobs output-sink`, started
//! by the job controller beside the attempt, in a session of its own) appends what it reads to
//! the attempt's log file.
//!
//! Why: the state dir is the operator's storage. When it is full (or failing), a workload
//! writing to a file there got ENOSPC on its own `echo` and failed, spending the user's restart
//! budget on the operator's fault (issue 43). Through the pipe, a write of the workload never
//! fails for that: what the sink cannot keep it drops and counts, and writes a note
//! ([`truncation_note`]) into the log as soon as it can write again; at the end it prints the
//! count on its stdout (`dropped N`), which the job controller that started it adds to the
//! job's message ([`dropped_sentence`]).
//!
//! The sink never exits before end of file (every writer of the pipe gone: the attempt's
//! processes, stopped at its end), so a workload never gets SIGPIPE; it holds no attempt mark
//! ([`super::contain::SCOPE_VAR`]) and is spared by the attempt's stop, and a job controller
//! that ends an attempt waits for it (at most [`DRAIN_WAIT`]) so the log is whole when the job's
//! end is written.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The sink's argument that names its attempt (`managedjob-output-<id>-<attempt>`): a
/// job controller that adopted an attempt finds its sink by it. It never parses as a wrapper's
/// marker (`managedjob-<id>-<attempt>`).
pub fn mark(job_id: i64, attempt: i32) -> String {
    format!("managedjob-output-{job_id}-{attempt}")
}

/// The sink's program: this very build (`/proc/self/exe`, as the operator starts its job
/// controllers: a binary replaced in place by an upgrade does not change what runs), else the
/// path this process was started from.
pub fn program() -> std::io::Result<PathBuf> {
    const OWN: &str = "/proc/self/exe";
    if Path::new(OWN).exists() {
        Ok(PathBuf::from(OWN))
    } else {
        std::env::current_exe()
    }
}

/// How long a job controller waits, once an attempt's processes are gone, for its sink to write
/// what it still holds: a pipe's worth (64 KiB) takes milliseconds.
pub const DRAIN_WAIT: Duration = Duration::from_secs(5);

/// The exit code of a sink that dropped output (0 when it kept everything).
pub const DROPPED_EXIT: i32 = 3;

/// The line written into the log where output was lost: `bytes` bytes were dropped there.
pub fn truncation_note(bytes: u64) -> String {
    format!(
        "\n[managed-jobs] output truncated: the state dir is full; {bytes} bytes of output were dropped here\n"
    )
}

/// The sentence a job's message gets when its attempt's sink dropped `bytes` bytes.
pub fn dropped_sentence(bytes: u64) -> String {
    format!("output truncated: the state dir was full, {bytes} bytes of output dropped")
}

/// Reads the sink's report (`dropped N` on its stdout): the bytes it dropped.
pub fn parse_report(text: &str) -> u64 {
    text.split_whitespace()
        .skip_while(|w| *w != "dropped")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// What the sink holds while it copies: the log (opened when it can be), and what it dropped.
pub struct Sink<W> {
    open: Box<dyn FnMut() -> std::io::Result<W>>,
    out: Option<W>,
    /// Dropped since the last note was written.
    pending: u64,
    /// Dropped in all.
    dropped: u64,
}

impl<W: Write> Sink<W> {
    /// A sink writing to what `open` opens (tried again at each chunk until it succeeds).
    pub fn new(open: impl FnMut() -> std::io::Result<W> + 'static) -> Sink<W> {
        Sink {
            open: Box::new(open),
            out: None,
            pending: 0,
            dropped: 0,
        }
    }

    /// Bytes dropped in all.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Keeps `chunk` if it can: first the note for what was dropped before it, then the chunk;
    /// what cannot be written is counted, never retried (the workload is not held up).
    pub fn write(&mut self, chunk: &[u8]) {
        if self.out.is_none() {
            self.out = (self.open)().ok();
        }
        let Some(out) = self.out.as_mut() else {
            self.drop_bytes(chunk.len());
            return;
        };
        if self.pending > 0 {
            let note = truncation_note(self.pending);
            if out.write_all(note.as_bytes()).is_err() {
                self.drop_bytes(chunk.len());
                return;
            }
            self.pending = 0;
        }
        let mut rest = chunk;
        while !rest.is_empty() {
            match out.write(rest) {
                Ok(0) => break,
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.drop_bytes(rest.len());
    }

    fn drop_bytes(&mut self, n: usize) {
        self.pending += n as u64;
        self.dropped += n as u64;
    }

    /// At end of input: the note for what was dropped last, if it can be written.
    pub fn finish(&mut self) {
        if self.pending > 0 {
            if self.out.is_none() {
                self.out = (self.open)().ok();
            }
            if let Some(out) = self.out.as_mut()
                && out
                    .write_all(truncation_note(self.pending).as_bytes())
                    .is_ok()
            {
                self.pending = 0;
            }
        }
    }
}

/// `managed-jobs output-sink FILE MARK`: copies stdin to `file` (appending, created when
/// missing) until end of file, then prints `dropped N` and exits 0, or [`DROPPED_EXIT`] when
/// it dropped anything.
pub fn run(file: &Path) -> i32 {
    let path: PathBuf = file.to_path_buf();
    let mut sink = Sink::new(move || {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
    });
    let mut input = std::io::stdin().lock();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => sink.write(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    sink.finish();
    let _ = writeln!(std::io::stdout(), "dropped {}", sink.dropped());
    if sink.dropped() > 0 { DROPPED_EXIT } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    /// A writer with room for `room` bytes more, shared with the test (which adds room).
    #[derive(Clone)]
    struct Disk {
        kept: Rc<RefCell<Vec<u8>>>,
        room: Rc<RefCell<usize>>,
    }

    impl Write for Disk {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let mut room = self.room.borrow_mut();
            if *room == 0 {
                return Err(std::io::Error::from_raw_os_error(libc_enospc()));
            }
            let n = buf.len().min(*room);
            *room -= n;
            self.kept.borrow_mut().extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn libc_enospc() -> i32 {
        nix::errno::Errno::ENOSPC as i32
    }

    fn disk(room: usize) -> (Disk, Sink<Disk>) {
        let d = Disk {
            kept: Rc::default(),
            room: Rc::new(RefCell::new(room)),
        };
        let opened = d.clone();
        (d, Sink::new(move || Ok(opened.clone())))
    }

    #[test]
    fn with_room_everything_is_kept_and_nothing_counted() {
        let (d, mut sink) = disk(usize::MAX);
        sink.write(b"one\n");
        sink.write(b"two\n");
        sink.finish();
        assert_eq!(&*d.kept.borrow(), b"one\ntwo\n");
        assert_eq!(sink.dropped(), 0);
    }

    #[test]
    fn a_full_disk_drops_and_counts_then_notes_the_gap_when_room_returns() {
        let (d, mut sink) = disk(4);
        sink.write(b"one\n");
        sink.write(b"two\n");
        sink.write(b"three\n");
        assert_eq!(sink.dropped(), 10);
        *d.room.borrow_mut() = usize::MAX;
        sink.write(b"four\n");
        sink.finish();
        let kept = String::from_utf8(d.kept.borrow().clone()).unwrap();
        assert_eq!(kept, format!("one\n{}four\n", truncation_note(10)));
        assert_eq!(sink.dropped(), 10);
    }

    #[test]
    fn a_partial_write_counts_only_what_was_lost() {
        let (d, mut sink) = disk(2);
        sink.write(b"abcdef");
        assert_eq!(sink.dropped(), 4);
        assert_eq!(&*d.kept.borrow(), b"ab");
    }

    #[test]
    fn a_log_that_cannot_be_opened_is_tried_again_at_the_next_chunk() {
        let tries = Rc::new(RefCell::new(0));
        let kept = Rc::new(RefCell::new(Vec::new()));
        let (t, k) = (tries.clone(), kept.clone());
        let mut sink = Sink::new(move || {
            *t.borrow_mut() += 1;
            if *t.borrow() == 1 {
                Err(std::io::Error::from_raw_os_error(libc_enospc()))
            } else {
                Ok(Disk {
                    kept: k.clone(),
                    room: Rc::new(RefCell::new(usize::MAX)),
                })
            }
        });
        sink.write(b"lost\n");
        sink.write(b"kept\n");
        sink.finish();
        let text = String::from_utf8(kept.borrow().clone()).unwrap();
        assert_eq!(text, format!("{}kept\n", truncation_note(5)));
    }

    #[test]
    fn the_report_is_read_back() {
        assert_eq!(parse_report("dropped 123\n"), 123);
        assert_eq!(parse_report(""), 0);
        assert!(dropped_sentence(5).contains("output truncated: the state dir was full"));
    }
}
