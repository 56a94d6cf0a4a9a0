//! What the operator's shared Pod watch saw of each attempt's Pod (the pod executor's input).

use rusqlite::{OptionalExtension, params};

use super::{Result, Store};

use crate::lifecycle::{Evidence, now_ms};

/// Where an attempt's Pod stands, as the job controller needs it.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    strum::VariantArray,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::Display,
)]
#[strum(serialize_all = "kebab-case")]
pub enum PodState {
    /// Created; not running yet (scheduling, pulling images, init containers running).
    Pending,
    /// The scheduler found no node (`PodScheduled=False`).
    Unschedulable,
    /// Phase Running.
    Running,
    /// Phase Succeeded.
    Succeeded,
    /// Phase Failed: a container exited non-zero.
    Failed,
    /// Phase Failed: an init container exited non-zero.
    SetupFailed,
    /// Phase Failed before any container ran: the node refused it (`OutOfcpu`...).
    Refused,
    /// Phase Failed, reason `DeadlineExceeded`: it ran past its own
    /// `spec.activeDeadlineSeconds` and its node stopped it
    /// ([`crate::executor::pod::state::pod_deadline`]).
    DeadlineExceeded,
    /// Pending with a container the kubelet can never start (`InvalidImageName`,
    /// `ErrImageNeverPull`, `CreateContainerConfigError`).
    Invalid,
    /// Deleted (it has a `deletionTimestamp`) but not gone, and it had not exited: no longer
    /// counted as running. Relaunched once gone, or force-deleted when it outlives its grace
    /// period plus [`TERMINATING_MARGIN`] on a node that is not Ready.
    Terminating,
    /// Taken away: evicted, preempted (`DisruptionTarget`), its node lost, or deleted.
    Lost,
}

/// How long past its grace period a terminating Pod may stay on a node that is not Ready before
/// it is force-deleted (the kubelet cannot confirm; the node lifecycle controller's default
/// grace for an unresponsive node is 40 s, and its eviction waits longer still).
pub const TERMINATING_MARGIN: std::time::Duration = std::time::Duration::from_secs(30);

impl PodState {
    /// Every state.
    pub const ALL: &'static [PodState] = <PodState as strum::VariantArray>::VARIANTS;

    /// The name stored in `pod_observations.state`.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The state named `s`, if any.
    pub fn parse(s: &str) -> Option<PodState> {
        s.parse().ok()
    }

    /// The attempt's fate is decided by what the Pod showed (it exited, was refused, or can
    /// never start): a deletion afterwards loses nothing.
    pub fn is_final_exit(self) -> bool {
        matches!(
            self,
            PodState::Succeeded
                | PodState::Failed
                | PodState::SetupFailed
                | PodState::Refused
                | PodState::DeadlineExceeded
                | PodState::Invalid
        )
    }
}

/// What the operator's shared Pod watch last saw of one attempt's Pod (the pod executor's
/// input; job controllers read it instead of watching or polling the API).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodObservation {
    /// The job.
    pub job_id: i64,
    /// The attempt the Pod belongs to.
    pub attempt: i32,
    /// Its member's rank in a multi-node attempt (0 for a job of one Pod).
    pub rank: u32,
    /// The Pod's name.
    pub pod_name: String,
    /// Where it stands.
    pub state: PodState,
    /// Exit code of the failing container, when there is one.
    pub exit_code: Option<i32>,
    /// CamelCase reason (e.g. `OOMKilled`, `EvictionByEvictionAPI`).
    pub reason: String,
    /// Human-readable detail (e.g. the scheduler's "0/4 nodes are available: ...").
    pub message: String,
    /// The Pod is gone from the API.
    pub deleted: bool,
    /// The node it is bound to (empty before it is scheduled).
    pub node: String,
    /// When it started terminating (ms since epoch: its `deletionTimestamp` minus its grace
    /// period), while [`PodState::Terminating`].
    pub terminating_since_ms: Option<i64>,
    /// Its deletion grace period, seconds (`deletionGracePeriodSeconds`).
    pub grace_seconds: Option<i64>,
    /// What failure rules read of an ended Pod: every terminated container, its conditions,
    /// the reasons given (empty while it has not ended).
    pub evidence: Evidence,
    /// When its end was first seen (ms since epoch: exited, refused, lost, terminating); None
    /// while it has not ended. Of a gang's members that ended badly, the first decides.
    pub ended_at_ms: Option<i64>,
}

