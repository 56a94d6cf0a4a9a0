//! From a store row to the API status: phase, counters, times and the conditions GitOps tools
//! read (docs/design.md#the-api: a job is in progress until it finishes).
//!
//! Conditions:
//! - `Reconciling` True until the job finishes (Pending, Submitted, Starting, Running,
//!   Recovering, Cancelling): a GitOps tool that waits for a job (Flux's `wait: true`, an Argo CD
//!   sync wave) waits for its outcome, as Argo CD does for a batch/v1 Job;
//! - `Ready` True once Succeeded, once Cancelled while `spec.cancel` still asks for the
//!   cancel, and while Suspended as `spec.suspend` asks (the object is in the state its spec
//!   asks for);
//! - `Stalled` True on a terminal failure, and on a Cancelled job whose `spec.cancel` was set
//!   back to false after it finished (the spec asks for a run that will never happen);
//! - `Complete` / `Failed` exactly as batch/v1 Job sets them (`kubectl wait --for=condition=Complete`);
//!   a Cancelled job did not complete: `Failed`, reason Cancelled;
//! - `Suspended` True while `spec.suspend` holds the job (phase Suspended): who set it (the
//!   field manager) and since when; the job is then not Reconciling (its spec's state reached);
//! - `Preempted` once a queue took its run slot: True until it runs again, naming the queue;
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

use crate::api::{JobPhase, ManagedJobStatus, QueueEntry, ScheduleState};
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
    // A suspended job is as its spec asks (held): not in progress, so a GitOps tool that waits
    // for its objects is not held by it (kstatus: Current).
    let suspended = p == JobPhase::Suspended;
    let reconciling = !p.is_terminal() && !suspended;
    let ready = p == JobPhase::Succeeded || (cancelled && !cancel_reverted) || suspended;
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
    if suspended {
        let since = jiff::Timestamp::from_millisecond(at)
            .map(|t| t.to_string())
            .unwrap_or_default();
        let who = row
            .suspended_by
            .as_deref()
            .unwrap_or("an unknown field manager");
        let said = format!("suspended by {who} (spec.suspend) since {since}: {msg}");
        out.push(condition("Suspended", true, "Suspended", &said, at, g));
    }
    if row.preemptions > 0
        && let (Some(by), Some(when)) = (&row.preempted_by, row.preempted_at_ms)
    {
        // True from the preemption until the job runs again.
        let waiting = !p.is_terminal() && row.running_since_ms.is_none() || row.preempt_requested;
        let times = match row.preemptions {
            1 => "once".to_string(),
            n => format!("{n} times"),
        };
        let (reason, said) = if by == &row.queue {
            (
                "WithinQueue",
                format!(
                    "preempted {times}; latest: a higher-priority job of its queue {by} took its run slot"
                ),
            )
        } else if let Some(pool) = &row.pool {
            (
                "ReclaimedByQueue",
                format!("preempted {times}; latest: queue {by} took its place on pool {pool}"),
            )
        } else {
            (
                "ReclaimedByQueue",
                format!("preempted {times}; latest: queue {by} took its run slot"),
            )
        };
        out.push(condition("Preempted", waiting, reason, &said, when, g));
    }
    let (admitted, why) = match row.schedule_state {
        ScheduleState::Inactive if suspended => (false, "Suspended"),
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
    // Only the attempts that started, and the budgets they spent (lifecycle::tasks::shown).
    let shown = tasks::shown(row);
    ManagedJobStatus {
        job_id: Some(row.id),
        phase: Some(row.phase),
        schedule_state: Some(row.schedule_state),
        message: Some(row.message.clone()),
        queue: Some(row.queue.clone()),
        queue_position: None,
        queue_entry: Some(queue_entry(row)),
        submitted_at: Some(time(row.submitted_at_ms)),
        started_at: row.started_at_ms.map(time),
        finished_at: row.finished_at_ms.map(time),
        attempt: shown.attempt,
        recovery_count: shown.recoveries,
        restart_count: shown.restarts,
        ignored_count: shown.ignored,
        attempts: row.attempts.clone(),
        exit_code: row.exit_code,
        failure_reason: row.failure_reason.as_ref().map(|f| f.to_string()),
        workload: row.workload.as_ref().map(|w| w.to_string()),
        ready_nodes: row.ready_nodes.clone(),
        pool: row.pool.clone(),
        observed_generation: Some(row.generation),
        conditions: conditions(row),
        current_task: row.spec.is_pipeline().then_some(row.task_index),
        task_progress: tasks::progress(row),
        tasks: shown.tasks,
        owner: None,
        owner_epoch: None,
    }
}

