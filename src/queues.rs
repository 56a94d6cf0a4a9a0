//! Queues for teams (`docs/design.md#queues`): the rules over `ManagedJobQueue` objects, pure.
//!
//! - [`Queues`]: every queue in force, as the scheduler applies it ([`QueuePolicy`]: weight,
//!   limits, the namespaces it admits), resolved from the objects and the namespaces' labels
//!   ([`Queues::resolve`]). The queue `default` needs no object: without one it has weight 1, no
//!   limits and admits every namespace, so with no queue objects at all the operator schedules
//!   exactly as one pool.
//! - [`selector_matches`]: a `metav1.LabelSelector` against a namespace's labels.
//! - [`share_order`]: which queue gets the next free slot: the lowest slots held / weight
//!   (Kueue's fair sharing, on slots instead of its dominant resource share over borrowed
//!   quota: <https://kueue.sigs.k8s.io/docs/concepts/fair_sharing/>), compared exactly by
//!   cross-multiplication; ties go to the higher weight, then the lower name.
//! - [`blocked`]: the reasons a queue's job waits that are the queue's own (missing, namespace
//!   not admitted, at `maxRunning` or `maxLaunching`), with the sentence its status shows.
//!
//! Usage counts only the slots held now, not recent history (Kueue's admission fair sharing
//! decays past usage): shares that follow the weights need no history while queues stay
//! backlogged, the rule keeps no state a restart or a lost store could lose, and a team that
//! used idle slots owes nothing when the others return (work conservation without debt).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::api::{
    DEFAULT_QUEUE, ManagedJobPool, ManagedJobQueue, QueuePreemption, QueueingStrategy,
    ReclaimShare, ReclaimWithinCohort, WaitReason, WithinQueue,
};
use crate::resources::Placement;
use crate::resources::quota::{QueueQuotas, Quota};

/// The namespaces a queue admits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admits {
    /// Every namespace (`namespaceSelector: {}`, or the implicit default queue).
    All,
    /// Only these (the namespaces whose labels match the selector, among those known).
    Only(BTreeSet<String>),
}

impl Admits {
    /// The namespaces it is limited to, if any (None: every namespace).
    pub fn only(&self) -> Option<&BTreeSet<String>> {
        match self {
            Admits::All => None,
            Admits::Only(set) => Some(set),
        }
    }

    /// True when the queue admits jobs of `namespace`.
    pub fn admits(&self, namespace: &str) -> bool {
        match self {
            Admits::All => true,
            Admits::Only(set) => set.contains(namespace),
        }
    }
}

/// A queue as the scheduler applies it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuePolicy {
    /// Its cohort and its quotas per pool and resource, in the order of its pools (empty: a
    /// queue of slots only, no pool, no fit check).
    pub quotas: QueueQuotas,
    /// Whether a waiting job that does not fit its quota or the nodes lets later ones go first.
    pub strategy: QueueingStrategy,
    /// Share of the caps while several queues have waiting jobs (at least 1).
    pub weight: u32,
    /// Most of its jobs holding a run slot at once; None: only the run cap.
    pub max_running: Option<usize>,
    /// Most of its jobs holding a launch slot at once; None: only the launch cap.
    pub max_launching: Option<usize>,
    /// The namespaces whose jobs it admits.
    pub admits: Admits,
    /// When it may stop running jobs to get its share (`spec.preemption`).
    pub preemption: Preemption,
}

/// A queue's preemption policy as the scheduler applies it (`spec.preemption`, resolved with
/// its defaults; `crate::preemption` decides with it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Preemption {
    /// Take run slots from queues above their share (`reclaimShare: Any`).
    pub reclaim_share: bool,
    /// Stop a lower-priority running job of this queue (`withinQueue: LowerPriority`).
    pub within_queue: bool,
    /// A job is taken only after running this long since its attempt started (ms).
    pub min_run_ms: i64,
    /// Most preemptions this queue causes in any [`crate::preemption::RATE_WINDOW_MS`].
    pub max_per_minute: usize,
    /// Take back quota its cohort borrows from it (`reclaimWithinCohort: Any`).
    pub reclaim_within_cohort: bool,
}

