//! Whether an attempt's members can be placed now ([`Nodes::place`]): the node view admission
//! checks a job against (docs/design.md#resources), pure.
//!
//! A member fits on a node when the node is Ready and schedulable, has every label its pool and
//! its template's `nodeSelector` ask for and matches the template's required node affinity,
//! tolerates every `NoSchedule`/`NoExecute` taint of the node (its template's tolerations and
//! its pool's), and has every resource the member asks for free: allocatable less what bound
//! Pods request (every Pod of the cluster, not only ours) less what earlier admissions reserved
//! and have not bound yet. A gang fits when the nodes together take all its members: its
//! members are identical, so that is the sum over nodes of how many each takes.
//!
//! What kube-scheduler also weighs and this does not (inter-Pod affinity, topology spread,
//! volumes, ports) can still keep a Pod waiting after admission; the launch deadline then
//! gives the slot back as before. Members are placed, in this model, on the nodes with the
//! most of the member's largest resource free first, as kube-scheduler's default
//! `LeastAllocated` scoring spreads them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Toleration};

use super::amount::{Amount, ONE, PODS, Resources};

/// A node's taint, as placement reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Taint {
    /// The key.
    pub key: String,
    /// The value ("" when none).
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// A node as admission sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// Its name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its taints.
    pub taints: Vec<Taint>,
    /// `status.allocatable`, in milli-units (`pods` included).
    pub allocatable: Resources,
    /// What the Pods bound to it request (every namespace; finished Pods not counted), `pods`
    /// counting them.
    pub requested: Resources,
    /// Its `Ready` condition is True.
    pub ready: bool,
    /// `spec.unschedulable` (cordoned).
    pub unschedulable: bool,
}

impl NodeInfo {
    /// Allocatable less requested.
    pub fn free(&self) -> Resources {
        let mut free = self.allocatable.clone();
        free.sub(&self.requested);
        free
    }
}

/// What a pool's status shows ([`crate::api::ManagedJobPoolStatus`]): its Ready, schedulable
/// nodes (those with every one of `node_labels`), their allocatable resources summed and what
/// of that no bound Pod requests. Quantities as [`crate::resources::amount::show`] prints them.
pub fn pool_status(
    node_labels: &BTreeMap<String, String>,
    nodes: &[NodeInfo],
) -> crate::api::ManagedJobPoolStatus {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let mut allocatable = Resources::new();
    let mut free = Resources::new();
    let mut count = 0;
    for n in nodes.iter().filter(|n| {
        n.ready && !n.unschedulable && node_labels.iter().all(|(k, v)| n.labels.get(k) == Some(v))
    }) {
        count += 1;
        allocatable.add(&n.allocatable);
        let mut f = n.free();
        for (r, a) in n.free().iter() {
            if a < 0 {
                f.set(r, 0);
            }
        }
        free.add(&f);
    }
    let shown = |r: &Resources| {
        r.iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    Quantity(crate::resources::amount::show(k, v)),
                )
            })
            .collect()
    };
    // Every resource of the nodes shows what is free of it, none included.
    let free = allocatable
        .iter()
        .map(|(k, _)| {
            (
                k.to_string(),
                Quantity(crate::resources::amount::show(k, free.get(k))),
            )
        })
        .collect();
    crate::api::ManagedJobPoolStatus {
        nodes: count,
        allocatable: shown(&allocatable),
        free,
    }
}

/// Where a member may go: its pool's and its template's node constraints.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Constraints {
    /// Labels a node must have (the pool's `nodeLabels` and the template's `nodeSelector`).
    pub node_selector: BTreeMap<String, String>,
    /// The template's required node affinity: a node must match one of these terms (every
    /// expression of it); empty: no affinity.
    pub affinity: Vec<Vec<NodeSelectorRequirement>>,
    /// The taints a member tolerates (the template's and the pool's).
    pub tolerations: Vec<Toleration>,
}

/// True when `t` tolerates `taint` (Kubernetes' `Toleration.ToleratesTaint`).
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = t.effect.as_deref()
        && !effect.is_empty()
        && effect != taint.effect
    {
        return false;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => t
            .key
            .as_deref()
            .is_none_or(|k| k.is_empty() || k == taint.key),
        _ => {
            t.key.as_deref() == Some(taint.key.as_str())
                && t.value.as_deref().unwrap_or("") == taint.value
        }
    }
}

