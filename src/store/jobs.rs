//! Jobs: mirroring ManagedJobs in, the compare-and-set of every transition, and the queries of
//! the scheduler, the status writer and the CLI. Every record is written through `insert` and
//! `write_change` (statements built from the record's declaration, [`super::row`]); every change to one is
//! decided and applied by [`crate::lifecycle`].

use rusqlite::{OptionalExtension, params};

use super::history;
use super::row::{self, from_row, select_list};
use super::{ADMISSION_ORDER, Result, Store, StoreError};
use crate::api::{JobPhase, ManagedJobSpec, ManagedJobStatus, ScheduleState};
use crate::capacity::SlotUsage;
use crate::lifecycle::world::JobBrief;
use crate::lifecycle::{self, JobRow, Object, Step, Transition, now_ms};

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

/// The order in which unwritten statuses go out (see [`Store::unsynced_brief`]), as SQL; verbatim in
/// the partial index `jobs_unsynced_in_order` (schema step 14), which serves it. Rank 4: a
/// waiting job whose only unwritten change is its reason ([`REASON_ONLY`]).
const UNSYNCED_ORDER: &str = "CASE WHEN unsynced_since_seq = 9223372036854775807 THEN 4 \
     WHEN schedule_state = 'Done' THEN 0 WHEN schedule_state = 'Launching' THEN 3 \
     WHEN schedule_state IN ('Alive', 'AliveWaiting') THEN 2 ELSE 1 END";

/// `unsynced_since_seq` of a job whose status the API has seen but for its waiting reason
/// ([`Store::tell_waiting`]): no transition of it is unwritten, so its write releases no slot
/// and holds no other write back (`operator::status_writer::writable`), and it goes after every
/// other status. Any transition of the job replaces it ([`write_change`] keeps the minimum).
pub const REASON_ONLY: i64 = i64::MAX;

