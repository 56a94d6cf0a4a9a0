//! The local executor: `setup` then `run` under `sh`, as a process group of its own on the
//! controller node, with only the spec's environment (docs/design.md#executors-and-security).
//!
//! Each attempt runs a fixed wrapper script (`sh -c WRAPPER MARKER SETUP RUN EXIT_FILE`): the
//! user's scripts are passed as arguments, never spliced into a command line. The wrapper writes
//! `started` to the attempt's exit file first thing, and `<stage> <code>` over it at the end, so
//! a job controller that was restarted (not the wrapper's parent) still learns how the attempt
//! ended, and whether it ever began. `MARKER` (`managedjob-<id>-<attempt>`)
//! is the wrapper's `$0`: the deterministic key that lets a resumed controller find the attempt's
//! process instead of launching it twice.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use super::{Executor, Launched, Result, Stop, contain, output};
use crate::lifecycle::world::ProcessSeen;
use crate::lifecycle::{
    Evidence, FailureReason, JobRow, MemberState, Observed, Outcome, Refused, Workload,
};
use crate::process;
use crate::state_dir::StateDir;
use crate::store::Store;

/// PATH given to workloads whose spec does not set one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The wrapper every local attempt runs (`sh -c WRAPPER MARKER SETUP RUN EXIT_FILE`). It
/// holds the attempt's outcome until it is recorded: a write of the exit file that fails (a
/// full disk, an I/O error) is tried again after 1 s, doubling up to 8 s, for as long as it
/// takes, so a finished attempt is never taken for a lost one (and run again). Its first act
/// writes `started` there (one write, no exec; a failure is ignored): an exit file that is
/// missing altogether tells a resumed controller the wrapper never ran ([`Found::NeverStarted`]).
const WRAPPER: &str = r#"exit_file=$3
{ printf 'started\n' > "$exit_file"; } 2>/dev/null
record() {
  delay=1
  until printf '%s %s\n' "$1" "$2" > "$exit_file"; do
    sleep "$delay"
    if [ "$delay" -lt 8 ]; then delay=$((delay * 2)); fi
  done
}
if [ -n "$1" ]; then
  sh -c "$1"
  code=$?
  if [ "$code" -ne 0 ]; then
    record setup "$code"
    exit "$code"
  fi
fi
sh -c "$2"
code=$?
record run "$code"
exit "$code"
"#;

/// Why an attempt whose launch was recorded is started again under the same number
/// ([`Found::NeverStarted`]); it follows "creating the workload failed, trying again: ".
const NEVER_STARTED: &str =
    "the job controller that recorded its launch stopped before it started the process";

/// How long what is found carrying the mark of an attempt about to be started again under the
/// same number has to exit after SIGTERM ([`Executor::launch`]): nothing should be there.
const RELAUNCH_SWEEP_GRACE: Duration = Duration::from_secs(2);

/// How long after a launch failed for the state dir (full, read-only, failing) it is tried
/// again, doubling from [`STORAGE_RETRY_BASE`] up to this: the operator's storage is its own
/// fault, not the workload's, so the launch waits for it.
const STORAGE_RETRY_MAX: Duration = Duration::from_secs(30);
const STORAGE_RETRY_BASE: Duration = Duration::from_secs(2);

/// The local executor, rooted at the operator's state dir. Holds the attempt it started (or
/// adopted) so that it learns of its end at once.
pub struct LocalExecutor {
    state_dir: StateDir,
    current: Option<(i32, LocalWorkload)>,
    /// A launch that failed for the state dir: (attempt, failures in a row, message, when to
    /// try again in ms since epoch).
    storage_failure: Option<(i32, u32, String, i64)>,
}

/// What stopping an attempt found ([`LocalExecutor::stop_attempt`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Processes other than the wrapper that were still there.
    pub left: usize,
    /// Bytes of output its sink dropped ([`output`]): 0 when it kept all, or is not ours.
    pub dropped: u64,
}

