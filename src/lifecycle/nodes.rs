//! When the node a member is bound to loses it (`docs/design.md#failures`, issue 43): the
//! operator's Node watch (`operator::nodes`) says how it sees each node ([`NodeSeen`]), and
//! [`member_lost`] decides, from that, the grace (`--node-lost-grace-seconds`) and now,
//! whether the member is lost, since when and why ([`NodeLoss`]).
//!
//! - **A Node deleted** loses its members at once ([`NODE_LOST`]): a spot node's cloud
//!   controller deletes it with the machine, and nothing will ever run or stop its Pods again.
//!   Before, the operator learnt of it only when kube-controller-manager's pod GC deleted the
//!   orphaned Pods (its 40 s quarantine and then its next sweep: a `nodes: 4` gang stayed
//!   `Running 4/4` for 55 s after its rank 1's node was deleted).
//! - **A Node not Ready** (its `Ready` condition `False` or `Unknown`, or none at all) loses its
//!   members once it has been so for the grace ([`NODE_NOT_READY`]), counted from the
//!   condition's `lastTransitionTime`; a node back to Ready within the grace changes nothing. A
//!   kubelet that stops reporting is marked `Unknown` by the node lifecycle controller after
//!   its node-monitor-grace-period (40 s, 50 s since Kubernetes 1.32); the grace counts from
//!   then. Kubernetes itself evicts such Pods only after its taint-based eviction's default
//!   toleration (300 s) on top.
//! - Nothing else of a node loses a member: cordoned (`unschedulable`), under pressure or
//!   tainted, it still runs it (a `NoExecute` taint's eviction deletes the Pod, which the Pod
//!   watch sees as any deletion).
//!
//! A member that is not bound to a node (its Pod waits for the scheduler) has no node to lose.
//! What a loss does to the attempt is the existing loss path's: the member reads as lost
//! (`executor::pod::state::lost_to_node`), the attempt ends lost, one recovery for the whole
//! gang, and the member's Pod is removed without a grace period ([`removes_at_once`]).

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;

/// The reason (`onReasons`, `status.attempts[].reason`) of a member whose Node was deleted.
pub const NODE_LOST: &str = "NodeLost";

/// The reason of a member whose Node was not Ready for longer than the grace (also the reason
/// of a Pod force-deleted after it stayed terminating on a node that is not Ready).
pub const NODE_NOT_READY: &str = "NodeNotReady";

/// A Node's `Ready` condition, when it is not `True`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NotReady {
    /// `False`: the kubelet says the node is not ready (its runtime or network is down...).
    False,
    /// `Unknown`: the node lifecycle controller has not heard from the kubelet for its
    /// node-monitor-grace-period.
    Unknown,
    /// No `Ready` condition at all: the kubelet never reported.
    Missing,
}

/// A node as the operator's Node watch sees it: what [`member_lost`] decides on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeSeen {
    /// No Node of that name exists (deleted, or never created).
    Absent,
    /// Its `Ready` condition is `True`.
    Ready,
    /// Its `Ready` condition is not `True`.
    NotReady {
        /// Which way.
        status: NotReady,
        /// Since when (ms since epoch): the condition's `lastTransitionTime` (the node's
        /// `creationTimestamp` without a condition), never later than when it was read.
        since_ms: i64,
        /// The condition's CamelCase reason (e.g. `NodeStatusUnknown`, `KubeletNotReady`),
        /// empty when it gives none.
        reason: String,
    },
}

impl NodeSeen {
    /// How `node` reads, at `now_ms`: its `Ready` condition, and since when it is not `True`
    /// (a transition time later than `now_ms`, another clock's, is taken as `now_ms`).
    pub fn of(node: &Node, now_ms: i64) -> NodeSeen {
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .find(|c| c.type_ == "Ready");
        let ms = |t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
            t.as_ref().map(|t| t.0.as_millisecond())
        };
        let (status, since, reason) = match ready {
            Some(c) if c.status == "True" => return NodeSeen::Ready,
            Some(c) => (
                if c.status == "False" {
                    NotReady::False
                } else {
                    NotReady::Unknown
                },
                ms(&c.last_transition_time),
                c.reason.clone().unwrap_or_default(),
            ),
            None => (
                NotReady::Missing,
                ms(&node.metadata.creation_timestamp),
                String::new(),
            ),
        };
        NodeSeen::NotReady {
            status,
            since_ms: since.unwrap_or(now_ms).min(now_ms),
            reason,
        }
    }
}

