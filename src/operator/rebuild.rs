//! Rebuilding a lost store (`docs/design.md`, "A lost store"): when the operator starts on a store with no
//! job at all (a new volume, an emptyDir after a pod restart, a deleted state dir), every
//! ManagedJob whose status names a job id is restored from that status
//! ([`lifecycle::restore()`]) before the first admission, so ids, attempts and counters carry on,
//! finished jobs keep their status byte for byte, and new jobs get ids above every old one. For
//! a live pod job, the Pod of its current attempt is looked up by label and owner: found, it is
//! adopted; missing, the attempt counts as lost (a recovery), never as a fresh attempt 1.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::api::{LABEL_JOB_ID, ManagedJob};
use crate::executor::pod;
use crate::lifecycle::{self, JobRow, Object, now_ms};
use crate::state_dir::StateDir;
use crate::store::Store;
use crate::store::pods::{PodObservation, PodState};

/// What a rebuild did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rebuilt {
    /// Jobs restored from their status.
    pub jobs: usize,
    /// Of those, live pod jobs whose current Pod was found and adopted.
    pub pods_adopted: usize,
    /// Of those, live pod jobs whose current Pod is gone (counted as lost).
    pub pods_missing: usize,
}

/// Rebuilds the store of `dir` from the API when it holds no job; does nothing otherwise.
/// `namespace` limits it as the operator's watch is limited. Errors: the store or the API
/// failed (the operator then exits and is restarted, before admitting anything).
///
/// Only the jobs of `owned` namespaces are restored (None: every namespace): another
/// operator's are its own (`docs/design.md#one-owner-per-job`).
pub async fn rebuild_if_empty(
    client: &Client,
    dir: &StateDir,
    namespace: Option<&str>,
    shard: Option<&str>,
    owned: Option<&std::collections::HashSet<String>>,
) -> anyhow::Result<Rebuilt> {
    dir.create()?;
    let mut store = Store::open(&dir.store(), 1024)?;
    // The jobs about to be restored are this shard's: claim the store first.
    crate::engine::claim_for_shard(&mut store, dir.root(), shard)?;
    if store.job_count()? > 0 {
        return Ok(Rebuilt::default());
    }
    let jobs: Api<ManagedJob> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    // Only this shard's jobs: another shard's are restored by their own operator.
    let selector = crate::api::shard_selector(shard);
    let objects = jobs
        .list(&ListParams::default().labels(&selector))
        .await?
        .items;
    let now = now_ms();
    let restorable: Vec<JobRow> = objects
        .iter()
        .filter(|mj| owned.is_none_or(|o| mj.namespace().is_some_and(|ns| o.contains(&ns))))
        .filter_map(|mj| {
            let (uid, ns) = (mj.uid()?, mj.namespace()?);
            let name = mj.name_any();
            let object = Object {
                uid: &uid,
                namespace: &ns,
                name: &name,
                generation: mj.metadata.generation.unwrap_or(0),
                spec: &mj.spec,
                created_at_ms: created_ms(mj, now),
                // A rebuilt job's place is its status's (`lifecycle::restore`).
                resource_version: "",
            };
            lifecycle::restore(&object, mj.status.as_ref()?, now)
        })
        .collect();
    let mut out = Rebuilt::default();
    if restorable.is_empty() {
        return Ok(out);
    }
    // The Pods of our jobs, by (job id, attempt); a failed list (no Pod permission when the pod
    // executor is off) leaves the pod jobs to find their Pods through the watch.
    let pods_api: Api<Pod> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let pods: Option<HashMap<(i64, i32, u32), Pod>> = match pods_api
        .list(&ListParams::default().labels(&format!("{LABEL_JOB_ID},{selector}")))
        .await
    {
        Ok(list) => Some(
            list.items
                .into_iter()
                .filter_map(|p| {
                    let (id, attempt) = pod::pod_key(&p)?;
                    Some(((id, attempt, pod::state::rank_of(&p)), p))
                })
                .collect(),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "listing Pods for the rebuild failed; the Pod watch will find them");
            None
        }
    };
    for record in restorable {
        let row = store.restore(&record)?;
        out.jobs += 1;
        let Some(pods) = &pods else { continue };
        let found = |rank: u32| pods.get(&(row.id, row.attempt, rank));
        if let Some((adopted, missing)) = adopt_pods(&mut store, &row, found)? {
            out.pods_adopted += adopted;
            out.pods_missing += missing;
        }
    }
    tracing::warn!(
        jobs = out.jobs,
        pods_adopted = out.pods_adopted,
        pods_missing = out.pods_missing,
        state_dir = %dir.root().display(),
        "the store held no job: rebuilt it from the ManagedJobs' status"
    );
    Ok(out)
}

