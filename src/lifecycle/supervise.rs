//! What the operator does around a job's controller process and its requests, decided here and
//! carried out by the engine: a cancel's route ([`cancel_route`]), a controller's exit
//! ([`controller_exited`]) and what a job given up leaves to stop ([`stop_after_give_up`]), a
//! controller that could not be started ([`after_spawn_failure`]), and what the start-up sweep
//! does with each live job ([`at_start`]).

use std::time::Duration;

use crate::api::ScheduleState;

use super::change::Transition;
use super::clock::backoff;
use super::record::JobRow;
use super::transitions as t;

/// What a persisted cancel request of a job means for the operator (`docs/design.md`,
/// "Cancellation").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CancelRoute {
    /// Never admitted (Pending + Inactive/Waiting): write this ([`t::cancel_queued`]), which ends
    /// it Cancelled at once, without a slot or a process. A conflict means it was admitted
    /// meanwhile: wake its controller instead, which sees the persisted request.
    EndNow(Box<Transition>),
    /// It holds a run slot: wake its controller, which stops the workload and ends it.
    WakeController,
    /// It is Done already: nothing.
    Nothing,
}

/// The route of a cancel of `row` (read after its request was persisted).
pub fn cancel_route(row: &JobRow) -> CancelRoute {
    match row.schedule_state {
        ScheduleState::Inactive | ScheduleState::Waiting => {
            CancelRoute::EndNow(Box::new(t::cancel_queued(row)))
        }
        ScheduleState::Done => CancelRoute::Nothing,
        _ => CancelRoute::WakeController,
    }
}

/// What the operator does with a job's `spec.suspend` as mirrored
/// (`docs/concepts/queues-and-preemption.md`, "Stopping without failing").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SuspendRoute {
    /// Write this: a job that holds no slot is suspended at once ([`t::suspend_queued`]), or a
    /// suspended job whose `spec.suspend` is false again waits again ([`t::resumed`]). A
    /// conflict means it moved meanwhile (admitted: its controller sees the suspend).
    Apply(Box<Transition>),
    /// It holds a run slot: wake its controller, which stops its workload ([`t::suspended`]).
    WakeController,
    /// Nothing to do: as asked already, Done, or being cancelled (a cancel comes first).
    Nothing,
}

/// The route of `row`'s `spec.suspend` (read after the store mirrored it).
pub fn suspend_route(row: &JobRow) -> SuspendRoute {
    use crate::api::JobPhase;
    if row.schedule_state == ScheduleState::Done || row.cancel_requested {
        return SuspendRoute::Nothing;
    }
    match (row.spec.suspend, row.phase, row.schedule_state) {
        (true, JobPhase::Suspended, _) => SuspendRoute::Nothing,
        (true, _, ScheduleState::Inactive | ScheduleState::Waiting) => {
            SuspendRoute::Apply(Box::new(t::suspend_queued(row)))
        }
        (true, _, _) => SuspendRoute::WakeController,
        (false, JobPhase::Suspended, _) => SuspendRoute::Apply(Box::new(t::resumed(row))),
        (false, _, _) => SuspendRoute::Nothing,
    }
}

/// What the operator does when a job's controller process (`pid`) exited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControllerExit {
    /// Nothing: the job is Done, or `pid` is not its recorded controller (an older one).
    Finished,
    /// Resume the job: write this ([`t::controller_resumed`]), then start a fresh controller.
    Resume(Transition),
    /// The controller exited `max_crashes` times: write this ([`t::controller_gave_up`]) and
    /// stop the job's workload.
    GiveUp(Transition),
}

/// Why the operator learned that a job controller is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitSeen {
    /// The operator saw it exit while running (its parent, or its pidfd): a crash.
    WhileOperatorRan,
    /// The operator, starting, found it dead: it went away with the previous operator
    /// (a rollout, SIGKILL, OOM, node loss), so it is a hand-over, not a crash.
    AtOperatorStart,
}

