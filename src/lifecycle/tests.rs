//! Scenarios across the lifecycle's files: a pipeline driven through its named transitions,
//! their application to the record and the job controller's decisions.

use std::time::Duration;

use crate::api::{
    ExecutorKind, JobPhase, ManagedJobSpec, RecoverySpec, ScheduleState, TaskPhase, TaskSpec,
};

use super::deadlines::deadline_ms;
use super::outcome::{Evidence, Observed, Outcome};
use super::record::JobRow;
use super::tasks::{progress, task_attempt, totals};
use super::transitions::{after_outcome, deadline_exceeded};

fn pipeline_row() -> JobRow {
    let spec = ManagedJobSpec {
        env: vec![crate::api::EnvVar {
            name: "A".into(),
            value: "job".into(),
        }],
        recovery: RecoverySpec {
            max_restarts_on_errors: 5,
            max_recoveries: None,
            max_ignored: None,
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
    let object = crate::lifecycle::record::Object {
        uid: "u",
        namespace: "ns",
        name: "p",
        generation: 1,
        spec: &spec,
        created_at_ms: 0,
    };
    let mut row = JobRow::new(&object, 0);
    row.id = 1;
    row.phase = JobPhase::Running;
    row.schedule_state = ScheduleState::Alive;
    row.attempt = 1;
    row.launched_attempt = 1;
    row.task_started_at_ms = Some(1_000);
    row.started_at_ms = Some(1_000);
    row
}

/// Applies `t`'s change as the store does.
fn apply(before: &JobRow, t: &crate::lifecycle::Transition, now: i64) -> JobRow {
    crate::lifecycle::change::apply(before, &t.change, now).expect("a legal change")
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
        max_ignored: None,
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
        evidence: Evidence::exit("run", false, 2, "ExitCode"),
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
    use crate::lifecycle::decide::{Action, Context, next_action};
    let mut row = pipeline_row();
    row.phase = JobPhase::Starting;
    row.schedule_state = ScheduleState::Alive;
    let observed = Observed::Unschedulable {
        pod: "p-1-0-1".into(),
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
        stop_grace: Duration::from_secs(5),
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
