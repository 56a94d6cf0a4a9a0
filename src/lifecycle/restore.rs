//! Rebuilding a job's record from its object's status after the store was lost
//! (`docs/design.md`, "A lost store"): the status is the truth for everything the user saw; the
//! workload, if it still runs, is adopted by its deterministic key (the job id and attempt the
//! status names).

use crate::api::{JobPhase, ManagedJobStatus, ScheduleState, TaskPhase};

use super::clock::ms_of as ms;
use super::outcome::Workload;
use super::reason::Failure;
use super::record::{JobRow, Object};
use super::tasks::Pending;

/// The record of `object` to rebuild from `status` at `now_ms`, or None when the status names
/// no job (the operator never saw the object: it is submitted as new). Its id is
/// `status.jobId` (so the job's Pods, markers and files stay its own); where it resumes is Done
/// for a finished job, Waiting for a queued one, and AliveWaiting (a relaunch: it keeps a run
/// slot and needs a launch slot) for one that was live, with the highest attempt whose
/// workload may exist as launched (its controller looks for it, adopts it or counts it lost,
/// instead of launching it again). A finished job is stored as already written to the API
/// (its status is never rewritten), its TTL counted from its original `finishedAt`.
pub fn restore(object: &Object<'_>, status: &ManagedJobStatus, now_ms: i64) -> Option<JobRow> {
    let job_id = status.job_id.filter(|id| *id > 0)?;
    let phase = status.phase.unwrap_or(JobPhase::Pending);
    // The attempts that started (`super::tasks::shown`).
    let started = status.attempt.max(0);
    let task_index = status.current_task.unwrap_or(0).max(0);
    // A pipeline's row holds its current task's counters; the job's are their sums.
    let task = status.tasks.get(task_index as usize);
    let task_launched = task.is_none_or(|t| t.phase != TaskPhase::Pending);
    let last = status.attempts.last();
    // A relaunch decided whose attempt had not started: the last started attempt's end is
    // recorded while the job goes on. It is decided again as it was: the next attempt, its
    // budget spent.
    let pending = (!phase.is_terminal() && started > 0)
        .then(|| last.filter(|r| r.attempt == started))
        .flatten()
        .map(|r| Pending::of_action(&r.action));
    let (schedule, attempt, launched_attempt) = if phase.is_terminal() {
        (ScheduleState::Done, started, started)
    } else if matches!(phase, JobPhase::Pending | JobPhase::Suspended) {
        // Queued, or held by spec.suspend: after a suspend or a preemption its next attempt
        // follows the ones that started (none of it launched).
        let schedule = if phase == JobPhase::Suspended {
            ScheduleState::Inactive
        } else {
            ScheduleState::Waiting
        };
        let next = if started > 0 { started + 1 } else { 0 };
        (schedule, next, started)
    } else if pending.is_some() {
        (ScheduleState::AliveWaiting, started + 1, started)
    } else {
        let attempt = started.max(1);
        // Submitted never launched. A status written before statuses counted only attempts
        // that started shows a relaunch queued for its launch slot (Recovering) or a
        // pipeline's next task (its record Pending) as the attempt itself: not launched. A
        // Pod that exists after all is adopted by its name when it is created again.
        let launched = match (phase, status.schedule_state) {
            (JobPhase::Submitted, _) => 0,
            (JobPhase::Recovering, Some(ScheduleState::Launching)) => attempt,
            (JobPhase::Recovering, _) => attempt - 1,
            _ if !task_launched => attempt - 1,
            _ => attempt,
        };
        (ScheduleState::AliveWaiting, attempt, launched)
    };
    let more = |kind: Pending| i32::from(pending == Some(kind));
    let done = schedule == ScheduleState::Done;
    let mut tasks = status.tasks.clone();
    if let (Some(_), Some(t)) = (pending, tasks.get_mut(task_index as usize))
        && t.attempt > 0
    {
        t.attempt += 1;
        t.restart_count += more(Pending::Restart);
        t.recovery_count += more(Pending::Recovery);
        t.ignored_count += more(Pending::Ignored);
    }
    let task = tasks.get(task_index as usize);
    let entry = status.queue_entry.as_ref();
    Some(JobRow {
        id: job_id,
        phase,
        schedule_state: schedule,
        message: status.message.clone().unwrap_or_default(),
        attempt,
        launched_attempt,
        recovery_count: task.map_or(status.recovery_count + more(Pending::Recovery), |t| {
            t.recovery_count
        }),
        restart_count: task.map_or(status.restart_count + more(Pending::Restart), |t| {
            t.restart_count
        }),
        ignored_count: task.map_or(status.ignored_count + more(Pending::Ignored), |t| {
            t.ignored_count
        }),
        attempts: status.attempts.clone(),
        exit_code: status.exit_code,
        failure_reason: status.failure_reason.as_deref().map(Failure::parse),
        workload: status.workload.as_deref().and_then(Workload::parse),
        cancel_requested: !phase.is_terminal()
            && (object.spec.cancel || phase == JobPhase::Cancelling),
        submitted_at_ms: ms(&status.submitted_at).unwrap_or(now_ms),
        started_at_ms: ms(&status.started_at),
        finished_at_ms: ms(&status.finished_at).or(done.then_some(now_ms)),
        synced_version: if done { 1 } else { 0 },
        task_index,
        task_first_attempt: match task {
            Some(t) if t.attempt > 0 => (attempt - t.attempt + 1).max(1),
            Some(_) => attempt.max(1),
            None => 1,
        },
        task_started_at_ms: task.and_then(|t| ms(&t.started_at)),
        tasks,
        // Its place in its queue as the status kept it (`super::entry`); a status of an
        // earlier release keeps none: its creation second, first inside it.
        queued_at_ms: entry
            .and_then(|e| ms(&e.entered_at))
            .unwrap_or(object.created_at_ms),
        entry_version: entry
            .and_then(|e| e.resource_version.as_deref())
            .and_then(super::entry::version_key)
            .unwrap_or_default(),
        ..JobRow::new(object, now_ms)
    })
}

