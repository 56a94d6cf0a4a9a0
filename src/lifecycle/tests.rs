//! Scenarios across the lifecycle's files: a pipeline driven through its named transitions,
//! their application to the record and the job controller's decisions.

use std::time::Duration;

use crate::api::{
    ExecutorKind, JobPhase, ManagedJobSpec, RecoverySpec, ScheduleState, TaskPhase, TaskSpec,
};

use super::deadlines::deadline_ms;
use super::members::{MemberState, Observed};
use super::outcome::{Evidence, Outcome, Workload};
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
        resource_version: "",
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

/// Drives a local job of `spec`, running attempt 1 from `now`, through its job controller's
/// decisions until it is Done or `until` passes; every attempt's workload ends with `end`.
/// Returns the row and the workloads launched (the first included).
fn drive(spec: ManagedJobSpec, end: Outcome, until: i64) -> (JobRow, i32) {
    use super::decide::{Action, Context, next_action};
    let object = crate::lifecycle::record::Object {
        uid: "u",
        namespace: "ns",
        name: "j",
        generation: 1,
        spec: &spec,
        created_at_ms: 0,
        resource_version: "",
    };
    let mut row = JobRow::new(&object, 0);
    row.id = 1;
    row.phase = JobPhase::Running;
    row.schedule_state = ScheduleState::Alive;
    row.attempt = 1;
    row.launched_attempt = 1;
    row.started_at_ms = Some(0);
    row.controller_pid = Some(10);
    let (mut now, mut launched, mut running_since) = (0, 1, Some(0));
    while row.schedule_state != ScheduleState::Done && now < until {
        let cx = Context {
            now_ms: now,
            executor_enabled: true,
            create_is_idempotent: false,
            backoff_base: Duration::from_secs(1),
            stop_after_exit: false,
            launch_timeout: Duration::from_secs(600),
            max_launch_timeouts: 3,
            run_slot_wanted: false,
            stop_grace: Duration::from_secs(5),
            claim: crate::lifecycle::claim::Gate::OPEN,
            operator_alive: true,
        };
        if row.schedule_state == ScheduleState::AliveWaiting {
            row = apply(&row, &crate::lifecycle::admit(&row), now);
            continue;
        }
        let attempt = row.current_attempt();
        // A workload runs 100 ms, then ends with `end`.
        let observed = if !crate::lifecycle::observes(&row) {
            None
        } else if row.launched_attempt < attempt {
            Some(Observed::not_found())
        } else if running_since.is_some_and(|t| now >= t + 100) {
            Some(Observed::one(None, MemberState::Ended(end.clone())))
        } else {
            Some(Observed::one(
                Some(super::outcome::Workload::Process(100 + attempt)),
                MemberState::Running,
            ))
        };
        match next_action(&row, observed.as_ref(), &cx) {
            Action::Apply(t) | Action::StopThen(t) | Action::RemoveThen(t) => {
                row = apply(&row, &t, now)
            }
            Action::Launch { intent, .. } => {
                if let Some(t) = intent {
                    row = apply(&row, &t, now);
                }
                launched += 1;
                running_since = Some(now);
            }
            Action::Wait { until_ms } => {
                now = until_ms.unwrap_or(now + 100).min(
                    running_since
                        .map_or(i64::MAX, |t| if t + 100 > now { t + 100 } else { i64::MAX }),
                );
            }
            Action::Exit => break,
        }
    }
    (row, launched)
}

