//! Pipelines (`spec.tasks`, DESIGN.md section 11b): which task a job runs, how its attempts
//! are numbered within the task, and how each task's record (`status.tasks[]`) follows the job.
//!
//! A pipeline's row is the row of its current task: `restart_count` and `recovery_count` count
//! that task's restarts and recoveries (its own budgets apply), `attempt` keeps counting over
//! every task (so an attempt names one workload of the job, whatever its task), and
//! `task_first_attempt` is the attempt at which the current task began. The store calls
//! [`follow`] with every change it writes: the current task's record mirrors the job, a task
//! that ends the job ends the later ones as Skipped, and every message names its task. A job
//! of one task has no records; all of this is then the identity.

use super::transitions::Change;
use crate::api::{JobPhase, ManagedJobSpec, ScheduleState, TaskPhase, TaskStatus, TaskView};
use crate::store::JobRow;

/// The task `row` runs (or last ran).
pub fn current_task(row: &JobRow) -> TaskView<'_> {
    row.spec.task(row.task_index.max(0) as usize)
}

/// `attempt` (the job's count) as the number of the current task's attempt, from 1.
pub fn task_attempt(row: &JobRow, attempt: i32) -> i32 {
    (attempt - row.task_first_attempt + 1).max(1)
}

/// True when the current task of `row` has a successor.
pub fn has_next_task(row: &JobRow) -> bool {
    (row.task_index.max(0) as usize) + 1 < row.spec.tasks.len()
}

/// `message` as the store keeps it for `row`: a pipeline's messages name the task they are about
/// (`task 2/3 train: ...`). A decision compares this, not `message`, with `row.message` to know
/// whether writing it would change anything.
pub fn stored_message(row: &JobRow, message: &str) -> String {
    match current_task(row).label() {
        Some(label) => format!("{label}: {message}"),
        None => message.to_string(),
    }
}

/// `TASK` as `kubectl get mj` shows it: `2/3 train` (number from 1). None for a job of one task.
pub fn progress(row: &JobRow) -> Option<String> {
    let task = current_task(row);
    task.name
        .map(|n| format!("{}/{} {n}", task.index + 1, task.count))
}

/// `ms` as a metav1.Time, in whole seconds: the precision it is stored and shown with.
fn time(ms: i64) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        jiff::Timestamp::from_second(ms.div_euclid(1000)).unwrap_or(jiff::Timestamp::UNIX_EPOCH),
    )
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

/// Brings `after` (the row `before` becomes with `change`, its other fields already applied)
/// in line with the pipeline rules, at `now_ms`:
///
/// - the change's message is prefixed with the task it is about (`task 2/3 train: ...`), the
///   task current when the change was decided;
/// - when the change moved to the next task, the task left behind is Succeeded;
/// - the current task's record mirrors the job: its phase (Pending until it launched), attempt
///   within the task, counters, exit code, failure reason, message and times;
/// - when the job ends, every task after the current one that never ran is Skipped.
pub fn follow(before: &JobRow, change: &Change, after: &mut JobRow, now_ms: i64) {
    if !after.spec.is_pipeline() {
        return;
    }
    let count = after.spec.tasks.len();
    if after.tasks.len() != count {
        after.tasks = initial_records(&after.spec);
    }
    let was = (before.task_index.max(0) as usize).min(count - 1);
    let now = (after.task_index.max(0) as usize).min(count - 1);
    if let Some(m) = &change.message {
        after.message = stored_message(before, m);
    }
    if now != was {
        let done = &mut after.tasks[was];
        done.phase = TaskPhase::Succeeded;
        done.attempt = task_attempt(before, before.attempt);
        // What it did, not what came next (the job's message says that).
        let succeeded = format!("succeeded on attempt {}", done.attempt);
        done.restart_count = before.restart_count;
        done.recovery_count = before.recovery_count;
        done.exit_code = Some(0);
        done.failure_reason = None;
        if done.started_at.is_none() {
            done.started_at = before.task_started_at_ms.map(time);
        }
        done.finished_at = Some(time(now_ms));
        done.message = Some(succeeded);
    }
    let launched = after.launched_attempt >= after.task_first_attempt;
    let rec = &mut after.tasks[now];
    rec.phase = if launched || after.phase.is_terminal() || after.phase == JobPhase::Cancelling {
        TaskPhase::of_job(after.phase)
    } else {
        TaskPhase::Pending
    };
    // As the job's `attempt`: the current attempt, also while a back-off waits to launch it
    // (a restore derives where the task began from it).
    rec.attempt = if launched {
        (after.attempt - after.task_first_attempt + 1).max(1)
    } else {
        0
    };
    rec.restart_count = after.restart_count;
    rec.recovery_count = after.recovery_count;
    if now == was {
        if let Some(code) = change.exit_code {
            rec.exit_code = code;
        }
        if let Some(reason) = &change.failure_reason {
            rec.failure_reason = reason.clone();
        }
        if change.message.is_some() {
            rec.message = change.message.clone();
        }
    } else {
        rec.message = Some("waiting for a launch slot".into());
    }
    if rec.started_at.is_none() {
        rec.started_at = after.task_started_at_ms.map(time);
    }
    if rec.phase.is_terminal() && rec.finished_at.is_none() {
        rec.finished_at = Some(time(now_ms));
    }
    if after.schedule_state == ScheduleState::Done {
        let why = match after.phase {
            JobPhase::Succeeded => None,
            JobPhase::Cancelled => Some("skipped: the job was cancelled".to_string()),
            phase => Some(format!(
                "skipped: task {}/{count} {} ended {phase}",
                now + 1,
                after.tasks[now].name
            )),
        };
        if let Some(why) = why {
            for rec in after.tasks[now + 1..].iter_mut() {
                if !rec.phase.is_terminal() {
                    rec.phase = TaskPhase::Skipped;
                    rec.finished_at = Some(time(now_ms));
                    rec.message = Some(why.clone());
                }
            }
        }
    }
}

