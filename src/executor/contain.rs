//! Containment of a local attempt's processes: however they detach, every process an attempt
//! started is stopped when the attempt ends, whether it succeeded, failed, was cancelled or ran
//! past its deadline (docs/design.md#executors-and-security), and across job-controller hand-overs.
//!
//! Three nets, the cheapest first:
//! 1. **The attempt's process group.** The wrapper leads it; `cmd &` children stay in it.
//! 2. **The job controller is a child subreaper** (`PR_SET_CHILD_SUBREAPER`). A process that
//!    leaves the group (`setsid -f`, a daemon's double fork) is reparented to the job controller
//!    when its parent exits, so the job controller's descendants are exactly its attempts'
//!    processes: one read of `/proc/self/task/*/children` per level finds them.
//! 3. **An environment mark.** Every process of an attempt inherits
//!    [`SCOPE_VAR`]`=<scope>` (the attempt's exit file path: unique per state dir, job and
//!    attempt). A job controller that did not start the attempt itself (it adopted it after a
//!    hand-over: the escapees were reparented to init when the old one exited), and the
//!    operator when it gives a job up, find them by scanning `/proc/*/environ`; this costs a
//!    read per process on the node, so only those rare paths pay it.
//!
//! Why not a cgroup per job: it needs a delegated, writable cgroup v2 subtree, which neither a
//! laptop session nor a default container has; these nets need nothing but /proc.
//!
//! Limits: a process that clears or rewrites its environment (`env -i`, `exec -c`) *and* leaves
//! the job controller's tree before a hand-over, or one whose environment cannot be read (a
//! setuid program, another user), escapes the third net. Every signal goes to a pid checked
//! against its start time, so a reused pid is never signalled.

use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

use crate::process;

/// The environment variable that marks every process of an attempt: `<scope>` is the attempt's
/// exit file path.
pub const SCOPE_VAR: &str = "MANAGEDJOB_ATTEMPT_SCOPE";

/// How long after SIGKILL to wait for the processes to be gone.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// Makes the calling process a child subreaper: orphaned descendants are reparented to it
/// instead of init. False where the kernel refuses (older than 3.4).
pub fn become_subreaper() -> bool {
    nix::sys::prctl::set_child_subreaper(true).is_ok()
}

/// Every descendant of the calling process (children, their children...), from
/// `/proc/<pid>/task/*/children`; None where the kernel does not provide those files
/// (`CONFIG_PROC_CHILDREN`).
pub fn descendants_of_self() -> Option<Vec<i32>> {
    let me = std::process::id() as i32;
    let mut found = Vec::new();
    let mut queue = children(me)?;
    while let Some(pid) = queue.pop() {
        if found.contains(&pid) {
            continue;
        }
        found.push(pid);
        queue.extend(children(pid).unwrap_or_default());
    }
    Some(found)
}

/// Direct children of `pid`, from each of its threads' `children` file.
fn children(pid: i32) -> Option<Vec<i32>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut out = Vec::new();
    let mut supported = false;
    for task in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            supported = true;
            out.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
    supported.then_some(out)
}

/// Pids of the processes whose environment holds `SCOPE_VAR=scope` exactly.
pub fn with_scope(scope: &str) -> Vec<i32> {
    let entry = format!("{SCOPE_VAR}={scope}");
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == entry.as_bytes()))
        })
        .collect()
}

/// How often the processes are looked for again while a stop waits: a process that forks
/// while it is being stopped (or ignores SIGTERM and keeps forking) is caught by the next look.
const RESCAN_EVERY: Duration = Duration::from_millis(200);

/// Whom a stop signals, and how, when a process is first found (docs/design.md#cancellation: "a stop is
/// SIGTERM once, then SIGKILL after the grace period").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirstSignal {
    /// SIGTERM (and SIGCONT, so a stopped process can act on it): the process is outside the
    /// attempt's process group, which got its own SIGTERM when the stop began.
    Term,
    /// Nothing before the grace ends: the process joined the process group after the group's
    /// SIGTERM (a TERM handler's child, e.g. the command that saves a checkpoint); signalling
    /// it again would kill the handler's work.
    None,
    /// SIGKILL: the grace period is over.
    Kill,
}

/// What a process first found during a stop gets: `in_group` says whether it belongs to the
/// attempt's process group (which got SIGTERM once, as a group, when the stop began);
/// `grace_over` whether SIGKILL time has come. Each process is told at most once to terminate.
pub fn first_signal(in_group: bool, grace_over: bool) -> FirstSignal {
    match (grace_over, in_group) {
        (true, _) => FirstSignal::Kill,
        (false, true) => FirstSignal::None,
        (false, false) => FirstSignal::Term,
    }
}