/// Issue 30, class 3: `run: 'exit 1'`, `maxRestartsOnErrors: 10`, `activeDeadlineSeconds: 5`.
/// Three attempts ran (back-offs of 1 s and 2 s), the fourth was decided (a back-off of 4 s)
/// when the deadline came: the job fails DeadlineExceeded on time, and its status says attempt 3
/// and restartCount 2, the attempts that ran (before: attempt 4, restartCount 3).
#[test]
fn a_deadline_during_a_back_off_shows_only_the_attempts_that_ran() {
    let spec = ManagedJobSpec {
        run: Some("exit 1".into()),
        recovery: RecoverySpec {
            max_restarts_on_errors: 10,
            max_recoveries: None,
            max_ignored: None,
        },
        active_deadline_seconds: Some(5),
        ..Default::default()
    };
    let exit1 = Outcome::Failed {
        code: 1,
        reason: "ExitCode".into(),
        detail: None,
        evidence: Evidence::exit("run", false, 1, "ExitCode"),
    };
    let (row, launched) = drive(spec, exit1, 60_000);
    assert_eq!(row.phase, JobPhase::Failed);
    assert_eq!(
        row.failure_reason.as_ref().map(|f| f.as_str()),
        Some("DeadlineExceeded")
    );
    assert_eq!(launched, 3, "three workloads ran");
    // The store keeps the restart decided during the back-off (its budget spent)...
    assert_eq!((row.attempt, row.restart_count), (4, 3));
    // ... the status shows what ran.
    let shown = super::tasks::shown(&row);
    assert_eq!((shown.attempt, shown.restarts), (3, 2), "{}", row.message);
    assert_eq!(row.attempts.len(), 3, "each attempt that ran ended once");
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
    let observed = Observed::one(
        Some(Workload::Pod("p-1-0-1".into())),
        MemberState::Unschedulable {
            message: "0/4 nodes are available".into(),
        },
    );
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
        claim: crate::lifecycle::claim::Gate::OPEN,
        operator_alive: true,
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

/// A rule's verdict names the rule in the message (so in the Event) and in the attempt's
/// record; none matching, `default`. A pipeline's task with its own rules uses only those.
#[test]
fn the_rule_that_decided_is_named_in_the_message_and_the_record() {
    use crate::api::{ExitCodeOperator, FailureAction, FailurePolicy, FailureRule, OnExitCodes};
    let rule = |name: &str, action, code| FailureRule {
        name: Some(name.into()),
        action,
        on_exit_codes: Some(OnExitCodes {
            container_name: None,
            operator: ExitCodeOperator::In,
            values: vec![code],
        }),
        ..Default::default()
    };
    let exit = |code| Outcome::Failed {
        code,
        reason: "ExitCode".into(),
        detail: None,
        evidence: Evidence::exit("run", false, code, "ExitCode"),
    };
    let mut row = pipeline_row();
    row.spec.failure_policy = Some(FailurePolicy {
        rules: vec![rule("config-error", FailureAction::FailJob, 2)],
    });
    row.spec.tasks[1].failure_policy = Some(FailurePolicy {
        rules: vec![rule("gpu-fault", FailureAction::Recover, 2)],
    });
    // Task a uses the job's rules: exit 2 fails the job at once, restarts left or not.
    let t = after_outcome(&row, 1, &exit(2), 2_000, Duration::from_secs(1));
    let failed = apply(&row, &t, 2_000);
    assert_eq!(failed.phase, JobPhase::Failed);
    assert_eq!(
        failed.failure_reason.as_ref().map(|f| f.as_str()),
        Some("FailureRule")
    );
    assert!(
        failed.message.contains("rule config-error says FailJob"),
        "{}",
        failed.message
    );
    let record = &failed.attempts[0];
    assert_eq!(
        (
            record.rule.as_str(),
            record.action.as_str(),
            record.exit_code
        ),
        ("config-error", "FailJob", Some(2))
    );
    assert_eq!(record.task.as_deref(), Some("a"));
    // Exit 3 matches nothing: the default restart, named so.
    let t = after_outcome(&row, 1, &exit(3), 2_000, Duration::from_secs(1));
    let restarted = apply(&row, &t, 2_000);
    assert!(
        restarted.message.contains("rule default"),
        "{}",
        restarted.message
    );
    assert_eq!(restarted.attempts[0].rule, "default");
    // Task b has its own rules: exit 2 is a recovery there, not a failure.
    row.task_index = 1;
    row.task_first_attempt = 1;
    let t = after_outcome(&row, 1, &exit(2), 2_000, Duration::from_secs(1));
    let recovering = apply(&row, &t, 2_000);
    assert_eq!(recovering.phase, JobPhase::Recovering);
    assert_eq!(
        (recovering.recovery_count, recovering.restart_count),
        (1, 0)
    );
    assert!(
        recovering.message.contains("rule gpu-fault"),
        "{}",
        recovering.message
    );
    assert_eq!(recovering.tasks[1].recovery_count, 1);
}

/// The failure rules' model (docs/design.md#failure-rules): a job of one or two tasks, each
/// with random budgets and a random rule list (a second task may have its own), whose attempts
/// end with random outcomes, driven through the job controller's decisions
/// ([`next_action`](crate::lifecycle::next_action)) and the operator's admissions until Done.
/// Asserted at every ended attempt and over the whole run:
///
/// 1. the action recorded is the first matching rule's (an oracle written apart from
///    `lifecycle::rules`), else the default's (also when the rule's `Ignore` has no budget
///    left), and the record names that rule, or `default`;
/// 2. no budget is ever exceeded: per task, restarts <= `maxRestartsOnErrors`, recoveries <=
///    `maxRecoveries`, ignored relaunches <= `maxIgnored`;
/// 3. attempts of a task never exceed 1 + the restarts, recoveries and ignored relaunches it
///    allows (with `maxRecoveries` unset: 1 + restarts + ignored + the losses drawn);
/// 4. no tight loop: every relaunch but a task's first recovery and first ignored one waits
///    out a stored back-off (`backoff_until_ms` in the future);
/// 5. a `FailJob` ends the job at once (reason `FailureRule`), a spent budget ends it too;
/// 6. the operator's own restarts (a job controller resumed after a hand-over) count nothing.
mod failure_rules_model {
    use std::time::Duration;

    use proptest::prelude::*;

    use crate::api::{
        ExitCodeOperator, FailureAction, FailurePolicy, FailureRule, JobPhase, ManagedJobSpec,
        OnExitCodes, OnPodCondition, RecoverySpec, ScheduleState, TaskSpec,
    };
    use crate::lifecycle::decide::{Action, Context, next_action};
    use crate::lifecycle::members::{MemberState, Observed};
    use crate::lifecycle::outcome::{Evidence, Outcome, PartExit, Workload};
    use crate::lifecycle::reason::FailureReason;
    use crate::lifecycle::record::{JobRow, Object};
    use crate::lifecycle::rules::{DEFAULT_RULE, Verdict};
    use crate::lifecycle::tasks::current_task;
    use crate::lifecycle::transitions as t;

    /// An attempt's end over a small universe: `main` and `side` exit codes, a disruption, an
    /// OOM kill, a refusal.
    #[derive(Clone, Debug)]
    enum End {
        Exit { main: i32, side: i32, oom: bool },
        Lost { disrupted: bool },
        Refused,
        Succeeded,
    }

    fn outcome(end: &End) -> Outcome {
        match end {
            End::Succeeded => Outcome::Succeeded,
            End::Exit { main, side, oom } => {
                let part = |name: &str, code: i32, oom: bool| PartExit {
                    name: name.into(),
                    init: false,
                    code,
                    reason: if oom {
                        "OOMKilled".into()
                    } else if code == 0 {
                        "Completed".into()
                    } else {
                        "Error".into()
                    },
                };
                let (code, reason) = if *oom {
                    (*main, "OOMKilled")
                } else if *main != 0 {
                    (*main, "Error")
                } else {
                    (*side, "Error")
                };
                Outcome::Failed {
                    code,
                    reason: reason.into(),
                    detail: None,
                    evidence: Evidence {
                        exits: vec![part("main", *main, *oom), part("side", *side, false)],
                        ..Default::default()
                    },
                }
            }
            End::Lost { disrupted } => Outcome::Lost {
                reason: "Pod p: lost".into(),
                evidence: Evidence {
                    conditions: if *disrupted {
                        vec![("DisruptionTarget".into(), "True".into())]
                    } else {
                        vec![]
                    },
                    reasons: vec![if *disrupted {
                        "EvictionByEvictionAPI".into()
                    } else {
                        "PodDeleted".into()
                    }],
                    ..Default::default()
                },
            },
            End::Refused => Outcome::Refused {
                reason: "OutOfcpu".into(),
                message: "no room".into(),
                evidence: Evidence::reason("OutOfcpu"),
            },
        }
    }

    /// Does `rule` match `end`? Said from the universe, not from `lifecycle::rules`.
    fn oracle(rule: &FailureRule, end: &End) -> bool {
        if let Some(on) = &rule.on_exit_codes {
            let End::Exit { main, side, .. } = end else {
                return false;
            };
            return [("main", *main), ("side", *side)].iter().any(|(n, c)| {
                *c != 0
                    && on.container_name.as_deref().is_none_or(|want| want == *n)
                    && (on.operator == ExitCodeOperator::In) == on.values.contains(c)
            });
        }
        if rule.on_pod_conditions.is_some() {
            return matches!(end, End::Lost { disrupted: true });
        }
        let reasons = rule.on_reasons.as_ref().unwrap();
        let word = |code: i32| if code == 0 { "Completed" } else { "Error" };
        let given: Vec<&str> = match end {
            End::Exit { main, side, oom } => vec![
                if *oom { "OOMKilled" } else { "Error" },
                if *oom { "OOMKilled" } else { word(*main) },
                word(*side),
            ],
            End::Lost { disrupted: true } => vec!["EvictionByEvictionAPI"],
            End::Lost { disrupted: false } => vec!["PodDeleted"],
            End::Refused => vec!["OutOfcpu"],
            End::Succeeded => vec![],
        };
        reasons.iter().any(|r| given.contains(&r.as_str()))
    }

    fn default_verdict(end: &End) -> Verdict {
        match end {
            End::Succeeded => Verdict::Succeeded,
            End::Lost { .. } => Verdict::Recover,
            _ => Verdict::Restart,
        }
    }

    fn end() -> impl Strategy<Value = End> {
        prop_oneof![
            4 => (0i32..5, 0i32..5, prop::bool::weighted(0.2))
                .prop_map(|(main, side, oom)| End::Exit { main: if main == 0 && side == 0 && !oom { 1 } else { main }, side, oom }),
            2 => any::<bool>().prop_map(|disrupted| End::Lost { disrupted }),
            1 => Just(End::Refused),
            1 => Just(End::Succeeded),
        ]
    }

    fn rule() -> impl Strategy<Value = FailureRule> {
        let action = prop::sample::select(FailureAction::ALL.to_vec());
        let codes = (
            prop::option::of(prop::sample::select(vec!["main", "side"])),
            any::<bool>(),
            prop::collection::btree_set(1i32..5, 1..3),
        )
            .prop_map(|(c, not_in, v)| {
                (
                    Some(OnExitCodes {
                        container_name: c.map(str::to_string),
                        operator: if not_in {
                            ExitCodeOperator::NotIn
                        } else {
                            ExitCodeOperator::In
                        },
                        values: v.into_iter().collect(),
                    }),
                    None,
                    None,
                )
            });
        let conditions = Just((
            None,
            Some(vec![OnPodCondition {
                type_: "DisruptionTarget".into(),
                status: None,
            }]),
            None,
        ));
        let reasons = prop::sample::subsequence(
            vec![
                "OOMKilled",
                "OutOfcpu",
                "PodDeleted",
                "EvictionByEvictionAPI",
                "Error",
            ],
            1..3,
        )
        .prop_map(|r| {
            (
                None,
                None,
                Some(r.into_iter().map(str::to_string).collect()),
            )
        });
        (
            action,
            prop_oneof![3 => codes, 1 => conditions, 2 => reasons],
            prop::option::of("[a-z]{1,6}"),
        )
            .prop_map(
                |(action, (on_exit_codes, on_pod_conditions, on_reasons), name)| FailureRule {
                    name: name.map(|n| format!("r-{n}")),
                    action,
                    on_exit_codes,
                    on_pod_conditions,
                    on_reasons,
                },
            )
    }

    fn policy() -> impl Strategy<Value = Option<FailurePolicy>> {
        prop::option::of(prop::collection::vec(rule(), 1..5).prop_map(|mut rules| {
            // Names unique, as the API requires.
            for (i, r) in rules.iter_mut().enumerate() {
                if let Some(n) = &mut r.name {
                    n.push_str(&format!("-{i}"));
                }
            }
            FailurePolicy { rules }
        }))
    }

    fn budget() -> impl Strategy<Value = RecoverySpec> {
        (
            0i32..3,
            prop::option::of(0i32..3),
            prop::option::of(0i32..3),
        )
            .prop_map(|(max_restarts_on_errors, max_recoveries, max_ignored)| {
                RecoverySpec {
                    max_restarts_on_errors,
                    max_recoveries,
                    max_ignored,
                }
            })
    }

    fn spec() -> impl Strategy<Value = ManagedJobSpec> {
        (
            budget(),
            policy(),
            prop::option::of((prop::option::of(budget()), policy())),
        )
            .prop_map(|(recovery, failure_policy, second)| {
                let task = |name: &str, recovery, failure_policy| TaskSpec {
                    name: name.into(),
                    run: Some("true".into()),
                    recovery,
                    failure_policy,
                    ..Default::default()
                };
                match second {
                    None => ManagedJobSpec {
                        run: Some("true".into()),
                        recovery,
                        failure_policy,
                        ..Default::default()
                    },
                    Some((budget, own)) => ManagedJobSpec {
                        recovery,
                        failure_policy,
                        tasks: vec![task("first", None, None), task("second", budget, own)],
                        ..Default::default()
                    },
                }
            })
    }

    fn cx(now_ms: i64) -> Context {
        Context {
            now_ms,
            executor_enabled: true,
            create_is_idempotent: false,
            backoff_base: Duration::from_secs(1),
            stop_after_exit: false,
            launch_timeout: Duration::from_secs(600),
            max_launch_timeouts: 3,
            run_slot_wanted: false,
            stop_grace: Duration::from_secs(5),
            claim: crate::lifecycle::claim::Gate::OPEN,
            operator_alive: true,
        }
    }

    fn write(
        row: &JobRow,
        tr: &crate::lifecycle::Transition,
        now: i64,
    ) -> Result<JobRow, TestCaseError> {
        prop_assert!(
            tr.expect.matches(row),
            "{:?} decided on a row its guard refuses",
            tr.change.reason
        );
        crate::lifecycle::change::apply(row, &tr.change, now)
            .map_err(|e| TestCaseError::fail(format!("illegal: {e}")))
    }

    /// Brings a relaunched job (or a pipeline's next task) back to Running, as the operator's
    /// passes and the job controller would: wait out a back-off (asserting there is one when
    /// it must be), get a launch slot, launch, run.
    fn relaunch(
        mut row: JobRow,
        mut now: i64,
        handover: bool,
    ) -> Result<(JobRow, i64), TestCaseError> {
        for _ in 0..10 {
            if handover {
                // A hand-over: the controller died with its operator and is resumed; nothing
                // is counted.
                let before = row.clone();
                row = write(&row, &t::controller_resumed(&row, false), now)?;
                prop_assert_eq!(
                    (
                        row.restart_count,
                        row.recovery_count,
                        row.ignored_count,
                        row.attempt
                    ),
                    (
                        before.restart_count,
                        before.recovery_count,
                        before.ignored_count,
                        before.attempt
                    )
                );
                row = write(&row, &t::controller_started(&row, 11, 2), now)?;
            }
            match (row.phase, row.schedule_state) {
                (JobPhase::Running, ScheduleState::Alive) => return Ok((row, now)),
                (_, ScheduleState::AliveWaiting) => row = write(&row, &t::admit(&row), now)?,
                _ => {
                    let attempt = row.current_attempt();
                    let observed = if row.launched_attempt < attempt {
                        Observed::not_found()
                    } else {
                        Observed::one(Some(Workload::Process(100 + attempt)), MemberState::Running)
                    };
                    match next_action(&row, Some(&observed), &cx(now)) {
                        Action::Wait {
                            until_ms: Some(until),
                        } => now = until,
                        Action::Apply(tr) => row = write(&row, &tr, now)?,
                        Action::Launch {
                            intent: Some(tr), ..
                        } => row = write(&row, &tr, now)?,
                        other => prop_assert!(false, "unexpected {:?} in {:?}", other, row.state()),
                    }
                }
            }
        }
        Err(TestCaseError::fail("no progress towards Running"))
    }

    /// Invariant 6 (issue 30): the status shows only attempts that started, `launched` of them, and the
    /// budgets those spent; a store rebuilt from it decides the pending relaunch again as it
    /// was (same attempt, same launch, same counts).
    fn shows_what_started(row: &JobRow, launched: i32) -> Result<(), TestCaseError> {
        let shown = crate::lifecycle::tasks::shown(row);
        prop_assert_eq!(shown.attempt, launched, "{}", row.message);
        let pending = crate::lifecycle::tasks::pending_relaunch(row);
        prop_assert_eq!(pending.is_some(), row.launched_attempt < row.attempt);
        let (r, c, i) = if row.tasks.is_empty() {
            (row.restart_count, row.recovery_count, row.ignored_count)
        } else {
            (
                crate::lifecycle::tasks::totals(row).0,
                crate::lifecycle::tasks::totals(row).1,
                crate::lifecycle::tasks::ignored_total(row),
            )
        };
        let less = i32::from(matches!(
            pending,
            Some(
                crate::lifecycle::tasks::Pending::Restart
                    | crate::lifecycle::tasks::Pending::Recovery
                    | crate::lifecycle::tasks::Pending::Ignored
            )
        ));
        prop_assert_eq!(
            shown.restarts + shown.recoveries + shown.ignored + less,
            r + c + i
        );
        if row.schedule_state == ScheduleState::Done {
            return Ok(());
        }
        let status = crate::api::ManagedJobStatus {
            job_id: Some(row.id),
            phase: Some(row.phase),
            schedule_state: Some(row.schedule_state),
            attempt: shown.attempt,
            restart_count: shown.restarts,
            recovery_count: shown.recoveries,
            ignored_count: shown.ignored,
            attempts: row.attempts.clone(),
            current_task: row.spec.is_pipeline().then_some(row.task_index),
            tasks: shown.tasks.clone(),
            ..Default::default()
        };
        let object = Object {
            uid: "u",
            namespace: "ns",
            name: "j",
            generation: 1,
            spec: &row.spec,
            created_at_ms: 0,
            resource_version: "",
        };
        let back = crate::lifecycle::restore(&object, &status, 0).expect("a job id");
        if pending.is_some() {
            prop_assert_eq!(
                (back.attempt, back.launched_attempt),
                (row.attempt, row.launched_attempt)
            );
        } else {
            prop_assert_eq!(back.attempt, row.attempt);
        }
        prop_assert_eq!(
            (back.restart_count, back.recovery_count, back.ignored_count),
            (row.restart_count, row.recovery_count, row.ignored_count)
        );
        Ok(())
    }

    fn run(
        spec: ManagedJobSpec,
        ends: Vec<End>,
        handovers: Vec<bool>,
    ) -> Result<(), TestCaseError> {
        let object = Object {
            uid: "u",
            namespace: "ns",
            name: "j",
            generation: 1,
            spec: &spec,
            created_at_ms: 0,
            resource_version: "",
        };
        let mut row = JobRow::new(&object, 0);
        row.id = 1;
        row.phase = JobPhase::Running;
        row.schedule_state = ScheduleState::Alive;
        row.attempt = 1;
        row.launched_attempt = 1;
        row.started_at_ms = Some(0);
        row.task_started_at_ms = Some(0);
        let mut now = 1_000;
        let mut ends = ends.into_iter();
        // Attempts, and losses drawn, in the current task; workloads launched in the job.
        let (mut attempts, mut losses, mut launched) = (1, 0, 1);
        for step in 0.. {
            prop_assert!(step < 200, "the job never ended");
            let end = ends.next().unwrap_or(End::Succeeded);
            let task = current_task(&row);
            let (budget, policy) = (task.recovery.clone(), task.failure_policy.cloned());
            let max_ignored = budget.max_ignored();
            if matches!(end, End::Lost { .. }) {
                losses += 1;
            }
            let observed = Observed::one(None, MemberState::Ended(outcome(&end)));
            let Action::Apply(tr) = next_action(&row, Some(&observed), &cx(now)) else {
                return Err(TestCaseError::fail("an ended attempt is written"));
            };
            // 1. The first matching rule decides, unless it is an Ignore without budget.
            let record = tr
                .change
                .attempt_record
                .clone()
                .expect("every end is recorded");
            let first = policy.as_ref().and_then(|p| {
                p.rules
                    .iter()
                    .position(|r| oracle(r, &end))
                    .map(|i| (i, &p.rules[i]))
            });
            let (want, rule) = match (&end, first) {
                (End::Succeeded, _) | (_, None) => {
                    (default_verdict(&end), DEFAULT_RULE.to_string())
                }
                (_, Some((_, r)))
                    if r.action == FailureAction::Ignore && row.ignored_count >= max_ignored =>
                {
                    (default_verdict(&end), DEFAULT_RULE.to_string())
                }
                (_, Some((i, r))) => (
                    Verdict::from(r.action),
                    crate::lifecycle::rules::label(r, i),
                ),
            };
            prop_assert_eq!(
                &record.action,
                want.as_str(),
                "{:?} under {:?}",
                end,
                policy
            );
            REACHED.with(|r| {
                let mut r = r.borrow_mut();
                r.insert(format!(
                    "{want}/{}",
                    if rule == DEFAULT_RULE {
                        "default"
                    } else {
                        "rule"
                    }
                ));
                if first.is_some() && rule == DEFAULT_RULE && !matches!(end, End::Succeeded) {
                    r.insert("ignore-spent".into());
                }
            });
            prop_assert_eq!(&record.rule, &rule);
            let before = row.clone();
            row = write(&row, &tr, now)?;
            shows_what_started(&row, launched)?;
            if row.schedule_state == ScheduleState::Done
                && row
                    .failure_reason
                    .as_ref()
                    .is_some_and(|f| f.as_str() == "RecoveryBudgetSpent")
            {
                // A job that kept losing its workload says what it lost it to last.
                prop_assert!(
                    row.message
                        .contains(&format!("last cause: {}", record.reason)),
                    "{}",
                    row.message
                );
                REACHED.with(|r| r.borrow_mut().insert("recoveries-spent".into()));
            }
            if handovers.get(step).copied().unwrap_or(false) {
                REACHED.with(|r| r.borrow_mut().insert("handover".into()));
            }
            // 2. Budgets.
            prop_assert!(row.restart_count <= budget.max_restarts_on_errors);
            prop_assert!(
                budget
                    .max_recoveries
                    .is_none_or(|m| row.recovery_count <= m)
            );
            prop_assert!(row.ignored_count <= max_ignored);
            // 5. FailJob ends at once.
            if want == Verdict::FailJob {
                prop_assert_eq!(row.schedule_state, ScheduleState::Done);
                prop_assert_eq!(
                    row.failure_reason.as_ref().map(|f| f.as_str()),
                    Some(FailureReason::FailureRule.as_str())
                );
            }
            if row.schedule_state == ScheduleState::Done {
                prop_assert!(row.phase.is_terminal());
                return Ok(());
            }
            // 4. No tight loop.
            let first_free = (want == Verdict::Recover && row.recovery_count == 1)
                || (want == Verdict::Ignore && row.ignored_count == 1)
                || row.task_index != before.task_index;
            if !first_free {
                prop_assert!(
                    row.backoff_until_ms.is_some_and(|b| b > now),
                    "relaunch {:?} without a back-off: {}",
                    want,
                    row.message
                );
            }
            if row.task_index != before.task_index {
                (attempts, losses) = (0, 0);
            }
            let handover = handovers.get(step).copied().unwrap_or(false);
            // Sometimes the deadline comes while the relaunch waits (its back-off, its launch
            // slot): the job ends showing only the attempts that ran.
            if step % 7 == 3 {
                let ended = write(&row, &t::deadline_exceeded(&row), now)?;
                shows_what_started(&ended, launched)?;
                REACHED.with(|r| r.borrow_mut().insert("deadline-while-pending".into()));
            }
            (row, now) = relaunch(row, now, handover)?;
            attempts += 1;
            launched += 1;
            shows_what_started(&row, launched)?;
            // 3. Attempts within what the task allows.
            let task = current_task(&row);
            let allowed = 1
                + task.recovery.max_restarts_on_errors
                + task
                    .recovery
                    .max_recoveries
                    .unwrap_or(losses + task.recovery.max_ignored() + 100)
                + task.recovery.max_ignored();
            let bound = match task.recovery.max_recoveries {
                Some(_) => allowed,
                None => {
                    1 + task.recovery.max_restarts_on_errors
                        + task.recovery.max_ignored()
                        + step as i32
                        + 1
                }
            };
            prop_assert!(
                attempts <= bound,
                "attempt {} of a task allowing {}",
                attempts,
                bound
            );
            prop_assert_eq!(
                crate::lifecycle::tasks::task_attempt(&row, row.attempt),
                attempts
            );
        }
        Ok(())
    }

    thread_local! {
        /// What the runs reached: `<verdict>/<rule|default>`, `ignore-spent`,
        /// `recoveries-spent`, `handover`.
        static REACHED: std::cell::RefCell<std::collections::BTreeSet<String>> = Default::default();
    }

    /// The generators reach every verdict by rule and by default, an Ignore without budget
    /// left, a spent recovery budget and a hand-over.
    #[test]
    fn the_model_reaches_every_verdict() {
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases: 512,
            failure_persistence: None,
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x2323_2323),
            ..ProptestConfig::default()
        });
        let strategy = (
            spec(),
            prop::collection::vec(end(), 0..20),
            prop::collection::vec(any::<bool>(), 0..20),
        );
        runner
            .run(&strategy, |(spec, ends, handovers)| {
                run(spec, ends, handovers)
            })
            .unwrap();
        let reached = REACHED.with(|r| r.borrow().clone());
        for want in [
            "Succeeded/default",
            "Restart/default",
            "Recover/default",
            "FailJob/rule",
            "Restart/rule",
            "Recover/rule",
            "Ignore/rule",
            "ignore-spent",
            "recoveries-spent",
            "handover",
            "deadline-while-pending",
        ] {
            assert!(reached.contains(want), "never reached {want}: {reached:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 512,
            failure_persistence: None,
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x2323_2323),
            ..ProptestConfig::default()
        })]
        #[test]
        fn rules_decide_within_budgets_and_never_loop(
            spec in spec(),
            ends in prop::collection::vec(end(), 0..20),
            handovers in prop::collection::vec(any::<bool>(), 0..20),
        ) {
            run(spec, ends, handovers)?;
        }
    }
}

