//! The job controller process: one per admitted job (`managed-jobs job-controller --state-dir DIR
//! --job-id N`), started by the operator in a session of its own. It drives its job through
//! Submitted -> Starting -> Running -> a terminal phase, restarts it after errors (with a stored
//! back-off), relaunches it after the workload was lost, and cancels it on request.
//!
//! It is resumable: every step re-reads the job's row and acts on what it finds, so a fresh
//! process started after a crash re-attaches to the running workload (or finds how it ended)
//! instead of launching it again. It makes no API calls for local jobs and holds one SQLite
//! connection with a small page cache.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::api::{ExecutorKind, JobPhase, ScheduleState, validate_spec};
use crate::executor::Outcome;
use crate::executor::local::{Found, LocalExecutor, LocalWorkload};
use crate::executor::pod;
use crate::store::{Cas, Change, Expect, JobRow, Store, now_ms};
use crate::wake::OperatorWaker;
use k8s_openapi::api::core::v1::Pod;

/// Store settings the operator writes for its job controllers.
pub mod settings {
    /// Comma-separated executors enabled (`local`, `pod`).
    pub const EXECUTORS: &str = "executors";
    /// Grace between SIGTERM and SIGKILL when stopping a workload, ms.
    pub const CANCEL_GRACE_MS: &str = "cancel_grace_ms";
    /// First restart back-off, ms; doubles per restart up to [`super::MAX_BACKOFF`].
    pub const RESTART_BACKOFF_MS: &str = "restart_backoff_ms";
}

/// Longest back-off between restarts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// Page cache of a job controller's SQLite connection, KiB (it touches one row at a time).
pub const CACHE_KIB: u32 = 64;

/// Back-off before restart number `restart` (1-based): base x 2^(restart-1), capped.
pub fn backoff(base: Duration, restart: i32) -> Duration {
    let factor = 1u32 << (restart.clamp(1, 16) - 1) as u32;
    base.saturating_mul(factor).min(MAX_BACKOFF)
}

struct JobController {
    store: Store,
    job_id: i64,
    local: LocalExecutor,
    waker: OperatorWaker,
    wake: Signal,
    grace: Duration,
    backoff_base: Duration,
    executors: Vec<ExecutorKind>,
    workload: Option<(i32, LocalWorkload)>,
    kube: Option<kube::Client>,
}

/// Entry point of `managed-jobs job-controller`. Returns when the job is Done.
pub async fn run(state_dir: PathBuf, job_id: i64) -> anyhow::Result<()> {
    // One driver per job: a process started while an older one still runs (e.g. after an
    // operator crash between start and record) waits here and takes over when that one ends.
    let run_dir = state_dir.join("run");
    std::fs::create_dir_all(&run_dir)?;
    let lock_file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(run_dir.join(format!("{job_id}.lock")))?;
    let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| anyhow::anyhow!("locking job {job_id}: {e}"))?;
    // Install the wake-up handler, then let the (held) SIGUSR1 through.
    let wake = signal(SignalKind::user_defined1()).context("installing the SIGUSR1 handler")?;
    crate::process::set_sigusr1_blocked(false);
    let store = Store::open(&state_dir.join(crate::STORE_FILE), CACHE_KIB)
        .with_context(|| format!("opening the store in {}", state_dir.display()))?;
    let ms = |key: &str, default: u64| -> Duration {
        let v = store
            .setting(key)
            .ok()
            .flatten()
            .and_then(|v| v.parse().ok());
        Duration::from_millis(v.unwrap_or(default))
    };
    let grace = ms(settings::CANCEL_GRACE_MS, 5_000);
    let backoff_base = ms(settings::RESTART_BACKOFF_MS, 1_000);
    let executors = store
        .setting(settings::EXECUTORS)?
        .unwrap_or_else(|| "local".into())
        .split(',')
        .filter_map(ExecutorKind::parse)
        .collect();
    let mut jc = JobController {
        store,
        job_id,
        local: LocalExecutor::new(&state_dir),
        waker: OperatorWaker::new(&state_dir),
        wake,
        grace,
        backoff_base,
        executors,
        workload: None,
        kube: None,
    };
    tracing::info!(job_id, pid = std::process::id(), "job controller started");
    jc.drive().await
}

