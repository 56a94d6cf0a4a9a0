//! What the scheduling pass read of each queue, kept until the queue changes (issue 44: a pass
//! with nothing changed re-read 3,300 candidates and 3,900 jobs holding quota every time, at
//! 10,000 waiting on 1,000 nodes).
//!
//! The store counts the changes of each queue (`queue_changes`, schema step 16): a trigger adds
//! one on every insert and delete of a job and on every update that changes one of the columns
//! in [`ADMISSION_READS`], whichever process writes (the operator or a job controller). A read
//! is kept with the count it was made at, the count read first (a write between the two makes
//! the kept read look older than it is: read again next time, never newer), and is answered
//! again only while the count is the same. What else a read depends on is part of its key:
//! the namespaces a candidate read admits, how many it asked for, the time (a back-off that
//! ends: [`Candidates::until_ms`]); a queue with a job seen arriving is never kept.
//!
//! The pass's own writes of a waiting job's reason ([`super::Store::tell_jobs`]) count too; the
//! store applies them to what it kept, in the same transaction (no other writer between), so
//! that telling a job why it waits does not make the next pass read its queue again.

use std::collections::HashMap;
use std::sync::Arc;

use crate::api::ScheduleState;
use crate::resources::{Demand, Placement};

/// Every column of `jobs` a kept read depends on (selected, filtered or ordered by): a change
/// of any of them counts a change of the job's queue (the trigger of schema step 16). A unit
/// test checks that every column the kept queries name is here and that the trigger watches
/// exactly these.
pub const ADMISSION_READS: &[&str] = &[
    "id",
    "uid",
    "queue",
    "namespace",
    "priority",
    "queued_at_ms",
    "entry_version",
    "reason_key",
    "schedule_state",
    "cancel_requested",
    "backoff_until_ms",
    "demands",
    "task_index",
    "pool",
    "placement",
    "attempt",
    "phase",
    "spec",
    "running_since_ms",
    "preempt_requested",
    "preempted_by",
];

/// The reads kept, by queue.
#[derive(Debug, Default)]
pub struct Memo {
    queues: HashMap<String, Kept>,
    /// What telling each queue's waiting jobs found last ([`super::Store::tell_waiting_except`]).
    pub told: HashMap<String, Told>,
}

/// What telling a queue's waiting jobs found, after its writes: every group of the queue
/// (namespace and digest of what it was told) was told it, but for jobs told their own reason
/// (`skip`), jobs being cancelled or in a back-off, and jobs not Pending. Another call finds
/// the same, and need not scan the queue, while the queue's count of changes is `changes`, its
/// jobs told their own reason are `skip`, no back-off ended (`until_ms`) and every group is
/// to be told what it was.
#[derive(Clone, Debug)]
pub struct Told {
    /// The queue's count of changes after the writes.
    pub changes: i64,
    /// Its jobs told their own reason, by id.
    pub skip: Vec<i64>,
    /// Each namespace's group of the queue and the digest of what it was told.
    pub said: Vec<(String, i64)>,
    /// When the first back-off of its Waiting jobs ends (ms since epoch; `i64::MAX`: none).
    pub until_ms: i64,
    /// When it was found (ms since epoch).
    pub at_ms: i64,
}

impl Told {
    /// Whether a call at `now_ms` that finds the queue at count `changes` with `skip` told their
    /// own reason finds what this one did (the digests checked apart).
    pub fn holds(&self, changes: i64, skip: &[i64], now_ms: i64) -> bool {
        self.changes == changes
            && self.skip == skip
            && (self.at_ms..self.until_ms).contains(&now_ms)
    }
}

/// What is kept of one queue, all read at one count of its changes.
#[derive(Debug)]
pub struct Kept {
    /// The queue's count of changes ([`Memo`]) the reads below were made at.
    pub changes: i64,
    /// Its last candidate read ([`super::Store::queue_candidates`]).
    pub candidates: Option<Candidates<Queued>>,
    /// Its jobs holding quota ([`super::Store::pooled_jobs`]).
    pub pooled: Option<Vec<Arc<Pooled>>>,
}

impl Kept {
    fn at(changes: i64) -> Self {
        Kept {
            changes,
            candidates: None,
            pooled: None,
        }
    }
}

/// A kept candidate read.
#[derive(Debug)]
pub struct Candidates<C> {
    /// The namespaces it admitted (as bound to the query; None: any).
    pub allowed: Option<String>,
    /// How many it asked for.
    pub limit: usize,
    /// What it found, in admission order.
    pub rows: Vec<C>,
    /// When it was read (ms since epoch; the back-offs it saw ended by then).
    pub read_at_ms: i64,
    /// When the first back-off of the queue's Waiting jobs ends after the read (ms since
    /// epoch; `i64::MAX`: none): that job becomes a candidate then, with no write.
    pub until_ms: i64,
}