impl Store {
    /// Records what the Pod watch saw; returns true when it differs from what was stored. The
    /// first end time recorded of a Pod is kept (`ended_at_ms`: when its end was first seen).
    /// Rank
    /// 0 lives in `pod_observations` (as before multi-node jobs, so a job controller of an
    /// earlier release reads it unchanged), the other ranks in `pod_members`.
    pub fn record_pod(&mut self, o: &PodObservation) -> Result<bool> {
        let (table, key, rank) = if o.rank == 0 {
            ("pod_observations", "job_id, attempt", None)
        } else {
            ("pod_members", "job_id, attempt, rank", Some(o.rank))
        };
        let rank_col = if rank.is_some() { ", rank" } else { "" };
        let rank_val = if rank.is_some() { ", ?15" } else { "" };
        let sql = format!(
            "INSERT INTO {table} (job_id, attempt, pod_name, state, exit_code, reason,
                message, deleted, observed_at_ms, node, terminating_since_ms, grace_seconds, evidence,
                ended_at_ms{rank_col})
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14{rank_val})
             ON CONFLICT ({key}) DO UPDATE SET pod_name = excluded.pod_name,
                state = excluded.state, exit_code = excluded.exit_code, reason = excluded.reason,
                message = excluded.message, deleted = excluded.deleted,
                observed_at_ms = excluded.observed_at_ms, node = excluded.node,
                terminating_since_ms = excluded.terminating_since_ms,
                grace_seconds = excluded.grace_seconds, evidence = excluded.evidence,
                ended_at_ms = coalesce({table}.ended_at_ms, excluded.ended_at_ms)
             WHERE state != excluded.state OR exit_code IS NOT excluded.exit_code
                OR reason != excluded.reason OR message != excluded.message
                OR deleted != excluded.deleted OR node != excluded.node
                OR terminating_since_ms IS NOT excluded.terminating_since_ms
                OR evidence != excluded.evidence"
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let evidence = serde_json::to_string(&o.evidence).expect("evidence serializes");
        let now = now_ms();
        let mut values: Vec<&dyn rusqlite::ToSql> = vec![
            &o.job_id,
            &o.attempt,
            &o.pod_name,
            &"",
            &o.exit_code,
            &o.reason,
            &o.message,
            &o.deleted,
            &now,
            &o.node,
            &o.terminating_since_ms,
            &o.grace_seconds,
            &evidence,
            &o.ended_at_ms,
        ];
        let state = o.state.as_str();
        values[3] = &state;
        if let Some(rank) = &rank {
            values.push(rank);
        }
        let changed = stmt.execute(values.as_slice())?;
        Ok(changed > 0)
    }

    /// The latest observation of an attempt's Pod (rank 0).
    pub fn pod_observation(&self, job_id: i64, attempt: i32) -> Result<Option<PodObservation>> {
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS}, 0 FROM pod_observations WHERE job_id = ?1 AND attempt = ?2"
            ))?
            .query_row(params![job_id, attempt], |r| read(job_id, r))
            .optional()?)
    }

    /// The latest observation of member `rank` of an attempt's Pods, if the watch saw it.
    pub fn pod_member(
        &self,
        job_id: i64,
        attempt: i32,
        rank: u32,
    ) -> Result<Option<PodObservation>> {
        if rank == 0 {
            return self.pod_observation(job_id, attempt);
        }
        Ok(self
            .conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS}, rank FROM pod_members
                 WHERE job_id = ?1 AND attempt = ?2 AND rank = ?3"
            ))?
            .query_row(params![job_id, attempt, rank], |r| read(job_id, r))
            .optional()?)
    }

    /// The latest observation of every member Pod of an attempt that the watch saw, by rank
    /// (rank 0 first, when seen).
    pub fn pod_members(&self, job_id: i64, attempt: i32) -> Result<Vec<PodObservation>> {
        let mut all: Vec<PodObservation> =
            self.pod_observation(job_id, attempt)?.into_iter().collect();
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {COLUMNS}, rank FROM pod_members WHERE job_id = ?1 AND attempt = ?2
             ORDER BY rank"
        ))?;
        let rows = stmt.query_map(params![job_id, attempt], |r| read(job_id, r))?;
        for o in rows {
            all.push(o?);
        }
        Ok(all)
    }
}

/// The columns [`read`] reads, in its order (then the rank).
const COLUMNS: &str = "job_id, attempt, pod_name, state, exit_code, reason, message, deleted,
    node, terminating_since_ms, grace_seconds, evidence, ended_at_ms";

fn read(job_id: i64, r: &rusqlite::Row<'_>) -> rusqlite::Result<PodObservation> {
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
        ended_at_ms: r.get(12)?,
        rank: r.get(13)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_states_round_trip() {
        for &s in PodState::ALL {
            assert_eq!(PodState::parse(s.as_str()), Some(s));
        }
    }
}