impl JobController {
    async fn drive(&mut self) -> anyhow::Result<()> {
        loop {
            let job = self.store.get(self.job_id)?;
            if job.schedule_state == ScheduleState::Done {
                tracing::info!(phase = %job.phase, "job is done");
                return Ok(());
            }
            if job.cancel_requested {
                self.cancel(job).await?;
                continue;
            }
            match job.schedule_state {
                ScheduleState::Launching => self.launch(job).await?,
                ScheduleState::Alive => self.alive(job).await?,
                // Waiting for the operator to grant a launch slot (or to admit us at all).
                _ => self.sleep_until_woken(Duration::from_secs(5)).await,
            }
        }
    }

    async fn sleep_until_woken(&mut self, backstop: Duration) {
        tokio::select! {
            _ = self.wake.recv() => {}
            _ = tokio::time::sleep(backstop) => {}
        }
    }

    /// Applies a transition and wakes the operator. A conflict is logged; the caller's loop
    /// re-reads the row and acts on what it holds now.
    fn set(&mut self, job: &JobRow, expect: Expect, change: Change) -> anyhow::Result<bool> {
        let applied = match self.store.transition(job.id, &expect, &change)? {
            Cas::Applied(row) => {
                tracing::info!(
                    phase = %row.phase, schedule = %row.schedule_state, reason = change.reason,
                    message = %row.message, "transition"
                );
                true
            }
            Cas::Conflict(row) => {
                tracing::info!(
                    phase = %row.phase, schedule = %row.schedule_state, wanted = change.reason,
                    "transition skipped: the job moved on"
                );
                false
            }
        };
        self.waker.wake(job.id);
        Ok(applied)
    }

    fn fail(
        &mut self,
        job: &JobRow,
        phase: JobPhase,
        reason: &str,
        message: String,
    ) -> anyhow::Result<bool> {
        self.set(
            job,
            Expect::schedule(&[job.schedule_state]),
            Change {
                phase: Some(phase),
                schedule: Some(ScheduleState::Done),
                failure_reason: Some(Some(reason.to_string())),
                message: Some(message),
                reason: "Failed",
                ..Default::default()
            },
        )
    }