/// Why a member is lost to its node ([`member_lost`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLoss {
    /// [`NODE_LOST`] or [`NODE_NOT_READY`].
    pub reason: &'static str,
    /// Since when (ms since epoch): when the node stopped being Ready, or when its absence
    /// was found (a deletion's own time is not kept).
    pub since_ms: i64,
    /// What happened, naming the node, e.g. "its node n1 was deleted", "its node n1 has not
    /// been Ready (Unknown: NodeStatusUnknown) for 75 s, past the grace of 60 s".
    pub message: String,
}

/// Whether the member bound to `node` (empty: not bound yet) is lost, seen as `seen`, with
/// `grace` for a node that is not Ready, at `now_ms`: a deleted node at once, a node not
/// Ready once it has been so for `grace`; None otherwise (Ready, not Ready for less than
/// the grace, or no node). Pure.
pub fn member_lost(node: &str, seen: &NodeSeen, grace: Duration, now_ms: i64) -> Option<NodeLoss> {
    if node.is_empty() {
        return None;
    }
    match seen {
        NodeSeen::Ready => None,
        NodeSeen::Absent => Some(NodeLoss {
            reason: NODE_LOST,
            since_ms: now_ms,
            message: format!("its node {node} was deleted"),
        }),
        NodeSeen::NotReady {
            status,
            since_ms,
            reason,
        } => {
            let grace_ms = grace.as_millis() as i64;
            let for_ms = now_ms.saturating_sub(*since_ms);
            (for_ms >= grace_ms).then(|| {
                let how = match (status, reason.is_empty()) {
                    (NotReady::Missing, _) => "no Ready condition".to_string(),
                    (s, true) => format!("{s:?}"),
                    (s, false) => format!("{s:?}: {reason}"),
                };
                NodeLoss {
                    reason: NODE_NOT_READY,
                    since_ms: *since_ms,
                    message: format!(
                        "its node {node} has not been Ready ({how}) for {} s, past the grace of {} s",
                        for_ms / 1000,
                        grace.as_secs_f64()
                    ),
                }
            })
        }
    }
}

/// When a node seen as `seen` loses its members, with `grace` (ms since epoch): at once
/// (`i64::MIN`) when it is absent, when its grace ends when it is not Ready, never (None) when
/// it is Ready. Pure; [`member_lost`] agrees with it: lost exactly when `now_ms` has reached it.
pub fn loses_members_at(seen: &NodeSeen, grace: Duration) -> Option<i64> {
    match seen {
        NodeSeen::Ready => None,
        NodeSeen::Absent => Some(i64::MIN),
        NodeSeen::NotReady { since_ms, .. } => {
            Some(since_ms.saturating_add(grace.as_millis() as i64))
        }
    }
}

/// The first moment after `now_ms` at which one of `nodes` will lose its members (a node not
/// Ready whose grace has not ended yet): when the world check must look again. None when no
/// node is on its way. Pure.
pub fn next_loss_at<'a>(
    nodes: impl IntoIterator<Item = &'a NodeSeen>,
    grace: Duration,
    now_ms: i64,
) -> Option<i64> {
    nodes
        .into_iter()
        .filter_map(|seen| loses_members_at(seen, grace))
        .filter(|at| *at > now_ms)
        .min()
}

/// True when `reason` is a loss to the member's node ([`NODE_LOST`], [`NODE_NOT_READY`]).
pub fn is_node_loss(reason: &str) -> bool {
    reason == NODE_LOST || reason == NODE_NOT_READY
}

/// Whether a member lost to its node (its cause `reason`: [`is_node_loss`]) is removed
/// without a grace period when its attempt is stopped, rather than deleted with the job's
/// grace and forced only after it plus a margin (`executor::pod::state::TERMINATING_MARGIN`):
/// a deleted Node's kubelet will never confirm a deletion (the pod GC force-deletes such Pods
/// too, after its 40 s quarantine), and a node not Ready past the grace has not answered for
/// at least as long as that margin. Removing it at once lets the attempt's end be recorded,
/// and the next attempt start, within seconds instead of after the Pod's grace period.
pub fn removes_at_once(reason: &str) -> bool {
    is_node_loss(reason)
}

