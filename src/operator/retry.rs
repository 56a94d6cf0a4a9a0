//! How the operator's watches retry after a failure: soon enough that after an API outage
//! every watch lists again within seconds of the API's return (`docs/design.md`, "The world
//! seen again after an outage").

use std::time::Duration;

/// Longest wait between two tries of a failed watch (every watch of the operator: ManagedJobs,
/// Pods, claims, queues, namespaces): after an API outage each lists again within this of the
/// API's return (kube's default back-off grows to 30 s, and after a minute's outage a watch
/// could stay blind for as long again).
pub const WATCH_RETRY_MAX: Duration = Duration::from_secs(2);
/// First wait before a failed watch is tried again; doubles up to [`WATCH_RETRY_MAX`].
pub const WATCH_RETRY_FIRST: Duration = Duration::from_millis(200);

/// The back-off of every watch of the operator: [`WATCH_RETRY_FIRST`] doubling up to
/// [`WATCH_RETRY_MAX`], each wait shortened by up to a fifth at random (so that many watches
/// do not retry in step), reset by the first event after a failure.
pub fn watch_backoff() -> WatchBackoff {
    WatchBackoff {
        next: WATCH_RETRY_FIRST,
    }
}

/// See [`watch_backoff`].
#[derive(Clone, Debug)]
pub struct WatchBackoff {
    next: Duration,
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let wait = self.next;
        self.next = (self.next * 2).min(WATCH_RETRY_MAX);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        Some(wait - wait / 5 * (nanos % 1000) / 1000)
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = WATCH_RETRY_FIRST;
    }
}