/// Decides on the exit of job controller `pid` of `row` (`docs/design.md`, "Processes, crashes and resumption"): an exit before
/// the job is Done while the operator ran is a crash, and the `max_crashes`-th ends the job
/// FailedController; one found at the operator's start is resumed without counting.
pub fn controller_exited(
    row: &JobRow,
    pid: i32,
    max_crashes: i64,
    seen: ExitSeen,
) -> ControllerExit {
    if row.schedule_state == ScheduleState::Done || row.controller_pid != Some(pid) {
        return ControllerExit::Finished;
    }
    if seen == ExitSeen::AtOperatorStart {
        return ControllerExit::Resume(t::controller_resumed(row, false));
    }
    let crashes = row.controller_crashes + 1;
    if crashes >= max_crashes {
        ControllerExit::GiveUp(t::controller_gave_up(row, crashes))
    } else {
        ControllerExit::Resume(t::controller_resumed(row, true))
    }
}

/// How the workload of a job given up for its controller ([`ControllerExit::GiveUp`]) is
/// stopped: no workload lives for a Done job (`docs/design.md`, "The store is checked against
/// the world").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopAfterGiveUp {
    /// A local job: the engine stops its processes at once (every process of its attempt,
    /// however detached), with the operator's grace.
    LocalProcesses,
    /// A pod job: the world check deletes its running Pod (a Pod with our marks that is no live
    /// attempt's); the engine, which has no API client, asks for the check at once.
    PodsByWorldCheck,
}

/// How the workload of `row`, given up, is stopped.
pub fn stop_after_give_up(row: &JobRow) -> StopAfterGiveUp {
    if row.executor.facts().local_processes {
        StopAfterGiveUp::LocalProcesses
    } else {
        StopAfterGiveUp::PodsByWorldCheck
    }
}

/// Why a job controller process could not be started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpawnFailure {
    /// The node lacked the resources (open files, processes, memory: EMFILE, ENFILE, EAGAIN,
    /// ENOMEM) or the state dir could not be written: not the job's fault. SkyPilot's first
    /// managed-jobs scheduler failed jobs for exactly this.
    NotTheJobs,
    /// Anything else (the binary is missing, the log cannot be opened for a reason that will
    /// not pass).
    ForGood,
}

/// What to do about a job controller that could not be started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AfterSpawnFailure {
    /// Start it again after this back-off, if the job still needs a controller then
    /// ([`needs_controller`]). The job keeps its place and its slots; never a failure phase.
    Retry(Duration),
    /// Write this ([`t::controller_start_failed`]): the job ends FailedController.
    Fail(Box<Transition>),
}

/// First back-off before starting a job controller again after the node lacked the resources;
/// doubles per failure in a row up to [`SPAWN_RETRY_MAX`].
pub const SPAWN_RETRY_BASE: Duration = Duration::from_millis(500);

/// The longest back-off between attempts to start a job controller: a shortage of open files
/// or processes passes as soon as other jobs end, and a try costs one `posix_spawn`, so the job
/// waits at most this long after it passed (not a restart's 5 minutes: 2 of 400 jobs sat
/// Pending for over 8 minutes under a 256 open-files limit on a loaded machine).
pub const SPAWN_RETRY_MAX: Duration = Duration::from_secs(10);

/// Decides on the `failures`-th failure in a row (from 1) to start `row`'s job controller,
/// for `why`, with `error` the failure's text.
pub fn after_spawn_failure(
    row: &JobRow,
    failures: i32,
    why: SpawnFailure,
    error: &str,
) -> AfterSpawnFailure {
    match why {
        SpawnFailure::NotTheJobs => {
            AfterSpawnFailure::Retry(backoff(SPAWN_RETRY_BASE, failures).min(SPAWN_RETRY_MAX))
        }
        SpawnFailure::ForGood => {
            AfterSpawnFailure::Fail(Box::new(t::controller_start_failed(row, error)))
        }
    }
}

/// True when `row` needs a job controller process to be started: it holds a run slot and has
/// none recorded.
pub fn needs_controller(row: &JobRow) -> bool {
    row.schedule_state.holds_run_slot() && row.controller_pid.is_none()
}

/// What the operator, starting, finds of a job's recorded controller process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// It no longer runs (no process with that pid and start time).
    Gone,
    /// It runs the operator's own build (the same executable).
    Ours,
    /// It runs another build: a job controller of the release before a version change, whose
    /// idea of the store's schema, the settings and the workloads' files may differ from this
    /// one's (`docs/upgrades.md`).
    OtherBuild,
}