/// A running attempt.
pub struct LocalWorkload {
    /// Pid of the wrapper shell, also the process group id.
    pub pid: i32,
    /// Its start time (clock ticks since boot).
    pub start_time: u64,
    child: Option<Child>,
    /// The attempt's output sink ([`output`]), when this executor started it.
    sink: Option<Box<Child>>,
    exit_file: PathBuf,
    /// Reported to the job controller as running at least once.
    reported: bool,
}

/// What [`LocalExecutor::find`] saw of an attempt.
pub enum Found {
    /// The attempt's process group runs.
    Running(LocalWorkload),
    /// The attempt ended; here is how.
    Exited(Outcome),
    /// The attempt began (its exit file says `started`) and vanished without recording its
    /// end: killed, with its process group, before it could.
    Missing,
    /// No trace at all, not even the exit file its wrapper writes first: the wrapper never ran
    /// (the controller that recorded the launch stopped before it started the process). The
    /// attempt did not run, so it is started again, not counted as lost.
    NeverStarted,
}

impl LocalExecutor {
    /// Stops the current attempt's processes; after an attempt that ended on its own, says
    /// how many it had left running.
    pub async fn stop_job(&mut self, job: &JobRow, grace: Duration) -> Result<Stop> {
        let mut forced = Vec::new();
        if job.attempt > 0 {
            let ended = read_exit_file(&self.exit_file(job.id, job.attempt)).is_some();
            let Swept { left, dropped } = self.stop_attempt(job.id, job.attempt, grace).await;
            if ended && left > 0 {
                forced.push(format!(
                    "stopped {left} process{} the attempt left running",
                    if left == 1 { "" } else { "es" }
                ));
            }
            if dropped > 0 {
                forced.push(output::dropped_sentence(dropped));
            }
        }
        Ok(Stop::Gone { forced })
    }

    /// An executor keeping its files under `state_dir` (`run/`, `logs/`, `work/`).
    pub fn new(state_dir: &StateDir) -> LocalExecutor {
        LocalExecutor {
            state_dir: state_dir.clone(),
            current: None,
            storage_failure: None,
        }
    }

    /// `managedjob-<id>-<attempt>`: the attempt's deterministic key.
    pub fn marker(job_id: i64, attempt: i32) -> String {
        format!("managedjob-{job_id}-{attempt}")
    }

    fn exit_file(&self, job_id: i64, attempt: i32) -> PathBuf {
        self.state_dir.exit_file(job_id, attempt)
    }

