//! Prometheus metrics and the operator's HTTP endpoints (`/metrics`, `/healthz`, `/readyz`).
//!
//! Metric names live here and only here. No metric carries a per-job label value: cardinality is
//! bounded by the number of phases, schedule states, verbs, exit reasons and queues (the
//! ManagedJobQueue objects, as Kueue labels its metrics by ClusterQueue).
//!
//! Besides the `managedjobs_*` metrics: `managedjobs_build_info` (the version, the store's schema
//! step and the API, value 1) and the standard `process_*` metrics of the operator's own process
//! (CPU seconds, resident and virtual memory, open and maximum file descriptors, threads, start
//! time), as Prometheus' client libraries name them, so existing dashboards read them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

use crate::api::{JobPhase, ScheduleState};
use crate::store::Store;

/// Label set with one `phase` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    /// A [`JobPhase`] name.
    pub phase: String,
}

/// Label set with one `state` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// A [`ScheduleState`] name.
    pub state: String,
}

/// Label set with one `watch` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchLabel {
    /// Which watch: `ManagedJob`, `Pod`, `claim Lease`, `ManagedJobQueue`, `Namespace`.
    pub watch: String,
}

/// Label set with one `verb` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbLabel {
    /// `patch`, `create`, `delete`, ...
    pub verb: String,
}

/// Label set of a preemption: the victim's queue and the queue that took its run slot.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PreemptionLabel {
    /// The victim's queue.
    pub queue: String,
    /// The queue that took its run slot (the victim's own for a higher priority).
    pub by: String,
}

/// Label set with one `reason` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// `done` (the job finished) or `crashed` (exited before the job was done).
    pub reason: String,
}

/// Label set with one `queue` label (a ManagedJobQueue's name, `default` included).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabel {
    /// The queue.
    pub queue: String,
}

/// Label set of a queue's quota on a pool for one resource (Kueue's
/// `cluster_queue_nominal_quota{cluster_queue, flavor, resource}`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QuotaLabels {
    /// The ManagedJobQueue.
    pub queue: String,
    /// The ManagedJobPool.
    pub pool: String,
    /// The resource (`cpu`, `memory`, `nvidia.com/gpu`, ...).
    pub resource: String,
}

/// Label set of `managedjobs_attempts_total`: bounded (5 actions x 2 sources).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AttemptLabels {
    /// What an ended attempt led to: `Succeeded`, `FailJob`, `Restart`, `Recover` or `Ignore`
    /// (`lifecycle::Verdict`).
    pub action: String,
    /// `rule` (a failure rule of the job matched) or `default` (none did).
    pub decided_by: String,
}

