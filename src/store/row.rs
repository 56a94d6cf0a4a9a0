//! [`JobRow`]: a job as the store holds it, mapped from its row by column position.

use rusqlite::Row;

use super::StoreError;
use crate::api::{ExecutorKind, JobPhase, ManagedJobSpec, ScheduleState};

/// A job as the store holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRow {
    /// Store id (`status.jobId`).
    pub id: i64,
    /// The ManagedJob's `metadata.uid`.
    pub uid: String,
    /// Namespace of the ManagedJob.
    pub namespace: String,
    /// Name of the ManagedJob.
    pub name: String,
    /// Latest `metadata.generation` mirrored.
    pub generation: i64,
    /// Executor the spec asks for.
    pub executor: ExecutorKind,
    /// The spec as submitted; its `cancel` follows the object's (`Store::upsert_created`).
    pub spec: ManagedJobSpec,
    /// Current priority (may change while queued).
    pub priority: i32,
    /// User-facing phase.
    pub phase: JobPhase,
    /// Scheduler state.
    pub schedule_state: ScheduleState,
    /// Latest human-readable message.
    pub message: String,
    /// Queue position when queued (1 = next).
    pub queue_position: Option<i64>,
    /// A cancel was requested (spec.cancel or deletion); persisted so it survives crashes.
    pub cancel_requested: bool,
    /// The object is being deleted (cleanup, then the row goes away).
    pub deleting: bool,
    /// Pid of the job controller process, once started.
    pub controller_pid: Option<i32>,
    /// Start time of that process in clock ticks since boot (/proc/PID/stat field 22).
    pub controller_start_time: Option<u64>,
    /// How many job controller processes were started for this job.
    pub controller_starts: i64,
    /// How many of them exited before the job was Done.
    pub controller_crashes: i64,
    /// Current attempt number (0 before the first launch).
    pub attempt: i32,
    /// Highest attempt whose workload create was issued (recorded before the create).
    pub launched_attempt: i32,
    /// Relaunches after preemption so far.
    pub recovery_count: i32,
    /// Restarts after errors so far.
    pub restart_count: i32,
    /// Exit code of the last finished attempt.
    pub exit_code: Option<i32>,
    /// CamelCase failure reason.
    pub failure_reason: Option<String>,
    /// `pid/N` or `pod/NAME` of the current attempt.
    pub workload: Option<String>,
    /// A restart back-off ends at this time (ms since epoch); stored so restarts keep it.
    pub backoff_until_ms: Option<i64>,
    /// When the job was first seen (ms since epoch).
    pub submitted_at_ms: i64,
    /// When the workload first ran (ms since epoch).
    pub started_at_ms: Option<i64>,
    /// When the job reached a terminal phase (ms since epoch).
    pub finished_at_ms: Option<i64>,
    /// When the phase last changed (ms since epoch); condition transition times.
    pub phase_changed_at_ms: i64,
    /// Bumped on every change that the API status should show.
    pub status_version: i64,
    /// The `status_version` last written to the API.
    pub synced_version: i64,
    /// When the job entered its queue (ms since epoch): its object's
    /// `metadata.creationTimestamp`, or when it gave its run slot back because no node took its
    /// Pod (the back of its priority). FIFO order within a priority.
    pub queued_at_ms: i64,
    /// Id of the job's last transition (a store-wide sequence; 0 before any).
    pub changed_seq: i64,
    /// Id of the job's first transition since its status was last fully written to the API,
    /// or older: the status writer never lets a job's taking of a slot reach the API before an
    /// earlier release of one (see `operator::status_loop`).
    pub unsynced_since_seq: i64,
    /// When the current attempt's launch clock started (ms since epoch): its launch intent, or
    /// the binding of its Pod after it waited for a node. None while it waits for a node (or
    /// before any launch). The launch deadline counts from here.
    pub launched_at_ms: Option<i64>,
    /// Launch timeouts in a row (reset when an attempt runs); the
    /// `--max-launch-timeouts`-th ends the job FailedNoResource.
    pub launch_timeouts: i32,
    /// A pipeline's current task: its index in `spec.tasks` (0 for a job of one task).
    pub task_index: i32,
    /// The job's attempt at which the current task began (1 for a job of one task): the
    /// task's attempt number is `attempt - task_first_attempt + 1`.
    pub task_first_attempt: i32,
    /// When the current task's workload first ran (ms since epoch): its own
    /// `activeDeadlineSeconds` counts from here.
    pub task_started_at_ms: Option<i64>,
    /// A pipeline's task records (`status.tasks[]`, kept by [`crate::lifecycle::tasks::follow`]);
    /// empty for a job of one task.
    pub tasks: Vec<crate::api::TaskStatus>,
    /// When the current attempt's Pod began waiting for a node (ms since epoch); None while it
    /// does not wait for one. Past its launch timeout, while other jobs wait for a run slot,
    /// it gives its run slot back ([`crate::lifecycle::node_wait_timed_out`]).
    pub node_wait_since_ms: Option<i64>,
}