fn matches_expression(labels: &BTreeMap<String, String>, e: &NodeSelectorRequirement) -> bool {
    let value = labels.get(&e.key);
    let values = e.values.as_deref().unwrap_or_default();
    match e.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|b| b.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if e.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

impl Constraints {
    /// True when a member may go to `node` at all (whatever is free there).
    pub fn admits(&self, node: &NodeInfo) -> bool {
        node.ready
            && !node.unschedulable
            && self
                .node_selector
                .iter()
                .all(|(k, v)| node.labels.get(k) == Some(v))
            && (self.affinity.is_empty()
                || self
                    .affinity
                    .iter()
                    .any(|term| term.iter().all(|e| matches_expression(&node.labels, e))))
            && node
                .taints
                .iter()
                .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
                .all(|taint| self.tolerations.iter().any(|t| tolerates(t, taint)))
    }
}

/// How many members asking for `member` fit in `free` (every resource it asks for; a member
/// that asks for nothing but a Pod takes what `pods` allows).
pub fn members_in(free: &Resources, member: &Resources) -> i64 {
    member
        .iter()
        .filter(|(_, need)| *need > 0)
        .map(|(name, need)| free.get(name).max(0) / need)
        .min()
        .unwrap_or(i64::MAX)
}

/// The resource a member asks most of, relative to a node's allocatable (its dominant one),
/// used to order nodes; `pods` when it asks for nothing else.
fn dominant(member: &Resources) -> &str {
    member
        .iter()
        .filter(|(name, need)| *name != PODS && *need > 0)
        .max_by_key(|(name, need)| {
            // GPUs and other extended resources dominate cpu and memory.
            let weight: Amount = match *name {
                "cpu" => 1,
                "memory" => 0,
                _ => 2,
            };
            (weight, *need)
        })
        .map_or(PODS, |(name, _)| name)
}

/// The nodes of the cluster with what is free on each, as one scheduling pass sees them.
///
/// A pass asks the same questions many times (thousands of candidates, a few shapes of member
/// on a few pools), so the view remembers its answers: the nodes each distinct [`Constraints`]
/// admits (a node's labels, taints and readiness do not change within a view, only what is
/// free on it), and per such set and member shape how many members fit now, kept exact as
/// members are placed and released (only the changed node is counted again), and the
/// [`Shortfall`], recomputed after a change to a node of its set. Every answer is the one a
/// scan of all the nodes gives.
#[derive(Clone, Debug, Default)]
pub struct Nodes {
    nodes: Vec<NodeInfo>,
    free: Vec<Resources>,
    memo: std::cell::RefCell<Memo>,
}

/// What a [`Nodes`] view remembers (see its doc).
#[derive(Clone, Debug, Default)]
struct Memo {
    /// Each distinct constraints asked about, with the nodes it admits (ascending) and, by node
    /// index, whether it admits that node.
    sets: Vec<Eligible>,
}

#[derive(Clone, Debug)]
struct Eligible {
    constraints: Constraints,
    nodes: Vec<usize>,
    admits: Vec<bool>,
    /// Per member shape: members that fit on these nodes now, all together.
    fit: std::collections::HashMap<Resources, i64>,
    /// Per member shape: the shortfall, until a node of the set changes.
    shortfalls: std::collections::HashMap<Resources, Shortfall>,
}

/// Where an attempt's members were placed: the index of a node for each member.
pub type Placed = Vec<usize>;

/// What a pool's nodes offer a member that does not fit: for the message of a job that waits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shortfall {
    /// Nodes a member may go to at all (Ready, schedulable, labels, taints).
    pub eligible: usize,
    /// Members that fit on them now, all together.
    pub members_fit: i64,
    /// The most members one node takes.
    pub most_on_one_node: i64,
    /// The most of the member's dominant resource free on one eligible node, and its name.
    pub largest_free: (String, Amount),
    /// The members the eligible nodes could take were nothing else bound to them (their
    /// allocatable): 0 means one member fits on no node of the pool ever, whatever ends.
    pub members_ever: i64,
    /// The most of the member's dominant resource one eligible node has in all.
    pub largest_allocatable: Amount,
}

impl Nodes {
    /// The view of `nodes`, everything bound already counted in their `requested`.
    pub fn new(nodes: Vec<NodeInfo>) -> Nodes {
        let free = nodes.iter().map(NodeInfo::free).collect();
        Nodes {
            nodes,
            free,
            memo: Default::default(),
        }
    }

    /// The nodes.
    pub fn nodes(&self) -> &[NodeInfo] {
        &self.nodes
    }

