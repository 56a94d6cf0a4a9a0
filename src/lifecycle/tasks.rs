//! Pipelines (`spec.tasks`, docs/design.md#pipelines): which task a job runs, how its attempts
//! are numbered within the task, and how each task's record (`status.tasks[]`) follows the job.
//!
//! A pipeline's row is the row of its current task: `restart_count` and `recovery_count` count
//! that task's restarts and recoveries (its own budgets apply), `attempt` keeps counting over
//! every task (so an attempt names one workload of the job, whatever its task), and
//! `task_first_attempt` is the attempt at which the current task began. Every change applied
//! to a record ([`super::change::apply`]) calls [`follow`]: the current task's record mirrors the job, a task
//! that ends the job ends the later ones as Skipped, and every message names its task. A job
//! of one task has no records; all of this is then the identity.

use crate::api::{JobPhase, MAX_STATUS_MESSAGE_BYTES, ScheduleState, TaskPhase, TaskView};

use super::clock::time_in_seconds as time;
use super::reason::Failure;
use super::record::JobRow;

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
        Some(label) => capped(&format!("{label}: {message}")),
        None => capped(message),
    }
}

/// `message` cut to [`MAX_STATUS_MESSAGE_BYTES`] (at a character boundary, ending `…`): a
/// status keeps every message within it, so that the largest status stays within
/// `api::MAX_STATUS_BYTES` (a kubelet's or a webhook's words quoted may be long).
pub fn capped(message: &str) -> String {
    if message.len() <= MAX_STATUS_MESSAGE_BYTES {
        return message.to_string();
    }
    let mut end = MAX_STATUS_MESSAGE_BYTES - '…'.len_utf8();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

/// `TASK` as `kubectl get mj` shows it: `2/3 train` (number from 1). None for a job of one task.
pub fn progress(row: &JobRow) -> Option<String> {
    let task = current_task(row);
    task.name
        .map(|n| format!("{}/{} {n}", task.index + 1, task.count))
}

/// What a change wrote that a task's record shows too.
#[derive(Clone, Copy, Debug, Default)]
pub struct Written<'a> {
    /// The change's message (before the task's label is added).
    pub message: Option<&'a str>,
    /// The exit code it wrote (`Some(None)`: cleared).
    pub exit_code: Option<Option<i32>>,
    /// The failure reason it wrote (`Some(None)`: cleared).
    pub failure_reason: Option<&'a Option<Failure>>,
}

