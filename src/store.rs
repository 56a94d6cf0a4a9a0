//! The SQLite store: the scheduler's working state and the source of every status write.
//!
//! One row per job in `jobs` holds both state machines of DESIGN.md section 4 (phase and schedule
//! state); `transitions` keeps each job's history. Every state change is a compare-and-set on the
//! expected previous state ([`Store::transition`]): a failed CAS re-reads and reports the current
//! row, it never overwrites. The file is opened in WAL mode and shared by the operator and every
//! job controller process; writers wait up to [`BUSY_TIMEOUT`] for the lock.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, Row, params};
use rusqlite_migration::{M, Migrations};

use crate::api::{ExecutorKind, JobPhase, ManagedJobSpec, ScheduleState};

/// How long a writer waits for another process's write lock before failing.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite refused or failed.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The schema migration failed.
    #[error("migrating the store's schema: {0}")]
    Migration(#[from] rusqlite_migration::Error),
    /// A row holds a value this version cannot read.
    #[error("corrupt row for job {job_id}: {what}")]
    Corrupt {
        /// The job.
        job_id: i64,
        /// What could not be read.
        what: String,
    },
    /// No job with that id.
    #[error("no job with id {0}")]
    NotFound(i64),
}

/// Result type of the store.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

fn migrations() -> Migrations<'static> {
    Migrations::new(vec![
        M::up(
            r#"
        CREATE TABLE jobs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            uid TEXT NOT NULL UNIQUE,
            namespace TEXT NOT NULL,
            name TEXT NOT NULL,
            generation INTEGER NOT NULL DEFAULT 0,
            executor TEXT NOT NULL,
            spec TEXT NOT NULL,
            priority INTEGER NOT NULL DEFAULT 0,
            phase TEXT NOT NULL,
            schedule_state TEXT NOT NULL,
            message TEXT NOT NULL DEFAULT '',
            queue_position INTEGER,
            cancel_requested INTEGER NOT NULL DEFAULT 0,
            deleting INTEGER NOT NULL DEFAULT 0,
            controller_pid INTEGER,
            controller_start_time INTEGER,
            controller_starts INTEGER NOT NULL DEFAULT 0,
            controller_crashes INTEGER NOT NULL DEFAULT 0,
            attempt INTEGER NOT NULL DEFAULT 0,
            launched_attempt INTEGER NOT NULL DEFAULT 0,
            recovery_count INTEGER NOT NULL DEFAULT 0,
            restart_count INTEGER NOT NULL DEFAULT 0,
            exit_code INTEGER,
            failure_reason TEXT,
            workload TEXT,
            backoff_until_ms INTEGER,
            submitted_at_ms INTEGER NOT NULL,
            created_at_ms INTEGER NOT NULL,
            started_at_ms INTEGER,
            finished_at_ms INTEGER,
            phase_changed_at_ms INTEGER NOT NULL,
            status_version INTEGER NOT NULL DEFAULT 1,
            synced_version INTEGER NOT NULL DEFAULT 0
        );
        CREATE INDEX jobs_queue ON jobs (schedule_state, priority DESC, created_at_ms, id)
            WHERE schedule_state IN ('Waiting', 'AliveWaiting');
        CREATE INDEX jobs_live ON jobs (schedule_state)
            WHERE schedule_state IN ('Launching', 'Alive', 'AliveWaiting');
        CREATE INDEX jobs_unsynced ON jobs (id) WHERE status_version > synced_version;
        CREATE INDEX jobs_by_name ON jobs (namespace, name);
        CREATE TABLE transitions (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            job_id INTEGER NOT NULL,
            at_ms INTEGER NOT NULL,
            from_phase TEXT,
            to_phase TEXT NOT NULL,
            from_schedule TEXT,
            to_schedule TEXT NOT NULL,
            reason TEXT NOT NULL,
            message TEXT NOT NULL DEFAULT ''
        );
        CREATE INDEX transitions_by_job ON transitions (job_id, id);
        CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE pod_observations (
            job_id INTEGER NOT NULL,
            attempt INTEGER NOT NULL,
            pod_name TEXT NOT NULL,
            state TEXT NOT NULL,
            exit_code INTEGER,
            reason TEXT NOT NULL DEFAULT '',
            message TEXT NOT NULL DEFAULT '',
            deleted INTEGER NOT NULL DEFAULT 0,
            observed_at_ms INTEGER NOT NULL,
            PRIMARY KEY (job_id, attempt)
        );
        "#,
        ),
        // The status writer's ordering (operator::status_loop): the transition (its id in
        // `transitions`) of a job's last schedule or phase change, and of the first one not yet
        // written to the API.
        M::up(
            r#"
        ALTER TABLE jobs ADD COLUMN changed_seq INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE jobs ADD COLUMN unsynced_since_seq INTEGER NOT NULL DEFAULT 0;
        "#,
        ),
    ])
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A job as the store holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRow {
    /// Store id (`status.jobId`).
    pub id: i64,
    /// The ManagedJob's `metadata.uid`.
    pub uid: String,
    /// Namespace of the ManagedJob.
    pub namespace: String,
    /// Name of the ManagedJob.
    pub name: String,
    /// Latest `metadata.generation` mirrored.
    pub generation: i64,
    /// Executor the spec asks for.
    pub executor: ExecutorKind,
    /// The spec as submitted.
    pub spec: ManagedJobSpec,
    /// Current priority (may change while queued).
    pub priority: i32,
    /// User-facing phase.
    pub phase: JobPhase,
    /// Scheduler state.
    pub schedule_state: ScheduleState,
    /// Latest human-readable message.
    pub message: String,
    /// Queue position when queued (1 = next).
    pub queue_position: Option<i64>,
    /// A cancel was requested (spec.cancel or deletion); persisted so it survives crashes.
    pub cancel_requested: bool,
    /// The object is being deleted (cleanup, then the row goes away).
    pub deleting: bool,
    /// Pid of the job controller process, once started.
    pub controller_pid: Option<i32>,
    /// Start time of that process in clock ticks since boot (/proc/PID/stat field 22).
    pub controller_start_time: Option<u64>,
    /// How many job controller processes were started for this job.
    pub controller_starts: i64,
    /// How many of them exited before the job was Done.
    pub controller_crashes: i64,
    /// Current attempt number (0 before the first launch).
    pub attempt: i32,
    /// Highest attempt whose workload create was issued (recorded before the create).
    pub launched_attempt: i32,
    /// Relaunches after preemption so far.
    pub recovery_count: i32,
    /// Restarts after errors so far.
    pub restart_count: i32,
    /// Exit code of the last finished attempt.
    pub exit_code: Option<i32>,
    /// CamelCase failure reason.
    pub failure_reason: Option<String>,
    /// `pid/N` or `pod/NAME` of the current attempt.
    pub workload: Option<String>,
    /// A restart back-off ends at this time (ms since epoch); stored so restarts keep it.
    pub backoff_until_ms: Option<i64>,
    /// When the job was first seen (ms since epoch).
    pub submitted_at_ms: i64,
    /// When the workload first ran (ms since epoch).
    pub started_at_ms: Option<i64>,
    /// When the job reached a terminal phase (ms since epoch).
    pub finished_at_ms: Option<i64>,
    /// When the phase last changed (ms since epoch); condition transition times.
    pub phase_changed_at_ms: i64,
    /// Bumped on every change that the API status should show.
    pub status_version: i64,
    /// The `status_version` last written to the API.
    pub synced_version: i64,
    /// The object's `metadata.creationTimestamp` (ms since epoch): FIFO order within a priority.
    pub created_at_ms: i64,
    /// Id of the job's last transition (a store-wide sequence; 0 before any).
    pub changed_seq: i64,
    /// Id of the job's first transition since its status was last fully written to the API,
    /// or older: the status writer never lets a job's taking of a slot reach the API before an
    /// earlier release of one (see `operator::status_loop`).
    pub unsynced_since_seq: i64,
}

