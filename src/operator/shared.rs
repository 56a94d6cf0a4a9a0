//! What the operator's tasks share ([`Operator`]: the reconcile loop, the status writer, the
//! Event workers and the world check), and the Event workers' queues.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;

use super::budget::RequestBudget;
use crate::api::ManagedJob;
use crate::engine::Engine;
use crate::events::EventPublisher;

/// Tasks publishing Events, each with its own queue; a job always goes to the same one.
pub const EVENT_WORKERS: usize = 8;

/// Jobs waiting for their Events per worker; beyond this, Events are dropped and counted
/// (`managedjobs_events_dropped_total`), as client-go's recorder drops beyond 1,000. Events are
/// best effort; the status and the store's history keep every transition.
pub const EVENT_QUEUE: usize = 1024;

/// One job whose new history may need Events: its id and a reference to the object.
pub(super) type EventWork = (i64, ObjectReference);

/// Shared state of the reconcile loop, the status writer, the Event workers and the world check.
pub struct Operator {
    pub(super) client: Client,
    pub(super) engine: Arc<Engine>,
    /// `--api-qps`/`--api-burst`, status writes first.
    pub(super) budget: RequestBudget,
    /// Publishes Events (None: `--events=false`).
    pub(super) events: Option<EventPublisher>,
    /// Jobs whose status was written and whose new history may need Events, sharded by job id
    /// over [`EVENT_WORKERS`] bounded queues (one job's Events stay in order).
    pub(super) events_tx: Vec<tokio::sync::mpsc::Sender<EventWork>>,
    /// Consecutive failed reconciles per object uid (reset by a successful one).
    pub(super) failures: Mutex<HashMap<String, u32>>,
    /// The watched ManagedJobs (the controller's cache): the labels of a job whose Events are
    /// published, to tell its Flux Kustomization why it failed.
    pub(super) jobs: kube::runtime::reflector::Store<ManagedJob>,
    /// Its claims on namespaces: it acts only on the jobs of those it holds
    /// (`docs/design.md#one-owner-per-job`).
    pub(super) claims: Arc<super::claims::Claims>,
    /// Jobs whose object has no room for their full status, already told
    /// (`StatusTooLarge`).
    pub(super) too_large: Mutex<std::collections::HashSet<i64>>,
}

impl Operator {
    /// The queue of the Event worker that publishes job `job_id`'s Events (always the same one,
    /// so one job's Events stay in order).
    pub(super) fn event_queue(&self, job_id: i64) -> &tokio::sync::mpsc::Sender<EventWork> {
        &self.events_tx[job_id.rem_euclid(EVENT_WORKERS as i64) as usize]
    }
}
