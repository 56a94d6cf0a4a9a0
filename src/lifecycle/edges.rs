//! The legal moves of both state machines (docs/design.md#two-state-machines), as tables:
//! [`SCHEDULE_EDGES`] and [`PHASE_EDGES`], the (phase, schedule state) pairs a job may be in
//! ([`legal_state`]), and the guard of a compare-and-set ([`Expect`]). [`check`] holds a move
//! against all of them; every change the store writes passes it
//! ([`super::change::apply`]), so an illegal move is an error and is never written.

use crate::api::{JobPhase, ScheduleState};

use super::reason::Reason;
use super::record::JobRow;

/// The state a compare-and-set expects to find. A Done job never matches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expect {
    /// Accepted current phases (empty = any).
    pub phases: Vec<JobPhase>,
    /// Accepted current schedule states (empty = any).
    pub schedule: Vec<ScheduleState>,
}

impl Expect {
    /// Expect exactly this phase and schedule state.
    pub fn exactly(phase: JobPhase, schedule: ScheduleState) -> Expect {
        Expect {
            phases: vec![phase],
            schedule: vec![schedule],
        }
    }

    /// Expect the job to be in one of these schedule states, any phase.
    pub fn schedule(states: &[ScheduleState]) -> Expect {
        Expect {
            phases: vec![],
            schedule: states.to_vec(),
        }
    }

    /// Expect the row exactly as read (its phase and schedule state).
    pub fn unchanged(row: &JobRow) -> Expect {
        Expect::exactly(row.phase, row.schedule_state)
    }

    /// True when `row` is in an expected state (and not Done: nothing leaves Done).
    pub fn matches(&self, row: &JobRow) -> bool {
        row.schedule_state != ScheduleState::Done
            && (self.phases.is_empty() || self.phases.contains(&row.phase))
            && (self.schedule.is_empty() || self.schedule.contains(&row.schedule_state))
    }
}

/// The legal edges of the schedule state machine: the main line
/// `Inactive -> Waiting -> Launching -> Alive`, a relaunch `Alive -> AliveWaiting -> Launching`,
/// a launch lost before it ran `Launching -> AliveWaiting`, a run slot given back by a Pod no
/// node took `Alive -> Waiting` ([`super::transitions::node_wait_timed_out`]), a preemption
/// carried out (`Launching | AliveWaiting -> Waiting` besides that one,
/// [`super::transitions::preempted`]), a suspend (any state not Done `-> Inactive`,
/// [`super::transitions::suspended`]), and `Done` from anything not Done
/// ([`legal_schedule_edge`]). A change of phase alone is a self edge. Nothing leaves `Done`.
pub const SCHEDULE_EDGES: [(ScheduleState, ScheduleState); 13] = [
    (ScheduleState::Inactive, ScheduleState::Waiting),
    (ScheduleState::Waiting, ScheduleState::Launching),
    (ScheduleState::Launching, ScheduleState::Alive),
    (ScheduleState::Launching, ScheduleState::AliveWaiting),
    (ScheduleState::Alive, ScheduleState::AliveWaiting),
    (ScheduleState::AliveWaiting, ScheduleState::Launching),
    (ScheduleState::Alive, ScheduleState::Waiting),
    (ScheduleState::Launching, ScheduleState::Waiting),
    (ScheduleState::AliveWaiting, ScheduleState::Waiting),
    (ScheduleState::Waiting, ScheduleState::Inactive),
    (ScheduleState::Launching, ScheduleState::Inactive),
    (ScheduleState::Alive, ScheduleState::Inactive),
    (ScheduleState::AliveWaiting, ScheduleState::Inactive),
];

/// True when the schedule state may move `from -> to` ([`SCHEDULE_EDGES`], self edges, and
/// Done from anything not Done).
pub fn legal_schedule_edge(from: ScheduleState, to: ScheduleState) -> bool {
    if from == ScheduleState::Done {
        return false;
    }
    from == to || to == ScheduleState::Done || SCHEDULE_EDGES.contains(&(from, to))
}