/// Every metric the operator exports.
pub struct Metrics {
    registry: Registry,
    /// Jobs in the store by phase (refreshed at each scrape).
    pub jobs_by_phase: Family<PhaseLabel, Gauge>,
    /// Jobs in the store by schedule state (refreshed at each scrape).
    pub jobs_by_schedule_state: Family<StateLabel, Gauge>,
    /// Launch slots in use (jobs in Launching).
    pub launch_slots_in_use: Gauge,
    /// Jobs waiting to be admitted, by queue (refreshed at each scrape): the queue's depth.
    pub queue_waiting_jobs: Family<QueueLabel, Gauge>,
    /// Launch slots held, by queue (refreshed at each scrape).
    pub queue_launch_slots_in_use: Family<QueueLabel, Gauge>,
    /// Run slots held, by queue (refreshed at each scrape).
    pub queue_run_slots_in_use: Family<QueueLabel, Gauge>,
    /// Run slots in use (jobs in Launching, Alive, AliveWaiting).
    pub run_slots_in_use: Gauge,
    /// A queue's nominal quota per pool and resource, in the resource's unit (cores, bytes,
    /// devices; refreshed at each scrape).
    pub queue_nominal_quota: Family<QuotaLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// What a queue's jobs holding a run slot ask for, per pool and resource.
    pub queue_resource_usage: Family<QuotaLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// What of that is above the nominal quota, borrowed from the cohort.
    pub queue_resource_borrowed: Family<QuotaLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// What of a queue's nominal quota other queues of its cohort use.
    pub queue_resource_lent: Family<QuotaLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// The launch cap in force.
    pub launch_cap: Gauge,
    /// The run cap in force.
    pub run_cap: Gauge,
    /// 1 while a burst of arriving jobs is paced ([`crate::pacing`]), else 0.
    pub burst_paced: Gauge,
    /// Duration of one scheduling pass, seconds.
    pub scheduling_pass_seconds: Histogram,
    /// From submission to the start of the job controller process, seconds.
    pub submit_to_launch_seconds: Histogram,
    /// Reconciles that returned an error.
    pub reconcile_errors_total: Counter,
    /// Job controller process exits by reason.
    pub controller_exits_total: Family<ReasonLabel, Counter>,
    /// Kubernetes API requests the operator made, by verb.
    pub api_requests_total: Family<VerbLabel, Counter>,
    /// Preemptions requested, by the victim's queue and the queue that took its slot.
    pub preemptions_total: Family<PreemptionLabel, Counter>,
    /// Finished jobs whose last Events were not published because their queue was full (Events
    /// are best effort, as in client-go's recorder, which drops beyond 1,000 queued).
    pub events_dropped_total: Counter,
    /// Events the API server refused (logged at warn with its reason).
    pub events_refused_total: Counter,
    /// Job controller starts put off because the node lacked resources (EMFILE, EAGAIN,
    /// ENOMEM); each is retried after a back-off, never failing the job.
    pub controller_spawns_deferred_total: Counter,
    /// Status writes the API server refused or that failed (each retried with a per-job
    /// back-off).
    pub status_write_failures_total: Counter,
    /// From a job's terminal transition in the store to the API server accepting the status
    /// write that carries it, seconds.
    pub terminal_status_lag_seconds: Histogram,
    /// Attempts that ended, by what was decided and whether a failure rule decided it
    /// (refreshed from the store at each scrape: job controllers count them there).
    pub attempts_total: Family<AttemptLabels, Counter>,
    /// Namespaces whose claim this operator wants, by where it stands (`held`, `paused`: its
    /// renewal is overdue, `elsewhere`: another operator owns their jobs; `lifecycle::claim`).
    pub claims: Family<StateLabel, Gauge>,
    /// Watches that listed every object again after failing (an API outage, a broken
    /// connection), by watch.
    pub watch_relists_total: Family<WatchLabel, Counter>,
    ready: AtomicBool,
    /// Why the operator is not ready although started, by what fails (e.g. `crd`,
    /// `state-dir`): one sentence each.
    problems: std::sync::Mutex<std::collections::BTreeMap<&'static str, String>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric under the `managedjobs` prefix.
    pub fn new() -> Metrics {
        Metrics::for_shard(None)
    }

