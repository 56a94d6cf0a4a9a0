//! The operator's API budget (`--api-qps`, `--api-burst`): one token bucket shared by status
//! writes and Events, in which a status write always goes first; while a burst of jobs arrives,
//! both are paced further ([`crate::pacing`]).

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use crate::pacing::{BurstPolicy, Pacer};

/// How often an Event waiting behind status writes looks again for a spare token.
pub const EVENT_RETRY: Duration = Duration::from_millis(50);

/// A token bucket of `qps` requests per second with bursts of `burst` (governor's GCRA), whose
/// tokens go to status writes first: an Event takes one only while no status write is waiting
/// for one.
///
/// A job's status is what users and tools read (`kubectl wait`, GitOps health checks); Events
/// are best effort. Without an order, a steady 35 jobs/s at the default 50 QPS spent two thirds
/// of the budget on Events (two per job) and the statuses queued behind them (p99 7 s).
pub struct RequestBudget {
    limiter: DefaultDirectRateLimiter,
    status_waiting: AtomicUsize,
    pacer: Arc<Pacer>,
}

impl RequestBudget {
    /// A budget of `qps` requests per second, bursts of `burst` (each at least 1), never paced.
    pub fn new(qps: u32, burst: u32) -> RequestBudget {
        RequestBudget::paced(qps, burst, Arc::new(Pacer::new(BurstPolicy::OFF)))
    }

    /// A budget of `qps` requests per second, bursts of `burst` (each at least 1), paced
    /// further by `pacer` while it paces.
    pub fn paced(qps: u32, burst: u32, pacer: Arc<Pacer>) -> RequestBudget {
        let quota = Quota::per_second(NonZeroU32::new(qps.max(1)).expect("max(1) > 0"))
            .allow_burst(NonZeroU32::new(burst.max(1)).expect("max(1) > 0"));
        RequestBudget {
            limiter: RateLimiter::direct(quota),
            status_waiting: AtomicUsize::new(0),
            pacer,
        }
    }

    /// Waits for a token for a status write.
    pub async fn for_status(&self) {
        self.status_waiting.fetch_add(1, Ordering::SeqCst);
        // Decremented however this future ends (a dropped write must not hold Events back).
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let _waiting = Waiting(&self.status_waiting);
        self.pacer.for_request().await;
        self.limiter.until_ready().await;
    }

    /// Waits for a token for a status write that only tells a waiting job its new reason
    /// (`store::jobs::REASON_ONLY`): as an Event does, one no other status write is waiting for.
    /// Such writes come in thousands when a reason of a long queue changes; they share what
    /// status writes leave with the Events.
    pub async fn for_reason(&self) {
        self.for_event().await
    }

    /// Waits for a token for an Event: one no status write is waiting for.
    pub async fn for_event(&self) {
        loop {
            if self.status_waiting.load(Ordering::SeqCst) == 0
                && self.pacer.try_request()
                && self.limiter.check().is_ok()
            {
                return;
            }
            tokio::time::sleep(EVENT_RETRY).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// With the bucket empty and a status write waiting, an Event gets no token until that
    /// write has had its own; with no status write waiting, an Event gets a spare token.
    #[tokio::test]
    async fn a_status_write_takes_the_next_token_before_any_event() {
        let budget = Arc::new(RequestBudget::new(5, 1));
        budget.for_status().await; // empties the bucket of one
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let event = {
            let (budget, order) = (budget.clone(), order.clone());
            tokio::spawn(async move {
                budget.for_event().await;
                order.lock().unwrap().push("event");
            })
        };
        // Give the Event a head start: it is already waiting when the status write arrives.
        tokio::time::sleep(Duration::from_millis(10)).await;
        let status = {
            let (budget, order) = (budget.clone(), order.clone());
            tokio::spawn(async move {
                budget.for_status().await;
                order.lock().unwrap().push("status");
            })
        };
        status.await.unwrap();
        event.await.unwrap();
        assert_eq!(*order.lock().unwrap(), ["status", "event"]);
        assert_eq!(budget.status_waiting.load(Ordering::SeqCst), 0);
    }

    /// Events alone use the whole budget.
    #[tokio::test]
    async fn events_alone_get_tokens() {
        let budget = RequestBudget::new(1000, 10);
        for _ in 0..10 {
            tokio::time::timeout(Duration::from_secs(1), budget.for_event())
                .await
                .expect("a spare token");
        }
    }
}