/// What the operator, starting, does with a job that holds a run slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtStart {
    /// Its recorded controller (pid, start time) still runs: adopt it (wait for its exit, as
    /// its parent would).
    Adopt {
        /// Pid.
        pid: i32,
        /// Start time, clock ticks since boot.
        start_time: u64,
    },
    /// Its recorded controller went away with the previous operator: a hand-over, decided by
    /// [`controller_exited`] with [`ExitSeen::AtOperatorStart`] (resumed, no crash counted).
    HandOver {
        /// Pid.
        pid: i32,
        /// Start time, clock ticks since boot (0 when unknown).
        start_time: u64,
    },
    /// No controller was ever recorded (a crash between the admission and the record): start
    /// one.
    Resume,
    /// Its recorded controller runs another build (a version change): stop it without its
    /// workload ([`stops_before_migration`] says how), then hand the job over as for
    /// [`AtStart::HandOver`]. The operator stops such controllers before it migrates the store
    /// (`engine::take_over`); this is for one that started after that look.
    Replace {
        /// Pid.
        pid: i32,
        /// Start time, clock ticks since boot.
        start_time: u64,
    },
}

/// The start-up sweep's choice for `row` (a job holding a run slot), given what runs of its
/// recorded controller (pid, start time).
pub fn at_start(row: &JobRow, controller: Liveness) -> AtStart {
    match (row.controller_pid, row.controller_start_time, controller) {
        (Some(pid), Some(start_time), Liveness::Ours) => AtStart::Adopt { pid, start_time },
        (Some(pid), Some(start_time), Liveness::OtherBuild) => AtStart::Replace { pid, start_time },
        (Some(pid), start, _) => AtStart::HandOver {
            pid,
            start_time: start.unwrap_or(0),
        },
        (None, _, _) => AtStart::Resume,
    }
}

/// A job controller process found on the state dir before the operator touched its store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControllerBuild {
    /// Pid.
    pub pid: i32,
    /// Start time, clock ticks since boot.
    pub start_time: u64,
    /// The identity (device, inode) of the executable it runs; None when it cannot be read.
    pub exe: Option<super::world::FileId>,
}

/// How long a job controller replaced at a version change gets to exit after SIGTERM before
/// SIGKILL. It holds no state a signal could lose (each turn re-reads the store and the
/// workload), and it has no handler: it ends at once unless the machine stalls.
pub const REPLACE_GRACE: Duration = Duration::from_secs(5);

