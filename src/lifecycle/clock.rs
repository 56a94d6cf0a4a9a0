//! Time, as every stored time is kept (milliseconds since the Unix epoch), and the back-off
//! between attempts.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Longest back-off between restarts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// Back-off before restart number `restart` (1-based): `base x 2^(restart-1)`, capped at
/// [`MAX_BACKOFF`] (the doubling of the kubelet's CrashLoopBackOff and of the batch/v1 Job
/// controller's pod failure back-off).
pub fn backoff(base: Duration, restart: i32) -> Duration {
    let factor = 1u32 << (restart.clamp(1, 16) - 1) as u32;
    base.saturating_mul(factor).min(MAX_BACKOFF)
}

/// The earlier of two optional times (ms since epoch); None only when both are.
pub fn earliest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    a.into_iter().chain(b).min()
}

/// Milliseconds since the Unix epoch, now (the clock of every stored time).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// `ms` (since the epoch) as a metav1.Time in whole seconds: the precision a task record's
/// times are stored and shown with.
pub fn time_in_seconds(ms: i64) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        jiff::Timestamp::from_second(ms.div_euclid(1000)).unwrap_or(jiff::Timestamp::UNIX_EPOCH),
    )
}

/// A metav1.Time as ms since the epoch.
pub fn ms_of(t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> Option<i64> {
    t.as_ref().map(|t| t.0.as_millisecond())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let base = Duration::from_secs(1);
        assert_eq!(backoff(base, 1), base);
        assert_eq!(backoff(base, 3), Duration::from_secs(4));
        assert_eq!(backoff(base, 40), MAX_BACKOFF);
        assert_eq!(earliest(Some(3), None), Some(3));
        assert_eq!(earliest(Some(3), Some(2)), Some(2));
    }
}