/// Every column of `jobs`, in the order the SELECTs list them ([`JOB_COLUMNS`]).
const COLUMNS: [&str; 42] = [
    "id",
    "uid",
    "namespace",
    "name",
    "generation",
    "executor",
    "spec",
    "priority",
    "phase",
    "schedule_state",
    "message",
    "queue_position",
    "cancel_requested",
    "deleting",
    "controller_pid",
    "controller_start_time",
    "controller_starts",
    "controller_crashes",
    "attempt",
    "launched_attempt",
    "recovery_count",
    "restart_count",
    "exit_code",
    "failure_reason",
    "workload",
    "backoff_until_ms",
    "submitted_at_ms",
    "started_at_ms",
    "finished_at_ms",
    "phase_changed_at_ms",
    "status_version",
    "synced_version",
    "queued_at_ms",
    "changed_seq",
    "unsynced_since_seq",
    "launched_at_ms",
    "launch_timeouts",
    "task_index",
    "task_first_attempt",
    "task_started_at_ms",
    "tasks",
    "node_wait_since_ms",
];

/// [`COLUMNS`] as the SELECTs list them.
pub(super) const JOB_COLUMNS: &str = "id, uid, namespace, name, generation, executor, spec, priority, phase, schedule_state, \
    message, queue_position, cancel_requested, deleting, controller_pid, controller_start_time, \
    controller_starts, controller_crashes, attempt, launched_attempt, recovery_count, \
    restart_count, exit_code, failure_reason, workload, backoff_until_ms, submitted_at_ms, \
    started_at_ms, finished_at_ms, phase_changed_at_ms, status_version, synced_version, \
    queued_at_ms, changed_seq, unsynced_since_seq, launched_at_ms, launch_timeouts, task_index, \
    task_first_attempt, task_started_at_ms, tasks, node_wait_since_ms";

/// Position of column `name` in [`COLUMNS`], computed at compile time (through [`col!`]): a row
/// is read by position, which costs nothing, but written by name (rusqlite's lookup by name
/// compares it with every column name, once per column per row: a tenth of the operator's CPU
/// when measured under load). A name not in [`COLUMNS`] fails the build.
const fn column_index(name: &str) -> usize {
    let mut i = 0;
    while i < COLUMNS.len() {
        let (a, b) = (COLUMNS[i].as_bytes(), name.as_bytes());
        if a.len() == b.len() {
            let mut k = 0;
            while k < a.len() && a[k] == b[k] {
                k += 1;
            }
            if k == a.len() {
                return i;
            }
        }
        i += 1;
    }
    panic!("not a column of jobs (store/row.rs COLUMNS)")
}

/// The position of a column of `jobs` in a row selected with [`JOB_COLUMNS`], at compile time.
macro_rules! col {
    ($name:literal) => {
        const { column_index($name) }
    };
}

fn corrupt(job_id: i64, what: impl Into<String>) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(Box::new(StoreError::Corrupt {
        job_id,
        what: what.into(),
    }))
}