impl Preemption {
    /// No preemption at all (the default, and the implicit default queue's).
    pub const OFF: Preemption = Preemption {
        reclaim_share: false,
        within_queue: false,
        min_run_ms: crate::api::DEFAULT_MIN_RUN_SECONDS as i64 * 1000,
        max_per_minute: crate::api::DEFAULT_MAX_PREEMPTIONS_PER_MINUTE as usize,
        reclaim_within_cohort: false,
    };

    /// The policy `spec` (None: unset) asks for, defaults filled in.
    pub fn of(spec: Option<&QueuePreemption>) -> Preemption {
        let Some(p) = spec else {
            return Preemption::OFF;
        };
        Preemption {
            reclaim_share: p.reclaim_share == ReclaimShare::Any,
            within_queue: p.within_queue == WithinQueue::LowerPriority,
            reclaim_within_cohort: p.reclaim_within_cohort == ReclaimWithinCohort::Any,
            min_run_ms: i64::from(
                p.min_run_seconds
                    .unwrap_or(crate::api::DEFAULT_MIN_RUN_SECONDS),
            ) * 1000,
            max_per_minute: p
                .max_per_minute
                .unwrap_or(crate::api::DEFAULT_MAX_PREEMPTIONS_PER_MINUTE)
                .max(1) as usize,
        }
    }

    /// True when the queue may preempt at all.
    pub fn enabled(&self) -> bool {
        self.reclaim_share || self.within_queue || self.reclaim_within_cohort
    }
}

impl QueuePolicy {
    /// The queue `default` when no object of that name exists: weight 1, no limits, every
    /// namespace.
    pub fn implicit_default() -> QueuePolicy {
        QueuePolicy {
            quotas: QueueQuotas {
                weight: 1,
                ..Default::default()
            },
            strategy: QueueingStrategy::default(),
            weight: 1,
            max_running: None,
            max_launching: None,
            admits: Admits::All,
            preemption: Preemption::OFF,
        }
    }
}

static IMPLICIT_DEFAULT: std::sync::LazyLock<QueuePolicy> =
    std::sync::LazyLock::new(QueuePolicy::implicit_default);

/// Every queue in force: the ManagedJobQueue objects, resolved, and the pools
/// (ManagedJobPools) they may name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Queues {
    objects: BTreeMap<String, QueuePolicy>,
    pools: BTreeMap<String, Placement>,
}

impl Queues {
    /// No queue objects: one pool, the implicit default queue.
    pub fn single_pool() -> Queues {
        Queues::default()
    }

    /// The queues `objects` (name -> policy) define, without pools.
    pub fn new(objects: BTreeMap<String, QueuePolicy>) -> Queues {
        Queues {
            objects,
            pools: BTreeMap::new(),
        }
    }

    /// These queues with the pools `pools` (name -> what each adds to its Pods).
    pub fn with_pools(self, pools: BTreeMap<String, Placement>) -> Queues {
        Queues { pools, ..self }
    }

    /// What pool `name` adds to a Pod, if the pool exists (`local` always does: nothing).
    pub fn pool(&self, name: &str) -> Option<Placement> {
        if name == crate::api::LOCAL_POOL {
            return Some(Placement {
                pool: name.to_string(),
                ..Default::default()
            });
        }
        self.pools.get(name).cloned()
    }

    /// True when any queue has quotas on pools (admission then reads the cluster).
    pub fn any_quotas(&self) -> bool {
        self.objects.values().any(|p| !p.quotas.pools.is_empty())
    }

    /// The quotas of every queue that has pools, by queue name: what a pass's
    /// [`crate::resources::quota::Ledger`] is made of.
    pub fn quotas(&self) -> BTreeMap<String, crate::resources::quota::QueueQuotas> {
        self.objects
            .iter()
            .filter(|(_, p)| !p.quotas.pools.is_empty())
            .map(|(name, p)| (name.clone(), p.quotas.clone()))
            .collect()
    }

