//! One owner per job at a time (`docs/design.md#one-owner-per-job`): the pure rules of the
//! claim an operator holds on the jobs of one namespace of its shard (a *cell*), carried by a
//! Lease in that namespace, and what the claim allows its holder and its job controllers.
//!
//! Every operator whose scope covers a namespace (cluster-wide or `--namespace`, same
//! `--shard`) competes for that namespace's one Lease ([`lease_name`]); the holder alone acts
//! on its jobs, the others leave them alone. The Lease is taken and renewed with a
//! compare-and-set on its `resourceVersion` (the API server's optimistic concurrency), so two
//! instances never both succeed; the rules here decide when to try, after client-go's leader
//! election:
//!
//! - a holder renews every [`Timing::renew_every`] and acts only until
//!   [`Timing::renew_deadline`] after the start of its last successful renewal
//!   ([`valid_until`]); past [`Timing::duration`] ([`lapse_at`]) another instance may hold the
//!   claim, so a local workload it started must be stopped by then;
//! - another instance takes a held claim only after it saw the same version of the Lease for a
//!   whole [`Timing::duration`] of its own clock, counted from when it could read again after
//!   failing to ([`observe`]): the holder's clock is never compared with anyone's, and after
//!   an API outage the holder gets a whole duration to renew before anyone takes its claim;
//! - every taking raises the claim's epoch (`leaseTransitions`), and the owner writes
//!   `status.owner` and `status.ownerEpoch` with every status; the API refuses a status with a
//!   lower epoch, or the same epoch under another owner (a CEL rule), so a former owner that has
//!   not yet noticed its loss can no longer write, and a row is known stale when the object's
//!   status was written under a later epoch than the store's ([`row_is_stale`]).

use std::time::Duration;

/// The Lease that carries the claim on a namespace's jobs of `shard` (the default instance's:
/// the jobs without a shard label), in that namespace.
pub fn lease_name(shard: Option<&str>) -> String {
    match shard {
        Some(shard) => format!("managed-jobs-owner-{shard}"),
        None => "managed-jobs-owner".into(),
    }
}

/// A holder identity: `<name>/<store id>`, the store id made once per store
/// (`store::Store::instance_id`), the name [`instance_name`]'s.
pub fn identity(name: &str, store_id: &str) -> String {
    format!("{name}/{store_id}")
}

/// The name part of a holder identity: `<pod or host name>.<path tag>`, where the path tag is
/// 8 hex digits of the state dir's path (FNV-1a): on one host, one path is one operator at a
/// time (its lock), so a store rebuilt there (lost, or new) succeeds the identity its
/// predecessor at that place held ([`successor_store`]).
pub fn instance_name(host: &str, state_dir: &str) -> String {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in state_dir.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    format!("{host}.{hash:08x}")
}

/// The store id a fresh store (no job, no claim recorded) named `name` takes over from the
/// holders of its scope's claims: a holder of the same name is its predecessor at the same
/// host and state dir (a lost store), whose claims are its own; None when none is. Otherwise
/// a store rebuilt after a loss would wait out its own former claims and take its jobs over
/// as another operator's, instead of adopting them.
pub fn successor_store<'a>(
    name: &str,
    holders: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    holders.into_iter().find_map(|h| {
        let (n, store) = h.rsplit_once('/')?;
        (n == name && !store.is_empty()).then(|| store.to_string())
    })
}

/// True when holder identities `a` and `b` name the same store (the part after the last `/`):
/// an operator restarted on its state dir under another Pod or host name is still the holder.
pub fn same_holder(a: &str, b: &str) -> bool {
    let store = |s: &str| s.rsplit('/').next().unwrap_or(s).to_string();
    store(a) == store(b)
}

/// The label every claim Lease carries (value `"true"`): the operators' Lease watch selects on
/// it.
pub const LEASE_LABEL: &str = "managedjobs.dev/claim";