/// A back-off counts from when the workload it waited for is gone: a launch timed out at 10 s
/// whose Pod took 1.5 s to be removed backs off until 1.5 s + the back-off after the decision,
/// so the jobs queued behind it get the launch slot meanwhile; a transition written at once
/// keeps its back-off, and one without a back-off is unchanged.
#[test]
fn a_back_off_counts_from_the_removal_not_from_the_decision() {
    let mut row = pipeline_row();
    row.phase = JobPhase::Starting;
    row.schedule_state = ScheduleState::Launching;
    let t = crate::lifecycle::transitions::launch_timed_out(
        &row,
        1,
        None,
        "bound to node n, which has not started it",
        Duration::from_secs(3),
        3,
        10_000,
        Duration::from_millis(200),
    );
    assert_eq!(t.change.backoff_until_ms, Some(Some(10_200)));
    let late = t.clone().written_at(10_000, 11_500);
    assert_eq!(late.change.backoff_until_ms, Some(Some(11_700)));
    assert_eq!(late.change.message, t.change.message);
    assert_eq!(
        t.clone().written_at(10_000, 10_000).change.backoff_until_ms,
        Some(Some(10_200))
    );
    // A clock that stepped back never shortens it.
    assert_eq!(
        t.clone().written_at(10_000, 9_000).change.backoff_until_ms,
        Some(Some(10_200))
    );
    let done = crate::lifecycle::transitions::deadline_exceeded(&row);
    assert_eq!(
        done.clone().written_at(0, 5_000).change.backoff_until_ms,
        done.change.backoff_until_ms
    );
}