    /// Holding a launch slot: start (or adopt) the current attempt's workload.
    async fn launch(&mut self, job: JobRow) -> anyhow::Result<()> {
        let attempt = job.attempt.max(1);
        let first = matches!(job.phase, JobPhase::Pending | JobPhase::Submitted);
        let starting = Change {
            phase: Some(JobPhase::Starting),
            attempt: Some(attempt),
            message: Some(format!("launching attempt {attempt}")),
            reason: "Starting",
            ..Default::default()
        };
        if let Err(why) = validate_spec(&job.spec) {
            self.fail(&job, JobPhase::FailedPrecheck, "InvalidSpec", why)?;
            return Ok(());
        }
        if !self.executors.contains(&job.executor) {
            let msg = format!(
                "the {} executor is not enabled in this operator (enabled: {}); start it with --executors including {}",
                job.executor,
                self.executors
                    .iter()
                    .map(|e| e.as_str())
                    .collect::<Vec<_>>()
                    .join(","),
                job.executor
            );
            self.fail(&job, JobPhase::FailedPrecheck, "ExecutorDisabled", msg)?;
            return Ok(());
        }
        if job.executor == ExecutorKind::Pod {
            if first {
                self.set(
                    &job,
                    Expect::exactly(job.phase, ScheduleState::Launching),
                    starting,
                )?;
                return Ok(());
            }
            return self.pod_step(job, attempt).await;
        }
        // A first launch records Starting and the launch intent in one transaction.
        let phase_after = if first { JobPhase::Starting } else { job.phase };
        // The launch intent is recorded before the spawn: an attempt without it never started, so
        // only a resumed launch needs to look for its process (a scan of /proc) or exit file.
        let found = if job.launched_attempt >= attempt {
            self.local.find(job.id, attempt)
        } else {
            Found::Missing
        };
        match found {
            Found::Exited(outcome) => return self.finish_attempt(job, attempt, outcome),
            Found::Running(w) => {
                tracing::info!(attempt, pid = w.pid, "adopted the running workload");
                self.workload = Some((attempt, w));
            }
            Found::Missing if job.launched_attempt >= attempt => {
                let outcome = Outcome::Lost {
                    reason: "the workload vanished before it recorded an exit code".into(),
                };
                return self.finish_attempt(job, attempt, outcome);
            }
            Found::Missing => {
                // Record the intent before the create, so a crash in between is never a
                // second launch of the same attempt.
                let intent = if first {
                    Change {
                        launched_attempt: Some(attempt),
                        ..starting
                    }
                } else {
                    Change {
                        launched_attempt: Some(attempt),
                        reason: "Launch",
                        ..Default::default()
                    }
                };
                if !self.set(
                    &job,
                    Expect::exactly(job.phase, ScheduleState::Launching),
                    intent,
                )? {
                    return Ok(());
                }
                match self.local.launch(&job, attempt) {
                    Ok(w) => self.workload = Some((attempt, w)),
                    Err(e) => {
                        self.fail(
                            &job,
                            JobPhase::FailedPrecheck,
                            "LaunchFailed",
                            format!("could not start the workload: {e}"),
                        )?;
                        return Ok(());
                    }
                }
            }
        }
        let describe = self.workload.as_ref().map(|(_, w)| w.describe());
        let message = match job.phase {
            JobPhase::Recovering => format!("running attempt {attempt} (relaunched)"),
            _ => format!("running attempt {attempt}"),
        };
        self.set(
            &job,
            Expect::exactly(phase_after, ScheduleState::Launching),
            Change {
                phase: Some(JobPhase::Running),
                schedule: Some(ScheduleState::Alive),
                attempt: Some(attempt),
                workload: Some(describe),
                started_now: true,
                message: Some(message),
                reason: "Running",
                ..Default::default()
            },
        )?;
        Ok(())
    }

    /// Alive: watch the running attempt, or wait out a restart back-off.
    async fn alive(&mut self, job: JobRow) -> anyhow::Result<()> {
        let attempt = job.attempt.max(1);
        if job.phase == JobPhase::Recovering {
            let wait_ms = job.backoff_until_ms.unwrap_or(0) - now_ms();
            if wait_ms > 0 {
                self.sleep_until_woken(Duration::from_millis(wait_ms as u64))
                    .await;
                return Ok(());
            }
            self.set(
                &job,
                Expect::exactly(JobPhase::Recovering, ScheduleState::Alive),
                Change {
                    schedule: Some(ScheduleState::AliveWaiting),
                    backoff_until_ms: Some(None),
                    message: Some(format!(
                        "waiting for a launch slot to start attempt {attempt}"
                    )),
                    reason: "WaitingForLaunchSlot",
                    ..Default::default()
                },
            )?;
            return Ok(());
        }
        if job.executor == ExecutorKind::Pod {
            return self.pod_step(job, attempt).await;
        }
        if self.workload.as_ref().map(|(a, _)| *a) != Some(attempt) {
            self.workload = None;
            match self.local.find(job.id, attempt) {
                Found::Running(w) => self.workload = Some((attempt, w)),
                Found::Exited(outcome) => return self.finish_attempt(job, attempt, outcome),
                Found::Missing => {
                    let outcome = Outcome::Lost {
                        reason: "the workload's process group is gone".into(),
                    };
                    return self.finish_attempt(job, attempt, outcome);
                }
            }
        }
        let deadline = job.spec.active_deadline_seconds.map(|s| {
            let end_ms = job.started_at_ms.unwrap_or(job.submitted_at_ms) + s * 1000;
            Duration::from_millis((end_ms - now_ms()).max(0) as u64)
        });
        let (_, workload) = self.workload.as_mut().expect("set above");
        tokio::select! {
            outcome = workload.wait() => {
                self.workload = None;
                self.finish_attempt(job, attempt, outcome)?;
            }
            _ = self.wake.recv() => {} // re-read: a cancel may have been requested
            _ = tokio::time::sleep(deadline.unwrap_or(Duration::MAX)), if deadline.is_some() => {
                workload.stop(self.grace).await;
                self.workload = None;
                let secs = job.spec.active_deadline_seconds.unwrap_or_default();
                self.fail(&job, JobPhase::Failed, "DeadlineExceeded",
                    format!("stopped: the job ran past activeDeadlineSeconds ({secs} s)"))?;
            }
        }
        Ok(())
    }

