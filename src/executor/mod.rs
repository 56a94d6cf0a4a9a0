//! Executors: how a job's workload runs, behind one interface ([`Executor`]).
//!
//! - [`local`]: `setup` then `run` under `sh`, a process group of its own on the controller node;
//! - [`pod`]: one Pod per attempt, observed by the operator's one shared Pod watch.
//!
//! The job controller asks its executor what it [`observe`](Executor::observe)s of the current
//! attempt, lets [`crate::lifecycle::next_action`] decide, and asks the executor to
//! [`launch`](Executor::launch) or [`stop`](Executor::stop).

use std::future::Future;
use std::time::Duration;

use crate::lifecycle::{FailureReason, Observed};
use crate::store::{JobRow, Store};

pub mod contain;
pub mod local;
pub mod pod;

/// How an attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every part exited 0.
    Succeeded,
    /// The setup script (or an init container) failed.
    SetupFailed {
        /// Exit code.
        code: i32,
        /// CamelCase reason.
        reason: String,
        /// Which part failed, when the executor knows (e.g. "init container fetch exited with
        /// code 2").
        detail: Option<String>,
    },
    /// The workload itself failed (counts against maxRestartsOnErrors).
    Failed {
        /// Exit code (128 + signal for a signal).
        code: i32,
        /// CamelCase reason, e.g. `ExitCode`, `OOMKilled`.
        reason: String,
        /// Which part failed, when the executor knows (e.g. "container sidecar was OOM-killed
        /// (exit code 0)").
        detail: Option<String>,
    },
    /// The node refused to run the workload (a Pod ended Failed before any container ran:
    /// `OutOfcpu`, `UnexpectedAdmissionError`, `SysctlForbidden`...). A workload error, like
    /// [`Outcome::Failed`]: it uses maxRestartsOnErrors and backs off; never a tight relaunch loop.
    Refused {
        /// The node's CamelCase reason.
        reason: String,
        /// The node's message.
        message: String,
    },
    /// The workload can never start as specified (an invalid image name, a container config
    /// that references what does not exist): retrying cannot help, the job fails its precheck
    /// and the workload is removed.
    Invalid {
        /// The kubelet's CamelCase reason, e.g. `InvalidImageName`.
        reason: String,
        /// What is wrong, naming the container.
        message: String,
    },
    /// The workload was taken away (preemption, eviction, node loss): a recovery, bounded by
    /// maxRecoveries.
    Lost {
        /// Sentence saying what happened.
        reason: String,
    },
}

/// The executor refused to start an attempt, for good (retrying cannot help).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// `status.failureReason`.
    pub reason: FailureReason,
    /// What was refused and why, for `status.message`.
    pub message: String,
}

/// How a create of an attempt's workload ([`Executor::launch`]) went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Launched {
    /// Issued: the workload exists (or existed already under its deterministic name, and is
    /// adopted).
    Created,
    /// Refused for good: retrying cannot help (a quota, an admission policy, an invalid
    /// template, a namespace being deleted).
    Refused(Refused),
    /// Failed, and may succeed later (the API answered 5xx, e.g. a failing admission webhook,
    /// or could not be reached). Not retried inside: the executor then observes the attempt as
    /// [`crate::lifecycle::Observed::CreateFailed`] with the time of the next try, and the job
    /// controller decides again, so a retry counts against the launch deadline and stops at
    /// once on a cancel or a delete.
    Failed {
        /// What the API said.
        message: String,
    },
}

/// Where a stop ([`Executor::stop`]) stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Every workload of the job is gone. `forced`: what had to be forced, one sentence each
    /// (e.g. a Pod stuck terminating on a node that is not Ready, force-deleted).
    Gone {
        /// Sentences for the job's final message and Event.
        forced: Vec<String>,
    },
    /// Some are still terminating; `waiting_on` names one when known.
    Stopping {
        /// E.g. "Pod x-1-1 on node n1 to terminate".
        waiting_on: Option<String>,
    },
}

/// One way of running a job's attempts. Implemented by [`local::LocalExecutor`] and
/// [`pod::PodExecutor`]; the job controller drives one of them.
pub trait Executor {
    /// True when creating an attempt's workload twice adopts the first (a Pod's deterministic
    /// name), so an attempt not observed after its launch intent is created again instead of
    /// counted lost.
    const CREATE_IS_IDEMPOTENT: bool;

    /// True when an attempt that ended may leave processes behind (a local script's background
    /// or detached children): the job controller then [`stop`](Executor::stop)s the job's
    /// workloads before it records the outcome. False for Pods (their containers end with
    /// them, and a finished Pod is kept for its logs).
    const STOPS_AFTER_EXIT: bool;

    /// What exists now of `attempt` of `job`. `store` holds what the operator's Pod watch saw.
    fn observe(
        &mut self,
        store: &Store,
        job: &JobRow,
        attempt: i32,
    ) -> impl Future<Output = anyhow::Result<Observed>>;

    /// Creates `attempt`'s workload (the launch intent is already recorded), once: a failure
    /// that may pass is [`Launched::Failed`], never retried inside (the job controller decides
    /// when, see [`Launched`]).
    fn launch(
        &mut self,
        job: &JobRow,
        attempt: i32,
    ) -> impl Future<Output = anyhow::Result<Launched>>;

    /// Resolves when the workload may have changed on its own (a local process exited). An
    /// executor whose changes come through the operator's watch (a SIGUSR1) never resolves.
    fn changed(&mut self) -> impl Future<Output = ()>;

    /// Stops every attempt of `job` (SIGTERM or a Pod delete, up to `grace`, then SIGKILL; a
    /// zero `grace` removes at once). Called again until it returns [`Stop::Gone`].
    fn stop(&mut self, job: &JobRow, grace: Duration)
    -> impl Future<Output = anyhow::Result<Stop>>;
}
