//! The `ManagedJobQueue` resource (`managedjobs.dev/v1alpha1`, cluster-scoped,
//! `docs/design.md#queues`): a team's share of the operator's caps. A ManagedJob names its
//! queue in `spec.queue` (omitted: [`DEFAULT_QUEUE`]).
//!
//! The rules over these objects (which namespaces a queue admits, which queue gets the next free
//! slot, why a job waits) are `crate::queues`; this file holds only the types and the CRD.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use kube::CustomResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The queue of a ManagedJob that names none. It needs no object: without a ManagedJobQueue of
/// this name it has weight 1, no limits of its own, and admits every namespace (so that with no
/// queue objects at all the operator schedules exactly as one pool). An object of this name sets
/// its weight, limits and namespaces like any other queue's.
pub const DEFAULT_QUEUE: &str = "default";

/// Highest `spec.weight`.
pub const MAX_WEIGHT: u32 = 10_000;

/// A queue: a share of the operator's launch and run caps for the namespaces it admits.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "managedjobs.dev",
    version = "v1alpha1",
    kind = "ManagedJobQueue",
    status = "ManagedJobQueueStatus",
    shortname = "mjq",
    printcolumn = r#"{"name":"Weight","type":"integer","jsonPath":".spec.weight","description":"Share of the caps while several queues have waiting jobs"}"#,
    printcolumn = r#"{"name":"Max-Running","type":"integer","jsonPath":".spec.maxRunning","description":"Hard limit on the queue's jobs holding a run slot"}"#,
    printcolumn = r#"{"name":"Waiting","type":"integer","jsonPath":".status.waiting","description":"Jobs waiting in the queue"}"#,
    printcolumn = r#"{"name":"Launching","type":"integer","jsonPath":".status.launching","description":"Jobs holding a launch slot"}"#,
    printcolumn = r#"{"name":"Running","type":"integer","jsonPath":".status.running","description":"Jobs holding a run slot (launching, running or recovering)"}"#,
    printcolumn = r#"{"name":"Share","type":"string","jsonPath":".status.share","description":"Run slots the queue holds, of the operator's run cap"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ManagedJobQueueSpec {
    /// Share of the caps while several queues have waiting jobs (1..10000): the next free run
    /// slot goes to the queue with the lowest (run slots held / weight). A queue alone takes
    /// every free slot (an idle queue's share is lent; a running job is stopped for it only
    /// under a queue's `preemption`).
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Most of the queue's jobs holding a run slot at once (launching, running or recovering),
    /// within the operator's run cap; unset: no limit of its own. A hard limit: it holds even
    /// when the rest of the caps is idle. Applied by each operator instance (shard) to its own
    /// jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_running: Option<u32>,
    /// Most of the queue's jobs holding a launch slot at once, within the operator's launch
    /// cap; unset: no limit of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_launching: Option<u32>,
    /// The namespaces whose ManagedJobs may use the queue, by their labels (e.g.
    /// `matchLabels: {kubernetes.io/metadata.name: team-a}`); `{}` admits every namespace. A
    /// job whose namespace the queue does not admit never runs, whatever its spec says: it
    /// waits, saying why.
    pub namespace_selector: LabelSelector,
    /// When the queue may stop running jobs to get its share
    /// (docs/concepts/queues-and-preemption.md, "Stopping without failing"). Unset: never (a queue below its share waits for the next free slot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption: Option<QueuePreemption>,
    /// The cohort the queue lends its unused quota to and borrows from (Kueue's cohort): every
    /// queue naming the same cohort. Unset: the queue neither lends nor borrows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cohort: Option<String>,
    /// The pools (ManagedJobPools) the queue's jobs may run on, in order of preference, each
    /// with the queue's quota of each resource there: a job takes the first pool where its
    /// whole demand fits the quota (with what it may borrow) and its members fit on the pool's
    /// nodes now (docs/concepts/quotas-pools-and-fit.md). A resource a pool's entry does not
    /// list is not limited by quota there. Unset: no quota, no pool, no fit check (the queue
    /// shares slots only, as before quotas existed). At most 16 pools of 16 resources.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<QueuePool>,
    /// Whether a waiting job that does not fit its quota or the nodes lets later jobs of the
    /// queue go first (`BestEffortFIFO`, the default, Kueue's) or holds them back until it fits
    /// (`StrictFIFO`). A job waiting for a slot holds back the jobs after it either way.
    #[serde(default)]
    pub queueing_strategy: QueueingStrategy,
}