impl JobRow {
    /// Maps a row selected with [`JOB_COLUMNS`] (by position, named through [`col!`]).
    pub(super) fn from_row(row: &Row<'_>) -> rusqlite::Result<JobRow> {
        let id: i64 = row.get(col!("id"))?;
        let executor: String = row.get(col!("executor"))?;
        let spec: String = row.get(col!("spec"))?;
        let phase: String = row.get(col!("phase"))?;
        let schedule: String = row.get(col!("schedule_state"))?;
        Ok(JobRow {
            id,
            uid: row.get(col!("uid"))?,
            namespace: row.get(col!("namespace"))?,
            name: row.get(col!("name"))?,
            generation: row.get(col!("generation"))?,
            executor: ExecutorKind::parse(&executor)
                .ok_or_else(|| corrupt(id, format!("executor {executor:?}")))?,
            spec: serde_json::from_str::<ManagedJobSpec>(&spec)
                .map_err(|e| corrupt(id, format!("spec: {e}")))?,
            priority: row.get(col!("priority"))?,
            phase: JobPhase::parse(&phase)
                .ok_or_else(|| corrupt(id, format!("phase {phase:?}")))?,
            schedule_state: ScheduleState::parse(&schedule)
                .ok_or_else(|| corrupt(id, format!("schedule state {schedule:?}")))?,
            message: row.get(col!("message"))?,
            queue_position: row.get(col!("queue_position"))?,
            cancel_requested: row.get(col!("cancel_requested"))?,
            deleting: row.get(col!("deleting"))?,
            controller_pid: row.get(col!("controller_pid"))?,
            controller_start_time: row
                .get::<_, Option<i64>>(col!("controller_start_time"))?
                .map(|t| t as u64),
            controller_starts: row.get(col!("controller_starts"))?,
            controller_crashes: row.get(col!("controller_crashes"))?,
            attempt: row.get(col!("attempt"))?,
            launched_attempt: row.get(col!("launched_attempt"))?,
            recovery_count: row.get(col!("recovery_count"))?,
            restart_count: row.get(col!("restart_count"))?,
            exit_code: row.get(col!("exit_code"))?,
            failure_reason: row.get(col!("failure_reason"))?,
            workload: row.get(col!("workload"))?,
            backoff_until_ms: row.get(col!("backoff_until_ms"))?,
            submitted_at_ms: row.get(col!("submitted_at_ms"))?,
            started_at_ms: row.get(col!("started_at_ms"))?,
            finished_at_ms: row.get(col!("finished_at_ms"))?,
            phase_changed_at_ms: row.get(col!("phase_changed_at_ms"))?,
            status_version: row.get(col!("status_version"))?,
            synced_version: row.get(col!("synced_version"))?,
            queued_at_ms: row.get(col!("queued_at_ms"))?,
            changed_seq: row.get(col!("changed_seq"))?,
            unsynced_since_seq: row.get(col!("unsynced_since_seq"))?,
            launched_at_ms: row.get(col!("launched_at_ms"))?,
            launch_timeouts: row.get(col!("launch_timeouts"))?,
            task_index: row.get(col!("task_index"))?,
            task_first_attempt: row.get(col!("task_first_attempt"))?,
            task_started_at_ms: row.get(col!("task_started_at_ms"))?,
            tasks: {
                let tasks: String = row.get(col!("tasks"))?;
                serde_json::from_str(&tasks).map_err(|e| corrupt(id, format!("tasks: {e}")))?
            },
            node_wait_since_ms: row.get(col!("node_wait_since_ms"))?,
        })
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SELECT list and the positions [`col!`] reads are the same columns in the same order.
    #[test]
    fn the_select_list_is_the_column_array() {
        let listed: Vec<&str> = JOB_COLUMNS.split(',').map(str::trim).collect();
        assert_eq!(listed, COLUMNS);
        assert_eq!(col!("id"), 0);
        assert_eq!(col!("node_wait_since_ms"), COLUMNS.len() - 1);
    }
}
