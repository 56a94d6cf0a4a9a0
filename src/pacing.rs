//! Pacing while a burst of ManagedJobs arrives (issue 34, docs/design.md#pacing-under-a-burst).
//!
//! A user applying a thousand jobs with `kubectl apply` sends one request after another, each
//! waiting for the API server's answer. Whatever we send meanwhile (a status write per job, an
//! Event, a Pod create, the scheduler's binding and the node's status writes it causes) is work
//! the API server does between two of theirs: on a small control plane the apply took four times
//! as long with the operator working as into a namespace no operator watches. Jobs that arrive
//! in a burst cannot all run at once anyway, so while one arrives the operator holds back: new
//! jobs launch at [`BurstPolicy::launch_rate`] per second and the operator's status writes and
//! Events at [`BurstPolicy::api_qps`]; once the arrivals stop, all resume at full speed.
//!
//! - A burst is arriving while the ManagedJobs created in the last [`WINDOW`] (seen new by the
//!   operator's watch, created less than [`WINDOW`] before it saw them) number at least
//!   [`BurstPolicy::threshold_per_s`] per second of the window.
//! - Pacing lasts at most [`BurstPolicy::hold`] per burst: a steady stream of arrivals above the
//!   threshold is served at full speed after that (its jobs must not wait forever), until the
//!   arrivals fall below the threshold and a new burst may begin.
//! - Relaunches (recoveries) and cancels are never paced; only new jobs' admissions, status
//!   writes and Events are.
//!
//! [`BurstState`] decides (pure, in milliseconds since the epoch); [`Pacer`] holds it for the
//! engine and the operator and carries out the request budget.

use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

/// How far back arrivals are counted.
pub const WINDOW: Duration = Duration::from_secs(2);

/// The `--burst-*` settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BurstPolicy {
    /// Arrivals per second, averaged over [`WINDOW`], at or above which a burst is arriving
    /// (`--burst-threshold`; 0: never paced).
    pub threshold_per_s: u32,
    /// New jobs launched per second while a burst arrives (`--burst-launch-rate`; at least 1).
    pub launch_rate: u32,
    /// Status writes and Events per second while a burst arrives (`--burst-api-qps`; at least 1).
    pub api_qps: u32,
    /// Longest one burst is paced (`--burst-hold-seconds`).
    pub hold: Duration,
}

impl BurstPolicy {
    /// Never paced.
    pub const OFF: BurstPolicy = BurstPolicy {
        threshold_per_s: 0,
        launch_rate: 1,
        api_qps: 1,
        hold: Duration::ZERO,
    };

    /// Whether pacing can ever happen.
    pub fn enabled(&self) -> bool {
        self.threshold_per_s > 0 && !self.hold.is_zero()
    }

    fn launch_interval_ms(&self) -> i64 {
        (1000 / i64::from(self.launch_rate.max(1))).max(1)
    }
}

/// What a burst's pacing decided at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pace {
    /// No burst (or its hold is over): full speed.
    Free,
    /// A burst is arriving: pace new launches and requests.
    Paced,
}

/// The arrivals of the last [`WINDOW`] and the burst they make, if any (pure: every method
/// takes the time, ms since the epoch).
#[derive(Clone, Debug, Default)]
pub struct BurstState {
    /// When each recent arrival was seen, oldest first.
    arrivals: VecDeque<i64>,
    /// When the current burst began (None: no burst).
    began_ms: Option<i64>,
    /// The earliest time the next new job may launch while paced.
    next_launch_ms: i64,
}

impl BurstState {
    /// A job created at `created_ms` was seen new at `now_ms`: counted when created within
    /// [`WINDOW`] of now (the jobs an operator finds at its start are not a burst).
    pub fn arrive(&mut self, created_ms: i64, now_ms: i64) {
        let window = WINDOW.as_millis() as i64;
        if now_ms.saturating_sub(created_ms) <= window {
            self.arrivals.push_back(now_ms);
        }
    }

    /// Whether `policy` paces now: forgets arrivals older than [`WINDOW`], begins a burst when
    /// the rest reach the threshold, ends it when they fall below it; pacing lasts at most
    /// `policy.hold` of a burst.
    pub fn pace(&mut self, policy: &BurstPolicy, now_ms: i64) -> Pace {
        let window = WINDOW.as_millis() as i64;
        while self
            .arrivals
            .front()
            .is_some_and(|&t| t < now_ms.saturating_sub(window))
        {
            self.arrivals.pop_front();
        }
        if !policy.enabled() {
            self.began_ms = None;
            return Pace::Free;
        }
        let needed = u64::from(policy.threshold_per_s) * window as u64 / 1000;
        if (self.arrivals.len() as u64) < needed.max(1) {
            self.began_ms = None;
            return Pace::Free;
        }
        let began = *self.began_ms.get_or_insert(now_ms);
        if now_ms.saturating_sub(began) < policy.hold.as_millis() as i64 {
            Pace::Paced
        } else {
            Pace::Free
        }
    }