    /// Decides what an ended attempt means: success, a restart, a recovery, or a failure.
    fn finish_attempt(
        &mut self,
        job: JobRow,
        attempt: i32,
        outcome: Outcome,
    ) -> anyhow::Result<()> {
        tracing::info!(attempt, ?outcome, "attempt ended");
        let expect = Expect::exactly(job.phase, job.schedule_state);
        let change = match outcome {
            Outcome::Succeeded => Change {
                phase: Some(JobPhase::Succeeded),
                schedule: Some(ScheduleState::Done),
                exit_code: Some(Some(0)),
                failure_reason: Some(None),
                message: Some(format!("succeeded on attempt {attempt}")),
                reason: "Succeeded",
                ..Default::default()
            },
            Outcome::Failed { code, ref reason } | Outcome::SetupFailed { code, ref reason } => {
                let setup = matches!(outcome, Outcome::SetupFailed { .. });
                let what = if setup { "setup" } else { "run" };
                let max = job.spec.recovery.max_restarts_on_errors;
                if job.restart_count < max {
                    let restart = job.restart_count + 1;
                    let wait = backoff(self.backoff_base, restart);
                    Change {
                        phase: Some(JobPhase::Recovering),
                        schedule: Some(ScheduleState::Alive),
                        attempt: Some(attempt + 1),
                        restart_count: Some(restart),
                        exit_code: Some(Some(code)),
                        failure_reason: Some(Some(reason.clone())),
                        backoff_until_ms: Some(Some(now_ms() + wait.as_millis() as i64)),
                        message: Some(format!(
                            "attempt {attempt} {what} exited with code {code}; restarting in {:.1} s (restart {restart} of {max})",
                            wait.as_secs_f64()
                        )),
                        reason: "Restarting",
                        ..Default::default()
                    }
                } else {
                    Change {
                        phase: Some(if setup {
                            JobPhase::FailedSetup
                        } else {
                            JobPhase::Failed
                        }),
                        schedule: Some(ScheduleState::Done),
                        exit_code: Some(Some(code)),
                        failure_reason: Some(Some(reason.clone())),
                        message: Some(format!(
                            "attempt {attempt} {what} exited with code {code} ({reason}); restarts exhausted ({max} allowed)"
                        )),
                        reason: "Failed",
                        ..Default::default()
                    }
                }
            }
            Outcome::Lost { reason } => match job.spec.recovery.max_recoveries {
                Some(max) if job.recovery_count >= max => Change {
                    phase: Some(JobPhase::Failed),
                    schedule: Some(ScheduleState::Done),
                    failure_reason: Some(Some("RecoveryBudgetSpent".into())),
                    message: Some(format!(
                        "attempt {attempt} was lost ({reason}) and the recovery budget is spent (maxRecoveries {max})"
                    )),
                    reason: "Failed",
                    ..Default::default()
                },
                _ => Change {
                    phase: Some(JobPhase::Recovering),
                    schedule: Some(ScheduleState::AliveWaiting),
                    attempt: Some(attempt + 1),
                    recovery_count: Some(job.recovery_count + 1),
                    message: Some(format!(
                        "recovering: attempt {attempt} was lost ({reason}); waiting for a launch slot (recovery {})",
                        job.recovery_count + 1
                    )),
                    reason: "Recovering",
                    ..Default::default()
                },
            },
        };
        self.set(&job, expect, change)?;
        Ok(())
    }

