//! The store's reads for admission in resources (`crate::admission`, issue 44): what each queue
//! uses of its quotas, the jobs holding quota (for reservations and reclaim), a candidate's
//! demand; and the demands of jobs recorded by an earlier release, filled in once.
//!
//! Which jobs hold quota is declared once ([`crate::admission::HOLDS_RUN_SLOT`]: the states
//! that hold a run slot hold their demand on their pool) and rendered into the SQL here; each
//! query is served by the partial index `jobs_live_by_pool` (store step 14), so none reads
//! finished or waiting jobs.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use rusqlite::params;

use super::{Result, Store};
use crate::admission::{HOLDS_RUN_SLOT, states_sql};
use crate::api::ScheduleState;
use crate::resources::quota::Dim;
use crate::resources::{Amount, Demand};

fn usage_sql() -> String {
    format!(
        "SELECT j.queue, j.pool, r.key,
                SUM(r.value * json_extract(j.demands, '$[' || j.task_index || '].m'))
         FROM jobs j INDEXED BY jobs_live_by_pool,
              json_each(j.demands, '$[' || j.task_index || '].r') r
         WHERE j.schedule_state IN ({}) AND j.pool IS NOT NULL
         GROUP BY j.queue, j.pool, r.key",
        states_sql(HOLDS_RUN_SLOT)
    )
}

/// The jobs of queue ?1 holding quota on a pool (an index seek of `jobs_live_by_pool`), in the
/// index's order.
pub(super) fn pooled_sql() -> String {
    format!(
        "SELECT id, uid, queue, attempt, priority, schedule_state, pool, placement,
                demands, task_index,
                CASE WHEN phase = 'Running' AND schedule_state = 'Alive' AND cancel_requested = 0
                    AND json_extract(spec, '$.suspend') IS NOT 1 THEN running_since_ms END,
                CASE WHEN preempt_requested = 1 THEN preempted_by END
         FROM jobs INDEXED BY jobs_live_by_pool
         WHERE queue = ?1 AND schedule_state IN ({}) AND pool IS NOT NULL
         ORDER BY pool, id",
        states_sql(HOLDS_RUN_SLOT)
    )
}

pub use super::memo::Pooled;

/// What the jobs of `pooled` use, per queue, pool and resource (milli-units): what
/// [`Store::quota_usage`] sums in SQL, summed from a read of the pooled jobs a pass has made
/// anyway (their demands are read once, not twice).
pub fn usage_of(pooled: &[Arc<Pooled>]) -> BTreeMap<String, BTreeMap<Dim, Amount>> {
    let mut out: BTreeMap<String, BTreeMap<Dim, Amount>> = BTreeMap::new();
    for job in pooled {
        let queue = match out.get_mut(&job.queue) {
            Some(q) => q,
            None => out.entry(job.queue.clone()).or_default(),
        };
        for (resource, a) in job.demand.per_member.iter() {
            let used = queue
                .entry((job.pool.clone(), resource.to_string()))
                .or_default();
            *used = used.saturating_add(a.saturating_mul(i64::from(job.demand.members)));
        }
    }
    out
}

/// A job's current demand and the pool it holds quota on.
pub type DemandAndPool = (Option<Demand>, Option<String>);

