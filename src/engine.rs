//! The engine: store, scheduling passes and job controller processes, without Kubernetes.
//!
//! It owns the state dir (exclusive lock), runs a scheduling pass on every wake-up (a datagram
//! from a job controller, a child's exit, a new job, a cancel) and every [`BACKSTOP`], starts job
//! controller processes in sessions of their own, notices their exit at once (the engine is their
//! parent, or holds a pidfd after a restart) and resumes their jobs. The [`crate::operator`] adds
//! the Kubernetes side (watch, finalizer, status writes); tests drive the engine directly.

use std::fs::OpenOptions;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};
use tokio::sync::Notify;

use crate::api::{ExecutorKind, JobPhase};
use crate::capacity::Capacity;
use crate::executor::local::LocalExecutor;
use crate::lifecycle::nodes::NodeLoss;
use crate::lifecycle::world::{self, ControllerSeen, Fix, ProcessSeen};
use crate::lifecycle::{
    self, AfterSpawnFailure, AtStart, CancelRoute, ControllerExit, ExitSeen, JobRow, Liveness,
    SpawnFailure, StopAfterGiveUp,
};
use crate::metrics::{Metrics, ReasonLabel};
use crate::process;
use crate::queues::Queues;
use crate::scheduler;
use crate::state_dir::StateDir;
use crate::store::{Cas, Settings, Store, StoreError};

/// The running executable (Linux): what an operator starts its job controllers from, so that
/// they run its very build even after the binary's file was replaced (`docs/upgrades.md`).
pub const OWN_EXECUTABLE: &str = "/proc/self/exe";

/// The file descriptor at which a job controller finds its start gate
/// ([`process::spawn_in_session`]): it acts on its job only after the operator recorded its
/// start (or died), so every start is counted and `Submitted` always comes first.
pub const START_GATE_FD: std::os::fd::RawFd = 3;

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
    /// The `managed-jobs` binary job controllers are started from: [`OWN_EXECUTABLE`] for the
    /// operator (its own build, whatever happens to the file on disk), the binary's path in
    /// tests that drive the engine from another program.
    pub self_exe: PathBuf,
    /// The shard this operator owns (`--shard`): None for the default instance.
    pub shard: Option<String>,
    /// Multi-node jobs get a PodGroup with the gang policy where the API serves one
    /// (`--gang-scheduling auto`); false: never.
    pub gang_scheduling: bool,
    /// The queues come from the API (the operator): nothing is admitted until they are known
    /// ([`Engine::set_queues`]). False: one pool, no queue objects (the engine alone).
    pub queues_from_api: bool,
    /// Claims are in force (the operator, `lifecycle::claim`): job controllers launch only
    /// under a claim on their job's namespace that the operator renewed lately. False: the
    /// engine alone, without an API.
    pub claims: bool,
    /// Bytes of the end of each container's log a pod job's controller keeps per attempt
    /// (`--kept-log-bytes`; 0: none).
    pub kept_log_bytes: u64,
    /// How new launches, status writes and Events are paced while a burst of jobs arrives
    /// ([`crate::pacing`]; `--burst-*`).
    pub burst: crate::pacing::BurstPolicy,
}

/// Shared state of the engine's tasks.
pub struct Engine {
    cfg: Config,
    dir: StateDir,
    store: Mutex<Store>,
    schedule: Notify,
    /// Notified whenever a job's status may have changed (the operator's status writer waits on it).
    pub status_changed: Notify,
    /// Notified when the world may have left the store (a job given up while its workload
    /// may run on): the operator's world check runs soon instead of at its next period.
    pub world_changed: Notify,
    /// Orphaned processes being stopped by the world check (pid, start time): each is stopped
    /// once, never signalled again by a later check.
    stopping: Arc<Mutex<std::collections::HashSet<(i32, u64)>>>,
    /// Why the state dir cannot be written, while it cannot (None: it can).
    state_dir_problem: Mutex<Option<String>>,
    /// Notified when the state dir starts or stops failing.
    pub state_dir_changed: Notify,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Jobs whose job controller could not be started for lack of resources, with the failures
    /// in a row (each retried after a back-off).
    spawn_retries: Mutex<std::collections::HashMap<i64, i32>>,
    /// The queues in force; None until the operator listed them (nothing is admitted before:
    /// a queue's limits and namespaces hold from the first pass).
    queues: Mutex<Option<Arc<Queues>>>,
    /// The cluster's nodes and Pods, for the queues with pools (set by the operator once it
    /// watches them; None: not known, and no job of a queue with pools is admitted).
    cluster: Mutex<Option<Arc<dyn crate::resources::fit::ClusterView>>>,
    /// Pacing while a burst of jobs arrives.
    pub pacer: Arc<crate::pacing::Pacer>,
    _lock: Flock<std::fs::File>,
}

/// How long the engine waits before recording a job controller's exit again when the state
/// dir could not be written.
pub const STORAGE_RETRY: Duration = Duration::from_secs(2);

