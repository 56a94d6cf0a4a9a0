//! The engine: store, scheduling passes and job controller processes, without Kubernetes.
//!
//! It owns the state dir (exclusive lock), runs a scheduling pass on every wake-up (a datagram
//! from a job controller, a child's exit, a new job, a cancel) and every [`BACKSTOP`], starts job
//! controller processes in sessions of their own, notices their exit at once (the engine is their
//! parent, or holds a pidfd after a restart) and resumes their jobs. The [`crate::operator`] adds
//! the Kubernetes side (watch, finalizer, status writes); tests drive the engine directly.

use std::fs::OpenOptions;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};
use tokio::sync::Notify;

use crate::api::{ExecutorKind, JobPhase, ScheduleState};
use crate::capacity::Capacity;
use crate::executor::Executor as _;
use crate::executor::local::LocalExecutor;
use crate::lifecycle::{self, ControllerExit, ExitSeen};
use crate::metrics::{Metrics, ReasonLabel};
use crate::process;
use crate::scheduler;
use crate::state_dir::StateDir;
use crate::store::{Cas, JobRow, Settings, Store, StoreError};

/// Period of the backstop scheduling pass and status sweep.
pub const BACKSTOP: Duration = Duration::from_secs(5);
/// SQLite page cache of the engine's connection, KiB.
pub const ENGINE_CACHE_KIB: u32 = 8 * 1024;

/// Engine configuration (from `managed-jobs run` flags).
#[derive(Clone, Debug)]
pub struct Config {
    /// Holds the store, logs, the lock and the wake-up socket.
    pub state_dir: PathBuf,
    /// Watch only this namespace (None = all).
    pub namespace: Option<String>,
    /// Executors enabled.
    pub executors: Vec<ExecutorKind>,
    /// Caps in force.
    pub capacity: Capacity,
    /// Grace between SIGTERM and SIGKILL when stopping a workload.
    pub cancel_grace: Duration,
    /// First restart back-off (doubles per restart).
    pub restart_backoff: Duration,
    /// Job controller exits before Done that end a job as FailedController.
    pub max_controller_crashes: i64,
    /// How long a launched workload may take to start running (a job's
    /// `spec.launchTimeoutSeconds` overrides it).
    pub launch_timeout: Duration,
    /// Launch timeouts in a row that end a job FailedNoResource (at least 1).
    pub max_launch_timeouts: i32,
    /// The `managed-jobs` binary used to start job controllers.
    pub self_exe: PathBuf,
    /// The shard this operator owns (`--shard`): None for the default instance.
    pub shard: Option<String>,
}

/// Shared state of the engine's tasks.
pub struct Engine {
    cfg: Config,
    dir: StateDir,
    store: Mutex<Store>,
    schedule: Notify,
    /// Notified whenever a job's status may have changed (the operator's status writer waits on it).
    pub status_changed: Notify,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Jobs whose job controller could not be started for lack of resources, with the failures
    /// in a row (each retried after a back-off).
    spawn_retries: Mutex<std::collections::HashMap<i64, i32>>,
    _lock: Flock<std::fs::File>,
}

/// First back-off before starting a job controller again after the node lacked the resources
/// (EMFILE, ENFILE, EAGAIN, ENOMEM); doubles per failure in a row up to
/// [`crate::lifecycle::MAX_BACKOFF`].
pub const SPAWN_RETRY_BASE: Duration = Duration::from_millis(500);

/// True when `e` says the node lacked the resources to start a process (open files, processes,
/// memory): the job is not at fault and must not fail for it. SkyPilot's first managed-jobs
/// scheduler failed jobs for exactly this (controller resources).
pub fn lacks_resources(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<std::io::Error>())
        .any(|io| {
            matches!(
                io.raw_os_error(),
                Some(libc::EMFILE | libc::ENFILE | libc::EAGAIN | libc::ENOMEM)
            )
        })
}

/// One shard per state dir: a store that holds jobs belongs to the shard recorded in its
/// settings, and another shard must not drive them. An empty store is claimed for `shard` (its
/// settings record it) before anything else is written to it, a rebuild from the API included.
///
/// Errors: the store belongs to another shard, or cannot be read or written.
pub fn claim_for_shard(
    store: &mut Store,
    state_dir: &std::path::Path,
    shard: Option<&str>,
) -> anyhow::Result<()> {
    let mut settings = store.settings()?;
    if store.job_count()? > 0 {
        anyhow::ensure!(
            settings.shard.as_deref() == shard,
            "the state dir {} belongs to {}, not to {}: give each shard its own --state-dir",
            state_dir.display(),
            shard_name(settings.shard.as_deref()),
            shard_name(shard)
        );
    } else if settings.shard.as_deref() != shard {
        settings.shard = shard.map(str::to_string);
        store.set_settings(&settings)?;
    }
    Ok(())
}

