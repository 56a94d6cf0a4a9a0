//! Jobs: mirroring ManagedJobs in, the compare-and-set of every transition, and the queries of
//! the scheduler, the status writer and the CLI.

use rusqlite::{OptionalExtension, params};

use super::history;
use super::row::JOB_COLUMNS;
use super::{JobRow, Result, Store, StoreError};
use crate::api::{JobPhase, ManagedJobSpec, ScheduleState};
use crate::capacity::SlotUsage;
use crate::lifecycle::{self, Change, LaunchClock, Reason, Transition, now_ms};

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

/// A job as the world check reads it when it holds no slot ([`Store::pending_jobs_brief`],
/// [`Store::done_jobs_brief`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobBrief {
    /// Store id.
    pub id: i64,
    /// Its object's uid.
    pub uid: String,
    /// Its object's namespace.
    pub namespace: String,
    /// Its executor.
    pub executor: crate::api::ExecutorKind,
    /// A cancel for a deletion is requested.
    pub deleting: bool,
    /// Attempts whose files it may have.
    pub attempts: i32,
}

/// Outcome of mirroring a ManagedJob into the store.
#[derive(Debug)]
pub struct Upserted {
    /// The row now stored.
    pub row: JobRow,
    /// True when this call inserted it.
    pub inserted: bool,
}

impl Store {
    /// The job with this id.
    pub fn get(&self, id: i64) -> Result<JobRow> {
        self.find(id)?.ok_or(StoreError::NotFound(id))
    }

    /// The job with this id, if any.
    pub fn find(&self, id: i64) -> Result<Option<JobRow>> {
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1");
        let mut stmt = self.conn.prepare_cached(&sql)?;
        Ok(stmt.query_row([id], JobRow::from_row).optional()?)
    }

