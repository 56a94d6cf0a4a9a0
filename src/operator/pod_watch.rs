//! The operator's one shared watch on the Pods carrying our job-id label: each change becomes a
//! [`PodObservation`] in the store and wakes the job's controller (job controllers never watch
//! or poll the API). It also keeps [`PodCache`]: every Pod with our marks, for the world check
//! ([`crate::lifecycle::world`]).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::watcher;

use crate::api::LABEL_JOB_ID;
use crate::engine::Engine;
use crate::executor::pod::{self, state};
use crate::lifecycle::world::PodSeen;
use crate::store::pods::{PodObservation, PodState};

/// Every Pod with our marks (the job-id and attempt labels and a ManagedJob controller owner),
/// as the watch last saw it, by (namespace, name): the world check's view of the Pods. A few
/// hundred bytes per Pod.
#[derive(Default)]
pub struct PodCache {
    pods: Mutex<HashMap<(String, String), PodSeen>>,
    /// The watch has listed every Pod once (a relist replaces the whole map at its end).
    ready: std::sync::atomic::AtomicBool,
}

impl PodCache {
    /// Every Pod with our marks, once the watch has listed them all (None before).
    pub fn snapshot(&self) -> Option<Vec<PodSeen>> {
        self.ready
            .load(std::sync::atomic::Ordering::SeqCst)
            .then(|| self.lock().values().cloned().collect())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), PodSeen>> {
        self.pods.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What the world check needs of `pod`, when it carries our marks.
pub fn pod_seen(pod: &Pod) -> Option<PodSeen> {
    let (job_id, attempt) = pod::pod_key(pod)?;
    let owner = pod.metadata.owner_references.iter().flatten().find(|o| {
        o.controller == Some(true)
            && o.kind == "ManagedJob"
            && o.api_version.starts_with("managedjobs.dev/")
    })?;
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    Some(PodSeen {
        namespace: pod.metadata.namespace.clone()?,
        name: pod.metadata.name.clone()?,
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        job_id,
        attempt,
        owner_uid: owner.uid.clone(),
        alive: !matches!(phase, Some("Succeeded" | "Failed")),
        terminating: pod.metadata.deletion_timestamp.is_some(),
        node: state::node_name(pod),
    })
}

fn cache_key(pod: &Pod) -> Option<(String, String)> {
    Some((pod.metadata.namespace.clone()?, pod.metadata.name.clone()?))
}

/// Runs the watch until the process ends (errors are retried with kube's default back-off).
pub async fn run(engine: Arc<Engine>, pods: Api<Pod>, cache: Arc<PodCache>) {
    use watcher::Event;
    let client = pods.clone().into_client();
    // This shard's Pods only: another shard's are another operator's.
    let selector = format!(
        "{LABEL_JOB_ID},{}",
        crate::api::shard_selector(engine.config().shard.as_deref())
    );
    let cfg = watcher::Config::default().labels(&selector);
    let mut stream = super::retry::relisting_watch(pods, cfg);
    let mut health = super::retry::WatchHealth::new("Pod");
    let mut listed: HashSet<(i64, i32, u32)> = HashSet::new();
    let mut relisted: HashMap<(String, String), PodSeen> = HashMap::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => {
                listed.clear();
                relisted.clear();
            }
            Ok(Event::InitApply(p)) => {
                if let (Some(key), Some(seen)) = (cache_key(&p), pod_seen(&p)) {
                    relisted.insert(key, seen);
                }
                if let Some(key) = record(&engine, &p, false) {
                    listed.insert(key);
                }
            }
            Ok(Event::InitDone) => {
                *cache.lock() = std::mem::take(&mut relisted);
                cache.ready.store(true, std::sync::atomic::Ordering::SeqCst);
                mark_vanished(&engine, &client, &listed).await;
                // Back after a failure (an API outage): the store is checked against the
                // world at once, not at the next period.
                if health.listed(Some(&engine.metrics)).is_some() {
                    engine.world_changed.notify_one();
                }
            }
            Ok(Event::Apply(p)) => {
                // The cache first: a job that ends on this Pod's news never finds the cache
                // older than its row.
                if let Some(key) = cache_key(&p) {
                    match pod_seen(&p) {
                        Some(seen) => cache.lock().insert(key, seen),
                        None => cache.lock().remove(&key),
                    };
                }
                record(&engine, &p, false);
            }
            Ok(Event::Delete(p)) => {
                // A label-filtered watch also reports a Pod whose labels were edited away as
                // deleted: only a GET by name tells. A Pod that still exists is not lost.
                // Without our labels it no longer carries our marks: out of the cache either way.
                if let Some(key) = cache_key(&p) {
                    cache.lock().remove(&key);
                }
                if still_exists(&client, &p).await {
                    tracing::warn!(pod = ?p.metadata.name, namespace = ?p.metadata.namespace, "a job's Pod lost its labels; it is not taken as deleted");
                    continue;
                }
                record(&engine, &p, true);
            }
            Err(e) => health.failed(&e),
        }
    }
}