    /// How many new jobs may launch now: unbounded when free; while paced, one once
    /// `1 / launch_rate` seconds have passed since the last (burst of 1).
    pub fn launch_allowance(&mut self, policy: &BurstPolicy, now_ms: i64) -> usize {
        match self.pace(policy, now_ms) {
            Pace::Free => usize::MAX,
            Pace::Paced if now_ms >= self.next_launch_ms => 1,
            Pace::Paced => 0,
        }
    }

    /// `n` new jobs launched at `now_ms`: the next may launch `n / launch_rate` seconds later
    /// while paced.
    pub fn launched(&mut self, policy: &BurstPolicy, n: usize, now_ms: i64) {
        if n > 0 {
            self.next_launch_ms =
                self.next_launch_ms.max(now_ms) + policy.launch_interval_ms() * n as i64;
        }
    }

    /// When the pacing should be looked at again while paced: the next launch allowed, or a
    /// tick of a quarter of the window (the burst may end); None when free.
    pub fn next_look_ms(&mut self, policy: &BurstPolicy, now_ms: i64) -> Option<i64> {
        match self.pace(policy, now_ms) {
            Pace::Free => None,
            Pace::Paced => {
                let tick = now_ms + WINDOW.as_millis() as i64 / 4;
                Some(self.next_launch_ms.max(now_ms).min(tick))
            }
        }
    }

    /// Arrivals counted in the window.
    pub fn recent_arrivals(&self) -> usize {
        self.arrivals.len()
    }
}

/// The burst pacing of one operator: its [`BurstState`] behind a lock, and the token bucket of
/// the requests it paces ([`BurstPolicy::api_qps`], bursts of 1).
pub struct Pacer {
    policy: BurstPolicy,
    state: Mutex<(BurstState, Pace)>,
    requests: DefaultDirectRateLimiter,
    /// Notified when a burst's pacing ends: the requests held back go at once.
    freed: tokio::sync::Notify,
}

impl Pacer {
    /// A pacer under `policy`.
    pub fn new(policy: BurstPolicy) -> Pacer {
        let qps = NonZeroU32::new(policy.api_qps.max(1)).expect("max(1) > 0");
        Pacer {
            policy,
            state: Mutex::new((BurstState::default(), Pace::Free)),
            requests: RateLimiter::direct(Quota::per_second(qps).allow_burst(NonZeroU32::MIN)),
            freed: tokio::sync::Notify::new(),
        }
    }

