//! From a store row to the API status: phase, counters, times and the conditions GitOps tools
//! read (docs/design.md#the-api: a job is in progress until it finishes).
//!
//! Conditions:
//! - `Reconciling` True until the job finishes (Pending, Submitted, Starting, Running,
//!   Recovering, Cancelling): a GitOps tool that waits for a job (Flux's `wait: true`, an Argo CD
//!   sync wave) waits for its outcome, as Argo CD does for a batch/v1 Job;
//! - `Ready` True once Succeeded, and once Cancelled while `spec.cancel` still asks for the
//!   cancel (the object is in the state its spec asks for);
//! - `Stalled` True on a terminal failure, and on a Cancelled job whose `spec.cancel` was set
//!   back to false after it finished (the spec asks for a run that will never happen);
//! - `Complete` / `Failed` exactly as batch/v1 Job sets them (`kubectl wait --for=condition=Complete`);
//!   a Cancelled job did not complete: `Failed`, reason Cancelled;
//! - `Admitted` (Kueue's word, `docs/design.md#queues`): False while the job waits for a slot,
//!   its reason saying why (`QueueMissing`, `NamespaceNotAdmitted`, `QueueMaxRunning`,
//!   `QueueMaxLaunching`, `ShareUsed`, `RunCapReached`, `LaunchCapReached`, `Queued`); True
//!   once the scheduler admitted it; False with the phase as reason for a job that ended
//!   without ever being admitted (cancelled while queued, refused at submission).
//!
//! Every condition carries the job's message (for a failure: the exit code or reason and the
//! budgets spent), which kstatus returns as its message and the Argo CD check shows.
//!
//! kstatus reads Reconciling/Stalled first: every live phase is InProgress, Succeeded (and a
//! Cancelled job that asks for it) Current, Failed* (and a reverted cancel) Failed. No terminal
//! phase reads as in progress. Before the operator's first write the object reads with the
//! schema's default status (`observedGeneration: 0`, [`crate::api::status_default`]): InProgress.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::{Value, json};

use crate::api::{JobPhase, ManagedJobStatus, ScheduleState};
use crate::lifecycle::{JobRow, tasks};

fn time(ms: i64) -> Time {
    Time(jiff::Timestamp::from_millisecond(ms).unwrap_or(jiff::Timestamp::UNIX_EPOCH))
}

fn condition(
    type_: &str,
    on: bool,
    reason: &str,
    message: &str,
    at_ms: i64,
    generation: i64,
) -> Condition {
    Condition {
        type_: type_.into(),
        status: if on { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: time(at_ms),
        observed_generation: Some(generation),
    }
}

/// The conditions for a row, in a fixed order.
pub fn conditions(row: &JobRow) -> Vec<Condition> {
    let p = row.phase;
    let at = row.phase_changed_at_ms;
    let g = row.generation;
    let reason = row.phase.as_str();
    // A Cancelled object stays only if its spec asked for the cancel (a deleted one goes):
    // `spec.cancel` back to false means git (or a user) asks again for a run that cannot be.
    let cancelled = p == JobPhase::Cancelled;
    let cancel_reverted = cancelled && !row.spec.cancel && !row.deleting;
    let reconciling = !p.is_terminal();
    let ready = p == JobPhase::Succeeded || (cancelled && !cancel_reverted);
    let stalled = p.is_failure() || cancel_reverted;
    let message = if cancel_reverted {
        format!(
            "{}; spec.cancel was set back to false after the job had finished, which does not run it again: \
             create the job under a new name to run it",
            row.message
        )
    } else {
        row.message.clone()
    };
    let msg = message.as_str();
    let mut out = vec![
        condition("Reconciling", reconciling, reason, msg, at, g),
        condition("Ready", ready, reason, msg, at, g),
        condition("Stalled", stalled, reason, msg, at, g),
    ];
    // batch/v1 Job sets Complete / Failed only once the job ended, each True.
    if p == JobPhase::Succeeded {
        out.push(condition("Complete", true, "Succeeded", msg, at, g));
    }
    if p.is_failure() || cancelled {
        let why = row.failure_reason.as_ref().map_or(reason, |f| f.as_str());
        out.push(condition("Failed", true, why, msg, at, g));
    }
    let (admitted, why) = match row.schedule_state {
        ScheduleState::Inactive | ScheduleState::Waiting => {
            (false, row.wait_reason.map_or("Queued", |r| r.as_str()))
        }
        ScheduleState::Done if row.controller_starts == 0 && row.attempt == 0 => (false, reason),
        _ => (true, "Admitted"),
    };
    out.push(condition("Admitted", admitted, why, msg, at, g));
    out
}

/// The status a row stands for.
pub fn status(row: &JobRow) -> ManagedJobStatus {
    let totals = tasks::totals(row);
    ManagedJobStatus {
        job_id: Some(row.id),
        phase: Some(row.phase),
        schedule_state: Some(row.schedule_state),
        message: Some(row.message.clone()),
        queue: Some(row.queue.clone()),
        queue_position: row.queue_position,
        submitted_at: Some(time(row.submitted_at_ms)),
        started_at: row.started_at_ms.map(time),
        finished_at: row.finished_at_ms.map(time),
        attempt: row.attempt,
        recovery_count: totals.1,
        restart_count: totals.0,
        ignored_count: tasks::ignored_total(row),
        attempts: row.attempts.clone(),
        exit_code: row.exit_code,
        failure_reason: row.failure_reason.as_ref().map(|f| f.to_string()),
        workload: row.workload.as_ref().map(|w| w.to_string()),
        ready_nodes: row.ready_nodes.clone(),
        observed_generation: Some(row.generation),
        conditions: conditions(row),
        current_task: row.spec.is_pipeline().then_some(row.task_index),
        task_progress: tasks::progress(row),
        tasks: row.tasks.clone(),
    }
}

/// A JSON merge patch that replaces the whole status (absent fields become null, so a value of an
/// earlier attempt never lingers) and fails unless the object still has the row's uid.
pub fn merge_patch(row: &JobRow) -> Value {
    let mut status = serde_json::to_value(status(row)).expect("a status serializes");
    let obj = status.as_object_mut().expect("status is an object");
    for field in [
        "queuePosition",
        "startedAt",
        "finishedAt",
        "exitCode",
        "failureReason",
        "workload",
        "ignoredCount",
        "attempts",
    ] {
        obj.entry(field).or_insert(Value::Null);
    }
    json!({ "metadata": { "uid": row.uid }, "status": status })
}