/// `BestEffortFIFO` (the default) or `StrictFIFO` (Kueue's words).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum QueueingStrategy {
    /// A job that does not fit its quota or the nodes now lets the next jobs of its queue go
    /// first (within a pass's scan of the queue); it keeps its place for when it fits.
    #[default]
    BestEffortFIFO,
    /// The queue's next job waits until it fits; nothing after it goes first.
    StrictFIFO,
}

/// A queue's quota on one pool (`spec.pools[]`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueuePool {
    /// The ManagedJobPool's name (`local`: the operator's own node, for local jobs that state
    /// their resources).
    pub name: String,
    /// The queue's quota of each resource on this pool (at most 16).
    #[serde(default)]
    pub resources: Vec<ResourceQuota>,
}

/// A queue's quota of one resource on one pool (`spec.pools[].resources[]`), Kueue's shape.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceQuota {
    /// The resource: `cpu`, `memory`, `nvidia.com/gpu`, any extended resource, or `pods`.
    pub name: String,
    /// What the queue is promised of it on the pool (a quantity: `16`, `64`, `256Gi`).
    pub nominal_quota: Quantity,
    /// Most the queue may use above its nominal quota by borrowing from its cohort; unset: as
    /// much as the cohort lends. Needs `cohort`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrowing_limit: Option<Quantity>,
    /// Most of its nominal quota the cohort may borrow; unset: all of it. Needs `cohort`; at
    /// most `nominalQuota`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lending_limit: Option<Quantity>,
}

fn default_weight() -> u32 {
    1
}

/// Whether to take another queue's run slots: `Never` (the default) or `Any`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum ReclaimShare {
    /// Wait for the next free slot.
    #[default]
    Never,
    /// While the queue holds fewer run slots than its weighted share of the run cap and has
    /// admissible waiting jobs, take slots from queues above their share (Kueue's
    /// `reclaimWithinCohort: Any`, on slots).
    Any,
}

/// Whether to take back quota that other queues of the cohort borrow: `Never` (the default) or
/// `Any` (Kueue's `reclaimWithinCohort`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum ReclaimWithinCohort {
    /// Wait until the borrowers give it back.
    #[default]
    Never,
    /// A waiting job that fits the queue's nominal quota stops jobs of the queues of its cohort
    /// that use more than their nominal quota (whole gangs, the least work lost first) until
    /// it fits.
    Any,
}

/// Whether a waiting job may stop a running job of its own queue: `Never` (the default) or
/// `LowerPriority`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum WithinQueue {
    /// Never.
    #[default]
    Never,
    /// A waiting job that finds no free run slot stops a running job of the same queue with a
    /// lower priority (Kueue's `withinClusterQueue: LowerPriority`).
    LowerPriority,
}

/// Default of `spec.preemption.minRunSeconds`: a job that ran less than this is never taken.
pub const DEFAULT_MIN_RUN_SECONDS: u32 = 60;

/// Default of `spec.preemption.maxPerMinute`.
pub const DEFAULT_MAX_PREEMPTIONS_PER_MINUTE: u32 = 10;

/// A queue's preemption policy (`spec.preemption`). A victim gets the graceful stop of a
/// suspend (SIGTERM, its stop grace, SIGKILL) and waits again, first in its own queue, its
/// restart and recovery budgets untouched; its status and an Event name the queue that took
/// its slot. Victims: never from a queue at or below its share (nor pushed below it), the
/// lowest priority first, then the most recently started (the least work lost).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueuePreemption {
    /// Take run slots from queues above their weighted share: `Never` (default) or `Any`.
    #[serde(default)]
    pub reclaim_share: ReclaimShare,
    /// Take back quota the queue's cohort borrows from it: `Never` (default) or `Any`. Only
    /// for the queue's jobs that fit its nominal quota; victims only from queues above theirs.
    #[serde(default)]
    pub reclaim_within_cohort: ReclaimWithinCohort,
    /// Stop a lower-priority running job of this queue for a higher-priority waiting one:
    /// `Never` (default) or `LowerPriority`.
    #[serde(default)]
    pub within_queue: WithinQueue,
    /// Seconds a job must have run, since its current attempt started running, before this
    /// queue may take its slot (default 60): a job that just started, or was just resumed
    /// after a preemption, is not taken, so no job is preempted twice within this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_run_seconds: Option<u32>,
    /// Most preemptions this queue causes in any 60 s (default 10): bounds the churn of a
    /// large backlog arriving at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_per_minute: Option<u32>,
}

