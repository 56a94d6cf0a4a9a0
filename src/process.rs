//! Process identity and lifecycle helpers (Linux): start times for pid-reuse-safe liveness,
//! pidfds to notice the exit of processes that are not our children, process groups.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// Start time of `pid` in clock ticks since boot (field 22 of `/proc/PID/stat`), or `None` if
/// the process does not exist. Together with the pid it identifies a process across pid reuse.
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces: split after it.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state); field 22 is index 19.
    if fields.first() == Some(&"Z") {
        return None; // a zombie has exited
    }
    fields.get(19)?.parse().ok()
}

/// What `/proc/PID/stat` says of a process's use of the machine: the fields Prometheus'
/// standard process collector exports (`process_cpu_seconds_total` and the rest).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// User plus system CPU time, in clock ticks (fields 14 and 15).
    pub cpu_ticks: u64,
    /// Threads (field 20).
    pub threads: u64,
    /// Start time, in clock ticks since boot (field 22).
    pub start_ticks: u64,
    /// Virtual memory size, bytes (field 23).
    pub virtual_bytes: u64,
    /// Resident set size, pages (field 24).
    pub resident_pages: u64,
}

/// Parses the text of `/proc/PID/stat` ([`Usage`]); None when it has too few fields.
pub fn parse_usage(stat: &str) -> Option<Usage> {
    // The command name (field 2) is in parentheses and may contain spaces: split after it.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3: field N is index N - 3.
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    Some(Usage {
        cpu_ticks: field(14)? + field(15)?,
        threads: field(20)?,
        start_ticks: field(22)?,
        virtual_bytes: field(23)?,
        resident_pages: field(24)?,
    })
}