    async fn client(&mut self) -> anyhow::Result<kube::Client> {
        if self.kube.is_none() {
            self.kube = Some(kube::Client::try_default().await?);
        }
        Ok(self.kube.clone().expect("set above"))
    }

    /// Creates the attempt's Pod; AlreadyExists adopts it. Returns Err(message) when the API
    /// refuses it for good (quota, admission, invalid template).
    async fn create_pod(
        &mut self,
        job: &JobRow,
        attempt: i32,
    ) -> anyhow::Result<Result<(), String>> {
        let api: kube::Api<Pod> = kube::Api::namespaced(self.client().await?, &job.namespace);
        let pod = pod::build_pod(job, attempt);
        let mut delay = Duration::from_millis(200);
        loop {
            match api.create(&kube::api::PostParams::default(), &pod).await {
                Ok(_) => return Ok(Ok(())),
                Err(kube::Error::Api(e)) if e.code == 409 => return Ok(Ok(())),
                Err(kube::Error::Api(e)) if matches!(e.code, 400 | 403 | 404 | 422) => {
                    return Ok(Err(e.message));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "creating the Pod failed; retrying in {delay:?}");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(10));
                }
            }
        }
    }

    /// One step of a pod job: create the attempt's Pod if needed, then act on what the
    /// operator's Pod watch last saw of it.
    async fn pod_step(&mut self, job: JobRow, attempt: i32) -> anyhow::Result<()> {
        let launching = job.schedule_state == ScheduleState::Launching;
        let observed = self.store.pod_observation(job.id, attempt)?;
        let Some(o) = observed else {
            if launching && job.launched_attempt < attempt {
                let intent = Change {
                    launched_attempt: Some(attempt),
                    reason: "Launch",
                    ..Default::default()
                };
                if !self.set(&job, Expect::exactly(job.phase, job.schedule_state), intent)? {
                    return Ok(());
                }
            }
            // Idempotent: after a crash this adopts the Pod if it was created.
            if let Err(message) = self.create_pod(&job, attempt).await? {
                self.fail(
                    &job,
                    JobPhase::FailedPrecheck,
                    "PodRejected",
                    format!("the API refused the Pod: {message}"),
                )?;
                return Ok(());
            }
            self.sleep_until_woken(Duration::from_secs(10)).await;
            return Ok(());
        };
        if let Some(outcome) = pod::outcome(&o) {
            return self.finish_attempt(job, attempt, outcome);
        }
        let name = format!("pod/{}", o.pod_name);
        match o.state.as_str() {
            "running" if launching || job.phase != JobPhase::Running => {
                self.set(
                    &job,
                    Expect::exactly(job.phase, job.schedule_state),
                    Change {
                        phase: Some(JobPhase::Running),
                        schedule: Some(ScheduleState::Alive),
                        attempt: Some(attempt),
                        workload: Some(Some(name)),
                        started_now: true,
                        message: Some(format!("running attempt {attempt} in {}", o.pod_name)),
                        reason: "Running",
                        ..Default::default()
                    },
                )?;
                return Ok(());
            }
            "unschedulable" => {
                // Waiting on the cluster must not hold a launch slot: keep the run slot only.
                let message = format!("waiting for a node for Pod {}: {}", o.pod_name, o.message);
                if launching || job.message != message {
                    self.set(
                        &job,
                        Expect::exactly(job.phase, job.schedule_state),
                        Change {
                            schedule: Some(ScheduleState::Alive),
                            workload: Some(Some(name)),
                            message: Some(message),
                            reason: "Unschedulable",
                            ..Default::default()
                        },
                    )?;
                    return Ok(());
                }
            }
            _ => {}
        }
        let deadline = job.spec.active_deadline_seconds.and_then(|s| {
            let start = job.started_at_ms?;
            Some(Duration::from_millis(
                (start + s * 1000 - now_ms()).max(0) as u64
            ))
        });
        tokio::select! {
            _ = self.wake.recv() => {}
            _ = tokio::time::sleep(Duration::from_secs(30)) => {}
            _ = tokio::time::sleep(deadline.unwrap_or(Duration::MAX)), if deadline.is_some() => {
                self.stop_pods(&job).await?;
                let secs = job.spec.active_deadline_seconds.unwrap_or_default();
                self.fail(&job, JobPhase::Failed, "DeadlineExceeded",
                    format!("stopped: the job ran past activeDeadlineSeconds ({secs} s)"))?;
            }
        }
        Ok(())
    }

    /// Deletes every attempt's Pod (each with its own grace period); true once all are gone.
    async fn stop_pods(&mut self, job: &JobRow) -> anyhow::Result<bool> {
        let api: kube::Api<Pod> = kube::Api::namespaced(self.client().await?, &job.namespace);
        let mut all_gone = true;
        for attempt in 1..=job.attempt.max(job.launched_attempt) {
            let name = pod::pod_name(&job.name, job.id, attempt);
            let observed = self.store.pod_observation(job.id, attempt)?;
            if observed.as_ref().is_some_and(|o| o.deleted) {
                continue;
            }
            match api.delete(&name, &kube::api::DeleteParams::default()).await {
                Ok(_) => all_gone = false,
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    tracing::warn!(pod = %name, error = %e, "deleting the Pod failed");
                    all_gone = false;
                }
            }
        }
        if !all_gone {
            self.sleep_until_woken(Duration::from_secs(5)).await;
        }
        Ok(all_gone)
    }

    /// Cancel requested: Cancelling, stop the workload and wait until it is gone, Cancelled.
    async fn cancel(&mut self, job: JobRow) -> anyhow::Result<()> {
        if job.phase != JobPhase::Cancelling {
            self.set(
                &job,
                Expect::exactly(job.phase, job.schedule_state),
                Change {
                    phase: Some(JobPhase::Cancelling),
                    message: Some("cancelling: stopping the workload".into()),
                    reason: "Cancelling",
                    ..Default::default()
                },
            )?;
            return Ok(());
        }
        if job.executor == ExecutorKind::Pod && !self.stop_pods(&job).await? {
            return Ok(()); // not gone yet: woken when the watch sees them go
        }
        match self.workload.take() {
            Some((_, mut w)) => w.stop(self.grace).await,
            None if job.executor == ExecutorKind::Local && job.attempt > 0 => {
                self.local.stop(job.id, job.attempt, self.grace).await
            }
            None => {}
        }
        self.set(
            &job,
            Expect::exactly(JobPhase::Cancelling, job.schedule_state),
            Change {
                phase: Some(JobPhase::Cancelled),
                schedule: Some(ScheduleState::Done),
                message: Some("cancelled; the workload is stopped".into()),
                reason: "Cancelled",
                ..Default::default()
            },
        )?;
        Ok(())
    }
}

/// The log file of job `job_id`'s controller process.
pub fn log_path(state_dir: &Path, job_id: i64) -> PathBuf {
    state_dir.join("logs").join(format!("{job_id}.log"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let base = Duration::from_secs(1);
        assert_eq!(backoff(base, 1), Duration::from_secs(1));
        assert_eq!(backoff(base, 3), Duration::from_secs(4));
        assert_eq!(backoff(base, 30), MAX_BACKOFF);
    }
}