/// What the operator shows of a queue: its counts as this operator instance sees them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManagedJobQueueStatus {
    /// Jobs waiting in the queue (admissible or not).
    #[serde(default)]
    pub waiting: i64,
    /// Jobs holding a launch slot.
    #[serde(default)]
    pub launching: i64,
    /// Jobs holding a run slot: launching, running or recovering.
    #[serde(default)]
    pub running: i64,
    /// Run slots the queue holds, of the operator's run cap, as a percentage (e.g. `75%`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<String>,
    /// `metadata.generation` of the spec these counts were computed under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The same counts for each operator instance (shard) that holds jobs of this queue: each
    /// applies the queue to its own caps. The top-level counts are the default instance's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<QueueShardStatus>,
    /// The queue's quota on each of its pools: per resource, the nominal quota, what its jobs
    /// use, what it borrows from its cohort and what of its quota others use (the default
    /// instance's view).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolUsage>,
}

/// A queue's use of its quota on one pool (`status.pools[]`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolUsage {
    /// The pool.
    pub name: String,
    /// Per resource.
    #[serde(default)]
    pub resources: Vec<ResourceUsage>,
}

/// A queue's use of one resource's quota on one pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceUsage {
    /// The resource.
    pub name: String,
    /// Its nominal quota.
    pub nominal: Quantity,
    /// What the queue's jobs holding a run slot ask for.
    pub used: Quantity,
    /// What of that is above the nominal quota, borrowed from the cohort.
    pub borrowed: Quantity,
    /// What of the nominal quota other queues of the cohort use.
    pub lent: Quantity,
}

/// One operator instance's counts of a queue (`status.shards[]`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueShardStatus {
    /// The instance: `default`, or the name given to `--shard`.
    pub shard: String,
    /// Jobs waiting in the queue.
    #[serde(default)]
    pub waiting: i64,
    /// Jobs holding a launch slot.
    #[serde(default)]
    pub launching: i64,
    /// Jobs holding a run slot.
    #[serde(default)]
    pub running: i64,
    /// Run slots held, of this instance's run cap, as a percentage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<String>,
    /// The queue's quota on each of its pools as this instance applies it to its own jobs
    /// (an instance given `--shard` or `--namespace`; the default instance's is the top-level
    /// `pools`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolUsage>,
}

/// A queue name: a DNS subdomain of at most 253 characters (a cluster-scoped object's name).
pub const QUEUE_NAME_PATTERN: &str =
    "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// A resource name: a qualified name, optionally prefixed by a DNS subdomain (`cpu`,
/// `nvidia.com/gpu`, `hugepages-2Mi`).
pub const RESOURCE_NAME_PATTERN: &str = "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$";

