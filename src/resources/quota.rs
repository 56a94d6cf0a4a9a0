//! Quotas in resources (docs/design.md#resources), pure: each queue's nominal quota per pool
//! and resource, the lending within a cohort, and the weighted dominant resource share that
//! orders queues that borrow.
//!
//! The rules are Kueue's for a flat cohort (<https://kueue.sigs.k8s.io/docs/concepts/cluster_queue/>,
//! "Cohort", `borrowingLimit`, `lendingLimit`). For a queue `q`, pool `f` and resource `r`:
//! nominal `N`, lendable `L = min(N, lendingLimit)` (all of `N` without a limit), guaranteed
//! `G = N - L` (never lent), borrowing limit `B` (None: unlimited), usage `U` (what q's jobs
//! that hold a run slot on `f` ask for). The cohort's pool is the sum of its queues' `L`; a
//! queue draws `D = max(0, U - G)` from it; what is free is the pool less every draw. A demand
//! `d` fits when `U + d <= N + B` (when `B` is set) and the extra draw
//! `max(0, U + d - G) - D` is free; without a cohort, when `U + d <= N`. A resource a queue's
//! pool does not list is not limited by quota there.
//!
//! Fair sharing (<https://kueue.sigs.k8s.io/docs/concepts/fair_sharing/>): a queue's share is
//! the largest, over its pools and resources, of what it borrows (`max(0, U - N)`) divided by
//! its cohort's pool of that resource, divided by its weight; the queue with the lower share
//! after an admission borrows first. Shares are compared exactly, as fractions.

use std::cell::RefCell;
use std::cmp::Ordering;
use std::collections::BTreeMap;

use super::amount::{Amount, Resources, show};

/// One queue's quota of one resource in one pool, in milli-units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quota {
    /// What the queue is promised.
    pub nominal: Amount,
    /// Most it may use above `nominal`, borrowing from its cohort; None: no limit but the
    /// cohort's.
    pub borrowing_limit: Option<Amount>,
    /// Most of `nominal` the cohort may borrow; None: all of it.
    pub lending_limit: Option<Amount>,
}

impl Quota {
    /// What of `nominal` the cohort may borrow.
    pub fn lendable(&self) -> Amount {
        self.lending_limit
            .map_or(self.nominal, |l| l.min(self.nominal))
    }

    /// What of `nominal` is never lent.
    pub fn guaranteed(&self) -> Amount {
        self.nominal - self.lendable()
    }
}

/// A queue's quotas: its cohort, its weight and, per pool in the order the queue lists them, a
/// quota per resource.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueQuotas {
    /// The cohort it lends to and borrows from; None: neither.
    pub cohort: Option<String>,
    /// Its weight (at least 1).
    pub weight: u32,
    /// Its pools in order of preference, each with its quota per resource.
    pub pools: Vec<(String, BTreeMap<String, Quota>)>,
}

impl QueueQuotas {
    /// The quotas of `pool`, if the queue lists it.
    pub fn pool(&self, pool: &str) -> Option<&BTreeMap<String, Quota>> {
        self.pools.iter().find(|(p, _)| p == pool).map(|(_, q)| q)
    }
}

/// A (pool, resource) pair.
pub type Dim = (String, String);

/// Why a demand does not fit a queue's quota on a pool, in numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaShortfall {
    /// The pool.
    pub pool: String,
    /// The resource that does not fit.
    pub resource: String,
    /// What the demand asks of it.
    pub need: Amount,
    /// What the queue uses now.
    pub used: Amount,
    /// Its nominal quota.
    pub nominal: Amount,
    /// Its borrowing limit, when that is what stops it.
    pub borrowing_limit: Option<Amount>,
    /// What its cohort could lend it now (None: no cohort).
    pub cohort_free: Option<Amount>,
    /// Who borrows in the cohort, and how much.
    pub borrowers: Vec<(String, Amount)>,
}

impl QuotaShortfall {
    /// "needs 8 nvidia.com/gpu on pool a100": what the sentence begins with.
    pub fn needs(&self) -> String {
        format!(
            "needs {} {} on pool {}",
            show(&self.resource, self.need),
            self.resource,
            self.pool
        )
    }

