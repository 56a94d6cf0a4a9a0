//! The job controller process: one per admitted job (`managed-jobs job-controller --state-dir DIR
//! --start-gate-fd 3 --job-id N`), started by the operator in a session of its own. Once its
//! start is recorded (its start gate opens) it drives its job through
//! Submitted -> Starting -> Running -> a terminal phase, restarts it after errors (with a stored
//! back-off), relaunches it after the workload was lost, and cancels it on request.
//!
//! Each turn of its loop reads the job's row, asks the executor what it observes of the current
//! attempt, lets [`lifecycle::next_action`] decide, and carries the decision out (a
//! compare-and-set, a launch, a stop, or a wait), having the executor keep the end of the
//! attempt's logs first when [`lifecycle::keep_logs`] says so (an attempt that ended, a stop). It holds no state of its own beyond the
//! executor's handle on a running workload, so a fresh process started after a crash re-attaches
//! to the running workload (or finds how it ended) instead of launching it again. It makes no API
//! calls for local jobs and holds one SQLite connection with a small page cache.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::api::ExecutorKind;
use crate::executor::{AnyExecutor, Executor, ExecutorError, Launched, Stop};
use crate::lifecycle::{self, Action, AfterRefusal, Context, JobRow, Transition, now_ms};
use crate::state_dir::StateDir;
use crate::store::{Cas, Store, StoreError};
use crate::wake::OperatorWaker;

/// Why a turn of the job controller failed.
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The executor failed.
    #[error(transparent)]
    Executor(#[from] ExecutorError),
}

impl TurnError {
    /// True when the state dir fails (disk full, I/O error): the turn is tried again.
    pub fn is_storage_failure(&self) -> bool {
        match self {
            TurnError::Store(e) => e.is_storage_failure(),
            TurnError::Executor(e) => e.is_storage_failure(),
        }
    }
}

/// Page cache of a job controller's SQLite connection, KiB (it touches one row at a time).
pub const CACHE_KIB: u32 = 64;

/// Longest wait before re-reading the row while a workload runs (a missed wake-up costs this).
pub const OBSERVE_BACKSTOP: Duration = Duration::from_secs(30);
/// Longest wait before re-reading the row while queued or stopping.
pub const QUEUED_BACKSTOP: Duration = Duration::from_secs(5);
/// How long a removal without grace ([`Action::RemoveThen`]) may take to be confirmed before
/// the job controller decides again.
pub const REMOVE_CONFIRM: Duration = Duration::from_secs(10);
/// How long a pod job waits for the Pod watch to report a Pod it just created.
pub const POD_REPORT_WAIT: Duration = Duration::from_secs(10);
/// First wait before a turn is tried again after the state dir could not be read or written;
/// doubles per failure in a row up to [`STORAGE_RETRY_MAX`].
pub const STORAGE_RETRY_BASE: Duration = Duration::from_millis(200);
/// Longest wait between two tries while the state dir fails.
pub const STORAGE_RETRY_MAX: Duration = Duration::from_secs(10);

/// After a turn: decide again, or the job is Done.
enum Flow {
    Continue,
    Exit,
}

struct JobController {
    store: Store,
    /// The store's path, and the identity of the file opened there: while another file (or
    /// none) is at the path, the store was replaced and this process no longer acts.
    store_path: PathBuf,
    store_id: lifecycle::world::FileId,
    job_id: i64,
    executor: AnyExecutor,
    waker: OperatorWaker,
    wake: Signal,
    grace: Duration,
    backoff_base: Duration,
    launch_timeout: Duration,
    max_launch_timeouts: i32,
    executors: Vec<ExecutorKind>,
    /// Claims are in force (the operator runs with an API): each turn reads the claim on the
    /// job's namespace before deciding (`docs/design.md#one-owner-per-job`).
    claims: bool,
    /// The last keep of an attempt's logs this process did: a stop decided again each turn
    /// until the workload is gone keeps once.
    kept: Option<lifecycle::KeepLogs>,
}