/// Where `row` stands in its queue ([`crate::lifecycle::entry`]), as its status keeps it.
pub fn queue_entry(row: &JobRow) -> QueueEntry {
    let version = crate::lifecycle::entry::version_of_key(&row.entry_version);
    QueueEntry {
        entered_at: Some(time(row.queued_at_ms)),
        resource_version: (!version.is_empty()).then(|| version.to_string()),
    }
}

/// Who writes a status: the holder identity of the claim on the job's namespace and its epoch
/// (`lifecycle::claim`), written as `status.owner` and `status.ownerEpoch`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// The claim's holder identity.
    pub identity: String,
    /// The claim's epoch (its Lease's `leaseTransitions`).
    pub epoch: i64,
}

/// A JSON merge patch that replaces the whole status (absent fields become null, so a value of an
/// earlier attempt never lingers) and fails unless the object still has the row's uid. `owner`
/// (None: claims are not in force) is written with it: the API refuses it when the job's
/// status was written under a later claim ([`crate::api`]'s owner rule).
pub fn merge_patch(row: &JobRow, owner: Option<&Owner>) -> Value {
    let mut status = status(row);
    if let Some(owner) = owner {
        status.owner = Some(owner.identity.clone());
        status.owner_epoch = Some(owner.epoch);
    }
    let mut status = serde_json::to_value(status).expect("a status serializes");
    null_absent(&mut status);
    json!({ "metadata": { "uid": row.uid }, "status": status })
}

/// Every field of the API's status (`status.*`, camelCase), from its schema: the one list of
/// what a patch must set or null, so that a field added to [`ManagedJobStatus`] can never
/// linger from an earlier attempt (issue 43: `readyNodes` was missing from a hand-kept list,
/// and a suspended gang kept showing `4/4` with no Pod).
fn status_fields() -> &'static [String] {
    static FIELDS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    FIELDS.get_or_init(|| {
        let schema = schemars::schema_for!(ManagedJobStatus);
        schema
            .as_object()
            .and_then(|o| o.get("properties"))
            .and_then(Value::as_object)
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default()
    })
}

/// The fields a status patch leaves as they are when it does not set them: who owns the job
/// is written only while claims are in force (a patch without an owner leaves the last one).
const KEPT_WHEN_ABSENT: [&str; 2] = ["owner", "ownerEpoch"];

/// Sets every field of the status schema that `status` lacks to null (a JSON merge patch then
/// removes it), except [`KEPT_WHEN_ABSENT`].
fn null_absent(status: &mut Value) {
    let obj = status.as_object_mut().expect("status is an object");
    for field in status_fields() {
        if !KEPT_WHEN_ABSENT.contains(&field.as_str()) {
            obj.entry(field.clone()).or_insert(Value::Null);
        }
    }
}

/// How much of its status an object has room for ([`fit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    /// The whole status ([`merge_patch`]).
    Full,
    /// Only what a user and a GitOps tool need to know where the job stands
    /// ([`minimal_patch`]): its phase and schedule state, counters, times, exit code, failure
    /// reason, the conditions (messages cut short), the message cut short.
    Minimal,
    /// Nothing: the object alone leaves no room for any status (and barely for its deletion).
    None,
}

/// Room an object keeps free beside its full status (bytes): its managedFields grow with the
/// status written, and a deletion writes `deletionTimestamp`.
pub const STATUS_RESERVE_BYTES: usize = 8_192;

/// Room an object keeps free beside its minimal status (bytes): what a deletion writes
/// (`deletionTimestamp`, `deletionGracePeriodSeconds`, the deleting manager's entry).
pub const DELETION_RESERVE_BYTES: usize = 1_024;

/// Which status an object of `object_bytes` (its stored JSON without status, managedFields
/// included) has room for within etcd's [`crate::api::ETCD_OBJECT_BYTES`]: the full one
/// (`full_bytes`) while it leaves [`STATUS_RESERVE_BYTES`], else the minimal one
/// (`minimal_bytes`) while it leaves [`DELETION_RESERVE_BYTES`] (a deletion must always fit),
/// else none (issue 30: a status too large for its object made the object undeletable).
pub fn fit(object_bytes: usize, full_bytes: usize, minimal_bytes: usize) -> Fit {
    let limit = crate::api::ETCD_OBJECT_BYTES;
    if object_bytes + full_bytes + STATUS_RESERVE_BYTES <= limit {
        Fit::Full
    } else if object_bytes + minimal_bytes + DELETION_RESERVE_BYTES <= limit {
        Fit::Minimal
    } else {
        Fit::None
    }
}

