//! The job record ([`JobRow`]): a job as the store holds it, one row of its `jobs` table, and
//! each entry of its history ([`HistoryEntry`]).
//!
//! The record is declared once, by `job_record!`: each field is a column of the same name, with
//! its kind ([`ColumnKind`]) and its value when a job is first seen. From that one declaration
//! come the struct, [`JobRow::COLUMNS`] (what the store's INSERT, UPDATE and SELECT list),
//! [`JobRow::to_values`] and [`JobRow::from_values`] (a record to and from its columns' values,
//! in that order). Adding a field to the record is one line here (and a migration adding its
//! column); the store's statements follow.

use std::fmt;

use crate::api::{
    AttemptStatus, ExecutorKind, JobPhase, ManagedJobSpec, ScheduleState, TaskStatus, WaitReason,
};

use crate::resources::{Demand, Placement};

use super::outcome::Workload;
use super::reason::{Failure, Reason};

/// A column's value as the store keeps it (SQLite's NULL, INTEGER and TEXT).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// No value (`None`).
    Null,
    /// An integer (numbers, counts, times in ms, booleans as 0/1).
    Integer(i64),
    /// Text (names, states, JSON documents).
    Text(String),
}

/// A type a column of the record holds: how it is written as a [`Value`] and read back.
pub trait Field: Sized {
    /// The value to store.
    fn to_value(&self) -> Value;
    /// Reads a stored value. Errors: a sentence saying what could not be read.
    fn from_value(value: Value) -> Result<Self, String>;
}

impl Field for i64 {
    fn to_value(&self) -> Value {
        Value::Integer(*self)
    }
    fn from_value(value: Value) -> Result<Self, String> {
        match value {
            Value::Integer(n) => Ok(n),
            other => Err(format!("{other:?} is not an integer")),
        }
    }
}

impl Field for i32 {
    fn to_value(&self) -> Value {
        Value::Integer(i64::from(*self))
    }
    fn from_value(value: Value) -> Result<Self, String> {
        let n = i64::from_value(value)?;
        i32::try_from(n).map_err(|_| format!("{n} does not fit 32 bits"))
    }
}

impl Field for u64 {
    fn to_value(&self) -> Value {
        Value::Integer(*self as i64)
    }
    fn from_value(value: Value) -> Result<Self, String> {
        Ok(i64::from_value(value)? as u64)
    }
}

impl Field for bool {
    fn to_value(&self) -> Value {
        Value::Integer(i64::from(*self))
    }
    fn from_value(value: Value) -> Result<Self, String> {
        Ok(i64::from_value(value)? != 0)
    }
}

impl Field for String {
    fn to_value(&self) -> Value {
        Value::Text(self.clone())
    }
    fn from_value(value: Value) -> Result<Self, String> {
        match value {
            Value::Text(s) => Ok(s),
            other => Err(format!("{other:?} is not text")),
        }
    }
}

impl<T: Field> Field for Option<T> {
    fn to_value(&self) -> Value {
        match self {
            Some(v) => v.to_value(),
            None => Value::Null,
        }
    }
    fn from_value(value: Value) -> Result<Self, String> {
        match value {
            Value::Null => Ok(None),
            v => T::from_value(v).map(Some),
        }
    }
}

/// A field stored as its name (`as_str`), read back by `parse`.
macro_rules! named_field {
    ($($ty:ty),*) => {$(
        impl Field for $ty {
            fn to_value(&self) -> Value {
                Value::Text(self.as_str().to_string())
            }
            fn from_value(value: Value) -> Result<Self, String> {
                let text = String::from_value(value)?;
                <$ty>::parse(&text).ok_or_else(|| format!("{text:?} is not a {}", stringify!($ty)))
            }
        }
    )*};
}

named_field!(JobPhase, ScheduleState, ExecutorKind, WaitReason);

impl Field for Workload {
    fn to_value(&self) -> Value {
        Value::Text(self.to_string())
    }
    fn from_value(value: Value) -> Result<Self, String> {
        let text = String::from_value(value)?;
        Workload::parse(&text).ok_or_else(|| format!("{text:?} is not a workload"))
    }
}

impl Field for Failure {
    fn to_value(&self) -> Value {
        Value::Text(self.as_str().to_string())
    }
    fn from_value(value: Value) -> Result<Self, String> {
        Ok(Failure::parse(&String::from_value(value)?))
    }
}