/// What the status writer orders an unwritten status by ([`Store::unsynced_brief`]): a few
/// columns of the job's row, no spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsyncedBrief {
    /// The job.
    pub id: i64,
    /// Its schedule state now (the slot its status will show).
    pub schedule_state: ScheduleState,
    /// The status version the API has seen (0: none yet).
    pub synced_version: i64,
    /// The change sequence number of its oldest unwritten change.
    pub unsynced_since_seq: i64,
    /// The change sequence number of its latest change.
    pub changed_seq: i64,
    /// When it was submitted, ms since the epoch.
    pub submitted_at_ms: i64,
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
        let sql = format!("SELECT {} FROM jobs WHERE id = ?1", select_list());
        let mut stmt = self.conn.prepare_cached(&sql)?;
        Ok(stmt.query_row([id], from_row).optional()?)
    }

    /// The jobs with these ids that exist, in the order of `ids`; one statement (one read
    /// transaction: each takes and gives back the store's file locks, whose cost grows with
    /// the number of job controllers holding the store open).
    pub fn find_many(&self, ids: &[i64]) -> Result<Vec<JobRow>> {
        let sql = format!(
            "SELECT {} FROM jobs WHERE id IN (SELECT value FROM json_each(?1))",
            select_list()
        );
        let list = serde_json::to_string(ids).expect("ids serialize");
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let mut rows: std::collections::HashMap<i64, JobRow> = stmt
            .query_map([list], from_row)?
            .map(|r| r.map(|row| (row.id, row)))
            .collect::<rusqlite::Result<_>>()?;
        Ok(ids.iter().filter_map(|id| rows.remove(id)).collect())
    }

    /// The job mirrored from the object with this uid, if any.
    pub fn find_by_uid(&self, uid: &str) -> Result<Option<JobRow>> {
        let sql = format!("SELECT {} FROM jobs WHERE uid = ?1", select_list());
        let mut stmt = self.conn.prepare_cached(&sql)?;
        Ok(stmt.query_row([uid], from_row).optional()?)
    }

    /// Jobs named `namespace/name` (newest first; a name can be reused after deletion).
    pub fn find_by_name(&self, namespace: &str, name: &str) -> Result<Vec<JobRow>> {
        let sql = format!(
            "SELECT {} FROM jobs WHERE namespace = ?1 AND name = ?2 ORDER BY id DESC",
            select_list()
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map(params![namespace, name], from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Every job, by id.
    pub fn all(&self) -> Result<Vec<JobRow>> {
        self.select("1 = 1 ORDER BY id", [])
    }

    fn select<P: rusqlite::Params>(&self, where_clause: &str, p: P) -> Result<Vec<JobRow>> {
        let sql = format!("SELECT {} FROM jobs WHERE {where_clause}", select_list());
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map(p, from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// [`Store::submit`] for an object created now, carrying no status.
    pub fn upsert(
        &mut self,
        uid: &str,
        namespace: &str,
        name: &str,
        generation: i64,
        spec: &ManagedJobSpec,
    ) -> Result<Upserted> {
        let object = Object {
            uid,
            namespace,
            name,
            generation,
            spec,
            created_at_ms: now_ms(),
            resource_version: "",
        };
        self.submit(&object, None)
    }

    /// Mirrors a ManagedJob. At first sight it is stored as [`lifecycle::submission`] decides
    /// (queued at once; kept Done with the final status `known` shows, when its object already
    /// carries one: the store lost the job; failed at once when its spec fails the checks the
    /// API schema cannot express); otherwise its generation and priority are updated. (Its
    /// position in its queue is not stored: it moves with every admission; the visibility API
    /// computes it on request.)
    pub fn submit(
        &mut self,
        object: &Object<'_>,
        known: Option<&ManagedJobStatus>,
    ) -> Result<Upserted> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let existing: Option<(i64, i64, i32)> = tx
            .prepare_cached("SELECT id, generation, priority FROM jobs WHERE uid = ?1")?
            .query_row([object.uid], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .optional()?;
        let (id, inserted) = match existing {
            Some((id, old_generation, old_priority)) => {
                let priority = object.spec.priority;
                if old_generation != object.generation || old_priority != priority {
                    // Of the stored spec only `cancel` and `suspend` follow the object (the
                    // API keeps the rest immutable; priority has its own column): the status
                    // of a finished job tells whether its spec still asks for the cancel, and
                    // a job's controller reads the suspend (`lifecycle::stop_requested`).
                    let flag = |on: bool| if on { "true" } else { "false" };
                    tx.prepare_cached(
                        "UPDATE jobs SET generation = ?2, priority = ?3,
                            spec = json_set(spec, '$.cancel', json(?4), '$.suspend', json(?5)),
                            status_version = status_version + 1,
                            unsynced_since_seq = min(unsynced_since_seq, changed_seq)
                         WHERE id = ?1",
                    )?
                    .execute(params![
                        id,
                        object.generation,
                        priority,
                        flag(object.spec.cancel),
                        flag(object.spec.suspend)
                    ])?;
                }
                (id, false)
            }
            None => {
                let now = now_ms();
                let submission = lifecycle::submission(object, known, now)?;
                let id = insert(&tx, &submission.record, false, &submission.steps, now)?;
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
    let sql = format!("SELECT {} FROM jobs WHERE id = ?1", select_list());
    let mut stmt = tx.prepare_cached(&sql)?;
    Ok(stmt.query_row([id], from_row).optional()?)
}

/// Inserts `record` inside `tx` (under its own id when `keep_id`, else a new one) with its
/// first history entries `steps`, recorded at `at_ms`; returns its id. Its last change is the last step; its
/// unwritten changes start with the first (any step of one insert orders the same against
/// other jobs' changes: nothing else is written meanwhile).
fn insert(
    tx: &rusqlite::Transaction<'_>,
    record: &JobRow,
    keep_id: bool,
    steps: &[Step],
    at_ms: i64,
) -> Result<i64> {
    tx.prepare_cached(row::insert_sql())?
        .execute(rusqlite::params_from_iter(row::insert_values(
            record, keep_id,
        )))?;
    let id = tx.last_insert_rowid();
    let mut seqs = Vec::with_capacity(steps.len());
    for step in steps {
        seqs.push(history::record(tx, id, at_ms, step)?);
    }
    if let (Some(first), Some(last)) = (seqs.first(), seqs.last()) {
        tx.prepare_cached(
            "UPDATE jobs SET changed_seq = ?2, unsynced_since_seq = ?3 WHERE id = ?1",
        )?
        .execute(params![id, last, first])?;
    }
    Ok(id)
}

/// Applies `change` to `before` inside `tx` (the guard already matched):
/// [`lifecycle::apply`] decides the record after it (an illegal move is an error and nothing
/// is written), the record is updated, and a move of its phase or schedule state is recorded
/// in its history.
fn write_change(
    tx: &rusqlite::Transaction<'_>,
    before: JobRow,
    change: &lifecycle::Change,
) -> Result<JobRow> {
    let now = now_ms();
    let mut after = lifecycle::apply(&before, change, now)?;
    tx.prepare_cached(row::update_sql())?
        .execute(rusqlite::params_from_iter(row::update_values(&after)))?;
    // Each ended attempt counts once, in the same write as its record.
    if let Some(record) = change.attempt_record() {
        let decided_by = if record.rule == lifecycle::rules::DEFAULT_RULE {
            "default"
        } else {
            "rule"
        };
        tx.prepare_cached(
            "INSERT INTO attempt_actions (action, decided_by, count) VALUES (?1, ?2, 1)
             ON CONFLICT (action, decided_by) DO UPDATE SET count = count + 1",
        )?
        .execute(params![record.action, decided_by])?;
    }
    if lifecycle::change::moved(&before, &after) {
        let seq = history::record(
            tx,
            after.id,
            now,
            &Step {
                from: Some(before.state()),
                to: after.state(),
                reason: change.reason(),
                message: after.message.clone(),
            },
        )?;
        // Had the API seen every earlier change? Then this one starts the unsynced run.
        let was_synced = before.status_version <= before.synced_version;
        // A status waiting only for its reason (REASON_ONLY) has no unwritten transition: this
        // one starts the unsynced run too.
        tx.prepare_cached(
            "UPDATE jobs SET changed_seq = ?2,
                    unsynced_since_seq = CASE WHEN ?3 THEN ?2 ELSE min(unsynced_since_seq, ?2) END
                 WHERE id = ?1",
        )?
        .execute(params![after.id, seq, was_synced])?;
        after.changed_seq = seq;
        if was_synced {
            after.unsynced_since_seq = seq;
        } else {
            after.unsynced_since_seq = after.unsynced_since_seq.min(seq);
        }
    }
    Ok(after)
}

impl Store {
    /// Attempts decided since the store began, by (action, `rule` or `default`): what
    /// `managedjobs_attempts_total` exports. Kept across operator restarts.
    pub fn attempt_actions(&self) -> Result<Vec<(String, String, i64)>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT action, decided_by, count FROM attempt_actions")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Number of jobs stored (0: a new or lost store, to be rebuilt before the first admission).
    pub fn job_count(&self) -> Result<i64> {
        Ok(self
            .conn
            .prepare_cached("SELECT count(*) FROM jobs")?
            .query_row([], |r| r.get(0))?)
    }

    /// Inserts `record`, rebuilt from its object's status ([`lifecycle::restore()`]), under its
    /// id when that id is free (otherwise a new one, logged), with one history entry
    /// ([`lifecycle::Reason::Restored`]). Returns the row, or the existing one when the uid is
    /// stored.
    pub fn restore(&mut self, record: &JobRow) -> Result<JobRow> {
        if let Some(row) = self.find_by_uid(&record.uid)? {
            return Ok(row);
        }
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let taken: bool = tx
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM jobs WHERE id = ?1)")?
            .query_row([record.id], |row| row.get(0))?;
        if taken {
            tracing::warn!(job_id = record.id, namespace = %record.namespace, name = %record.name, "two objects show one job id; this one gets a new id");
        }
        let step = Step {
            from: None,
            to: record.state(),
            reason: lifecycle::Reason::Restored,
            message: "rebuilt from the object's status after the store was lost".into(),
        };
        let id = insert(&tx, record, !taken, std::slice::from_ref(&step), now_ms())?;
        tx.commit()?;
        self.get(id)
    }

    /// Persists a cancel request (idempotent). Returns the row after it.
    pub fn request_cancel(&mut self, id: i64, deleting: bool) -> Result<JobRow> {
        self.conn
            .prepare_cached(
                "UPDATE jobs SET cancel_requested = 1, deleting = max(deleting, ?2),
                status_version = status_version + (cancel_requested = 0),
                unsynced_since_seq = min(unsynced_since_seq, changed_seq)
             WHERE id = ?1",
            )?
            .execute(params![id, deleting])?;
        self.get(id)
    }

    /// Records who set the job's `spec.suspend` (its field manager; None: unknown), which its
    /// messages and `Suspended` condition name. Changes nothing else.
    pub fn note_suspended_by(&mut self, id: i64, who: Option<&str>) -> Result<()> {
        self.conn
            .prepare_cached(
                "UPDATE jobs SET suspended_by = ?2 WHERE id = ?1 AND suspended_by IS NOT ?2",
            )?
            .execute(params![id, who])?;
        Ok(())
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
        tx.prepare_cached("DELETE FROM pod_members WHERE job_id = ?1")?
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
            // The IN term, verbatim from the partial index jobs_queue_order, lets SQLite use it.
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
            &format!(
                "schedule_state IN ('Waiting', 'AliveWaiting') AND schedule_state = ?1
                AND cancel_requested = 0
                AND (?3 = 0 OR backoff_until_ms IS NULL OR backoff_until_ms <= ?3)
             ORDER BY {ADMISSION_ORDER} LIMIT ?2"
            ),
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

    /// Every job of `namespace`, by id (the `jobs_by_name` index).
    pub fn in_namespace(&self, namespace: &str) -> Result<Vec<JobRow>> {
        self.select("namespace = ?1 ORDER BY id", [namespace])
    }

    /// The namespaces that hold a job of this store.
    pub fn namespaces(&self) -> Result<Vec<String>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT DISTINCT namespace FROM jobs ORDER BY namespace")?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Jobs holding a run slot (Launching, Alive, AliveWaiting).
    pub fn live_jobs(&self) -> Result<Vec<JobRow>> {
        self.select(
            "schedule_state IN ('Launching', 'Alive', 'AliveWaiting') ORDER BY id",
            [],
        )
    }

    /// Jobs whose status changed since it was last written to the API, the first `limit` in
    /// the order that keeps the API's view within the caps: finished jobs first (their final
    /// status is what users and GitOps tools wait for), then other jobs holding no slot, then
    /// jobs holding only a run slot, then jobs holding a launch slot; oldest first within
    /// each. Only what the status writer orders them by ([`UnsyncedBrief`]; it then reads whole
    /// rows of the jobs it writes, [`Store::find_many`]). Served by the partial index
    /// `jobs_unsynced_order` in that order: O(limit) however many statuses are unwritten
    /// (after a burst, a thousand or more; reading and decoding whole rows of that backlog for
    /// every write was a seventh of the operator's CPU).
    pub fn unsynced_brief(&self, limit: usize) -> Result<Vec<UnsyncedBrief>> {
        let sql = format!(
            "SELECT id, schedule_state, synced_version, unsynced_since_seq, changed_seq,
                submitted_at_ms
             FROM jobs WHERE status_version > synced_version
             ORDER BY {UNSYNCED_ORDER}, id LIMIT ?1"
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map([limit as i64], |r| {
            let state: String = r.get(1)?;
            Ok((
                UnsyncedBrief {
                    id: r.get(0)?,
                    schedule_state: ScheduleState::Inactive,
                    synced_version: r.get(2)?,
                    unsynced_since_seq: r.get(3)?,
                    changed_seq: r.get(4)?,
                    submitted_at_ms: r.get(5)?,
                },
                state,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (mut brief, state) = row?;
            brief.schedule_state =
                ScheduleState::parse(&state).ok_or_else(|| StoreError::Corrupt {
                    job_id: brief.id,
                    what: format!("schedule_state {state:?}"),
                })?;
            out.push(brief);
        }
        Ok(out)
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
        use crate::api::ExecutorKind;
        let sql = format!(
            "SELECT id, uid, namespace, executor, deleting, max(attempt, launched_attempt)
             FROM jobs WHERE {where_clause}"
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map([], |r| {
            let executor: String = r.get(3)?;
            let id: i64 = r.get(0)?;
            // An executor this binary does not know (a store written by a newer release) is an
            // error, never read as another kind.
            let executor = ExecutorKind::parse(&executor).ok_or_else(|| {
                rusqlite::Error::ToSqlConversionFailure(Box::new(StoreError::Corrupt {
                    job_id: id,
                    what: format!("executor {executor:?}"),
                }))
            })?;
            Ok(JobBrief {
                id,
                uid: r.get(1)?,
                namespace: r.get(2)?,
                executor,
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
    use crate::lifecycle::{self as lc, Expect, Reason, faults};

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
        let select = |w: &str| format!("SELECT {} FROM jobs WHERE {w}", select_list());
        let queries = [
            select(
                "schedule_state IN ('Waiting', 'AliveWaiting') AND schedule_state = ?1
                    AND cancel_requested = 0
                    AND (?3 = 0 OR backoff_until_ms IS NULL OR backoff_until_ms <= ?3)
                    ORDER BY priority DESC, queued_at_ms, entry_version, id LIMIT ?2",
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

    /// The status writer's read of the backlog walks `jobs_unsynced_in_order` in its order: no
    /// sort of every unwritten status, however many a burst left.
    #[test]
    fn the_status_writers_read_walks_its_index_in_order() {
        let store = Store::in_memory().unwrap();
        let sql = format!(
            "EXPLAIN QUERY PLAN SELECT id FROM jobs WHERE status_version > synced_version
             ORDER BY {UNSYNCED_ORDER}, id LIMIT 64"
        );
        let mut stmt = store.conn.prepare(&sql).unwrap();
        let steps: Vec<String> = stmt
            .query_map([], |r| r.get::<_, String>(3))
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        assert!(
            steps.iter().any(|s| s.contains("jobs_unsynced_in_order"))
                && !steps.iter().any(|s| s.contains("TEMP B-TREE")),
            "{steps:?}"
        );
    }

    /// The read lists every unwritten status, in the order the status writer writes them:
    /// finished, then holding no slot, then a run slot, then a launch slot; by id within each.
    #[test]
    fn unsynced_brief_lists_the_unwritten_statuses_in_write_order() {
        let mut store = Store::in_memory().unwrap();
        for i in 0..12 {
            let row = store
                .upsert(&format!("u{i}"), "ns", &format!("j{i}"), 1, &spec())
                .unwrap()
                .row;
            if i % 3 == 0 {
                store.transition(row.id, &lc::admit(&row)).unwrap();
            }
            if i % 4 == 0 {
                let row = store.get(row.id).unwrap();
                store.mark_synced(row.id, row.status_version).unwrap();
            }
        }
        let rank = |s: ScheduleState| match s {
            ScheduleState::Done => 0,
            ScheduleState::Launching => 3,
            ScheduleState::Alive | ScheduleState::AliveWaiting => 2,
            _ => 1,
        };
        let mut whole: Vec<JobRow> = store
            .all()
            .unwrap()
            .into_iter()
            .filter(|r| r.status_version > r.synced_version)
            .collect();
        whole.sort_by_key(|r| (rank(r.schedule_state), r.id));
        let brief = store.unsynced_brief(100).unwrap();
        assert!(!whole.is_empty());
        assert_eq!(
            brief,
            whole
                .iter()
                .map(|r| UnsyncedBrief {
                    id: r.id,
                    schedule_state: r.schedule_state,
                    synced_version: r.synced_version,
                    unsynced_since_seq: r.unsynced_since_seq,
                    changed_seq: r.changed_seq,
                    submitted_at_ms: r.submitted_at_ms,
                })
                .collect::<Vec<_>>()
        );
        assert_eq!(store.unsynced_brief(3).unwrap(), brief[..3]);
        let ids: Vec<i64> = brief.iter().rev().map(|b| b.id).chain([9999]).collect();
        let found: Vec<i64> = store
            .find_many(&ids)
            .unwrap()
            .iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(found, ids[..ids.len() - 1]);
    }

    fn spec() -> ManagedJobSpec {
        ManagedJobSpec {
            run: Some("true".into()),
            ..Default::default()
        }
    }

    /// The start-up sweep finds exactly the jobs whose status is written and whose history has
    /// entries after the last one recorded published; a forgotten job gets no record.
    #[test]
    fn unpublished_events_are_those_after_the_record_of_written_statuses() {
        let mut store = Store::in_memory().unwrap();
        let mut rows = Vec::new();
        for i in 0..4 {
            let row = store
                .upsert(&format!("u{i}"), "ns", &format!("j{i}"), 1, &spec())
                .unwrap()
                .row;
            rows.push(row);
        }
        // j0: never written; j1: written, nothing recorded; j2: written and recorded; j3:
        // written, recorded, then changed again and written.
        for row in &rows[1..] {
            store.mark_synced(row.id, row.status_version).unwrap();
        }
        let last = |store: &Store, id| store.history(id).unwrap().last().unwrap().id;
        for row in &rows[2..] {
            store
                .set_events_published(row.id, last(&store, row.id))
                .unwrap();
        }
        store.transition(rows[3].id, &lc::admit(&rows[3])).unwrap();
        let j3 = store.get(rows[3].id).unwrap();
        store.mark_synced(j3.id, j3.status_version).unwrap();
        assert_eq!(
            store.jobs_with_unpublished_events().unwrap(),
            [rows[1].id, rows[3].id]
        );
        // Recorded, it is no longer found; a record never goes backwards.
        store
            .set_events_published(j3.id, last(&store, j3.id))
            .unwrap();
        store.set_events_published(j3.id, 1).unwrap();
        assert_eq!(store.events_published(j3.id).unwrap(), last(&store, j3.id));
        assert_eq!(store.jobs_with_unpublished_events().unwrap(), [rows[1].id]);
        // A job forgotten meanwhile (its deletion raced its Events) leaves no record behind.
        store.delete(rows[1].id).unwrap();
        store.set_events_published(rows[1].id, 99).unwrap();
        assert_eq!(store.events_published(rows[1].id).unwrap(), 0);
    }

    #[test]
    fn upsert_assigns_ids_and_queues() {
        let mut store = Store::in_memory().unwrap();
        let a = store.upsert("u1", "ns", "a", 1, &spec()).unwrap();
        assert!(a.inserted);
        assert_eq!(a.row.phase, JobPhase::Pending);
        assert_eq!(a.row.schedule_state, ScheduleState::Waiting);
        assert_eq!(a.row.queue_position, None, "no position is stored");
        let again = store.upsert("u1", "ns", "a", 1, &spec()).unwrap();
        assert!(!again.inserted);
        assert_eq!(again.row.id, a.row.id);
        let b = store.upsert("u2", "ns", "b", 1, &spec()).unwrap();
        assert_eq!(b.row.queue_position, None);
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
            change: faults::change(
                Reason::Submitted,
                Some(JobPhase::Pending),
                Some(ScheduleState::Waiting),
            ),
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
            change: faults::change(
                Reason::Running,
                Some(JobPhase::Running),
                Some(ScheduleState::Alive),
            ),
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
            change: faults::change(
                Reason::Failed,
                Some(JobPhase::Running),
                Some(ScheduleState::Done),
            ),
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
                .transition(
                    row.id,
                    &lc::cancelling(&admitted, std::time::Duration::from_secs(5))
                )
                .is_err()
        );
        let after = store.get(row.id).unwrap();
        assert_eq!(after, admitted);
        assert_eq!(store.history(row.id).unwrap().len(), 3);
    }
}