    /// The queues `objects` define, each selector resolved against `namespaces` (name ->
    /// labels): a selector matches the namespaces whose labels it selects; `{}` matches every
    /// namespace, known or not. Weights below 1 count as 1 (the API refuses them).
    pub fn resolve(
        objects: &[ManagedJobQueue],
        namespaces: &BTreeMap<String, BTreeMap<String, String>>,
        pools: &[ManagedJobPool],
    ) -> Queues {
        let mut out = BTreeMap::new();
        for q in objects {
            let Some(name) = q.metadata.name.clone() else {
                continue;
            };
            let selector = &q.spec.namespace_selector;
            let admits = if selector_is_empty(selector) {
                Admits::All
            } else {
                Admits::Only(
                    namespaces
                        .iter()
                        .filter(|(_, labels)| selector_matches(selector, labels))
                        .map(|(ns, _)| ns.clone())
                        .collect(),
                )
            };
            out.insert(
                name,
                QueuePolicy {
                    quotas: quotas_of(&q.spec),
                    strategy: q.spec.queueing_strategy,
                    weight: q.spec.weight.max(1),
                    max_running: q.spec.max_running.map(|n| n as usize),
                    max_launching: q.spec.max_launching.map(|n| n as usize),
                    admits,
                    preemption: Preemption::of(q.spec.preemption.as_ref()),
                },
            );
        }
        let pools = pools
            .iter()
            .filter_map(|p| {
                let name = p.metadata.name.clone()?;
                Some((
                    name.clone(),
                    Placement {
                        pool: name,
                        node_labels: p.spec.node_labels.clone(),
                        tolerations: p.spec.tolerations.clone(),
                    },
                ))
            })
            .collect();
        Queues {
            objects: out,
            pools,
        }
    }

    /// True when no queue object exists: every job of the default queue shares one pool, as
    /// before queues existed.
    pub fn is_single_pool(&self) -> bool {
        self.objects.is_empty()
    }

    /// The policy of queue `name`: its object's, the implicit default's for `default`, or None
    /// (no such queue: its jobs wait for it).
    pub fn get(&self, name: &str) -> Option<&QueuePolicy> {
        self.objects
            .get(name)
            .or_else(|| (name == DEFAULT_QUEUE).then(|| &*IMPLICIT_DEFAULT))
    }

    /// Every queue in force, by name: the objects and `default`.
    pub fn names(&self) -> BTreeSet<&str> {
        let mut names: BTreeSet<&str> = self.objects.keys().map(String::as_str).collect();
        names.insert(DEFAULT_QUEUE);
        names
    }
}

/// A queue's quotas from its spec: each quantity in milli-units (one the API let through that
/// is not a quantity counts as 0: nothing is admitted on it, rather than everything).
fn quotas_of(spec: &crate::api::ManagedJobQueueSpec) -> QueueQuotas {
    let amount = |q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| {
        crate::resources::amount::parse(&q.0).unwrap_or(0)
    };
    QueueQuotas {
        cohort: spec.cohort.clone(),
        weight: spec.weight.max(1),
        pools: spec
            .pools
            .iter()
            .map(|p| {
                (
                    p.name.clone(),
                    p.resources
                        .iter()
                        .map(|r| {
                            (
                                r.name.clone(),
                                Quota {
                                    nominal: amount(&r.nominal_quota),
                                    borrowing_limit: r.borrowing_limit.as_ref().map(amount),
                                    lending_limit: r.lending_limit.as_ref().map(amount),
                                },
                            )
                        })
                        .collect(),
                )
            })
            .collect(),
    }
}

fn selector_is_empty(s: &LabelSelector) -> bool {
    s.match_labels.as_ref().is_none_or(|m| m.is_empty())
        && s.match_expressions.as_ref().is_none_or(|e| e.is_empty())
}

