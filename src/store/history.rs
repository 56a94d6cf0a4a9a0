//! The history of each job (`transitions`): one entry ([`HistoryEntry`]) per change of phase or
//! schedule state.

use rusqlite::{OptionalExtension, params};

use super::{Result, Store, StoreError};
use crate::api::{JobPhase, ScheduleState};
use crate::lifecycle::Reason;
use crate::lifecycle::record::{HistoryEntry, Step};

/// Appends one entry, `step` at `at_ms` (the only INSERT into `transitions`); returns its id.
pub(super) fn record(
    tx: &rusqlite::Transaction<'_>,
    job_id: i64,
    at_ms: i64,
    step: &Step,
) -> Result<i64> {
    let (from, to) = (step.from, step.to);
    tx.prepare_cached(
        "INSERT INTO transitions (job_id, at_ms, from_phase, to_phase, from_schedule,
            to_schedule, reason, message)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        job_id,
        at_ms,
        from.map(|(p, _)| p.as_str()),
        to.0.as_str(),
        from.map(|(_, s)| s.as_str()),
        to.1.as_str(),
        step.reason.as_str(),
        step.message
    ])?;
    Ok(tx.last_insert_rowid())
}

fn corrupt(job_id: i64, what: String) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(Box::new(StoreError::Corrupt { job_id, what }))
}

fn parse_reason(job_id: i64, s: String) -> rusqlite::Result<Reason> {
    Reason::parse(&s).ok_or_else(|| corrupt(job_id, format!("history reason {s:?}")))
}

fn parse_phase(job_id: i64, s: String) -> rusqlite::Result<JobPhase> {
    JobPhase::parse(&s).ok_or_else(|| corrupt(job_id, format!("history phase {s:?}")))
}

fn parse_schedule(job_id: i64, s: String) -> rusqlite::Result<ScheduleState> {
    ScheduleState::parse(&s).ok_or_else(|| corrupt(job_id, format!("history schedule {s:?}")))
}

impl Store {
    /// The last history entry of the job whose Events were published (0: none).
    pub fn events_published(&self, job_id: i64) -> Result<i64> {
        Ok(self
            .conn
            .prepare_cached("SELECT seq FROM events_published WHERE job_id = ?1")?
            .query_row([job_id], |r| r.get(0))
            .optional()?
            .unwrap_or(0))
    }

    /// Records that the job's Events up to history entry `seq` were published (nothing for a job
    /// already forgotten).
    pub fn set_events_published(&mut self, job_id: i64, seq: i64) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO events_published (job_id, seq)
             SELECT ?1, ?2 WHERE EXISTS (SELECT 1 FROM jobs WHERE id = ?1)
             ON CONFLICT (job_id) DO UPDATE SET seq = max(seq, excluded.seq)",
            )?
            .execute(params![job_id, seq])?;
        Ok(())
    }

    /// The jobs whose status is written but whose history has entries after the last one whose
    /// Events were recorded published (an operator stopped between the two), by id.
    pub fn jobs_with_unpublished_events(&self) -> Result<Vec<i64>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT j.id FROM jobs j
             WHERE j.synced_version >= j.status_version
               AND (SELECT max(t.id) FROM transitions t WHERE t.job_id = j.id)
                   > coalesce((SELECT e.seq FROM events_published e WHERE e.job_id = j.id), 0)
             ORDER BY j.id",
        )?;
        let ids = stmt.query_map([], |r| r.get(0))?;
        Ok(ids.collect::<rusqlite::Result<_>>()?)
    }

    /// A job's history, oldest first.
    pub fn history(&self, id: i64) -> Result<Vec<HistoryEntry>> {
        self.history_after(id, 0)
    }

    /// A job's history after the transition with id `after`, oldest first.
    pub fn history_after(&self, id: i64, after: i64) -> Result<Vec<HistoryEntry>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, at_ms, from_phase, to_phase, from_schedule, to_schedule, reason, message
             FROM transitions WHERE job_id = ?1 AND id > ?2 ORDER BY id",
        )?;
        let rows = stmt.query_map(params![id, after], |r| {
            Ok(HistoryEntry {
                id: r.get(0)?,
                at_ms: r.get(1)?,
                from_phase: r
                    .get::<_, Option<String>>(2)?
                    .map(|p| parse_phase(id, p))
                    .transpose()?,
                to_phase: parse_phase(id, r.get(3)?)?,
                from_schedule: r
                    .get::<_, Option<String>>(4)?
                    .map(|s| parse_schedule(id, s))
                    .transpose()?,
                to_schedule: parse_schedule(id, r.get(5)?)?,
                reason: parse_reason(id, r.get::<_, String>(6)?)?,
                message: r.get(7)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}
