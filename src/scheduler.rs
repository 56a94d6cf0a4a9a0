//! Admission: which queued jobs get a launch slot now (docs/design.md#scheduling).
//!
//! [`plan`] is a pure function over counts and queue heads; [`pass`] reads those from the store,
//! plans, and applies each admission as a compare-and-set. Rules, after SkyPilot's
//! `maybe_schedule_next_jobs` with its known faults fixed:
//! - AliveWaiting jobs (recoveries and restarts) are admitted before new jobs and need only a
//!   launch slot: a recovery is never blocked behind a new job that lacks a run slot.
//! - New (Waiting) jobs need a launch slot and a run slot.
//! - Within each group: higher priority first, then earlier creation (`metadata.creationTimestamp`,
//!   one-second resolution), then lower job id: FIFO within a priority.

use crate::api::ScheduleState;
use crate::capacity::{Caps, SlotUsage};
use crate::lifecycle::{self, JobRow};
use crate::store::{Cas, Store, StoreError};

/// A queued job as the planner sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Store id.
    pub id: i64,
    /// Priority (-1000..1000).
    pub priority: i32,
}

/// One admission decided by [`plan`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admission {
    /// Store id.
    pub id: i64,
    /// The state it leaves for Launching: Waiting (new job) or AliveWaiting (relaunch).
    pub from: ScheduleState,
}

/// Decides admissions. `relaunches` and `new_jobs` must each be in admission order (priority
/// descending, id ascending), as [`Store::queue_head`] returns them.
pub fn plan(
    usage: SlotUsage,
    caps: Caps,
    relaunches: &[Candidate],
    new_jobs: &[Candidate],
) -> Vec<Admission> {
    let mut launching = usage.launching;
    let mut alive = usage.alive;
    let mut out = Vec::new();
    for c in relaunches {
        if launching >= caps.launch {
            return out;
        }
        launching += 1;
        out.push(Admission {
            id: c.id,
            from: ScheduleState::AliveWaiting,
        });
    }
    for c in new_jobs {
        if launching >= caps.launch || alive >= caps.run {
            break;
        }
        launching += 1;
        alive += 1;
        out.push(Admission {
            id: c.id,
            from: ScheduleState::Waiting,
        });
    }
    out
}

/// What one pass did.
#[derive(Debug, Default)]
pub struct PassResult {
    /// New jobs moved Waiting -> Launching: the caller must start their job controller process.
    pub started: Vec<JobRow>,
    /// Relaunches moved AliveWaiting -> Launching: the caller must wake their process.
    pub relaunched: Vec<JobRow>,
    /// Slot usage after the pass.
    pub usage: SlotUsage,
    /// Queued jobs whose message changed to say what they wait for.
    pub messages: usize,
}

/// Queued jobs at the head of the queue whose message a pass keeps saying what they wait for
/// ([`lifecycle::queued_message`]); the others keep the one they were queued with.
pub const QUEUE_MESSAGES: usize = 8;

/// One scheduling pass over the store: plans and applies admissions as compare-and-sets, then
/// tells the head of the queue which slot it really waits for. Cost: three indexed queries
/// bounded by the free slots and [`QUEUE_MESSAGES`], independent of finished jobs.
pub fn pass(store: &mut Store, caps: Caps) -> Result<PassResult, StoreError> {
    let now = lifecycle::now_ms();
    let mut result = admit(store, caps, now)?;
    if result.usage.waiting > 0 {
        let usage = result.usage;
        let node_waits = if usage.alive >= caps.run {
            store.node_waits()?
        } else {
            0
        };
        let message = lifecycle::queued_message(
            usage.launching,
            caps.launch,
            usage.alive,
            caps.run,
            node_waits,
        );
        for row in store.queue_head(ScheduleState::Waiting, QUEUE_MESSAGES, now)? {
            if row.message != message {
                store.transition(row.id, &lifecycle::queued(&row, message.clone()))?;
                result.messages += 1;
            }
        }
    }
    Ok(result)
}

fn admit(store: &mut Store, caps: Caps, now: i64) -> Result<PassResult, StoreError> {
    let usage = store.slot_usage()?;
    let free_launch = caps.launch.saturating_sub(usage.launching);
    if free_launch == 0 {
        return Ok(PassResult {
            usage,
            ..Default::default()
        });
    }
    let relaunches = store.queue_head(ScheduleState::AliveWaiting, free_launch, now)?;
    let free_new = free_launch
        .saturating_sub(relaunches.len())
        .min(caps.run.saturating_sub(usage.alive));
    let new_jobs = if free_new > 0 {
        store.queue_head(ScheduleState::Waiting, free_new, now)?
    } else {
        Vec::new()
    };
    let as_candidates = |rows: &[JobRow]| -> Vec<Candidate> {
        rows.iter()
            .map(|r| Candidate {
                id: r.id,
                priority: r.priority,
            })
            .collect()
    };
    let mut rows: std::collections::HashMap<i64, JobRow> = relaunches
        .iter()
        .chain(&new_jobs)
        .map(|r| (r.id, r.clone()))
        .collect();
    let admissions = plan(
        usage,
        caps,
        &as_candidates(&relaunches),
        &as_candidates(&new_jobs),
    );
    let mut result = PassResult::default();
    for a in admissions {
        // A failed CAS means someone else moved the job (e.g. a cancel): skip it.
        let Some(row) = rows.remove(&a.id) else {
            continue;
        };
        if let Cas::Applied(row) = store.transition(a.id, &lifecycle::admit(&row))? {
            match a.from {
                ScheduleState::Waiting => result.started.push(*row),
                _ => result.relaunched.push(*row),
            }
        }
    }
    result.usage = store.slot_usage()?;
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(id: i64, priority: i32) -> Candidate {
        Candidate { id, priority }
    }

    #[test]
    fn relaunch_is_not_blocked_by_a_new_job_without_run_slot() {
        let usage = SlotUsage {
            launching: 0,
            alive: 3,
            ..Default::default()
        };
        let caps = Caps { launch: 2, run: 3 };
        let out = plan(usage, caps, &[c(9, 0)], &[c(1, 0)]);
        assert_eq!(
            out,
            vec![Admission {
                id: 9,
                from: ScheduleState::AliveWaiting
            }]
        );
    }

    #[test]
    fn new_jobs_need_both_slots() {
        let usage = SlotUsage {
            launching: 1,
            alive: 1,
            ..Default::default()
        };
        let out = plan(usage, Caps { launch: 2, run: 5 }, &[], &[c(1, 0), c(2, 0)]);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].id, 1);
    }
}