const JOB_COLUMNS: &str = "id, uid, namespace, name, generation, executor, spec, priority, phase, \
    schedule_state, message, queue_position, cancel_requested, deleting, controller_pid, \
    controller_start_time, controller_starts, controller_crashes, attempt, launched_attempt, \
    recovery_count, restart_count, exit_code, failure_reason, workload, backoff_until_ms, \
    submitted_at_ms, started_at_ms, finished_at_ms, phase_changed_at_ms, status_version, \
    synced_version, created_at_ms, changed_seq, unsynced_since_seq";

fn corrupt(job_id: i64, what: impl Into<String>) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(Box::new(StoreError::Corrupt {
        job_id,
        what: what.into(),
    }))
}

impl JobRow {
    fn from_row(row: &Row<'_>) -> rusqlite::Result<JobRow> {
        let id: i64 = row.get(0)?;
        let executor: String = row.get(5)?;
        let spec: String = row.get(6)?;
        let phase: String = row.get(8)?;
        let schedule: String = row.get(9)?;
        Ok(JobRow {
            id,
            uid: row.get(1)?,
            namespace: row.get(2)?,
            name: row.get(3)?,
            generation: row.get(4)?,
            executor: ExecutorKind::parse(&executor)
                .ok_or_else(|| corrupt(id, format!("executor {executor:?}")))?,
            spec: serde_json::from_str(&spec).map_err(|e| corrupt(id, format!("spec: {e}")))?,
            priority: row.get(7)?,
            phase: JobPhase::parse(&phase)
                .ok_or_else(|| corrupt(id, format!("phase {phase:?}")))?,
            schedule_state: ScheduleState::parse(&schedule)
                .ok_or_else(|| corrupt(id, format!("schedule state {schedule:?}")))?,
            message: row.get(10)?,
            queue_position: row.get(11)?,
            cancel_requested: row.get(12)?,
            deleting: row.get(13)?,
            controller_pid: row.get(14)?,
            controller_start_time: row.get::<_, Option<i64>>(15)?.map(|t| t as u64),
            controller_starts: row.get(16)?,
            controller_crashes: row.get(17)?,
            attempt: row.get(18)?,
            launched_attempt: row.get(19)?,
            recovery_count: row.get(20)?,
            restart_count: row.get(21)?,
            exit_code: row.get(22)?,
            failure_reason: row.get(23)?,
            workload: row.get(24)?,
            backoff_until_ms: row.get(25)?,
            submitted_at_ms: row.get(26)?,
            started_at_ms: row.get(27)?,
            finished_at_ms: row.get(28)?,
            phase_changed_at_ms: row.get(29)?,
            status_version: row.get(30)?,
            synced_version: row.get(31)?,
            created_at_ms: row.get(32)?,
            changed_seq: row.get(33)?,
            unsynced_since_seq: row.get(34)?,
        })
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The state a compare-and-set expects to find.
#[derive(Clone, Debug, Default)]
pub struct Expect {
    /// Accepted current phases (empty = any).
    pub phases: Vec<JobPhase>,
    /// Accepted current schedule states (empty = any).
    pub schedule: Vec<ScheduleState>,
}

impl Expect {
    /// Expect exactly this phase and schedule state.
    pub fn exactly(phase: JobPhase, schedule: ScheduleState) -> Expect {
        Expect {
            phases: vec![phase],
            schedule: vec![schedule],
        }
    }

    /// Expect the job to be in one of these schedule states, any phase.
    pub fn schedule(states: &[ScheduleState]) -> Expect {
        Expect {
            phases: vec![],
            schedule: states.to_vec(),
        }
    }

    fn matches(&self, row: &JobRow) -> bool {
        (self.phases.is_empty() || self.phases.contains(&row.phase))
            && (self.schedule.is_empty() || self.schedule.contains(&row.schedule_state))
    }
}

/// A change to apply in one transition. `None` fields stay as they are; `Some(None)` clears.
#[derive(Clone, Debug, Default)]
pub struct Change {
    /// New phase.
    pub phase: Option<JobPhase>,
    /// New schedule state.
    pub schedule: Option<ScheduleState>,
    /// New message.
    pub message: Option<String>,
    /// Record a job controller process (pid, start time), or clear it.
    pub controller: Option<Option<(i32, u64)>>,
    /// New attempt number.
    pub attempt: Option<i32>,
    /// Record that the create of this attempt's workload is issued.
    pub launched_attempt: Option<i32>,
    /// New recovery count.
    pub recovery_count: Option<i32>,
    /// New restart count.
    pub restart_count: Option<i32>,
    /// New exit code.
    pub exit_code: Option<Option<i32>>,
    /// New failure reason.
    pub failure_reason: Option<Option<String>>,
    /// New workload description.
    pub workload: Option<Option<String>>,
    /// New back-off deadline.
    pub backoff_until_ms: Option<Option<i64>>,
    /// Set started_at (only if still unset).
    pub started_now: bool,
    /// Count one more job controller start.
    pub controller_started: bool,
    /// Count one more job controller crash.
    pub controller_crashed: bool,
    /// Reason recorded in the history (CamelCase).
    pub reason: &'static str,
}

/// What a compare-and-set found.
#[derive(Debug)]
pub enum Cas {
    /// Applied; the row after the change.
    Applied(Box<JobRow>),
    /// Not applied: the row was not in the expected state; here is what it holds now.
    Conflict(Box<JobRow>),
}

impl Cas {
    /// The row after the change, if applied.
    pub fn applied(self) -> Option<JobRow> {
        match self {
            Cas::Applied(row) => Some(*row),
            Cas::Conflict(_) => None,
        }
    }
}

/// Outcome of mirroring a ManagedJob into the store.
#[derive(Debug)]
pub struct Upserted {
    /// The row now stored.
    pub row: JobRow,
    /// True when this call inserted it.
    pub inserted: bool,
}

/// One entry of a job's history.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    /// Position in the history (increasing).
    pub id: i64,
    /// When (ms since epoch).
    pub at_ms: i64,
    /// Phase before (None at insert).
    pub from_phase: Option<String>,
    /// Phase after.
    pub to_phase: String,
    /// Schedule state before.
    pub from_schedule: Option<String>,
    /// Schedule state after.
    pub to_schedule: String,
    /// CamelCase reason.
    pub reason: String,
    /// Message at that time.
    pub message: String,
}

/// What the operator's shared Pod watch last saw of one attempt's Pod (the pod executor's
/// input; job controllers read it instead of watching or polling the API).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodObservation {
    /// The job.
    pub job_id: i64,
    /// The attempt the Pod belongs to.
    pub attempt: i32,
    /// The Pod's name.
    pub pod_name: String,
    /// `pending`, `unschedulable`, `running`, `succeeded`, `failed`, `setup-failed` or `lost`.
    pub state: String,
    /// Exit code of the failing container, when there is one.
    pub exit_code: Option<i32>,
    /// CamelCase reason (e.g. `OOMKilled`, `EvictionByEvictionAPI`).
    pub reason: String,
    /// Human-readable detail (e.g. the scheduler's "0/4 nodes are available: ...").
    pub message: String,
    /// The Pod is gone from the API.
    pub deleted: bool,
}