    /// What is free on node `i` now (less what was placed in this view).
    pub fn free(&self, i: usize) -> &Resources {
        &self.free[i]
    }

    /// The index in the memo of the set of nodes `constraints` admits (computed on first use:
    /// one scan of the nodes).
    fn set_of(&self, constraints: &Constraints) -> usize {
        let mut memo = self.memo.borrow_mut();
        if let Some(k) = memo.sets.iter().position(|e| e.constraints == *constraints) {
            return k;
        }
        let admits: Vec<bool> = self.nodes.iter().map(|n| constraints.admits(n)).collect();
        let nodes = (0..self.nodes.len()).filter(|&i| admits[i]).collect();
        memo.sets.push(Eligible {
            constraints: constraints.clone(),
            nodes,
            admits,
            fit: Default::default(),
            shortfalls: Default::default(),
        });
        memo.sets.len() - 1
    }

    /// The nodes `constraints` admits at all, ascending.
    pub fn eligible(&self, constraints: &Constraints) -> Vec<usize> {
        let k = self.set_of(constraints);
        self.memo.borrow().sets[k].nodes.clone()
    }

    /// How many members asking for `member` fit now on the nodes `constraints` admits, all
    /// together (saturating).
    pub fn members_fit(&self, member: &Resources, constraints: &Constraints) -> i64 {
        let k = self.set_of(constraints);
        let mut memo = self.memo.borrow_mut();
        let set = &mut memo.sets[k];
        if let Some(n) = set.fit.get(member) {
            return *n;
        }
        let n = set
            .nodes
            .iter()
            .map(|&i| members_in(&self.free[i], member))
            .fold(0, i64::saturating_add);
        set.fit.insert(member.clone(), n);
        n
    }

    /// Changes what is free on node `i` by `change`, keeping the memo exact.
    fn change(&mut self, i: usize, change: impl FnOnce(&mut Resources)) {
        let memo = self.memo.get_mut();
        let before: Vec<Vec<(Resources, i64)>> = memo
            .sets
            .iter()
            .map(|set| {
                if !set.admits[i] {
                    return Vec::new();
                }
                set.fit
                    .keys()
                    .map(|m| (m.clone(), members_in(&self.free[i], m)))
                    .collect()
            })
            .collect();
        change(&mut self.free[i]);
        for (set, before) in memo.sets.iter_mut().zip(before) {
            if !set.admits[i] {
                continue;
            }
            set.shortfalls.clear();
            for (m, was) in before {
                let now = members_in(&self.free[i], &m);
                if let Some(total) = set.fit.get_mut(&m) {
                    *total = total.saturating_add(now - was);
                    if *total == i64::MAX || was == i64::MAX || now == i64::MAX {
                        // Saturated: count the set again on the next question.
                        set.fit.remove(&m);
                    }
                }
            }
        }
    }

    /// True when `count` members asking for `member` fit on the nodes `constraints` admits now
    /// (what [`Nodes::place`] would do, without taking anything).
    pub fn fits(&self, member: &Resources, count: u32, constraints: &Constraints) -> bool {
        self.members_fit(member, constraints) >= i64::from(count)
    }

    /// Places `count` members asking for `member` on nodes `constraints` admits, taking what
    /// they use from the view; None (and the view unchanged) when they do not all fit. Nodes
    /// with the most of the member's dominant resource free go first.
    pub fn place(
        &mut self,
        member: &Resources,
        count: u32,
        constraints: &Constraints,
    ) -> Option<Placed> {
        if !self.fits(member, count, constraints) {
            return None;
        }
        let key = dominant(member);
        let mut eligible: Vec<(usize, i64)> = self
            .eligible(constraints)
            .into_iter()
            .map(|i| (i, members_in(&self.free[i], member)))
            .filter(|(_, k)| *k > 0)
            .collect();
        let total: i64 = eligible
            .iter()
            .map(|(_, k)| *k)
            .fold(0, i64::saturating_add);
        if total < i64::from(count) {
            return None;
        }
        eligible.sort_by(|a, b| {
            self.free[b.0]
                .get(key)
                .cmp(&self.free[a.0].get(key))
                .then(a.0.cmp(&b.0))
        });
        let mut placed = Vec::with_capacity(count as usize);
        let mut placed_on = Vec::with_capacity(count as usize);
        let mut left = i64::from(count);
        // Spread: one member per node per round, most free first, as long as members remain.
        while left > 0 {
            let mut progressed = false;
            for (i, k) in eligible.iter_mut() {
                if left == 0 {
                    break;
                }
                if *k > 0 {
                    placed_on.push(*i);
                    *k -= 1;
                    left -= 1;
                    progressed = true;
                }
            }
            if !progressed {
                break;
            }
        }
        debug_assert_eq!(left, 0);
        for i in placed_on {
            self.change(i, |free| free.sub(member));
            placed.push(i);
        }
        Some(placed)
    }