/// Entry point of `managed-jobs job-controller`. Returns when the job is Done. With
/// `start_gate_fd`, it acts on the job only once that start gate opens
/// ([`crate::process::wait_for_gate`]): the operator has recorded its start.
pub async fn run(
    state_dir: PathBuf,
    job_id: i64,
    start_gate_fd: Option<i32>,
) -> anyhow::Result<()> {
    let dir = StateDir::new(state_dir);
    // One driver per job: a process started while an older one still runs (e.g. after an
    // operator crash between start and record) waits here and takes over when that one ends.
    std::fs::create_dir_all(dir.run_dir())?;
    let lock_file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.job_lock(job_id))?;
    let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| anyhow::anyhow!("locking job {job_id}: {e}"))?;
    // Install the wake-up handler, then let the (held) SIGUSR1 through.
    let wake = signal(SignalKind::user_defined1()).context("installing the SIGUSR1 handler")?;
    crate::process::set_sigusr1_blocked(false);
    // Never migrated here: only an operator migrates, after it replaced the job controllers of
    // other builds (docs/upgrades.md). A store at another step belongs to another release's
    // operator, whose own job controller drives this job: leave, touching nothing.
    let store = match Store::open_current(&dir.store(), CACHE_KIB) {
        Ok(store) => store,
        Err(e @ StoreError::OtherRelease { .. }) => {
            tracing::warn!(job_id, error = %e, "exiting without touching the workload");
            return Ok(());
        }
        Err(e) => {
            return Err(anyhow::Error::new(e)
                .context(format!("opening the store in {}", dir.root().display())));
        }
    };
    let store_id = file_id(&dir.store()).with_context(|| {
        format!(
            "the store in {} vanished as it was opened",
            dir.root().display()
        )
    })?;
    let settings = store.settings()?;
    let kind = store.get(job_id)?.executor;
    let mut executor = crate::executor::for_job(kind, &dir, &settings);
    executor.prepare();
    if let Some(fd) = start_gate_fd
        && let Err(e) = crate::process::wait_for_gate(fd)
    {
        // Started by hand, or by a parent that passed no gate: nothing to wait for.
        tracing::warn!(job_id, fd, error = %e, "no start gate to wait for");
    }
    tracing::info!(job_id, pid = std::process::id(), executor = %kind, "job controller started");
    let waker = OperatorWaker::new(&dir);
    JobController {
        store,
        store_path: dir.store(),
        store_id,
        job_id,
        executor,
        waker,
        wake,
        grace: Duration::from_millis(settings.cancel_grace_ms),
        backoff_base: Duration::from_millis(settings.restart_backoff_ms),
        launch_timeout: Duration::from_millis(settings.launch_timeout_ms),
        max_launch_timeouts: settings.max_launch_timeouts,
        executors: settings.executors,
        claims: settings.claims,
        kept: None,
    }
    .drive()
    .await
}

/// The identity (device, inode) of the file at `path`, if any.
fn file_id(path: &std::path::Path) -> Option<lifecycle::world::FileId> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