/// The timing of a claim, all derived from its duration (`--lease-duration-seconds`), with
/// client-go's leader-election ratios (lease 15 s, renew deadline 10 s, retry 2 s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long a claim stays valid after the start of its last renewal: the bound on the
    /// hand-over when its owner dies.
    pub duration: Duration,
    /// How often a holder renews: a third of the duration.
    pub renew_every: Duration,
    /// How long after the start of its last successful renewal a holder may still act: two
    /// thirds of the duration, so that it has stopped before anyone may take the claim.
    pub renew_deadline: Duration,
    /// How soon a failed try (a renewal, a take, a read) is tried again: a tenth of the
    /// duration, from 200 ms to 2 s.
    pub retry: Duration,
}

impl Timing {
    /// The timing of a claim lasting `duration` (at least 2 s).
    pub fn new(duration: Duration) -> Timing {
        let duration = duration.max(Duration::from_secs(2));
        Timing {
            duration,
            renew_every: duration / 3,
            renew_deadline: duration * 2 / 3,
            retry: (duration / 10).clamp(Duration::from_millis(200), Duration::from_secs(2)),
        }
    }

    fn ms(d: Duration) -> i64 {
        d.as_millis() as i64
    }
}

/// A claim's Lease as read from the API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRecord {
    /// `spec.holderIdentity` (None or empty: nobody holds it).
    pub holder: Option<String>,
    /// `spec.leaseTransitions`: the epoch of the current holding.
    pub epoch: i64,
    /// `metadata.resourceVersion`: what a compare-and-set expects.
    pub version: String,
}

impl LeaseRecord {
    /// The holder, if anyone holds it.
    pub fn holder(&self) -> Option<&str> {
        self.holder.as_deref().filter(|h| !h.is_empty())
    }
}

/// What one instance has seen of a claim's Lease (client-go's observed record and time).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// The version last seen (None: the Lease did not exist).
    pub version: Option<String>,
    /// When that version was first seen, or when reads worked again after failing (ms since
    /// the epoch, this instance's clock).
    pub since_ms: i64,
}

/// A fresh observation (nothing seen yet) at `now_ms`.
pub fn unseen(now_ms: i64) -> Seen {
    Seen {
        version: None,
        since_ms: now_ms,
    }
}

/// The observation after a read at `now_ms` that found `version` (None: no Lease).
/// `reads_failed` says the reads before this one failed: the clock of the version seen then
/// starts again, so a claim is never taken on the strength of time the taker could not see.
pub fn observe(seen: &Seen, version: Option<&str>, reads_failed: bool, now_ms: i64) -> Seen {
    if reads_failed || seen.version.as_deref() != version {
        Seen {
            version: version.map(str::to_string),
            since_ms: now_ms,
        }
    } else {
        seen.clone()
    }
}

/// This instance's holding of a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The epoch it holds.
    pub epoch: i64,
    /// When its last successful renewal (or take) was sent, ms since the epoch.
    pub renewed_ms: i64,
}

/// Until when (ms since the epoch) a holder whose last successful renewal was sent at
/// `renewed_ms` may act: launch a workload, write a status, delete a Pod.
pub fn valid_until(renewed_ms: i64, t: &Timing) -> i64 {
    renewed_ms + Timing::ms(t.renew_deadline)
}

/// From when (ms since the epoch) another instance may hold a claim last renewed at
/// `renewed_ms`: a local workload its holder started must be stopped by then.
pub fn lapse_at(renewed_ms: i64, t: &Timing) -> i64 {
    renewed_ms + Timing::ms(t.duration)
}

/// What to do about a claim next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing before `until_ms` (ms since the epoch), unless the Lease changes.
    Wait {
        /// When to decide again.
        until_ms: i64,
    },
    /// No Lease exists: create it, held by this instance, at `epoch`.
    Create {
        /// The epoch to hold.
        epoch: i64,
    },
    /// Nobody holds it, or its holder let it lapse: take it at `epoch` (a compare-and-set on
    /// `version`).
    Take {
        /// The epoch to hold.
        epoch: i64,
        /// The version the write expects.
        version: String,
    },
    /// This instance holds it: renew it (a compare-and-set on `version`).
    Renew {
        /// The epoch held.
        epoch: i64,
        /// The version the write expects.
        version: String,
    },
}