    /// Gives back what `place` took for `placed` (a plan undone).
    pub fn unplace(&mut self, member: &Resources, placed: &Placed) {
        for &i in placed {
            self.change(i, |free| free.add(member));
        }
    }

    /// Frees what a running member asking for `member` holds on node `i` (a preemption
    /// victim, in a plan).
    pub fn release(&mut self, i: usize, member: &Resources) {
        self.change(i, |free| free.add(member));
    }

    /// Takes what a member asking for `member` uses on node `i` (a plan undoing a release).
    pub fn take_on(&mut self, i: usize, member: &Resources) {
        self.change(i, |free| free.sub(member));
    }

    /// The index of the node named `name`.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// What the nodes `constraints` admits offer a member asking for `member` now.
    pub fn shortfall(&self, member: &Resources, constraints: &Constraints) -> Shortfall {
        let k = self.set_of(constraints);
        if let Some(s) = self.memo.borrow().sets[k].shortfalls.get(member) {
            return s.clone();
        }
        let key = dominant(member).to_string();
        let mut s = Shortfall {
            largest_free: (key.clone(), 0),
            ..Default::default()
        };
        let eligible = self.memo.borrow().sets[k].nodes.clone();
        for i in eligible {
            s.eligible += 1;
            let k = members_in(&self.free[i], member);
            s.members_fit = s.members_fit.saturating_add(k);
            s.most_on_one_node = s.most_on_one_node.max(k);
            s.largest_free.1 = s.largest_free.1.max(self.free[i].get(&key).max(0));
            let all = &self.nodes[i].allocatable;
            s.members_ever = s.members_ever.saturating_add(members_in(all, member));
            s.largest_allocatable = s.largest_allocatable.max(all.get(&key));
        }
        self.memo.borrow_mut().sets[k]
            .shortfalls
            .insert(member.clone(), s.clone());
        s
    }
}

/// The cluster as one scheduling pass sees it, from the operator's Node and Pod watches: every
/// node with what every bound, unfinished Pod of the cluster requests of it, and how many
/// members of each of our attempts are bound already (the rest are still reserved on the
/// nodes by their admission). Built by the operator (`operator::cluster`), read by the pass.
#[derive(Clone, Debug, Default)]
pub struct ClusterSnapshot {
    /// Every node (`requested` counts every bound Pod that has not finished).
    pub nodes: Vec<NodeInfo>,
    /// The nodes our attempts' members are bound to now (one entry per bound member), by (the
    /// ManagedJob's uid, the attempt's number as the Pods' attempt label says it): how many
    /// are bound (the rest are reserved by their admission), and where a preemption would
    /// free room.
    pub bound: std::collections::HashMap<(String, i32), Vec<String>>,
    /// Grows with every change the watches saw: a pass may keep what it built from an equal one.
    pub version: u64,
}

/// Where the cluster view comes from (the operator's watches): None while it is not complete
/// (not listed yet, or the API refused the watches), in which case no pool admits anything.
pub trait ClusterView: Send + Sync {
    /// The cluster now.
    fn snapshot(&self) -> Option<std::sync::Arc<ClusterSnapshot>>;
}

