//! Rebuilding a job's row from its object's status after the store was lost (DESIGN.md
//! section 7): the status is the truth for everything the user saw; the workload, if it still
//! runs, is adopted by its deterministic key (the job id and attempt the status names).

use crate::api::{JobPhase, ManagedJobStatus, ScheduleState, TaskPhase, TaskStatus};

/// The row of a job rebuilt from its status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restored {
    /// `status.jobId`: kept, so the job's Pods, markers and files stay its own.
    pub job_id: i64,
    /// Phase as the status shows it.
    pub phase: JobPhase,
    /// Where the job resumes: Done for a finished job, Waiting for a queued one, AliveWaiting
    /// (a relaunch: it keeps a run slot and needs a launch slot) for one that was live.
    pub schedule: ScheduleState,
    /// `status.message`.
    pub message: String,
    /// `status.attempt` (at least 1 for a live job).
    pub attempt: i32,
    /// Highest attempt whose workload may exist: the controller looks for it (adopts it, or
    /// counts it lost) instead of launching it again.
    pub launched_attempt: i32,
    /// `status.recoveryCount`.
    pub recovery_count: i32,
    /// `status.restartCount`.
    pub restart_count: i32,
    /// `status.exitCode`.
    pub exit_code: Option<i32>,
    /// `status.failureReason`.
    pub failure_reason: Option<String>,
    /// `status.workload`.
    pub workload: Option<String>,
    /// The job was being cancelled (or its spec asks for it).
    pub cancel_requested: bool,
    /// `status.submittedAt`, ms since epoch.
    pub submitted_at_ms: Option<i64>,
    /// `status.startedAt`, ms since epoch.
    pub started_at_ms: Option<i64>,
    /// `status.finishedAt`, ms since epoch (the TTL counts from it, not from the rebuild).
    pub finished_at_ms: Option<i64>,
    /// The object already shows this row (a finished job): nothing is written, byte for byte.
    pub synced: bool,
    /// `status.currentTask` (0 for a job of one task).
    pub task_index: i32,
    /// The job's attempt at which the current task began: `status.attempt` less the task's
    /// own attempts.
    pub task_first_attempt: i32,
    /// `status.tasks[current].startedAt`, ms since epoch.
    pub task_started_at_ms: Option<i64>,
    /// `status.tasks`.
    pub tasks: Vec<TaskStatus>,
}

fn ms(t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> Option<i64> {
    t.as_ref().map(|t| t.0.as_millisecond())
}

/// The row to rebuild from `status` (`spec_cancel`: the object's `spec.cancel`), or None when
/// the status names no job (the operator never saw the object: it is submitted as new).
pub fn restore(status: &ManagedJobStatus, spec_cancel: bool) -> Option<Restored> {
    let job_id = status.job_id.filter(|id| *id > 0)?;
    let phase = status.phase.unwrap_or(JobPhase::Pending);
    let attempt = status.attempt.max(0);
    let task_index = status.current_task.unwrap_or(0).max(0);
    // A pipeline's row holds its current task's counters; the job's are their sums.
    let task = status.tasks.get(task_index as usize);
    let task_launched = task.is_none_or(|t| t.phase != TaskPhase::Pending);
    let (schedule, attempt, launched_attempt) = if phase.is_terminal() {
        (ScheduleState::Done, attempt, attempt)
    } else if phase == JobPhase::Pending {
        (ScheduleState::Waiting, 0, 0)
    } else {
        let attempt = attempt.max(1);
        // Submitted never launched; a recovery or restart queued for its launch slot has not
        // launched its new attempt. Anything else may have a workload to adopt.
        let launched = match (phase, status.schedule_state) {
            (JobPhase::Submitted, _) => 0,
            (JobPhase::Recovering, Some(ScheduleState::Launching)) => attempt,
            (JobPhase::Recovering, _) => attempt - 1,
            // The next task of a pipeline waits for its launch slot: not launched yet.
            _ if !task_launched => attempt - 1,
            _ => attempt,
        };
        (ScheduleState::AliveWaiting, attempt, launched)
    };
    Some(Restored {
        job_id,
        phase,
        schedule,
        message: status.message.clone().unwrap_or_default(),
        attempt,
        launched_attempt,
        recovery_count: task.map_or(status.recovery_count, |t| t.recovery_count),
        restart_count: task.map_or(status.restart_count, |t| t.restart_count),
        exit_code: status.exit_code,
        failure_reason: status.failure_reason.clone(),
        workload: status.workload.clone(),
        cancel_requested: !phase.is_terminal() && (spec_cancel || phase == JobPhase::Cancelling),
        submitted_at_ms: ms(&status.submitted_at),
        started_at_ms: ms(&status.started_at),
        finished_at_ms: ms(&status.finished_at),
        synced: phase.is_terminal(),
        task_index,
        task_first_attempt: match task {
            Some(t) if t.attempt > 0 => (attempt - t.attempt + 1).max(1),
            Some(_) => attempt.max(1),
            None => 1,
        },
        task_started_at_ms: task.and_then(|t| ms(&t.started_at)),
        tasks: status.tasks.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(phase: JobPhase, schedule: ScheduleState, attempt: i32) -> ManagedJobStatus {
        ManagedJobStatus {
            job_id: Some(7),
            phase: Some(phase),
            schedule_state: Some(schedule),
            attempt,
            ..Default::default()
        }
    }

    #[test]
    fn a_running_job_resumes_as_a_relaunch_that_adopts_its_attempt() {
        let r = restore(&status(JobPhase::Running, ScheduleState::Alive, 2), false).unwrap();
        assert_eq!(
            (r.job_id, r.schedule, r.attempt, r.launched_attempt),
            (7, ScheduleState::AliveWaiting, 2, 2)
        );
        assert!(!r.synced);
    }

    #[test]
    fn a_finished_job_is_kept_as_it_is_shown() {
        let r = restore(&status(JobPhase::Succeeded, ScheduleState::Done, 1), false).unwrap();
        assert_eq!(r.schedule, ScheduleState::Done);
        assert!(r.synced && !r.cancel_requested);
    }

    #[test]
    fn a_queued_recovery_has_not_launched_its_new_attempt() {
        let r = restore(
            &status(JobPhase::Recovering, ScheduleState::AliveWaiting, 3),
            false,
        )
        .unwrap();
        assert_eq!((r.attempt, r.launched_attempt), (3, 2));
        let queued = restore(&status(JobPhase::Pending, ScheduleState::Waiting, 0), true).unwrap();
        assert_eq!(
            (queued.schedule, queued.cancel_requested),
            (ScheduleState::Waiting, true)
        );
        assert_eq!(restore(&ManagedJobStatus::default(), false), None);
    }
}