    /// Looks for the attempt: its exit file, else its running process group, else its exit
    /// file once more (it may have ended during the search).
    pub fn find(&self, job_id: i64, attempt: i32) -> Found {
        let exit_file = self.exit_file(job_id, attempt);
        if let Some(outcome) = read_exit_file(&exit_file) {
            return Found::Exited(outcome);
        }
        // The marker alone is not unique across state dirs (two operators on one host); the exit
        // file's path, also an argument, is.
        let marker = Self::marker(job_id, attempt);
        let exit_arg = exit_file.to_string_lossy();
        for pid in process::find_by_arguments(&[&marker, &exit_arg]) {
            // The wrapper leads its own group; its children carry the marker only in their env.
            if nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(pid))).ok()
                == Some(nix::unistd::Pid::from_raw(pid))
                && let Some(start_time) = process::start_time(pid)
            {
                return Found::Running(LocalWorkload {
                    pid,
                    start_time,
                    child: None,
                    sink: None,
                    exit_file,
                    reported: false,
                });
            }
        }
        // Read again: an attempt that recorded its end and exited while the processes were
        // being searched (a read of every command line: long on a busy host) ended, it did not
        // vanish. Taken for lost, it was run again.
        match read_exit_file(&exit_file) {
            Some(outcome) => Found::Exited(outcome),
            None if std::fs::symlink_metadata(&exit_file)
                .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) =>
            {
                Found::NeverStarted
            }
            None => Found::Missing,
        }
    }

    /// Every local attempt's wrapper process of this state dir, found by its marker and its
    /// exit file's path among its arguments (a read of each process's command line): what the
    /// world check ([`crate::lifecycle::world`]) holds against the store.
    pub fn wrappers(&self) -> Vec<ProcessSeen> {
        let run_dir = self.state_dir.run_dir();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter_map(|pid| {
                let args = process::cmdline(pid)?;
                let marker = args.iter().find_map(|a| a.strip_prefix("managedjob-"))?;
                let (job, attempt) = marker.split_once('-')?;
                let (job_id, attempt): (i64, i32) = (job.parse().ok()?, attempt.parse().ok()?);
                let exit_file = self.state_dir.exit_file(job_id, attempt);
                let exit_arg = exit_file.to_string_lossy();
                // Ours (this state dir), and the wrapper itself (it leads its group).
                (exit_file.starts_with(&run_dir)
                    && args.iter().any(|a| *a == exit_arg)
                    && nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(pid))).ok()
                        == Some(nix::unistd::Pid::from_raw(pid)))
                .then_some(())?;
                Some(ProcessSeen {
                    pid,
                    start_time: process::start_time(pid)?,
                    job_id,
                    attempt,
                })
            })
            .collect()
    }

    /// Stops a wrapper the world check found orphaned (no live attempt owns it): its process
    /// group and everything with its attempt's mark, SIGTERM once, SIGKILL after `grace`.
    pub async fn stop_orphan(&self, seen: ProcessSeen, grace: Duration) {
        if !process::is_alive(seen.pid, seen.start_time) {
            return;
        }
        let scope = self
            .exit_file(seen.job_id, seen.attempt)
            .to_string_lossy()
            .into_owned();
        contain::stop_all(Some(seen.pid), || contain::with_scope(&scope), grace, None).await;
    }

    /// Starts the attempt: a new process group running the wrapper with the spec's env only,
    /// its stdout and stderr a pipe to the attempt's output sink ([`output`]), started first in
    /// a process group of its own.
    pub fn spawn(&self, job: &JobRow, attempt: i32) -> std::io::Result<LocalWorkload> {
        let work_dir = self.state_dir.work_dir(job.id);
        std::fs::create_dir_all(self.state_dir.run_dir())?;
        std::fs::create_dir_all(&work_dir)?;
        std::fs::create_dir_all(self.state_dir.logs_dir())?;
        let task = crate::lifecycle::tasks::current_task(job);
        let log_path = match task.name {
            Some(_) => self.state_dir.task_log(job.id, task.index),
            None => self.state_dir.workload_log(job.id),
        };
        let (read, write) = std::io::pipe()?;
        let sink = Command::new(output::program()?)
            .arg("output-sink")
            .arg(&log_path)
            .arg(output::mark(job.id, attempt))
            .env_clear()
            .stdin(Stdio::from(read))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(false)
            .spawn()?;
        let exit_file = self.exit_file(job.id, attempt);
        let _ = std::fs::remove_file(&exit_file);
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(WRAPPER)
            .arg(Self::marker(job.id, attempt))
            .arg(task.setup.unwrap_or(""))
            .arg(task.run.unwrap_or(""))
            .arg(&exit_file)
            .env_clear()
            .env("PATH", DEFAULT_PATH)
            .env("HOME", &work_dir)
            .env("MANAGEDJOB_ID", job.id.to_string())
            .env("MANAGEDJOB_NAME", &job.name)
            .env("MANAGEDJOB_NAMESPACE", &job.namespace)
            .env(
                "MANAGEDJOB_ATTEMPT",
                crate::lifecycle::tasks::task_attempt(job, attempt).to_string(),
            )
            .env(contain::SCOPE_VAR, &exit_file)
            .current_dir(&work_dir)
            .stdin(Stdio::null())
            .stdout(write.try_clone()?)
            .stderr(write)
            .process_group(0)
            .kill_on_drop(false);
        if let Some(name) = task.name {
            cmd.env("MANAGEDJOB_TASK", name)
                .env("MANAGEDJOB_TASK_INDEX", task.index.to_string());
        }
        for var in &task.env {
            cmd.env(&var.name, &var.value);
        }
        // The pipe's write end lives only in the wrapper's processes from here on (`cmd` is
        // dropped at the end of this function), so the sink sees end of file when they are gone.
        let child = cmd.spawn()?;
        let pid = child.id().expect("a spawned child has a pid") as i32;
        let start_time = process::start_time(pid).unwrap_or(0);
        Ok(LocalWorkload {
            pid,
            start_time,
            child: Some(child),
            sink: Some(Box::new(sink)),
            exit_file,
            reported: false,
        })
    }

    /// Stops every process of the attempt, however it detached ([`contain`]): its process
    /// group, and the processes found by this job controller's descendants (when it started
    /// the attempt itself) or by the attempt's environment mark (when it adopted it, or is not
    /// its job controller at all). SIGTERM, `grace`, SIGKILL. Then waits (at most
    /// [`output::DRAIN_WAIT`]) for the attempt's output sink to write what it holds. Returns how
    /// many processes other than the wrapper were still there, and what the sink dropped.
    pub async fn stop_attempt(&mut self, job_id: i64, attempt: i32, grace: Duration) -> Swept {
        let held = match self.current.take() {
            Some((a, w)) if a == attempt => Some(w),
            _ => None,
        };
        let (pgid, mut child, sink) = match held {
            Some(w) => (Some(w.pid), w.child, w.sink),
            None => match self.find(job_id, attempt) {
                Found::Running(w) => (Some(w.pid), None, None),
                _ => (None, None, None),
            },
        };
        let sink_pid = sink.as_ref().and_then(|s| s.id()).map(|p| p as i32);
        // Its own children are in this process' tree (escapees reparented to it, a subreaper);
        // otherwise, and where the kernel cannot list children, the environment mark tells.
        let own = child.is_some() && contain::descendants_of_self().is_some();
        let scope = self
            .exit_file(job_id, attempt)
            .to_string_lossy()
            .into_owned();
        // The sink is this process' child too, and is spared: it ends at end of file.
        let find = || {
            if own {
                let mut pids = contain::descendants_of_self().unwrap_or_default();
                pids.retain(|p| Some(*p) != sink_pid);
                pids
            } else {
                contain::with_scope(&scope)
            }
        };
        let left = contain::stop_all(pgid, find, grace, child.as_mut()).await;
        if let Some(child) = child.as_mut() {
            let _ = child.wait().await;
        }
        let dropped = match sink {
            Some(sink) => drain(sink).await,
            None => {
                // Adopted: the sink (if the attempt has one) reports to the controller that
                // started it; wait for it to write what it holds.
                let mark = output::mark(job_id, attempt);
                for pid in process::find_by_arguments(&["output-sink", &mark]) {
                    if let Some(started) = process::start_time(pid) {
                        let _ = tokio::time::timeout(
                            output::DRAIN_WAIT,
                            process::wait_gone(pid, started),
                        )
                        .await;
                    }
                }
                0
            }
        };
        Swept { left, dropped }
    }
}