/// A member that asks for nothing still takes a Pod.
pub fn one_pod() -> Resources {
    let mut r = Resources::new();
    r.set(PODS, ONE);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(n: i64) -> Resources {
        let mut r = Resources::new();
        r.set("nvidia.com/gpu", n * ONE);
        r.set(PODS, ONE);
        r
    }

    fn node(name: &str, gpus_free: i64) -> NodeInfo {
        let mut allocatable = Resources::new();
        allocatable.set("nvidia.com/gpu", 8 * ONE);
        allocatable.set(PODS, 110 * ONE);
        let mut requested = Resources::new();
        requested.set("nvidia.com/gpu", (8 - gpus_free) * ONE);
        NodeInfo {
            name: name.into(),
            labels: [("pool".to_string(), "gpu".to_string())].into(),
            allocatable,
            requested,
            ready: true,
            ..Default::default()
        }
    }

    /// A pool's status counts its Ready, schedulable nodes with its labels, sums their
    /// allocatable and what is free (0 shown, never below 0: a node overcommitted by Pods bound
    /// by hand counts none free).
    #[test]
    fn a_pools_status_counts_its_ready_schedulable_nodes() {
        let mut cordoned = node("c", 8);
        cordoned.unschedulable = true;
        let mut not_ready = node("d", 8);
        not_ready.ready = false;
        let mut other = node("e", 8);
        other.labels.clear();
        let mut over = node("f", 0);
        over.requested.set("nvidia.com/gpu", 9 * ONE);
        let nodes = [node("a", 0), node("b", 3), cordoned, not_ready, other, over];
        let s = pool_status(&[("pool".to_string(), "gpu".to_string())].into(), &nodes);
        assert_eq!(s.nodes, 3);
        assert_eq!(s.allocatable["nvidia.com/gpu"].0, "24");
        assert_eq!(s.free["nvidia.com/gpu"].0, "3");
        assert_eq!(s.free["pods"].0, "330");
        let none = pool_status(&[("pool".to_string(), "tpu".to_string())].into(), &nodes);
        assert_eq!((none.nodes, none.free.len()), (0, 0));
    }

    /// Two nodes with 4 free GPUs each do not take one 8-GPU Pod (kueue#3211), but do take two
    /// 4-GPU members; an 8-member gang on 7 free nodes does not fit, and nothing is taken.
    #[test]
    fn fit_is_per_node_and_a_gang_is_all_or_nothing() {
        let any = Constraints::default();
        let mut v = Nodes::new(vec![node("a", 4), node("b", 4)]);
        assert_eq!(v.place(&gpus(8), 1, &any), None);
        let s = v.shortfall(&gpus(8), &any);
        assert_eq!(
            (s.eligible, s.members_fit, s.largest_free.1),
            (2, 0, 4 * ONE)
        );
        assert_eq!(v.place(&gpus(4), 2, &any), Some(vec![0, 1]));
        assert_eq!(v.free(0).get("nvidia.com/gpu"), 0);

        let mut seven = Nodes::new((0..7).map(|i| node(&format!("n{i}"), 8)).collect());
        assert_eq!(seven.place(&gpus(8), 8, &any), None);
        assert!((0..7).all(|i| seven.free(i).get("nvidia.com/gpu") == 8 * ONE));
        assert_eq!(seven.place(&gpus(8), 7, &any).map(|p| p.len()), Some(7));
    }

    #[test]
    fn labels_taints_readiness_and_affinity_decide_where_a_member_may_go() {
        let mut tainted = node("spot", 8);
        tainted.taints.push(Taint {
            key: "spot".into(),
            value: "".into(),
            effect: "NoSchedule".into(),
        });
        let mut not_ready = node("down", 8);
        not_ready.ready = false;
        let mut cordoned = node("cordoned", 8);
        cordoned.unschedulable = true;
        let mut other = node("cpu", 8);
        other.labels = [("pool".to_string(), "cpu".to_string())].into();
        let gpu_pool = Constraints {
            node_selector: [("pool".to_string(), "gpu".to_string())].into(),
            ..Default::default()
        };
        for n in [&tainted, &not_ready, &cordoned, &other] {
            assert!(!gpu_pool.admits(n), "{}", n.name);
        }
        assert!(gpu_pool.admits(&node("ok", 8)));
        let tolerant = Constraints {
            tolerations: vec![Toleration {
                key: Some("spot".into()),
                operator: Some("Exists".into()),
                effect: Some("NoSchedule".into()),
                ..Default::default()
            }],
            ..gpu_pool.clone()
        };
        assert!(tolerant.admits(&tainted));
        let affine = Constraints {
            affinity: vec![vec![NodeSelectorRequirement {
                key: "pool".into(),
                operator: "In".into(),
                values: Some(vec!["cpu".into()]),
            }]],
            ..Default::default()
        };
        assert!(affine.admits(&other) && !affine.admits(&node("ok", 8)));
    }

    /// A member that needs no GPU still needs a Pod slot: a node full of Pods takes none.
    #[test]
    fn pods_count_as_a_resource() {
        let mut full = node("full", 8);
        full.requested.set(PODS, 110 * ONE);
        let mut v = Nodes::new(vec![full]);
        assert_eq!(v.place(&one_pod(), 1, &Constraints::default()), None);
    }
}
