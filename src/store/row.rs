//! [`JobRow`]: a job as the store holds it, mapped from its row by column name.

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
    /// The spec as submitted.
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
    /// The object's `metadata.creationTimestamp` (ms since epoch): FIFO order within a priority.
    pub created_at_ms: i64,
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
}

/// Every column of `jobs`, in the order the SELECTs list them.
pub(super) const JOB_COLUMNS: &str = "id, uid, namespace, name, generation, executor, spec, \
    priority, phase, schedule_state, message, queue_position, cancel_requested, deleting, \
    controller_pid, controller_start_time, controller_starts, controller_crashes, attempt, \
    launched_attempt, recovery_count, restart_count, exit_code, failure_reason, workload, \
    backoff_until_ms, submitted_at_ms, started_at_ms, finished_at_ms, phase_changed_at_ms, \
    status_version, synced_version, created_at_ms, changed_seq, unsynced_since_seq, \
    launched_at_ms, launch_timeouts, task_index, task_first_attempt, task_started_at_ms, tasks";

fn corrupt(job_id: i64, what: impl Into<String>) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(Box::new(StoreError::Corrupt {
        job_id,
        what: what.into(),
    }))
}

impl JobRow {
    /// Maps a row selected with [`JOB_COLUMNS`], by column name.
    pub(super) fn from_row(row: &Row<'_>) -> rusqlite::Result<JobRow> {
        let id: i64 = row.get("id")?;
        let executor: String = row.get("executor")?;
        let spec: String = row.get("spec")?;
        let phase: String = row.get("phase")?;
        let schedule: String = row.get("schedule_state")?;
        Ok(JobRow {
            id,
            uid: row.get("uid")?,
            namespace: row.get("namespace")?,
            name: row.get("name")?,
            generation: row.get("generation")?,
            executor: ExecutorKind::parse(&executor)
                .ok_or_else(|| corrupt(id, format!("executor {executor:?}")))?,
            spec: serde_json::from_str::<ManagedJobSpec>(&spec)
                .map_err(|e| corrupt(id, format!("spec: {e}")))?,
            priority: row.get("priority")?,
            phase: JobPhase::parse(&phase)
                .ok_or_else(|| corrupt(id, format!("phase {phase:?}")))?,
            schedule_state: ScheduleState::parse(&schedule)
                .ok_or_else(|| corrupt(id, format!("schedule state {schedule:?}")))?,
            message: row.get("message")?,
            queue_position: row.get("queue_position")?,
            cancel_requested: row.get("cancel_requested")?,
            deleting: row.get("deleting")?,
            controller_pid: row.get("controller_pid")?,
            controller_start_time: row
                .get::<_, Option<i64>>("controller_start_time")?
                .map(|t| t as u64),
            controller_starts: row.get("controller_starts")?,
            controller_crashes: row.get("controller_crashes")?,
            attempt: row.get("attempt")?,
            launched_attempt: row.get("launched_attempt")?,
            recovery_count: row.get("recovery_count")?,
            restart_count: row.get("restart_count")?,
            exit_code: row.get("exit_code")?,
            failure_reason: row.get("failure_reason")?,
            workload: row.get("workload")?,
            backoff_until_ms: row.get("backoff_until_ms")?,
            submitted_at_ms: row.get("submitted_at_ms")?,
            started_at_ms: row.get("started_at_ms")?,
            finished_at_ms: row.get("finished_at_ms")?,
            phase_changed_at_ms: row.get("phase_changed_at_ms")?,
            status_version: row.get("status_version")?,
            synced_version: row.get("synced_version")?,
            created_at_ms: row.get("created_at_ms")?,
            changed_seq: row.get("changed_seq")?,
            unsynced_since_seq: row.get("unsynced_since_seq")?,
            launched_at_ms: row.get("launched_at_ms")?,
            launch_timeouts: row.get("launch_timeouts")?,
            task_index: row.get("task_index")?,
            task_first_attempt: row.get("task_first_attempt")?,
            task_started_at_ms: row.get("task_started_at_ms")?,
            tasks: {
                let tasks: String = row.get("tasks")?;
                serde_json::from_str(&tasks).map_err(|e| corrupt(id, format!("tasks: {e}")))?
            },
        })
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}