/// True when the API still holds this Pod (same uid): its Delete event came from a label change.
async fn still_exists(client: &kube::Client, pod: &Pod) -> bool {
    let (Some(ns), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
        return false;
    };
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    match api.get_opt(name).await {
        Ok(Some(now)) => now.metadata.uid == pod.metadata.uid,
        Ok(None) => false,
        // Unknown: take the watch's word (a lost Pod is recovered, never left running unseen).
        Err(_) => false,
    }
}

/// Records what a labelled Pod shows, if it is one of our jobs' attempts by namespace, name,
/// owner and labels ([`pod::is_attempt_pod`]), and wakes that job's controller when something changed. Returns its (job, attempt, rank).
fn record(engine: &Engine, pod: &Pod, deleted: bool) -> Option<(i64, i32, u32)> {
    let (id, attempt) = pod::pod_key(pod)?;
    let row = engine.store().find(id).ok()??;
    if !pod::is_attempt_pod(pod, &row, attempt) {
        tracing::debug!(job_id = id, pod = ?pod.metadata.name, namespace = ?pod.metadata.namespace, "a labelled Pod that is not this job's: ignored");
        return None;
    }
    let seen = state::observe(pod, id, attempt, deleted);
    // A Pod once lost (its node lost, say) stays lost: what it shows later is its aftermath.
    let previous = match engine.store().pod_member(id, attempt, seen.rank) {
        Ok(previous) => previous,
        Err(e) => {
            tracing::error!(job_id = id, error = %e, "reading a Pod observation failed");
            None
        }
    };
    let observation = state::keep_fate(previous, seen);
    let changed = engine.store().record_pod(&observation);
    match changed {
        Ok(true) => {
            tracing::debug!(job_id = id, attempt, state = %observation.state, "pod observed");
            engine.wake_controller(&row);
            engine.wake_all();
        }
        Ok(false) => {}
        Err(e) => tracing::error!(job_id = id, error = %e, "recording a Pod observation failed"),
    }
    Some((id, attempt, observation.rank))
}

/// After a (re)list: Pods we had seen that are no longer there were deleted while we were not
/// watching. Each is confirmed by a GET by name: a Pod whose labels were edited away is missing
/// from the labelled list but not gone.
async fn mark_vanished(engine: &Engine, client: &kube::Client, listed: &HashSet<(i64, i32, u32)>) {
    let live = engine.store().live_jobs().unwrap_or_default();
    for row in live.iter().filter(|r| r.executor.facts().api_objects) {
        let seen = engine
            .store()
            .pod_members(row.id, row.attempt)
            .unwrap_or_default();
        for mut o in seen {
            if o.deleted || listed.contains(&(row.id, row.attempt, o.rank)) {
                continue;
            }
            let api: Api<Pod> = Api::namespaced(client.clone(), &row.namespace);
            let owned_by_job = |p: &Pod| {
                p.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|r| r.uid == row.uid)
            };
            if let Ok(Some(p)) = api.get_opt(&o.pod_name).await
                && owned_by_job(&p)
            {
                tracing::warn!(job_id = row.id, pod = %o.pod_name, "a job's Pod lost its labels; it is not taken as deleted");
                continue;
            }
            vanished(&mut o);
            if let Err(e) = engine.store().record_pod(&o) {
                tracing::error!(job_id = row.id, error = %e, "recording a vanished Pod failed");
            }
            engine.wake_controller(row);
        }
    }
    engine.wake_all();
}

/// Marks an observation deleted; a Pod that had not exited on its own is lost (one lost
/// already keeps its cause: `state::keep_fate`).
fn vanished(o: &mut PodObservation) {
    o.deleted = true;
    if !o.state.is_final_exit() && o.state != PodState::Lost {
        o.state = PodState::Lost;
        o.reason = "PodDeleted".into();
        o.message = "the Pod was deleted while the operator was not watching".into();
        o.ended_at_ms = Some(crate::lifecycle::now_ms());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(state: PodState, reason: &str) -> PodObservation {
        PodObservation {
            job_id: 1,
            attempt: 1,
            rank: 0,
            pod_name: "p".into(),
            state,
            exit_code: None,
            reason: reason.into(),
            message: String::new(),
            deleted: false,
            node: "n1".into(),
            terminating_since_ms: None,
            grace_seconds: None,
            evidence: Default::default(),
            ended_at_ms: None,
        }
    }

    /// A Pod gone while the watch was down: lost if it was running; one that had exited, or
    /// was lost already (to its node, say), keeps its fate and its cause.
    #[test]
    fn a_pod_gone_unseen_is_lost_unless_its_fate_was_known() {
        let mut running = seen(PodState::Running, "");
        vanished(&mut running);
        assert_eq!(
            (running.state, running.reason.as_str(), running.deleted),
            (PodState::Lost, "PodDeleted", true)
        );
        for (state, reason) in [(PodState::Succeeded, ""), (PodState::Lost, "NodeLost")] {
            let mut o = seen(state, reason);
            vanished(&mut o);
            assert_eq!(
                (o.state, o.reason.as_str(), o.deleted),
                (state, reason, true)
            );
        }
    }
}
