//! What the visibility API (`crate::visibility`) reads: the queued and live jobs in brief (no
//! spec parsed), each queue's recent run times, and the sampled counts of the last hour
//! ([`Sample`]). Every query is served by an index (`jobs_queue_order`, `jobs_waiting_in_order`, `jobs_live`,
//! `jobs_finished_by_queue`, `samples_by_time`): none reads finished jobs in bulk.

use std::collections::BTreeSet;

use rusqlite::params;

use super::{ADMISSION_ORDER, Result, Store};
use crate::api::{JobPhase, ScheduleState};

/// A job not yet finished, as the visibility API shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BriefJob {
    /// Store id (`status.jobId`).
    pub id: i64,
    /// Namespace of its ManagedJob.
    pub namespace: String,
    /// Name of its ManagedJob.
    pub name: String,
    /// Its queue (`spec.queue`).
    pub queue: String,
    /// `spec.priority`.
    pub priority: i32,
    /// Its phase.
    pub phase: JobPhase,
    /// Its schedule state.
    pub schedule_state: ScheduleState,
    /// Its status message.
    pub message: String,
    /// When it entered its queue (ms since epoch): its place within its priority.
    pub queued_at_ms: i64,
    /// A cancel (or delete) is under way.
    pub cancel_requested: bool,
    /// It waits in a back-off until then (ms since epoch).
    pub backoff_until_ms: Option<i64>,
    /// The current attempt (1-based; 0 before the first launch).
    pub attempt: i32,
    /// A pipeline's current task (0-based).
    pub task_index: i32,
    /// Its workload (a Pod name, a process), once launched.
    pub workload: Option<String>,
    /// When it first started running (ms since epoch).
    pub started_at_ms: Option<i64>,
    /// When its current attempt began to run (ms since epoch).
    pub running_since_ms: Option<i64>,
    /// It is held by `spec.suspend` (phase Suspended; a Waiting job never is: a suspend moves
    /// it to Inactive at once).
    pub suspended: bool,
    /// The reason a waiting job was last told (`wait_reason`), with `message` its sentence.
    pub wait_reason: Option<String>,
}

const BRIEF_COLUMNS: &str = "id, namespace, name, queue, priority, phase, schedule_state, message,
    queued_at_ms, cancel_requested, backoff_until_ms, attempt, task_index, workload,
    started_at_ms, running_since_ms, phase = 'Suspended', wait_reason";

fn brief(r: &rusqlite::Row<'_>) -> rusqlite::Result<BriefJob> {
    let phase: String = r.get(5)?;
    let state: String = r.get(6)?;
    Ok(BriefJob {
        id: r.get(0)?,
        namespace: r.get(1)?,
        name: r.get(2)?,
        queue: r.get(3)?,
        priority: r.get(4)?,
        phase: JobPhase::parse(&phase).unwrap_or(JobPhase::Pending),
        schedule_state: ScheduleState::parse(&state).unwrap_or(ScheduleState::Waiting),
        message: r.get(7)?,
        queued_at_ms: r.get(8)?,
        cancel_requested: r.get(9)?,
        backoff_until_ms: r.get(10)?,
        attempt: r.get(11)?,
        task_index: r.get(12)?,
        workload: r.get(13)?,
        started_at_ms: r.get(14)?,
        running_since_ms: r.get(15)?,
        suspended: r.get(16)?,
        wait_reason: r.get(17)?,
    })
}