impl Executor for LocalExecutor {
    fn create_is_idempotent(&self) -> bool {
        false
    }

    fn stops_after_exit(&self) -> bool {
        true
    }

    /// A local attempt's detached processes are reparented to this process when their parent
    /// exits, so that the attempt's end finds and stops them ([`super::contain`]).
    fn prepare(&mut self) {
        if !super::contain::become_subreaper() {
            tracing::warn!(
                "cannot become a child subreaper; detached processes are found by their environment mark instead"
            );
        }
    }

    /// The attempt held (started or adopted) and still running; else its exit file; else, once
    /// its launch intent is recorded, its process group found by its marker (a resumed
    /// controller adopts it). Never launched: nothing found without a /proc scan.
    async fn observe(&mut self, _store: &Store, job: &JobRow, attempt: i32) -> Result<Observed> {
        if let Some((a, w)) = self.current.as_mut() {
            // An attempt this executor started is reported running once even if it already
            // ended (a trivial script exits within the spawn): it did run, and its start
            // (startedAt, the Launched Event) must not be skipped.
            if *a == attempt && (w.is_running() || !w.reported) {
                w.reported = true;
                return Ok(Observed::one(Some(w.describe()), MemberState::Running));
            }
            // Ended: kept (its group and child) for the stop that sweeps what it left behind.
            if *a == attempt {
                // Its exit file, or lost: the wrapper was killed before it recorded one
                // (`ProcessLost`; its children may run on, and the stop that follows ends them).
                return Ok(Observed::one(
                    Some(w.describe()),
                    MemberState::Ended(w.outcome()),
                ));
            }
            self.current = None;
        }
        if let Some((a, _, message, retry_at_ms)) = &self.storage_failure
            && *a == attempt
        {
            return Ok(Observed::one(
                None,
                MemberState::CreateFailed {
                    message: message.clone(),
                    retry_at_ms: *retry_at_ms,
                },
            ));
        }
        if job.launched_attempt < attempt {
            return Ok(Observed::not_found());
        }
        Ok(match self.find(job.id, attempt) {
            Found::Exited(outcome) => Observed::one(None, MemberState::Ended(outcome)),
            Found::Running(mut w) => {
                tracing::info!(attempt, pid = w.pid, "adopted the running workload");
                w.reported = true;
                let workload = w.describe();
                self.current = Some((attempt, w));
                Observed::one(Some(workload), MemberState::Running)
            }
            // Launched again under the same attempt, against the launch deadline; it is swept
            // first ([`Executor::launch`]).
            Found::NeverStarted if crate::lifecycle::launch_unobserved(job) => Observed::one(
                None,
                MemberState::CreateFailed {
                    message: NEVER_STARTED.into(),
                    retry_at_ms: 0,
                },
            ),
            // Seen before and now without a trace (a wrapper of an earlier release, or one whose
            // first write failed, killed with its group): lost.
            Found::Missing | Found::NeverStarted => Observed::not_found(),
        })
    }