/// The longest message the minimal status keeps ([`minimal_patch`]).
pub const MINIMAL_MESSAGE_BYTES: usize = 256;

/// The minimal status of `row` as a merge patch, for an object with no room for its full one
/// ([`fit`]): phase, schedule state, job id, observed generation, attempt and counters, times,
/// exit code, failure reason, queue, the owner, and the conditions and message cut to
/// [`MINIMAL_MESSAGE_BYTES`]; every other field of the status is removed (null).
pub fn minimal_patch(row: &JobRow, owner: Option<&Owner>) -> Value {
    let cut = |m: &str| -> String {
        if m.len() <= MINIMAL_MESSAGE_BYTES {
            return m.to_string();
        }
        let mut end = MINIMAL_MESSAGE_BYTES - '…'.len_utf8();
        while !m.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &m[..end])
    };
    let full = status(row);
    let conditions: Vec<Condition> = full
        .conditions
        .into_iter()
        .map(|c| Condition {
            message: cut(&c.message),
            ..c
        })
        .collect();
    let minimal = ManagedJobStatus {
        job_id: full.job_id,
        phase: full.phase,
        schedule_state: full.schedule_state,
        message: full.message.as_deref().map(cut),
        queue: full.queue,
        queue_entry: full.queue_entry,
        submitted_at: full.submitted_at,
        started_at: full.started_at,
        finished_at: full.finished_at,
        attempt: full.attempt,
        recovery_count: full.recovery_count,
        restart_count: full.restart_count,
        ignored_count: full.ignored_count,
        exit_code: full.exit_code,
        failure_reason: full.failure_reason,
        observed_generation: full.observed_generation,
        conditions,
        current_task: full.current_task,
        task_progress: full.task_progress,
        owner: owner.map(|o| o.identity.clone()),
        owner_epoch: owner.map(|o| o.epoch),
        ..Default::default()
    };
    let mut status = serde_json::to_value(minimal).expect("a status serializes");
    null_absent(&mut status);
    json!({ "metadata": { "uid": row.uid }, "status": status })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        AttemptStatus, MAX_STATUS_BYTES, MAX_STATUS_MESSAGE_BYTES, MAX_TASKS, ManagedJobSpec,
        TaskSpec, TaskStatus,
    };
    use crate::lifecycle::Object;

    /// A status shows where its job stands in its queue (what a rebuilt store keeps, and what
    /// orders jobs created in one second) and no position (it would be stale at once).
    #[test]
    fn a_status_keeps_the_queue_entry_and_no_position() {
        let spec = ManagedJobSpec {
            run: Some("true".into()),
            ..Default::default()
        };
        let object = Object {
            uid: "u",
            namespace: "ns",
            name: "j",
            generation: 1,
            spec: &spec,
            created_at_ms: 7_000,
            resource_version: "123",
        };
        let row = JobRow {
            queue_position: Some(3),
            ..JobRow::new(&object, 8_000)
        };
        let s = status(&row);
        assert_eq!(s.queue_position, None);
        let entry = s.queue_entry.unwrap();
        assert_eq!(entry.resource_version.as_deref(), Some("123"));
        assert_eq!(entry.entered_at.map(|t| t.0.as_millisecond()), Some(7_000));
        let patch = merge_patch(&row, None);
        assert!(patch["status"]["queuePosition"].is_null());
        assert_eq!(patch["status"]["queueEntry"]["resourceVersion"], "123");
        let minimal = minimal_patch(&row, None);
        assert_eq!(minimal["status"]["queueEntry"]["resourceVersion"], "123");
    }

    /// The largest status the operator writes: a pipeline of 32 tasks with 63-character names,
    /// every message (the job's, each condition's, each task record's) at its longest, 10
    /// attempts with the longest rule names. It stays within `MAX_STATUS_BYTES`, the share of
    /// etcd's limit the API's bound on a spec leaves it (issue 30).
    #[test]
    fn the_largest_status_stays_within_its_share_of_the_object() {
        let name = |i: usize| format!("{i:02}{}", "t".repeat(61));
        let spec = ManagedJobSpec {
            tasks: (0..MAX_TASKS)
                .map(|i| TaskSpec {
                    name: name(i),
                    run: Some("true".into()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let object = Object {
            uid: "0123456789abcdef0123456789abcdef0123",
            namespace: &"n".repeat(63),
            name: &"j".repeat(253),
            generation: 1,
            spec: &spec,
            created_at_ms: 0,
            resource_version: "",
        };
        let mut row = JobRow::new(&object, 0);
        let long = "€".repeat(MAX_STATUS_MESSAGE_BYTES);
        row.message = crate::lifecycle::tasks::capped(&long);
        assert!(row.message.len() <= MAX_STATUS_MESSAGE_BYTES);
        row.phase = JobPhase::Failed;
        row.schedule_state = ScheduleState::Done;
        row.workload = Some(crate::lifecycle::Workload::Pod("p".repeat(63)));
        row.exit_code = Some(255);
        row.started_at_ms = Some(1);
        row.finished_at_ms = Some(2);
        row.attempt = 9999;
        row.launched_attempt = 9999;
        row.tasks = (0..MAX_TASKS)
            .map(|i| TaskStatus {
                name: name(i),
                phase: crate::api::TaskPhase::Failed,
                attempt: 9999,
                restart_count: 9999,
                recovery_count: 9999,
                ignored_count: 1000,
                exit_code: Some(255),
                failure_reason: Some("x".repeat(64)),
                started_at: Some(crate::lifecycle::clock::time_in_seconds(1)),
                finished_at: Some(crate::lifecycle::clock::time_in_seconds(2)),
                message: Some(row.message.clone()),
            })
            .collect();
        row.attempts = (0..10)
            .map(|i| AttemptStatus {
                attempt: 9990 + i,
                rank: Some(63),
                task: Some(name(0)),
                exit_code: Some(255),
                reason: "x".repeat(64),
                rule: "r".repeat(63),
                action: "Restart".into(),
                finished_at: Some(crate::lifecycle::clock::time_in_seconds(2)),
            })
            .collect();
        let owner = Owner {
            identity: "o".repeat(crate::api::schema::MAX_OWNER_BYTES),
            epoch: i64::MAX,
        };
        let full = serde_json::to_vec(&merge_patch(&row, Some(&owner)))
            .unwrap()
            .len();
        println!(
            "the largest status: {full} bytes (of {MAX_STATUS_BYTES}); its minimal form: {} bytes",
            serde_json::to_vec(&minimal_patch(&row, Some(&owner)))
                .unwrap()
                .len()
        );
        assert!(full <= MAX_STATUS_BYTES, "{full} bytes");
        let minimal = serde_json::to_vec(&minimal_patch(&row, Some(&owner)))
            .unwrap()
            .len();
        assert!(minimal < 8_192, "{minimal} bytes");
    }

    /// An object with room for its full status gets it; one too close to etcd's limit its
    /// minimal one while a deletion still fits; one at the limit none.
    #[test]
    fn a_status_is_written_as_its_object_has_room() {
        let limit = crate::api::ETCD_OBJECT_BYTES;
        assert_eq!(fit(100_000, 3_000, 600), Fit::Full);
        assert_eq!(
            fit(limit - 3_000 - STATUS_RESERVE_BYTES, 3_000, 600),
            Fit::Full
        );
        assert_eq!(fit(limit - 5_000, 3_000, 600), Fit::Minimal);
        assert_eq!(
            fit(limit - 600 - DELETION_RESERVE_BYTES, 3_000, 600),
            Fit::Minimal
        );
        assert_eq!(fit(limit - 1_000, 3_000, 600), Fit::None);
    }

    /// Both patches name every field of the status schema (set, or null to remove it), except
    /// the owner pair; a gang stopped by a suspend no longer shows the members it had running.
    #[test]
    fn every_field_a_row_does_not_set_is_nulled() {
        let spec = ManagedJobSpec {
            nodes: Some(4),
            ..Default::default()
        };
        let object = Object {
            uid: "u",
            namespace: "n",
            name: "gang",
            generation: 1,
            spec: &spec,
            created_at_ms: 0,
            resource_version: "",
        };
        let mut row = JobRow::new(&object, 0);
        row.ready_nodes = None;
        assert!(status_fields().len() > 20, "{:?}", status_fields());
        assert!(status_fields().iter().any(|f| f == "readyNodes"));
        for patch in [merge_patch(&row, None), minimal_patch(&row, None)] {
            let status = patch["status"].as_object().unwrap();
            for field in status_fields() {
                assert_eq!(
                    status.contains_key(field),
                    !KEPT_WHEN_ABSENT.contains(&field.as_str()),
                    "{field} in {status:?}"
                );
            }
            assert_eq!(status["readyNodes"], Value::Null);
        }
    }
}
