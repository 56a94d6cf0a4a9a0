//! The history of each job (`transitions`): one entry per change of phase or schedule state.

use rusqlite::{OptionalExtension, params};

use super::{Result, Store, StoreError};
use crate::api::{JobPhase, ScheduleState};
use crate::lifecycle::Reason;

/// One entry of a job's history.
#[derive(Clone, Debug, PartialEq)]
pub struct HistoryEntry {
    /// Position in the history (a store-wide increasing sequence).
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
    /// Why.
    pub reason: Reason,
    /// Message at that time.
    pub message: String,
}

/// Appends one entry (the only INSERT into `transitions`); returns its id.
pub(super) fn record(
    tx: &rusqlite::Transaction<'_>,
    job_id: i64,
    at_ms: i64,
    from: Option<(JobPhase, ScheduleState)>,
    to: (JobPhase, ScheduleState),
    reason: Reason,
    message: &str,
) -> Result<i64> {
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
        reason.as_str(),
        message
    ])?;
    Ok(tx.last_insert_rowid())
}

fn parse_reason(job_id: i64, s: String) -> rusqlite::Result<Reason> {
    Reason::parse(&s).ok_or_else(|| {
        rusqlite::Error::ToSqlConversionFailure(Box::new(StoreError::Corrupt {
            job_id,
            what: format!("history reason {s:?}"),
        }))
    })
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

    /// Records that the job's Events up to history entry `seq` were published.
    pub fn set_events_published(&mut self, job_id: i64, seq: i64) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO events_published (job_id, seq) VALUES (?1, ?2)
             ON CONFLICT (job_id) DO UPDATE SET seq = max(seq, excluded.seq)",
            )?
            .execute(params![job_id, seq])?;
        Ok(())
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
                from_phase: r.get(2)?,
                to_phase: r.get(3)?,
                from_schedule: r.get(4)?,
                to_schedule: r.get(5)?,
                reason: parse_reason(id, r.get::<_, String>(6)?)?,
                message: r.get(7)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}
