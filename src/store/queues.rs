//! The queues' queries (`crate::queues`, `docs/design.md#queues`): each queue's slots held, the
//! queues that have waiting jobs, a queue's head in admission order, its counts. Each is served
//! by a partial index (`jobs_live_by_queue`, `jobs_waiting_in_order`, `jobs_waiting_told`): none reads finished jobs.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use rusqlite::{OptionalExtension, params};

use super::parsed::Parsed;
use super::{ADMISSION_ORDER, Result, Store};
use crate::api::WaitReason;
use crate::queues::QueueLoad;

pub use super::memo::Queued;

/// A row of [`QUEUED_COLUMNS`], its demand parsed once per text (`parsed`).
fn queued(r: &rusqlite::Row<'_>, parsed: &mut Parsed) -> rusqlite::Result<Queued> {
    let demands = r.get_ref(7)?.as_str()?;
    let task: i64 = r.get(8)?;
    Ok(Queued {
        id: r.get(0)?,
        queue: r.get(1)?,
        namespace: r.get(2)?,
        priority: r.get(3)?,
        reason_key: r.get(4)?,
        queued_at_ms: r.get(5)?,
        entry_version: r.get(6)?,
        demand: parsed.demand(demands, task),
        pool: r.get(9)?,
    })
}

/// What a pass reads of a candidate (every column is one of [`super::memo::ADMISSION_READS`]).
pub(super) const QUEUED_COLUMNS: &str = "id, queue, namespace, priority, reason_key, queued_at_ms, \
     entry_version, demands, task_index, pool";

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

/// The next (queue, namespace, reason digest) of the Waiting jobs after `(?1, ?2, ?3)`: a loose
/// index scan of `jobs_waiting_told`.
const NEXT_TOLD_GROUP_SQL: &str = "SELECT queue, namespace, reason_key FROM jobs
     WHERE schedule_state = 'Waiting' AND (queue, namespace, reason_key) > (?1, ?2, ?3)
     ORDER BY queue, namespace, reason_key LIMIT 1";

/// Tells the Waiting jobs of queue ?1 and namespace ?2 that were told ?3 the reason ?5 and
/// message ?6 (digest ?7), unless in a back-off at ?4 or being cancelled; a status the API had
/// seen whole waits only for its reason ([`super::jobs::REASON_ONLY`]), but for the jobs in
/// `temp.told_apart` (told their own). Every right-hand side reads the row as it was.
const TELL_GROUP_SQL: &str = "UPDATE jobs SET
        unsynced_since_seq = CASE
            WHEN (wait_reason IS NOT ?5 OR message IS NOT ?6) AND status_version <= synced_version
            THEN 9223372036854775807 ELSE unsynced_since_seq END,
        status_version = status_version + (wait_reason IS NOT ?5 OR message IS NOT ?6),
        wait_reason = ?5, message = ?6, reason_key = ?7
     WHERE schedule_state = 'Waiting' AND queue = ?1 AND namespace = ?2 AND reason_key = ?3
        AND phase = 'Pending' AND cancel_requested = 0
        AND (backoff_until_ms IS NULL OR backoff_until_ms <= ?4)
        AND id NOT IN (SELECT id FROM temp.told_apart)";

/// The jobs [`TELL_GROUP_SQL`] would tell of group (?1, ?2, ?3) at ?4, but for those told
/// their own reason (`temp.told_apart`, checked by the caller).
const GROUP_JOBS_SQL: &str = "SELECT id FROM jobs INDEXED BY jobs_waiting_told
     WHERE schedule_state = 'Waiting' AND queue = ?1 AND namespace = ?2 AND reason_key = ?3
        AND phase = 'Pending' AND cancel_requested = 0
        AND (backoff_until_ms IS NULL OR backoff_until_ms <= ?4)";

/// Tells Waiting job ?1 the reason ?3 and message ?4 (digest ?5) unless it is told them
/// already, in a back-off at ?2 or being cancelled: one job's own reason
/// ([`Store::tell_jobs`]), as [`TELL_GROUP_SQL`] tells a group.
const TELL_JOB_SQL: &str = "UPDATE jobs SET
        unsynced_since_seq = CASE
            WHEN (wait_reason IS NOT ?3 OR message IS NOT ?4) AND status_version <= synced_version
            THEN 9223372036854775807 ELSE unsynced_since_seq END,
        status_version = status_version + (wait_reason IS NOT ?3 OR message IS NOT ?4),
        wait_reason = ?3, message = ?4, reason_key = ?5
     WHERE id = ?1 AND schedule_state = 'Waiting' AND reason_key IS NOT ?5
        AND phase = 'Pending' AND cancel_requested = 0
        AND (backoff_until_ms IS NULL OR backoff_until_ms <= ?2)";

const WAITING_COUNTS_SQL: &str =
    "SELECT queue, count(*) FROM jobs WHERE schedule_state = 'Waiting' GROUP BY queue";

/// How long a job seen arriving ([`Store::arriving`]) holds back the jobs after it in its
/// queue while it is not recorded yet: the operator records a job once its finalizer is on,
/// within a second when it keeps up; past this (a burst paced at the API budget), the jobs
/// behind it are admitted without it.
pub const ARRIVAL_HOLD_MS: i64 = 10_000;