// ---- issue 32: stopping without failing ----

/// Issue 32: a suspend of a running job stops it gracefully (no observation, no launch),
/// then it is Suspended + Inactive with its run slot and controller given back, the stopped
/// attempt recorded `Suspended`, the next attempt not launched and every budget as it was;
/// resumed it waits again (Pending + Waiting) in its place.
#[test]
fn a_suspend_stops_the_job_without_failing_it_and_a_resume_queues_it_in_its_place() {
    let mut r = super::decide::tests::row(JobPhase::Running, ScheduleState::Alive);
    r.attempt = 3;
    r.launched_attempt = 3;
    r.restart_count = 1;
    r.recovery_count = 1;
    r.running_since_ms = Some(5_000);
    r.spec.suspend = true;
    r.suspended_by = Some("kubectl-patch".into());
    assert!(!super::decide::observes(&r));
    let a = super::decide::next_action(&r, None, &super::decide::tests::cx(false));
    let super::decide::Action::StopThen(t) = &a else {
        panic!("{a:?}")
    };
    assert_eq!(t.change.reason, super::reason::Reason::Suspended);
    let after = crate::lifecycle::apply(&r, &t.change, 20_000).unwrap();
    assert_eq!(
        (after.phase, after.schedule_state),
        (JobPhase::Suspended, ScheduleState::Inactive)
    );
    assert_eq!((after.attempt, after.launched_attempt), (4, 3));
    assert_eq!((after.restart_count, after.recovery_count), (1, 1));
    assert_eq!(after.controller_pid, None);
    assert_eq!(after.running_since_ms, None);
    assert_eq!(
        after.attempts.last().map(|a| a.action.as_str()),
        Some("Suspended")
    );
    assert!(after.message.contains("kubectl-patch"), "{}", after.message);
    // Its controller, if any were left, only exits; the operator resumes it.
    assert_eq!(
        super::decide::next_action(&after, None, &super::decide::tests::cx(false)),
        super::decide::Action::Exit
    );
    let mut held = after.clone();
    held.spec.suspend = false;
    let super::supervise::SuspendRoute::Apply(t) = crate::lifecycle::suspend_route(&held) else {
        panic!("a resume is the operator's to write")
    };
    let resumed = crate::lifecycle::apply(&held, &t.change, 30_000).unwrap();
    assert_eq!(
        (resumed.phase, resumed.schedule_state),
        (JobPhase::Pending, ScheduleState::Waiting)
    );
    assert_eq!(resumed.queued_at_ms, r.queued_at_ms, "it keeps its place");
    assert_eq!((resumed.restart_count, resumed.recovery_count), (1, 1));
    // The pending attempt 4 is not shown as started, nor counted in any budget.
    let shown = crate::lifecycle::tasks::shown(&resumed);
    assert_eq!((shown.attempt, shown.restarts, shown.recoveries), (3, 1, 1));
}