/// `shard NAME`, or `the default shard`: how logs and errors name a shard.
pub fn shard_name(shard: Option<&str>) -> String {
    match shard {
        Some(name) => format!("shard {name}"),
        None => "the default shard".into(),
    }
}

/// Takes the state dir's exclusive lock, or fails naming the holder's lock file.
pub fn lock_state_dir(dir: &StateDir) -> anyhow::Result<Flock<std::fs::File>> {
    dir.create()?;
    let path = dir.operator_lock();
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|_| {
        anyhow::anyhow!(
            "another operator holds {} (two operators must never drive one state dir)",
            path.display()
        )
    })
}

impl Engine {
    /// Takes the state dir, opens the store, shares settings with job controllers, adopts or
    /// resumes live jobs, and starts the wake-up listener and the scheduler loop.
    pub fn start(cfg: Config) -> anyhow::Result<Arc<Engine>> {
        let lock = lock_state_dir(&StateDir::new(&cfg.state_dir))?;
        Engine::start_locked(cfg, lock)
    }

    /// [`Engine::start`] with the state dir's lock already taken (the operator takes it first,
    /// to rebuild a lost store before the engine starts).
    pub fn start_locked(cfg: Config, lock: Flock<std::fs::File>) -> anyhow::Result<Arc<Engine>> {
        let dir = StateDir::new(&cfg.state_dir);
        let mut store = Store::open(&dir.store(), ENGINE_CACHE_KIB)?;
        store.keep_statements(crate::store::STATEMENT_CACHE);
        claim_for_shard(&mut store, &cfg.state_dir, cfg.shard.as_deref())?;
        let executors: Vec<&str> = cfg.executors.iter().map(|e| e.as_str()).collect();
        let caps = cfg.capacity.caps;
        store.set_settings(&Settings {
            executors: cfg.executors.clone(),
            cancel_grace_ms: cfg.cancel_grace.as_millis() as u64,
            restart_backoff_ms: cfg.restart_backoff.as_millis() as u64,
            caps: Some(caps),
            launch_timeout_ms: cfg.launch_timeout.as_millis() as u64,
            max_launch_timeouts: cfg.max_launch_timeouts,
            capacity: Some(cfg.capacity.to_string()),
            shard: cfg.shard.clone(),
        })?;
        tracing::info!(
            launch_cap = caps.launch,
            run_cap = caps.run,
            executors = %executors.join(","),
            state_dir = %cfg.state_dir.display(),
            "caps in force: {}",
            cfg.capacity
        );
        let socket = bind_socket(&dir)?;
        let caps_gauge = (caps.launch as i64, caps.run as i64);
        let metrics = Metrics::for_shard(cfg.shard.as_deref());
        let engine = Arc::new(Engine {
            cfg,
            dir,
            store: Mutex::new(store),
            schedule: Notify::new(),
            status_changed: Notify::new(),
            metrics: Arc::new(metrics),
            spawn_retries: Mutex::new(Default::default()),
            _lock: lock,
        });
        engine.metrics.launch_cap.set(caps_gauge.0);
        engine.metrics.run_cap.set(caps_gauge.1);
        tokio::spawn(listen(engine.clone(), socket));
        engine.startup_sweep()?;
        tokio::spawn(scheduler_loop(engine.clone()));
        Ok(engine)
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The state dir.
    pub fn state_dir(&self) -> &StateDir {
        &self.dir
    }

    /// The store (one connection shared by the engine's tasks).
    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks for a scheduling pass and a status sweep.
    pub fn wake_all(&self) {
        self.schedule.notify_one();
        self.status_changed.notify_one();
    }

    /// Persists a cancel request and acts on it: a queued job ends Cancelled at once, a live
    /// job's controller is woken to stop its workload.
    pub fn cancel(&self, row: JobRow, deleting: bool) -> Result<JobRow, StoreError> {
        let mut row = self.store().request_cancel(row.id, deleting)?;
        tracing::info!(job_id = row.id, job = %row.key(), schedule = %row.schedule_state, "cancel requested");
        match row.schedule_state {
            ScheduleState::Inactive | ScheduleState::Waiting => {
                let result = self
                    .store()
                    .transition(row.id, &lifecycle::cancel_queued(&row))?;
                match result {
                    Cas::Applied(r) => row = *r,
                    // Admitted meanwhile: its controller will see the persisted request.
                    Cas::Conflict(r) => {
                        row = *r;
                        self.wake_controller(&row);
                    }
                }
            }
            ScheduleState::Done => {}
            _ => self.wake_controller(&row),
        }
        self.wake_all();
        Ok(row)
    }

    /// Sends SIGUSR1 to the job's controller process, if it is the recorded one.
    pub fn wake_controller(&self, row: &JobRow) {
        if let (Some(pid), Some(start)) = (row.controller_pid, row.controller_start_time) {
            process::signal_if_alive(pid, start, nix::sys::signal::Signal::SIGUSR1);
        }
    }

    /// Starts a job controller process for `row` in a session of its own, records its pid and
    /// start time, and supervises it.
    fn spawn_controller(self: &Arc<Self>, row: &JobRow) {
        match self.try_spawn(row) {
            Ok((pid, start, child)) => {
                self.spawn_retries
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&row.id);
                let op = self.clone();
                let id = row.id;
                tokio::spawn(async move {
                    let mut child = child;
                    let _ = child.wait().await;
                    op.on_controller_exit(id, pid, start, ExitSeen::WhileOperatorRan);
                });
            }
            Err(e) if lacks_resources(&e) => {
                // Not the job's fault: it keeps its place (and slots) and is started again after
                // a back-off; never a failure phase.
                let failures = {
                    let mut retries = self.spawn_retries.lock().unwrap_or_else(|e| e.into_inner());
                    let n = retries.entry(row.id).or_insert(0);
                    *n += 1;
                    *n
                };
                let wait = lifecycle::backoff(SPAWN_RETRY_BASE, failures);
                tracing::warn!(job_id = row.id, error = %e, failures, retry_in = ?wait, "the node lacks the resources to start a job controller; retrying");
                self.metrics.controller_spawns_deferred_total.inc();
                let op = self.clone();
                let id = row.id;
                tokio::spawn(async move {
                    tokio::time::sleep(wait).await;
                    let row = op.store().find(id).ok().flatten();
                    if let Some(row) = row
                        && row.schedule_state.holds_run_slot()
                        && row.controller_pid.is_none()
                    {
                        op.spawn_controller(&row);
                    }
                });
            }
            Err(e) => {
                tracing::error!(job_id = row.id, error = %e, "could not start a job controller process");
                let error = e.to_string();
                let _ = self.store().apply(row.id, |now| {
                    Some(lifecycle::controller_start_failed(now, &error))
                });
                self.wake_all();
            }
        }
    }