/// Stops process group `pgid` (when given) and every process `find` returns: SIGTERM once (and
/// SIGCONT, so a stopped process can act on it), up to `grace` for them to exit, then SIGKILL,
/// then up to 10 s more. `find` is asked again every 200 ms and once more after all seemed
/// gone: a process found meanwhile outside the group gets SIGTERM once too (SIGKILL once the
/// grace is over); one that joined the group after its SIGTERM (a TERM handler's command) is
/// left to finish until the grace is over ([`first_signal`]). Nothing is ever sent SIGTERM
/// twice, so a handler that saves a checkpoint runs once, to its end.
///
/// `wrapper`, the group leader when the caller started it, is reaped through its handle (its
/// zombie would keep the group alive); other children of the caller (reparented escapees) are
/// reaped here. Returns how many processes other than `pgid`'s leader it found alive.
pub async fn stop_all(
    pgid: Option<i32>,
    find: impl Fn() -> Vec<i32>,
    grace: Duration,
    mut wrapper: Option<&mut tokio::process::Child>,
) -> usize {
    let me = std::process::id() as i32;
    let mut targets: Vec<(i32, u64)> = Vec::new();
    let in_group = |pid: i32| {
        pgid.is_some_and(|g| {
            nix::unistd::getpgid(Some(Pid::from_raw(pid))).ok() == Some(Pid::from_raw(g))
        })
    };
    let look = |targets: &mut Vec<(i32, u64)>| -> Vec<(i32, u64)> {
        let new: Vec<(i32, u64)> = find()
            .into_iter()
            .filter(|&p| p != me && Some(p) != pgid)
            .filter(|p| !targets.iter().any(|(t, _)| t == p))
            .filter_map(|p| Some((p, process::start_time(p)?)))
            .collect();
        targets.extend(&new);
        new
    };
    let reap = |targets: &[(i32, u64)], wrapper: &mut Option<&mut tokio::process::Child>| {
        if let Some(child) = wrapper.as_mut() {
            let _ = child.try_wait();
        }
        for &(pid, _) in targets {
            let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
        }
    };
    let all_gone = |targets: &[(i32, u64)]| {
        pgid.is_none_or(|g| !process::group_exists(g))
            && targets.iter().all(|&(p, t)| !process::is_alive(p, t))
    };
    // Processes found after the stop began: each gets its first (and only) SIGTERM, or
    // SIGKILL, by [`first_signal`].
    let greet = |found: &[(i32, u64)], grace_over: bool| {
        for &(pid, started) in found {
            match first_signal(in_group(pid), grace_over) {
                FirstSignal::Term => {
                    process::signal_if_alive(pid, started, Signal::SIGTERM);
                    process::signal_if_alive(pid, started, Signal::SIGCONT);
                }
                FirstSignal::Kill => {
                    process::signal_if_alive(pid, started, Signal::SIGKILL);
                }
                FirstSignal::None => {}
            }
        }
    };
    let kill_all = |targets: &[(i32, u64)]| {
        if let Some(g) = pgid {
            let _ = killpg(Pid::from_raw(g), Signal::SIGKILL);
        }
        for &(pid, started) in targets {
            process::signal_if_alive(pid, started, Signal::SIGKILL);
        }
    };
    // SIGTERM once: to the group as a whole, and to every process found outside it.
    look(&mut targets);
    if let Some(g) = pgid {
        let _ = killpg(Pid::from_raw(g), Signal::SIGTERM);
        let _ = killpg(Pid::from_raw(g), Signal::SIGCONT);
    }
    for &(pid, started) in &targets {
        if !in_group(pid) {
            process::signal_if_alive(pid, started, Signal::SIGTERM);
            process::signal_if_alive(pid, started, Signal::SIGCONT);
        }
    }
    let mut grace_over = false;
    let mut deadline = tokio::time::Instant::now() + grace;
    let mut looked = tokio::time::Instant::now();
    loop {
        reap(&targets, &mut wrapper);
        if all_gone(&targets) {
            // Anything forked at the last moment?
            let late = look(&mut targets);
            if late.is_empty() || late.iter().all(|&(p, t)| !process::is_alive(p, t)) {
                break;
            }
            greet(&late, grace_over);
            // A late process left to finish (in the group, before the grace ends) is waited
            // for like the others.
            if !grace_over {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            continue;
        }
        if tokio::time::Instant::now() >= deadline {
            if grace_over {
                break;
            }
            grace_over = true;
            deadline = tokio::time::Instant::now() + KILL_WAIT;
            kill_all(&targets);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        if looked.elapsed() >= RESCAN_EVERY {
            looked = tokio::time::Instant::now();
            let new = look(&mut targets);
            greet(&new, grace_over);
        }
    }
    reap(&targets, &mut wrapper);
    targets.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each process is told to terminate once: the group as a whole at the start, a process
    /// found later outside the group on its own, and one that joined the group after its
    /// SIGTERM (a TERM handler's command) not before the grace is over.
    #[test]
    fn every_process_gets_one_sigterm_at_most() {
        assert_eq!(first_signal(false, false), FirstSignal::Term);
        assert_eq!(first_signal(true, false), FirstSignal::None);
        assert_eq!(first_signal(true, true), FirstSignal::Kill);
        assert_eq!(first_signal(false, true), FirstSignal::Kill);
    }

    /// A process marked with a scope is found by it, and stopped with everything else given.
    #[tokio::test]
    async fn a_marked_process_is_found_and_stopped() {
        let scope = format!("/tmp/contain-test-{}", std::process::id());
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env(SCOPE_VAR, &scope)
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let start = std::time::Instant::now();
        while !with_scope(&scope).contains(&pid) {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "not found by its mark"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            !with_scope(&format!("{scope}x")).contains(&pid),
            "exact match only"
        );
        if let Some(all) = descendants_of_self() {
            assert!(all.contains(&pid), "a child is a descendant");
        }
        let stopped = stop_all(None, || vec![pid], Duration::from_secs(2), None).await;
        assert_eq!(stopped, 1);
        // Reaped by stop_all: the child handle finds nothing to wait for, or its status.
        let _ = child.try_wait();
        assert!(process::start_time(pid).is_none(), "still alive");
    }
}