/// Counts the scheduler needs (DESIGN.md section 4's invariants).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotUsage {
    /// Jobs in Launching (launch slots in use).
    pub launching: usize,
    /// Jobs in Launching, Alive or AliveWaiting (run slots in use).
    pub alive: usize,
    /// Jobs in Waiting.
    pub waiting: usize,
    /// Jobs in AliveWaiting.
    pub alive_waiting: usize,
}

/// A handle on the SQLite file. Not `Sync`: each process (and each thread) opens its own.
pub struct Store {
    conn: Connection,
}

impl Store {
    /// Opens (creating if needed) the store at `path`, in WAL mode, and migrates its schema.
    ///
    /// `cache_kib` sizes SQLite's page cache: the operator uses a few MiB, a job controller
    /// process a few pages (SQLite's 2 MiB default would dominate its private memory).
    pub fn open(path: &Path, cache_kib: u32) -> Result<Store> {
        let mut conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        conn.pragma_update(None, "cache_size", -(cache_kib as i64))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", true)?;
        migrations().to_latest(&mut conn)?;
        Ok(Store { conn })
    }

    /// Opens a throw-away store in memory (tests and property tests).
    pub fn in_memory() -> Result<Store> {
        let mut conn = Connection::open_in_memory()?;
        migrations().to_latest(&mut conn)?;
        Ok(Store { conn })
    }