    /// [`Metrics::new`], every series labelled `shard="NAME"` for a shard's operator (`--shard`;
    /// the default instance's carry no label), so one Prometheus can tell the shards apart.
    pub fn for_shard(shard: Option<&str>) -> Metrics {
        let labels = shard
            .map(|s| {
                (
                    std::borrow::Cow::Borrowed("shard"),
                    std::borrow::Cow::Owned(s.to_string()),
                )
            })
            .into_iter();
        let mut root = Registry::with_labels(labels);
        root.register_collector(Box::new(ProcessCollector));
        let registry = root.sub_registry_with_prefix("managedjobs");
        let m = Metrics {
            jobs_by_phase: Family::default(),
            jobs_by_schedule_state: Family::default(),
            launch_slots_in_use: Gauge::default(),
            queue_waiting_jobs: Family::default(),
            queue_launch_slots_in_use: Family::default(),
            queue_run_slots_in_use: Family::default(),
            queue_nominal_quota: Family::default(),
            queue_resource_usage: Family::default(),
            queue_resource_borrowed: Family::default(),
            queue_resource_lent: Family::default(),
            run_slots_in_use: Gauge::default(),
            launch_cap: Gauge::default(),
            run_cap: Gauge::default(),
            burst_paced: Gauge::default(),
            scheduling_pass_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            submit_to_launch_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 16)),
            reconcile_errors_total: Counter::default(),
            controller_exits_total: Family::default(),
            api_requests_total: Family::default(),
            preemptions_total: Family::default(),
            events_dropped_total: Counter::default(),
            events_refused_total: Counter::default(),
            status_write_failures_total: Counter::default(),
            controller_spawns_deferred_total: Counter::default(),
            terminal_status_lag_seconds: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            attempts_total: Family::default(),
            claims: Family::default(),
            watch_relists_total: Family::default(),
            ready: AtomicBool::new(false),
            problems: Default::default(),
            registry: Registry::default(),
        };
        registry.register(
            "jobs",
            "Jobs in the store by phase",
            m.jobs_by_phase.clone(),
        );
        registry.register(
            "jobs_by_schedule_state",
            "Jobs in the store by schedule state",
            m.jobs_by_schedule_state.clone(),
        );
        registry.register(
            "launch_slots_in_use",
            "Jobs in Launching",
            m.launch_slots_in_use.clone(),
        );
        registry.register(
            "run_slots_in_use",
            "Jobs in Launching, Alive or AliveWaiting",
            m.run_slots_in_use.clone(),
        );
        registry.register(
            "queue_waiting_jobs",
            "Jobs waiting to be admitted (Waiting), by queue",
            m.queue_waiting_jobs.clone(),
        );
        registry.register(
            "queue_launch_slots_in_use",
            "Launch slots held (Launching), by queue",
            m.queue_launch_slots_in_use.clone(),
        );
        registry.register(
            "queue_run_slots_in_use",
            "Run slots held (Launching, Alive or AliveWaiting), by queue",
            m.queue_run_slots_in_use.clone(),
        );
        registry.register(
            "queue_nominal_quota",
            "A queue's nominal quota on a pool, per resource (cores, bytes or devices)",
            m.queue_nominal_quota.clone(),
        );
        registry.register(
            "queue_resource_usage",
            "What a queue's jobs holding a run slot ask for on a pool, per resource",
            m.queue_resource_usage.clone(),
        );
        registry.register(
            "queue_resource_borrowed",
            "What a queue uses above its nominal quota on a pool, borrowed from its cohort",
            m.queue_resource_borrowed.clone(),
        );
        registry.register(
            "queue_resource_lent",
            "What of a queue's nominal quota on a pool other queues of its cohort use",
            m.queue_resource_lent.clone(),
        );
        registry.register(
            "build",
            "The operator's build: its version, its store's schema step and the API it serves (value 1)",
            Info::new(vec![
                ("version".to_string(), env!("CARGO_PKG_VERSION").to_string()),
                (
                    "store_schema_step".to_string(),
                    crate::store::schema::CURRENT_STEP.to_string(),
                ),
                ("api".to_string(), "managedjobs.dev/v1alpha1".to_string()),
            ]),
        );
        registry.register("launch_cap", "Launch cap in force", m.launch_cap.clone());
        registry.register("run_cap", "Run cap in force", m.run_cap.clone());
        registry.register(
            "burst_paced",
            "1 while a burst of arriving jobs is paced (new launches, status writes and Events held back)",
            m.burst_paced.clone(),
        );
        registry.register(
            "scheduling_pass_seconds",
            "Duration of one scheduling pass",
            m.scheduling_pass_seconds.clone(),
        );
        registry.register(
            "submit_to_launch_seconds",
            "Time from submission to the start of the job controller process",
            m.submit_to_launch_seconds.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconciles that returned an error",
            m.reconcile_errors_total.clone(),
        );
        registry.register(
            "job_controller_exits",
            "Job controller process exits by reason: done (its job finished), crashed (before, while the operator ran), handed_over (found gone at the operator's start: a restart or a version change)",
            m.controller_exits_total.clone(),
        );
        registry.register(
            "api_requests",
            "Kubernetes API requests made by the operator, by verb",
            m.api_requests_total.clone(),
        );
        registry.register(
            "preemptions",
            "Preemptions requested by a scheduling pass, by the victim's queue and the queue that took its run slot (spec.preemption)",
            m.preemptions_total.clone(),
        );
        registry.register(
            "events_dropped",
            "Events not published because their queue was full",
            m.events_dropped_total.clone(),
        );
        registry.register(
            "events_refused",
            "Events the API server refused",
            m.events_refused_total.clone(),
        );
        registry.register(
            "controller_spawns_deferred",
            "Job controller starts put off because the node lacked resources",
            m.controller_spawns_deferred_total.clone(),
        );
        registry.register(
            "status_write_failures",
            "Status writes that failed (retried with a per-job back-off)",
            m.status_write_failures_total.clone(),
        );
        registry.register(
            "terminal_status_lag_seconds",
            "Time from a job's terminal transition in the store to the API accepting its status",
            m.terminal_status_lag_seconds.clone(),
        );
        registry.register(
            "attempts",
            "Attempts that ended, by the action decided (Succeeded, FailJob, Restart, Recover, Ignore) and whether a failure rule or the default decided it",
            m.attempts_total.clone(),
        );
        registry.register(
            "claims",
            "Namespaces whose claim this operator wants, by state: held, paused (renewal overdue), elsewhere (another operator owns their jobs)",
            m.claims.clone(),
        );
        registry.register(
            "watch_relists",
            "Watches that listed every object again after failing, by watch",
            m.watch_relists_total.clone(),
        );
        Metrics {
            registry: root,
            ..m
        }
    }

    /// Counts one API request.
    pub fn api_request(&self, verb: &str) {
        self.api_requests_total
            .get_or_create(&VerbLabel { verb: verb.into() })
            .inc();
    }

    /// Counts one preemption of a job of `queue` for queue `by`.
    pub fn preemption(&self, queue: &str, by: &str) {
        self.preemptions_total
            .get_or_create(&PreemptionLabel {
                queue: queue.into(),
                by: by.into(),
            })
            .inc();
    }

    /// Marks the operator ready (`/readyz` answers 200).
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    /// True once [`Metrics::set_ready`] was called and while no problem is set.
    pub fn is_ready(&self) -> bool {
        self.readiness().is_ok()
    }

    /// Records (Some) or clears (None) a problem that makes the operator not ready, under
    /// `what` fails (`crd`, `state-dir`). Returns true when this changed whether `what` fails.
    pub fn set_problem(&self, what: &'static str, problem: Option<String>) -> bool {
        let mut problems = self.problems.lock().unwrap_or_else(|e| e.into_inner());
        match problem {
            Some(p) => problems.insert(what, p).is_none(),
            None => problems.remove(what).is_some(),
        }
    }

    /// Ok once started and while nothing fails; else why not (`/readyz`'s body).
    pub fn readiness(&self) -> Result<(), String> {
        if !self.ready.load(Ordering::Relaxed) {
            return Err("starting".into());
        }
        let problems = self.problems.lock().unwrap_or_else(|e| e.into_inner());
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.values().cloned().collect::<Vec<_>>().join("; "))
        }
    }

    /// Refreshes the store-derived gauges and renders the text exposition format; `queues`
    /// (the queues in force, when any) gives the quota gauges.
    pub fn render(&self, store: &Store, queues: Option<&crate::queues::Queues>) -> String {
        self.quotas(store, queues);
        if let Ok(counts) = store.counts_by_state() {
            for &p in JobPhase::ALL {
                let n = counts.iter().filter(|c| c.0 == p).map(|c| c.2).sum::<i64>();
                self.jobs_by_phase
                    .get_or_create(&PhaseLabel {
                        phase: p.as_str().into(),
                    })
                    .set(n);
            }
            for &s in ScheduleState::ALL {
                let n = counts.iter().filter(|c| c.1 == s).map(|c| c.2).sum::<i64>();
                self.jobs_by_schedule_state
                    .get_or_create(&StateLabel {
                        state: s.as_str().into(),
                    })
                    .set(n);
            }
        }
        if let Ok(counts) = store.attempt_actions() {
            for (action, decided_by, count) in counts {
                let counter = self
                    .attempts_total
                    .get_or_create(&AttemptLabels { action, decided_by });
                // A counter only grows: a store that began again (lost) starts over from here.
                let seen = counter.get() as i64;
                if count > seen {
                    counter.inc_by((count - seen) as u64);
                }
            }
        }
        if let Ok(usage) = store.slot_usage() {
            self.launch_slots_in_use.set(usage.launching as i64);
            self.run_slots_in_use.set(usage.alive as i64);
        }
        if let Ok(queues) = store.queue_counts() {
            // A queue that holds and waits for nothing any more has no series (not a 0 kept for
            // ever for a queue that was deleted).
            self.queue_waiting_jobs.clear();
            self.queue_launch_slots_in_use.clear();
            self.queue_run_slots_in_use.clear();
            for (queue, counts) in queues {
                let label = QueueLabel { queue };
                self.queue_waiting_jobs
                    .get_or_create(&label)
                    .set(counts.waiting as i64);
                self.queue_launch_slots_in_use
                    .get_or_create(&label)
                    .set(counts.load.launching as i64);
                self.queue_run_slots_in_use
                    .get_or_create(&label)
                    .set(counts.load.alive as i64);
            }
        }
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Metrics {
    /// The quota gauges: every queue with pools, per pool and resource; none without.
    fn quotas(&self, store: &Store, queues: Option<&crate::queues::Queues>) {
        let families = [
            &self.queue_nominal_quota,
            &self.queue_resource_usage,
            &self.queue_resource_borrowed,
            &self.queue_resource_lent,
        ];
        for f in families {
            f.clear();
        }
        let Some(queues) = queues.filter(|q| q.any_quotas()) else {
            return;
        };
        let Ok(usage) = store.quota_usage() else {
            return;
        };
        let ledger = crate::resources::quota::Ledger::new(queues.quotas(), usage);
        let unit = |milli: i64| milli as f64 / crate::resources::amount::ONE as f64;
        for queue in ledger.quotas().keys() {
            for (pool, uses) in ledger.status(queue) {
                for u in uses {
                    let label = QuotaLabels {
                        queue: queue.clone(),
                        pool: pool.clone(),
                        resource: u.resource.clone(),
                    };
                    for (family, value) in
                        families.iter().zip([u.nominal, u.used, u.borrowed, u.lent])
                    {
                        family.get_or_create(&label).set(unit(value));
                    }
                }
            }
        }
    }
}

/// The standard `process_*` metrics of this process (Prometheus' process collector's names and
/// units), read from `/proc` at each scrape; none when `/proc` cannot be read.
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(usage) = crate::process::usage(std::process::id() as i32) else {
            return Ok(());
        };
        let (ticks, page) = crate::process::ticks_and_page_size();
        let cpu = ConstCounter::new(usage.cpu_ticks as f64 / ticks as f64);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu",
            "Total user and system CPU time spent",
            Some(&Unit::Seconds),
            cpu.metric_type(),
        )?)?;
        let mut gauge = |name: &str, help: &str, unit: Option<&Unit>, value: f64| {
            let g = ConstGauge::new(value);
            g.encode(encoder.encode_descriptor(name, help, unit, g.metric_type())?)
        };
        gauge(
            "process_resident_memory",
            "Resident memory size",
            Some(&Unit::Bytes),
            (usage.resident_pages * page) as f64,
        )?;
        gauge(
            "process_virtual_memory",
            "Virtual memory size",
            Some(&Unit::Bytes),
            usage.virtual_bytes as f64,
        )?;
        gauge("process_threads", "OS threads", None, usage.threads as f64)?;
        if let Some(boot) = crate::process::boot_time() {
            gauge(
                "process_start_time",
                "Start time of the process since the epoch",
                Some(&Unit::Seconds),
                boot as f64 + usage.start_ticks as f64 / ticks as f64,
            )?;
        }
        if let Some(open) = crate::process::open_fds() {
            gauge(
                "process_open_fds",
                "Open file descriptors",
                None,
                open as f64,
            )?;
        }
        if let Ok((soft, _)) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        {
            gauge(
                "process_max_fds",
                "Maximum open file descriptors",
                None,
                soft as f64,
            )?;
        }
        Ok(())
    }
}