    /// Starts the attempt. One launched before (its launch recorded, no trace of it found:
    /// [`Found::NeverStarted`]) is swept first: anything carrying its mark is stopped, so a
    /// wrapper its former controller was starting as it died never runs beside this one.
    async fn launch(&mut self, job: &JobRow, attempt: i32) -> Result<Launched> {
        if let Some((a, _, _, retry_at_ms)) = &self.storage_failure
            && *a == attempt
            && crate::lifecycle::now_ms() < *retry_at_ms
        {
            return Ok(Launched::Failed {
                message: "the state dir cannot be written yet".into(),
            });
        }
        if job.launched_attempt >= attempt {
            self.stop_attempt(job.id, attempt, RELAUNCH_SWEEP_GRACE)
                .await;
        }
        match self.spawn(job, attempt) {
            Ok(w) => {
                self.storage_failure = None;
                self.current = Some((attempt, w));
                Ok(Launched::Created)
            }
            Err(e) if storage_fault(&e) => {
                // The operator's own storage: tried again, never the workload's failure.
                let failures = match &self.storage_failure {
                    Some((a, n, _, _)) if *a == attempt => n + 1,
                    _ => 1,
                };
                let delay = STORAGE_RETRY_BASE
                    .saturating_mul(1 << (failures - 1).min(8))
                    .min(STORAGE_RETRY_MAX);
                let message = format!(
                    "the operator's state dir cannot be written ({e}); trying again in {} s",
                    delay.as_secs()
                );
                tracing::warn!(attempt, %message, "launch postponed");
                self.storage_failure = Some((
                    attempt,
                    failures,
                    message.clone(),
                    crate::lifecycle::now_ms() + delay.as_millis() as i64,
                ));
                Ok(Launched::Failed { message })
            }
            Err(e) => {
                let no_shell = e.kind() == std::io::ErrorKind::NotFound
                    && !std::path::Path::new("/bin/sh").exists();
                let message = if no_shell {
                    format!(
                        "could not start the workload: the local executor runs spec.setup and spec.run with /bin/sh, which this operator's image does not have ({e}); run the job with spec.template (the pod executor), or use an image with a shell"
                    )
                } else {
                    format!("could not start the workload: {e}")
                };
                Ok(Launched::Refused(Refused {
                    reason: FailureReason::LaunchFailed,
                    message,
                }))
            }
        }
    }

    async fn changed(&mut self) {
        match self.current.as_mut() {
            Some((_, w)) => w.exited().await,
            None => std::future::pending().await,
        }
    }