/// True when `selector` selects an object with `labels` (metav1.LabelSelector semantics:
/// every `matchLabels` pair and every `matchExpressions` requirement hold; operators `In`,
/// `NotIn`, `Exists`, `DoesNotExist`). An unknown operator selects nothing: a queue never
/// admits a namespace by mistake.
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let pairs = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let expressions = selector.match_expressions.iter().flatten().all(|e| {
        let value = labels.get(&e.key);
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    pairs && expressions
}

/// The order in which queues get the next free slot: `a` before `b` (Less) when `a`'s
/// `held / weight` is lower, compared exactly (`a.held * b.weight` against
/// `b.held * a.weight`); ties go to the higher weight, then the lower name. Each argument is
/// (slots held, weight, name).
pub fn share_order(a: (usize, u32, &str), b: (usize, u32, &str)) -> Ordering {
    let (ha, wa, na) = a;
    let (hb, wb, nb) = b;
    let left = ha as u128 * u128::from(wb.max(1));
    let right = hb as u128 * u128::from(wa.max(1));
    left.cmp(&right).then(wb.cmp(&wa)).then(na.cmp(nb))
}

/// A queue's slots held now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueLoad {
    /// Its jobs holding a launch slot (Launching).
    pub launching: usize,
    /// Its jobs holding a run slot (Launching, Alive, AliveWaiting).
    pub alive: usize,
}

/// Why a job of `namespace` in queue `queue` waits, when the reason is the queue's own: no such
/// queue, its namespace not admitted (not checked when `namespace` is None), the queue at its
/// `maxRunning` or its `maxLaunching` (`load`: what the queue holds). None: the queue could
/// admit it now (what remains is its share and the caps). Each reason comes with the sentence
/// its status shows; the sentences hold no count that moves with every admission, so a job's
/// message changes only when its reason does (each change is an API write).
pub fn blocked(
    queues: &Queues,
    queue: &str,
    namespace: Option<&str>,
    load: QueueLoad,
) -> Option<(WaitReason, String)> {
    let Some(policy) = queues.get(queue) else {
        return Some((
            WaitReason::QueueMissing,
            format!(
                "waiting for queue {queue}: no ManagedJobQueue of that name exists; the job starts once it is applied"
            ),
        ));
    };
    if let Some(namespace) = namespace
        && !policy.admits.admits(namespace)
    {
        return Some((
            WaitReason::NamespaceNotAdmitted,
            format!(
                "queue {queue} does not admit namespace {namespace} (its namespaceSelector): the job does not run unless the queue admits the namespace"
            ),
        ));
    }
    if let Some(max) = policy.max_running
        && load.alive >= max
    {
        return Some((
            WaitReason::QueueMaxRunning,
            format!("queue {queue} is at its maxRunning ({max} jobs holding a run slot)"),
        ));
    }
    if let Some(max) = policy.max_launching
        && load.launching >= max
    {
        return Some((
            WaitReason::QueueMaxLaunching,
            format!("queue {queue} is at its maxLaunching ({max} jobs launching)"),
        ));
    }
    None
}

/// True when queue `queue`'s jobs wait for their share while the run cap is full: other queues
/// have jobs waiting too (`backlogged` queues, `backlogged_weight` their weights' sum, this
/// one's included) and this one holds at least its weighted share of the `run_cap` run slots
/// (`held / weight >= run_cap / backlogged_weight`).
pub fn share_used(
    held: usize,
    weight: u32,
    run_cap: usize,
    backlogged: usize,
    backlogged_weight: u64,
) -> bool {
    backlogged >= 2
        && held as u128 * u128::from(backlogged_weight)
            >= run_cap as u128 * u128::from(weight.max(1))
}