/// Renders the `/metrics` body.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;
/// Answers whether `/readyz` is 200 (Ok), or why not.
pub type Ready = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr` until the process ends.
pub async fn serve(addr: SocketAddr, ready: Ready, render: Render) -> std::io::Result<()> {
    use axum::http::StatusCode;
    use axum::routing::get;
    let app = axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = ready.clone();
                async move {
                    match ready() {
                        Ok(()) => (StatusCode::OK, "ok".to_string()),
                        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let render = render.clone();
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        render(),
                    )
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
    axum::serve(listener, app).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store holding one waiting local job, `n/a`.
    fn store_with_one_job() -> Store {
        let mut store = Store::in_memory().unwrap();
        let spec = crate::api::ManagedJobSpec {
            run: Some("true".into()),
            ..Default::default()
        };
        store
            .submit(
                &crate::lifecycle::Object {
                    uid: "u1",
                    namespace: "n",
                    name: "a",
                    generation: 1,
                    spec: &spec,
                    created_at_ms: 0,
                    resource_version: "",
                },
                None,
            )
            .unwrap();
        store
    }

    /// The build, the process and the queues are exported under the names dashboards read.
    #[test]
    fn build_process_and_queue_metrics_are_rendered() {
        let store = store_with_one_job();
        let text = Metrics::for_shard(Some("s1")).render(&store, None);
        let version = env!("CARGO_PKG_VERSION");
        let step = crate::store::schema::CURRENT_STEP;
        assert!(
            text.contains(&format!(
                "managedjobs_build_info{{shard=\"s1\",version=\"{version}\",store_schema_step=\"{step}\",api=\"managedjobs.dev/v1alpha1\"}} 1"
            )),
            "{text}"
        );
        for needle in [
            "process_cpu_seconds_total{shard=\"s1\"} ",
            "process_resident_memory_bytes{shard=\"s1\"} ",
            "process_virtual_memory_bytes{shard=\"s1\"} ",
            "process_open_fds{shard=\"s1\"} ",
            "process_max_fds{shard=\"s1\"} ",
            "process_threads{shard=\"s1\"} ",
            "process_start_time_seconds{shard=\"s1\"} ",
            "managedjobs_queue_waiting_jobs{shard=\"s1\",queue=\"default\"} 1",
            "managedjobs_queue_run_slots_in_use{shard=\"s1\",queue=\"default\"} 0",
            "managedjobs_run_slots_in_use{shard=\"s1\"} 0",
        ] {
            assert!(text.contains(needle), "no {needle:?} in\n{text}");
        }
        let rss: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes{shard=\"s1\"} "))
            .unwrap()
            .parse()
            .unwrap();
        assert!(rss > 1_000_000.0, "{rss}");
    }

    /// docs/reference/metrics.md names every metric the operator exports (each family given a
    /// series here so that it is rendered).
    #[test]
    fn every_metric_is_documented() {
        let m = Metrics::new();
        m.api_request("get");
        m.preemption("a", "b");
        m.controller_exits_total
            .get_or_create(&ReasonLabel {
                reason: "done".into(),
            })
            .inc();
        m.attempts_total
            .get_or_create(&AttemptLabels {
                action: "Succeeded".into(),
                decided_by: "default".into(),
            })
            .inc();
        m.claims
            .get_or_create(&StateLabel {
                state: "held".into(),
            })
            .set(1);
        m.watch_relists_total
            .get_or_create(&WatchLabel {
                watch: "Pod".into(),
            })
            .inc();
        let store = store_with_one_job();
        let text = m.render(&store, None);
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/reference/metrics.md"),
        )
        .unwrap();
        let mut names = 0;
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("# TYPE ") else {
                continue;
            };
            let (name, kind) = rest.split_once(' ').unwrap();
            let shown = match kind {
                "counter" => format!("`{name}_total`"),
                "info" => format!("`{name}_info`"),
                _ => format!("`{name}`"),
            };
            assert!(
                doc.contains(&shown),
                "docs/reference/metrics.md lacks {shown}"
            );
            names += 1;
        }
        assert!(names >= 30, "{names} metrics rendered:\n{text}");
    }
}