/// [`Usage`] of `pid`, None when it cannot be read.
pub fn usage(pid: i32) -> Option<Usage> {
    parse_usage(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`, 100 on Linux) and the page size in bytes.
pub fn ticks_and_page_size() -> (u64, u64) {
    // SAFETY: sysconf only reads a configuration value.
    let (ticks, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (
        u64::try_from(ticks).ok().filter(|t| *t > 0).unwrap_or(100),
        u64::try_from(page).ok().filter(|p| *p > 0).unwrap_or(4096),
    )
}

/// When the machine booted, seconds since the epoch (`btime` of `/proc/stat`).
pub fn boot_time() -> Option<u64> {
    std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())
}

/// Open file descriptors of this process (entries of `/proc/self/fd`, less the one reading it).
pub fn open_fds() -> Option<u64> {
    let n = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    Some(n.saturating_sub(1))
}

/// The session id of `pid` (field 6 of `/proc/PID/stat`), or `None` if the process does not
/// exist.
pub fn session_id(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    // `rest` starts at field 3 (state); field 6 is index 3.
    rest.split_whitespace().nth(3)?.parse().ok()
}

/// True if `pid` leads its own session (its session id is its pid). Job controllers are
/// started with `setsid`, so each leads a session; a child a job controller has forked but not
/// yet exec'd (its workload's wrapper, for a moment) still shows the controller's command line
/// but is in the controller's session, and must never be taken for one.
pub fn is_session_leader(pid: i32) -> bool {
    session_id(pid) == Some(pid)
}

/// True if the process `pid` exists and started at `started` (not a reused pid).
pub fn is_alive(pid: i32, started: u64) -> bool {
    start_time(pid) == Some(started)
}

/// The command line of `pid` as its arguments.
pub fn cmdline(pid: i32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
    )
}

/// The identity (device, inode) of the file at `path`, following links (`/proc/self/exe`
/// gives the running executable's, even when its file was replaced or deleted since).
pub fn file_identity(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The identity (device, inode) of the executable `pid` runs (`/proc/PID/exe`), or `None`
/// when it cannot be read (the process exited, or another user's). Two processes with the same
/// identity run the same build.
pub fn executable_identity(pid: i32) -> Option<(u64, u64)> {
    file_identity(std::path::Path::new(&format!("/proc/{pid}/exe")))
}

/// Pids whose argument list contains every one of `markers` as a whole argument.
pub fn find_by_arguments(markers: &[&str]) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            cmdline(*pid).is_some_and(|args| markers.iter().all(|m| args.iter().any(|a| a == m)))
                && start_time(*pid).is_some()
        })
        .collect()
}

/// Sends `signal` to `pid` only if it is still the process that started at `started`.
pub fn signal_if_alive(pid: i32, started: u64, signal: Signal) -> bool {
    is_alive(pid, started) && kill(Pid::from_raw(pid), signal).is_ok()
}

/// True while any process is in process group `pgid`.
pub fn group_exists(pgid: i32) -> bool {
    killpg(Pid::from_raw(pgid), None).is_ok()
}

/// Stops process group `pgid`: SIGTERM, up to `grace` for it to exit, then SIGKILL; returns once
/// no process of the group is left (or after a further 10 s).
pub async fn stop_group(pgid: i32, grace: Duration) {
    let group = Pid::from_raw(pgid);
    let _ = killpg(group, Signal::SIGTERM);
    let _ = killpg(group, Signal::SIGCONT);
    let deadline = tokio::time::Instant::now() + grace;
    while group_exists(pgid) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = killpg(group, Signal::SIGKILL);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while group_exists(pgid) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A pidfd: readable once the process exits. Works for processes that are not our children
/// (job controllers adopted after an operator restart, workloads adopted after a resume).
pub struct PidFd(OwnedFd);

impl AsRawFd for PidFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl PidFd {
    /// Opens a pidfd for `pid` (Linux >= 5.3).
    pub fn open(pid: i32) -> io::Result<PidFd> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the syscall returned a fresh fd that we now own.
        Ok(PidFd(unsafe { OwnedFd::from_raw_fd(fd as RawFd) }))
    }

    /// Waits until the process exits.
    pub async fn exited(self) -> io::Result<()> {
        // SAFETY: the PidFd owns its fd, which stays open and unchanged while the AsyncFd lives.
        let afd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(self, tokio::io::Interest::READABLE)
        }
        .map_err(|e| e.into_parts().1)?;
        let _guard = afd.readable().await?;
        Ok(())
    }
}

/// Waits until process `pid` (started at `started`) is gone. Uses a pidfd; falls back to polling
/// `/proc` every 200 ms where pidfds are unavailable.
pub async fn wait_gone(pid: i32, started: u64) {
    if let Ok(fd) = PidFd::open(pid)
        && is_alive(pid, started)
        && fd.exited().await.is_ok()
    {
        return;
    }
    while is_alive(pid, started) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A child started by [`spawn_in_session`]; [`Spawned::wait`] reaps it.
#[derive(Debug)]
pub struct Spawned {
    /// Its pid.
    pub pid: i32,
    /// The write end of its start gate, while the gate is shut.
    gate: Option<OwnedFd>,
}

impl Spawned {
    /// Opens the child's start gate (closes the write end of the pipe it waits on, see
    /// [`spawn_in_session`]); dropping the `Spawned`, or the end of this process, opens it too.
    pub fn open_gate(&mut self) {
        self.gate = None;
    }

    /// Waits until the child exits (its pidfd; a blocking `waitpid` on a thread where pidfds
    /// are unavailable), then reaps it. Returns its wait status, if it could be read.
    pub async fn wait(self) -> Option<nix::sys::wait::WaitStatus> {
        let pid = nix::unistd::Pid::from_raw(self.pid);
        if let Ok(fd) = PidFd::open(self.pid)
            && fd.exited().await.is_ok()
        {
            return nix::sys::wait::waitpid(pid, None).ok();
        }
        tokio::task::spawn_blocking(move || nix::sys::wait::waitpid(pid, None).ok())
            .await
            .ok()
            .flatten()
    }

    /// Sends SIGKILL to the child (it is still ours to reap: it cannot have been reused).
    pub fn kill(&self) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), Signal::SIGKILL);
    }
}

/// Starts `program` with `argv` (its first element is the name `ps` shows) and this process's
/// environment, in a session of its own, with SIGUSR1 blocked (its wake-up signal, whose
/// default action would end it before it sets its handler), SIGPIPE at its default, stdin
/// from /dev/null and stdout and stderr to `log`. With `gate_fd` (say 3), the child's file
/// descriptor `gate_fd` is the read end of a pipe whose write end only the returned [`Spawned`]
/// holds: the child can wait for its end of file ([`wait_for_gate`]) until the parent has done
/// what must come first ([`Spawned::open_gate`]), or has died.
///
/// Uses `posix_spawn`, which glibc carries out with `clone(CLONE_VM | CLONE_VFORK)`: the
/// parent's page tables are not copied. A fork (what `std::process::Command` does as soon as it
/// has a `pre_exec`) copied them for every job controller: about 7% of the operator's CPU, and
/// more the larger the operator. Errors: those of `posix_spawn` (the program's exec included).
pub fn spawn_in_session(
    program: &std::path::Path,
    argv: &[std::ffi::OsString],
    log: &std::fs::File,
    gate_fd: Option<RawFd>,
) -> io::Result<Spawned> {
    use nix::spawn::{PosixSpawnAttr, PosixSpawnFileActions, PosixSpawnFlags};
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt as _;
    let cstring = |s: &std::ffi::OsStr| {
        CString::new(s.as_bytes()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
    };
    let args: Vec<CString> = argv.iter().map(|a| cstring(a)).collect::<io::Result<_>>()?;
    let env: Vec<CString> = std::env::vars_os()
        .map(|(k, v)| {
            let mut kv = k;
            kv.push("=");
            kv.push(v);
            cstring(&kv)
        })
        .collect::<io::Result<_>>()?;
    let null = std::fs::File::open("/dev/null")?;
    let mut actions = PosixSpawnFileActions::init()?;
    actions.add_dup2(null.as_raw_fd(), 0)?;
    actions.add_dup2(log.as_raw_fd(), 1)?;
    actions.add_dup2(log.as_raw_fd(), 2)?;
    // Both ends close on exec (no other child started meanwhile inherits them); the dup2 gives
    // the child a copy of the read end without that flag (glibc clears it when the fds are
    // equal, as POSIX 2017 asks).
    let gate = match gate_fd {
        Some(fd) => {
            let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
            actions.add_dup2(read.as_raw_fd(), fd)?;
            Some((read, write))
        }
        None => None,
    };
    let mut attr = PosixSpawnAttr::init()?;
    let mut mask = nix::sys::signal::SigSet::empty();
    mask.add(Signal::SIGUSR1);
    attr.set_sigmask(&mask)?;
    let mut defaults = nix::sys::signal::SigSet::empty();
    defaults.add(Signal::SIGPIPE);
    attr.set_sigdefault(&defaults)?;
    attr.set_flags(
        PosixSpawnFlags::POSIX_SPAWN_SETSIGMASK
            | PosixSpawnFlags::POSIX_SPAWN_SETSIGDEF
            | PosixSpawnFlags::from_bits_retain(libc::c_int::from(libc::POSIX_SPAWN_SETSID)),
    )?;
    let pid = nix::spawn::posix_spawn(program, &actions, &attr, &args, &env)?;
    Ok(Spawned {
        pid: pid.as_raw(),
        gate: gate.map(|(_read, write)| write),
    })
}

/// Waits until the start gate at file descriptor `fd` (see [`spawn_in_session`]) opens: end of
/// file on it, once the parent opened the gate or died. Blocks the calling thread; closes `fd`.
///
/// Errors: `fd` is not open (`EBADF`) or cannot be read.
pub fn wait_for_gate(fd: RawFd) -> io::Result<()> {
    // Refuse an fd that is not open before taking ownership of it.
    nix::fcntl::fcntl(
        // SAFETY: only used for this one F_GETFD call, while `fd` is not closed by anyone.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
        nix::fcntl::FcntlArg::F_GETFD,
    )?;
    // SAFETY: `fd` is open and this process owns it from here (nothing else uses it).
    let mut gate = unsafe { std::fs::File::from_raw_fd(fd) };
    // Reads to end of file, retrying an interrupted read.
    io::copy(&mut gate, &mut io::sink()).map(drop)
}

/// Blocks or unblocks SIGUSR1 for the calling thread (inherited by children across exec).
pub fn set_sigusr1_blocked(blocked: bool) {
    let mut set = nix::sys::signal::SigSet::empty();
    set.add(Signal::SIGUSR1);
    let how = if blocked {
        nix::sys::signal::SigmaskHow::SIG_BLOCK
    } else {
        nix::sys::signal::SigmaskHow::SIG_UNBLOCK
    };
    let _ = nix::sys::signal::pthread_sigmask(how, Some(&set), None);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_read_from_proc_stat_fields() {
        // A command name with spaces and a parenthesis, as the kernel writes it.
        let stat = "4242 (managed (jobs)) S 1 4242 4242 0 -1 4194560 6364 0 0 0 \
                    150 25 0 0 20 0 7 0 123456 987654321 2048 18446744073709551615";
        let u = parse_usage(stat).unwrap();
        assert_eq!(
            u,
            Usage {
                cpu_ticks: 175,
                threads: 7,
                start_ticks: 123456,
                virtual_bytes: 987654321,
                resident_pages: 2048
            }
        );
        assert_eq!(parse_usage("1 (x) S 1"), None);
        let me = usage(std::process::id() as i32).unwrap();
        assert!(me.threads >= 1 && me.resident_pages > 0, "{me:?}");
    }

    /// The child runs in a session of its own, with SIGUSR1 blocked, its output in the log,
    /// and is reaped with its exit status.
    #[tokio::test]
    async fn a_spawned_child_has_its_own_session_and_sigusr1_blocked() {
        let dir = tempfile::tempdir().unwrap();
        let log_path = dir.path().join("log");
        let log = std::fs::File::create(&log_path).unwrap();
        // Its status, then stdin (empty), then an error on stderr: exit status 1.
        let argv: Vec<std::ffi::OsString> = vec![
            "shown-name".into(),
            "/proc/self/status".into(),
            "-".into(),
            "/nonexistent".into(),
        ];
        let child = spawn_in_session(std::path::Path::new("/bin/cat"), &argv, &log, None).unwrap();
        let pid = Pid::from_raw(child.pid);
        assert_eq!(nix::unistd::getsid(Some(pid)).unwrap(), pid);
        assert_eq!(
            child.wait().await,
            Some(nix::sys::wait::WaitStatus::Exited(pid, 1))
        );
        let out = std::fs::read_to_string(&log_path).unwrap();
        let mask = out
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:"))
            .map(|m| u64::from_str_radix(m.trim(), 16).unwrap())
            .unwrap_or_else(|| panic!("no mask in {out:?}"));
        assert_eq!(mask, 1 << (Signal::SIGUSR1 as u64 - 1), "{out}");
        assert!(out.contains("shown-name: /nonexistent"), "{out:?}");
        // Reaped: no zombie left.
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }

    /// A child waits at its start gate until the parent opens it; a second child started
    /// meanwhile holds no copy of the first one's write end (the first still sees end of file).
    #[tokio::test]
    async fn a_child_waits_at_its_gate_until_the_parent_opens_it() {
        let dir = tempfile::tempdir().unwrap();
        let start = |name: &str| {
            let log_path = dir.path().join(name);
            let log = std::fs::File::create(&log_path).unwrap();
            let argv: Vec<std::ffi::OsString> = vec![
                "sh".into(),
                "-c".into(),
                "echo waiting; cat <&3; echo opened".into(),
            ];
            let child =
                spawn_in_session(std::path::Path::new("/bin/sh"), &argv, &log, Some(3)).unwrap();
            (child, log_path)
        };
        let (mut first, first_log) = start("first");
        let (mut second, second_log) = start("second");
        let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while read(&first_log) != "waiting\n" || read(&second_log) != "waiting\n" {
            assert!(std::time::Instant::now() < deadline, "never started");
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(read(&first_log), "waiting\n", "went past a shut gate");
        first.open_gate();
        assert!(matches!(
            first.wait().await,
            Some(nix::sys::wait::WaitStatus::Exited(_, 0))
        ));
        assert_eq!(read(&first_log), "waiting\nopened\n");
        assert_eq!(read(&second_log), "waiting\n", "the second gate is its own");
        second.open_gate();
        second.wait().await;
        assert_eq!(read(&second_log), "waiting\nopened\n");
    }

    #[test]
    fn own_process_is_alive_and_reuse_is_detected() {
        let me = std::process::id() as i32;
        let t = start_time(me).expect("own start time");
        assert!(is_alive(me, t));
        assert!(!is_alive(me, t + 1));
    }
}