/// A field stored as a JSON document.
macro_rules! json_field {
    ($($ty:ty),*) => {$(
        impl Field for $ty {
            fn to_value(&self) -> Value {
                Value::Text(serde_json::to_string(self).expect("a record's document serializes"))
            }
            fn from_value(value: Value) -> Result<Self, String> {
                serde_json::from_str(&String::from_value(value)?).map_err(|e| e.to_string())
            }
        }
    )*};
}

json_field!(
    ManagedJobSpec,
    Vec<TaskStatus>,
    Vec<AttemptStatus>,
    Vec<Demand>,
    Placement
);

/// How the store writes a column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnKind {
    /// The job's id: assigned by the store at insert (when 0), never updated.
    Key,
    /// Set when the job is inserted, never written by a transition (the object's identity and
    /// spec: only the object's mirror updates the spec's `cancel`).
    Fixed,
    /// Changed by transitions: written by every update of the record.
    State,
}

/// One column of the `jobs` table: a field of [`JobRow`] of the same name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column {
    /// The column's (and the field's) name.
    pub name: &'static str,
    /// How it is written.
    pub kind: ColumnKind,
}

/// A column whose stored value could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError {
    /// The column.
    pub column: &'static str,
    /// What was wrong.
    pub what: String,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.column, self.what)
    }
}