/// The legal edges of the phase machine besides those [`legal_phase_edge`] adds (self edges;
/// any phase that is not terminal, Cancelling excepted, to Cancelling and to a failure phase):
///
/// - the main line `Pending -> Submitted -> Starting -> Running -> Succeeded`, with the first
///   launch decided before the process was recorded (`Pending -> Starting`);
/// - `Running <-> Recovering`: a relaunch after the workload was lost, a restart after an
///   error; an attempt that was never seen running also recovers (`Starting -> Recovering`)
///   and may succeed or run straight away (`Recovering -> Succeeded`);
/// - a pipeline's next task begins (`Running | Recovering -> Starting`; `Starting -> Succeeded`
///   when a task's workload ended before it was seen running);
/// - a run slot given back by a Pod no node took (`Starting | Recovering | Running -> Pending`,
///   [`super::transitions::node_wait_timed_out`]): queued again;
/// - a workload found running, lost or ended before the job's first launch was recorded: a
///   store rebuilt from a status that lagged behind its Pod (`Pending | Submitted -> Running |
///   Recovering`, `Submitted -> Succeeded`);
/// - a queued job cancelled before it started (`Pending -> Cancelled`), a cancel carried out
///   (`Cancelling -> Cancelled`), and a job whose controller kept crashing while it was
///   cancelled (`Cancelling -> FailedController`);
/// - a store that lost the job finding a final status on its object keeps it
///   (`Pending -> Succeeded | Cancelled`, [`super::submit`]);
/// - a suspend (`Pending | Submitted | Starting | Running | Recovering -> Suspended`), its
///   resume (`Suspended -> Pending`), a suspended job cancelled (`Suspended -> Cancelled`), and
///   a preemption carried out before the first launch was recorded (`Submitted -> Pending`).
pub const PHASE_EDGES: [(JobPhase, JobPhase); 30] = [
    (JobPhase::Pending, JobPhase::Submitted),
    (JobPhase::Pending, JobPhase::Starting),
    (JobPhase::Submitted, JobPhase::Starting),
    (JobPhase::Starting, JobPhase::Running),
    (JobPhase::Running, JobPhase::Succeeded),
    (JobPhase::Running, JobPhase::Recovering),
    (JobPhase::Recovering, JobPhase::Running),
    (JobPhase::Starting, JobPhase::Recovering),
    (JobPhase::Recovering, JobPhase::Succeeded),
    (JobPhase::Running, JobPhase::Starting),
    (JobPhase::Recovering, JobPhase::Starting),
    (JobPhase::Starting, JobPhase::Succeeded),
    (JobPhase::Starting, JobPhase::Pending),
    (JobPhase::Recovering, JobPhase::Pending),
    (JobPhase::Running, JobPhase::Pending),
    (JobPhase::Pending, JobPhase::Running),
    (JobPhase::Pending, JobPhase::Recovering),
    (JobPhase::Submitted, JobPhase::Running),
    (JobPhase::Submitted, JobPhase::Recovering),
    (JobPhase::Submitted, JobPhase::Succeeded),
    (JobPhase::Pending, JobPhase::Cancelled),
    (JobPhase::Cancelling, JobPhase::Cancelled),
    (JobPhase::Pending, JobPhase::Suspended),
    (JobPhase::Submitted, JobPhase::Suspended),
    (JobPhase::Starting, JobPhase::Suspended),
    (JobPhase::Running, JobPhase::Suspended),
    (JobPhase::Recovering, JobPhase::Suspended),
    (JobPhase::Suspended, JobPhase::Pending),
    (JobPhase::Suspended, JobPhase::Cancelled),
    (JobPhase::Submitted, JobPhase::Pending),
];

/// True when the phase may move `from -> to`: a self edge, an edge of [`PHASE_EDGES`], any
/// phase that is not terminal (Cancelling excepted) to Cancelling or to a failure phase,
/// Cancelling to FailedController, and a Pending job to the final status its object already
/// shows ([`super::submit`]). Nothing leaves a terminal phase.
pub fn legal_phase_edge(from: JobPhase, to: JobPhase) -> bool {
    if from.is_terminal() {
        return false;
    }
    from == to
        || PHASE_EDGES.contains(&(from, to))
        || (from == JobPhase::Cancelling && to == JobPhase::FailedController)
        || (from != JobPhase::Cancelling && (to == JobPhase::Cancelling || to.is_failure()))
        || (from == JobPhase::Pending && to.is_terminal())
}