/// How often the engine probes its state dir ([`Engine::probe_state_dir`]).
pub const STATE_DIR_PROBE_PERIOD: Duration = Duration::from_secs(5);

/// Bytes the probe writes (and syncs) in the state dir: one page, about what a transition
/// costs the store.
pub const STATE_DIR_PROBE_BYTES: usize = 4096;

/// Why a job controller process could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// Its log could not be opened, or the process could not be created.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// It started, but could not be recorded (it was killed: unrecorded, it must not run).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl SpawnError {
    /// Why, as [`lifecycle::after_spawn_failure`] reads it: the node lacked the resources to
    /// start a process (open files, processes, memory: EMFILE, ENFILE, EAGAIN, ENOMEM) or the
    /// state dir could not be written (ENOSPC, EIO, EDQUOT, EROFS; SQLite's own) is not the
    /// job's fault; anything else is for good.
    pub fn why(&self) -> SpawnFailure {
        let not_the_jobs = match self {
            SpawnError::Io(io) => matches!(
                io.raw_os_error(),
                Some(
                    libc::EMFILE
                        | libc::ENFILE
                        | libc::EAGAIN
                        | libc::ENOMEM
                        | libc::ENOSPC
                        | libc::EIO
                        | libc::EDQUOT
                        | libc::EROFS
                )
            ),
            SpawnError::Store(e) => e.is_storage_failure(),
        };
        if not_the_jobs {
            SpawnFailure::NotTheJobs
        } else {
            SpawnFailure::ForGood
        }
    }
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

/// The job controller processes of the state dir `state_dir`: found by their command line, and
/// each leading its own session (a controller's child between fork and exec has the same
/// command line: signalling it would kill the workload it is about to become). Cost: a read of
/// each process's command line.
pub fn controller_processes(state_dir: &std::path::Path) -> Vec<ControllerSeen> {
    let dir = state_dir.to_string_lossy().into_owned();
    process::find_by_arguments(&["job-controller", "--state-dir", &dir])
        .into_iter()
        .filter(|pid| process::is_session_leader(*pid))
        .filter_map(|pid| {
            let args = process::cmdline(pid)?;
            let at = args.iter().position(|a| *a == "--state-dir")?;
            (args.get(at + 1)? == &dir).then_some(())?;
            Some(ControllerSeen {
                pid,
                start_time: process::start_time(pid)?,
                job_id: args.last()?.parse().ok()?,
            })
        })
        .collect()
}

/// Takes the state dir over from whatever ran on it before (`docs/upgrades.md`), once its lock
/// is held and before its store is opened: refuses a store a newer release migrated
/// ([`StoreError::NewerRelease`]: nothing is changed), and stops every job controller of the
/// state dir that runs another build than `self_exe`
/// ([`lifecycle::stops_before_migration`]), leaving its workload as it is. Their jobs are then
/// handed over by the start-up sweep to fresh controllers of this build, which adopt the
/// workloads: no crash, no relaunch. So a job controller never meets a schema it was not built
/// for: the store is migrated (by the first [`Store::open`]) only after they are gone.
///
/// Errors: the store is a newer release's, or cannot be read; `self_exe` cannot be read.
pub fn take_over(dir: &StateDir, self_exe: &std::path::Path) -> anyhow::Result<()> {
    let step = crate::store::schema_step_at(&dir.store())?;
    let known = crate::store::schema::CURRENT_STEP;
    if let Some(found) = step {
        if found > known {
            return Err(StoreError::NewerRelease {
                path: dir.store().display().to_string(),
                found,
                known,
            }
            .into());
        }
        if found < known {
            tracing::info!(
                store = %dir.store().display(),
                from_step = found,
                to_step = known,
                "the store was written by an earlier release: it is migrated once that release's job controllers are stopped"
            );
        }
    }
    let own = process::file_identity(self_exe).ok_or_else(|| {
        anyhow::anyhow!(
            "cannot read the executable {} that job controllers are started from",
            self_exe.display()
        )
    })?;
    let found: Vec<lifecycle::ControllerBuild> = controller_processes(dir.root())
        .into_iter()
        .map(|c| lifecycle::ControllerBuild {
            pid: c.pid,
            start_time: c.start_time,
            exe: process::executable_identity(c.pid),
        })
        .collect();
    let stop: Vec<(i32, u64)> = lifecycle::stops_before_migration(&found, own)
        .iter()
        .map(|c| (c.pid, c.start_time))
        .collect();
    for (pid, _) in &stop {
        tracing::warn!(
            pid,
            "stopping a job controller of another build (a version change), leaving its workload: this build's controller takes its job over"
        );
    }
    stop_controllers(&stop);
    Ok(())
}

