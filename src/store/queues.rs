//! The queues' queries (`crate::queues`, `docs/design.md#queues`): each queue's slots held, the
//! queues that have waiting jobs, a queue's head in admission order, its counts. Each is served
//! by a partial index (`jobs_live_by_queue`, `jobs_waiting_by_queue`): none reads finished jobs.

use std::collections::{BTreeMap, BTreeSet};

use rusqlite::{OptionalExtension, params};

use super::{Result, Store};
use crate::api::WaitReason;
use crate::queues::QueueLoad;

/// A queued job, briefly: what a scheduling pass reads of a queue's head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Queued {
    /// Store id.
    pub id: i64,
    /// Its queue.
    pub queue: String,
    /// Its namespace (its queue must admit it).
    pub namespace: String,
    /// Its priority.
    pub priority: i32,
    /// Its message now.
    pub message: String,
    /// Why it waits, as last said.
    pub wait_reason: Option<WaitReason>,
}

fn queued(r: &rusqlite::Row<'_>) -> rusqlite::Result<Queued> {
    let reason: Option<String> = r.get(5)?;
    Ok(Queued {
        id: r.get(0)?,
        queue: r.get(1)?,
        namespace: r.get(2)?,
        priority: r.get(3)?,
        message: r.get(4)?,
        wait_reason: reason.as_deref().and_then(WaitReason::parse),
    })
}

const QUEUED_COLUMNS: &str = "id, queue, namespace, priority, message, wait_reason";

/// Queued jobs a pass may admit at the time bound to parameter `?{now}` (ms since epoch; 0: any
/// time): not cancelled, not in a back-off.
fn admissible(now: usize) -> String {
    format!(
        "cancel_requested = 0
        AND (?{now} = 0 OR backoff_until_ms IS NULL OR backoff_until_ms <= ?{now})"
    )
}

const USAGE_SQL: &str = "SELECT queue, schedule_state = 'Launching', count(*)
     FROM jobs INDEXED BY jobs_live_by_queue
     WHERE schedule_state IN ('Launching', 'Alive', 'AliveWaiting')
     GROUP BY queue, schedule_state";

const NEXT_WAITING_QUEUE_SQL: &str = "SELECT queue FROM jobs
     WHERE schedule_state = 'Waiting' AND queue > ?1 ORDER BY queue LIMIT 1";

const WAITING_COUNTS_SQL: &str =
    "SELECT queue, count(*) FROM jobs WHERE schedule_state = 'Waiting' GROUP BY queue";

fn candidates_sql() -> String {
    format!(
        "SELECT {QUEUED_COLUMNS} FROM jobs
         WHERE schedule_state = 'Waiting' AND queue = ?1 AND {}
            AND (?4 IS NULL OR namespace IN (SELECT value FROM json_each(?4)))
         ORDER BY priority DESC, queued_at_ms, id LIMIT ?2",
        admissible(3)
    )
}

fn relaunches_sql() -> String {
    format!(
        "SELECT {QUEUED_COLUMNS} FROM jobs
         WHERE schedule_state IN ('Waiting', 'AliveWaiting') AND schedule_state = 'AliveWaiting'
            AND {}
         ORDER BY priority DESC, queued_at_ms, id",
        admissible(1)
    )
}

const LIVE_SQL: &str = "SELECT id, queue, priority,
        CASE WHEN phase = 'Running' AND schedule_state = 'Alive' AND cancel_requested = 0
            AND json_extract(spec, '$.suspend') IS NOT 1 THEN running_since_ms END,
        CASE WHEN preempt_requested = 1 THEN preempted_by END
     FROM jobs INDEXED BY jobs_live_by_queue
     WHERE schedule_state IN ('Launching', 'Alive', 'AliveWaiting')";

const RECENT_PREEMPTIONS_SQL: &str = "SELECT preempted_by, count(*) FROM jobs
     WHERE preempted_at_ms IS NOT NULL AND preempted_at_ms > ?1 GROUP BY preempted_by";

/// The counts a queue's status shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueCounts {
    /// Jobs waiting (Waiting).
    pub waiting: usize,
    /// Slots held.
    pub load: QueueLoad,
}

impl Store {
    /// Slots each queue's jobs hold now (queues holding none are absent).
    pub fn queue_usage(&self) -> Result<BTreeMap<String, QueueLoad>> {
        let mut stmt = self.conn.prepare_cached(USAGE_SQL)?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, bool>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?;
        let mut out: BTreeMap<String, QueueLoad> = BTreeMap::new();
        for row in rows {
            let (queue, launching, n) = row?;
            let load = out.entry(queue).or_default();
            load.alive += n as usize;
            if launching {
                load.launching += n as usize;
            }
        }
        Ok(out)
    }

    /// The queues that have Waiting jobs, by name: one index seek per queue (a loose index scan),
    /// however many jobs wait.
    pub fn waiting_queues(&self) -> Result<Vec<String>> {
        let mut stmt = self.conn.prepare_cached(NEXT_WAITING_QUEUE_SQL)?;
        let mut out = Vec::new();
        let mut after = String::new();
        while let Some(q) = stmt
            .query_row([&after], |r| r.get::<_, String>(0))
            .optional()?
        {
            after = q.clone();
            out.push(q);
        }
        Ok(out)
    }