pub(super) fn candidates_sql() -> String {
    format!(
        "SELECT {QUEUED_COLUMNS} FROM jobs
         WHERE schedule_state = 'Waiting' AND queue = ?1 AND {}
            AND (?4 IS NULL OR namespace IN (SELECT value FROM json_each(?4)))
         ORDER BY {ADMISSION_ORDER} LIMIT ?2",
        admissible(3)
    )
}

/// The first job of queue ?1 in admission order seen arriving since ?2 and not recorded yet
/// ([`Store::arriving`]): its priority, second and version. Read once per queue a pass looks
/// at (an index seek, then one lookup by uid per arrival recorded since).
const FIRST_ARRIVING_SQL: &str = "SELECT priority, queued_at_ms, entry_version
     FROM temp.arriving a INDEXED BY arriving_in_order
     WHERE a.queue = ?1 AND a.seen_at_ms >= ?2
        AND NOT EXISTS (SELECT 1 FROM jobs k WHERE k.uid = a.uid)
     ORDER BY priority DESC, queued_at_ms, entry_version LIMIT 1";

/// When the first back-off of queue ?1's Waiting jobs ends after ?2 (ms since epoch; NULL:
/// none): an index seek (`jobs_waiting_backoff`).
pub(super) const NEXT_BACKOFF_END_SQL: &str = "SELECT min(backoff_until_ms) FROM jobs
     WHERE schedule_state = 'Waiting' AND backoff_until_ms IS NOT NULL
        AND queue = ?1 AND backoff_until_ms > ?2";

