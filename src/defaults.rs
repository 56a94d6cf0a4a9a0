//! Every default of the operator, in one place: the `managed-jobs run` flags' values when they
//! are not given (`cli`), the settings a job controller uses when no operator wrote any
//! (`store::settings`), and what a job's spec falls back to. Each with its unit and where it
//! comes from.

use std::time::Duration;

use crate::api::ExecutorKind;

/// `--cancel-grace-seconds`: SIGTERM to SIGKILL when stopping a workload, seconds (Kubernetes'
/// default `terminationGracePeriodSeconds` is 30; a batch job that checkpoints on SIGTERM
/// usually needs less, and a cancel should feel prompt).
pub const CANCEL_GRACE_SECONDS: f64 = 5.0;

/// `--restart-backoff-seconds`: the first back-off before a restart after an error, seconds;
/// doubles per restart up to `lifecycle::clock::MAX_BACKOFF` (the kubelet's CrashLoopBackOff
/// starts at 10 s; a managed job's restart is rarer and costs a launch).
pub const RESTART_BACKOFF_SECONDS: f64 = 1.0;

/// `--max-controller-crashes`: job controller exits before the job is done, in a row, that end
/// it FailedController (SkyPilot fails at the first; a resumed controller loses nothing).
pub const MAX_CONTROLLER_CRASHES: i64 = 3;

/// `--launch-timeout-seconds`, in seconds: how long a launched workload may take to start
/// running. Kueue's waitForPodsReady defaults to 5 minutes; ours is longer because ML images of
/// several GB often take minutes to pull, and a timeout costs the whole launch again.
pub const LAUNCH_TIMEOUT_SECONDS: f64 = 600.0;

/// [`LAUNCH_TIMEOUT_SECONDS`] as a duration (a job's `spec.launchTimeoutSeconds` overrides it).
pub const LAUNCH_TIMEOUT: Duration = Duration::from_secs(LAUNCH_TIMEOUT_SECONDS as u64);

/// `--node-lost-grace-seconds`, in seconds: how long the node of a live attempt's member may
/// stay not Ready (its `Ready` condition `False` or `Unknown`) before the member is lost and
/// its attempt recovered (a deleted node loses it at once). The condition turns `Unknown` only
/// after kube-controller-manager's node-monitor-grace-period without a heartbeat (40 s; 50 s
/// since Kubernetes 1.32), so a node that died is given up 90-110 s after its last heartbeat,
/// a third of what Kubernetes takes to evict its Pods (taint-based eviction's default
/// toleration, 300 s, on top); a kubelet restart or a short network partition (tens of
/// seconds) costs no recovery, which for a gang is a relaunch of every member.
pub const NODE_LOST_GRACE_SECONDS: f64 = 60.0;

/// `--max-launch-timeouts`: launch timeouts in a row that end a job FailedNoResource.
pub const MAX_LAUNCH_TIMEOUTS: i32 = 3;

/// `--kept-log-bytes`, bytes: how much of the end of each container's log a pod job's
/// controller keeps per attempt in the state dir, after the attempt ended or before it stops
/// its Pods (`docs/reference/what-survives-what.md`). 1 MiB: a tenth of what the kubelet keeps
/// of a container (its `containerLogMaxSize`, 10 MiB), some 10,000 lines of 100 bytes (the end
/// of the output is what explains a failure); a job of ten attempts of one container then
/// keeps at most 10 MiB of the state volume. 0 keeps none.
pub const KEPT_LOG_BYTES: u64 = 1024 * 1024;

/// `--job-memory-mib`: the per-job memory budget behind the run cap, MiB. A job controller
/// process measures about 1-4 MiB of private memory (USS; see BENCHMARKS.md); the budget
/// leaves room for its page tables and kernel overhead and for bursts while it launches
/// (SkyPilot assumed 350 MB per Python process).
pub const JOB_MEMORY_MIB: u64 = 16;

/// `--reserved-memory-mib`: memory kept for the operator itself and the host, MiB.
pub const RESERVED_MEMORY_MIB: u64 = 512;

/// `--api-qps`: sustained Kubernetes API requests per second for the operator's writes (status
/// writes first, Events from what they leave; client-go's default is 5, too few for thousands
/// of jobs, and the API server's default max-mutating-requests-inflight is 200).
pub const API_QPS: u32 = 50;

/// `--api-burst`: requests above [`API_QPS`] in a burst (twice the rate, as client-go pairs
/// them).
pub const API_BURST: u32 = 100;

/// `--burst-threshold`: ManagedJobs created per second (over the last 2 s) at which the operator
/// sees a burst arriving and paces itself ([`crate::pacing`]). A `kubectl apply` of many jobs
/// sends 50-80 per second on the dev control plane; a script creating one job after another
/// far fewer than 20.
pub const BURST_THRESHOLD: u32 = 20;

/// `--burst-launch-rate`: new jobs launched per second while a burst arrives.
pub const BURST_LAUNCH_RATE: u32 = 2;

/// `--burst-api-qps`: the operator's status writes and Events per second while a burst arrives
/// (client-go's default QPS).
pub const BURST_API_QPS: u32 = 5;

/// `--burst-hold-seconds`: longest one burst is paced; a steady stream above the threshold is
/// served at full speed after that.
pub const BURST_HOLD_SECONDS: u64 = 30;

/// `--metrics-addr`: where `/metrics`, `/healthz` and `/readyz` are served.
pub const METRICS_ADDR: &str = "0.0.0.0:8080";

/// `--lease-duration-seconds`: a dead leader is replaced within this, seconds (client-go's
/// leader election default is 15 s).
pub const LEASE_DURATION_SECONDS: u64 = 15;

/// `--log-format`.
pub const LOG_FORMAT: &str = "text";

/// `--executors`: inside a cluster only `pod` (the local executor would run user code with the
/// operator's identity, so it is switched on explicitly); outside one (a laptop, the dev
/// control plane) `local,pod`.
pub fn executors(in_cluster: bool) -> Vec<ExecutorKind> {
    if in_cluster {
        vec![ExecutorKind::Pod]
    } else {
        vec![ExecutorKind::Local, ExecutorKind::Pod]
    }
}

/// Seconds as a duration; `secs` is one of the defaults above (finite, not negative).
pub fn seconds(secs: f64) -> Duration {
    Duration::from_secs_f64(secs)
}

/// How often the operator writes a queue's status (`ManagedJobQueue.status`: its waiting,
/// launching and running counts and its share), at most, and only when it changed: at most 6
/// API writes per queue per minute, however busy the queue (a job's own status carries its
/// progress; the queue's counts are a summary). Written with what the API budget leaves after
/// the jobs' status writes, as Events are.
pub const QUEUE_STATUS_PERIOD: Duration = Duration::from_secs(10);
