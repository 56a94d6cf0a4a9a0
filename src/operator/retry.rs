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

/// How often a watch that keeps failing says so again (its first failure is said at once).
pub const WATCH_FAILURE_REPEAT: Duration = Duration::from_secs(30);

/// What one watch of the operator says about its failures and its return: its first failure
/// at once and then every [`WATCH_FAILURE_REPEAT`] (not once per retry), and, when it has
/// listed again after failing, how long it was blind (`the Pod watch lists again, 41.2 s
/// after it failed`), counted in `managedjobs_watch_relists_total{watch}`.
#[derive(Debug)]
pub struct WatchHealth {
    name: &'static str,
    failing_since: Option<std::time::Instant>,
    said_at: Option<std::time::Instant>,
}

impl WatchHealth {
    /// The health of the watch `name` (`ManagedJob`, `Pod`, `claim Lease`...).
    pub fn new(name: &'static str) -> WatchHealth {
        WatchHealth {
            name,
            failing_since: None,
            said_at: None,
        }
    }

    /// The watch failed with `error`.
    pub fn failed(&mut self, error: &dyn std::fmt::Display) {
        let now = std::time::Instant::now();
        let since = *self.failing_since.get_or_insert(now);
        if self
            .said_at
            .is_none_or(|at| now.duration_since(at) >= WATCH_FAILURE_REPEAT)
        {
            self.said_at = Some(now);
            tracing::warn!(watch = self.name, error = %error, failing_for = ?now.duration_since(since), "the {} watch failed; retrying every {:?} at most", self.name, WATCH_RETRY_MAX);
        }
    }

    /// The watch listed every object (again). Returns how long it was blind, when it had
    /// failed.
    pub fn listed(&mut self, metrics: Option<&crate::metrics::Metrics>) -> Option<Duration> {
        let since = self.failing_since.take()?;
        self.said_at = None;
        let blind = since.elapsed();
        if let Some(metrics) = metrics {
            metrics
                .watch_relists_total
                .get_or_create(&crate::metrics::WatchLabel {
                    watch: self.name.into(),
                })
                .inc();
        }
        tracing::info!(
            watch = self.name,
            blind_seconds = blind.as_secs_f64(),
            "the {} watch lists again, {:.1} s after it failed",
            self.name,
            blind.as_secs_f64()
        );
        Some(blind)
    }
}

/// A watch of `api` (`config`) that lists every object again after any failure (kube's
/// watcher would resume from the last resourceVersion: after an API server restart such a
/// resumed watch was seen to stay silent for 30 s until the server answered `Expired`, and the
/// operator saw nothing meanwhile). After a failure the error is passed on, then a fresh watch
/// starts after [`watch_backoff`]'s wait: its `Init`, `InitApply`… `InitDone` replace what a
/// reflector holds, and every watch of the operator says when it lists again
/// ([`WatchHealth`]). A watch that only times out (the API server closes it) resumes as
/// kube's does; only errors relist.
pub fn relisting_watch<K>(
    api: kube::Api<K>,
    config: kube::runtime::watcher::Config,
) -> futures::stream::BoxStream<
    'static,
    kube::runtime::watcher::Result<kube::runtime::watcher::Event<K>>,
>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    use futures::StreamExt as _;
    use kube::runtime::utils::Backoff as _;
    struct State<
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    > {
        api: kube::Api<K>,
        config: kube::runtime::watcher::Config,
        inner: Option<
            futures::stream::BoxStream<
                'static,
                kube::runtime::watcher::Result<kube::runtime::watcher::Event<K>>,
            >,
        >,
        backoff: WatchBackoff,
        failed: bool,
    }
    let state = State {
        api,
        config,
        inner: None,
        backoff: watch_backoff(),
        failed: false,
    };
    futures::stream::unfold(state, |mut s| async move {
        loop {
            if s.inner.is_none() {
                if s.failed {
                    let wait = s.backoff.next().unwrap_or(WATCH_RETRY_MAX);
                    tokio::time::sleep(wait).await;
                }
                s.inner = Some(kube::runtime::watcher(s.api.clone(), s.config.clone()).boxed());
            }
            match s.inner.as_mut().expect("set above").next().await {
                Some(Ok(event)) => {
                    s.failed = false;
                    s.backoff.reset();
                    return Some((Ok(event), s));
                }
                Some(Err(e)) => {
                    s.inner = None;
                    s.failed = true;
                    return Some((Err(e), s));
                }
                None => s.inner = None,
            }
        }
    })
    .boxed()
}
