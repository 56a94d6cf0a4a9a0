//! Every rule about a job's life, in one place and free of I/O (DESIGN.md sections 4 to 7).
//!
//! A job carries two state machines: the user-facing phase ([`JobPhase`]) and the scheduler's
//! state ([`ScheduleState`]). This module is their single source of truth:
//!
//! - [`reason`]: why a transition happened ([`Reason`], recorded in the history and read by the
//!   Events) and why a job failed ([`FailureReason`], `status.failureReason`).
//! - [`transitions`]: the guard ([`Expect`]) and the [`Change`] of each named transition
//!   ([`admit`], [`controller_started`], [`launch_intent`], [`running`], [`after_outcome`], ...),
//!   and the table of legal edges ([`legal_schedule_edge`], [`check_edge`]) that
//!   [`crate::store::Store::transition`] enforces: an illegal edge is an error, never written.
//! - [`restore`]: a job's row rebuilt from its object's status after the store was lost.
//! - [`decide`]: what a job controller does next ([`next_action`]) given the job's row and what
//!   its executor observes, and what the operator does when a job controller exits
//!   ([`controller_exited`]).
//! - [`world`]: the store checked against the world (objects, Pods, processes), and the
//!   fencing of stores.
//!
//! The processes only read, call these functions, and carry out the result (a compare-and-set,
//! a launch, a stop); the property test (`tests/scheduler_props.rs`) drives the same functions.
//!
//! [`JobPhase`]: crate::api::JobPhase
//! [`ScheduleState`]: crate::api::ScheduleState

pub mod decide;
pub mod reason;
pub mod restore;
pub mod tasks;
pub mod transitions;
pub mod world;

pub use decide::{
    Action, AfterRefusal, ControllerExit, DEFAULT_LAUNCH_TIMEOUT, DEFAULT_MAX_LAUNCH_TIMEOUTS,
    ExitSeen, Observed, after_refusal, controller_exited, in_backoff, launch_deadline_ms,
    next_action, observes,
};
pub use reason::{FailureReason, Reason};
pub use restore::{Restored, restore};
pub use transitions::*;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Longest back-off between restarts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// Back-off before restart number `restart` (1-based): `base x 2^(restart-1)`, capped at
/// [`MAX_BACKOFF`] (the doubling of the kubelet's CrashLoopBackOff and of the batch/v1 Job
/// controller's pod failure back-off).
pub fn backoff(base: Duration, restart: i32) -> Duration {
    let factor = 1u32 << (restart.clamp(1, 16) - 1) as u32;
    base.saturating_mul(factor).min(MAX_BACKOFF)
}

/// The earlier of two optional times (ms since epoch); None only when both are.
pub fn earliest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    a.into_iter().chain(b).min()
}

/// Milliseconds since the Unix epoch, now (the clock of every stored time).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