/// A suspend of a job admitted but not launched yet gives its slot back without a record;
/// a waiting job is held at once by the operator, and a suspended job cancels at once.
#[test]
fn a_suspend_before_any_launch_records_no_attempt_and_a_suspended_job_cancels_at_once() {
    let mut r = super::decide::tests::row(JobPhase::Submitted, ScheduleState::Launching);
    r.spec.suspend = true;
    let super::decide::Action::StopThen(t) =
        super::decide::next_action(&r, None, &super::decide::tests::cx(true))
    else {
        panic!()
    };
    let after = crate::lifecycle::apply(&r, &t.change, 20_000).unwrap();
    assert_eq!(after.phase, JobPhase::Suspended);
    assert_eq!((after.attempt, after.attempts.len()), (0, 0));
    let mut waiting = super::decide::tests::row(JobPhase::Pending, ScheduleState::Waiting);
    waiting.spec.suspend = true;
    let super::supervise::SuspendRoute::Apply(t) = crate::lifecycle::suspend_route(&waiting) else {
        panic!()
    };
    let held = crate::lifecycle::apply(&waiting, &t.change, 20_000).unwrap();
    assert_eq!(
        (held.phase, held.schedule_state),
        (JobPhase::Suspended, ScheduleState::Inactive)
    );
    assert_eq!(
        crate::lifecycle::suspend_route(&held),
        super::supervise::SuspendRoute::Nothing
    );
    let cancel = crate::lifecycle::cancel_queued(&held);
    assert!(cancel.expect.matches(&held));
    let cancelled = crate::lifecycle::apply(&held, &cancel.change, 30_000).unwrap();
    assert_eq!(cancelled.phase, JobPhase::Cancelled);
}

