//! Resources (docs/design.md#resources, issue 44): what a job needs, where it may run, what a
//! queue may use, all pure.
//!
//! - [`amount`]: Kubernetes quantities as integer milli-units, and lists of them;
//! - [`demand`]: what one attempt needs, as kube-scheduler counts a Pod, times its members;
//! - [`fit`]: the nodes, and whether an attempt's members can be placed on them now;
//! - [`quota`]: queues' quotas per pool and resource, lending within a cohort, fair sharing.

pub mod amount;
pub mod demand;
pub mod fit;
pub mod quota;

pub use amount::{Amount, Resources};
pub use demand::Demand;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;

/// The pool an attempt was admitted onto, and what that pool adds to its Pods at launch: its
/// nodes' labels (to their `nodeSelector`) and the taints its Pods tolerate.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// The pool (a ManagedJobPool's name, or `local`).
    pub pool: String,
    /// Labels added to each Pod's `nodeSelector`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,
    /// Tolerations added to each Pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
}

// Tolerations compare as their strings and numbers do: equality is total.
impl Eq for Placement {}