    /// "needs 8 nvidia.com/gpu on pool a100: team-b uses 16 of 16, cohort has 0 to lend
    /// (team-a borrows 16)".
    pub fn sentence(&self, queue: &str) -> String {
        let s = |a: Amount| show(&self.resource, a);
        let mut out = format!(
            "{}: {queue} uses {} of {}",
            self.needs(),
            s(self.used),
            s(self.nominal)
        );
        if let Some(b) = self.borrowing_limit {
            out.push_str(&format!(" and may borrow at most {}", s(b)));
        }
        match self.cohort_free {
            Some(free) => {
                out.push_str(&format!(", cohort has {} to lend", s(free)));
                if !self.borrowers.is_empty() {
                    let who: Vec<String> = self
                        .borrowers
                        .iter()
                        .map(|(q, a)| format!("{q} borrows {}", s(*a)))
                        .collect();
                    out.push_str(&format!(" ({})", who.join(", ")));
                }
            }
            None => out.push_str(" (no cohort to borrow from)"),
        }
        out
    }
}

/// A queue's weighted dominant resource share: `num / den`, compared exactly. Zero for a queue
/// that borrows nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share {
    num: i128,
    den: i128,
}

impl Share {
    /// No share.
    pub const ZERO: Share = Share { num: 0, den: 1 };

    /// The share in thousandths (for messages and status).
    pub fn per_mille(&self) -> i64 {
        (self.num * 1000 / self.den.max(1)) as i64
    }
}

impl Ord for Share {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.num * other.den).cmp(&(other.num * self.den))
    }
}

impl PartialOrd for Share {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// One queue's quota of one resource, as its status shows it (milli-units).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuotaUse {
    /// The resource.
    pub resource: String,
    /// Its nominal quota.
    pub nominal: Amount,
    /// What its jobs use.
    pub used: Amount,
    /// What it uses above its nominal quota.
    pub borrowed: Amount,
    /// What of its nominal quota other queues of its cohort use.
    pub lent: Amount,
}

/// Every queue's quotas and usage, as one scheduling pass sees them: what each may take now.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    quotas: BTreeMap<String, QueueQuotas>,
    /// Per queue, per pool: what it uses.
    usage: BTreeMap<String, BTreeMap<String, Resources>>,
    /// Per cohort: its queues, by name (read by every quota check: built once).
    cohorts: BTreeMap<String, Vec<String>>,
    /// What was found of each cohort, pool and resource asked of ([`Ledger::cohort_pool`],
    /// [`Ledger::borrowers`]: each a walk over the cohort's queues, asked by every candidate's
    /// quota check and share), until a queue of the cohort takes or gives that resource on
    /// that pool.
    memo: RefCell<CohortMemo>,
}

/// Per cohort, pool and resource: what a [`Ledger`] remembers of it.
type CohortMemo = BTreeMap<String, BTreeMap<String, BTreeMap<String, CohortFacts>>>;

/// What a [`Ledger`] remembers of one cohort, pool and resource.
#[derive(Clone, Debug, Default)]
struct CohortFacts {
    /// [`Ledger::cohort_pool`]'s answer.
    pool: Option<(Amount, Amount)>,
    /// [`Ledger::borrowers`]' answer.
    borrowers: Option<Vec<(String, Amount)>>,
}