/// True when a job may be in `phase` and `schedule` together (`cancel_requested`: its cancel
/// is persisted): Done exactly with a terminal phase; Inactive only while Pending or Suspended,
/// Waiting only while Pending, Suspended only Inactive, and Pending only queued or being
/// admitted (Inactive, Waiting, Launching); Submitted (a
/// controller runs, the first launch is not recorded) only holding or asking for its first
/// launch slot (Launching, AliveWaiting after a lost store); Cancelling only after a persisted
/// cancel request.
pub fn legal_state(phase: JobPhase, schedule: ScheduleState, cancel_requested: bool) -> bool {
    (schedule == ScheduleState::Done) == phase.is_terminal()
        && (schedule != ScheduleState::Waiting || phase == JobPhase::Pending)
        && (schedule != ScheduleState::Inactive
            || matches!(phase, JobPhase::Pending | JobPhase::Suspended))
        && (phase != JobPhase::Suspended || schedule == ScheduleState::Inactive)
        && (phase != JobPhase::Pending
            || matches!(
                schedule,
                ScheduleState::Inactive | ScheduleState::Waiting | ScheduleState::Launching
            ))
        && (phase != JobPhase::Submitted
            || matches!(
                schedule,
                ScheduleState::Launching | ScheduleState::AliveWaiting
            ))
        && (phase != JobPhase::Cancelling || cancel_requested)
}

/// Why the store refused a change: it would break the state machines.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("illegal transition {reason}: {from_phase}/{from_schedule} -> {to_phase}/{to_schedule}")]
pub struct IllegalTransition {
    /// Why it was asked for.
    pub reason: Reason,
    /// Phase before.
    pub from_phase: JobPhase,
    /// Schedule state before.
    pub from_schedule: ScheduleState,
    /// Phase asked for.
    pub to_phase: JobPhase,
    /// Schedule state asked for.
    pub to_schedule: ScheduleState,
}

/// Checks the move of `row` to `to` (phase, schedule state) for `reason`: the schedule edge
/// and the phase edge are legal, and `to` is a legal state.
pub fn check(
    row: &JobRow,
    reason: Reason,
    to: (JobPhase, ScheduleState),
) -> Result<(), IllegalTransition> {
    let (to_phase, to_schedule) = to;
    let legal = legal_schedule_edge(row.schedule_state, to_schedule)
        && legal_phase_edge(row.phase, to_phase)
        && legal_state(to_phase, to_schedule, row.cancel_requested);
    if legal {
        Ok(())
    } else {
        Err(IllegalTransition {
            reason,
            from_phase: row.phase,
            from_schedule: row.schedule_state,
            to_phase,
            to_schedule,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tables_refuse_what_the_design_forbids() {
        use JobPhase::*;
        // Nothing leaves a terminal phase or Done.
        for p in JobPhase::ALL.iter().copied().filter(|p| p.is_terminal()) {
            assert!(JobPhase::ALL.iter().all(|&to| !legal_phase_edge(p, to)));
        }
        assert!(!legal_schedule_edge(
            ScheduleState::Done,
            ScheduleState::Done
        ));
        // Back to Submitted, or from Cancelling to anything but its end.
        assert!(!legal_phase_edge(Running, Submitted));
        assert!(!legal_phase_edge(Cancelling, Running));
        assert!(legal_phase_edge(Cancelling, Cancelled));
        assert!(!legal_phase_edge(Starting, Submitted));
        // Pending only while queued or admitted: never Running -> Pending while Alive.
        assert!(legal_phase_edge(Running, Pending));
        assert!(!legal_state(Pending, ScheduleState::Alive, false));
        assert!(!legal_state(Pending, ScheduleState::AliveWaiting, false));
        assert!(legal_state(Pending, ScheduleState::Launching, false));
        assert!(!legal_state(Cancelling, ScheduleState::Alive, false));
        assert!(!legal_state(Submitted, ScheduleState::Alive, false));
        assert!(!legal_state(Running, ScheduleState::Waiting, false));
        assert!(!legal_state(Succeeded, ScheduleState::Alive, false));
    }
}