    /// Up to `limit` Waiting jobs of `queue` a pass may admit at `now_ms` (see
    /// [`Store::queue_head`]), in admission order (priority, then entry in the queue, then id),
    /// only of the namespaces in `namespaces` when given.
    pub fn queue_candidates(
        &self,
        queue: &str,
        namespaces: Option<&BTreeSet<String>>,
        limit: usize,
        now_ms: i64,
    ) -> Result<Vec<Queued>> {
        let allowed = namespaces.map(|set| {
            serde_json::to_string(&set.iter().collect::<Vec<_>>()).expect("names serialize")
        });
        let mut stmt = self.conn.prepare_cached(&candidates_sql())?;
        let rows = stmt.query_map(params![queue, limit as i64, now_ms, allowed], queued)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Every AliveWaiting job (a relaunch or a pipeline's next task, waiting for a launch slot)
    /// a pass may admit at `now_ms`, in admission order; at most the run cap's worth.
    pub fn relaunch_candidates(&self, now_ms: i64) -> Result<Vec<Queued>> {
        let mut stmt = self.conn.prepare_cached(&relaunches_sql())?;
        let rows = stmt.query_map([now_ms], queued)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The first `limit` Waiting jobs of `queue` a pass may admit at `now_ms`, whatever their
    /// namespace: the ones whose message a pass keeps saying why they wait.
    pub fn queue_head_briefly(
        &self,
        queue: &str,
        limit: usize,
        now_ms: i64,
    ) -> Result<Vec<Queued>> {
        self.queue_candidates(queue, None, limit, now_ms)
    }

    /// Every job holding a run slot, by queue, as the preemption planner sees it
    /// ([`crate::preemption::Running`]: only a job Running + Alive, not being cancelled or
    /// suspended, shows when it began to run; one whose preemption is under way shows for
    /// whom). Served by `jobs_live_by_queue`: O(jobs holding a run slot).
    pub fn live_for_preemption(&self) -> Result<Vec<(String, crate::preemption::Running)>> {
        let mut stmt = self.conn.prepare_cached(LIVE_SQL)?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(1)?,
                crate::preemption::Running {
                    id: r.get(0)?,
                    priority: r.get(2)?,
                    running_since_ms: r.get(3)?,
                    leaving_for: r.get(4)?,
                },
            ))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Preemptions decided after `since_ms` (ms since epoch), by the queue that took the slot
    /// (a queue's `maxPerMinute`). Served by `jobs_preempted`.
    pub fn recent_preemptions(&self, since_ms: i64) -> Result<BTreeMap<String, usize>> {
        let mut stmt = self.conn.prepare_cached(RECENT_PREEMPTIONS_SQL)?;
        let rows = stmt.query_map([since_ms], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as usize))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Each queue's counts: Waiting jobs (one pass over the waiting jobs' index) and slots held.
    /// For the queues' status, written at a bounded rate, not for every scheduling pass.
    pub fn queue_counts(&self) -> Result<BTreeMap<String, QueueCounts>> {
        let mut out: BTreeMap<String, QueueCounts> = self
            .queue_usage()?
            .into_iter()
            .map(|(q, load)| (q, QueueCounts { waiting: 0, load }))
            .collect();
        let mut stmt = self.conn.prepare_cached(WAITING_COUNTS_SQL)?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
        for row in rows {
            let (queue, n) = row?;
            out.entry(queue).or_default().waiting = n as usize;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every query of the queues is served by an index: none reads the whole jobs table (so
    /// finished jobs never slow a pass down), and none sorts the waiting jobs.
    #[test]
    fn the_queue_queries_read_indexes_only() {
        let store = Store::in_memory().unwrap();
        for sql in [
            USAGE_SQL.to_string(),
            NEXT_WAITING_QUEUE_SQL.to_string(),
            WAITING_COUNTS_SQL.to_string(),
            candidates_sql(),
            LIVE_SQL.to_string(),
            RECENT_PREEMPTIONS_SQL.to_string(),
            relaunches_sql(),
        ] {
            let mut stmt = store
                .conn
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .unwrap();
            let n = stmt.parameter_count();
            let params: Vec<Box<dyn rusqlite::ToSql>> = (1..=n)
                .map(|i| -> Box<dyn rusqlite::ToSql> {
                    if i == 4 {
                        Box::new("[\"a\"]")
                    } else {
                        Box::new(1i64)
                    }
                })
                .collect();
            let steps: Vec<String> = stmt
                .query_map(rusqlite::params_from_iter(params.iter()), |r| {
                    r.get::<_, String>(3)
                })
                .unwrap()
                .map(|r| r.unwrap())
                .collect();
            assert!(
                steps
                    .iter()
                    .all(|s| !s.starts_with("SCAN jobs") || s.contains("INDEX")),
                "{sql}\nreads the whole table: {steps:?}"
            );
            if sql.contains("queue = ?1") {
                assert!(
                    steps.iter().all(|s| !s.contains("TEMP B-TREE")),
                    "{sql}\nsorts: {steps:?}"
                );
            }
        }
    }
}
