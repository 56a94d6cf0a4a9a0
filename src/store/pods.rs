//! What the operator's shared Pod watch saw of each attempt's Pod (the pod executor's input).

use rusqlite::{OptionalExtension, params};

use super::{Result, Store};
use crate::lifecycle::now_ms;
use crate::lifecycle::pod::{PodObservation, PodState};

impl Store {
    /// Records what the Pod watch saw; returns true when it differs from what was stored.
    pub fn record_pod(&mut self, o: &PodObservation) -> Result<bool> {
        let changed = self
            .conn
            .prepare_cached(
                "INSERT INTO pod_observations (job_id, attempt, pod_name, state, exit_code, reason,
                message, deleted, observed_at_ms, node, terminating_since_ms, grace_seconds, evidence)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
             ON CONFLICT (job_id, attempt) DO UPDATE SET pod_name = excluded.pod_name,
                state = excluded.state, exit_code = excluded.exit_code, reason = excluded.reason,
                message = excluded.message, deleted = excluded.deleted,
                observed_at_ms = excluded.observed_at_ms, node = excluded.node,
                terminating_since_ms = excluded.terminating_since_ms,
                grace_seconds = excluded.grace_seconds, evidence = excluded.evidence
             WHERE state != excluded.state OR exit_code IS NOT excluded.exit_code
                OR reason != excluded.reason OR message != excluded.message
                OR deleted != excluded.deleted OR node != excluded.node
                OR terminating_since_ms IS NOT excluded.terminating_since_ms
                OR evidence != excluded.evidence",
            )?
            .execute(params![
                o.job_id,
                o.attempt,
                o.pod_name,
                o.state.as_str(),
                o.exit_code,
                o.reason,
                o.message,
                o.deleted,
                now_ms(),
                o.node,
                o.terminating_since_ms,
                o.grace_seconds,
                serde_json::to_string(&o.evidence).expect("evidence serializes"),
            ])?;
        Ok(changed > 0)
    }

    /// The latest observation of an attempt's Pod.
    pub fn pod_observation(&self, job_id: i64, attempt: i32) -> Result<Option<PodObservation>> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT job_id, attempt, pod_name, state, exit_code, reason, message, deleted,
                    node, terminating_since_ms, grace_seconds, evidence
                 FROM pod_observations WHERE job_id = ?1 AND attempt = ?2",
            )?
            .query_row(params![job_id, attempt], |r| {
                Ok(PodObservation {
                    job_id: r.get(0)?,
                    attempt: r.get(1)?,
                    pod_name: r.get(2)?,
                    state: {
                        let s: String = r.get(3)?;
                        PodState::parse(&s).ok_or_else(|| {
                            rusqlite::Error::ToSqlConversionFailure(Box::new(
                                crate::store::StoreError::Corrupt {
                                    job_id,
                                    what: format!("pod state {s:?}"),
                                },
                            ))
                        })?
                    },
                    exit_code: r.get(4)?,
                    reason: r.get(5)?,
                    message: r.get(6)?,
                    deleted: r.get(7)?,
                    node: r.get(8)?,
                    terminating_since_ms: r.get(9)?,
                    grace_seconds: r.get(10)?,
                    // Unreadable evidence (never written so) reads as none: the defaults decide.
                    evidence: serde_json::from_str(&r.get::<_, String>(11)?).unwrap_or_default(),
                })
            })
            .optional()?)
    }
}