fn relaunches_sql() -> String {
    format!(
        "SELECT {QUEUED_COLUMNS} FROM jobs
         WHERE schedule_state IN ('Waiting', 'AliveWaiting') AND schedule_state = 'AliveWaiting'
            AND {}
         ORDER BY {ADMISSION_ORDER}",
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

/// What a waiting job told `reason` and `message` holds: the message as stored (capped) and
/// the digest of both ([`crate::lifecycle::said_key`]).
fn told_as(reason: WaitReason, message: &str) -> (String, i64) {
    let message = crate::lifecycle::tasks::capped(message);
    let digest = crate::lifecycle::said_key(reason, &message);
    (message, digest)
}

/// Every queue's count of changes ([`super::memo`]), read on `conn` (a transaction's).
fn all_changes(conn: &rusqlite::Connection) -> Result<HashMap<String, i64>> {
    let mut stmt = conn.prepare_cached("SELECT queue, n FROM queue_changes")?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

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
        // None behind a job of the queue seen arriving and not recorded yet: the queue's order
        // is the API server's, whatever order the operator records the jobs in.
        let since = now_ms.saturating_sub(ARRIVAL_HOLD_MS);
        let first_arriving: Option<(i32, i64, String)> = self
            .conn
            .prepare_cached(FIRST_ARRIVING_SQL)?
            .query_row(params![queue, since], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .optional()?;
        // A queue with a job arriving is read every time (its hold ends with time); any other
        // is answered from the last read while its count of changes holds (`super::memo`).
        let changes = match first_arriving {
            None => Some(self.changes_of(queue)?),
            Some(_) => None,
        };
        if let Some(changes) = changes
            && let Some(kept) = &self.memo.borrow_mut().at(queue, changes).candidates
            && let Some(rows) = kept.answer(allowed.as_deref(), limit, now_ms)
        {
            return Ok(rows);
        }
        let mut stmt = self.conn.prepare_cached(&candidates_sql())?;
        let mut parsed = self.parsed.borrow_mut();
        let rows = stmt.query_map(params![queue, limit as i64, now_ms, allowed], |r| {
            queued(r, &mut parsed)
        })?;
        let arrival = first_arriving
            .as_ref()
            .map(
                |(priority, queued_at_ms, version)| crate::lifecycle::entry::Entry {
                    priority: *priority,
                    queued_at_ms: *queued_at_ms,
                    version,
                    id: 0,
                },
            );
        let mut out = Vec::new();
        let mut cut = false;
        for row in rows {
            let row = row?;
            // In admission order: every job after the first one behind is behind too.
            if let Some(arrival) = &arrival
                && crate::lifecycle::entry::behind(&row.entry(), arrival)
            {
                cut = true;
                break;
            }
            out.push(row);
        }
        // A read at time 0 ("any time": back-offs ignored) is never kept.
        if let (Some(changes), false, true) = (changes, cut, now_ms > 0) {
            let until_ms: Option<i64> = self
                .conn
                .prepare_cached(NEXT_BACKOFF_END_SQL)?
                .query_row(params![queue, now_ms], |r| r.get(0))?;
            self.memo.borrow_mut().at(queue, changes).candidates = Some(super::memo::Candidates {
                allowed,
                limit,
                rows: out.clone(),
                read_at_ms: now_ms,
                until_ms: until_ms.unwrap_or(i64::MAX),
            });
        }
        Ok(out)
    }

    /// The count of changes of `queue` ([`super::memo`]; 0 before its first job).
    pub fn changes_of(&self, queue: &str) -> Result<i64> {
        Ok(self
            .conn
            .prepare_cached("SELECT n FROM queue_changes WHERE queue = ?1")?
            .query_row([queue], |r| r.get(0))
            .optional()?
            .unwrap_or(0))
    }

    /// Every queue's count of changes ([`super::memo`]).
    pub fn all_changes(&self) -> Result<HashMap<String, i64>> {
        all_changes(&self.conn)
    }

    /// Notes a job the operator has seen, unless it is recorded already (a job of `uid`):
    /// its queue, priority and entry ([`crate::lifecycle::entry`]: its creation second,
    /// `queued_at_ms`, and the [`crate::lifecycle::entry::version_key`] it was first seen at),
    /// seen at `now_ms`. While it is not recorded, and for at most [`ARRIVAL_HOLD_MS`], no job
    /// after it in its queue is a candidate. Kept in memory (a table of this connection).
    pub fn arriving(
        &self,
        uid: &str,
        queue: &str,
        priority: i32,
        queued_at_ms: i64,
        entry_version: &str,
        now_ms: i64,
    ) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT OR IGNORE INTO temp.arriving
                 (uid, queue, priority, queued_at_ms, entry_version, seen_at_ms)
                 SELECT ?1, ?2, ?3, ?4, ?5, ?6
                 WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE uid = ?1)",
            )?
            .execute(params![
                uid,
                queue,
                priority,
                queued_at_ms,
                entry_version,
                now_ms
            ])?;
        Ok(())
    }

    /// Forgets the arrivals of `uid` (recorded, deleted, or not this operator's) and those
    /// older than [`ARRIVAL_HOLD_MS`] at `now_ms`.
    pub fn arrived(&self, uid: &str, now_ms: i64) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM temp.arriving WHERE uid = ?1 OR seen_at_ms < ?2")?
            .execute(params![uid, now_ms.saturating_sub(ARRIVAL_HOLD_MS)])?;
        Ok(())
    }

    /// Every AliveWaiting job (a relaunch or a pipeline's next task, waiting for a launch slot)
    /// a pass may admit at `now_ms`, in admission order; at most the run cap's worth.
    pub fn relaunch_candidates(&self, now_ms: i64) -> Result<Vec<Queued>> {
        let mut stmt = self.conn.prepare_cached(&relaunches_sql())?;
        let mut parsed = self.parsed.borrow_mut();
        let rows = stmt.query_map([now_ms], |r| queued(r, &mut parsed))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Tells every Waiting job why it waits, writing only where that changed: for each group of
    /// Waiting jobs (its queue and namespace) the reason and message `why(queue, namespace)`
    /// gives (the same for every job of the group), set on those of its jobs not already told
    /// exactly that ([`crate::lifecycle::JobRow::reason_key`]), except jobs whose own reason
    /// comes first (a back-off at `now_ms`, a cancel under way). It is
    /// [`crate::lifecycle::queued`] for many jobs at once: Pending + Waiting only, no history
    /// entry. A job whose reason or message changes gets its status written again: after
    /// every other status when the API had seen the rest of it ([`super::jobs::REASON_ONLY`]).
    ///
    /// Cost: one index seek per distinct (queue, namespace, digest) of the Waiting jobs
    /// (`jobs_waiting_told`, a loose index scan: a group already told is one seek however many
    /// jobs it holds) and, per group told anew, one UPDATE of its jobs. Returns the jobs
    /// updated.
    pub fn tell_waiting(
        &mut self,
        now_ms: i64,
        why: impl FnMut(&str, &str) -> (WaitReason, String),
    ) -> Result<usize> {
        self.tell_waiting_except(now_ms, &[], why)
    }

    /// Tells each waiting job its own reason (`told`: id, reason, message), where a pass knows
    /// more of it than its group's ([`crate::admission::WhyNot`]: the quota or the nodes it
    /// waits for); written only when it changed: a job whose digest in `said` (what the pass
    /// read, [`Queued::reason_key`]) is the new one's is not written to at all (no write lock
    /// is taken when none changed). Returns how many jobs were told.
    pub fn tell_jobs(
        &mut self,
        now_ms: i64,
        told: &[(i64, WaitReason, String)],
        said: &HashMap<i64, i64>,
    ) -> Result<usize> {
        let changed: Vec<(i64, WaitReason, String, i64)> = told
            .iter()
            .filter_map(|(id, reason, message)| {
                let (message, digest) = told_as(*reason, message);
                (said.get(id) != Some(&digest)).then_some((*id, *reason, message, digest))
            })
            .collect();
        if changed.is_empty() {
            return Ok(0);
        }
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        // No other writer until the commit: what changed each queue's count between the two
        // reads is these writes alone, which the reads kept of it take in.
        let before = all_changes(&tx)?;
        let mut written = HashMap::new();
        {
            let mut tell = tx.prepare_cached(TELL_JOB_SQL)?;
            for (id, reason, message, digest) in changed {
                if tell.execute(params![id, now_ms, reason.as_str(), message, digest])? > 0 {
                    written.insert(id, digest);
                }
            }
        }
        let after = all_changes(&tx)?;
        tx.commit()?;
        self.memo.borrow_mut().told(&before, &after, &written);
        Ok(written.len())
    }

    /// [`Store::tell_waiting`] for every waiting job but those of `skip` (told their own reason
    /// by [`Store::tell_jobs`], with their queue).
    ///
    /// A queue is not scanned again while nothing would come of it ([`super::memo::Told`]):
    /// its count of changes is the one after the last call's writes, its jobs of `skip` are the
    /// same, no back-off of its jobs ended since, and every group it had is told what it was.
    pub fn tell_waiting_except(
        &mut self,
        now_ms: i64,
        skip: &[(i64, &str)],
        mut why: impl FnMut(&str, &str) -> (WaitReason, String),
    ) -> Result<usize> {
        // The counts before the scan: a write after them makes what is kept look older.
        let changes = all_changes(&self.conn)?;
        let mut skip_of: HashMap<&str, Vec<i64>> = HashMap::new();
        for (id, queue) in skip {
            skip_of.entry(queue).or_default().push(*id);
        }
        for ids in skip_of.values_mut() {
            ids.sort_unstable();
        }
        let kept = std::mem::take(&mut self.memo.borrow_mut().told);
        let mut scanned: HashMap<String, super::memo::Told> = HashMap::new();
        // The groups told something else, found by reads alone (no write lock while every
        // group is told already, the steady state).
        let mut stale: Vec<(String, String, i64, WaitReason, String, i64)> = Vec::new();
        {
            let mut next = self.conn.prepare_cached(NEXT_TOLD_GROUP_SQL)?;
            let mut after = (String::new(), String::new(), i64::MIN);
            // The group last asked and what it is told (reason, message, digest).
            type Said = ((String, String), (WaitReason, String, i64));
            let mut said: Option<Said> = None;
            while let Some((queue, namespace, key)) = next
                .query_row(params![after.0, after.1, after.2], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                })
                .optional()?
            {
                if queue != after.0 {
                    // A queue not seen yet in this scan: passed over when nothing would come
                    // of it (every group after it in the index is of a later queue).
                    let count = changes.get(&queue).copied().unwrap_or(0);
                    let queue_skip = skip_of.get(queue.as_str()).map_or(&[][..], |v| &v[..]);
                    if let Some(k) = kept.get(&queue)
                        && k.holds(count, queue_skip, now_ms)
                        && k.said.iter().all(|(ns, d)| {
                            let (reason, message) = why(&queue, ns);
                            told_as(reason, &message).1 == *d
                        })
                    {
                        after = (queue.clone(), "\u{10FFFF}".to_string(), i64::MAX);
                        scanned.insert(queue, k.clone());
                        continue;
                    }
                    scanned.insert(
                        queue.clone(),
                        super::memo::Told {
                            changes: count,
                            skip: queue_skip.to_vec(),
                            said: Vec::new(),
                            until_ms: i64::MAX,
                            at_ms: now_ms,
                        },
                    );
                }
                let group = (queue, namespace);
                if said.as_ref().is_none_or(|(g, _)| *g != group) {
                    let (reason, message) = why(&group.0, &group.1);
                    let (message, digest) = told_as(reason, &message);
                    if let Some(t) = scanned.get_mut(&group.0) {
                        t.said.push((group.1.clone(), digest));
                    }
                    said = Some((group.clone(), (reason, message, digest)));
                }
                let (reason, message, digest) = &said.as_ref().expect("set above").1;
                if key != *digest {
                    stale.push((
                        group.0.clone(),
                        group.1.clone(),
                        key,
                        *reason,
                        message.clone(),
                        *digest,
                    ));
                }
                after = (group.0, group.1, key);
            }
            // A queue scanned is passed over next time only until its next back-off ends.
            let mut backoff = self.conn.prepare_cached(NEXT_BACKOFF_END_SQL)?;
            for (queue, t) in scanned.iter_mut() {
                if t.until_ms == i64::MAX && !t.said.is_empty() {
                    let until: Option<i64> =
                        backoff.query_row(params![queue, now_ms], |r| r.get(0))?;
                    t.until_ms = until.unwrap_or(i64::MAX);
                }
            }
        }
        // A group whose only jobs are told their own reason (`skip`: a candidate's) needs no
        // write: found by reading its jobs until the first other (the candidates told alike
        // form such groups, found stale by every pass: each was a write transaction that
        // matched nothing).
        if !stale.is_empty() {
            let skip: HashSet<i64> = skip.iter().map(|(id, _)| *id).collect();
            let mut jobs = self.conn.prepare_cached(GROUP_JOBS_SQL)?;
            let mut needed = Vec::with_capacity(stale.len());
            for group in stale {
                let mut rows = jobs.query(params![group.0, group.1, group.2, now_ms])?;
                let mut other = false;
                while let Some(r) = rows.next()? {
                    if !skip.contains(&r.get::<_, i64>(0)?) {
                        other = true;
                        break;
                    }
                }
                if other {
                    needed.push(group);
                }
            }
            stale = needed;
        }
        if stale.is_empty() {
            self.memo.borrow_mut().told = scanned;
            return Ok(0);
        }
        // Each UPDATE matches only the jobs still told what the scan saw.
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let mut told = 0;
        let before;
        {
            // The jobs told their own reason, kept apart in a table of this connection: each
            // UPDATE looks a row up in it (a list bound as JSON was parsed again by every
            // UPDATE: 4,000 ids x 500 groups took 460 ms of a pass at 10,000 waiting).
            tx.execute("DELETE FROM temp.told_apart", [])?;
            let mut apart =
                tx.prepare_cached("INSERT OR IGNORE INTO temp.told_apart (id) VALUES (?1)")?;
            for (id, _) in skip {
                apart.execute([id])?;
            }
            before = all_changes(&tx)?;
            let mut tell = tx.prepare_cached(TELL_GROUP_SQL)?;
            for (queue, namespace, key, reason, message, digest) in &stale {
                told += tell.execute(params![
                    queue,
                    namespace,
                    key,
                    now_ms,
                    reason.as_str(),
                    message,
                    digest,
                ])?;
            }
        }
        // No other writer until the commit: a queue written only by these UPDATEs since the
        // scan is kept at its count after them; one another writer changed too is not kept.
        let after = all_changes(&tx)?;
        tx.commit()?;
        scanned.retain(|queue, t| {
            let (was, now) = (before.get(queue), after.get(queue));
            if was == now {
                return true;
            }
            let kept = was.copied().unwrap_or(0) == t.changes;
            t.changes = now.copied().unwrap_or(0);
            kept
        });
        self.memo.borrow_mut().told = scanned;
        Ok(told)
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

    /// The trigger of schema step 16 watches exactly [`super::super::memo::ADMISSION_READS`], and every column of
    /// `jobs` the kept queries name is among them: a column added to a kept query without the
    /// trigger watching it would leave a kept read stale.
    #[test]
    fn the_trigger_watches_every_column_the_kept_reads_name() {
        let store = Store::in_memory().unwrap();
        let columns: BTreeSet<String> = store
            .conn
            .prepare("SELECT name FROM pragma_table_info('jobs')")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        let named = |sql: &str| -> BTreeSet<String> {
            sql.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| columns.contains(*w))
                .map(str::to_string)
                .collect()
        };
        let trigger: String = store
            .conn
            .query_row(
                "SELECT sql FROM sqlite_master WHERE name = 'jobs_queue_changes_update'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        let when = &trigger[trigger.find("WHEN").unwrap()..trigger.find("BEGIN").unwrap()];
        // Each column compared with itself.
        for pair in when.split(" OR ") {
            let words: Vec<&str> = pair
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
                .filter(|w| w.starts_with("OLD.") || w.starts_with("NEW."))
                .collect();
            assert!(
                words.len() == 2 && words[0][4..] == words[1][4..],
                "{pair}: not one column's old and new"
            );
        }
        let reads: BTreeSet<String> = super::super::memo::ADMISSION_READS
            .iter()
            .map(|c| c.to_string())
            .collect();
        assert_eq!(named(when), reads, "the trigger's columns");
        for sql in [
            candidates_sql(),
            NEXT_BACKOFF_END_SQL.to_string(),
            super::super::resources::pooled_sql(),
        ] {
            let missing: Vec<_> = named(&sql).difference(&reads).cloned().collect();
            assert!(missing.is_empty(), "{sql}\nnames {missing:?}, not watched");
        }
    }

    /// Over a store file written by another connection (a job controller, another process),
    /// every change of a column a kept read depends on is seen: after each, the operator's
    /// store (which keeps its reads) answers as a store that keeps nothing does. Its own writes
    /// of reasons are taken in without a read again, and a back-off that ends is seen with no
    /// write at all.
    #[test]
    fn kept_reads_answer_as_fresh_ones_after_any_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let mut ours = Store::open(&path, 2048).unwrap();
        let spec = |queue: &str, gpus: u32| -> crate::api::ManagedJobSpec {
            serde_json::from_value(serde_json::json!({
                "queue": queue,
                "template": {"spec": {"containers": [
                    {"name": "t", "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]}}
            }))
            .unwrap()
        };
        let mut ids = Vec::new();
        for k in 0..12 {
            let queue = ["a", "b"][k % 2];
            let uid = format!("u{k}");
            let name = format!("j{k}");
            let spec = spec(queue, 1 + k as u32 % 3);
            let object = crate::lifecycle::Object {
                uid: &uid,
                namespace: "n",
                name: &name,
                generation: 1,
                spec: &spec,
                created_at_ms: 1_000 * k as i64,
                resource_version: "",
            };
            ids.push(ours.submit(&object, None).unwrap().row.id);
        }
        // Four hold quota on pool p, the rest wait.
        for id in &ids[..4] {
            let row = ours.get(*id).unwrap();
            let placement = crate::resources::Placement {
                pool: "p".into(),
                ..Default::default()
            };
            ours.transition(*id, &crate::lifecycle::admit_onto(&row, Some(placement)))
                .unwrap();
        }
        let now = 1_000_000;
        let answers = |s: &Store| {
            let candidates: Vec<_> = ["a", "b"]
                .iter()
                .map(|q| s.queue_candidates(q, None, 20, now).unwrap())
                .collect();
            let pooled: Vec<super::super::memo::Pooled> = s
                .pooled_jobs()
                .unwrap()
                .into_iter()
                .map(std::sync::Arc::unwrap_or_clone)
                .collect();
            (candidates, pooled)
        };
        let fresh = || Store::open_current(&path, 256).unwrap();
        let other = fresh();
        other
            .conn
            .execute("UPDATE jobs SET preempted_by = 'x'", [])
            .unwrap();
        assert_eq!(answers(&ours), answers(&fresh()));
        let changes: &[(&str, &str)] = &[
            ("queue", "CASE queue WHEN 'a' THEN 'b' ELSE 'a' END"),
            ("namespace", "'m'"),
            ("priority", "priority + 5"),
            ("queued_at_ms", "queued_at_ms - 100000"),
            ("entry_version", "'zz'"),
            ("reason_key", "reason_key + 7"),
            (
                "schedule_state",
                "CASE schedule_state WHEN 'Waiting' THEN 'Alive' ELSE 'Waiting' END",
            ),
            ("cancel_requested", "1 - cancel_requested"),
            ("backoff_until_ms", "2000000"),
            ("demands", "'[]'"),
            ("task_index", "task_index + 1"),
            ("pool", "CASE WHEN pool IS NULL THEN 'p' ELSE 'p2' END"),
            ("placement", "'{\"pool\":\"p3\"}'"),
            ("attempt", "attempt + 1"),
            ("phase", "'Running'"),
            ("spec", "json_set(spec, '$.suspend', json('true'))"),
            ("running_since_ms", "5"),
            ("preempted_by", "'y'"),
            ("preempt_requested", "1"),
        ];
        for (k, (column, value)) in changes.iter().enumerate() {
            // A waiting job and a job holding quota.
            let before = answers(&ours);
            let waits: Vec<i64> = before.0.iter().flatten().map(|q| q.id).collect();
            let (waiting, holding) = (waits[k % waits.len()], before.1[k % before.1.len()].id);
            other
                .conn
                .execute(
                    &format!("UPDATE jobs SET {column} = {value} WHERE id IN (?1, ?2)"),
                    [waiting, holding],
                )
                .unwrap();
            let (kept, read) = (answers(&ours), answers(&fresh()));
            assert_eq!(
                kept, read,
                "after {column} of jobs {waiting} and {holding} changed"
            );
            // Telling the groups (what kept of its last scan, a queue passed over): it leaves
            // nothing a store that keeps nothing would tell.
            let skip: Vec<(i64, &str)> = kept
                .0
                .iter()
                .flat_map(|c| c.iter().take(2))
                .map(|q| (q.id, q.queue.as_str()))
                .collect();
            let why = |q: &str, ns: &str| (WaitReason::Queued, format!("{q} {ns} {}", k / 3));
            ours.tell_waiting_except(now, &skip, why).unwrap();
            assert_eq!(
                fresh().tell_waiting_except(now, &skip, why).unwrap(),
                0,
                "after {column} changed, a group was left untold"
            );
            assert_eq!(ours.tell_waiting_except(now, &skip, why).unwrap(), 0);
            assert!(
                before != read
                    || matches!(
                        *column,
                        "preempted_by" | "spec" | "phase" | "running_since_ms"
                    ),
                "the change of {column} changed no read: the test proves nothing"
            );
        }
        // A job another process records, and one it deletes; fewer rows, then more, of one
        // namespace.
        let spec = spec("a", 2);
        let object = crate::lifecycle::Object {
            uid: "u-other",
            namespace: "n",
            name: "other",
            generation: 1,
            spec: &spec,
            created_at_ms: 0,
            resource_version: "",
        };
        let mut writer = fresh();
        let added = writer.submit(&object, None).unwrap().row.id;
        assert_eq!(answers(&ours), answers(&fresh()));
        assert!(answers(&ours).0.iter().flatten().any(|q| q.id == added));
        writer
            .conn
            .execute("DELETE FROM jobs WHERE id = ?1", [added])
            .unwrap();
        assert_eq!(answers(&ours), answers(&fresh()));
        let only: BTreeSet<String> = ["n".to_string()].into();
        for limit in [1, 2, 9, 2, 20] {
            assert_eq!(
                ours.queue_candidates("a", Some(&only), limit, now).unwrap(),
                fresh()
                    .queue_candidates("a", Some(&only), limit, now)
                    .unwrap(),
                "{limit} of namespace n"
            );
        }
        // Its own reasons: taken in.
        let waiting = ours.queue_candidates("a", None, 4, now).unwrap();
        let told: Vec<_> = waiting
            .iter()
            .map(|q| {
                (
                    q.id,
                    crate::api::WaitReason::Queued,
                    format!("told {}", q.id),
                )
            })
            .collect();
        let said = waiting.iter().map(|q| (q.id, q.reason_key)).collect();
        assert!(ours.tell_jobs(now, &told, &said).unwrap() > 0);
        let kept_at = ours
            .memo
            .borrow_mut()
            .at("a", ours.changes_of("a").unwrap())
            .changes;
        assert!(
            ours.memo.borrow_mut().at("a", kept_at).candidates.is_some(),
            "kept"
        );
        assert_eq!(answers(&ours), answers(&fresh()));
        // A back-off that ends: seen with no write.
        let id = waiting[0].id;
        other
            .conn
            .execute(
                "UPDATE jobs SET backoff_until_ms = ?2 WHERE id = ?1",
                [id, now + 50],
            )
            .unwrap();
        let (kept, read) = (answers(&ours), answers(&fresh()));
        assert_eq!(kept, read);
        assert!(!kept.0[0].iter().any(|q| q.id == id));
        let later = ours.queue_candidates("a", None, 4, now + 60).unwrap();
        assert_eq!(
            later,
            fresh().queue_candidates("a", None, 4, now + 60).unwrap()
        );
        assert!(later.iter().any(|q| q.id == id), "its back-off ended");
    }

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
            NEXT_BACKOFF_END_SQL.to_string(),
            FIRST_ARRIVING_SQL.to_string(),
            LIVE_SQL.to_string(),
            RECENT_PREEMPTIONS_SQL.to_string(),
            relaunches_sql(),
            NEXT_TOLD_GROUP_SQL.to_string(),
            GROUP_JOBS_SQL.to_string(),
            TELL_GROUP_SQL.to_string(),
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

    fn spec(queue: &str, priority: i32) -> crate::api::ManagedJobSpec {
        crate::api::ManagedJobSpec {
            run: Some("true".into()),
            queue: Some(queue.into()),
            priority,
            ..Default::default()
        }
    }

    /// Submits a job of `namespace` in `queue` created at `created_ms`, first seen at `version`.
    fn submit(
        store: &mut Store,
        i: usize,
        namespace: &str,
        spec: &crate::api::ManagedJobSpec,
        created_ms: i64,
        version: &str,
    ) -> crate::lifecycle::JobRow {
        let (uid, name) = (format!("u{i}"), format!("j{i}"));
        let object = crate::lifecycle::Object {
            uid: &uid,
            namespace,
            name: &name,
            generation: 1,
            spec,
            created_at_ms: created_ms,
            resource_version: version,
        };
        store.submit(&object, None).unwrap().row
    }

    proptest::proptest! {
        /// A queue's jobs come out of the store in the order `lifecycle::entry` declares:
        /// priority, then the creation second, then the version first seen, then the id (jobs
        /// submitted in any order, many in one second).
        #[test]
        fn the_store_orders_a_queue_as_the_lifecycle_rule(
            jobs in proptest::collection::vec((0i32..2, 0i64..3, proptest::option::of(1u64..40)), 1..25),
        ) {
            let mut store = Store::in_memory().unwrap();
            let mut rows = Vec::new();
            for (i, (priority, second, version)) in jobs.iter().enumerate() {
                let version = version.map(|v| v.to_string()).unwrap_or_default();
                rows.push(submit(&mut store, i, "ns", &spec("q", *priority), second * 1000, &version));
            }
            let mut expected = rows.clone();
            fn key(r: &crate::lifecycle::JobRow) -> crate::lifecycle::entry::Entry<'_> {
                crate::lifecycle::entry::Entry {
                    priority: r.priority,
                    queued_at_ms: r.queued_at_ms,
                    version: &r.entry_version,
                    id: r.id,
                }
            }
            expected.sort_by(|a, b| crate::lifecycle::entry::admission_order(&key(a), &key(b)));
            let got: Vec<i64> = store
                .queue_candidates("q", None, 100, 0)
                .unwrap()
                .iter()
                .map(|q| q.id)
                .collect();
            let want: Vec<i64> = expected.iter().map(|r| r.id).collect();
            proptest::prop_assert_eq!(&got, &want);
            let brief: Vec<i64> = store.waiting_brief().unwrap().iter().map(|b| b.id).collect();
            proptest::prop_assert_eq!(brief, want);
        }
    }

    /// A job seen arriving and not recorded yet holds back the jobs after it in its queue's
    /// order (its priority, its creation second, the version it was first seen at), not those
    /// before it nor other queues'; not once recorded, forgotten, or older than the hold.
    #[test]
    fn a_job_not_recorded_yet_holds_back_the_jobs_after_it() {
        let mut store = Store::in_memory().unwrap();
        let rows: Vec<_> = [(0, "10"), (1, "20"), (2, "30")]
            .iter()
            .map(|(i, v)| submit(&mut store, *i, "ns", &spec("q", 0), 5000, v))
            .collect();
        let other = submit(&mut store, 3, "ns", &spec("other", 0), 5000, "40");
        let candidates = |store: &Store, queue: &str, now: i64| -> Vec<i64> {
            let got = store.queue_candidates(queue, None, 100, now).unwrap();
            got.iter().map(|q| q.id).collect()
        };
        let now = 100_000;
        let all: Vec<i64> = rows.iter().map(|r| r.id).collect();
        assert_eq!(candidates(&store, "q", now), all);
        // Created in the same second, first seen at version 15: between the first two.
        store
            .arriving("x", "q", 0, 5000, &version("15"), now)
            .unwrap();
        assert_eq!(candidates(&store, "q", now), [rows[0].id]);
        assert_eq!(candidates(&store, "other", now), [other.id]);
        // Past the hold, the jobs behind it go on without it.
        assert_eq!(candidates(&store, "q", now + ARRIVAL_HOLD_MS + 1), all);
        store.arrived("x", now).unwrap();
        assert_eq!(candidates(&store, "q", now), all);
        // A higher priority holds back every job of lower priority, whenever created.
        store
            .arriving("y", "q", 5, 9000, &version("99"), now)
            .unwrap();
        assert!(candidates(&store, "q", now).is_empty());
        // A recorded job is not noted; an arrival whose job was recorded since holds nothing
        // back.
        store.arrived("y", now).unwrap();
        store
            .arriving(&rows[1].uid, "q", 0, 5000, &version("20"), now)
            .unwrap();
        let noted: i64 = store
            .conn
            .query_row("SELECT count(*) FROM temp.arriving", [], |r| r.get(0))
            .unwrap();
        assert_eq!(noted, 0);
        store
            .conn
            .execute(
                "INSERT INTO temp.arriving VALUES (?1, 'q', 0, 5000, ?2, ?3)",
                params![rows[1].uid, version("20"), now],
            )
            .unwrap();
        assert_eq!(candidates(&store, "q", now), all);
        // Arrivals past the hold are forgotten by the next one forgotten.
        store.arriving("z", "q", 0, 0, "", now).unwrap();
        store.arrived("none", now + ARRIVAL_HOLD_MS + 1).unwrap();
        let left: i64 = store
            .conn
            .query_row("SELECT count(*) FROM temp.arriving", [], |r| r.get(0))
            .unwrap();
        assert_eq!(left, 0);
    }

    fn version(rv: &str) -> String {
        crate::lifecycle::entry::version_key(rv).unwrap()
    }

    /// A job told its own reason (the quota or the nodes it waits for) keeps it while the
    /// group's reason is told to the others, and is written again only when its reason changes.
    #[test]
    fn a_job_told_its_own_reason_keeps_it_beside_its_group() {
        let mut store = Store::in_memory().unwrap();
        let rows: Vec<_> = (0..3)
            .map(|i| submit(&mut store, i, "a", &spec("q", 0), 1000, ""))
            .collect();
        let group = |_: &str, _: &str| (WaitReason::RunCapReached, "run cap".to_string());
        let own = vec![(
            rows[1].id,
            WaitReason::InsufficientQuota,
            "needs 8 nvidia.com/gpu".to_string(),
        )];
        assert_eq!(store.tell_jobs(0, &own, &HashMap::new()).unwrap(), 1);
        assert_eq!(
            store
                .tell_waiting_except(0, &[(rows[1].id, rows[1].queue.as_str())], group)
                .unwrap(),
            2
        );
        let said = |store: &Store, i: usize| {
            let r = store.get(rows[i].id).unwrap();
            (r.wait_reason, r.message)
        };
        assert_eq!(
            said(&store, 1),
            (
                Some(WaitReason::InsufficientQuota),
                "needs 8 nvidia.com/gpu".to_string()
            )
        );
        assert_eq!(said(&store, 0).0, Some(WaitReason::RunCapReached));
        // Told again the same: nothing written; once no longer its own, its group's.
        assert_eq!(store.tell_jobs(0, &own, &HashMap::new()).unwrap(), 0);
        assert_eq!(
            store
                .tell_waiting_except(0, &[(rows[1].id, rows[1].queue.as_str())], group)
                .unwrap(),
            0
        );
        assert_eq!(store.tell_waiting(0, group).unwrap(), 1);
        assert_eq!(said(&store, 1).0, Some(WaitReason::RunCapReached));
    }

    /// A pass tells every waiting job its group's reason, and writes only where it changed:
    /// a job already told is not touched, a new one is, a job in a back-off keeps its own;
    /// a status the API had seen whole waits for its reason after every other status.
    #[test]
    fn waiting_jobs_are_told_only_what_changed() {
        use crate::api::ScheduleState;
        let mut store = Store::in_memory().unwrap();
        let mut rows = Vec::new();
        for i in 0..30 {
            let ns = if i < 25 { "a" } else { "b" };
            rows.push(submit(&mut store, i, ns, &spec("q", 0), 1000, ""));
        }
        // The API has seen every first status.
        for r in &rows {
            store.mark_synced(r.id, r.status_version).unwrap();
        }
        // One of them holds a slot now, with its change unwritten.
        let admitted = store
            .transition(rows[0].id, &crate::lifecycle::admit(&rows[0]))
            .unwrap()
            .applied()
            .unwrap();
        let run_cap = |_: &str, _: &str| {
            (
                WaitReason::RunCapReached,
                "waiting for a run slot: all 1 in use".to_string(),
            )
        };
        assert_eq!(store.tell_waiting(0, run_cap).unwrap(), 29);
        let all = store.all().unwrap();
        for r in all
            .iter()
            .filter(|r| r.schedule_state == ScheduleState::Waiting)
        {
            assert_eq!(r.wait_reason, Some(WaitReason::RunCapReached));
            assert_eq!(r.message, "waiting for a run slot: all 1 in use");
            assert_eq!(r.unsynced_since_seq, super::super::jobs::REASON_ONLY);
            assert!(r.status_version > r.synced_version);
        }
        // Unchanged: nothing written, however many wait.
        assert_eq!(store.tell_waiting(0, run_cap).unwrap(), 0);
        // The slot holder's status goes first; the reasons after it.
        let order = store.unsynced_brief(100).unwrap();
        assert_eq!(order.len(), 30);
        assert_eq!(order[0].id, admitted.id);
        // A new job is told; one namespace's reason changes alone.
        let late = submit(&mut store, 99, "b", &spec("q", 0), 2000, "");
        let refuse_b = |_: &str, ns: &str| {
            if ns == "b" {
                (
                    WaitReason::NamespaceNotAdmitted,
                    format!("queue q does not admit namespace {ns}"),
                )
            } else {
                run_cap("", "")
            }
        };
        assert_eq!(store.tell_waiting(0, refuse_b).unwrap(), 6);
        assert_eq!(
            store.get(late.id).unwrap().wait_reason,
            Some(WaitReason::NamespaceNotAdmitted)
        );
        // A job in a back-off keeps its own message until the back-off ends.
        store
            .conn
            .execute(
                "UPDATE jobs SET backoff_until_ms = 5000, message = 'retrying', reason_key = 0 WHERE id = ?1",
                [rows[1].id],
            )
            .unwrap();
        assert_eq!(store.tell_waiting(4000, refuse_b).unwrap(), 0);
        assert_eq!(store.get(rows[1].id).unwrap().message, "retrying");
        assert_eq!(store.tell_waiting(5000, refuse_b).unwrap(), 1);
        // A transition of a job told its reason writes its status as any other.
        let row = store.get(rows[2].id).unwrap();
        let moved = store
            .transition(row.id, &crate::lifecycle::admit(&row))
            .unwrap()
            .applied()
            .unwrap();
        assert_eq!(moved.reason_key, 0);
        assert_eq!(moved.unsynced_since_seq, moved.changed_seq);
    }
}