/// Declares [`JobRow`]: each line `KIND name: Type = value when first seen`, with its doc.
macro_rules! job_record {
    (
        $(#[$meta:meta])*
        pub struct $record:ident {
            $( $(#[$doc:meta])* $kind:ident $field:ident : $ty:ty = $default:expr ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        pub struct $record {
            $( $(#[$doc])* pub $field: $ty, )*
        }

        impl $record {
            /// Every column, in the order of [`JobRow::to_values`] and [`JobRow::from_values`].
            pub const COLUMNS: &'static [Column] = &[
                $( Column { name: stringify!($field), kind: ColumnKind::$kind }, )*
            ];

            /// Every field at its value when a job is first seen.
            fn first_seen() -> $record {
                $record { $( $field: $default, )* }
            }

            /// The value of each column, in [`JobRow::COLUMNS`]' order.
            pub fn to_values(&self) -> Vec<Value> {
                vec![ $( Field::to_value(&self.$field), )* ]
            }

            /// The record from the value of each column (`value(i)`: the `i`-th of
            /// [`JobRow::COLUMNS`]). Errors: a column whose value cannot be read.
            #[allow(unused_assignments)] // the count after the last column
            pub fn from_values<E>(
                mut value: impl FnMut(usize) -> Result<Value, E>,
                error: impl Fn(DecodeError) -> E,
            ) -> Result<$record, E> {
                let mut i = 0;
                Ok($record {
                    $( $field: {
                        let v = value(i)?;
                        i += 1;
                        Field::from_value(v).map_err(|what| error(DecodeError {
                            column: stringify!($field),
                            what,
                        }))?
                    }, )*
                })
            }
        }
    };
}

job_record! {
    /// A job as the store holds it: both state machines, the current attempt, the counters and
    /// times the status shows, and the operator's bookkeeping.
    #[derive(Clone, Debug, PartialEq)]
    pub struct JobRow {
        /// Store id (`status.jobId`); 0 until the store assigned one.
        Key id: i64 = 0,
        /// The ManagedJob's `metadata.uid`.
        Fixed uid: String = String::new(),
        /// Namespace of the ManagedJob.
        Fixed namespace: String = String::new(),
        /// Name of the ManagedJob.
        Fixed name: String = String::new(),
        /// Latest `metadata.generation` mirrored.
        State generation: i64 = 0,
        /// Executor the spec asks for.
        Fixed executor: ExecutorKind = ExecutorKind::Local,
        /// The spec as submitted; its `cancel` follows the object's (`Store::submit`), no
        /// transition writes it.
        Fixed spec: ManagedJobSpec = ManagedJobSpec::default(),
        /// Current priority (may change while queued).
        State priority: i32 = 0,
        /// User-facing phase.
        State phase: JobPhase = JobPhase::Pending,
        /// Scheduler state.
        State schedule_state: ScheduleState = ScheduleState::Inactive,
        /// Latest human-readable message.
        State message: String = String::new(),
        /// Queue position when queued (1 = next).
        State queue_position: Option<i64> = None,
        /// A cancel was requested (spec.cancel or deletion); persisted so it survives crashes.
        State cancel_requested: bool = false,
        /// The object is being deleted (cleanup, then the row goes away).
        State deleting: bool = false,
        /// Pid of the job controller process, once started.
        State controller_pid: Option<i32> = None,
        /// Start time of that process in clock ticks since boot (/proc/PID/stat field 22).
        State controller_start_time: Option<u64> = None,
        /// How many job controller processes were started for this job.
        State controller_starts: i64 = 0,
        /// How many of them exited before the job was Done.
        State controller_crashes: i64 = 0,
        /// Current attempt number (0 before the first launch).
        State attempt: i32 = 0,
        /// Highest attempt whose workload create was issued (recorded before the create).
        State launched_attempt: i32 = 0,
        /// Relaunches after preemption so far (a pipeline: its current task's).
        State recovery_count: i32 = 0,
        /// Restarts after errors so far (a pipeline: its current task's).
        State restart_count: i32 = 0,
        /// Exit code of the last finished attempt.
        State exit_code: Option<i32> = None,
        /// Why the job failed (`status.failureReason`): the operator's own reason, or what the
        /// workload said.
        State failure_reason: Option<Failure> = None,
        /// The current attempt's workload (`status.workload`).
        State workload: Option<Workload> = None,
        /// A restart back-off ends at this time (ms since epoch); stored so restarts keep it.
        State backoff_until_ms: Option<i64> = None,
        /// When the job was first seen (ms since epoch).
        State submitted_at_ms: i64 = 0,
        /// When the workload first ran (ms since epoch).
        State started_at_ms: Option<i64> = None,
        /// When the job reached a terminal phase (ms since epoch).
        State finished_at_ms: Option<i64> = None,
        /// When the phase last changed (ms since epoch); condition transition times.
        State phase_changed_at_ms: i64 = 0,
        /// Bumped on every change that the API status should show.
        State status_version: i64 = 1,
        /// The `status_version` last written to the API.
        State synced_version: i64 = 0,
        /// When the job entered its queue (ms since epoch): its object's
        /// `metadata.creationTimestamp`, or when it gave its run slot back because no node took
        /// its Pod (the back of its priority). FIFO order within a priority.
        State queued_at_ms: i64 = 0,
        /// Id of the job's last transition (a store-wide sequence; 0 before any).
        State changed_seq: i64 = 0,
        /// Id of the job's first transition since its status was last fully written to the API,
        /// or older: the status writer never lets a job's taking of a slot reach the API before
        /// an earlier release of one (see `operator::status_writer::writable`).
        State unsynced_since_seq: i64 = 0,
        /// When the current attempt's launch clock started (ms since epoch): its launch intent,
        /// or the binding of its Pod after it waited for a node. None while it waits for a node
        /// (or before any launch). The launch deadline counts from here.
        State launched_at_ms: Option<i64> = None,
        /// Launch timeouts in a row (reset when an attempt runs); the
        /// `--max-launch-timeouts`-th ends the job FailedNoResource.
        State launch_timeouts: i32 = 0,
        /// A pipeline's current task: its index in `spec.tasks` (0 for a job of one task).
        State task_index: i32 = 0,
        /// The job's attempt at which the current task began (1 for a job of one task): the
        /// task's attempt number is `attempt - task_first_attempt + 1`.
        State task_first_attempt: i32 = 1,
        /// When the current task's workload first ran (ms since epoch): its own
        /// `activeDeadlineSeconds` counts from here.
        State task_started_at_ms: Option<i64> = None,
        /// A pipeline's task records (`status.tasks[]`, kept by [`super::tasks::follow`]);
        /// empty for a job of one task.
        State tasks: Vec<TaskStatus> = Vec::new(),
        /// When the current attempt's Pod began waiting for a node (ms since epoch); None while
        /// it does not wait for one. Past its launch timeout, while other jobs wait for a run
        /// slot, it gives its run slot back ([`super::transitions::node_wait_timed_out`]).
        State node_wait_since_ms: Option<i64> = None,
        /// The queue the job waits in (`spec.queue`, or `default`); immutable like the spec.
        Fixed queue: String = crate::api::DEFAULT_QUEUE.to_string(),
        /// Why the queued job is not admitted yet (its `Admitted` condition's reason); None
        /// before a scheduling pass said it, and once the job left the queue.
        State wait_reason: Option<WaitReason> = None,
        /// Relaunches a failure rule's `Ignore` decided (a pipeline: its current task's),
        /// against `recovery.maxIgnored` (docs/design.md#failure-rules).
        State ignored_count: i32 = 0,
        /// The latest attempts that ended (`status.attempts[]`, at most
        /// [`crate::api::failure::MAX_ATTEMPT_RECORDS`]): how each ended and the rule that
        /// decided it.
        State attempts: Vec<AttemptStatus> = Vec::new(),
        /// A multi-node job's members of the current attempt that run (or have succeeded), of
        /// its nodes, as `status.readyNodes` shows them (`3/4`); None for a job without `nodes`.
        State ready_nodes: Option<String> = None,
        /// Who last set `spec.suspend` (the field manager that owns it in `managedFields`,
        /// e.g. `kubectl-patch`, `kustomize-controller`); None when unknown.
        State suspended_by: Option<String> = None,
        /// A scheduling pass chose the job as a preemption victim (persisted so it survives
        /// crashes): its job controller stops its workload gracefully and requeues it.
        State preempt_requested: bool = false,
        /// The queue that took the job's run slot at its latest preemption.
        State preempted_by: Option<String> = None,
        /// When its latest preemption was decided (ms since epoch): the preempting queue's rate
        /// limit counts these.
        State preempted_at_ms: Option<i64> = None,
        /// How many times the job was preempted.
        State preemptions: i32 = 0,
        /// When the current attempt's workload began to run (ms since epoch); None while it
        /// does not run. A queue's `minRunSeconds` counts from here.
        State running_since_ms: Option<i64> = None,
        /// The resourceVersion at which the operator first saw the object, as the store orders
        /// it ([`super::entry::version_key`]; `""`: none known): breaks ties of
        /// `queued_at_ms` inside one second (FIFO in the order the API server accepted the
        /// jobs, [`super::entry`]).
        Fixed entry_version: String = String::new(),
        /// A digest of the reason a scheduling pass last told the job while it waits, with its
        /// message ([`said_key`]): the pass rewrites only the waiting jobs
        /// whose digest differs from their group's reason (`scheduler::tell_waiting`). 0: its
        /// message was set by anything else (every change through [`super::change::apply`]
        /// resets it).
        State reason_key: i64 = 0,
        /// What each task's attempt needs (one entry for a job of one task), computed at
        /// submission from the spec (`resources::demand::of_job`).
        Fixed demands: Vec<Demand> = Vec::new(),
        /// The pool the current attempt was admitted onto (its queue's `spec.pools`); None in
        /// a queue without pools, and while the job is not admitted.
        State pool: Option<String> = None,
        /// What that pool adds to its Pods at launch (labels, tolerations).
        State placement: Option<Placement> = None,
    }
}

/// A ManagedJob object as the operator sees it: what a job's record is made from.
#[derive(Clone, Copy, Debug)]
pub struct Object<'a> {
    /// `metadata.uid`.
    pub uid: &'a str,
    /// `metadata.namespace`.
    pub namespace: &'a str,
    /// `metadata.name`.
    pub name: &'a str,
    /// `metadata.generation`.
    pub generation: i64,
    /// `spec`.
    pub spec: &'a ManagedJobSpec,
    /// `metadata.creationTimestamp`, ms since epoch: its place in the queue (FIFO within a
    /// priority follows creation, not the order the operator happens to see objects in).
    pub created_at_ms: i64,
    /// `metadata.resourceVersion` when the operator first saw the object (its creation's when
    /// its watch saw the create; `""`: unknown): orders jobs created in one second
    /// ([`super::entry`]).
    pub resource_version: &'a str,
}

impl JobRow {
    /// The record of `object` first seen at `now_ms`: Pending + Inactive, no id yet, its cancel
    /// request already persisted when the object asks for it (so no pass can admit it first),
    /// one Pending record per task of a pipeline. Every other field has its first-seen value.
    pub fn new(object: &Object<'_>, now_ms: i64) -> JobRow {
        JobRow {
            uid: object.uid.to_string(),
            namespace: object.namespace.to_string(),
            name: object.name.to_string(),
            generation: object.generation,
            executor: object.spec.executor(),
            spec: object.spec.clone(),
            priority: object.spec.priority,
            cancel_requested: object.spec.cancel,
            submitted_at_ms: now_ms,
            phase_changed_at_ms: now_ms,
            queued_at_ms: object.created_at_ms,
            entry_version: super::entry::version_key(object.resource_version).unwrap_or_default(),
            tasks: initial_records(object.spec),
            queue: object.spec.queue_name().to_string(),
            ..JobRow::first_seen()
        }
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The attempt a job controller works on: the row's attempt, at least 1.
    pub fn current_attempt(&self) -> i32 {
        self.attempt.max(1)
    }

    /// The recorded job controller process (pid, start time), when both are known.
    pub fn controller(&self) -> Option<(i32, u64)> {
        self.controller_pid.zip(self.controller_start_time)
    }

    /// Attempts whose files (exit files, logs) the job may have.
    pub fn attempts(&self) -> i32 {
        self.attempt.max(self.launched_attempt)
    }

    /// The row's (phase, schedule state).
    pub fn state(&self) -> (JobPhase, ScheduleState) {
        (self.phase, self.schedule_state)
    }
}

/// A digest of a waiting job's reason and message (never 0): what the store compares to tell
/// only the waiting jobs whose reason changed ([`JobRow::reason_key`], `scheduler::tell_waiting`).
/// FNV-1a (64 bits) of the reason's name, a NUL and the message: stable across releases (it is
/// stored), and two different reasons share a digest with odds of about 2^-64.
pub fn said_key(reason: WaitReason, message: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in reason
        .as_str()
        .bytes()
        .chain(std::iter::once(0))
        .chain(message.bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    match h as i64 {
        0 => 1,
        k => k,
    }
}

/// One Pending record per task of `spec` (none for a job of one task).
pub fn initial_records(spec: &ManagedJobSpec) -> Vec<TaskStatus> {
    spec.tasks
        .iter()
        .map(|t| TaskStatus {
            name: t.name.clone(),
            ..Default::default()
        })
        .collect()
}

/// One entry of a job's history: a change of its phase or schedule state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryEntry {
    /// Position in the history (a store-wide increasing sequence).
    pub id: i64,
    /// When (ms since epoch).
    pub at_ms: i64,
    /// Phase before (None for the job's first entry).
    pub from_phase: Option<JobPhase>,
    /// Phase after.
    pub to_phase: JobPhase,
    /// Schedule state before (None for the job's first entry).
    pub from_schedule: Option<ScheduleState>,
    /// Schedule state after.
    pub to_schedule: ScheduleState,
    /// Why.
    pub reason: Reason,
    /// The job's message at that time.
    pub message: String,
}

/// A history entry to record: a job's move from `from` (None: it was not in the store) to `to`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// (phase, schedule state) before.
    pub from: Option<(JobPhase, ScheduleState)>,
    /// (phase, schedule state) after.
    pub to: (JobPhase, ScheduleState),
    /// Why.
    pub reason: Reason,
    /// The message it is recorded with.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every column round-trips through its value, and the names are the fields'.
    #[test]
    fn a_record_round_trips_through_its_columns() {
        let spec = ManagedJobSpec {
            run: Some("true".into()),
            ..Default::default()
        };
        let object = Object {
            uid: "u",
            namespace: "ns",
            name: "j",
            generation: 2,
            spec: &spec,
            created_at_ms: 5,
            resource_version: "",
        };
        let mut row = JobRow::new(&object, 7);
        row.id = 3;
        row.workload = Some(Workload::Pod("j-3-1-x".into()));
        row.failure_reason = Some(Failure::Workload("OOMKilled".into()));
        row.controller_start_time = Some(99);
        let values = row.to_values();
        assert_eq!(values.len(), JobRow::COLUMNS.len());
        let back = JobRow::from_values(|i| Ok::<_, DecodeError>(values[i].clone()), |e| e);
        assert_eq!(back, Ok(row));
        assert_eq!(JobRow::COLUMNS[0].name, "id");
        assert_eq!(JobRow::COLUMNS[0].kind, ColumnKind::Key);
        let bad = JobRow::from_values(
            |i| {
                Ok::<_, DecodeError>(if JobRow::COLUMNS[i].name == "phase" {
                    Value::Text("Sleeping".into())
                } else {
                    values[i].clone()
                })
            },
            |e| e,
        );
        assert_eq!(bad.unwrap_err().column, "phase");
    }
}