    /// The state, brought up to now: says when a burst begins or ends, and lets the requests
    /// held back go when it ends.
    fn state(&self, now_ms: i64) -> std::sync::MutexGuard<'_, (BurstState, Pace)> {
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (state, last) = &mut *guard;
        let pace = state.pace(&self.policy, now_ms);
        if pace != *last {
            *last = pace;
            match pace {
                Pace::Paced => tracing::info!(
                    arrivals = state.recent_arrivals(),
                    window_s = WINDOW.as_secs(),
                    "a burst of jobs is arriving: new launches paced at {}/s, status writes and Events at {}/s, for at most {} s",
                    self.policy.launch_rate,
                    self.policy.api_qps,
                    self.policy.hold.as_secs()
                ),
                Pace::Free => {
                    tracing::info!("the burst is over (or paced for its longest): full speed");
                    self.freed.notify_waiters();
                }
            }
        }
        guard
    }

    /// A job created at `created_ms` was seen new ([`BurstState::arrive`]).
    pub fn arrive(&self, created_ms: i64) {
        let now = crate::lifecycle::now_ms();
        self.state(now).0.arrive(created_ms, now);
        // Said at once when this arrival begins a burst.
        drop(self.state(now));
    }

    /// Whether it paces now.
    pub fn pace(&self) -> Pace {
        self.state(crate::lifecycle::now_ms()).1
    }

    /// New jobs that may launch now ([`BurstState::launch_allowance`]).
    pub fn launch_allowance(&self) -> usize {
        let now = crate::lifecycle::now_ms();
        self.state(now).0.launch_allowance(&self.policy, now)
    }

    /// `n` new jobs launched ([`BurstState::launched`]).
    pub fn launched(&self, n: usize) {
        let now = crate::lifecycle::now_ms();
        self.state(now).0.launched(&self.policy, n, now);
    }

    /// How long until the pacing should be looked at again (None: not paced).
    pub fn next_look(&self) -> Option<Duration> {
        let now = crate::lifecycle::now_ms();
        self.state(now)
            .0
            .next_look_ms(&self.policy, now)
            .map(|t| Duration::from_millis(t.saturating_sub(now).max(1) as u64))
    }

    /// Waits, while paced, for a token of the paced request budget; returns at once when free,
    /// or when the pacing ends (seen by whoever looks at it next: the scheduler looks at least
    /// every [`WINDOW`] / 4 while paced).
    pub async fn for_request(&self) {
        loop {
            // Registered before the look, so that an end of pacing in between is not missed.
            let freed = self.freed.notified();
            if self.pace() == Pace::Free {
                return;
            }
            tokio::select! {
                _ = self.requests.until_ready() => return,
                _ = freed => {}
            }
        }
    }

    /// True when a request may go now: not paced, or a token of the paced budget was taken.
    pub fn try_request(&self) -> bool {
        self.pace() == Pace::Free || self.requests.check().is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const POLICY: BurstPolicy = BurstPolicy {
        threshold_per_s: 20,
        launch_rate: 2,
        api_qps: 5,
        hold: Duration::from_secs(30),
    };

    /// `n` arrivals evenly over `[from, to)`, each created when seen.
    fn arrive_evenly(s: &mut BurstState, n: usize, from: i64, to: i64) {
        for i in 0..n as i64 {
            let t = from + (to - from) * i / n as i64;
            s.arrive(t, t);
        }
    }

    #[test]
    fn forty_arrivals_in_two_seconds_are_a_burst_and_thirty_nine_are_not() {
        let mut s = BurstState::default();
        arrive_evenly(&mut s, 39, 0, 2000);
        assert_eq!(s.pace(&POLICY, 1999), Pace::Free);
        s.arrive(1999, 1999);
        assert_eq!(s.pace(&POLICY, 1999), Pace::Paced);
        // Two seconds later without arrivals: over.
        assert_eq!(s.pace(&POLICY, 4100), Pace::Free);
    }

    #[test]
    fn jobs_found_at_start_are_no_burst() {
        let mut s = BurstState::default();
        for _ in 0..1000 {
            s.arrive(0, 60_000);
        }
        assert_eq!(s.pace(&POLICY, 60_000), Pace::Free);
    }

    #[test]
    fn while_paced_one_launch_per_interval_and_free_launches_are_unbounded() {
        let mut s = BurstState::default();
        assert_eq!(s.launch_allowance(&POLICY, 0), usize::MAX);
        arrive_evenly(&mut s, 100, 0, 1000);
        assert_eq!(s.launch_allowance(&POLICY, 1000), 1);
        s.launched(&POLICY, 1, 1000);
        assert_eq!(s.launch_allowance(&POLICY, 1200), 0);
        assert_eq!(s.next_look_ms(&POLICY, 1200), Some(1500));
        assert_eq!(s.launch_allowance(&POLICY, 1500), 1);
    }

    #[test]
    fn a_steady_stream_is_paced_for_the_hold_only() {
        let mut s = BurstState::default();
        let mut paced_ms = 0;
        for t in (0..120_000).step_by(20) {
            s.arrive(t, t); // 50 per second
            if s.pace(&POLICY, t) == Pace::Paced {
                paced_ms += 20;
            }
        }
        assert!((29_000..=30_020).contains(&paced_ms), "paced {paced_ms} ms");
    }

    #[test]
    fn off_never_paces() {
        let mut s = BurstState::default();
        arrive_evenly(&mut s, 1000, 0, 1000);
        assert_eq!(s.pace(&BurstPolicy::OFF, 1000), Pace::Free);
        assert_eq!(s.launch_allowance(&BurstPolicy::OFF, 1000), usize::MAX);
    }

    proptest! {
        /// Whatever the arrivals: launches while paced never exceed one per interval (plus
        /// one), pacing never lasts longer than the hold in one stretch, and with no arrival
        /// in the last window it is free.
        #[test]
        fn pacing_is_bounded(gaps in proptest::collection::vec(0i64..200, 1..400), looks in 1i64..50) {
            let mut s = BurstState::default();
            let mut t = 0i64;
            let mut paced_since: Option<i64> = None;
            let mut launches_paced = 0i64;
            let mut first_paced_launch: Option<i64> = None;
            for g in gaps {
                t += g;
                s.arrive(t, t);
                let mut u = t;
                while u < t + g.max(1) {
                    let allowed = s.launch_allowance(&POLICY, u);
                    match s.pace(&POLICY, u) {
                        Pace::Paced => {
                            let since = *paced_since.get_or_insert(u);
                            prop_assert!(u - since < POLICY.hold.as_millis() as i64);
                            if allowed > 0 {
                                prop_assert_eq!(allowed, 1);
                                s.launched(&POLICY, 1, u);
                                launches_paced += 1;
                                let first = *first_paced_launch.get_or_insert(u);
                                prop_assert!(launches_paced <= 1 + (u - first) / POLICY.launch_interval_ms());
                            }
                        }
                        Pace::Free => {
                            paced_since = None;
                            prop_assert_eq!(allowed, usize::MAX);
                        }
                    }
                    u += looks;
                }
            }
            prop_assert_eq!(s.pace(&POLICY, t + WINDOW.as_millis() as i64 + 1), Pace::Free);
        }
    }
}