/// The next step of instance `me` for a claim whose Lease is `lease` (None: it does not exist),
/// as it has `seen` it, holding it as `held` (None: it does not, as far as it knows), at
/// `now_ms`. `floor` is the highest epoch this instance knows of for the claim (the statuses of
/// the namespace's jobs, its own past holdings): a claim created again after its Lease was
/// deleted, or taken, gets an epoch above it, so that epochs never go back.
///
/// - its own Lease (its holder is `me`, e.g. after a restart on the same state dir) is renewed
///   once [`Timing::renew_every`] passed since the last renewal, at once when it knows of none;
/// - a Lease nobody holds is taken at once;
/// - another's is taken only once `seen` shows its version unchanged for [`Timing::duration`].
pub fn next_step(
    lease: Option<&LeaseRecord>,
    seen: &Seen,
    held: Option<&Held>,
    me: &str,
    floor: i64,
    now_ms: i64,
    t: &Timing,
) -> Step {
    let Some(lease) = lease else {
        return Step::Create {
            epoch: floor.max(0) + 1,
        };
    };
    match lease.holder() {
        Some(holder) if same_holder(holder, me) => match held {
            Some(h)
                if h.epoch == lease.epoch && now_ms < h.renewed_ms + Timing::ms(t.renew_every) =>
            {
                Step::Wait {
                    until_ms: h.renewed_ms + Timing::ms(t.renew_every),
                }
            }
            _ => Step::Renew {
                epoch: lease.epoch,
                version: lease.version.clone(),
            },
        },
        None => Step::Take {
            epoch: lease.epoch.max(floor) + 1,
            version: lease.version.clone(),
        },
        Some(_) => {
            let unchanged_since = if seen.version.as_deref() == Some(lease.version.as_str()) {
                seen.since_ms
            } else {
                now_ms
            };
            let expires = unchanged_since + Timing::ms(t.duration);
            if now_ms >= expires {
                Step::Take {
                    epoch: lease.epoch.max(floor) + 1,
                    version: lease.version.clone(),
                }
            } else {
                Step::Wait { until_ms: expires }
            }
        }
    }
}

/// Whether a stored row of a job is stale: the job's status was written under `status_epoch` by
/// `status_owner`, and this instance (`me`) last held the claim at `our_epoch` (None: never, as
/// far as its store knows). It is stale when another owner wrote it under a later epoch than
/// ours: that owner drove the job after us, and the status, not the row, says where it is. A
/// status without an owner (written by an older version, or never) leaves the row as it is.
pub fn row_is_stale(
    status_epoch: Option<i64>,
    status_owner: Option<&str>,
    me: &str,
    our_epoch: Option<i64>,
) -> bool {
    match (status_epoch, status_owner) {
        (Some(epoch), Some(owner)) if !same_holder(owner, me) => {
            our_epoch.is_none_or(|ours| epoch > ours)
        }
        _ => false,
    }
}

/// What a job controller may do under its job's claim, as its store records it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gate {
    /// Launches are allowed until then (ms since the epoch); None: claims are not in force (the
    /// engine runs without an API), everything is allowed.
    pub launch_until_ms: Option<i64>,
    /// From then (ms since the epoch) another operator may own the job: a local workload still
    /// running must be stopped. None: never (claims not in force).
    pub lapse_at_ms: Option<i64>,
}

impl Gate {
    /// No claims in force (an engine without an API): nothing is gated.
    pub const OPEN: Gate = Gate {
        launch_until_ms: None,
        lapse_at_ms: None,
    };