    /// The job with this id.
    pub fn get(&self, id: i64) -> Result<JobRow> {
        self.find(id)?.ok_or(StoreError::NotFound(id))
    }

    /// The job with this id, if any.
    pub fn find(&self, id: i64) -> Result<Option<JobRow>> {
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1");
        Ok(self
            .conn
            .query_row(&sql, [id], JobRow::from_row)
            .optional()?)
    }

    /// The job mirrored from the object with this uid, if any.
    pub fn find_by_uid(&self, uid: &str) -> Result<Option<JobRow>> {
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE uid = ?1");
        Ok(self
            .conn
            .query_row(&sql, [uid], JobRow::from_row)
            .optional()?)
    }

    /// Jobs named `namespace/name` (newest first; a name can be reused after deletion).
    pub fn find_by_name(&self, namespace: &str, name: &str) -> Result<Vec<JobRow>> {
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE namespace = ?1 AND name = ?2 ORDER BY id DESC"
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map(params![namespace, name], JobRow::from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Every job, by id.
    pub fn all(&self) -> Result<Vec<JobRow>> {
        self.select("1 = 1 ORDER BY id", [])
    }

    fn select<P: rusqlite::Params>(&self, where_clause: &str, p: P) -> Result<Vec<JobRow>> {
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE {where_clause}");
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map(p, JobRow::from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// [`Store::upsert_created`] for an object created now.
    pub fn upsert(
        &mut self,
        uid: &str,
        namespace: &str,
        name: &str,
        generation: i64,
        spec: &ManagedJobSpec,
    ) -> Result<Upserted> {
        self.upsert_created(uid, namespace, name, generation, spec, now_ms(), None)
    }

    /// Mirrors a ManagedJob: inserts it as Pending/Waiting at first sight (the job is submitted
    /// at once), otherwise updates its generation and priority. `created_at_ms` is the object's
    /// `metadata.creationTimestamp`: FIFO within a priority follows it (then the job id), so the
    /// order in which the operator happens to see objects does not reorder the queue.
    ///
    /// `known` is the status the object already carries. When it shows a terminal phase (the
    /// store lost the job, e.g. a new state dir), the job is stored Done with that phase and is
    /// never run again: terminal jobs keep their final status (DESIGN.md section 7).
    #[allow(clippy::too_many_arguments)]
    pub fn upsert_created(
        &mut self,
        uid: &str,
        namespace: &str,
        name: &str,
        generation: i64,
        spec: &ManagedJobSpec,
        created_at_ms: i64,
        known: Option<&crate::api::ManagedJobStatus>,
    ) -> Result<Upserted> {
        // A job created already cancelled is stored with its cancel request, so no pass can
        // admit it before the request is acted on.
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let existing: Option<(i64, i64, i32)> = tx
            .query_row(
                "SELECT id, generation, priority FROM jobs WHERE uid = ?1",
                [uid],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let (id, inserted) = match existing {
            Some((id, old_generation, old_priority)) => {
                if old_generation != generation || old_priority != spec.priority {
                    tx.execute(
                        "UPDATE jobs SET generation = ?2, priority = ?3,
                            status_version = status_version + 1 WHERE id = ?1",
                        params![id, generation, spec.priority],
                    )?;
                }
                (id, false)
            }
            None => {
                let now = now_ms();
                let spec_json = serde_json::to_string(spec).expect("a spec serializes");
                tx.execute(
                    "INSERT INTO jobs (uid, namespace, name, generation, executor, spec, priority,
                        phase, schedule_state, message, submitted_at_ms, phase_changed_at_ms,
                        created_at_ms, cancel_requested)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'Pending', 'Waiting', ?8, ?9, ?9, ?10,
                        ?11)",
                    params![
                        uid,
                        namespace,
                        name,
                        generation,
                        spec.executor().as_str(),
                        spec_json,
                        spec.priority,
                        "queued: waiting for a launch slot",
                        now,
                        created_at_ms,
                        spec.cancel
                    ],
                )?;
                let id = tx.last_insert_rowid();
                for (from, to, reason) in [
                    (None, ScheduleState::Inactive, "Created"),
                    (
                        Some(ScheduleState::Inactive),
                        ScheduleState::Waiting,
                        "Submitted",
                    ),
                ] {
                    tx.execute(
                        "INSERT INTO transitions (job_id, at_ms, from_phase, to_phase,
                            from_schedule, to_schedule, reason)
                         VALUES (?1, ?2, ?3, 'Pending', ?4, ?5, ?6)",
                        params![
                            id,
                            now,
                            from.map(|_| "Pending"),
                            from.map(|s| s.as_str()),
                            to.as_str(),
                            reason
                        ],
                    )?;
                }
                let position: i64 = tx.query_row(
                    "SELECT count(*) FROM jobs WHERE schedule_state = 'Waiting'
                        AND (priority > ?1 OR (priority = ?1 AND (created_at_ms < ?3
                            OR (created_at_ms = ?3 AND id <= ?2))))",
                    params![spec.priority, id, created_at_ms],
                    |r| r.get(0),
                )?;
                // Its Submitted transition starts the job's unwritten changes.
                let seq = tx.last_insert_rowid();
                tx.execute(
                    "UPDATE jobs SET queue_position = ?2, changed_seq = ?3,
                        unsynced_since_seq = ?3 WHERE id = ?1",
                    params![id, position, seq],
                )?;
                if let Some(k) = known
                    && let Some(phase) = k.phase.filter(|p| p.is_terminal())
                {
                    tx.execute(
                        "UPDATE jobs SET phase = ?2, schedule_state = 'Done', exit_code = ?3,
                            failure_reason = ?4, attempt = ?5, recovery_count = ?6,
                            restart_count = ?7, finished_at_ms = ?8, queue_position = NULL,
                            message = ?9, workload = ?10
                         WHERE id = ?1",
                        params![
                            id,
                            phase.as_str(),
                            k.exit_code,
                            k.failure_reason,
                            k.attempt,
                            k.recovery_count,
                            k.restart_count,
                            now,
                            k.message.clone().unwrap_or_default(),
                            k.workload
                        ],
                    )?;
                    tx.execute(
                        "INSERT INTO transitions (job_id, at_ms, from_phase, to_phase,
                            from_schedule, to_schedule, reason, message)
                         VALUES (?1, ?2, 'Pending', ?3, 'Waiting', 'Done', 'KeptFinalStatus',
                            'the object already carried a final status')",
                        params![id, now, phase.as_str()],
                    )?;
                }
                (id, true)
            }
        };
        tx.commit()?;
        Ok(Upserted {
            row: self.get(id)?,
            inserted,
        })
    }

    /// Compare-and-set: applies `change` only if the job is in a state `expect` accepts, and
    /// records the transition in the history. Nothing ever leaves Done.
    pub fn transition(&mut self, id: i64, expect: &Expect, change: &Change) -> Result<Cas> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1");
        let before = tx
            .query_row(&sql, [id], JobRow::from_row)
            .optional()?
            .ok_or(StoreError::NotFound(id))?;
        if !expect.matches(&before) || before.schedule_state == ScheduleState::Done {
            return Ok(Cas::Conflict(Box::new(before)));
        }
        let now = now_ms();
        let mut after = before.clone();
        if let Some(p) = change.phase {
            if p != after.phase {
                after.phase_changed_at_ms = now;
            }
            after.phase = p;
            if p.is_terminal() && after.finished_at_ms.is_none() {
                after.finished_at_ms = Some(now);
            }
        }
        if let Some(s) = change.schedule {
            after.schedule_state = s;
        }
        if let Some(m) = &change.message {
            after.message = m.clone();
        }
        if let Some(c) = change.controller {
            after.controller_pid = c.map(|(pid, _)| pid);
            after.controller_start_time = c.map(|(_, t)| t);
        }
        if let Some(a) = change.attempt {
            after.attempt = a;
        }
        if let Some(a) = change.launched_attempt {
            after.launched_attempt = a;
        }
        if let Some(n) = change.recovery_count {
            after.recovery_count = n;
        }
        if let Some(n) = change.restart_count {
            after.restart_count = n;
        }
        if let Some(c) = change.exit_code {
            after.exit_code = c;
        }
        if let Some(r) = &change.failure_reason {
            after.failure_reason = r.clone();
        }
        if let Some(w) = &change.workload {
            after.workload = w.clone();
        }
        if let Some(b) = change.backoff_until_ms {
            after.backoff_until_ms = b;
        }
        if change.started_now && after.started_at_ms.is_none() {
            after.started_at_ms = Some(now);
        }
        if change.controller_started {
            after.controller_starts += 1;
        }
        if change.controller_crashed {
            after.controller_crashes += 1;
        }
        if after.schedule_state != ScheduleState::Waiting {
            after.queue_position = None;
        }
        after.status_version += 1;
        tx.execute(
            "UPDATE jobs SET phase = ?2, schedule_state = ?3, message = ?4, controller_pid = ?5,
                controller_start_time = ?6, attempt = ?7, launched_attempt = ?8,
                recovery_count = ?9, restart_count = ?10, exit_code = ?11, failure_reason = ?12,
                workload = ?13, backoff_until_ms = ?14, started_at_ms = ?15, finished_at_ms = ?16,
                phase_changed_at_ms = ?17, controller_starts = ?18, controller_crashes = ?19,
                queue_position = ?20, status_version = ?21
             WHERE id = ?1",
            params![
                id,
                after.phase.as_str(),
                after.schedule_state.as_str(),
                after.message,
                after.controller_pid,
                after.controller_start_time.map(|t| t as i64),
                after.attempt,
                after.launched_attempt,
                after.recovery_count,
                after.restart_count,
                after.exit_code,
                after.failure_reason,
                after.workload,
                after.backoff_until_ms,
                after.started_at_ms,
                after.finished_at_ms,
                after.phase_changed_at_ms,
                after.controller_starts,
                after.controller_crashes,
                after.queue_position,
                after.status_version,
            ],
        )?;
        if before.phase != after.phase || before.schedule_state != after.schedule_state {
            tx.execute(
                "INSERT INTO transitions (job_id, at_ms, from_phase, to_phase, from_schedule,
                    to_schedule, reason, message)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    id,
                    now,
                    before.phase.as_str(),
                    after.phase.as_str(),
                    before.schedule_state.as_str(),
                    after.schedule_state.as_str(),
                    change.reason,
                    after.message
                ],
            )?;
            let seq = tx.last_insert_rowid();
            // Had the API seen every earlier change? Then this one starts the unsynced run.
            let was_synced = before.status_version <= before.synced_version;
            tx.execute(
                "UPDATE jobs SET changed_seq = ?2,
                    unsynced_since_seq = CASE WHEN ?3 THEN ?2 ELSE unsynced_since_seq END
                 WHERE id = ?1",
                params![id, seq, was_synced],
            )?;
            after.changed_seq = seq;
            if was_synced {
                after.unsynced_since_seq = seq;
            }
        }
        tx.commit()?;
        Ok(Cas::Applied(Box::new(after)))
    }

    /// Persists a cancel request (idempotent). Returns the row after it.
    pub fn request_cancel(&mut self, id: i64, deleting: bool) -> Result<JobRow> {
        self.conn.execute(
            "UPDATE jobs SET cancel_requested = 1, deleting = max(deleting, ?2),
                status_version = status_version + (cancel_requested = 0)
             WHERE id = ?1",
            params![id, deleting],
        )?;
        self.get(id)
    }

    /// Removes a job and its history (after its object is gone).
    pub fn delete(&mut self, id: i64) -> Result<()> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.execute("DELETE FROM transitions WHERE job_id = ?1", [id])?;
        tx.execute("DELETE FROM pod_observations WHERE job_id = ?1", [id])?;
        tx.execute("DELETE FROM jobs WHERE id = ?1", [id])?;
        tx.commit()?;
        Ok(())
    }

    /// Slots in use and queue lengths, from the partial indexes (cost independent of the number
    /// of finished jobs).
    pub fn slot_usage(&self) -> Result<SlotUsage> {
        let mut usage = SlotUsage::default();
        let mut stmt = self.conn.prepare_cached(
            "SELECT schedule_state, count(*) FROM jobs
             WHERE schedule_state IN ('Launching', 'Alive', 'AliveWaiting') GROUP BY schedule_state",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
        for row in rows {
            let (state, n) = row?;
            let n = n as usize;
            usage.alive += n;
            match state.as_str() {
                "Launching" => usage.launching = n,
                "AliveWaiting" => usage.alive_waiting = n,
                _ => {}
            }
        }
        usage.waiting = self.conn.query_row(
            "SELECT count(*) FROM jobs WHERE schedule_state = 'Waiting'",
            [],
            |r| r.get::<_, i64>(0),
        )? as usize;
        Ok(usage)
    }

    /// Number of jobs per (phase, schedule state) pair, for metrics.
    pub fn counts_by_state(&self) -> Result<Vec<(JobPhase, ScheduleState, i64)>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT phase, schedule_state, count(*) FROM jobs GROUP BY phase, schedule_state",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (p, s, n) = row?;
            if let (Some(p), Some(s)) = (JobPhase::parse(&p), ScheduleState::parse(&s)) {
                out.push((p, s, n));
            }
        }
        Ok(out)
    }

    /// Up to `limit` jobs in `state` (Waiting or AliveWaiting) in admission order: higher
    /// priority first, then earlier creation, then lower id (FIFO within a priority). Jobs whose
    /// cancel is requested are never admitted: a cancel costs no slot and starts no process.
    pub fn queue_head(&self, state: ScheduleState, limit: usize) -> Result<Vec<JobRow>> {
        self.select(
            "schedule_state = ?1 AND cancel_requested = 0
             ORDER BY priority DESC, created_at_ms, id LIMIT ?2",
            params![state.as_str(), limit as i64],
        )
    }

    /// Jobs holding a run slot (Launching, Alive, AliveWaiting).
    pub fn live_jobs(&self) -> Result<Vec<JobRow>> {
        self.select(
            "schedule_state IN ('Launching', 'Alive', 'AliveWaiting') ORDER BY id",
            [],
        )
    }

    /// Jobs whose status changed since it was last written to the API, in the order that keeps
    /// the API's view within the caps: finished jobs first (their final status is what users and
    /// GitOps tools wait for), then other jobs holding no slot, then jobs holding only a run
    /// slot, then jobs holding a launch slot; oldest first within each.
    pub fn unsynced(&self, limit: usize) -> Result<Vec<JobRow>> {
        self.select(
            "status_version > synced_version
             ORDER BY CASE schedule_state WHEN 'Done' THEN 0 WHEN 'Launching' THEN 3
                 WHEN 'Alive' THEN 2 WHEN 'AliveWaiting' THEN 2 ELSE 1 END, id LIMIT ?1",
            [limit as i64],
        )
    }

    /// Records that `version` of a job's status reached the API.
    pub fn mark_synced(&mut self, id: i64, version: i64) -> Result<()> {
        self.conn.execute(
            "UPDATE jobs SET synced_version = max(synced_version, ?2) WHERE id = ?1",
            params![id, version],
        )?;
        Ok(())
    }

    /// Jobs not Done whose cancel was requested (the operator acts on each).
    pub fn pending_cancels(&self) -> Result<Vec<JobRow>> {
        self.select(
            "cancel_requested = 1 AND schedule_state != 'Done' ORDER BY id",
            [],
        )
    }

    /// A job's history, oldest first.
    pub fn history(&self, id: i64) -> Result<Vec<Transition>> {
        self.history_after(id, 0)
    }

    /// A job's history after the transition with id `after`, oldest first.
    pub fn history_after(&self, id: i64, after: i64) -> Result<Vec<Transition>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, at_ms, from_phase, to_phase, from_schedule, to_schedule, reason, message
             FROM transitions WHERE job_id = ?1 AND id > ?2 ORDER BY id",
        )?;
        let rows = stmt.query_map(params![id, after], |r| {
            Ok(Transition {
                id: r.get(0)?,
                at_ms: r.get(1)?,
                from_phase: r.get(2)?,
                to_phase: r.get(3)?,
                from_schedule: r.get(4)?,
                to_schedule: r.get(5)?,
                reason: r.get(6)?,
                message: r.get(7)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Records what the Pod watch saw; returns true when it differs from what was stored.
    pub fn record_pod(&mut self, o: &PodObservation) -> Result<bool> {
        let changed = self.conn.execute(
            "INSERT INTO pod_observations (job_id, attempt, pod_name, state, exit_code, reason,
                message, deleted, observed_at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
             ON CONFLICT (job_id, attempt) DO UPDATE SET pod_name = excluded.pod_name,
                state = excluded.state, exit_code = excluded.exit_code, reason = excluded.reason,
                message = excluded.message, deleted = excluded.deleted,
                observed_at_ms = excluded.observed_at_ms
             WHERE state != excluded.state OR exit_code IS NOT excluded.exit_code
                OR reason != excluded.reason OR message != excluded.message
                OR deleted != excluded.deleted",
            params![
                o.job_id,
                o.attempt,
                o.pod_name,
                o.state,
                o.exit_code,
                o.reason,
                o.message,
                o.deleted,
                now_ms()
            ],
        )?;
        Ok(changed > 0)
    }

    /// The latest observation of an attempt's Pod.
    pub fn pod_observation(&self, job_id: i64, attempt: i32) -> Result<Option<PodObservation>> {
        Ok(self
            .conn
            .query_row(
                "SELECT job_id, attempt, pod_name, state, exit_code, reason, message, deleted
                 FROM pod_observations WHERE job_id = ?1 AND attempt = ?2",
                params![job_id, attempt],
                |r| {
                    Ok(PodObservation {
                        job_id: r.get(0)?,
                        attempt: r.get(1)?,
                        pod_name: r.get(2)?,
                        state: r.get(3)?,
                        exit_code: r.get(4)?,
                        reason: r.get(5)?,
                        message: r.get(6)?,
                        deleted: r.get(7)?,
                    })
                },
            )
            .optional()?)
    }

    /// Reads a setting written by the operator.
    pub fn setting(&self, key: &str) -> Result<Option<String>> {
        Ok(self
            .conn
            .query_row("SELECT value FROM settings WHERE key = ?1", [key], |r| {
                r.get(0)
            })
            .optional()?)
    }

    /// Writes a setting (the operator shares its configuration with job controllers this way).
    pub fn set_setting(&mut self, key: &str, value: &str) -> Result<()> {
        self.conn.execute(
            "INSERT INTO settings (key, value) VALUES (?1, ?2)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            params![key, value],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ManagedJobSpec {
        ManagedJobSpec {
            run: Some("true".into()),
            ..Default::default()
        }
    }

    #[test]
    fn upsert_assigns_ids_and_queues() {
        let mut store = Store::in_memory().unwrap();
        let a = store.upsert("u1", "ns", "a", 1, &spec()).unwrap();
        assert!(a.inserted);
        assert_eq!(a.row.phase, JobPhase::Pending);
        assert_eq!(a.row.schedule_state, ScheduleState::Waiting);
        assert_eq!(a.row.queue_position, Some(1));
        let again = store.upsert("u1", "ns", "a", 1, &spec()).unwrap();
        assert!(!again.inserted);
        assert_eq!(again.row.id, a.row.id);
        let b = store.upsert("u2", "ns", "b", 1, &spec()).unwrap();
        assert_eq!(b.row.queue_position, Some(2));
        assert_eq!(store.history(a.row.id).unwrap().len(), 2);
    }

    #[test]
    fn failed_cas_reports_current_row_and_changes_nothing() {
        let mut store = Store::in_memory().unwrap();
        let id = store.upsert("u1", "ns", "a", 1, &spec()).unwrap().row.id;
        let change = Change {
            schedule: Some(ScheduleState::Launching),
            reason: "Admitted",
            ..Default::default()
        };
        let expect = Expect::exactly(JobPhase::Pending, ScheduleState::Waiting);
        assert!(matches!(
            store.transition(id, &expect, &change).unwrap(),
            Cas::Applied(_)
        ));
        match store.transition(id, &expect, &change).unwrap() {
            Cas::Conflict(row) => assert_eq!(row.schedule_state, ScheduleState::Launching),
            Cas::Applied(_) => panic!("second CAS must fail"),
        }
    }

    #[test]
    fn nothing_leaves_done() {
        let mut store = Store::in_memory().unwrap();
        let id = store.upsert("u1", "ns", "a", 1, &spec()).unwrap().row.id;
        let done = Change {
            phase: Some(JobPhase::Cancelled),
            schedule: Some(ScheduleState::Done),
            reason: "Cancelled",
            ..Default::default()
        };
        store.transition(id, &Expect::default(), &done).unwrap();
        let back = Change {
            schedule: Some(ScheduleState::Waiting),
            reason: "Bug",
            ..Default::default()
        };
        assert!(matches!(
            store.transition(id, &Expect::default(), &back).unwrap(),
            Cas::Conflict(_)
        ));
        assert!(store.get(id).unwrap().finished_at_ms.is_some());
    }
}