/// True when `name` can name a ManagedJobQueue ([`QUEUE_NAME_PATTERN`], at most 253 characters).
pub fn is_queue_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// The ManagedJobQueue CRD as installed: kube's derived schema plus ranges and descriptions.
pub fn queue_crd() -> CustomResourceDefinition {
    let crd = ManagedJobQueue::crd();
    let mut value = serde_json::to_value(&crd).expect("a CRD serializes");
    let version = &mut value["spec"]["versions"][0];
    let root = &mut version["schema"]["openAPIV3Schema"];
    root["description"] = json!(
        "A queue of ManagedJobs: a team's weighted share of the operator's launch and run caps, \
         with optional limits of its own and the namespaces that may use it. A ManagedJob names \
         its queue in spec.queue (omitted: the queue `default`)."
    );
    root["required"] = json!(["spec"]);
    let spec = &mut root["properties"]["spec"];
    spec["description"] = json!("The queue's weight, limits and the namespaces it admits.");
    let props = &mut spec["properties"];
    props["weight"]["minimum"] = json!(1);
    props["weight"]["maximum"] = json!(MAX_WEIGHT);
    props["weight"]["default"] = json!(1);
    props["weight"]
        .as_object_mut()
        .expect("an object")
        .remove("format");
    for field in ["maxRunning", "maxLaunching"] {
        props[field]
            .as_object_mut()
            .expect("an object")
            .remove("format");
        props[field]["maximum"] = json!(100_000);
    }
    props["maxRunning"]["minimum"] = json!(0);
    // A relaunch needs a launch slot of its queue: 0 would strand a recovering job.
    props["maxLaunching"]["minimum"] = json!(1);
    let preemption = &mut props["preemption"]["properties"];
    preemption["reclaimShare"]["default"] = json!("Never");
    preemption["withinQueue"]["default"] = json!("Never");
    for field in ["minRunSeconds", "maxPerMinute"] {
        preemption[field]
            .as_object_mut()
            .expect("an object")
            .remove("format");
    }
    preemption["minRunSeconds"]["minimum"] = json!(0);
    preemption["minRunSeconds"]["maximum"] = json!(30 * 24 * 3600);
    preemption["maxPerMinute"]["minimum"] = json!(1);
    preemption["maxPerMinute"]["maximum"] = json!(10_000);
    preemption["reclaimWithinCohort"]["default"] = json!("Never");
    props["queueingStrategy"]["default"] = json!("BestEffortFIFO");
    props["cohort"]["maxLength"] = json!(253);
    props["cohort"]["pattern"] = json!(QUEUE_NAME_PATTERN);
    // Pools and resources are lists keyed by name: the API refuses a name twice.
    let pools = &mut props["pools"];
    pools["maxItems"] = json!(16);
    pools["x-kubernetes-list-type"] = json!("map");
    pools["x-kubernetes-list-map-keys"] = json!(["name"]);
    let pool = &mut pools["items"]["properties"];
    pool["name"]["maxLength"] = json!(253);
    pool["name"]["pattern"] = json!(QUEUE_NAME_PATTERN);
    let resources = &mut pool["resources"];
    resources["maxItems"] = json!(16);
    resources["x-kubernetes-list-type"] = json!("map");
    resources["x-kubernetes-list-map-keys"] = json!(["name"]);
    resources["items"]["properties"]["name"]["maxLength"] = json!(253);
    resources["items"]["properties"]["name"]["pattern"] = json!(RESOURCE_NAME_PATTERN);
    resources["items"]["x-kubernetes-validations"] = json!([
        {
            "rule": "quantity(string(self.nominalQuota)).compareTo(quantity('0')) >= 0",
            "message": "nominalQuota must not be negative",
        },
        {
            "rule": "!has(self.borrowingLimit) || quantity(string(self.borrowingLimit)).compareTo(quantity('0')) >= 0",
            "message": "borrowingLimit must not be negative",
        },
        {
            "rule": "!has(self.lendingLimit) || quantity(string(self.lendingLimit)).compareTo(quantity('0')) >= 0",
            "message": "lendingLimit must not be negative",
        },
        {
            "rule": "!has(self.lendingLimit) || quantity(string(self.lendingLimit)).compareTo(quantity(string(self.nominalQuota))) <= 0",
            "message": "lendingLimit must not exceed nominalQuota",
        },
    ]);
    spec["x-kubernetes-validations"] = json!([{
        "rule": "has(self.cohort) || !has(self.pools) || self.pools.all(p, !has(p.resources) || p.resources.all(r, !has(r.borrowingLimit) && !has(r.lendingLimit)))",
        "message": "borrowingLimit and lendingLimit need spec.cohort (a queue without a cohort neither borrows nor lends)",
    }]);
    let status = &mut root["properties"]["status"];
    status["description"] = json!(
        "Counts of the queue's jobs and its use of its quotas, written by the operator at a \
         bounded rate (server-side apply: each operator instance owns its entry of shards[])."
    );
    status["properties"]["shards"]["x-kubernetes-list-type"] = json!("map");
    status["properties"]["shards"]["x-kubernetes-list-map-keys"] = json!(["shard"]);
    super::quantities::compact_quantities(&mut value);
    serde_json::from_value(value).expect("the refined CRD deserializes")
}

/// The ManagedJobQueue CRD as YAML, exactly as committed in
/// `crds/managedjobs.dev_managedjobqueues.yaml`.
pub fn queue_crd_yaml() -> String {
    let mut out = String::from("# Generated by `managed-jobs crd queue`; do not edit.\n");
    out.push_str(&serde_norway::to_string(&queue_crd()).expect("a CRD serializes to YAML"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_are_dns_subdomains() {
        for ok in ["default", "team-a", "a.b-c", "x1"] {
            assert!(is_queue_name(ok), "{ok}");
        }
        for bad in ["", "Team", "-a", "a-", "a..b", "a_b", &"a".repeat(254)] {
            assert!(!is_queue_name(bad), "{bad}");
        }
    }
}
