//! A job's place in its queue within its priority (`docs/design.md#scheduling`): first come,
//! first served, in the order the API server accepted the jobs, to the finest grain the API
//! gives.
//!
//! `metadata.creationTimestamp` has whole seconds: a `kubectl apply` of a few hundred jobs puts
//! them all in one or two seconds, and ordering ties by job id ordered them as the operator's
//! concurrent reconciles first saw them (issue 43: 1,117 adjacent inversions in 10,000 jobs). A
//! ManagedJob's `metadata.resourceVersion` in the watch event of its creation is etcd's revision
//! of that create, and since Kubernetes 1.35 resource versions of one resource are documented as
//! comparable: monotonically increasing integers of no fixed size, compared by length, then
//! digit by digit (KEP-5504, "Comparable Resource Version",
//! <https://github.com/kubernetes/enhancements/issues/5504>; its conformance test bounds them
//! by the largest unsigned 128-bit integer). So a job's entry is:
//!
//! 1. `queued_at_ms`: its creation second (or, after it gave its run slot back because no node
//!    took its Pod, when it did: the back of its priority);
//! 2. the resourceVersion at which the operator first saw the object ([`version_key`]): its
//!    creation's when the operator's watch saw it created; ties inside one second are broken
//!    by it;
//! 3. its job id.
//!
//! An object the operator first sees after it was modified (the operator was down when it was
//! created and something changed it meanwhile) carries a later version than its creation's: the
//! second still comes first, so such a job can only go behind jobs created after it *in the
//! same second*, never behind a job of a later second or ahead of an earlier one. Rows stored by
//! a release before this rule (schema step 14), and jobs rebuilt from a status that does not
//! show their entry, have no version (`""`): inside their second they go first, by id, as before.

use std::cmp::Ordering;

/// Digits of the largest resourceVersion ordered exactly: 2^128 - 1 has 39 (KEP-5504's bound).
pub const VERSION_DIGITS: usize = 39;

/// The text the store orders a resourceVersion by: its digits left-padded with zeros to
/// [`VERSION_DIGITS`], so that text order is numeric order (KEP-5504's comparison: the longer
/// is the greater, then digit by digit). None when `rv` is not comparable that way (empty, not
/// all ASCII digits, a leading zero, longer than [`VERSION_DIGITS`]): an API server that is
/// not backed by etcd may serve such versions; the job then orders as one without a version.
pub fn version_key(rv: &str) -> Option<String> {
    let comparable = !rv.is_empty()
        && rv.len() <= VERSION_DIGITS
        && rv.bytes().all(|b| b.is_ascii_digit())
        && (rv == "0" || !rv.starts_with('0'));
    comparable.then(|| format!("{rv:0>VERSION_DIGITS$}"))
}

/// The resourceVersion a stored key ([`version_key`]) stands for, as the API wrote it (no
/// padding); `""` for a job without one.
pub fn version_of_key(key: &str) -> &str {
    let digits = key.trim_start_matches('0');
    if digits.is_empty() && !key.is_empty() {
        "0"
    } else {
        digits
    }
}

/// KEP-5504's comparison of two resource versions of one resource: None when either is not
/// comparable ([`version_key`]).
pub fn compare_versions(a: &str, b: &str) -> Option<Ordering> {
    Some(version_key(a)?.cmp(&version_key(b)?))
}

/// What orders one queued job against another of its queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    /// `spec.priority`: higher first.
    pub priority: i32,
    /// When it entered its queue, ms since the epoch.
    pub queued_at_ms: i64,
    /// [`version_key`] of the resourceVersion it was first seen at (`""`: none).
    pub version: &'a str,
    /// Its job id.
    pub id: i64,
}

/// The admission order within a queue: higher priority first, then the earlier entry (its
/// second, then the version it was first seen at), then the lower job id. The store's queries
/// render the same order (`store::ADMISSION_ORDER`).
pub fn admission_order(a: &Entry<'_>, b: &Entry<'_>) -> Ordering {
    b.priority
        .cmp(&a.priority)
        .then(a.queued_at_ms.cmp(&b.queued_at_ms))
        .then(a.version.cmp(b.version))
        .then(a.id.cmp(&b.id))
}

/// True when `job` comes after `arrival` in their queue: `arrival` is a job seen and not
/// recorded yet (it has no id), so only their priority, second and version count; a job in
/// the same place is not behind it.
pub fn behind(job: &Entry<'_>, arrival: &Entry<'_>) -> bool {
    let (arrival, job) = (Entry { id: 0, ..*arrival }, Entry { id: 0, ..*job });
    admission_order(&arrival, &job) == Ordering::Less
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn only_canonical_decimal_versions_are_comparable() {
        assert_eq!(
            version_key("12").as_deref(),
            Some("000000000000000000000000000000000000012")
        );
        assert_eq!(version_of_key(&version_key("12").unwrap()), "12");
        assert_eq!(version_of_key(&version_key("0").unwrap()), "0");
        assert_eq!(version_of_key(""), "");
        let max = u128::MAX.to_string();
        assert_eq!(max.len(), VERSION_DIGITS);
        assert_eq!(version_key(&max).as_deref(), Some(max.as_str()));
        for bad in [
            "",
            "012",
            "12a",
            "-1",
            "1.5",
            " 1",
            "1000000000000000000000000000000000000000",
        ] {
            assert_eq!(version_key(bad), None, "{bad:?}");
        }
        assert_eq!(compare_versions("9", "10"), Some(Ordering::Less));
        assert_eq!(compare_versions("10", "x"), None);
    }

    proptest! {
        /// The stored key orders as the numbers do (KEP-5504: length, then digits), for any
        /// versions up to 2^128 - 1.
        #[test]
        fn keys_order_as_the_numbers(a in any::<u128>(), b in any::<u128>()) {
            let (ka, kb) = (version_key(&a.to_string()).unwrap(), version_key(&b.to_string()).unwrap());
            prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
            prop_assert_eq!(version_of_key(&ka), a.to_string());
        }

        /// Within a priority the earlier second goes first whatever the versions; inside a
        /// second, the lower version; a job without a version goes first inside its second.
        #[test]
        fn the_second_comes_before_the_version(
            s in 0i64..3, t in 0i64..3, v in any::<u64>(), w in any::<u64>(),
            known in any::<bool>(),
        ) {
            let (kv, kw) = (version_key(&v.to_string()).unwrap(), version_key(&w.to_string()).unwrap());
            let a = Entry { priority: 0, queued_at_ms: s * 1000, version: if known { &kv } else { "" }, id: 2 };
            let b = Entry { priority: 0, queued_at_ms: t * 1000, version: &kw, id: 1 };
            let expected = if s != t {
                s.cmp(&t)
            } else if !known {
                Ordering::Less
            } else {
                v.cmp(&w).then(Ordering::Greater)
            };
            prop_assert_eq!(admission_order(&a, &b), expected);
            let higher = Entry { priority: 1, ..b };
            prop_assert_eq!(admission_order(&a, &higher), Ordering::Greater);
        }
    }
}