/// Stops the job controllers `controllers` (pid, start time) without their workloads: SIGTERM
/// to each, then SIGKILL to those left after [`lifecycle::supervise::REPLACE_GRACE`]; returns
/// once all are gone (or 5 s after the SIGKILL). Blocking: used at start, before anything else
/// runs. Cost: one read of `/proc/PID/stat` per controller left every 20 ms.
fn stop_controllers(controllers: &[(i32, u64)]) {
    use nix::sys::signal::Signal;
    let left = || -> Vec<(i32, u64)> {
        controllers
            .iter()
            .copied()
            .filter(|(pid, start)| process::is_alive(*pid, *start))
            .collect()
    };
    let gone_within = |limit: Duration| {
        let deadline = std::time::Instant::now() + limit;
        while !left().is_empty() {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    };
    for (pid, start) in controllers {
        process::signal_if_alive(*pid, *start, Signal::SIGTERM);
    }
    if !gone_within(lifecycle::supervise::REPLACE_GRACE) {
        for (pid, start) in left() {
            tracing::warn!(pid, "the job controller ignored SIGTERM; SIGKILL");
            process::signal_if_alive(pid, start, Signal::SIGKILL);
        }
        gone_within(Duration::from_secs(5));
    }
}

impl Engine {
    /// Takes the state dir ([`take_over`]), opens the store, shares settings with job
    /// controllers, adopts or resumes live jobs, and starts the wake-up listener and the
    /// scheduler loop.
    pub fn start(cfg: Config) -> anyhow::Result<Arc<Engine>> {
        let dir = StateDir::new(&cfg.state_dir);
        let lock = lock_state_dir(&dir)?;
        take_over(&dir, &cfg.self_exe)?;
        Engine::start_locked(cfg, lock)
    }

    /// [`Engine::start`] with the state dir's lock already taken and [`take_over`] done (the
    /// operator does both first, to rebuild a lost store before the engine starts).
    pub fn start_locked(cfg: Config, lock: Flock<std::fs::File>) -> anyhow::Result<Arc<Engine>> {
        let dir = StateDir::new(&cfg.state_dir);
        let mut store = Store::open(&dir.store(), ENGINE_CACHE_KIB)?;
        store.keep_statements(crate::store::STATEMENT_CACHE);
        claim_for_shard(&mut store, &cfg.state_dir, cfg.shard.as_deref())?;
        // Jobs an earlier release recorded have no demand in resources: computed once.
        let filled = store.fill_demands()?;
        if filled > 0 {
            tracing::info!(
                jobs = filled,
                "computed the demands of jobs an earlier release recorded"
            );
        }
        let executors: Vec<&str> = cfg.executors.iter().map(|e| e.as_str()).collect();
        let caps = cfg.capacity.caps;
        let shared = store.set_settings(&Settings {
            executors: cfg.executors.clone(),
            cancel_grace_ms: cfg.cancel_grace.as_millis() as u64,
            restart_backoff_ms: cfg.restart_backoff.as_millis() as u64,
            caps: Some(caps),
            launch_timeout_ms: cfg.launch_timeout.as_millis() as u64,
            max_launch_timeouts: cfg.max_launch_timeouts,
            capacity: Some(cfg.capacity.to_string()),
            shard: cfg.shard.clone(),
            claims: cfg.claims,
            gang_scheduling: cfg.gang_scheduling,
            kept_log_bytes: cfg.kept_log_bytes,
        });
        match shared {
            Ok(()) => {}
            // A full disk must not keep the operator from starting: its job controllers hold
            // outcomes it must adopt. They run with the settings last written meanwhile.
            Err(e) if e.is_storage_failure() => {
                tracing::error!(error = %e, "the settings could not be written to the state dir; job controllers keep the previous ones")
            }
            Err(e) => return Err(e.into()),
        }
        tracing::info!(
            launch_cap = caps.launch,
            run_cap = caps.run,
            executors = %executors.join(","),
            state_dir = %cfg.state_dir.display(),
            "caps in force: {}",
            cfg.capacity
        );
        let c = &cfg.capacity;
        if c.caps.run <= 1 && c.memory_mib < c.reserved_mib + 2 * c.job_memory_mib {
            tracing::warn!(
                memory_mib = c.memory_mib,
                reserved_mib = c.reserved_mib,
                "the run cap is 1 job at a time: {} MiB of memory leave nothing after the {} MiB reserved for the operator; raise the memory limit (the chart's resources.limits.memory) or lower --reserved-memory-mib",
                c.memory_mib,
                c.reserved_mib
            );
        }
        if cfg.executors.iter().any(|k| k.facts().local_processes)
            && !std::path::Path::new("/bin/sh").exists()
        {
            tracing::warn!(
                "the local executor is on, but /bin/sh does not exist here: every job with spec.run will fail to start (the operator's image has no shell; use spec.template)"
            );
        }
        // Its job controllers tell from this whether their operator still runs.
        let me = std::process::id() as i32;
        if let Some(start) = process::start_time(me)
            && let Err(e) = store.set_operator(me, start)
        {
            tracing::warn!(error = %e, "recording the operator process in the store failed");
        }
        let socket = bind_socket(&dir)?;
        let caps_gauge = (caps.launch as i64, caps.run as i64);
        let metrics = Metrics::for_shard(cfg.shard.as_deref());
        let pacer = Arc::new(crate::pacing::Pacer::new(cfg.burst));
        let engine = Arc::new(Engine {
            cfg,
            pacer,
            dir,
            store: Mutex::new(store),
            schedule: Notify::new(),
            status_changed: Notify::new(),
            world_changed: Notify::new(),
            stopping: Default::default(),
            state_dir_problem: Mutex::new(None),
            state_dir_changed: Notify::new(),
            metrics: Arc::new(metrics),
            spawn_retries: Mutex::new(Default::default()),
            queues: Mutex::new(None),
            cluster: Mutex::new(None),
            _lock: lock,
        });
        if !engine.cfg.queues_from_api {
            engine.set_queues(Queues::single_pool());
        }
        engine.metrics.launch_cap.set(caps_gauge.0);
        engine.metrics.run_cap.set(caps_gauge.1);
        tokio::spawn(listen(engine.clone(), socket));
        engine.startup_sweep()?;
        tokio::spawn(scheduler_loop(engine.clone()));
        tokio::spawn(probe_loop(engine.clone()));
        Ok(engine)
    }

    /// Why the state dir cannot be written, while it cannot ([`Engine::probe_state_dir`]).
    pub fn state_dir_problem(&self) -> Option<String> {
        self.state_dir_problem
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Writes and syncs [`STATE_DIR_PROBE_BYTES`] in the state dir and one row of the store:
    /// what a job's next transition needs. A failure (a full disk, an I/O error) makes the
    /// operator not ready (`/readyz` says why) and is logged once; its end too. Returns the
    /// problem, if any.
    pub fn probe_state_dir(&self) -> Option<String> {
        let probe = || -> anyhow::Result<()> {
            use std::io::Write as _;
            let path = self.dir.run_dir().join("probe");
            let mut f = std::fs::File::create(&path)?;
            f.write_all(&[0u8; STATE_DIR_PROBE_BYTES])?;
            f.sync_all()?;
            drop(f);
            std::fs::remove_file(&path)?;
            self.store().heartbeat(lifecycle::now_ms())?;
            Ok(())
        };
        let problem = probe().err().map(|e| {
            format!(
                "the state dir {} cannot be written: {e:#}",
                self.cfg.state_dir.display()
            )
        });
        let changed = {
            let mut held = self
                .state_dir_problem
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let changed = held.is_some() != problem.is_some();
            *held = problem.clone();
            changed
        };
        self.metrics.set_problem("state-dir", problem.clone());
        if changed {
            match &problem {
                Some(p) => tracing::error!("{p}; jobs hold their outcomes until it can be"),
                None => {
                    tracing::info!(state_dir = %self.cfg.state_dir.display(), "the state dir can be written again")
                }
            }
            self.state_dir_changed.notify_one();
            self.wake_all();
        }
        problem
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

    /// Sets the queues in force (`docs/design.md#queues`); a change wakes a pass. The first call
    /// lets the engine admit jobs when the queues come from the API.
    pub fn set_queues(&self, queues: Queues) {
        let mut held = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        if held.as_deref() == Some(&queues) {
            return;
        }
        tracing::info!(
            queues = queues.names().len(),
            single_pool = queues.is_single_pool(),
            "queues in force changed"
        );
        *held = Some(Arc::new(queues));
        drop(held);
        self.wake_all();
    }

    /// The queues in force, once known.
    pub fn queues(&self) -> Option<Arc<Queues>> {
        self.queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Where the scheduling passes read the cluster's nodes and Pods from (issue 44: the
    /// queues with pools admit only what fits).
    pub fn set_cluster_view(&self, view: Arc<dyn crate::resources::fit::ClusterView>) {
        *self.cluster.lock().unwrap_or_else(|e| e.into_inner()) = Some(view);
        self.schedule.notify_one();
    }

    /// The cluster now, for a pass of queues with pools; None while not known.
    pub fn cluster_snapshot(&self) -> Option<Arc<crate::resources::fit::ClusterSnapshot>> {
        let view = self
            .cluster
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()?;
        view.snapshot()
    }

    /// Asks for a scheduling pass (the cluster changed: a job waiting for room may fit now).
    pub fn schedule_soon(&self) {
        self.schedule.notify_one();
    }

    /// Asks for a scheduling pass and a status sweep.
    pub fn wake_all(&self) {
        self.schedule.notify_one();
        self.status_changed.notify_one();
    }

    /// Persists a cancel request and acts on it ([`lifecycle::cancel_route`]): a queued job
    /// ends Cancelled at once, a live job's controller is woken to stop its workload.
    pub fn cancel(&self, row: JobRow, deleting: bool) -> Result<JobRow, StoreError> {
        let mut row = self.store().request_cancel(row.id, deleting)?;
        tracing::info!(job_id = row.id, job = %row.key(), schedule = %row.schedule_state, "cancel requested");
        match lifecycle::cancel_route(&row) {
            CancelRoute::EndNow(t) => match self.store().transition(row.id, &t)? {
                Cas::Applied(r) => row = *r,
                // Admitted meanwhile: its controller will see the persisted request.
                Cas::Conflict(r) => {
                    row = *r;
                    self.wake_controller(&row);
                }
            },
            CancelRoute::WakeController => self.wake_controller(&row),
            CancelRoute::Nothing => {}
        }
        self.wake_all();
        Ok(row)
    }

    /// Acts on the job's `spec.suspend` as mirrored ([`lifecycle::suspend_route`]): a job that
    /// holds no slot is suspended (or resumed) at once, a live job's controller is woken to stop
    /// its workload. Returns the row after it.
    pub fn suspend_or_resume(&self, row: JobRow) -> Result<JobRow, StoreError> {
        match lifecycle::suspend_route(&row) {
            lifecycle::SuspendRoute::Apply(t) => match self.store().transition(row.id, &t)? {
                Cas::Applied(r) => {
                    tracing::info!(job_id = r.id, job = %r.key(), phase = %r.phase, "{}", if r.phase == crate::api::JobPhase::Suspended { "suspended" } else { "resumed" });
                    self.wake_all();
                    Ok(*r)
                }
                // Admitted meanwhile: its controller sees the suspend.
                Cas::Conflict(r) => {
                    self.wake_controller(&r);
                    Ok(*r)
                }
            },
            lifecycle::SuspendRoute::WakeController => {
                tracing::info!(job_id = row.id, job = %row.key(), "suspend requested: stopping its workload");
                self.wake_controller(&row);
                Ok(row)
            }
            lifecycle::SuspendRoute::Nothing => Ok(row),
        }
    }

    /// A job restored from its status while the engine runs (taken over from another operator,
    /// `docs/design.md#one-owner-per-job`): when it holds a run slot, its job controller is
    /// started, as the start-up sweep does for a rebuilt store.
    pub fn resume_restored(self: &Arc<Self>, row: &JobRow) {
        if lifecycle::needs_controller(row) {
            tracing::info!(
                job_id = row.id,
                "starting a job controller for a job taken over"
            );
            self.spawn_controller(row);
        }
        self.wake_all();
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
                    child.wait().await;
                    op.on_controller_exit(id, pid, start, ExitSeen::WhileOperatorRan);
                });
            }
            Err(e) => {
                let failures = {
                    let mut retries = self.spawn_retries.lock().unwrap_or_else(|e| e.into_inner());
                    let n = retries.entry(row.id).or_insert(0);
                    *n += 1;
                    *n
                };
                let error = e.to_string();
                match lifecycle::after_spawn_failure(row, failures, e.why(), &error) {
                    // Not the job's fault: it keeps its place (and slots) and is started again
                    // after a back-off; never a failure phase.
                    AfterSpawnFailure::Retry(wait) => {
                        tracing::warn!(job_id = row.id, error, failures, retry_in = ?wait, "the node lacks the resources to start a job controller (or the state dir cannot be written); retrying");
                        self.metrics.controller_spawns_deferred_total.inc();
                        let op = self.clone();
                        let id = row.id;
                        tokio::spawn(async move {
                            tokio::time::sleep(wait).await;
                            let row = op.store().find(id).ok().flatten();
                            if let Some(row) = row
                                && lifecycle::needs_controller(&row)
                            {
                                op.spawn_controller(&row);
                            }
                        });
                    }
                    AfterSpawnFailure::Fail(_) => {
                        tracing::error!(
                            job_id = row.id,
                            error,
                            "could not start a job controller process"
                        );
                        self.spawn_retries
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(&row.id);
                        // Decided again on the row as it is when written.
                        let _ =
                            self.store()
                                .apply(row.id, |now| {
                                    match lifecycle::after_spawn_failure(
                                        now,
                                        failures,
                                        SpawnFailure::ForGood,
                                        &error,
                                    ) {
                                        AfterSpawnFailure::Fail(t) => Some(*t),
                                        AfterSpawnFailure::Retry(_) => None,
                                    }
                                });
                        self.wake_all();
                    }
                }
            }
        }
    }

    fn try_spawn(&self, row: &JobRow) -> Result<(i32, u64, process::Spawned), SpawnError> {
        let log_path = self.dir.controller_log(row.id);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        // `ps` shows the binary's path rather than /proc/self/exe.
        let mut shown: std::ffi::OsString = self.cfg.self_exe.clone().into();
        if self.cfg.self_exe == std::path::Path::new(OWN_EXECUTABLE)
            && let Ok(path) = std::fs::read_link(OWN_EXECUTABLE)
        {
            let path = path.to_string_lossy();
            shown = path.strip_suffix(" (deleted)").unwrap_or(&path).into();
        }
        let argv: Vec<std::ffi::OsString> = vec![
            shown,
            "job-controller".into(),
            "--state-dir".into(),
            self.cfg.state_dir.clone().into(),
            "--start-gate-fd".into(),
            START_GATE_FD.to_string().into(),
            "--job-id".into(),
            row.id.to_string().into(),
        ];
        // In a session of its own, SIGUSR1 blocked until it sets its handler, and acting on
        // the job only once its start is recorded (the gate opens below, or when this process
        // dies): one that ended the job first would leave its start uncounted.
        let mut child =
            process::spawn_in_session(&self.cfg.self_exe, &argv, &log, Some(START_GATE_FD))?;
        let pid = child.pid;
        let start = process::start_time(pid).unwrap_or(0);
        // Decided on the row as it is when written, in one transaction (a controller whose
        // start an operator that died before recording it never opened may be driving it).
        let recorded = self.store().apply(row.id, |now| {
            Some(lifecycle::controller_started(now, pid, start))
        });
        if let Err(e) = recorded {
            // Unrecorded, it must not run (it would drive the job beside the next one).
            child.kill();
            tokio::spawn(child.wait());
            return Err(SpawnError::Store(e));
        }
        child.open_gate();
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
                // A controller that stopped its job for a suspend leaves it Suspended even if
                // spec.suspend went back to false during the stop (no object change comes
                // after): the row is routed again now that the stop is written.
                if let Ok(Some(row)) = self.store().find(id)
                    && row.phase == crate::api::JobPhase::Suspended
                    && let Err(e) = self.suspend_or_resume(row)
                {
                    tracing::warn!(job_id = id, error = %e, "resuming a job after its stop failed");
                }
                return;
            }
            Err(e) => {
                tracing::error!(job_id = id, error = %e, "recording a job controller exit failed");
                if e.is_storage_failure() {
                    // The job must not stay with a dead controller: try again once the state
                    // dir can be written (a full disk, an I/O error).
                    let op = self.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(STORAGE_RETRY).await;
                        op.on_controller_exit(id, pid, start, seen);
                    });
                }
                return;
            }
        };
        // A controller found gone at the operator's start was handed over, not crashed.
        self.count_exit(if seen == ExitSeen::AtOperatorStart {
            "handed_over"
        } else {
            "crashed"
        });
        match decision {
            ControllerExit::GiveUp(_) => {
                tracing::error!(
                    job_id = id,
                    pid,
                    crashes = row.controller_crashes,
                    "job controller keeps exiting; failing the job"
                );
                match lifecycle::stop_after_give_up(&row) {
                    StopAfterGiveUp::LocalProcesses => {
                        let mut local = LocalExecutor::new(&self.dir);
                        let grace = lifecycle::stop_grace(&row, self.cfg.cancel_grace);
                        tokio::spawn(async move {
                            let _ = local.stop_job(&row, grace).await;
                        });
                    }
                    // The engine has no API client: the world check deletes a Done job's
                    // running Pod, now rather than at its next period.
                    StopAfterGiveUp::PodsByWorldCheck => self.world_changed.notify_one(),
                }
            }
            _ if seen == ExitSeen::AtOperatorStart => {
                tracing::info!(
                    job_id = id,
                    pid,
                    "handing the job over to a fresh job controller (its previous one went away with the previous operator, or ran another build)"
                );
                self.spawn_controller(&row);
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

    /// The engine's side of one observation of the world ([`lifecycle::world`]): the local
    /// attempts' wrapper processes and the job controller processes of this state dir, then
    /// the jobs (read after the processes: a workload seen is known to the rows read after
    /// it). Live jobs are read whole, Done ones briefly. Cost: one read of each process's
    /// command line, the live rows, two columns of each Done row.
    pub fn observe_world(&self) -> Result<LocalWorld, StoreError> {
        let processes = LocalExecutor::new(&self.dir).wrappers();
        let controllers = controller_processes(&self.cfg.state_dir);
        let store = self.store();
        let mut jobs: Vec<world::Job> = store
            .live_jobs()?
            .iter()
            .map(|r| world::Job::live(r, crate::executor::member_names(r)))
            .collect();
        jobs.extend(
            store
                .pending_jobs_brief()?
                .into_iter()
                .map(world::Job::queued),
        );
        jobs.extend(store.done_jobs_brief()?.into_iter().map(world::Job::done));
        Ok(LocalWorld {
            jobs,
            processes,
            controllers,
        })
    }

    /// Carries out the world check's fixes that are the engine's (cancel a job whose object
    /// vanished, forget a finished one, stop an orphaned process, wake a stray job controller)
    /// and returns the others (Pods to delete: the operator's).
    pub fn apply_fixes(self: &Arc<Self>, fixes: Vec<Fix>) -> Vec<Fix> {
        let mut rest = Vec::new();
        for fix in fixes {
            match fix {
                Fix::CancelVanished { job_id } => {
                    let row = match self.store().find(job_id) {
                        Ok(Some(row)) => row,
                        Ok(None) => continue,
                        Err(e) => {
                            tracing::error!(job_id, error = %e, "reading a vanished job failed");
                            continue;
                        }
                    };
                    tracing::warn!(job_id, job = %row.key(), uid = %row.uid, "the job's object is gone (deleted while no operator watched, or without its finalizer): cancelling it as a deletion");
                    if let Err(e) = self.cancel(row, true) {
                        tracing::error!(job_id, error = %e, "cancelling a vanished job failed");
                    }
                }
                Fix::Forget { job_id, attempts } => {
                    tracing::info!(
                        job_id,
                        "the finished job's object is gone: forgetting the job"
                    );
                    match self.store().delete(job_id) {
                        Ok(()) => self.dir.forget_job(job_id, attempts),
                        Err(e) => {
                            tracing::error!(job_id, error = %e, "forgetting a job failed")
                        }
                    }
                }
                Fix::StopProcess { process: p, why } => {
                    let key = (p.pid, p.start_time);
                    if !self
                        .stopping
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(key)
                    {
                        continue;
                    }
                    tracing::warn!(
                        job_id = p.job_id,
                        attempt = p.attempt,
                        pid = p.pid,
                        "stopping a workload process that no live attempt owns: {why}"
                    );
                    let local = LocalExecutor::new(&self.dir);
                    // The job's own grace when the store still knows it.
                    let grace = match self.store().find(p.job_id) {
                        Ok(Some(row)) => lifecycle::stop_grace(&row, self.cfg.cancel_grace),
                        _ => self.cfg.cancel_grace,
                    };
                    let stopping = self.stopping.clone();
                    tokio::spawn(async move {
                        local.stop_orphan(p, grace).await;
                        stopping
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(&key);
                    });
                }
                Fix::WakeController { controller: c } => {
                    tracing::info!(
                        job_id = c.job_id,
                        pid = c.pid,
                        "waking a job controller that is not its job's recorded one"
                    );
                    // Checked again right before the signal: only a session leader is a
                    // job controller (see `job_controller_processes`).
                    if process::is_session_leader(c.pid) {
                        process::signal_if_alive(
                            c.pid,
                            c.start_time,
                            nix::sys::signal::Signal::SIGUSR1,
                        );
                    }
                }
                Fix::MemberLost {
                    job_id,
                    attempt,
                    pod,
                    node,
                    loss,
                } => self.lose_member(job_id, attempt, &pod, &node, &loss),
                other => rest.push(other),
            }
        }
        if !rest.is_empty()
            || !self
                .stopping
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
        {
            self.wake_all();
        }
        rest
    }

    /// Records `pod`, a member of `job_id`'s current `attempt`, lost to its node (`loss`), unless
    /// the Pod watch saw it end already, and wakes the job's controller, which ends the attempt
    /// as lost (`docs/design.md#failures`).
    fn lose_member(&self, job_id: i64, attempt: i32, pod: &str, node: &str, loss: &NodeLoss) {
        let lost = (|| -> Result<Option<JobRow>, StoreError> {
            let mut store = self.store();
            let Some(row) = store.find(job_id)? else {
                return Ok(None);
            };
            if row.current_attempt() != attempt {
                return Ok(None);
            }
            let seen = store.pod_members(job_id, attempt)?;
            let Some(lost) = seen
                .iter()
                .find(|o| o.pod_name == pod)
                .and_then(|o| crate::executor::pod::state::lost_to_node(o, loss))
            else {
                return Ok(None);
            };
            Ok(store.record_pod(&lost)?.then_some(row))
        })();
        match lost {
            Ok(Some(row)) => {
                tracing::warn!(
                    job_id,
                    attempt,
                    pod,
                    node,
                    reason = loss.reason,
                    "the attempt's Pod {pod} is lost: {}",
                    loss.message
                );
                self.wake_controller(&row);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::error!(job_id, pod, error = %e, "recording a Pod lost with its node failed")
            }
        }
    }

    /// Leaves every job of `namespace` to the operator that now owns them
    /// ([`leave_jobs`]); returns how many.
    pub fn leave_namespace(&self, namespace: &str, why: &str) -> usize {
        let rows = match self.store().in_namespace(namespace) {
            Ok(rows) => rows,
            Err(e) => {
                tracing::error!(namespace, error = %e, "reading the jobs to leave failed");
                return 0;
            }
        };
        self.leave(rows, why)
    }

    /// Leaves `rows` to the operator that now owns them ([`leave_jobs`]); returns how many.
    pub fn leave(&self, rows: Vec<JobRow>, why: &str) -> usize {
        let n = rows.len();
        leave_jobs(
            &self.dir,
            &mut self.store(),
            rows,
            self.cfg.cancel_grace,
            why,
        );
        self.wake_all();
        n
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
        let own = process::file_identity(&self.cfg.self_exe);
        for row in live {
            let liveness = match row.controller() {
                Some((pid, start)) if process::is_alive(pid, start) => {
                    if own.is_some() && process::executable_identity(pid) == own {
                        Liveness::Ours
                    } else {
                        Liveness::OtherBuild
                    }
                }
                _ => Liveness::Gone,
            };
            match lifecycle::at_start(&row, liveness) {
                AtStart::Adopt { pid, start_time } => {
                    tracing::info!(job_id = row.id, pid, "adopting a running job controller");
                    let op = self.clone();
                    let id = row.id;
                    tokio::spawn(async move {
                        process::wait_gone(pid, start_time).await;
                        op.on_controller_exit(id, pid, start_time, ExitSeen::WhileOperatorRan);
                    });
                }
                // It went away with the previous operator: a hand-over, not a crash.
                AtStart::HandOver { pid, start_time } => {
                    self.on_controller_exit(row.id, pid, start_time, ExitSeen::AtOperatorStart)
                }
                AtStart::Resume => {
                    tracing::info!(
                        job_id = row.id,
                        "resuming a job that has no job controller process"
                    );
                    self.spawn_controller(&row);
                }
                AtStart::Replace { pid, start_time } => {
                    tracing::warn!(
                        job_id = row.id,
                        pid,
                        "the job's controller runs another build (a version change): stopping it, leaving its workload, and handing the job over"
                    );
                    stop_controllers(&[(pid, start_time)]);
                    self.on_controller_exit(row.id, pid, start_time, ExitSeen::AtOperatorStart)
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

/// Leaves `rows` to the operator that owns them now (`lifecycle::claim`: another instance
/// holds the claim on their namespace, or wrote their status under a later claim): each row is
/// forgotten first (so that nothing here resumes it), then its job controller is killed (it
/// holds nothing the store does not), and a local attempt's processes, which the new owner
/// cannot adopt (they are this state dir's), are stopped with the job's grace; a Pod is left
/// as it is, for the new owner to adopt. `why` is logged.
pub fn leave_jobs(
    dir: &StateDir,
    store: &mut Store,
    rows: Vec<JobRow>,
    default_grace: Duration,
    why: &str,
) {
    for row in rows {
        if let Err(e) = store.delete(row.id) {
            tracing::error!(job_id = row.id, error = %e, "forgetting a job left to another owner failed");
            continue;
        }
        tracing::warn!(job_id = row.id, job = %row.key(), phase = %row.phase, "leaving the job to its owner: {why}");
        if let Some((pid, start)) = row.controller() {
            process::signal_if_alive(pid, start, nix::sys::signal::Signal::SIGKILL);
        }
        let local = row.executor == ExecutorKind::Local
            && row.schedule_state.holds_run_slot()
            && row.launched_attempt > 0;
        if local {
            let grace = lifecycle::stop_grace(&row, default_grace);
            let dir = dir.clone();
            tokio::spawn(async move {
                let mut executor = LocalExecutor::new(&dir);
                executor
                    .stop_attempt(row.id, row.current_attempt(), grace)
                    .await;
                dir.forget_job(row.id, row.attempts());
            });
        } else {
            dir.forget_job(row.id, row.attempts());
        }
    }
}

/// The engine's side of one observation of the world ([`Engine::observe_world`]).
#[derive(Clone, Debug, Default)]
pub struct LocalWorld {
    /// Every job (live ones whole, the others briefly), read after the processes.
    pub jobs: Vec<world::Job>,
    /// The local attempts' wrapper processes of this state dir.
    pub processes: Vec<ProcessSeen>,
    /// The job controller processes of this state dir.
    pub controllers: Vec<ControllerSeen>,
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

async fn probe_loop(op: Arc<Engine>) {
    loop {
        op.probe_state_dir();
        tokio::time::sleep(STATE_DIR_PROBE_PERIOD).await;
    }
}

async fn scheduler_loop(op: Arc<Engine>) {
    loop {
        // While a burst is paced: again when the next launch is allowed or the burst may be over.
        let wait = op.pacer.next_look().unwrap_or(BACKSTOP).min(BACKSTOP);
        tokio::select! {
            _ = op.schedule.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
        // Nothing is admitted before the queues are known.
        let Some(queues) = op.queues() else { continue };
        let started = std::time::Instant::now();
        let max_new = op.pacer.launch_allowance();
        op.metrics.burst_paced.set(i64::from(max_new != usize::MAX));
        let cluster = queues.any_quotas().then(|| op.cluster_snapshot()).flatten();
        let result = {
            let mut store = op.store();
            scheduler::pass_resources(
                &mut store,
                op.cfg.capacity.caps,
                &queues,
                max_new,
                cluster.as_deref(),
            )
        };
        if let Ok(r) = &result
            && max_new != usize::MAX
        {
            op.pacer.launched(r.started.len());
        }
        op.metrics
            .scheduling_pass_seconds
            .observe(started.elapsed().as_secs_f64());
        match result {
            Ok(r) => {
                let acted = !r.started.is_empty()
                    || !r.relaunched.is_empty()
                    || !r.preempted.is_empty()
                    || r.messages > 0;
                for row in &r.preempted {
                    op.metrics
                        .preemption(&row.queue, row.preempted_by.as_deref().unwrap_or(""));
                    op.wake_controller(row);
                }
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