/// A preemption: the pass's request is persisted (the victim's status says who takes its
/// slot), its controller stops it, and it waits again in its place with its budgets.
#[test]
fn a_preempted_job_waits_again_first_in_its_queue_with_its_budgets() {
    let mut r = super::decide::tests::row(JobPhase::Running, ScheduleState::Alive);
    r.attempt = 2;
    r.launched_attempt = 2;
    r.restart_count = 1;
    r.running_since_ms = Some(1_000);
    let t = crate::lifecycle::preempt(&r, "team-b", false, 9_000);
    assert!(t.expect.matches(&r));
    let asked = crate::lifecycle::apply(&r, &t.change, 9_000).unwrap();
    assert!(asked.preempt_requested && asked.preemptions == 1);
    assert_eq!(asked.preempted_by.as_deref(), Some("team-b"));
    assert!(!super::decide::observes(&asked));
    let super::decide::Action::StopThen(t) =
        super::decide::next_action(&asked, None, &super::decide::tests::cx(true))
    else {
        panic!()
    };
    assert_eq!(t.change.reason, super::reason::Reason::Preempted);
    let after = crate::lifecycle::apply(&asked, &t.change, 12_000).unwrap();
    assert_eq!(
        (after.phase, after.schedule_state),
        (JobPhase::Pending, ScheduleState::Waiting)
    );
    assert!(!after.preempt_requested);
    assert_eq!(
        (after.attempt, after.restart_count, after.recovery_count),
        (3, 1, 0)
    );
    assert_eq!(after.queued_at_ms, r.queued_at_ms);
    assert_eq!(
        after.attempts.last().map(|a| a.action.as_str()),
        Some("Preempted")
    );
    assert!(
        after.message.contains("team-b") && after.message.contains("8 s"),
        "{}",
        after.message
    );
    // Only a running job is taken: a relaunch in flight is not.
    let relaunching = super::decide::tests::row(JobPhase::Recovering, ScheduleState::AliveWaiting);
    assert!(
        !crate::lifecycle::preempt(&relaunching, "b", false, 1)
            .expect
            .matches(&relaunching)
    );
}

/// Only a launch whose workload was never reported may have left no trace: the job is still
/// Launching with the attempt's launch recorded (the first one, or a relaunch); not before the
/// record, and not once it was seen running.
#[test]
fn only_a_launch_never_reported_may_have_left_no_trace() {
    use super::decide::launch_unobserved;
    let mut row = pipeline_row();
    assert!(!launch_unobserved(&row), "seen running (Alive)");
    row.phase = JobPhase::Starting;
    row.schedule_state = ScheduleState::Launching;
    assert!(launch_unobserved(&row), "launch recorded, nothing reported");
    row.launched_attempt = 0;
    assert!(
        !launch_unobserved(&row),
        "launch not recorded: nothing was started"
    );
    row.phase = JobPhase::Recovering;
    row.attempt = 2;
    row.launched_attempt = 1;
    assert!(!launch_unobserved(&row), "the relaunch not recorded yet");
    row.launched_attempt = 2;
    assert!(
        launch_unobserved(&row),
        "the relaunch recorded, nothing reported"
    );
    row.schedule_state = ScheduleState::Alive;
    assert!(!launch_unobserved(&row), "the relaunch seen");
}