/// The sentence of a job whose queue holds its share ([`share_used`]).
pub fn share_used_message(queue: &str, weight: u32) -> String {
    format!(
        "queue {queue} holds at least its share of the run slots (weight {weight}) while other queues have jobs waiting: the queue with the lowest share gets the next free run slot"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selectors_follow_label_selector_semantics() {
        let team_a = labels(&[("team", "a"), ("kubernetes.io/metadata.name", "ns-a")]);
        let by_label = LabelSelector {
            match_labels: Some(labels(&[("team", "a")])),
            ..Default::default()
        };
        assert!(selector_matches(&by_label, &team_a));
        assert!(!selector_matches(&by_label, &labels(&[("team", "b")])));
        let expr = |op: &str, values: &[&str]| LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "team".into(),
                operator: op.into(),
                values: Some(values.iter().map(|v| v.to_string()).collect()),
            }]),
            ..Default::default()
        };
        assert!(selector_matches(&expr("In", &["a", "c"]), &team_a));
        assert!(!selector_matches(&expr("NotIn", &["a"]), &team_a));
        assert!(selector_matches(&expr("NotIn", &["a"]), &labels(&[])));
        assert!(selector_matches(&expr("Exists", &[]), &team_a));
        assert!(!selector_matches(&expr("DoesNotExist", &[]), &team_a));
        assert!(
            !selector_matches(&expr("Gt", &["1"]), &team_a),
            "unknown: nothing"
        );
        assert!(selector_matches(&LabelSelector::default(), &team_a));
    }

    #[test]
    fn the_default_queue_exists_without_an_object_and_others_do_not() {
        let q = Queues::single_pool();
        assert!(q.is_single_pool());
        assert_eq!(q.get(DEFAULT_QUEUE), Some(&QueuePolicy::implicit_default()));
        assert_eq!(q.get("gold"), None);
        let load = QueueLoad::default();
        assert_eq!(blocked(&q, DEFAULT_QUEUE, Some("any"), load), None);
        assert_eq!(
            blocked(&q, "gold", Some("any"), load).unwrap().0,
            WaitReason::QueueMissing
        );
    }

    #[test]
    fn a_queue_refuses_namespaces_it_does_not_admit_before_anything_else() {
        let mut objects = BTreeMap::new();
        objects.insert(
            "gold".to_string(),
            QueuePolicy {
                quotas: Default::default(),
                strategy: Default::default(),
                weight: 3,
                max_running: Some(0),
                max_launching: None,
                admits: Admits::Only(["a".to_string()].into()),
                preemption: Preemption::OFF,
            },
        );
        let q = Queues::new(objects);
        let load = QueueLoad::default();
        assert_eq!(
            blocked(&q, "gold", Some("b"), load).unwrap().0,
            WaitReason::NamespaceNotAdmitted
        );
        assert_eq!(
            blocked(&q, "gold", Some("a"), load).unwrap().0,
            WaitReason::QueueMaxRunning
        );
    }

    #[test]
    fn the_lowest_share_goes_first_then_the_heavier_queue_then_the_name() {
        use Ordering::*;
        // 2/1 against 6/3: equal shares; the heavier queue first.
        assert_eq!(share_order((2, 1, "a"), (6, 3, "b")), Greater);
        assert_eq!(share_order((1, 1, "a"), (6, 3, "b")), Less);
        assert_eq!(share_order((0, 1, "b"), (0, 1, "a")), Greater);
        assert_eq!(
            share_order((usize::MAX, u32::MAX, "a"), (1, 1, "b")),
            Greater
        );
    }

    #[test]
    fn a_share_is_used_only_while_other_queues_wait() {
        // Run cap 8, weights 1 and 3 both waiting: shares 2 and 6.
        assert!(share_used(2, 1, 8, 2, 4));
        assert!(!share_used(1, 1, 8, 2, 4));
        assert!(share_used(6, 3, 8, 2, 4));
        assert!(!share_used(5, 3, 8, 2, 4));
        // Alone, a queue's share is every slot: it waits for the cap, not its share.
        assert!(!share_used(8, 1, 8, 1, 1));
    }
}