    /// The job mirrored from the object with this uid, if any.
    pub fn find_by_uid(&self, uid: &str) -> Result<Option<JobRow>> {
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE uid = ?1");
        let mut stmt = self.conn.prepare_cached(&sql)?;
        Ok(stmt.query_row([uid], JobRow::from_row).optional()?)
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
            .prepare_cached("SELECT id, generation, priority FROM jobs WHERE uid = ?1")?
            .query_row([uid], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .optional()?;
        let (id, inserted) = match existing {
            Some((id, old_generation, old_priority)) => {
                if old_generation != generation || old_priority != spec.priority {
                    // Of the stored spec only `cancel` follows the object (the API keeps the
                    // rest immutable; priority has its own column): the status of a finished
                    // job tells whether its spec still asks for the cancel.
                    tx.prepare_cached(
                        "UPDATE jobs SET generation = ?2, priority = ?3,
                            spec = json_set(spec, '$.cancel', json(?4)),
                            status_version = status_version + 1 WHERE id = ?1",
                    )?
                    .execute(params![
                        id,
                        generation,
                        spec.priority,
                        if spec.cancel { "true" } else { "false" }
                    ])?;
                }
                (id, false)
            }
            None => {
                let now = now_ms();
                let spec_json = serde_json::to_string(spec).expect("a spec serializes");
                tx.prepare_cached(
                    "INSERT INTO jobs (uid, namespace, name, generation, executor, spec, priority,
                        phase, schedule_state, message, submitted_at_ms, phase_changed_at_ms,
                        queued_at_ms, cancel_requested, tasks)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'Pending', 'Waiting', ?8, ?9, ?9, ?10,
                        ?11, ?12)",
                )?
                .execute(params![
                    uid,
                    namespace,
                    name,
                    generation,
                    spec.executor().as_str(),
                    spec_json,
                    spec.priority,
                    "queued: waiting to be admitted",
                    now,
                    created_at_ms,
                    spec.cancel,
                    serde_json::to_string(&lifecycle::tasks::initial_records(spec))
                        .expect("task records serialize"),
                ])?;
                let id = tx.last_insert_rowid();
                let pending = JobPhase::Pending;
                for (from, to, reason) in [
                    (None, ScheduleState::Inactive, Reason::Created),
                    (
                        Some((pending, ScheduleState::Inactive)),
                        ScheduleState::Waiting,
                        Reason::Submitted,
                    ),
                ] {
                    history::record(&tx, id, now, from, (pending, to), reason, "")?;
                }
                let position: i64 = tx
                    .prepare_cached(
                        "SELECT count(*) FROM jobs
                            WHERE schedule_state IN ('Waiting', 'AliveWaiting')
                            AND schedule_state = 'Waiting'
                            AND (priority > ?1 OR (priority = ?1 AND (queued_at_ms < ?3
                                OR (queued_at_ms = ?3 AND id <= ?2))))",
                    )?
                    .query_row(params![spec.priority, id, created_at_ms], |r| r.get(0))?;
                // Its Submitted transition starts the job's unwritten changes.
                let seq = tx.last_insert_rowid();
                tx.prepare_cached(
                    "UPDATE jobs SET queue_position = ?2, changed_seq = ?3,
                        unsynced_since_seq = ?3 WHERE id = ?1",
                )?
                .execute(params![id, position, seq])?;
                if let Some(k) = known
                    && let Some(phase) = k.phase.filter(|p| p.is_terminal())
                {
                    tx.prepare_cached(
                        "UPDATE jobs SET phase = ?2, schedule_state = 'Done', exit_code = ?3,
                            failure_reason = ?4, attempt = ?5, recovery_count = ?6,
                            restart_count = ?7, finished_at_ms = ?8, queue_position = NULL,
                            message = ?9, workload = ?10, task_index = ?11, tasks = ?12
                         WHERE id = ?1",
                    )?
                    .execute(params![
                        id,
                        phase.as_str(),
                        k.exit_code,
                        k.failure_reason,
                        k.attempt,
                        k.recovery_count,
                        k.restart_count,
                        now,
                        k.message.clone().unwrap_or_default(),
                        k.workload,
                        k.current_task.unwrap_or(0),
                        serde_json::to_string(&k.tasks).expect("task records serialize"),
                    ])?;
                    history::record(
                        &tx,
                        id,
                        now,
                        Some((JobPhase::Pending, ScheduleState::Waiting)),
                        (phase, ScheduleState::Done),
                        Reason::KeptFinalStatus,
                        "the object already carried a final status",
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

    /// Compare-and-set: applies the transition's change only if the job is in a state its
    /// guard accepts, and records it in the history. Nothing ever leaves Done.
    ///
    /// Errors: [`StoreError::NotFound`] without such a job; [`StoreError::Illegal`] (nothing
    /// written) when the change would break the state machines ([`lifecycle::check_edge`]).
    pub fn transition(&mut self, id: i64, t: &Transition) -> Result<Cas> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let before = read_job(&tx, id)?.ok_or(StoreError::NotFound(id))?;
        if !t.expect.matches(&before) {
            return Ok(Cas::Conflict(Box::new(before)));
        }
        let after = write_change(&tx, before, &t.change)?;
        tx.commit()?;
        Ok(Cas::Applied(Box::new(after)))
    }

    /// Reads the job, decides, and writes in one transaction: `decide` sees the row as it is and
    /// returns the transition to apply (None: nothing to do). For the operator's own
    /// bookkeeping (a controller started or exited), where no I/O sits between read and write.
    /// Returns the row after the change, or None when `decide` chose nothing or the guard it
    /// returned does not match.
    pub fn apply(
        &mut self,
        id: i64,
        decide: impl FnOnce(&JobRow) -> Option<Transition>,
    ) -> Result<Option<JobRow>> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let Some(before) = read_job(&tx, id)? else {
            return Ok(None);
        };
        let Some(t) = decide(&before) else {
            return Ok(None);
        };
        if !t.expect.matches(&before) {
            return Ok(None);
        }
        let after = write_change(&tx, before, &t.change)?;
        tx.commit()?;
        Ok(Some(after))
    }
}

fn read_job(tx: &rusqlite::Transaction<'_>, id: i64) -> Result<Option<JobRow>> {
    let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1");
    let mut stmt = tx.prepare_cached(&sql)?;
    Ok(stmt.query_row([id], JobRow::from_row).optional()?)
}

/// Applies `change` to `before` inside `tx` (the guard already matched): checks the edge,
/// updates the row, records a history entry when the phase or schedule state moved.
fn write_change(tx: &rusqlite::Transaction<'_>, before: JobRow, change: &Change) -> Result<JobRow> {
    lifecycle::check_edge(&before, change)?;
    let id = before.id;
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
    match change.launch_clock {
        Some(LaunchClock::Start) => after.launched_at_ms = Some(now),
        Some(LaunchClock::Clear) => after.launched_at_ms = None,
        None => {}
    }
    if let Some(n) = change.launch_timeouts {
        after.launch_timeouts = n;
    }
    match change.node_wait {
        Some(LaunchClock::Start) if after.node_wait_since_ms.is_none() => {
            after.node_wait_since_ms = Some(now)
        }
        Some(LaunchClock::Clear) => after.node_wait_since_ms = None,
        _ => {}
    }
    if change.requeue {
        after.queued_at_ms = now;
    }
    if change.started_now && after.started_at_ms.is_none() {
        after.started_at_ms = Some(now);
    }
    if let Some(task) = change.task_index {
        after.task_index = task;
        after.task_first_attempt = after.attempt;
        after.task_started_at_ms = None;
    }
    if change.started_now && after.task_started_at_ms.is_none() {
        after.task_started_at_ms = Some(now);
    }
    if change.controller_started {
        after.controller_starts += 1;
    }
    if change.reset_crashes {
        after.controller_crashes = 0;
    }
    if change.controller_crashed {
        after.controller_crashes += 1;
    }
    if after.schedule_state != ScheduleState::Waiting {
        after.queue_position = None;
    }
    lifecycle::tasks::follow(&before, change, &mut after, now);
    after.status_version += 1;
    let tasks = serde_json::to_string(&after.tasks).expect("task records serialize");
    tx.prepare_cached(
        "UPDATE jobs SET phase = ?2, schedule_state = ?3, message = ?4, controller_pid = ?5,
                controller_start_time = ?6, attempt = ?7, launched_attempt = ?8,
                recovery_count = ?9, restart_count = ?10, exit_code = ?11, failure_reason = ?12,
                workload = ?13, backoff_until_ms = ?14, started_at_ms = ?15, finished_at_ms = ?16,
                phase_changed_at_ms = ?17, controller_starts = ?18, controller_crashes = ?19,
                queue_position = ?20, status_version = ?21, launched_at_ms = ?22,
                launch_timeouts = ?23, task_index = ?24, task_first_attempt = ?25,
                task_started_at_ms = ?26, tasks = ?27, node_wait_since_ms = ?28,
                queued_at_ms = ?29
             WHERE id = ?1",
    )?
    .execute(params![
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
        after.launched_at_ms,
        after.launch_timeouts,
        after.task_index,
        after.task_first_attempt,
        after.task_started_at_ms,
        tasks,
        after.node_wait_since_ms,
        after.queued_at_ms,
    ])?;
    if before.phase != after.phase || before.schedule_state != after.schedule_state {
        let seq = history::record(
            tx,
            id,
            now,
            Some((before.phase, before.schedule_state)),
            (after.phase, after.schedule_state),
            change.reason,
            &after.message,
        )?;
        // Had the API seen every earlier change? Then this one starts the unsynced run.
        let was_synced = before.status_version <= before.synced_version;
        tx.prepare_cached(
            "UPDATE jobs SET changed_seq = ?2,
                    unsynced_since_seq = CASE WHEN ?3 THEN ?2 ELSE unsynced_since_seq END
                 WHERE id = ?1",
        )?
        .execute(params![id, seq, was_synced])?;
        after.changed_seq = seq;
        if was_synced {
            after.unsynced_since_seq = seq;
        }
    }
    Ok(after)
}

impl Store {
    /// Number of jobs stored (0: a new or lost store, to be rebuilt before the first admission).
    pub fn job_count(&self) -> Result<i64> {
        Ok(self
            .conn
            .prepare_cached("SELECT count(*) FROM jobs")?
            .query_row([], |r| r.get(0))?)
    }

    /// Inserts a job rebuilt from its object's status ([`lifecycle::restore`]), under its
    /// status' job id when that id is free (otherwise a new one, logged), with one history entry
    /// ([`Reason::Restored`]). A finished job is stored as already written to the API, so its
    /// status is never rewritten. Returns the row, or the existing one when the uid is stored.
    #[allow(clippy::too_many_arguments)]
    pub fn restore(
        &mut self,
        uid: &str,
        namespace: &str,
        name: &str,
        generation: i64,
        spec: &ManagedJobSpec,
        created_at_ms: i64,
        r: &lifecycle::Restored,
    ) -> Result<JobRow> {
        if let Some(row) = self.find_by_uid(uid)? {
            return Ok(row);
        }
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let taken: bool = tx
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM jobs WHERE id = ?1)")?
            .query_row([r.job_id], |row| row.get(0))?;
        if taken {
            tracing::warn!(job_id = r.job_id, %namespace, %name, "two objects show one job id; this one gets a new id");
        }
        let now = now_ms();
        let spec_json = serde_json::to_string(spec).expect("a spec serializes");
        let synced = i64::from(r.synced);
        tx.prepare_cached(
            "INSERT INTO jobs (id, uid, namespace, name, generation, executor, spec, priority,
                phase, schedule_state, message, cancel_requested, attempt, launched_attempt,
                recovery_count, restart_count, exit_code, failure_reason, workload,
                submitted_at_ms, started_at_ms, finished_at_ms, phase_changed_at_ms,
                queued_at_ms, status_version, synced_version, task_index, task_first_attempt,
                task_started_at_ms, tasks)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17,
                ?18, ?19, ?20, ?21, ?22, ?23, ?24, 1, ?25, ?26, ?27, ?28, ?29)",
        )?
        .execute(params![
            (!taken).then_some(r.job_id),
            uid,
            namespace,
            name,
            generation,
            spec.executor().as_str(),
            spec_json,
            spec.priority,
            r.phase.as_str(),
            r.schedule.as_str(),
            r.message,
            r.cancel_requested,
            r.attempt,
            r.launched_attempt,
            r.recovery_count,
            r.restart_count,
            r.exit_code,
            r.failure_reason,
            r.workload,
            r.submitted_at_ms.unwrap_or(now),
            r.started_at_ms,
            r.finished_at_ms
                .or((r.schedule == ScheduleState::Done).then_some(now)),
            now,
            created_at_ms,
            synced,
            r.task_index,
            r.task_first_attempt,
            r.task_started_at_ms,
            serde_json::to_string(&r.tasks).expect("task records serialize"),
        ])?;
        let id = tx.last_insert_rowid();
        let seq = history::record(
            &tx,
            id,
            now,
            None,
            (r.phase, r.schedule),
            Reason::Restored,
            "rebuilt from the object's status after the store was lost",
        )?;
        tx.prepare_cached(
            "UPDATE jobs SET changed_seq = ?2, unsynced_since_seq = ?2 WHERE id = ?1",
        )?
        .execute(params![id, seq])?;
        tx.commit()?;
        self.get(id)
    }

    /// Persists a cancel request (idempotent). Returns the row after it.
    pub fn request_cancel(&mut self, id: i64, deleting: bool) -> Result<JobRow> {
        self.conn
            .prepare_cached(
                "UPDATE jobs SET cancel_requested = 1, deleting = max(deleting, ?2),
                status_version = status_version + (cancel_requested = 0)
             WHERE id = ?1",
            )?
            .execute(params![id, deleting])?;
        self.get(id)
    }

    /// Removes a job and its history (after its object is gone).
    pub fn delete(&mut self, id: i64) -> Result<()> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.prepare_cached("DELETE FROM transitions WHERE job_id = ?1")?
            .execute([id])?;
        tx.prepare_cached("DELETE FROM pod_observations WHERE job_id = ?1")?
            .execute([id])?;
        tx.prepare_cached("DELETE FROM events_published WHERE job_id = ?1")?
            .execute([id])?;
        tx.prepare_cached("DELETE FROM jobs WHERE id = ?1")?
            .execute([id])?;
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
            // The IN term, verbatim from the partial index jobs_queue, lets SQLite use it.
            "SELECT count(*) FROM jobs WHERE schedule_state IN ('Waiting', 'AliveWaiting')
                AND schedule_state = 'Waiting'",
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
    /// priority first, then earlier entry in the queue (creation, or a requeue), then lower id
    /// (FIFO within a priority). Jobs whose cancel is requested are never admitted: a cancel
    /// costs no slot and starts no process; nor are jobs in a back-off at `now_ms` (a job that
    /// gave its run slot back).
    pub fn queue_head(
        &self,
        state: ScheduleState,
        limit: usize,
        now_ms: i64,
    ) -> Result<Vec<JobRow>> {
        self.select(
            // SQLite uses a partial index only when the query repeats its WHERE term: without the
            // IN term, every pass would read the whole table, finished jobs included.
            "schedule_state IN ('Waiting', 'AliveWaiting') AND schedule_state = ?1
                AND cancel_requested = 0
                AND (?3 = 0 OR backoff_until_ms IS NULL OR backoff_until_ms <= ?3)
             ORDER BY priority DESC, queued_at_ms, id LIMIT ?2",
            params![state.as_str(), limit as i64, now_ms],
        )
    }

    /// True when some job waits for a run slot at `now_ms`: Waiting, not cancelled, not in a
    /// back-off (served by the queue's partial index).
    pub fn run_slot_wanted(&self, now_ms: i64) -> Result<bool> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM jobs
                 WHERE schedule_state IN ('Waiting', 'AliveWaiting') AND schedule_state = 'Waiting'
                    AND cancel_requested = 0
                    AND (backoff_until_ms IS NULL OR backoff_until_ms <= ?1))",
            )?
            .query_row([now_ms], |r| r.get(0))?)
    }

    /// Jobs holding a run slot whose Pod waits for a node (for the queue's messages).
    pub fn node_waits(&self) -> Result<usize> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT count(*) FROM jobs
                 WHERE schedule_state IN ('Launching', 'Alive', 'AliveWaiting')
                    AND node_wait_since_ms IS NOT NULL",
            )?
            .query_row([], |r| r.get::<_, i64>(0))? as usize)
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
        self.conn
            .prepare_cached(
                "UPDATE jobs SET synced_version = max(synced_version, ?2) WHERE id = ?1",
            )?
            .execute(params![id, version])?;
        Ok(())
    }

    /// Every Done job, briefly (for the world check, [`crate::lifecycle::world`], which
    /// forgets those whose object is gone); reads a few small columns per finished job.
    pub fn done_jobs_brief(&self) -> Result<Vec<JobBrief>> {
        self.briefly("schedule_state = 'Done'")
    }

    /// Every job not admitted yet (Inactive, Waiting), briefly. For the world check: such a
    /// job has no workload, only an object.
    pub fn pending_jobs_brief(&self) -> Result<Vec<JobBrief>> {
        self.briefly("schedule_state IN ('Inactive', 'Waiting')")
    }

    fn briefly(&self, where_clause: &str) -> Result<Vec<JobBrief>> {
        let sql = format!(
            "SELECT id, uid, namespace, executor, deleting, max(attempt, launched_attempt)
             FROM jobs WHERE {where_clause}"
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map([], |r| {
            let executor: String = r.get(3)?;
            Ok(JobBrief {
                id: r.get(0)?,
                uid: r.get(1)?,
                namespace: r.get(2)?,
                executor: crate::api::ExecutorKind::parse(&executor)
                    .unwrap_or(crate::api::ExecutorKind::Local),
                deleting: r.get(4)?,
                attempts: r.get(5)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Jobs not Done whose cancel was requested (the operator acts on each).
    pub fn pending_cancels(&self) -> Result<Vec<JobRow>> {
        self.select(
            "cancel_requested = 1 AND schedule_state != 'Done' ORDER BY id",
            [],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::{self as lc, Expect};

    /// Every query of a scheduling pass (and of the operator's per-pass reads) is served by an
    /// index: none reads the whole jobs table, so finished jobs never slow a pass down.
    #[test]
    fn the_pass_queries_never_scan_the_jobs_table() {
        let store = Store::in_memory().unwrap();
        let plan = |sql: &str| -> Vec<String> {
            let mut stmt = store
                .conn
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .unwrap();
            // A parameter bound to a literal, as the queries bind them.
            let n = stmt.parameter_count();
            let params: Vec<Box<dyn rusqlite::ToSql>> = (1..=n)
                .map(|i| -> Box<dyn rusqlite::ToSql> {
                    if i == 1 && sql.contains("schedule_state = ?1") {
                        Box::new("Waiting")
                    } else {
                        Box::new(1i64)
                    }
                })
                .collect();
            let rows = stmt
                .query_map(rusqlite::params_from_iter(params.iter()), |r| {
                    r.get::<_, String>(3)
                })
                .unwrap();
            rows.map(|r| r.unwrap()).collect()
        };
        let select = |w: &str| format!("SELECT {JOB_COLUMNS} FROM jobs WHERE {w}");
        let queries = [
            select(
                "schedule_state IN ('Waiting', 'AliveWaiting') AND schedule_state = ?1
                    AND cancel_requested = 0
                    AND (?3 = 0 OR backoff_until_ms IS NULL OR backoff_until_ms <= ?3)
                    ORDER BY priority DESC, queued_at_ms, id LIMIT ?2",
            ),
            select("schedule_state IN ('Launching', 'Alive', 'AliveWaiting') ORDER BY id"),
            select("cancel_requested = 1 AND schedule_state != 'Done' ORDER BY id"),
            select("status_version > synced_version ORDER BY id LIMIT ?1"),
            "SELECT schedule_state, count(*) FROM jobs
                 WHERE schedule_state IN ('Launching', 'Alive', 'AliveWaiting') GROUP BY schedule_state"
                .into(),
            "SELECT count(*) FROM jobs WHERE schedule_state IN ('Waiting', 'AliveWaiting')
                AND schedule_state = 'Waiting'"
                .into(),
        ];
        for sql in queries {
            let steps = plan(&sql);
            assert!(
                steps
                    .iter()
                    .all(|s| !s.starts_with("SCAN jobs") || s.contains("INDEX")),
                "{sql}\nreads the whole table: {steps:?}"
            );
        }
    }

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
        let history = store.history(a.row.id).unwrap();
        let reasons: Vec<Reason> = history.iter().map(|h| h.reason).collect();
        assert_eq!(reasons, [Reason::Created, Reason::Submitted]);
    }

    #[test]
    fn failed_cas_reports_current_row_and_changes_nothing() {
        let mut store = Store::in_memory().unwrap();
        let row = store.upsert("u1", "ns", "a", 1, &spec()).unwrap().row;
        let admit = lc::admit(&row);
        assert!(matches!(
            store.transition(row.id, &admit).unwrap(),
            Cas::Applied(_)
        ));
        match store.transition(row.id, &admit).unwrap() {
            Cas::Conflict(now) => assert_eq!(now.schedule_state, ScheduleState::Launching),
            Cas::Applied(_) => panic!("second CAS must fail"),
        }
    }

    #[test]
    fn nothing_leaves_done() {
        let mut store = Store::in_memory().unwrap();
        let row = store.upsert("u1", "ns", "a", 1, &spec()).unwrap().row;
        store.transition(row.id, &lc::cancel_queued(&row)).unwrap();
        let back = Transition {
            expect: Expect::default(),
            change: Change::because(Reason::Submitted)
                .to(JobPhase::Pending, ScheduleState::Waiting),
        };
        assert!(matches!(
            store.transition(row.id, &back).unwrap(),
            Cas::Conflict(_)
        ));
        assert!(store.get(row.id).unwrap().finished_at_ms.is_some());
    }

    #[test]
    fn an_illegal_edge_is_an_error_and_writes_nothing() {
        let mut store = Store::in_memory().unwrap();
        let row = store.upsert("u1", "ns", "a", 1, &spec()).unwrap().row;
        // Waiting -> Alive skips the launch slot.
        let skip = Transition {
            expect: Expect::default(),
            change: Change::because(Reason::Running).to(JobPhase::Running, ScheduleState::Alive),
        };
        let err = store.transition(row.id, &skip).unwrap_err();
        assert!(matches!(err, StoreError::Illegal(_)), "{err}");
        assert!(
            err.to_string().contains("Pending/Waiting -> Running/Alive"),
            "{err}"
        );
        // Done with a phase that is not terminal.
        let half = Transition {
            expect: Expect::default(),
            change: Change::because(Reason::Failed).to(JobPhase::Running, ScheduleState::Done),
        };
        assert!(store.transition(row.id, &half).is_err());
        // Cancelling without a persisted cancel request.
        let admitted = store
            .transition(row.id, &lc::admit(&row))
            .unwrap()
            .applied()
            .unwrap();
        assert!(
            store
                .transition(row.id, &lc::cancelling(&admitted))
                .is_err()
        );
        let after = store.get(row.id).unwrap();
        assert_eq!(after, admitted);
        assert_eq!(store.history(row.id).unwrap().len(), 3);
    }
}