/// How long after a take-over a local attempt of the former owner may still be stopping, on top
/// of the job's stop grace: the former owner's job controller stops it once its claim lapsed,
/// which is before anyone may take the claim (`super::claim`); this covers a process that is
/// slow to go and the two machines' clocks.
pub const TAKE_OVER_MARGIN: std::time::Duration = std::time::Duration::from_secs(2);

/// A record restored from a status that another operator's store wrote (`from`, its holder
/// identity), after this operator took the job's namespace over (`docs/design.md#one-owner-per-job`).
/// A local attempt that may still run belongs to the former owner's state dir (this store can
/// neither adopt nor stop it); its job controller stops it once its claim lapsed, within
/// `grace` (the job's stop grace) plus [`TAKE_OVER_MARGIN`]. So the attempt is over for this
/// store: the job waits that long (Recovering, a back-off), then relaunches its next attempt,
/// counted in no budget (it did not fail; its owner changed). A pod job adopts its Pod by name
/// and a job that launched nothing waits for its launch slot, unchanged.
pub fn taken_over(mut row: JobRow, from: &str, grace: std::time::Duration, now_ms: i64) -> JobRow {
    use crate::api::ExecutorKind;
    let may_run = row.executor == ExecutorKind::Local
        && row.schedule_state == ScheduleState::AliveWaiting
        && row.attempt > 0
        && row.launched_attempt >= row.attempt;
    if !may_run {
        return row;
    }
    let wait = grace + TAKE_OVER_MARGIN;
    let shown = super::tasks::task_attempt(&row, row.attempt);
    row.phase = JobPhase::Recovering;
    row.schedule_state = ScheduleState::Alive;
    row.attempt += 1;
    row.workload = None;
    row.backoff_until_ms = Some(now_ms + wait.as_millis() as i64);
    row.message = format!(
        "taken over from {from}: attempt {shown} ran in that operator's state dir, which stops it; relaunching in {:.1} s, counted in no budget",
        wait.as_secs_f64()
    );
    row
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ManagedJobSpec;

    fn restore(status: &ManagedJobStatus, cancel: bool) -> Option<JobRow> {
        let spec = ManagedJobSpec {
            run: Some("true".into()),
            cancel,
            ..Default::default()
        };
        let object = Object {
            uid: "u",
            namespace: "ns",
            name: "j",
            generation: 1,
            spec: &spec,
            created_at_ms: 0,
            resource_version: "",
        };
        super::restore(&object, status, 1_000)
    }

    fn status(phase: JobPhase, schedule: ScheduleState, attempt: i32) -> ManagedJobStatus {
        ManagedJobStatus {
            job_id: Some(7),
            phase: Some(phase),
            schedule_state: Some(schedule),
            attempt,
            ..Default::default()
        }
    }

    /// A queued job rebuilt from its status keeps its place: the time it entered its queue and
    /// the version it was first seen at, as its status shows them (`crate::status`); a status
    /// of an earlier release, which shows neither, gives its creation and no version.
    #[test]
    fn a_queued_job_keeps_its_place_in_its_queue() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let at = |ms| Time(jiff::Timestamp::from_millisecond(ms).unwrap());
        let mut shown = ManagedJobStatus {
            queue_entry: Some(crate::api::QueueEntry {
                entered_at: Some(at(3_000)),
                resource_version: Some("4711".into()),
            }),
            ..status(JobPhase::Pending, ScheduleState::Waiting, 0)
        };
        let r = restore(&shown, false).unwrap();
        assert_eq!(r.queued_at_ms, 3_000);
        assert_eq!(
            super::super::entry::version_of_key(&r.entry_version),
            "4711"
        );
        shown.queue_entry = None;
        let r = restore(&shown, false).unwrap();
        assert_eq!((r.queued_at_ms, r.entry_version.as_str()), (0, ""));
    }

    #[test]
    fn a_running_job_resumes_as_a_relaunch_that_adopts_its_attempt() {
        let r = restore(&status(JobPhase::Running, ScheduleState::Alive, 2), false).unwrap();
        assert_eq!(
            (r.id, r.schedule_state, r.attempt, r.launched_attempt),
            (7, ScheduleState::AliveWaiting, 2, 2)
        );
        assert!(r.synced_version < r.status_version);
    }

    #[test]
    fn a_local_job_taken_over_relaunches_after_the_former_owner_stopped_it() {
        let r = restore(&status(JobPhase::Running, ScheduleState::Alive, 2), false).unwrap();
        let t = taken_over(r.clone(), "a/x1", std::time::Duration::from_secs(5), 1_000);
        assert_eq!(
            (t.phase, t.schedule_state, t.attempt, t.launched_attempt),
            (JobPhase::Recovering, ScheduleState::Alive, 3, 2)
        );
        assert_eq!(t.backoff_until_ms, Some(8_000));
        assert_eq!(
            (t.restart_count, t.recovery_count),
            (r.restart_count, r.recovery_count)
        );
        assert!(crate::lifecycle::in_backoff(&t));
        assert!(crate::lifecycle::legal_state(
            t.phase,
            t.schedule_state,
            false
        ));
        // Queued, or never launched: unchanged.
        let queued = restore(&status(JobPhase::Pending, ScheduleState::Waiting, 0), false).unwrap();
        assert_eq!(
            taken_over(queued.clone(), "a/x1", Default::default(), 0),
            queued
        );
    }

    #[test]
    fn a_finished_job_is_kept_as_it_is_shown() {
        let r = restore(&status(JobPhase::Succeeded, ScheduleState::Done, 1), false).unwrap();
        assert_eq!(r.schedule_state, ScheduleState::Done);
        assert!(r.synced_version == r.status_version && !r.cancel_requested);
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
            (queued.schedule_state, queued.cancel_requested),
            (ScheduleState::Waiting, true)
        );
        assert_eq!(restore(&ManagedJobStatus::default(), false), None);
    }
}
