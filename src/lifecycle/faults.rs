//! Wrong changes, for the tests that must check what the rest of the crate does with one: the
//! store refusing an illegal move, the property model (`tests/scheduler_props.rs`) re-introducing
//! a bug into what a transition returns to see that its invariants catch it. Nothing in `src/`
//! outside tests calls these: every real change comes from [`super::transitions`].

use crate::api::{JobPhase, ScheduleState};

use super::change::Change;
use super::reason::Reason;

/// A change for `reason` to `phase` and `schedule` (None: unchanged), nothing else.
pub fn change(reason: Reason, phase: Option<JobPhase>, schedule: Option<ScheduleState>) -> Change {
    let mut c = Change::because(reason);
    c.phase = phase;
    c.schedule = schedule;
    c
}

/// `c` with another reason.
pub fn with_reason(mut c: Change, reason: Reason) -> Change {
    c.reason = reason;
    c
}

/// `c` moving to `phase` instead (None: leaving the phase).
pub fn with_phase(mut c: Change, phase: Option<JobPhase>) -> Change {
    c.phase = phase;
    c
}

/// `c` moving to `schedule` instead (None: leaving the schedule state).
pub fn with_schedule(mut c: Change, schedule: Option<ScheduleState>) -> Change {
    c.schedule = schedule;
    c
}

/// `c` moving a pipeline to task `index` instead (None: staying).
pub fn with_task_index(mut c: Change, index: Option<i32>) -> Change {
    c.task_index = index;
    c
}

/// `c` without counting the crash it counts.
pub fn without_crash(mut c: Change) -> Change {
    c.controller_crashed = false;
    c
}

/// `c` also clearing the recorded job controller.
pub fn clearing_controller(mut c: Change) -> Change {
    c.controller = Some(None);
    c
}

/// Any change, field by field: for tests that need a record in a given state without driving
/// it there (the GitOps samples: a plausible status for each phase).
#[derive(Clone, Debug)]
pub struct Builder(Change);

impl Builder {
    /// A change for `reason`, nothing else.
    pub fn new(reason: Reason) -> Builder {
        Builder(Change::because(reason))
    }

    /// Moves to `phase` and `schedule`.
    pub fn to(mut self, phase: JobPhase, schedule: ScheduleState) -> Builder {
        self.0.phase = Some(phase);
        self.0.schedule = Some(schedule);
        self
    }

    /// Writes `message`.
    pub fn message(mut self, message: &str) -> Builder {
        self.0.message = Some(message.into());
        self
    }

    /// Writes `attempt`.
    pub fn attempt(mut self, attempt: i32) -> Builder {
        self.0.attempt = Some(attempt);
        self
    }

    /// Records that attempts up to `attempt` were launched (`launched_attempt`).
    pub fn launched(mut self, attempt: i32) -> Builder {
        self.0.launched_attempt = Some(attempt);
        self
    }

    /// Writes the recovery count.
    pub fn recovery_count(mut self, n: i32) -> Builder {
        self.0.recovery_count = Some(n);
        self
    }

    /// Writes the exit code.
    pub fn exit_code(mut self, code: Option<i32>) -> Builder {
        self.0.exit_code = Some(code);
        self
    }

    /// Writes the failure reason.
    pub fn failure_reason(mut self, reason: &str) -> Builder {
        self.0.failure_reason = Some(Some(super::reason::Failure::parse(reason)));
        self
    }

    /// Records that the workload `workload` ran (its start time, if unset).
    pub fn started(mut self, workload: super::outcome::Workload) -> Builder {
        self.0.started_now = true;
        self.0.workload = Some(Some(workload));
        self
    }

    /// The change.
    pub fn build(self) -> Change {
        self.0
    }
}