impl JobController {
    /// Read, decide, act, until the job is Done. A turn that fails because the state dir
    /// cannot be read or written (disk full, I/O error) is tried again with a back-off, for as
    /// long as it takes: this process may hold the only knowledge of an outcome (decided again
    /// from the workload's own evidence at each turn), and leaving would lose it.
    async fn drive(&mut self) -> anyhow::Result<()> {
        let mut failures = 0;
        loop {
            match self.turn().await {
                Ok(Flow::Exit) => return Ok(()),
                Ok(Flow::Continue) => failures = 0,
                Err(e) if e.is_storage_failure() => {
                    failures += 1;
                    let wait =
                        lifecycle::backoff(STORAGE_RETRY_BASE, failures).min(STORAGE_RETRY_MAX);
                    tracing::warn!(error = %e, failures, retry_in = ?wait, "the state dir cannot be written; holding on and trying again");
                    self.wait(None, wait).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// One turn: read, decide, act.
    async fn turn(&mut self) -> Result<Flow, TurnError> {
        {
            // Fencing: only the operator's current store is acted on. One replaced (a lost
            // state dir rebuilt) or removed leaves the workload to the current store, which
            // adopts or stops it.
            if !lifecycle::world::store_is_current(self.store_id, file_id(&self.store_path)) {
                tracing::warn!(
                    store = %self.store_path.display(),
                    "the store this job controller opened was replaced or removed; exiting without touching the workload"
                );
                return Ok(Flow::Exit);
            }
            // The same for a store another release's operator migrated since (a version
            // change): its schema is not the one this build reads.
            match self.store.check_step(&self.store_path) {
                Ok(()) => {}
                Err(e @ StoreError::OtherRelease { .. }) => {
                    tracing::warn!(error = %e, "exiting without touching the workload");
                    return Ok(Flow::Exit);
                }
                Err(e) => return Err(e.into()),
            }
            let row = self.store.get(self.job_id)?;
            let attempt = row.current_attempt();
            let observed = if lifecycle::observes(&row) {
                Some(self.executor.observe(&self.store, &row, attempt).await?)
            } else {
                None
            };
            let cx = Context {
                now_ms: now_ms(),
                executor_enabled: self.executors.contains(&row.executor),
                create_is_idempotent: self.executor.create_is_idempotent(),
                backoff_base: self.backoff_base,
                stop_after_exit: self.executor.stops_after_exit(),
                launch_timeout: self.launch_timeout,
                max_launch_timeouts: self.max_launch_timeouts,
                // Asked only of a Pod waiting for a node (one indexed query).
                run_slot_wanted: observed.as_ref().is_some_and(|o| {
                    matches!(lifecycle::view(o), lifecycle::View::Unschedulable { .. })
                }) && self.store.run_slot_wanted(now_ms())?,
                stop_grace: self.grace,
                // One small indexed read: launch only under a claim renewed lately.
                claim: self.store.gate(&row.namespace, self.claims)?,
                operator_alive: !self.claims
                    || self
                        .store
                        .operator()?
                        .is_some_and(|(pid, start)| crate::process::is_alive(pid, start)),
            };
            let decided_ms = cx.now_ms;
            let action = lifecycle::next_action(&row, observed.as_ref(), &cx);
            let grace = lifecycle::action_grace(&action, &row, self.grace);
            if let Some(keep) = lifecycle::keep_logs(&row, observed.as_ref(), &action)
                && self.kept != Some(keep)
            {
                // Best effort and bounded in time: nothing of it fails the turn.
                self.executor
                    .keep_logs(&self.store, &row, keep.attempt)
                    .await;
                self.kept = Some(keep);
            }
            match action {
                Action::Exit => {
                    tracing::info!(phase = %row.phase, "job is done");
                    return Ok(Flow::Exit);
                }
                Action::Apply(t) => {
                    self.set(&row, &t)?;
                }
                Action::Launch { attempt, intent } => {
                    if let Some(intent) = intent
                        && !self.set(&row, &intent)?
                    {
                        return Ok(Flow::Continue);
                    }
                    // No create after a cancel, a suspend or a preemption, ever: the request
                    // may have come since the row was read.
                    let now = self.store.get(self.job_id)?;
                    if now.cancel_requested || lifecycle::stop_requested(&now) {
                        return Ok(Flow::Continue);
                    }
                    match self.executor.launch(&row, attempt).await? {
                        Launched::Refused(refused) => {
                            match lifecycle::after_refusal(&row, &refused) {
                                AfterRefusal::Cancel => {
                                    tracing::info!(message = %refused.message, "the namespace is being deleted: cancelling the job");
                                    self.store.request_cancel(self.job_id, false)?;
                                }
                                AfterRefusal::Apply(t) => {
                                    self.set(&row, t.as_ref())?;
                                }
                            }
                        }
                        // Observed as CreateFailed from now on: decided again at once.
                        Launched::Failed { .. } => {}
                        Launched::Created if self.executor.create_is_idempotent() => {
                            // Its state comes from the operator's watch, which wakes us.
                            self.wait(None, POD_REPORT_WAIT).await;
                        }
                        Launched::Created => {}
                    }
                }
                Action::StopThen(t) => match self.executor.stop(&self.store, &row, grace).await? {
                    Stop::Gone { forced } => {
                        let t = t.with_notes(&forced).written_at(decided_ms, now_ms());
                        self.set(&row, &t)?;
                    }
                    Stop::Stopping { waiting_on } => {
                        if let Some(t) = waiting_on.and_then(|w| lifecycle::stopping(&row, &w)) {
                            self.set(&row, &t)?;
                        }
                        // Not gone yet: woken when the watch sees it go.
                        self.wait(None, QUEUED_BACKSTOP).await;
                    }
                },
                Action::RemoveThen(t) => {
                    // A removal without grace completes at once: confirm it and write the
                    // decision taken before it. Deciding again would see the removed workload
                    // as lost (a recovery) instead of what the decision was (a launch timeout).
                    let start = std::time::Instant::now();
                    loop {
                        if let Stop::Gone { forced } =
                            self.executor.stop(&self.store, &row, grace).await?
                        {
                            let t = t.with_notes(&forced).written_at(decided_ms, now_ms());
                            self.set(&row, &t)?;
                            break;
                        }
                        if start.elapsed() >= REMOVE_CONFIRM {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                Action::Wait { until_ms } => {
                    let backstop = if observed.is_some() {
                        OBSERVE_BACKSTOP
                    } else {
                        QUEUED_BACKSTOP
                    };
                    self.wait(until_ms, backstop).await;
                }
            }
        }
        Ok(Flow::Continue)
    }

    /// Waits for a wake-up (SIGUSR1: a launch slot, a cancel, the Pod watch), the workload's own
    /// change, `until_ms` (ms since epoch), or `backstop`, whichever comes first.
    async fn wait(&mut self, until_ms: Option<i64>, backstop: Duration) {
        let until = until_ms
            .map(|t| Duration::from_millis((t - now_ms()).max(0) as u64))
            .unwrap_or(backstop)
            .min(backstop);
        tokio::select! {
            _ = self.wake.recv() => {}
            _ = self.executor.changed() => {}
            _ = tokio::time::sleep(until) => {}
        }
    }

    /// Applies a transition and wakes the operator. A conflict is logged and returns false; the
    /// loop re-reads the row and decides on what it holds now.
    fn set(&mut self, job: &JobRow, t: &Transition) -> Result<bool, StoreError> {
        let applied = match self.store.transition(job.id, t)? {
            Cas::Applied(row) => {
                tracing::info!(
                    phase = %row.phase, schedule = %row.schedule_state, reason = %t.change.reason(),
                    message = %row.message, "transition"
                );
                true
            }
            Cas::Conflict(row) => {
                tracing::info!(
                    phase = %row.phase, schedule = %row.schedule_state, wanted = %t.change.reason(),
                    "transition skipped: the job moved on"
                );
                false
            }
        };
        self.waker.wake(job.id);
        Ok(applied)
    }
}