/// The job controllers an operator starting on a state dir stops before it opens (and
/// migrates) the store: every one that runs another executable than the operator's own
/// (`own`), or whose executable cannot be read (`docs/upgrades.md`). Each is stopped with
/// SIGTERM, then SIGKILL after [`REPLACE_GRACE`]; its workload is left as it is, and the
/// start-up sweep hands its job over to a fresh controller of this build, which adopts the
/// workload ([`at_start`]: the controller is gone, a hand-over, no crash counted).
pub fn stops_before_migration(
    found: &[ControllerBuild],
    own: super::world::FileId,
) -> Vec<ControllerBuild> {
    found
        .iter()
        .filter(|c| c.exe != Some(own))
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::JobPhase;
    use crate::lifecycle::decide::tests::row;
    use crate::lifecycle::reason::Reason;

    #[test]
    fn a_controller_exit_resumes_until_the_crash_limit() {
        let ran = ExitSeen::WhileOperatorRan;
        let r = row(JobPhase::Running, ScheduleState::Alive);
        assert!(matches!(
            controller_exited(&r, 10, 3, ran),
            ControllerExit::Resume(_)
        ));
        assert_eq!(controller_exited(&r, 11, 3, ran), ControllerExit::Finished);
        let mut twice = r.clone();
        twice.controller_crashes = 2;
        assert!(matches!(
            controller_exited(&twice, 10, 3, ran),
            ControllerExit::GiveUp(_)
        ));
        // Found dead at the operator's start: a hand-over, never counted, never fatal.
        match controller_exited(&twice, 10, 3, ExitSeen::AtOperatorStart) {
            ControllerExit::Resume(t) => assert!(!t.change.controller_crashed),
            other => panic!("{other:?}"),
        }
        let done = row(JobPhase::Succeeded, ScheduleState::Done);
        assert_eq!(
            controller_exited(&done, 10, 3, ran),
            ControllerExit::Finished
        );
    }

    #[test]
    fn a_cancel_ends_a_queued_job_and_wakes_a_live_ones_controller() {
        let queued = row(JobPhase::Pending, ScheduleState::Waiting);
        match cancel_route(&queued) {
            CancelRoute::EndNow(t) => {
                assert_eq!(t.change.reason, Reason::Cancelled);
                assert_eq!(t.change.phase, Some(JobPhase::Cancelled));
            }
            other => panic!("{other:?}"),
        }
        let live = row(JobPhase::Running, ScheduleState::Alive);
        assert_eq!(cancel_route(&live), CancelRoute::WakeController);
        let done = row(JobPhase::Succeeded, ScheduleState::Done);
        assert_eq!(cancel_route(&done), CancelRoute::Nothing);
    }

    #[test]
    fn a_spawn_that_lacks_resources_backs_off_and_one_that_cannot_work_fails() {
        let r = row(JobPhase::Pending, ScheduleState::Launching);
        assert_eq!(
            after_spawn_failure(&r, 1, SpawnFailure::NotTheJobs, "EMFILE"),
            AfterSpawnFailure::Retry(SPAWN_RETRY_BASE)
        );
        assert_eq!(
            after_spawn_failure(&r, 3, SpawnFailure::NotTheJobs, "EMFILE"),
            AfterSpawnFailure::Retry(SPAWN_RETRY_BASE * 4)
        );
        // However long the shortage lasted, the next try is at most SPAWN_RETRY_MAX away.
        assert_eq!(
            after_spawn_failure(&r, 12, SpawnFailure::NotTheJobs, "EMFILE"),
            AfterSpawnFailure::Retry(SPAWN_RETRY_MAX)
        );
        match after_spawn_failure(&r, 1, SpawnFailure::ForGood, "no such file") {
            AfterSpawnFailure::Fail(t) => {
                assert_eq!(t.change.phase, Some(JobPhase::FailedController));
                assert!(t.change.message.unwrap().contains("no such file"));
            }
            other => panic!("{other:?}"),
        }
        let mut waiting = r.clone();
        waiting.controller_pid = None;
        assert!(needs_controller(&waiting));
        assert!(!needs_controller(&r), "one is recorded");
    }

    #[test]
    fn the_start_up_sweep_adopts_the_living_and_hands_over_the_dead() {
        let r = row(JobPhase::Running, ScheduleState::Alive);
        assert_eq!(
            at_start(&r, Liveness::Ours),
            AtStart::Adopt {
                pid: 10,
                start_time: 1
            }
        );
        assert_eq!(
            at_start(&r, Liveness::Gone),
            AtStart::HandOver {
                pid: 10,
                start_time: 1
            }
        );
        let mut unrecorded = r;
        unrecorded.controller_pid = None;
        assert_eq!(at_start(&unrecorded, Liveness::Gone), AtStart::Resume);
    }

    #[test]
    fn a_controller_of_another_build_is_replaced_never_adopted() {
        let r = row(JobPhase::Running, ScheduleState::Alive);
        assert_eq!(
            at_start(&r, Liveness::OtherBuild),
            AtStart::Replace {
                pid: 10,
                start_time: 1
            }
        );
        // Its exit, once stopped, is found at the operator's start: a hand-over, no crash.
        match controller_exited(&r, 10, 1, ExitSeen::AtOperatorStart) {
            ControllerExit::Resume(t) => assert!(!t.change.controller_crashed),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn before_migrating_every_controller_of_another_or_unknown_build_is_stopped() {
        let own = (1, 100);
        let c = |pid, exe| ControllerBuild {
            pid,
            start_time: 7,
            exe,
        };
        let found = [
            c(1, Some(own)),
            c(2, Some((1, 99))),
            c(3, None),
            c(4, Some((2, 100))),
        ];
        let stopped: Vec<i32> = stops_before_migration(&found, own)
            .iter()
            .map(|c| c.pid)
            .collect();
        assert_eq!(stopped, vec![2, 3, 4]);
    }
}