    fn try_spawn(&self, row: &JobRow) -> anyhow::Result<(i32, u64, tokio::process::Child)> {
        let log_path = self.dir.controller_log(row.id);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        let mut cmd = std::process::Command::new(&self.cfg.self_exe);
        cmd.arg("job-controller")
            .arg("--state-dir")
            .arg(&self.cfg.state_dir)
            .arg("--job-id")
            .arg(row.id.to_string())
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // SAFETY: setsid and sigprocmask are async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                nix::unistd::setsid().map_err(std::io::Error::from)?;
                process::set_sigusr1_blocked(true);
                Ok(())
            });
        }
        let child = tokio::process::Command::from(cmd).spawn()?;
        let pid = child
            .id()
            .ok_or_else(|| anyhow::anyhow!("child has no pid"))? as i32;
        let start = process::start_time(pid).unwrap_or(0);
        // The new process may already have moved the job on (Starting, Running): decided on
        // the row as it is when written, in one transaction.
        self.store().apply(row.id, |now| {
            Some(lifecycle::controller_started(now, pid, start))
        })?;
        tracing::info!(job_id = row.id, pid, "job controller process started");
        if row.phase == JobPhase::Pending {
            let waited = (crate::lifecycle::now_ms() - row.submitted_at_ms).max(0) as f64 / 1000.0;
            self.metrics.submit_to_launch_seconds.observe(waited);
        }
        self.status_changed.notify_one();
        Ok((pid, start, child))
    }

    /// A job controller process exited. If the job is not Done it crashed: resume it with a
    /// fresh process, or end it as FailedController after `max_controller_crashes`
    /// ([`lifecycle::controller_exited`] decides, in the store's transaction).
    fn on_controller_exit(self: &Arc<Self>, id: i64, pid: i32, start: u64, seen: ExitSeen) {
        self.wake_all();
        let max = self.cfg.max_controller_crashes;
        let mut decision = ControllerExit::Finished;
        let result = self.store().apply(id, |row| {
            decision = lifecycle::controller_exited(row, pid, max, seen);
            match &decision {
                ControllerExit::Finished => None,
                ControllerExit::Resume(t) | ControllerExit::GiveUp(t) => Some(t.clone()),
            }
        });
        let row = match result {
            Ok(Some(row)) => row,
            Ok(None) => {
                self.count_exit("done");
                return;
            }
            Err(e) => {
                tracing::error!(job_id = id, error = %e, "recording a job controller exit failed");
                return;
            }
        };
        self.count_exit("crashed");
        match decision {
            ControllerExit::GiveUp(_) => {
                tracing::error!(
                    job_id = id,
                    pid,
                    crashes = row.controller_crashes,
                    "job controller keeps exiting; failing the job"
                );
                if row.executor == ExecutorKind::Local {
                    let mut local = LocalExecutor::new(&self.dir);
                    let grace = self.cfg.cancel_grace;
                    tokio::spawn(async move {
                        let _ = local.stop(&row, grace).await;
                    });
                }
            }
            _ => {
                tracing::warn!(
                    job_id = id,
                    pid,
                    start,
                    crashes = row.controller_crashes,
                    "job controller process exited early; resuming the job"
                );
                self.spawn_controller(&row);
            }
        }
    }

    fn count_exit(&self, reason: &str) {
        self.metrics
            .controller_exits_total
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc();
    }

    /// At start: adopt live job controllers, resume jobs whose controller is gone or was never
    /// recorded (crash between the two writes), and finish queued cancels. Slots are recounted
    /// from the store by the first pass.
    fn startup_sweep(self: &Arc<Self>) -> Result<(), StoreError> {
        let live = self.store().live_jobs()?;
        for row in live {
            match (row.controller_pid, row.controller_start_time) {
                (Some(pid), Some(start)) if process::is_alive(pid, start) => {
                    tracing::info!(job_id = row.id, pid, "adopting a running job controller");
                    let op = self.clone();
                    let id = row.id;
                    tokio::spawn(async move {
                        process::wait_gone(pid, start).await;
                        op.on_controller_exit(id, pid, start, ExitSeen::WhileOperatorRan);
                    });
                }
                // It went away with the previous operator: a hand-over, not a crash.
                (Some(pid), start) => self.on_controller_exit(
                    row.id,
                    pid,
                    start.unwrap_or(0),
                    ExitSeen::AtOperatorStart,
                ),
                (None, _) => {
                    tracing::info!(
                        job_id = row.id,
                        "resuming a job that has no job controller process"
                    );
                    self.spawn_controller(&row);
                }
            }
        }
        let cancels = self.store().pending_cancels()?;
        for row in cancels {
            if let Err(e) = self.cancel(row, false) {
                tracing::error!(error = %e, "finishing a queued cancel failed");
            }
        }
        self.wake_all();
        Ok(())
    }
}