impl Store {
    /// Every Waiting job (new jobs, not relaunches), in each queue's admission order (queue,
    /// then priority descending, then entry in the queue, then id), back-offs and cancels
    /// included. Served by `jobs_waiting_in_order`: O(waiting jobs).
    pub fn waiting_brief(&self) -> Result<Vec<BriefJob>> {
        let sql = format!(
            "SELECT {BRIEF_COLUMNS} FROM jobs INDEXED BY jobs_waiting_in_order
             WHERE schedule_state = 'Waiting'
             ORDER BY queue, {ADMISSION_ORDER}"
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map([], brief)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Every job holding a run slot (Launching, Alive, AliveWaiting), by id. Served by
    /// `jobs_live`: O(jobs holding a run slot).
    pub fn live_brief(&self) -> Result<Vec<BriefJob>> {
        let sql = format!(
            "SELECT {BRIEF_COLUMNS} FROM jobs
             WHERE schedule_state IN ('Launching', 'Alive', 'AliveWaiting') ORDER BY id"
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map([], brief)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Every job not finished that is neither Waiting nor holding a run slot (Inactive:
    /// suspended, or not yet queued), by id. Served by `jobs_inactive`.
    pub fn inactive_brief(&self) -> Result<Vec<BriefJob>> {
        let sql = format!(
            "SELECT {BRIEF_COLUMNS} FROM jobs INDEXED BY jobs_inactive WHERE schedule_state = 'Inactive' ORDER BY id"
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map([], brief)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The run times (finish - first start, ms) of the `limit` jobs of `queue` that finished
    /// last (at most those finished since `since_ms`), newest first, with when each finished.
    /// Served by `jobs_finished_by_queue`.
    pub fn recent_run_times(
        &self,
        queue: &str,
        since_ms: i64,
        limit: usize,
    ) -> Result<Vec<(i64, i64)>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT finished_at_ms - started_at_ms, finished_at_ms
             FROM jobs INDEXED BY jobs_finished_by_queue
             WHERE queue = ?1 AND finished_at_ms IS NOT NULL AND started_at_ms IS NOT NULL
                AND finished_at_ms >= ?2
             ORDER BY finished_at_ms DESC LIMIT ?3",
        )?;
        let rows = stmt.query_map(params![queue, since_ms, limit as i64], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The namespaces that hold a job not finished, by name: O(jobs not finished), over the
    /// partial indexes of the Inactive, Waiting and live states.
    pub fn open_namespaces(&self) -> Result<Vec<String>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT namespace FROM jobs INDEXED BY jobs_inactive WHERE schedule_state = 'Inactive'
             UNION
             SELECT namespace FROM jobs INDEXED BY jobs_waiting_in_order
                 WHERE schedule_state = 'Waiting'
             UNION
             SELECT namespace FROM jobs INDEXED BY jobs_live
                 WHERE schedule_state IN ('Launching', 'Alive', 'AliveWaiting')
             ORDER BY 1",
        )?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The namespaces sampled since `since_ms` (those whose jobs the plot may show).
    pub fn sampled_namespaces(&self, since_ms: i64) -> Result<Vec<String>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT DISTINCT namespace FROM samples INDEXED BY samples_by_time
             WHERE at_ms >= ?1 AND namespace != ''",
        )?;
        let rows = stmt.query_map(params![since_ms], |r| r.get::<_, String>(0))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Runs `f` inside one read transaction: everything it reads is of one moment, however
    /// the operator writes meanwhile (WAL: the writer is not blocked).
    pub fn read_consistently<T>(
        &mut self,
        f: impl FnOnce(&Store) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        self.conn.execute_batch("BEGIN DEFERRED")?;
        let out = f(self);
        // A read transaction has nothing to keep: ending it either way releases the snapshot.
        let _ = self.conn.execute_batch("COMMIT");
        out
    }

    /// Records, at `at_ms`, how many jobs wait, launch and run per namespace and queue (one
    /// row each where any does, and one row of zeros under the namespace "" so that a moment
    /// with no job at all still shows as a sample), and prunes samples older than
    /// [`SAMPLES_KEPT_MS`]. O(jobs not finished), over the `jobs_live` index.
    pub fn record_samples(&mut self, at_ms: i64) -> Result<()> {
        let tx = self.conn.transaction()?;
        tx.prepare_cached(
            "INSERT INTO samples (at_ms, namespace, queue, waiting, launching, running)
             SELECT ?1, namespace, queue, SUM(w), SUM(l), SUM(r) FROM (
                 SELECT namespace, queue, COUNT(*) AS w, 0 AS l, 0 AS r
                 FROM jobs INDEXED BY jobs_waiting_in_order WHERE schedule_state = 'Waiting'
                 GROUP BY namespace, queue
                 UNION ALL
                 SELECT namespace, queue, 0, SUM(schedule_state = 'Launching'),
                     SUM(schedule_state IN ('Alive', 'AliveWaiting'))
                 FROM jobs INDEXED BY jobs_live_by_queue
                 WHERE schedule_state IN ('Launching', 'Alive', 'AliveWaiting')
                 GROUP BY namespace, queue)
             GROUP BY namespace, queue",
        )?
        .execute(params![at_ms])?;
        tx.prepare_cached(
            "INSERT INTO samples (at_ms, namespace, queue, waiting, launching, running)
             VALUES (?1, '', '', 0, 0, 0)",
        )?
        .execute(params![at_ms])?;
        tx.prepare_cached("DELETE FROM samples WHERE at_ms < ?1")?
            .execute(params![at_ms - SAMPLES_KEPT_MS])?;
        tx.commit()?;
        Ok(())
    }

    /// The samples taken since `since_ms`, oldest first, each the sum over `namespaces` (None:
    /// all) and, with `queue`, that queue only. Every moment sampled is there, with zeros where
    /// none of those namespaces had a job.
    pub fn samples(
        &self,
        since_ms: i64,
        namespaces: Option<&BTreeSet<String>>,
        queue: Option<&str>,
    ) -> Result<Vec<Sample>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT at_ms, namespace, queue, waiting, launching, running
             FROM samples INDEXED BY samples_by_time WHERE at_ms >= ?1 ORDER BY at_ms",
        )?;
        let mut rows = stmt.query(params![since_ms])?;
        let mut out: Vec<Sample> = Vec::new();
        while let Some(r) = rows.next()? {
            let at_ms: i64 = r.get(0)?;
            if out.last().is_none_or(|s| s.at_ms != at_ms) {
                out.push(Sample {
                    at_ms,
                    ..Default::default()
                });
            }
            let ns: String = r.get(1)?;
            let q: String = r.get(2)?;
            if ns.is_empty()
                || namespaces.is_some_and(|v| !v.contains(&ns))
                || queue.is_some_and(|want| want != q)
            {
                continue;
            }
            let s = out.last_mut().expect("pushed above");
            s.waiting += r.get::<_, i64>(3)?;
            s.launching += r.get::<_, i64>(4)?;
            s.running += r.get::<_, i64>(5)?;
        }
        Ok(out)
    }
}

/// How long samples are kept, ms: the dashboard plots the last hour; a margin beyond it.
pub const SAMPLES_KEPT_MS: i64 = 2 * 3_600_000;

/// The counts at one moment ([`Store::samples`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sample {
    /// When, ms since the epoch.
    pub at_ms: i64,
    /// Jobs waiting for a slot (Waiting).
    pub waiting: i64,
    /// Jobs launching (Launching).
    pub launching: i64,
    /// Jobs holding a run slot past their launch (Alive, AliveWaiting).
    pub running: i64,
}