impl Ledger {
    /// The ledger of `quotas` (queues without quotas need not be there) with `usage`: what each
    /// queue's jobs holding a run slot ask for, per pool and resource.
    pub fn new(
        quotas: BTreeMap<String, QueueQuotas>,
        usage: BTreeMap<String, BTreeMap<Dim, Amount>>,
    ) -> Ledger {
        let mut by_pool: BTreeMap<String, BTreeMap<String, Resources>> = BTreeMap::new();
        for (queue, dims) in usage {
            let pools = by_pool.entry(queue).or_default();
            for ((pool, resource), a) in dims {
                let r = pools.entry(pool).or_default();
                r.set(&resource, r.get(&resource).saturating_add(a));
            }
        }
        let mut cohorts: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, q) in &quotas {
            if let Some(c) = &q.cohort {
                cohorts.entry(c.clone()).or_default().push(name.clone());
            }
        }
        Ledger {
            quotas,
            usage: by_pool,
            cohorts,
            memo: Default::default(),
        }
    }

    /// Runs `f` on what is remembered of `cohort`, `pool` and `resource` (an empty entry the
    /// first time).
    fn facts<T>(
        &self,
        (cohort, pool, resource): (&str, &str, &str),
        f: impl FnOnce(&mut CohortFacts) -> T,
    ) -> T {
        let mut memo = self.memo.borrow_mut();
        let known = memo
            .get(cohort)
            .and_then(|m| m.get(pool))
            .is_some_and(|m| m.contains_key(resource));
        if !known {
            memo.entry(cohort.to_string())
                .or_default()
                .entry(pool.to_string())
                .or_default()
                .insert(resource.to_string(), CohortFacts::default());
        }
        let facts = memo
            .get_mut(cohort)
            .and_then(|m| m.get_mut(pool))
            .and_then(|m| m.get_mut(resource))
            .expect("inserted above");
        f(facts)
    }

    /// The queues with quotas.
    pub fn quotas(&self) -> &BTreeMap<String, QueueQuotas> {
        &self.quotas
    }

    /// True when `queue` has quotas (it admits only onto its pools).
    pub fn has_quotas(&self, queue: &str) -> bool {
        self.quotas.get(queue).is_some_and(|q| !q.pools.is_empty())
    }

    /// What `queue` uses of `resource` on `pool`.
    pub fn used(&self, queue: &str, pool: &str, resource: &str) -> Amount {
        self.usage
            .get(queue)
            .and_then(|u| u.get(pool))
            .map_or(0, |r| r.get(resource))
    }

    fn quota(&self, queue: &str, pool: &str, resource: &str) -> Option<Quota> {
        self.quotas.get(queue)?.pool(pool)?.get(resource).copied()
    }

    fn cohort_members<'a>(&'a self, cohort: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.cohorts
            .get(cohort)
            .into_iter()
            .flatten()
            .map(String::as_str)
    }

    /// The cohort's pool of `resource` on `pool` and what is free of it.
    fn cohort_pool(&self, cohort: &str, pool: &str, resource: &str) -> (Amount, Amount) {
        let key = (cohort, pool, resource);
        if let Some(known) = self.facts(key, |f| f.pool) {
            return known;
        }
        let found = self.walk_cohort_pool(cohort, pool, resource);
        self.facts(key, |f| f.pool = Some(found));
        found
    }

    /// [`Ledger::cohort_pool`] found by walking the cohort's queues.
    fn walk_cohort_pool(&self, cohort: &str, pool: &str, resource: &str) -> (Amount, Amount) {
        let (mut total, mut drawn) = (0, 0);
        for q in self.cohort_members(cohort) {
            if let Some(quota) = self.quota(q, pool, resource) {
                total += quota.lendable();
                drawn += (self.used(q, pool, resource) - quota.guaranteed()).max(0);
            } else {
                // A queue without this quota draws all it uses from the cohort.
                drawn += self.used(q, pool, resource);
            }
        }
        (total, total - drawn)
    }

    /// Whether `queue` may take `demand` (the whole attempt's) on `pool` now: Ok(true) when it
    /// would borrow, Ok(false) when within its nominal quota; the first resource that does not
    /// fit otherwise.
    pub fn admits(
        &self,
        queue: &str,
        pool: &str,
        demand: &Resources,
    ) -> Result<bool, Box<QuotaShortfall>> {
        let Some(q) = self.quotas.get(queue) else {
            return Ok(false);
        };
        let Some(quotas) = q.pool(pool) else {
            return Ok(false);
        };
        let mut borrows = false;
        for (resource, need) in demand.iter() {
            let Some(quota) = quotas.get(resource).copied() else {
                continue;
            };
            let used = self.used(queue, pool, resource);
            let new = used.saturating_add(need);
            let short = |borrowing_limit, cohort_free| {
                Box::new(QuotaShortfall {
                    pool: pool.to_string(),
                    resource: resource.to_string(),
                    need,
                    used,
                    nominal: quota.nominal,
                    borrowing_limit,
                    cohort_free,
                    borrowers: q
                        .cohort
                        .as_deref()
                        .map(|c| self.borrowers(c, pool, resource))
                        .unwrap_or_default(),
                })
            };
            if new > quota.nominal {
                borrows = true;
            }
            if let Some(b) = quota.borrowing_limit
                && new > quota.nominal.saturating_add(b)
            {
                return Err(short(Some(b), None));
            }
            match &q.cohort {
                None => {
                    if new > quota.nominal {
                        return Err(short(None, None));
                    }
                }
                Some(cohort) => {
                    let g = quota.guaranteed();
                    let extra = (new - g).max(0) - (used - g).max(0);
                    let (_, free) = self.cohort_pool(cohort, pool, resource);
                    if extra > free {
                        return Err(short(None, Some(free.max(0))));
                    }
                }
            }
        }
        Ok(borrows)
    }

    /// True when `demand` on `pool` stays within `queue`'s nominal quota (a reclaim may take
    /// back what others borrowed for it).
    pub fn within_nominal(&self, queue: &str, pool: &str, demand: &Resources) -> bool {
        let Some(quotas) = self.quotas.get(queue).and_then(|q| q.pool(pool)) else {
            return false;
        };
        demand.iter().all(|(resource, need)| {
            quotas
                .get(resource)
                .is_none_or(|q| self.used(queue, pool, resource).saturating_add(need) <= q.nominal)
        })
    }

    /// Counts `demand` on `pool` as used by `queue` (an admission).
    pub fn take(&mut self, queue: &str, pool: &str, demand: &Resources) {
        self.add(queue, pool, demand, 1);
    }

    /// Adds `sign` x `demand` to what `queue` uses on `pool`.
    fn add(&mut self, queue: &str, pool: &str, demand: &Resources, sign: Amount) {
        let u = match self.usage.get_mut(queue) {
            Some(u) => u,
            None => self.usage.entry(queue.to_string()).or_default(),
        };
        let r = match u.get_mut(pool) {
            Some(r) => r,
            None => u.entry(pool.to_string()).or_default(),
        };
        for (resource, a) in demand.iter() {
            r.set(resource, r.get(resource).saturating_add(sign * a));
        }
        // What the queue's cohort had of these resources on this pool is no longer known.
        if let Some(cohort) = self.quotas.get(queue).and_then(|q| q.cohort.as_deref())
            && let Some(by_resource) = self
                .memo
                .get_mut()
                .get_mut(cohort)
                .and_then(|m| m.get_mut(pool))
        {
            for (resource, _) in demand.iter() {
                by_resource.remove(resource);
            }
        }
    }

    /// Gives `demand` on `pool` back from `queue` (a job stopped, in a plan).
    pub fn give(&mut self, queue: &str, pool: &str, demand: &Resources) {
        self.add(queue, pool, demand, -1);
    }

    /// What `queue` borrows of `resource` on `pool`.
    pub fn borrowed(&self, queue: &str, pool: &str, resource: &str) -> Amount {
        self.quota(queue, pool, resource)
            .map_or(0, |q| (self.used(queue, pool, resource) - q.nominal).max(0))
    }

    /// The queues of `cohort` that borrow `resource` on `pool`, and how much, by name.
    pub fn borrowers(&self, cohort: &str, pool: &str, resource: &str) -> Vec<(String, Amount)> {
        let key = (cohort, pool, resource);
        if let Some(known) = self.facts(key, |f| f.borrowers.clone()) {
            return known;
        }
        let found = self.walk_borrowers(cohort, pool, resource);
        self.facts(key, |f| f.borrowers = Some(found.clone()));
        found
    }

    /// [`Ledger::borrowers`] found by walking the cohort's queues.
    fn walk_borrowers(&self, cohort: &str, pool: &str, resource: &str) -> Vec<(String, Amount)> {
        self.cohort_members(cohort)
            .filter_map(|q| {
                let b = self.borrowed(q, pool, resource);
                (b > 0).then(|| (q.to_string(), b))
            })
            .collect()
    }

    /// `queue`'s weighted dominant resource share now.
    pub fn share(&self, queue: &str) -> Share {
        self.share_after(queue, None)
    }

    /// `queue`'s share with `extra` (a pool and what more it would use there) counted.
    fn share_after(&self, queue: &str, extra: Option<(&str, &Resources)>) -> Share {
        let Some(q) = self.quotas.get(queue) else {
            return Share::ZERO;
        };
        let Some(cohort) = &q.cohort else {
            return Share::ZERO;
        };
        let mut best = Share::ZERO;
        for (pool, quotas) in &q.pools {
            for (resource, quota) in quotas {
                let more = extra
                    .filter(|(p, _)| *p == pool.as_str())
                    .map_or(0, |(_, d)| d.get(resource));
                let used = self.used(queue, pool, resource).saturating_add(more);
                let borrowed = (used - quota.nominal).max(0);
                if borrowed == 0 {
                    continue;
                }
                let (total, _) = self.cohort_pool(cohort, pool, resource);
                let s = Share {
                    num: i128::from(borrowed),
                    den: i128::from(total.max(1)) * i128::from(q.weight.max(1)),
                };
                best = best.max(s);
            }
        }
        best
    }

    /// `queue`'s share were it to take `demand` on `pool`.
    pub fn share_with(&self, queue: &str, pool: &str, demand: &Resources) -> Share {
        self.share_after(queue, Some((pool, demand)))
    }

    /// `status.pools` of `queue` ([`Ledger::status`] as quantities): per pool and resource,
    /// its nominal quota, what its jobs use, borrow and lend.
    pub fn pool_usage(&self, queue: &str) -> Vec<crate::api::PoolUsage> {
        use crate::resources::amount::show;
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        self.status(queue)
            .into_iter()
            .map(|(pool, uses)| crate::api::PoolUsage {
                name: pool,
                resources: uses
                    .into_iter()
                    .map(|u| crate::api::ResourceUsage {
                        nominal: Quantity(show(&u.resource, u.nominal)),
                        used: Quantity(show(&u.resource, u.used)),
                        borrowed: Quantity(show(&u.resource, u.borrowed)),
                        lent: Quantity(show(&u.resource, u.lent)),
                        name: u.resource,
                    })
                    .collect(),
            })
            .collect()
    }

    /// `queue`'s quotas as its status shows them: per pool in its order, per resource, the
    /// nominal quota, what it uses, borrows and lends (the cohort's borrowing attributed to the
    /// queues with unused lendable quota, in name order).
    pub fn status(&self, queue: &str) -> Vec<(String, Vec<QuotaUse>)> {
        let Some(q) = self.quotas.get(queue) else {
            return Vec::new();
        };
        q.pools
            .iter()
            .map(|(pool, quotas)| {
                let uses = quotas
                    .iter()
                    .map(|(resource, quota)| QuotaUse {
                        resource: resource.clone(),
                        nominal: quota.nominal,
                        used: self.used(queue, pool, resource),
                        borrowed: self.borrowed(queue, pool, resource),
                        lent: self.lent(queue, pool, resource),
                    })
                    .collect();
                (pool.clone(), uses)
            })
            .collect()
    }

    fn lent(&self, queue: &str, pool: &str, resource: &str) -> Amount {
        let Some(cohort) = self.quotas.get(queue).and_then(|q| q.cohort.as_deref()) else {
            return 0;
        };
        let mut owed: Amount = self
            .cohort_members(cohort)
            .map(|q| {
                self.quota(q, pool, resource)
                    .map_or(self.used(q, pool, resource), |quota| {
                        (self.used(q, pool, resource) - quota.nominal).max(0)
                    })
            })
            .sum();
        for q in self.cohort_members(cohort) {
            let Some(quota) = self.quota(q, pool, resource) else {
                continue;
            };
            let unused = (quota.nominal - self.used(q, pool, resource)).max(0);
            let lends = unused.min(quota.lendable()).min(owed);
            if q == queue {
                return lends;
            }
            owed -= lends;
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::amount::ONE;

    fn gpus(n: i64) -> Resources {
        let mut r = Resources::new();
        r.set("nvidia.com/gpu", n * ONE);
        r
    }

    fn team(
        cohort: Option<&str>,
        nominal: i64,
        borrowing: Option<i64>,
        lending: Option<i64>,
    ) -> QueueQuotas {
        QueueQuotas {
            cohort: cohort.map(String::from),
            weight: 1,
            pools: vec![(
                "gpu".into(),
                [(
                    "nvidia.com/gpu".to_string(),
                    Quota {
                        nominal: nominal * ONE,
                        borrowing_limit: borrowing.map(|b| b * ONE),
                        lending_limit: lending.map(|l| l * ONE),
                    },
                )]
                .into(),
            )],
        }
    }

    fn ledger(a: QueueQuotas, b: QueueQuotas) -> Ledger {
        Ledger::new(
            [("team-a".to_string(), a), ("team-b".to_string(), b)].into(),
            BTreeMap::new(),
        )
    }

    /// The table: 16 + 16 GPUs in one cohort; team-a alone borrows team-b's idle 16,
    /// then team-b may take nothing until team-a gives back (without preemption), and says why.
    #[test]
    fn a_cohort_lends_what_a_queue_does_not_use() {
        let mut l = ledger(
            team(Some("c"), 16, None, None),
            team(Some("c"), 16, None, None),
        );
        for borrows in [false, false, true, true] {
            assert_eq!(l.admits("team-a", "gpu", &gpus(8)), Ok(borrows));
            l.take("team-a", "gpu", &gpus(8));
        }
        assert_eq!(l.borrowed("team-a", "gpu", "nvidia.com/gpu"), 16 * ONE);
        let err = l.admits("team-b", "gpu", &gpus(1)).unwrap_err();
        assert_eq!(err.cohort_free, Some(0));
        assert_eq!(
            err.sentence("team-b"),
            "needs 1 nvidia.com/gpu on pool gpu: team-b uses 0 of 16, cohort has 0 to lend (team-a borrows 16)"
        );
        assert!(l.within_nominal("team-b", "gpu", &gpus(1)));
        let status = l.status("team-b");
        assert_eq!(status[0].1[0].lent, 16 * ONE);
        assert!(l.share("team-a") > l.share("team-b"));
        // team-a gives back one job: team-b may take 8.
        l.give("team-a", "gpu", &gpus(8));
        assert_eq!(l.admits("team-b", "gpu", &gpus(8)), Ok(false));
    }

    #[test]
    fn borrowing_and_lending_limits_bound_what_moves() {
        // team-b lends at most 4 of its 16; team-a may borrow at most 8.
        let mut l = ledger(
            team(Some("c"), 16, Some(8), None),
            team(Some("c"), 16, None, Some(4)),
        );
        l.take("team-a", "gpu", &gpus(16));
        assert_eq!(l.admits("team-a", "gpu", &gpus(4)), Ok(true));
        assert_eq!(
            l.admits("team-a", "gpu", &gpus(5)).unwrap_err().cohort_free,
            Some(4 * ONE)
        );
        // team-b's guaranteed 12 are its own whatever team-a does.
        l.take("team-a", "gpu", &gpus(4));
        assert_eq!(l.admits("team-b", "gpu", &gpus(12)), Ok(false));
        assert!(l.admits("team-b", "gpu", &gpus(13)).is_err());
        // Without a cohort, nominal is the limit.
        let lone = ledger(team(None, 16, None, None), team(None, 16, None, None));
        assert_eq!(lone.admits("team-a", "gpu", &gpus(16)), Ok(false));
        assert!(lone.admits("team-a", "gpu", &gpus(17)).is_err());
    }

    /// Resources and pools a queue does not list are not limited by its quota.
    #[test]
    fn what_a_queue_does_not_list_is_not_limited() {
        let l = ledger(team(Some("c"), 0, None, None), team(None, 0, None, None));
        let mut d = gpus(0);
        d.set("cpu", 64 * ONE);
        assert_eq!(l.admits("team-a", "gpu", &d), Ok(false));
        assert_eq!(l.admits("team-a", "other", &gpus(100)), Ok(false));
        assert_eq!(l.admits("nobody", "gpu", &gpus(100)), Ok(false));
    }

    #[test]
    fn shares_follow_weights() {
        let mut a = team(Some("c"), 8, None, None);
        a.weight = 3;
        let b = team(Some("c"), 8, None, None);
        let mut c = team(Some("c"), 16, None, None);
        c.pools[0].1.get_mut("nvidia.com/gpu").unwrap().nominal = 16 * ONE;
        let mut l = Ledger::new(
            [
                ("a".to_string(), a),
                ("b".to_string(), b),
                ("c".to_string(), c),
            ]
            .into(),
            BTreeMap::new(),
        );
        l.take("a", "gpu", &gpus(14));
        l.take("b", "gpu", &gpus(10));
        // a borrows 6 with weight 3, b borrows 2 with weight 1: 6/3 = 2 = 2/1.
        assert_eq!(l.share("a").cmp(&l.share("b")), Ordering::Equal);
        assert!(l.share_with("a", "gpu", &gpus(1)) > l.share("b"));
    }

    /// The ledger's remembered answers about a cohort are those of walking it: after every
    /// random take and give (queues in one cohort, one outside it, two pools, two resources,
    /// with and without limits), every quota check, share, borrowers' list and status equals
    /// that of a copy with nothing remembered.
    mod remembered {
        use super::*;
        use proptest::prelude::*;

        const QUEUES: [&str; 4] = ["a", "b", "c", "solo"];
        const POOLS: [&str; 2] = ["gpu", "spot"];

        fn demand(gpu: i64, cpu: i64) -> Resources {
            let mut r = Resources::new();
            r.set("nvidia.com/gpu", gpu * ONE);
            r.set("cpu", cpu * ONE);
            r
        }

        fn quotas(limits: &[(i64, Option<i64>, Option<i64>)]) -> BTreeMap<String, QueueQuotas> {
            QUEUES
                .iter()
                .zip(limits)
                .enumerate()
                .map(|(i, (name, (nominal, borrowing, lending)))| {
                    let quota = Quota {
                        nominal: nominal * ONE,
                        borrowing_limit: borrowing.map(|b| b * ONE),
                        lending_limit: lending.map(|l| l * ONE),
                    };
                    // Queue "b" lists no cpu quota on "spot": it draws all it uses there.
                    let pools = POOLS
                        .iter()
                        .map(|p| {
                            let mut q: BTreeMap<String, Quota> =
                                [("nvidia.com/gpu".to_string(), quota)].into();
                            if !(*name == "b" && *p == "spot") {
                                q.insert("cpu".into(), quota);
                            }
                            (p.to_string(), q)
                        })
                        .collect();
                    let q = QueueQuotas {
                        cohort: (*name != "solo").then(|| "c".to_string()),
                        weight: 1 + i as u32,
                        pools,
                    };
                    (name.to_string(), q)
                })
                .collect()
        }

        fn forgetful(l: &Ledger) -> Ledger {
            Ledger {
                memo: Default::default(),
                ..l.clone()
            }
        }

        fn same_answers(l: &Ledger) -> Result<(), TestCaseError> {
            let fresh = forgetful(l);
            for queue in QUEUES {
                prop_assert_eq!(l.share(queue), fresh.share(queue));
                prop_assert_eq!(l.status(queue), fresh.status(queue));
                for pool in POOLS {
                    for (gpu, cpu) in [(1, 0), (4, 2), (8, 16)] {
                        let d = demand(gpu, cpu);
                        prop_assert_eq!(l.admits(queue, pool, &d), fresh.admits(queue, pool, &d));
                        prop_assert_eq!(
                            l.share_with(queue, pool, &d),
                            fresh.share_with(queue, pool, &d)
                        );
                    }
                    for resource in ["nvidia.com/gpu", "cpu"] {
                        prop_assert_eq!(
                            l.borrowers("c", pool, resource),
                            fresh.borrowers("c", pool, resource)
                        );
                        prop_assert_eq!(
                            l.cohort_pool("c", pool, resource),
                            fresh.cohort_pool("c", pool, resource)
                        );
                    }
                }
            }
            Ok(())
        }

        proptest! {
            #[test]
            fn after_any_takes_and_gives(
                limits in proptest::collection::vec(
                    (0i64..16, proptest::option::of(0i64..8), proptest::option::of(0i64..16)),
                    4,
                ),
                ops in proptest::collection::vec(
                    (0usize..4, 0usize..2, 0i64..9, 0i64..17, any::<bool>()),
                    1..40,
                ),
            ) {
                let mut l = Ledger::new(quotas(&limits), BTreeMap::new());
                same_answers(&l)?;
                let mut held: Vec<(usize, usize, Resources)> = Vec::new();
                for (queue, pool, gpu, cpu, give) in ops {
                    match (give, held.pop()) {
                        (true, Some((q, p, d))) => l.give(QUEUES[q], POOLS[p], &d),
                        (_, back) => {
                            held.extend(back);
                            let d = demand(gpu, cpu);
                            l.take(QUEUES[queue], POOLS[pool], &d);
                            held.push((queue, pool, d));
                        }
                    }
                    same_answers(&l)?;
                }
            }
        }
    }
}