    /// The gate of a claim in force: its store records it last renewed at `renewed_ms` (None:
    /// the operator holds no claim on the job's namespace: nothing may be launched and a local
    /// workload is stopped at once).
    pub fn of(renewed_ms: Option<i64>, t: &Timing) -> Gate {
        match renewed_ms {
            Some(r) => Gate {
                launch_until_ms: Some(valid_until(r, t)),
                lapse_at_ms: Some(lapse_at(r, t)),
            },
            None => Gate {
                launch_until_ms: Some(i64::MIN),
                lapse_at_ms: Some(i64::MIN),
            },
        }
    }

    /// A workload may be launched at `now_ms`.
    pub fn may_launch(&self, now_ms: i64) -> bool {
        self.launch_until_ms.is_none_or(|u| now_ms < u)
    }

    /// The claim lapsed at `now_ms`: a local workload must be stopped.
    pub fn lapsed(&self, now_ms: i64) -> bool {
        self.lapse_at_ms.is_some_and(|l| now_ms >= l)
    }
}

/// How long a job controller whose launch waits for its claim's renewal waits before it looks
/// again.
pub const GATE_RECHECK: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_000_000;

    fn t() -> Timing {
        Timing::new(Duration::from_secs(15))
    }

    fn lease(holder: Option<&str>, epoch: i64, version: &str) -> LeaseRecord {
        LeaseRecord {
            holder: holder.map(str::to_string),
            epoch,
            version: version.into(),
        }
    }

    #[test]
    fn the_timing_follows_client_gos_ratios() {
        let t = t();
        assert_eq!(t.renew_every, Duration::from_secs(5));
        assert_eq!(t.renew_deadline, Duration::from_secs(10));
        assert_eq!(t.retry, Duration::from_millis(1500));
        assert_eq!(Timing::new(Duration::ZERO).duration, Duration::from_secs(2));
        assert!(valid_until(T0, &t) < lapse_at(T0, &t));
    }

    #[test]
    fn a_missing_lease_is_created_above_every_epoch_known() {
        assert_eq!(
            next_step(None, &unseen(T0), None, "a", 7, T0, &t()),
            Step::Create { epoch: 8 }
        );
    }

    #[test]
    fn a_free_lease_is_taken_at_once_and_its_epoch_rises() {
        let l = lease(None, 3, "v1");
        assert_eq!(
            next_step(Some(&l), &unseen(T0), None, "a", 0, T0, &t()),
            Step::Take {
                epoch: 4,
                version: "v1".into()
            }
        );
        let empty = lease(Some(""), 3, "v1");
        assert!(matches!(
            next_step(Some(&empty), &unseen(T0), None, "a", 9, T0, &t()),
            Step::Take { epoch: 10, .. }
        ));
    }

    #[test]
    fn its_own_lease_is_renewed_at_once_after_a_restart_then_every_third() {
        let l = lease(Some("a"), 4, "v9");
        // A restart on the same store: the Lease names it, it knows no holding yet.
        assert!(matches!(
            next_step(Some(&l), &unseen(T0), None, "a", 0, T0, &t()),
            Step::Renew { epoch: 4, .. }
        ));
        let held = Held {
            epoch: 4,
            renewed_ms: T0,
        };
        assert_eq!(
            next_step(Some(&l), &unseen(T0), Some(&held), "a", 0, T0 + 1_000, &t()),
            Step::Wait {
                until_ms: T0 + 5_000
            }
        );
        assert!(matches!(
            next_step(Some(&l), &unseen(T0), Some(&held), "a", 0, T0 + 5_000, &t()),
            Step::Renew { .. }
        ));
    }

    #[test]
    fn anothers_lease_is_taken_only_after_a_whole_duration_of_the_same_version() {
        let l = lease(Some("b"), 4, "v9");
        let seen = observe(&unseen(T0), Some("v9"), false, T0);
        assert_eq!(
            next_step(Some(&l), &seen, None, "a", 0, T0 + 14_999, &t()),
            Step::Wait {
                until_ms: T0 + 15_000
            }
        );
        assert_eq!(
            next_step(Some(&l), &seen, None, "a", 0, T0 + 15_000, &t()),
            Step::Take {
                epoch: 5,
                version: "v9".into()
            }
        );
        // A renewal (a new version) starts the clock again.
        let renewed = lease(Some("b"), 4, "v10");
        let seen = observe(&seen, Some("v10"), false, T0 + 14_000);
        assert!(matches!(
            next_step(Some(&renewed), &seen, None, "a", 0, T0 + 20_000, &t()),
            Step::Wait {
                until_ms: 1_029_000
            }
        ));
    }

    #[test]
    fn after_an_outage_the_holder_gets_a_whole_duration_to_renew() {
        // b renewed at T0; the API was down for 60 s; a reads again at T0 + 60 s.
        let l = lease(Some("b"), 4, "v9");
        let before = observe(&unseen(T0), Some("v9"), false, T0);
        let after = observe(&before, Some("v9"), true, T0 + 60_000);
        assert_eq!(after.since_ms, T0 + 60_000);
        assert!(matches!(
            next_step(Some(&l), &after, None, "a", 0, T0 + 60_000, &t()),
            Step::Wait { .. }
        ));
    }

    #[test]
    fn a_version_never_seen_is_never_taken_at_once() {
        let l = lease(Some("b"), 4, "v9");
        let stale = observe(&unseen(T0), Some("v8"), false, T0);
        assert_eq!(
            next_step(Some(&l), &stale, None, "a", 0, T0 + 100_000, &t()),
            Step::Wait {
                until_ms: T0 + 115_000
            }
        );
    }

    #[test]
    fn a_holder_stops_acting_before_anyone_may_take_its_claim() {
        let t = t();
        let g = Gate::of(Some(T0), &t);
        assert!(g.may_launch(T0 + 9_999) && !g.may_launch(T0 + 10_000));
        assert!(!g.lapsed(T0 + 14_999) && g.lapsed(T0 + 15_000));
        let none = Gate::of(None, &t);
        assert!(!none.may_launch(T0) && none.lapsed(T0));
        assert!(Gate::OPEN.may_launch(T0) && !Gate::OPEN.lapsed(i64::MAX));
    }

    #[test]
    fn a_lost_store_succeeds_its_predecessor_at_the_same_place_only() {
        let here = instance_name("vm", "/var/lib/managed-jobs");
        assert_eq!(here, instance_name("vm", "/var/lib/managed-jobs"));
        assert_ne!(here, instance_name("vm", "/var/lib/other"));
        assert_ne!(here, instance_name("vm2", "/var/lib/managed-jobs"));
        let other = instance_name("vm", "/var/lib/other");
        let holders = [format!("{other}/aaa"), format!("{here}/bbb")];
        assert_eq!(
            successor_store(&here, holders.iter().map(String::as_str)),
            Some("bbb".into())
        );
        assert_eq!(
            successor_store(&here, [format!("{other}/aaa").as_str()]),
            None
        );
    }

    #[test]
    fn a_holder_is_its_store_whatever_its_host_name() {
        assert!(same_holder("pod-0/abc", "pod-1/abc"));
        assert!(!same_holder("pod-0/abc", "pod-0/abd"));
        let l = lease(Some("old-host/s1"), 2, "v1");
        assert!(matches!(
            next_step(Some(&l), &unseen(T0), None, "new-host/s1", 0, T0, &t()),
            Step::Renew { .. }
        ));
    }

    #[test]
    fn a_row_is_stale_only_when_another_owner_wrote_under_a_later_epoch() {
        assert!(!row_is_stale(None, None, "a", Some(3)));
        assert!(!row_is_stale(Some(3), Some("a"), "a", Some(3)));
        assert!(
            !row_is_stale(Some(5), Some("a"), "a", Some(3)),
            "our own write"
        );
        assert!(row_is_stale(Some(4), Some("b"), "a", Some(3)));
        assert!(
            !row_is_stale(Some(2), Some("b"), "a", Some(3)),
            "b wrote before we took the claim"
        );
        assert!(row_is_stale(Some(1), Some("b"), "a", None));
    }
}
