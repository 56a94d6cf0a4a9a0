//! A ManagedJob's first sight (`docs/design.md`, "Scheduling"): the record it is stored as and
//! the history it starts with, each step through the edge check ([`super::edges::check`]).
//!
//! - `Created`: the record appears Pending + Inactive;
//! - `Submitted`: it queues for a launch slot (Pending + Waiting), at once;
//! - `KeptFinalStatus`: its object already shows a final status (the store lost the job, e.g.
//!   a new state dir): it is stored Done with that status and never runs again;
//! - `Failed` (`InvalidSpec`): otherwise, a spec that fails the checks the API schema cannot
//!   express ends FailedPrecheck; nothing runs;
//! - `Suspended`: otherwise, a spec created with `suspend: true` is held at once (Suspended +
//!   Inactive), its place in the queue kept for when it is resumed.

use crate::api::{JobPhase, ManagedJobStatus, ScheduleState, validate_spec};

use super::change::apply;
use super::edges::{IllegalTransition, check};
use super::reason::{Failure, Reason};
use super::record::{JobRow, Object, Step};
use super::transitions::{invalid_spec, suspend_queued};

/// The message of a job just queued.
pub const QUEUED: &str = "queued: waiting to be admitted";

/// What a ManagedJob seen for the first time is stored as.
#[derive(Clone, Debug, PartialEq)]
pub struct Submission {
    /// The record to insert (no id yet).
    pub record: JobRow,
    /// Its first history entries, oldest first.
    pub steps: Vec<Step>,
}

/// The submission of `object`, first seen at `now_ms`, whose object already carries `known`
/// (its status, if any). Errors: a step the state machines refuse (none of these can be).
pub fn submission(
    object: &Object<'_>,
    known: Option<&ManagedJobStatus>,
    now_ms: i64,
) -> Result<Submission, IllegalTransition> {
    let mut record = JobRow::new(object, now_ms);
    // What each task's attempt needs; a quantity that is not one fails the job, naming it.
    let demands = crate::resources::demand::of_job(
        object.spec,
        object.spec.resources.as_ref().map(|r| &r.requests),
    );
    record.demands = demands.clone().unwrap_or_default();
    let mut steps = vec![Step {
        from: None,
        to: record.state(),
        reason: Reason::Created,
        message: String::new(),
    }];
    let mut step = |record: &mut JobRow, to: JobRow, reason: Reason, message: &str| {
        steps.push(Step {
            from: Some(record.state()),
            to: to.state(),
            reason,
            message: message.to_string(),
        });
        *record = to;
    };
    // Submitted: queued at once.
    check(
        &record,
        Reason::Submitted,
        (JobPhase::Pending, ScheduleState::Waiting),
    )?;
    let queued = JobRow {
        schedule_state: ScheduleState::Waiting,
        message: QUEUED.into(),
        ..record.clone()
    };
    step(&mut record, queued, Reason::Submitted, "");
    if let Some(status) = known
        && let Some(phase) = status.phase.filter(|p| p.is_terminal())
    {
        check(
            &record,
            Reason::KeptFinalStatus,
            (phase, ScheduleState::Done),
        )?;
        let kept = kept_final_status(&record, status, phase, now_ms);
        step(
            &mut record,
            kept,
            Reason::KeptFinalStatus,
            "the object already carried a final status",
        );
    } else if let Err(why) =
        validate_spec(object.spec).and_then(|()| demands.map(|_| ()).map_err(|e| e.to_string()))
    {
        let failed = apply(&record, &invalid_spec(&record, why).change, now_ms)?;
        let message = failed.message.clone();
        step(&mut record, failed, Reason::Failed, &message);
    } else if object.spec.suspend && !object.spec.cancel {
        // Created suspended (e.g. from git): it never waits for admission until resumed.
        let held = apply(&record, &suspend_queued(&record).change, now_ms)?;
        let message = held.message.clone();
        step(&mut record, held, Reason::Suspended, &message);
    }
    Ok(Submission { record, steps })
}

/// `record` (Pending + Waiting) stored Done in `phase` with what `status` shows: its counters,
/// exit, failure, message, workload, task and task records; finished now.
fn kept_final_status(
    record: &JobRow,
    status: &ManagedJobStatus,
    phase: JobPhase,
    now_ms: i64,
) -> JobRow {
    JobRow {
        phase,
        schedule_state: ScheduleState::Done,
        exit_code: status.exit_code,
        failure_reason: status.failure_reason.as_deref().map(Failure::parse),
        attempt: status.attempt,
        recovery_count: status.recovery_count,
        restart_count: status.restart_count,
        finished_at_ms: Some(now_ms),
        queue_position: None,
        message: status.message.clone().unwrap_or_default(),
        workload: status
            .workload
            .as_deref()
            .and_then(super::outcome::Workload::parse),
        task_index: status.current_task.unwrap_or(0),
        tasks: status.tasks.clone(),
        ..record.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ManagedJobSpec;

    fn object(spec: &ManagedJobSpec) -> Object<'_> {
        Object {
            uid: "u",
            namespace: "ns",
            name: "j",
            generation: 1,
            spec,
            created_at_ms: 5,
            resource_version: "",
        }
    }

    fn reasons(s: &Submission) -> Vec<Reason> {
        s.steps.iter().map(|s| s.reason).collect()
    }

    #[test]
    fn a_new_job_is_created_then_queued_at_once() {
        let spec = ManagedJobSpec {
            run: Some("true".into()),
            ..Default::default()
        };
        let s = submission(&object(&spec), None, 7).unwrap();
        assert_eq!(reasons(&s), [Reason::Created, Reason::Submitted]);
        assert_eq!(
            s.record.state(),
            (JobPhase::Pending, ScheduleState::Waiting)
        );
        assert_eq!(s.record.message, QUEUED);
        assert_eq!((s.record.submitted_at_ms, s.record.queued_at_ms), (7, 5));
        assert_eq!(s.steps[0].to, (JobPhase::Pending, ScheduleState::Inactive));
    }

    #[test]
    fn an_invalid_spec_fails_its_precheck_and_a_final_status_is_kept() {
        let invalid = ManagedJobSpec::default();
        let s = submission(&object(&invalid), None, 7).unwrap();
        assert_eq!(
            reasons(&s),
            [Reason::Created, Reason::Submitted, Reason::Failed]
        );
        assert_eq!(s.record.phase, JobPhase::FailedPrecheck);
        assert_eq!(s.record.failure_reason, Some(Failure::parse("InvalidSpec")));
        let status = ManagedJobStatus {
            phase: Some(JobPhase::Succeeded),
            attempt: 2,
            exit_code: Some(0),
            workload: Some("pod/j-1-2-x".into()),
            message: Some("succeeded on attempt 2".into()),
            ..Default::default()
        };
        // The final status wins over the spec's checks: the job never runs again.
        let s = submission(&object(&invalid), Some(&status), 7).unwrap();
        assert_eq!(
            reasons(&s),
            [Reason::Created, Reason::Submitted, Reason::KeptFinalStatus]
        );
        assert_eq!(s.record.state(), (JobPhase::Succeeded, ScheduleState::Done));
        assert_eq!(s.record.attempt, 2);
        assert_eq!(s.record.finished_at_ms, Some(7));
        assert_eq!(s.record.message, "succeeded on attempt 2");
        assert_eq!(s.record.workload.unwrap().to_string(), "pod/j-1-2-x");
    }
}