fn bind_socket(dir: &StateDir) -> anyhow::Result<tokio::net::UnixDatagram> {
    let path = dir.wake_socket();
    // We hold the state dir lock, so a socket file left here belongs to a dead operator.
    let _ = std::fs::remove_file(&path);
    Ok(tokio::net::UnixDatagram::bind(&path)?)
}

async fn listen(op: Arc<Engine>, socket: tokio::net::UnixDatagram) {
    let mut buf = [0u8; 64];
    loop {
        if socket.recv(&mut buf).await.is_ok() {
            op.wake_all();
        }
    }
}

async fn scheduler_loop(op: Arc<Engine>) {
    loop {
        tokio::select! {
            _ = op.schedule.notified() => {}
            _ = tokio::time::sleep(BACKSTOP) => {}
        }
        let started = std::time::Instant::now();
        let result = {
            let mut store = op.store();
            scheduler::pass(&mut store, op.cfg.capacity.caps)
        };
        op.metrics
            .scheduling_pass_seconds
            .observe(started.elapsed().as_secs_f64());
        match result {
            Ok(r) => {
                let acted = !r.started.is_empty() || !r.relaunched.is_empty();
                for row in r.started {
                    op.spawn_controller(&row);
                }
                for row in r.relaunched {
                    op.wake_controller(&row);
                }
                if acted {
                    op.status_changed.notify_one();
                }
            }
            Err(e) => tracing::error!(error = %e, "scheduling pass failed"),
        }
    }
}
