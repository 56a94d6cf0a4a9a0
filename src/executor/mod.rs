//! Executors: how a job's workload runs, behind one interface ([`Executor`]), one module per
//! kind (as Kueue's `GenericJob` integrations are):
//!
//! - [`local`]: `setup` then `run` under `sh`, a process group of its own on the controller node;
//! - [`pod`]: the Pods of each attempt (one, or one per node of a multi-node job), observed by
//!   the operator's one shared Pod watch (`operator::pod_watch`).
//!
//! The job controller asks its executor what it [`observe`](Executor::observe)s of the current
//! attempt's members (kind-neutral: [`crate::lifecycle::Observed`]), lets
//! [`crate::lifecycle::next_action`] decide, and asks the executor to
//! [`launch`](Executor::launch) or [`stop`](Executor::stop), having it
//! [`keep_logs`](Executor::keep_logs) first when [`crate::lifecycle::keep_logs`] says so. [`any`] is the only place that
//! chooses an executor by kind ([`for_job`], [`member_names`]); what the rest of the operator
//! knows of a kind is declared once, in [`crate::api::ExecutorFacts`].
//!
//! A new kind is a module implementing [`Executor`], its variant of [`AnyExecutor`] (a few
//! lines in [`any`]) and its variant of `api::ExecutorKind` with its facts.

use std::future::Future;
use std::time::Duration;

use crate::lifecycle::{JobRow, Observed, Refused};
use crate::store::{Store, StoreError};

pub mod any;
pub mod contain;
pub mod local;
pub mod output;
pub mod pod;

pub use any::{AnyExecutor, for_job, member_names};

/// Why an executor could not observe, launch or stop (a refused or failed create is no error:
/// see [`Launched`]).
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// The store could not be read (what the Pod watch recorded).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No Kubernetes client could be built (no kubeconfig, no in-cluster credentials).
    #[error("kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

impl ExecutorError {
    /// True when the state dir fails (disk full, I/O error): worth trying again later.
    pub fn is_storage_failure(&self) -> bool {
        matches!(self, ExecutorError::Store(e) if e.is_storage_failure())
    }
}

/// Result of an executor's operation.
pub type Result<T, E = ExecutorError> = std::result::Result<T, E>;

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
    /// [`Observed::CreateFailed`] with the time of the next try, and the job
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
/// [`pod::PodExecutor`]; the job controller drives one of them ([`AnyExecutor`]).
pub trait Executor {
    /// True when creating an attempt's workload twice adopts the first (a Pod's deterministic
    /// name), so an attempt not observed after its launch intent is created again instead of
    /// counted lost.
    fn create_is_idempotent(&self) -> bool;

    /// True when an attempt that ended may leave processes behind (a local script's background
    /// or detached children): the job controller then [`stop`](Executor::stop)s the job's
    /// workloads before it records the outcome. False for Pods (their containers end with
    /// them, and a finished Pod is kept for its logs).
    fn stops_after_exit(&self) -> bool;

    /// Called once when the job controller starts, before anything is observed (a local
    /// executor becomes a child subreaper, so that its attempts' detached processes are
    /// reparented to it).
    fn prepare(&mut self) {}

    /// What exists now of `attempt` of `job`: every member, by rank. `store` holds what the
    /// operator's Pod watch saw.
    fn observe(
        &mut self,
        store: &Store,
        job: &JobRow,
        attempt: i32,
    ) -> impl Future<Output = Result<Observed>>;

    /// Creates `attempt`'s workload (the launch intent is already recorded), once: a failure
    /// that may pass is [`Launched::Failed`], never retried inside (the job controller decides
    /// when, see [`Launched`]).
    fn launch(&mut self, job: &JobRow, attempt: i32) -> impl Future<Output = Result<Launched>>;

    /// Resolves when the workload may have changed on its own (a local process exited). An
    /// executor whose changes come through the operator's watch (a SIGUSR1) never resolves.
    fn changed(&mut self) -> impl Future<Output = ()>;

    /// Stops every attempt of `job` (SIGTERM or a Pod delete, up to `grace`, then SIGKILL; a
    /// zero `grace` removes at once). Called again until it returns [`Stop::Gone`].
    fn stop(
        &mut self,
        store: &Store,
        job: &JobRow,
        grace: Duration,
    ) -> impl Future<Output = Result<Stop>>;

    /// Keeps the end of the output of `attempt` of `job` in the state dir, so that it outlives
    /// the workload (a pod job's container logs, [`pod::logs`]), when
    /// [`crate::lifecycle::keep_logs`] says so. Best effort and bounded in time: a failure is
    /// logged and keeps nothing, and never fails or holds up the job. By default nothing (a
    /// local job's output is written to the state dir as it runs).
    fn keep_logs(&mut self, store: &Store, job: &JobRow, attempt: i32) -> impl Future<Output = ()> {
        let _ = (store, job, attempt);
        std::future::ready(())
    }
}