/// For a live job of API objects just restored from its status (`row`): records what each
/// member of its current attempt shows (`pod_of(rank)`: the Pod found for that rank, used if
/// it is the attempt's by every mark), or that it is gone (counted lost, never launched again as
/// a fresh attempt: a gang then recovers as one). Returns Some((adopted, missing)) member
/// counts, or None when the job has no Pod to look for (not a live job of API objects, or its
/// current attempt was not launched).
pub fn adopt_pods<'p>(
    store: &mut Store,
    row: &JobRow,
    pod_of: impl Fn(u32) -> Option<&'p Pod>,
) -> anyhow::Result<Option<(usize, usize)>> {
    let live = row.schedule_state.holds_run_slot() && row.launched_attempt >= row.attempt;
    if !row.executor.facts().api_objects || !live {
        return Ok(None);
    }
    let (mut adopted, mut missing) = (0, 0);
    for rank in 0..crate::lifecycle::tasks::current_task(row).size() as u32 {
        let found = pod_of(rank).filter(|p| pod::is_attempt_pod(p, row, row.attempt));
        let observation = match found {
            Some(p) => {
                adopted += 1;
                pod::state::observe(p, row.id, row.attempt, false)
            }
            None => {
                missing += 1;
                PodObservation {
                    job_id: row.id,
                    attempt: row.attempt,
                    rank,
                    pod_name: pod::member_pod_name(row, row.attempt, rank),
                    state: PodState::Lost,
                    exit_code: None,
                    reason: "PodMissing".into(),
                    message: "no Pod of this attempt was found when the job was rebuilt from \
                              its status"
                        .into(),
                    deleted: true,
                    node: String::new(),
                    terminating_since_ms: None,
                    grace_seconds: None,
                    evidence: Default::default(),
                    ended_at_ms: Some(crate::lifecycle::now_ms()),
                }
            }
        };
        store.record_pod(&observation)?;
    }
    Ok(Some((adopted, missing)))
}

/// Restores one job from its object's status into the engine's store (a job another operator
/// drove, or that a lost store had): [`lifecycle::restore()`] (and, when another store wrote
/// that status, [`lifecycle::restore::taken_over`]: a local attempt of that store's is over
/// here), then its current Pod looked up by name ([`adopt_pod`]). `me` is this operator's
/// holder identity. Returns the row, or None when the status names no job.
pub async fn restore_one(
    client: &Client,
    engine: &crate::engine::Engine,
    mj: &ManagedJob,
    me: &str,
) -> anyhow::Result<Option<JobRow>> {
    let (Some(uid), Some(ns), Some(status)) = (mj.uid(), mj.namespace(), mj.status.as_ref()) else {
        return Ok(None);
    };
    let now = now_ms();
    let name = mj.name_any();
    let object = Object {
        uid: &uid,
        namespace: &ns,
        name: &name,
        generation: mj.metadata.generation.unwrap_or(0),
        spec: &mj.spec,
        created_at_ms: created_ms(mj, now),
        // A job taken over keeps the place its status shows (`lifecycle::restore`).
        resource_version: "",
    };
    let Some(mut record) = lifecycle::restore(&object, status, now) else {
        return Ok(None);
    };
    if let Some(from) = status.owner.as_deref()
        && !lifecycle::claim::same_holder(from, me)
    {
        let grace = lifecycle::stop_grace(&record, engine.config().cancel_grace);
        record = lifecycle::restore::taken_over(record, from, grace, now);
    }
    let row = engine.store().restore(&record)?;
    let live = row.executor.facts().api_objects
        && row.schedule_state.holds_run_slot()
        && row.launched_attempt >= row.attempt;
    if live {
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let mut found = std::collections::HashMap::new();
        for rank in 0..crate::lifecycle::tasks::current_task(&row).size() as u32 {
            let mut names = vec![pod::member_pod_name(&row, row.attempt, rank)];
            if rank == 0 {
                names.push(pod::legacy_attempt_pod_name(&row, row.attempt));
            }
            for candidate in names {
                if let Some(p) = api.get_opt(&candidate).await? {
                    found.insert(rank, p);
                    break;
                }
            }
        }
        adopt_pods(&mut engine.store(), &row, |rank| found.get(&rank))?;
    }
    Ok(Some(row))
}

/// `metadata.creationTimestamp` of `mj` in ms since the epoch, else `now`.
pub(super) fn created_ms(mj: &ManagedJob, now: i64) -> i64 {
    mj.metadata
        .creation_timestamp
        .as_ref()
        .map_or(now, |t| t.0.as_millisecond())
}