    async fn stop(&mut self, _store: &Store, job: &JobRow, grace: Duration) -> Result<Stop> {
        self.stop_job(job, grace).await
    }
}

impl LocalWorkload {
    /// Waits until the attempt's wrapper process is gone (reaped when it is our child).
    pub async fn exited(&mut self) {
        match self.child.as_mut() {
            Some(child) => {
                let _ = child.wait().await;
            }
            None => process::wait_gone(self.pid, self.start_time).await,
        }
    }

    /// True while the wrapper runs.
    fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => process::is_alive(self.pid, self.start_time),
        }
    }

    /// How the attempt ended, once it did.
    pub fn outcome(&self) -> Outcome {
        read_exit_file(&self.exit_file).unwrap_or_else(|| {
            Outcome::lost(
                "the workload's process was killed before it recorded an exit code",
                "ProcessLost",
            )
        })
    }

    /// Stops the attempt's process group: SIGTERM, up to `grace`, SIGKILL; returns once the group
    /// is gone (reaping the wrapper when it is our child, so no zombie keeps the group alive).
    pub async fn stop(&mut self, grace: Duration) {
        match self.child.as_mut() {
            Some(child) => {
                let group = nix::unistd::Pid::from_raw(self.pid);
                let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGTERM);
                if tokio::time::timeout(grace, child.wait()).await.is_err() {
                    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
                    let _ = child.wait().await;
                }
                process::stop_group(self.pid, Duration::from_millis(200)).await;
            }
            None => process::stop_group(self.pid, grace).await,
        }
    }

    /// The workload, as `status.workload` names it (`pid/<pid>`).
    pub fn describe(&self) -> Workload {
        Workload::Process(self.pid)
    }
}

/// True for an error of the state dir's storage (full, over quota, read-only, failing): the
/// operator's fault, never the workload's.
fn storage_fault(e: &std::io::Error) -> bool {
    use nix::errno::Errno;
    matches!(
        e.raw_os_error().map(Errno::from_raw),
        Some(Errno::ENOSPC | Errno::EDQUOT | Errno::EROFS | Errno::EIO)
    )
}

/// Waits (at most [`output::DRAIN_WAIT`]) for an attempt's sink to reach end of file and
/// report; returns the bytes it dropped. A sink still copying then is left to finish.
async fn drain(mut sink: Box<Child>) -> u64 {
    use tokio::io::AsyncReadExt;
    let mut report = String::new();
    let mut stdout = sink.stdout.take();
    let read = async {
        if let Some(out) = stdout.as_mut() {
            let _ = out.read_to_string(&mut report).await;
        }
        let _ = sink.wait().await;
    };
    if tokio::time::timeout(output::DRAIN_WAIT, read)
        .await
        .is_err()
    {
        tracing::warn!("the attempt's output sink is still writing; its log may end late");
    }
    output::parse_report(&report)
}

fn read_exit_file(path: &Path) -> Option<Outcome> {
    let text = std::fs::read_to_string(path).ok()?;
    // The wrapper writes the line with one write(2) (no temporary file and `mv`: that was a third
    // exec per attempt); a line without its newline is not finished, or was cut by a kill.
    if !text.ends_with('\n') {
        return None;
    }
    let mut parts = text.split_whitespace();
    let stage = parts.next()?;
    let code: i32 = parts.next()?.parse().ok()?;
    // A script killed by signal N exits 128 + N (sh's convention, and a container's).
    let signalled = |code: i32| (code > 128).then(|| format!("KilledBySignal{}", code - 128));
    Some(match (stage, code) {
        ("run", 0) => Outcome::Succeeded,
        ("setup", code) => {
            let part = signalled(code).unwrap_or_else(|| "SetupFailed".into());
            Outcome::SetupFailed {
                code,
                reason: "SetupFailed".into(),
                detail: None,
                evidence: Evidence::exit("setup", true, code, &part),
            }
        }
        (_, code) => {
            let reason = signalled(code).unwrap_or_else(|| "ExitCode".into());
            Outcome::Failed {
                code,
                evidence: Evidence::exit("run", false, code, &reason),
                reason,
                detail: None,
            }
        }
    })
}
