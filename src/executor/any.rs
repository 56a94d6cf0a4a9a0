//! The executor of a job by its kind ([`for_job`]): the one place that matches on
//! [`ExecutorKind`] to choose what runs a job, and the one type the job controller drives
//! ([`AnyExecutor`], delegating to each kind's module).

use std::time::Duration;

use super::{Executor, Launched, Result, Stop, local, pod};
use crate::api::ExecutorKind;
use crate::lifecycle::{JobRow, Observed};
use crate::state_dir::StateDir;
use crate::store::{Settings, Store};

/// The executor of one job, whatever its kind: what the job controller drives.
pub enum AnyExecutor {
    /// A local job.
    Local(local::LocalExecutor),
    /// A pod job (one Pod per attempt, or one per node of a multi-node job).
    Pod(pod::PodExecutor),
}

/// The executor for a job of `kind` driven by a job controller of the state dir `dir`, with the
/// operator's `settings`.
pub fn for_job(kind: ExecutorKind, dir: &StateDir, settings: &Settings) -> AnyExecutor {
    match kind {
        ExecutorKind::Local => AnyExecutor::Local(local::LocalExecutor::new(dir)),
        ExecutorKind::Pod => AnyExecutor::Pod(
            pod::PodExecutor::new(settings.shard.clone(), settings.gang_scheduling)
                .keeping_logs(dir, settings.kept_log_bytes),
        ),
    }
}

/// The names of the API objects `row`'s current attempt may run as (a pod job's Pods, every
/// rank, with the names Pods had before an upgrade): what the world check keeps. None for a
/// local job.
pub fn member_names(row: &JobRow) -> Vec<String> {
    match row.executor {
        ExecutorKind::Pod => pod::member_names(row, row.current_attempt()),
        ExecutorKind::Local => Vec::new(),
    }
}

macro_rules! each {
    ($self:ident, $e:ident => $body:expr) => {
        match $self {
            AnyExecutor::Local($e) => $body,
            AnyExecutor::Pod($e) => $body,
        }
    };
}

impl Executor for AnyExecutor {
    fn create_is_idempotent(&self) -> bool {
        each!(self, e => e.create_is_idempotent())
    }

    fn stops_after_exit(&self) -> bool {
        each!(self, e => e.stops_after_exit())
    }

    fn prepare(&mut self) {
        each!(self, e => e.prepare())
    }

    async fn observe(&mut self, store: &Store, job: &JobRow, attempt: i32) -> Result<Observed> {
        each!(self, e => e.observe(store, job, attempt).await)
    }

    async fn launch(&mut self, job: &JobRow, attempt: i32) -> Result<Launched> {
        each!(self, e => e.launch(job, attempt).await)
    }

    async fn changed(&mut self) {
        each!(self, e => e.changed().await)
    }

    async fn stop(&mut self, store: &Store, job: &JobRow, grace: Duration) -> Result<Stop> {
        each!(self, e => e.stop(store, job, grace).await)
    }

    async fn keep_logs(&mut self, store: &Store, job: &JobRow, attempt: i32) {
        each!(self, e => e.keep_logs(store, job, attempt).await)
    }
}