/// The job-wide restart and recovery counts of `row`: the sums over a pipeline's tasks (the
/// row holds the current task's), or the row's own for a job of one task.
pub fn totals(row: &JobRow) -> (i32, i32) {
    if row.tasks.is_empty() {
        return (row.restart_count, row.recovery_count);
    }
    row.tasks.iter().fold((0, 0), |(r, c), t| {
        (r + t.restart_count, c + t.recovery_count)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ExecutorKind, ManagedJobSpec, RecoverySpec, TaskSpec};
    use crate::executor::Outcome;
    use crate::lifecycle::{after_outcome, deadline_exceeded, decide::deadline_ms};
    use std::time::Duration;

    fn pipeline_row() -> JobRow {
        let mut store = crate::store::Store::in_memory().unwrap();
        let spec = ManagedJobSpec {
            env: vec![crate::api::EnvVar {
                name: "A".into(),
                value: "job".into(),
            }],
            recovery: RecoverySpec {
                max_restarts_on_errors: 5,
                max_recoveries: None,
            },
            tasks: ["a", "b", "c"]
                .into_iter()
                .map(|n| TaskSpec {
                    name: n.into(),
                    run: Some("true".into()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let mut row = store.upsert("u", "ns", "p", 1, &spec).unwrap().row;
        row.phase = JobPhase::Running;
        row.schedule_state = ScheduleState::Alive;
        row.attempt = 1;
        row.launched_attempt = 1;
        row.task_started_at_ms = Some(1_000);
        row.started_at_ms = Some(1_000);
        row
    }

    /// Applies `t`'s change as the store does (the fields this module reads), then `follow`.
    fn apply(before: &JobRow, t: &crate::lifecycle::Transition, now: i64) -> JobRow {
        let c = &t.change;
        let mut after = before.clone();
        after.phase = c.phase.unwrap_or(after.phase);
        after.schedule_state = c.schedule.unwrap_or(after.schedule_state);
        after.message = c.message.clone().unwrap_or(after.message.clone());
        after.attempt = c.attempt.unwrap_or(after.attempt);
        after.restart_count = c.restart_count.unwrap_or(after.restart_count);
        after.recovery_count = c.recovery_count.unwrap_or(after.recovery_count);
        if let Some(i) = c.task_index {
            after.task_index = i;
            after.task_first_attempt = after.attempt;
            after.task_started_at_ms = None;
        }
        follow(before, c, &mut after, now);
        after
    }

    #[test]
    fn a_task_environment_is_merged_over_the_jobs() {
        let mut row = pipeline_row();
        row.spec.tasks[1].env = vec![
            crate::api::EnvVar {
                name: "A".into(),
                value: "task".into(),
            },
            crate::api::EnvVar {
                name: "B".into(),
                value: "b".into(),
            },
        ];
        let env = |i| row.spec.task(i).env;
        assert_eq!(env(0).len(), 1);
        assert_eq!(env(0)[0].value, "job");
        let merged = env(1);
        assert_eq!(
            merged
                .iter()
                .map(|v| (v.name.as_str(), v.value.as_str()))
                .collect::<Vec<_>>(),
            [("A", "task"), ("B", "b")]
        );
        assert_eq!(row.spec.executor(), ExecutorKind::Local);
        assert_eq!(row.spec.task(1).label().unwrap(), "task 2/3 b");
    }

    #[test]
    fn a_success_moves_to_the_next_task_which_waits_for_a_launch_slot() {
        let row = pipeline_row();
        let t = after_outcome(&row, 1, &Outcome::Succeeded, 5_000, Duration::from_secs(1));
        assert_eq!(t.change.task_index, Some(1));
        assert_eq!(
            (t.change.phase, t.change.schedule),
            (Some(JobPhase::Starting), Some(ScheduleState::AliveWaiting))
        );
        let after = apply(&row, &t, 5_000);
        let phases: Vec<_> = after.tasks.iter().map(|t| t.phase).collect();
        assert_eq!(
            phases,
            [TaskPhase::Succeeded, TaskPhase::Pending, TaskPhase::Pending]
        );
        assert_eq!(after.tasks[0].exit_code, Some(0));
        assert_eq!(after.tasks[0].attempt, 1);
        assert!(after.tasks[0].finished_at.is_some());
        assert!(
            after.message.starts_with(
                "task 1/3 a: succeeded on attempt 1; waiting for a launch slot to start task 2/3 b"
            ),
            "{}",
            after.message
        );
        assert_eq!(progress(&after).unwrap(), "2/3 b");
        assert_eq!(task_attempt(&after, after.attempt), 1);
    }

    #[test]
    fn each_task_spends_its_own_budget_and_a_failure_skips_the_rest() {
        let mut row = pipeline_row();
        row.spec.tasks[1].recovery = Some(RecoverySpec {
            max_restarts_on_errors: 0,
            max_recoveries: Some(0),
        });
        // Task a used 2 restarts of the job's 5; task b has none of its own.
        row.restart_count = 2;
        row.attempt = 3;
        row.launched_attempt = 3;
        let t = after_outcome(&row, 3, &Outcome::Succeeded, 5_000, Duration::from_secs(1));
        let mut b = apply(&row, &t, 5_000);
        assert_eq!((b.restart_count, b.task_first_attempt), (0, 4));
        assert_eq!(b.tasks[0].restart_count, 2);
        b.phase = JobPhase::Running;
        b.schedule_state = ScheduleState::Alive;
        b.launched_attempt = 4;
        let failed = Outcome::Failed {
            code: 2,
            reason: "ExitCode".into(),
            detail: None,
        };
        let t = after_outcome(&b, 4, &failed, 6_000, Duration::from_secs(1));
        assert_eq!(
            t.change.phase,
            Some(JobPhase::Failed),
            "task b allows no restart"
        );
        let done = apply(&b, &t, 6_000);
        let phases: Vec<_> = done.tasks.iter().map(|t| t.phase).collect();
        assert_eq!(
            phases,
            [TaskPhase::Succeeded, TaskPhase::Failed, TaskPhase::Skipped]
        );
        assert_eq!(done.tasks[1].exit_code, Some(2));
        assert_eq!(done.tasks[1].attempt, 1);
        assert!(
            done.message.starts_with("task 2/3 b: attempt 1"),
            "{}",
            done.message
        );
        assert_eq!(
            done.tasks[2].message.as_deref(),
            Some("skipped: task 2/3 b ended Failed")
        );
        assert_eq!(totals(&done), (2, 0));
    }

    /// A pipeline's stored messages name the task: a decision that compares what it would write
    /// with the row must compare the stored form, or it writes the same message in a loop.
    #[test]
    fn an_unchanged_wait_of_a_pipeline_task_writes_nothing() {
        use crate::lifecycle::{Action, Observed, decide::Context, next_action};
        let mut row = pipeline_row();
        row.phase = JobPhase::Starting;
        row.schedule_state = ScheduleState::Alive;
        let observed = Observed::Unschedulable {
            workload: "pod/p-1-0-1".into(),
            message: "0/4 nodes are available".into(),
        };
        let cx = Context {
            now_ms: 10_000,
            executor_enabled: true,
            create_is_idempotent: true,
            backoff_base: Duration::from_secs(1),
            stop_after_exit: false,
            launch_timeout: Duration::from_secs(600),
            max_launch_timeouts: 3,
            run_slot_wanted: false,
        };
        let Action::Apply(t) = next_action(&row, Some(&observed), &cx) else {
            panic!("the first sight of the wait is written");
        };
        let after = apply(&row, &t, 10_000);
        assert!(
            after.message.starts_with("task 1/3 a: waiting for a node"),
            "{}",
            after.message
        );
        assert!(
            matches!(
                next_action(&after, Some(&observed), &cx),
                Action::Wait { .. }
            ),
            "the same wait again writes nothing"
        );
    }

    #[test]
    fn a_task_deadline_counts_from_the_tasks_first_start() {
        let mut row = pipeline_row();
        row.spec.active_deadline_seconds = Some(100);
        row.spec.tasks[0].active_deadline_seconds = Some(10);
        row.task_started_at_ms = Some(50_000);
        assert_eq!(deadline_ms(&row), Some(60_000));
        assert!(
            deadline_exceeded(&row)
                .change
                .message
                .unwrap()
                .contains("the task ran past its activeDeadlineSeconds (10 s)")
        );
        row.task_started_at_ms = Some(95_000);
        assert_eq!(deadline_ms(&row), Some(101_000), "the job's comes first");
    }
}