/// What the operator knows of every node, to decide on members with ([`member_lost`]): the
/// nodes it sees (a name it does not hold is [`NodeSeen::Absent`]), the grace and now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Nodes {
    /// Every Node, by name, as seen now.
    pub seen: HashMap<String, NodeSeen>,
    /// `--node-lost-grace-seconds`.
    pub grace: Duration,
    /// Now, ms since epoch.
    pub now_ms: i64,
}

impl Nodes {
    /// Whether the member bound to `node` is lost ([`member_lost`]).
    pub fn member_lost(&self, node: &str) -> Option<NodeLoss> {
        let seen = self.seen.get(node).unwrap_or(&NodeSeen::Absent);
        member_lost(node, seen, self.grace, self.now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GRACE: Duration = Duration::from_secs(60);

    fn not_ready(since_ms: i64) -> NodeSeen {
        NodeSeen::NotReady {
            status: NotReady::Unknown,
            since_ms,
            reason: "NodeStatusUnknown".into(),
        }
    }

    /// Issue 43, item 4: a member's node deleted ends the attempt at once; not Ready past the
    /// grace too; back within the grace, nothing.
    #[test]
    fn a_deleted_node_loses_at_once_a_node_not_ready_after_the_grace() {
        let now = 1_000_000;
        let gone = member_lost("n1", &NodeSeen::Absent, GRACE, now).unwrap();
        assert_eq!(
            gone,
            NodeLoss {
                reason: NODE_LOST,
                since_ms: now,
                message: "its node n1 was deleted".into()
            }
        );
        assert_eq!(member_lost("n1", &NodeSeen::Ready, GRACE, now), None);
        // Not Ready for 59.999 s: not yet; for 60 s: lost, since it stopped being Ready.
        assert_eq!(
            member_lost("n1", &not_ready(now - 59_999), GRACE, now),
            None
        );
        let late = member_lost("n1", &not_ready(now - 75_000), GRACE, now).unwrap();
        assert_eq!((late.reason, late.since_ms), (NODE_NOT_READY, now - 75_000));
        assert_eq!(
            late.message,
            "its node n1 has not been Ready (Unknown: NodeStatusUnknown) for 75 s, past the grace of 60 s"
        );
        // Not bound to a node: nothing to lose.
        assert_eq!(member_lost("", &NodeSeen::Absent, GRACE, now), None);
        // A name the watch does not hold is absent.
        let nodes = Nodes {
            seen: HashMap::from([("n2".to_string(), NodeSeen::Ready)]),
            grace: GRACE,
            now_ms: now,
        };
        assert_eq!(nodes.member_lost("n2"), None);
        assert_eq!(nodes.member_lost("n1").unwrap().reason, NODE_LOST);
        assert!(removes_at_once(NODE_LOST) && removes_at_once(NODE_NOT_READY));
        assert!(!removes_at_once("PodDeleted") && !is_node_loss("EvictionByEvictionAPI"));
    }

    /// What a Node object reads as: its Ready condition, since its transition (another clock's
    /// time in the future is now), or since its creation without one.
    #[test]
    fn a_node_reads_as_its_ready_condition() {
        let node = |conditions: serde_json::Value| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "n1", "creationTimestamp": "2026-01-01T00:00:00Z"},
                "status": {"conditions": conditions}
            }))
            .unwrap()
        };
        let at = |s: &str| s.parse::<jiff::Timestamp>().unwrap().as_millisecond();
        let now = at("2026-01-01T00:10:00Z");
        assert_eq!(
            NodeSeen::of(
                &node(serde_json::json!([{"type": "Ready", "status": "True"}])),
                now
            ),
            NodeSeen::Ready
        );
        assert_eq!(
            NodeSeen::of(
                &node(serde_json::json!([
                    {"type": "MemoryPressure", "status": "False"},
                    {"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                     "lastTransitionTime": "2026-01-01T00:09:00Z"}
                ])),
                now
            ),
            NodeSeen::NotReady {
                status: NotReady::False,
                since_ms: at("2026-01-01T00:09:00Z"),
                reason: "KubeletNotReady".into()
            }
        );
        assert_eq!(
            NodeSeen::of(
                &node(serde_json::json!([{"type": "Ready", "status": "Unknown",
                    "lastTransitionTime": "2026-01-01T00:11:00Z"}])),
                now
            ),
            NodeSeen::NotReady {
                status: NotReady::Unknown,
                since_ms: now,
                reason: String::new()
            },
            "a transition in the future (a skewed clock) counts from now"
        );
        assert_eq!(
            NodeSeen::of(&node(serde_json::json!([])), now),
            NodeSeen::NotReady {
                status: NotReady::Missing,
                since_ms: at("2026-01-01T00:00:00Z"),
                reason: String::new()
            }
        );
    }

    /// When the world check must look again: the end of the first grace still running.
    #[test]
    fn the_next_loss_is_the_first_grace_to_end() {
        let now = 500_000;
        let nodes = [
            NodeSeen::Ready,
            not_ready(now - 10_000),
            not_ready(now - 30_000),
            not_ready(now - 90_000),
            NodeSeen::Absent,
        ];
        assert_eq!(next_loss_at(&nodes, GRACE, now), Some(now + 30_000));
        assert_eq!(next_loss_at(&nodes[..1], GRACE, now), None);
    }

    fn seen() -> impl Strategy<Value = NodeSeen> {
        prop_oneof![
            Just(NodeSeen::Absent),
            Just(NodeSeen::Ready),
            (
                prop_oneof![
                    Just(NotReady::False),
                    Just(NotReady::Unknown),
                    Just(NotReady::Missing)
                ],
                0i64..1_000_000,
                prop_oneof![Just(String::new()), Just("KubeletNotReady".to_string())]
            )
                .prop_map(|(status, since_ms, reason)| NodeSeen::NotReady {
                    status,
                    since_ms,
                    reason
                }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Over random nodes, graces and times: a member is lost exactly when its node is
        /// absent or not Ready for at least the grace ([`loses_members_at`] agrees); a Ready
        /// node never loses it; the loss never dates from after now; once lost, it stays lost
        /// as time goes on (a loss is never taken back by waiting), and a longer grace never
        /// loses a member a shorter one keeps.
        #[test]
        fn a_member_is_lost_exactly_past_the_grace(
            seen in seen(),
            grace_s in 0u64..600,
            now in 0i64..2_000_000,
            later in 0i64..1_000_000,
            more_s in 0u64..600,
        ) {
            let grace = Duration::from_secs(grace_s);
            let lost = member_lost("n", &seen, grace, now);
            let due = loses_members_at(&seen, grace);
            prop_assert_eq!(lost.is_some(), due.is_some_and(|at| at <= now));
            match &seen {
                NodeSeen::Ready => prop_assert!(lost.is_none()),
                NodeSeen::Absent => prop_assert_eq!(lost.as_ref().map(|l| l.reason), Some(NODE_LOST)),
                NodeSeen::NotReady { since_ms, .. } => {
                    prop_assert_eq!(lost.is_some(), now - since_ms >= grace.as_millis() as i64);
                    if let Some(l) = &lost {
                        prop_assert_eq!(l.reason, NODE_NOT_READY);
                        prop_assert_eq!(l.since_ms, *since_ms);
                    }
                }
            }
            if let Some(l) = &lost {
                prop_assert!(l.since_ms <= now);
                prop_assert!(l.message.contains("node n "));
                prop_assert!(member_lost("n", &seen, grace, now + later).is_some());
            }
            if member_lost("n", &seen, grace + Duration::from_secs(more_s), now).is_some() {
                prop_assert!(lost.is_some());
            }
            if let Some(next) = next_loss_at([&seen], grace, now) {
                prop_assert!(next > now && lost.is_none());
                prop_assert!(member_lost("n", &seen, grace, next).is_some());
                prop_assert!(member_lost("n", &seen, grace, next - 1).is_none());
            }
        }
    }
}