/// Brings `after` (the row `before` becomes with a change, its other fields already applied;
/// `written`: what that change wrote) in line with the pipeline rules, at `now_ms`:
///
/// - the change's message is prefixed with the task it is about (`task 2/3 train: ...`), the
///   task current when the change was decided;
/// - when the change moved to the next task, the task left behind is Succeeded;
/// - the current task's record mirrors the job: its phase (Pending until it launched), attempt
///   within the task, counters, exit code, failure reason, message and times;
/// - when the job ends, every task after the current one that never ran is Skipped.
pub fn follow(before: &JobRow, after: &mut JobRow, written: Written<'_>, now_ms: i64) {
    if !after.spec.is_pipeline() {
        return;
    }
    let count = after.spec.tasks.len();
    if after.tasks.len() != count {
        after.tasks = super::record::initial_records(&after.spec);
    }
    let was = (before.task_index.max(0) as usize).min(count - 1);
    let now = (after.task_index.max(0) as usize).min(count - 1);
    if let Some(m) = written.message {
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
        done.ignored_count = before.ignored_count;
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
    rec.phase = if launched
        || after.phase.is_terminal()
        || matches!(after.phase, JobPhase::Cancelling | JobPhase::Suspended)
    {
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
    rec.ignored_count = after.ignored_count;
    if now == was {
        if let Some(code) = written.exit_code {
            rec.exit_code = code;
        }
        if let Some(reason) = written.failure_reason {
            rec.failure_reason = reason.as_ref().map(|f| f.as_str().to_string());
        }
        if let Some(m) = written.message {
            rec.message = Some(capped(m));
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

/// A relaunch decided whose attempt has not started yet (a restart's back-off, a relaunch
/// waiting for its launch slot, a pipeline's next task), by the budget it counts in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pending {
    /// A restart (`maxRestartsOnErrors`).
    Restart,
    /// A recovery (`maxRecoveries`).
    Recovery,
    /// A relaunch a rule's `Ignore` decided (`maxIgnored`).
    Ignored,
    /// Counted in no budget: a pipeline's next task, a launch timed out, a claim that lapsed.
    Uncounted,
}

impl Pending {
    /// The relaunch decided by the action `action` of an ended attempt's record
    /// (`status.attempts[].action`).
    pub fn of_action(action: &str) -> Pending {
        match action {
            "Restart" => Pending::Restart,
            "Recover" => Pending::Recovery,
            "Ignore" => Pending::Ignored,
            _ => Pending::Uncounted,
        }
    }
}

/// The relaunch `row` decided whose attempt has not started (None: its current attempt
/// started, or it never launched one): the row counts an attempt, and its budget, when it is
/// decided, and its status shows them once it starts ([`shown`]). Which budget: the action of
/// the record of the attempt before it (`attempts[]`), when that is the one that ended.
pub fn pending_relaunch(row: &JobRow) -> Option<Pending> {
    if row.attempt <= 0 || row.launched_attempt >= row.attempt {
        return None;
    }
    Some(match row.attempts.last() {
        Some(r) if r.attempt == row.attempt - 1 => Pending::of_action(&r.action),
        _ => Pending::Uncounted,
    })
}

/// What a job's status shows of its attempts and budgets ([`shown`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shown {
    /// Attempts that started, over the whole job (`status.attempt`).
    pub attempt: i32,
    /// Restarts whose attempt started (`status.restartCount`; a pipeline's: over its tasks).
    pub restarts: i32,
    /// Recoveries whose attempt started (`status.recoveryCount`).
    pub recoveries: i32,
    /// Ignored relaunches whose attempt started (`status.ignoredCount`).
    pub ignored: i32,
    /// A pipeline's task records, the current one's counts likewise (`status.tasks[]`).
    pub tasks: Vec<crate::api::TaskStatus>,
}

/// What `row`'s status shows (issue 30): only attempts that started. A relaunch decided but
/// not launched yet ([`pending_relaunch`]: a restart waiting out its back-off, a recovery
/// waiting for its launch slot) counts once its attempt starts, so a job that ends meanwhile
/// (its deadline, a cancel) shows the attempts that ran: `run: exit 1` with
/// `maxRestartsOnErrors: 10` and a 5 s deadline that ran three times shows attempt 3 and
/// restartCount 2, not the fourth attempt decided during the back-off. The store keeps the
/// decision (its budget is spent when decided, so a restart of the operator never repeats it).
pub fn shown(row: &JobRow) -> Shown {
    let pending = pending_relaunch(row);
    let less = |kind: Pending| i32::from(pending == Some(kind));
    let mut tasks = row.tasks.clone();
    let index = row.task_index.max(0) as usize;
    // The pending attempt is the current task's when the task already launched one.
    if pending.is_some()
        && row.launched_attempt >= row.task_first_attempt
        && let Some(t) = tasks.get_mut(index)
    {
        t.attempt = (t.attempt - 1).max(0);
        t.restart_count -= less(Pending::Restart);
        t.recovery_count -= less(Pending::Recovery);
        t.ignored_count -= less(Pending::Ignored);
    }
    let (restarts, recoveries, ignored) = if tasks.is_empty() {
        (
            row.restart_count - less(Pending::Restart),
            row.recovery_count - less(Pending::Recovery),
            row.ignored_count - less(Pending::Ignored),
        )
    } else {
        tasks.iter().fold((0, 0, 0), |(r, c, i), t| {
            (
                r + t.restart_count,
                c + t.recovery_count,
                i + t.ignored_count,
            )
        })
    };
    Shown {
        attempt: if pending.is_some() {
            row.launched_attempt.max(0)
        } else {
            row.attempt
        },
        restarts,
        recoveries,
        ignored,
        tasks,
    }
}

/// The job-wide count of relaunches decided by a rule's `Ignore`: the sum over a pipeline's
/// tasks, or the row's own.
pub fn ignored_total(row: &JobRow) -> i32 {
    if row.tasks.is_empty() {
        return row.ignored_count;
    }
    row.tasks.iter().map(|t| t.ignored_count).sum()
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