impl Store {
    /// What each queue's jobs holding a run slot ask for, per pool and resource (milli-units):
    /// one pass over the pooled live jobs' index, summed in SQL.
    pub fn quota_usage(&self) -> Result<BTreeMap<String, BTreeMap<Dim, Amount>>> {
        let mut stmt = self.conn.prepare_cached(&usage_sql())?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, f64>(3)?,
            ))
        })?;
        let mut out: BTreeMap<String, BTreeMap<Dim, Amount>> = BTreeMap::new();
        for row in rows {
            let (queue, pool, resource, amount) = row?;
            out.entry(queue)
                .or_default()
                .insert((pool, resource), amount.round() as Amount);
        }
        Ok(out)
    }

    /// Every job holding quota on a pool, with its demand and placement, by queue name, then
    /// pool, then id. A queue's jobs are read again only when it changed since they were last
    /// ([`super::memo`]): one index seek per queue that did.
    pub fn pooled_jobs(&self) -> Result<Vec<Arc<Pooled>>> {
        // The counts first: a write after them makes what is read look older, never newer.
        let mut changes: Vec<(String, i64)> = self.all_changes()?.into_iter().collect();
        changes.sort_unstable();
        let mut memo = self.memo.borrow_mut();
        let mut out = Vec::new();
        for (queue, n) in changes {
            let kept = memo.at(&queue, n);
            if kept.pooled.is_none() {
                kept.pooled = Some(self.pooled_of(&queue)?);
            }
            out.extend(kept.pooled.iter().flatten().cloned());
        }
        Ok(out)
    }

    /// The jobs of `queue` holding quota on a pool.
    fn pooled_of(&self, queue: &str) -> Result<Vec<Arc<Pooled>>> {
        let mut stmt = self.conn.prepare_cached(&pooled_sql())?;
        let mut parsed = self.parsed.borrow_mut();
        let rows = stmt.query_map([queue], |r| {
            let state: String = r.get(5)?;
            let placement = r.get_ref(7)?.as_str_or_null()?;
            let demands = r.get_ref(8)?.as_str()?;
            let task: i64 = r.get(9)?;
            Ok(Arc::new(Pooled {
                id: r.get(0)?,
                uid: r.get(1)?,
                queue: r.get(2)?,
                attempt: r.get(3)?,
                priority: r.get(4)?,
                schedule_state: ScheduleState::parse(&state).unwrap_or(ScheduleState::Alive),
                pool: r.get(6)?,
                placement: placement.and_then(|p| parsed.placement(p)),
                demand: parsed.demand(demands, task).unwrap_or_default(),
                running_since_ms: r.get(10)?,
                leaving_for: r.get(11)?,
            }))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The current task's demand and the pool of each job of `ids` (those that exist).
    pub fn demands_of(&self, ids: &[i64]) -> Result<HashMap<i64, DemandAndPool>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, demands, task_index, pool FROM jobs
             WHERE id IN (SELECT value FROM json_each(?1))",
        )?;
        let list = serde_json::to_string(ids).expect("ids serialize");
        let mut parsed = self.parsed.borrow_mut();
        let rows = stmt.query_map([list], |r| {
            let demands = r.get_ref(1)?.as_str()?;
            let task: i64 = r.get(2)?;
            Ok((
                r.get::<_, i64>(0)?,
                (
                    parsed.demand(demands, task).map(Arc::unwrap_or_clone),
                    r.get::<_, Option<String>>(3)?,
                ),
            ))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Computes the demands of the jobs an earlier release recorded (none then: `[]`) that are
    /// not finished, from their specs ([`crate::resources::demand::of_job`]); a spec whose
    /// quantities cannot be read keeps none (its job needs slots only, as before). Run by the
    /// operator at start, after the migrations. Returns the jobs filled in.
    pub fn fill_demands(&mut self) -> Result<usize> {
        let todo: Vec<(i64, String)> = {
            let mut stmt = self.conn.prepare(
                "SELECT id, spec FROM jobs WHERE demands = '[]' AND schedule_state != 'Done'",
            )?;
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        let tx = self.conn.transaction()?;
        let mut filled = 0;
        for (id, spec) in todo {
            let Ok(spec) = serde_json::from_str::<crate::api::ManagedJobSpec>(&spec) else {
                continue;
            };
            let Ok(demands) = crate::resources::demand::of_job(
                &spec,
                spec.resources.as_ref().map(|r| &r.requests),
            ) else {
                continue;
            };
            let json = serde_json::to_string(&demands).expect("demands serialize");
            filled += tx.execute(
                "UPDATE jobs SET demands = ?2 WHERE id = ?1",
                params![id, json],
            )?;
        }
        tx.commit()?;
        Ok(filled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every query of this module is served by an index: none reads the whole jobs table.
    #[test]
    fn the_resource_queries_read_indexes_only() {
        let store = Store::in_memory().unwrap();
        for sql in [usage_sql(), pooled_sql()] {
            let mut stmt = store
                .conn
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .unwrap();
            let params = vec!["team-a"; stmt.parameter_count()];
            let steps: Vec<String> = stmt
                .query_map(rusqlite::params_from_iter(params), |r| {
                    r.get::<_, String>(3)
                })
                .unwrap()
                .map(|r| r.unwrap())
                .collect();
            assert!(
                steps
                    .iter()
                    .all(|s| !s.starts_with("SCAN jobs") && !s.starts_with("SCAN j ")
                        || s.contains("INDEX")),
                "{sql}\nreads the whole table: {steps:?}"
            );
        }
    }

    /// A gang of 4 x 8 GPUs admitted onto pool `gpu` counts 32 GPUs and 4 Pods in its queue's
    /// usage while it holds its run slot, none once it is done; a job of a queue without pools
    /// counts nowhere.
    #[test]
    fn quota_usage_follows_admission_and_release() {
        let mut store = Store::in_memory().unwrap();
        let spec: crate::api::ManagedJobSpec = serde_json::from_value(serde_json::json!({
            "nodes": 4,
            "queue": "team-a",
            "template": {"spec": {"containers": [
                {"name": "t", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}
        }))
        .unwrap();
        let object = |uid: &'static str, name: &'static str| crate::lifecycle::Object {
            uid,
            namespace: "n",
            name,
            generation: 1,
            spec: &spec,
            created_at_ms: 0,
            resource_version: "",
        };
        let gang = store.submit(&object("u1", "gang"), None).unwrap().row;
        let plain = store.submit(&object("u2", "plain"), None).unwrap().row;
        assert_eq!(gang.demands[0].total().get("nvidia.com/gpu"), 32_000);
        let placement = crate::resources::Placement {
            pool: "gpu".into(),
            ..Default::default()
        };
        store
            .transition(
                gang.id,
                &crate::lifecycle::admit_onto(&gang, Some(placement.clone())),
            )
            .unwrap();
        store
            .transition(plain.id, &crate::lifecycle::admit(&plain))
            .unwrap();
        let usage = store.quota_usage().unwrap();
        let a = &usage["team-a"];
        assert_eq!(
            a[&("gpu".to_string(), "nvidia.com/gpu".to_string())],
            32_000
        );
        assert_eq!(a[&("gpu".to_string(), "pods".to_string())], 4_000);
        assert_eq!(usage.len(), 1);
        let pooled = store.pooled_jobs().unwrap();
        assert_eq!(usage_of(&pooled), usage);
        assert_eq!(pooled.len(), 1);
        assert_eq!(pooled[0].placement.as_deref(), Some(&placement));
        assert_eq!(pooled[0].demand.members, 4);
        let of = store.demands_of(&[gang.id, plain.id]).unwrap();
        assert_eq!(of[&gang.id].1.as_deref(), Some("gpu"));
        assert_eq!(of[&plain.id].1, None);
    }
}