impl<C: Clone> Candidates<C> {
    /// The answer to a read of at most `limit` candidates admitting `allowed` at `now_ms`, when
    /// this read gives it: the same namespaces, not before it was read (a clock set back) nor
    /// after the next back-off ends, and either no more than it asked for or all there were.
    pub fn answer(&self, allowed: Option<&str>, limit: usize, now_ms: i64) -> Option<Vec<C>> {
        let complete = self.rows.len() < self.limit;
        (self.allowed.as_deref() == allowed
            && (self.read_at_ms..self.until_ms).contains(&now_ms)
            && (limit <= self.limit || complete))
            .then(|| self.rows[..limit.min(self.rows.len())].to_vec())
    }
}

impl Memo {
    /// What is kept of `queue` if it was read at `changes`; forgets older reads.
    pub fn at(&mut self, queue: &str, changes: i64) -> &mut Kept {
        if !self.queues.contains_key(queue) {
            self.queues.insert(queue.to_string(), Kept::at(changes));
        }
        let kept = self.queues.get_mut(queue).expect("inserted above");
        if kept.changes != changes {
            *kept = Kept::at(changes);
        }
        kept
    }

    /// The pass's own writes of reasons, made in one transaction that moved the counts of
    /// changes from `before` to `after` (by queue; absent: 0): for each queue whose kept reads
    /// were made at `before`, the written digests (`told`: job id to digest) are applied to its
    /// kept candidates and the reads are moved to `after`. A queue another writer changed too
    /// cannot be told apart: its reads stay at their count and are made again.
    pub fn told(
        &mut self,
        before: &HashMap<String, i64>,
        after: &HashMap<String, i64>,
        told: &HashMap<i64, i64>,
    ) {
        for (queue, kept) in &mut self.queues {
            let was = before.get(queue).copied().unwrap_or(0);
            let now = after.get(queue).copied().unwrap_or(0);
            if kept.changes != was || was == now {
                continue;
            }
            if let Some(c) = &mut kept.candidates {
                for row in &mut c.rows {
                    if let Some(digest) = told.get(&row.id) {
                        row.reason_key = *digest;
                    }
                }
            }
            kept.changes = now;
        }
    }
}

/// A queued job, briefly: what a scheduling pass reads of a queue's head.
#[derive(Clone, Debug, PartialEq)]
pub struct Queued {
    /// Store id.
    pub id: i64,
    /// Its queue.
    pub queue: String,
    /// Its namespace (its queue must admit it).
    pub namespace: String,
    /// Its priority.
    pub priority: i32,
    /// The digest of the reason a pass last told it ([`crate::lifecycle::said_key`]; 0: its
    /// message was set otherwise).
    pub reason_key: i64,
    /// When it entered its queue (ms since epoch; [`crate::lifecycle::entry`]).
    pub queued_at_ms: i64,
    /// The version that orders it inside its second ([`crate::lifecycle::entry::version_key`]).
    pub entry_version: String,
    /// What its next attempt needs (its current task's demand); None: slots only.
    pub demand: Option<Arc<Demand>>,
    /// The pool its quota is held on (a relaunch's); None for a new job.
    pub pool: Option<String>,
}

impl Queued {
    /// Its place in its queue.
    pub fn entry(&self) -> crate::lifecycle::entry::Entry<'_> {
        crate::lifecycle::entry::Entry {
            priority: self.priority,
            queued_at_ms: self.queued_at_ms,
            version: &self.entry_version,
            id: self.id,
        }
    }
}

/// A job holding quota on a pool (a run slot and its demand there).
#[derive(Clone, Debug, PartialEq)]
pub struct Pooled {
    /// Store id.
    pub id: i64,
    /// The ManagedJob's uid (its Pods' owner).
    pub uid: String,
    /// Its queue.
    pub queue: String,
    /// Its current attempt (its Pods' attempt label).
    pub attempt: i32,
    /// Its priority.
    pub priority: i32,
    /// Its schedule state.
    pub schedule_state: ScheduleState,
    /// The pool.
    pub pool: String,
    /// What the pool adds to its Pods.
    pub placement: Option<Arc<Placement>>,
    /// What its current task's attempt needs.
    pub demand: Arc<Demand>,
    /// When its current attempt began to run (only a running job, not being stopped).
    pub running_since_ms: Option<i64>,
    /// The queue it is stopping for, when a preemption is under way.
    pub leaving_for: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kept read answers fewer rows than it read, more only when it read them all, the same
    /// namespaces only, and only before the next back-off ends.
    #[test]
    fn a_kept_read_answers_only_what_it_read() {
        let kept = Candidates {
            allowed: None,
            limit: 3,
            rows: vec![1, 2, 3],
            read_at_ms: 10,
            until_ms: 100,
        };
        assert_eq!(kept.answer(None, 2, 10).unwrap().len(), 2);
        assert_eq!(kept.answer(None, 3, 99).unwrap().len(), 3);
        assert_eq!(kept.answer(None, 4, 10), None, "it may have stopped at 3");
        assert_eq!(kept.answer(Some("[\"n\"]"), 2, 10), None);
        assert_eq!(kept.answer(None, 2, 100), None, "a back-off ended");
        assert_eq!(kept.answer(None, 2, 9), None, "the clock was set back");
        let all = Candidates { limit: 10, ..kept };
        assert_eq!(
            all.answer(None, 50, 10).unwrap().len(),
            3,
            "it read them all"
        );
    }
}
