//! The `managed-jobs` command line: `run`, `crd`, `queue`, `logs`, `smoke-test` and the internal
//! `job-controller`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use crate::api::ExecutorKind;
use crate::capacity::Overrides;
use crate::defaults;
use crate::lifecycle::JobRow;
use crate::lifecycle::now_ms;
use crate::state_dir::StateDir;
use crate::store::Store;
use crate::telemetry::LogFormat;
use crate::visibility::logs::{PodLogPiece, pod_logs};

pub mod reach;

/// Runs managed jobs on Kubernetes: admitted within launch and run caps, recovered after
/// preemption, restarted after errors, cancelled on request.
#[derive(Debug, Parser)]
#[command(name = "managed-jobs", version, long_version = long_version(), about)]
pub struct Cli {
    /// Log format.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = defaults::LOG_FORMAT,
        env = "MJ_LOG_FORMAT"
    )]
    pub log_format: LogFormat,
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// What `managed-jobs --version` prints after the name: the release, and the versions it
/// speaks (docs/upgrades.md, "Version skew"): the store's schema step it migrates to and reads,
/// and the API version of the ManagedJob it serves.
pub fn long_version() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        format!(
            "{}\nstore schema step: {}\napi: {}",
            env!("CARGO_PKG_VERSION"),
            crate::store::schema::CURRENT_STEP,
            <crate::api::ManagedJob as kube::Resource>::api_version(&())
        )
    })
}

/// Subcommands.
// Parsed once per process: the size of `run`'s flags beside the others costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the operator: watch ManagedJobs, schedule them, write status.
    Run(RunArgs),
    /// Print a CustomResourceDefinition (YAML): the ManagedJob's, or with `queue` the
    /// ManagedJobQueue's; with `--reference`, the API reference instead.
    Crd {
        /// `job` (ManagedJob, the default), `queue` (ManagedJobQueue) or `pool`
        /// (ManagedJobPool).
        #[arg(default_value = "job", value_parser = ["job", "queue", "pool"])]
        kind: String,
        /// Print the API reference of the three resources (Markdown, every field with its type,
        /// default, bounds and immutability, as committed in docs/reference/api.md) instead of
        /// a CRD.
        #[arg(long)]
        reference: bool,
    },
    /// Show the queue, like `sky jobs queue`: the jobs waiting, in admission order (with why
    /// each waits and when it may start), and the jobs holding slots, of the kubeconfig
    /// context's namespace (`-n`, `-A`), through the installed operator's visibility API, or
    /// from an operator's store (`--state-dir`; else, when the API server does not serve the
    /// visibility API, the store of an operator run by hand on this machine).
    Queue(QueueArgs),
    /// Print a job's workload log (or its job controller's log), through the installed
    /// operator's visibility API or from an operator's store, as `queue` chooses.
    Logs(LogsArgs),
    /// Create a ManagedJob, wait until it finishes, delete it: exit 0 only if it Succeeded (the
    /// chart's `helm test`).
    SmokeTest(crate::smoke_test::SmokeTestArgs),
    /// Internal: drive one job (started by the operator).
    #[command(hide = true)]
    JobController(JobControllerArgs),
    /// Internal: copy a local attempt's output from stdin into its log file, dropping and
    /// counting what the state dir cannot take (started by a job controller;
    /// `executor::output`).
    #[command(hide = true)]
    OutputSink {
        /// The log file, appended to (created when missing).
        file: PathBuf,
        /// The attempt's mark (`managedjob-output-<id>-<attempt>`), by which it is found.
        mark: String,
    },
}

/// Default state dir: `$MJ_STATE_DIR`, else `$XDG_STATE_HOME/managed-jobs`, else
/// `~/.local/state/managed-jobs`.
pub fn default_state_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_STATE_HOME") {
        return PathBuf::from(dir).join("managed-jobs");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into());
    PathBuf::from(home).join(".local/state/managed-jobs")
}

/// Flags of `managed-jobs run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Directory for the SQLite store, logs and the operator lock (a PVC in a cluster).
    #[arg(long, env = "MJ_STATE_DIR", default_value_os_t = default_state_dir())]
    pub state_dir: PathBuf,
    /// Watch ManagedJobs in this namespace only (default: all namespaces).
    #[arg(long, env = "MJ_NAMESPACE")]
    pub namespace: Option<String>,
    /// Executors to enable, comma-separated: `local`, `pod`. Default: `pod` inside a cluster
    /// (the local executor would run user code with the operator's identity), `local,pod` outside.
    #[arg(long, env = "MJ_EXECUTORS", value_delimiter = ',')]
    pub executors: Vec<String>,
    /// Override the launch cap (default: 4 x usable CPUs; ceiling 512).
    #[arg(long, env = "MJ_LAUNCH_CAP")]
    pub launch_cap: Option<usize>,
    /// Override the run cap (default: (usable memory - reserve) / per-job budget; ceiling 10000).
    #[arg(long, env = "MJ_RUN_CAP")]
    pub run_cap: Option<usize>,
    /// Per-job memory budget in MiB used to derive the run cap.
    #[arg(long, env = "MJ_JOB_MEMORY_MIB", default_value_t = defaults::JOB_MEMORY_MIB)]
    pub job_memory_mib: u64,
    /// Memory kept for the operator and the host, MiB.
    #[arg(long, env = "MJ_RESERVED_MEMORY_MIB", default_value_t = defaults::RESERVED_MEMORY_MIB)]
    pub reserved_memory_mib: u64,
    /// Sustained Kubernetes API requests per second for the operator's writes: status writes
    /// first, Events from what they leave.
    #[arg(long, env = "MJ_API_QPS", default_value_t = defaults::API_QPS)]
    pub api_qps: u32,
    /// Burst of Kubernetes API requests above the QPS.
    #[arg(long, env = "MJ_API_BURST", default_value_t = defaults::API_BURST)]
    pub api_burst: u32,
    /// ManagedJobs created per second (averaged over 2 s) at which a burst is arriving: new
    /// launches, status writes and Events are then paced (docs/design.md#pacing-under-a-burst);
    /// 0 never paces.
    #[arg(long, env = "MJ_BURST_THRESHOLD", default_value_t = defaults::BURST_THRESHOLD)]
    pub burst_threshold: u32,
    /// New jobs launched per second while a burst arrives (at least 1).
    #[arg(long, env = "MJ_BURST_LAUNCH_RATE", default_value_t = defaults::BURST_LAUNCH_RATE)]
    pub burst_launch_rate: u32,
    /// Status writes and Events per second while a burst arrives (at least 1).
    #[arg(long, env = "MJ_BURST_API_QPS", default_value_t = defaults::BURST_API_QPS)]
    pub burst_api_qps: u32,
    /// Longest one burst is paced, seconds (0 never paces).
    #[arg(long, env = "MJ_BURST_HOLD_SECONDS", default_value_t = defaults::BURST_HOLD_SECONDS)]
    pub burst_hold_seconds: u64,
    /// Seconds between SIGTERM and SIGKILL when stopping a workload.
    #[arg(long, env = "MJ_CANCEL_GRACE_SECONDS", default_value_t = defaults::CANCEL_GRACE_SECONDS)]
    pub cancel_grace_seconds: f64,
    /// First back-off before a restart after an error, seconds; doubles per restart (max 300).
    #[arg(long, env = "MJ_RESTART_BACKOFF_SECONDS", default_value_t = defaults::RESTART_BACKOFF_SECONDS)]
    pub restart_backoff_seconds: f64,
    /// Job controller exits before the job is done that end it as FailedController.
    #[arg(long, env = "MJ_MAX_CONTROLLER_CRASHES", default_value_t = defaults::MAX_CONTROLLER_CRASHES)]
    pub max_controller_crashes: i64,
    /// Seconds a launched workload may take to start running (a Pod pulling its image, waiting
    /// for a volume, running init containers) before it is removed and the job requeued with
    /// back-off; a job's `spec.launchTimeoutSeconds` overrides it.
    #[arg(long, env = "MJ_LAUNCH_TIMEOUT_SECONDS", default_value_t = defaults::LAUNCH_TIMEOUT_SECONDS)]
    pub launch_timeout_seconds: f64,
    /// Launch timeouts in a row after which a job ends FailedNoResource.
    #[arg(long, env = "MJ_MAX_LAUNCH_TIMEOUTS", default_value_t = defaults::MAX_LAUNCH_TIMEOUTS)]
    pub max_launch_timeouts: i32,
    /// Seconds the node of a running Pod may stay not Ready (its Ready condition False or
    /// Unknown) before the Pod's attempt is lost and recovered (one recovery for a whole
    /// gang); a deleted node loses it at once. Needs get, list and watch on nodes.
    #[arg(long, env = "MJ_NODE_LOST_GRACE_SECONDS", default_value_t = defaults::NODE_LOST_GRACE_SECONDS)]
    pub node_lost_grace_seconds: f64,
    /// Serve Prometheus `/metrics`, `/healthz` and `/readyz` on this address (`none` to disable).
    #[arg(long, env = "MJ_METRICS_ADDR", default_value = defaults::METRICS_ADDR)]
    pub metrics_addr: String,
    /// Hold a Lease before acting, so a second replica only stands by.
    #[arg(long, env = "MJ_LEADER_ELECTION")]
    pub leader_election: bool,
    /// Namespace of the leader-election Lease (default: `$POD_NAMESPACE`, else the watched
    /// `--namespace`, else `default`).
    #[arg(long, env = "MJ_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// Lease duration in seconds, of the leader-election Lease and of the claims on namespaces
    /// (one owner per job): a dead leader, or a dead owner of a namespace's jobs, is replaced
    /// within about it.
    #[arg(long, env = "MJ_LEASE_DURATION_SECONDS", default_value_t = defaults::LEASE_DURATION_SECONDS)]
    pub lease_duration_seconds: u64,
    /// Own only the ManagedJobs labelled `managedjobs.dev/shard=NAME` (and their Pods), with a
    /// Lease, caps and state dir of its own; without it the operator owns the jobs without
    /// that label. Run one instance per shard to spread jobs over several controller nodes.
    #[arg(long, env = "MJ_SHARD")]
    pub shard: Option<String>,
    /// Place a multi-node job's Pods with kube-scheduler's gang scheduling: `auto` creates a
    /// PodGroup with the gang policy for each attempt where the API serves
    /// `scheduling.k8s.io/v1alpha2` PodGroups (feature gate `GenericWorkload`), so no Pod binds
    /// until all fit; `off` never does (a partly placed gang is then removed after its launch
    /// timeout).
    #[arg(long, env = "MJ_GANG_SCHEDULING", default_value = "auto", value_parser = ["auto", "off"])]
    pub gang_scheduling: String,
    /// Bytes of the end of each container's log that a pod job's controller keeps in the state
    /// dir per attempt (every rank's and task's Pod, init containers too), once the attempt
    /// ended or before it stops its Pods, so that `managed-jobs logs` shows it after the Pod is
    /// gone; kept as long as the job's record. 0 keeps none.
    #[arg(long, env = "MJ_KEPT_LOG_BYTES", default_value_t = defaults::KEPT_LOG_BYTES)]
    pub kept_log_bytes: u64,
    /// Publish Kubernetes Events on each ManagedJob's transitions.
    #[arg(long, env = "MJ_EVENTS", default_value_t = true, action = clap::ArgAction::Set)]
    pub events: bool,
    /// Serve the visibility API and dashboard (HTTPS) on this address, e.g. `0.0.0.0:8443`
    /// (`none`: not served). Each answer shows only what the caller's Kubernetes identity may
    /// list (docs/tasks/visibility.md).
    #[arg(long, env = "MJ_VISIBILITY_ADDR", default_value = "none")]
    pub visibility_addr: String,
    /// The visibility API's certificate chain (PEM); without it and the key, a self-signed
    /// certificate is made at start.
    #[arg(
        long,
        env = "MJ_VISIBILITY_TLS_CERT_FILE",
        requires = "visibility_tls_key_file"
    )]
    pub visibility_tls_cert_file: Option<PathBuf>,
    /// The visibility API's private key (PEM).
    #[arg(
        long,
        env = "MJ_VISIBILITY_TLS_KEY_FILE",
        requires = "visibility_tls_cert_file"
    )]
    pub visibility_tls_key_file: Option<PathBuf>,
}

/// Flags of `managed-jobs queue`.
///
/// Where it reads from (`cli::reach`): with `--state-dir DIR` (or `MJ_STATE_DIR`), that
/// operator's store; else, when the API server's discovery lists the visibility API (the
/// chart's APIService), that API through the API server with the caller's kubeconfig (no
/// exec into the operator), which shows only the namespaces the caller may list ManagedJobs
/// in; else the store in the default state dir of an operator run by hand on this machine,
/// saying so on stderr. Either way the answer is the same `JobQueue`: the waiting jobs in
/// admission order with why each waits and when it may start, and the jobs holding slots.
#[derive(Debug, clap::Args)]
pub struct QueueArgs {
    /// Read this operator's state dir instead of asking the API (every namespace unless
    /// `-n`).
    #[arg(long, env = "MJ_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// From a store: print its table of every job, finished ones too.
    #[arg(long, short)]
    pub all: bool,
    /// From a store: print its table of jobs with one line per task of each pipeline.
    #[arg(long)]
    pub tasks: bool,
    /// Read every shard's jobs through the Kubernetes API (KUBECONFIG) instead of one
    /// operator's store: per shard, its slots in use and its jobs, as their status shows them.
    #[arg(long)]
    pub all_shards: bool,
    /// The namespace (default: the kubeconfig context's, `default` when it names none; with
    /// `--state-dir` or `--all-shards`: all).
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Every namespace the caller may list ManagedJobs in.
    #[arg(long, short = 'A', conflicts_with = "namespace")]
    pub all_namespaces: bool,
    /// Only this ManagedJobQueue's jobs.
    #[arg(long)]
    pub queue: Option<String>,
    /// At most this many waiting jobs (the first in admission order).
    #[arg(long)]
    pub limit: Option<usize>,
    /// `table` (the default) or `json` (the API's `JobQueue` as it came).
    #[arg(long, short = 'o', default_value = "table", value_parser = ["table", "json"])]
    pub output: String,
}

/// Flags of `managed-jobs logs`.
#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    /// The job: `NAME` (in `-n NS`, else the kubeconfig context's namespace, else `default`,
    /// as kubectl), `NAMESPACE/NAME`, or a store's job id (`status.jobId`, with a store only).
    pub job: String,
    /// The namespace of a job given by `NAME` (default: the kubeconfig context's).
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Print the job controller process's log instead of the workload's.
    #[arg(long)]
    pub controller: bool,
    /// A pipeline's task (its name, or its index from 0): print only that task's output. A
    /// pipeline's log without it holds every task's output, in order, each under a header.
    #[arg(long)]
    pub task: Option<String>,
    /// A multi-node job's member (0..N-1): its Pod's log. Without it, every rank's.
    #[arg(long)]
    pub rank: Option<u32>,
    /// A pod job's attempt (counted over the whole job, as `status.attempt` and
    /// `status.attempts[].attempt`): the log kept of it. Without it, the latest attempt's (of
    /// each task of a pipeline).
    #[arg(long)]
    pub attempt: Option<i32>,
    /// Read this operator's state dir instead of asking the API (needed for job ids).
    /// Without it, the installed operator's visibility API is asked through the API server
    /// with the caller's kubeconfig, as the caller; where the API server does not serve it,
    /// the store of an operator run by hand on this machine is read, saying so.
    #[arg(long, env = "MJ_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
}

/// Flags of the internal `job-controller` (`--job-id N` always last: liveness checks read it).
#[derive(Debug, clap::Args)]
pub struct JobControllerArgs {
    /// State dir of the operator.
    #[arg(long)]
    pub state_dir: PathBuf,
    /// A file descriptor to read until end of file before acting on the job: the operator
    /// opens this start gate once it has recorded the process's start (or it died).
    #[arg(long)]
    pub start_gate_fd: Option<i32>,
    /// The job to drive.
    #[arg(long)]
    pub job_id: i64,
}

impl RunArgs {
    /// The executors to enable, defaulting by environment (in a cluster or not).
    pub fn executors(&self) -> anyhow::Result<Vec<ExecutorKind>> {
        if self.executors.is_empty() {
            let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
            return Ok(defaults::executors(in_cluster));
        }
        self.executors
            .iter()
            .map(|e| {
                ExecutorKind::parse(e.trim())
                    .with_context(|| format!("unknown executor {e:?}: expected local or pod"))
            })
            .collect()
    }

    /// The shard (`--shard`), checked: a label value that is a DNS label.
    pub fn shard(&self) -> anyhow::Result<Option<String>> {
        match self.shard.as_deref() {
            None => Ok(None),
            Some("") => anyhow::bail!(
                "--shard is empty (MJ_SHARD set to nothing?): omit it for the default instance"
            ),
            Some(name) if crate::api::is_dns_label(name) => Ok(Some(name.to_string())),
            Some(name) => anyhow::bail!(
                "--shard {name:?} is not a DNS label (lowercase letters, digits and '-', at most 63)"
            ),
        }
    }

    /// The metrics address, or None for `none`.
    pub fn metrics_addr(&self) -> anyhow::Result<Option<std::net::SocketAddr>> {
        if self.metrics_addr == "none" {
            return Ok(None);
        }
        Ok(Some(self.metrics_addr.parse().with_context(|| {
            format!("--metrics-addr {:?} is not host:port", self.metrics_addr)
        })?))
    }

    /// Leader election settings, when switched on: the replicas of one operator (same shard,
    /// same watched namespace) share one Lease, so that one acts and the others stand by. Its
    /// namespace: `--leader-election-namespace`, else `$POD_NAMESPACE` (in a cluster: the
    /// release's), else the watched namespace (`--namespace`), else `default`. Its name:
    /// `managed-jobs` (`managed-jobs-<shard>` for a shard), with `-for-<namespace>` when the
    /// operator watches one namespace other than the Lease's: operators of different
    /// namespaces never stand by for each other. (Which jobs each acts on is its claims':
    /// `docs/design.md#one-owner-per-job`.)
    pub fn leader_election(&self) -> Option<crate::operator::LeaderElection> {
        if !self.leader_election {
            return None;
        }
        let namespace = self
            .leader_election_namespace
            .clone()
            .or_else(|| {
                std::env::var("POD_NAMESPACE")
                    .ok()
                    .filter(|n| !n.is_empty())
            })
            .or_else(|| self.namespace.clone())
            .unwrap_or_else(|| "default".into());
        let mut lease_name = match self.shard.as_deref() {
            Some(shard) => format!("managed-jobs-{shard}"),
            None => "managed-jobs".into(),
        };
        if let Some(watched) = &self.namespace
            && *watched != namespace
        {
            lease_name.push_str(&format!("-for-{watched}"));
        }
        Some(crate::operator::LeaderElection {
            namespace,
            lease_name,
            identity: std::env::var("POD_NAME").unwrap_or_else(|_| {
                format!(
                    "{}-{}",
                    std::fs::read_to_string("/proc/sys/kernel/hostname")
                        .unwrap_or_default()
                        .trim(),
                    std::process::id()
                )
            }),
            duration_seconds: self.lease_duration_seconds.max(2),
        })
    }

    /// The visibility API's settings, or None for `--visibility-addr none`.
    pub fn visibility(&self) -> anyhow::Result<Option<crate::visibility::Options>> {
        if self.visibility_addr == "none" {
            return Ok(None);
        }
        Ok(Some(crate::visibility::Options {
            addr: self.visibility_addr.parse().with_context(|| {
                format!(
                    "--visibility-addr {:?} is not host:port (or none)",
                    self.visibility_addr
                )
            })?,
            cert_file: self.visibility_tls_cert_file.clone(),
            key_file: self.visibility_tls_key_file.clone(),
        }))
    }

    /// Cap overrides from the flags.
    pub fn overrides(&self) -> Overrides {
        Overrides {
            launch_cap: self.launch_cap,
            run_cap: self.run_cap,
            job_memory_mib: Some(self.job_memory_mib),
            reserved_memory_mib: Some(self.reserved_memory_mib),
        }
    }
}

fn open_existing(state_dir: &Path) -> anyhow::Result<Store> {
    let path = StateDir::new(state_dir).store();
    anyhow::ensure!(
        path.exists(),
        "no store at {} (is the operator's --state-dir elsewhere?)",
        path.display()
    );
    // Read as it is, never migrated: only the operator of this release migrates its store.
    Ok(Store::open_current(&path, 1024)?)
}

fn human_duration(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        _ => format!("{}h{}m", s / 3600, (s % 3600) / 60),
    }
}

/// Renders the store's table of jobs of `scope` (and of ManagedJobQueue `queue` only, when
/// given): those not finished (`all`: every one); `tasks` adds a line per task of each
/// pipeline. The caps and the slots in use are the operator's, over every namespace.
pub fn queue_table(
    store: &Store,
    all: bool,
    tasks: bool,
    scope: &reach::Scope,
    queue: Option<&str>,
) -> anyhow::Result<String> {
    let usage = store.slot_usage()?;
    let settings = store.settings()?;
    let caps = match settings.caps {
        Some(c) => format!("launch={},run={}", c.launch, c.run),
        None => "unknown".into(),
    };
    let mut out = format!(
        "caps: {caps}; in use: launching {}, alive {}; queued {}\n",
        usage.launching, usage.alive, usage.waiting
    );
    if let Some(how) = &settings.capacity {
        out.push_str(&format!("({how})\n"));
    }
    out.push_str(&format!(
        "{:>6}  {:<40} {:<16} {:<12} {:<16} {:>4} {:>4}  {:<20} {:>8}  {}\n",
        "ID",
        "NAMESPACE/NAME",
        "PHASE",
        "SCHEDULE",
        "TASK",
        "REC",
        "RST",
        "SUBMITTED",
        "DURATION",
        "MESSAGE"
    ));
    let now = now_ms();
    let rows: Vec<JobRow> = store
        .all()?
        .into_iter()
        .filter(|r| all || !r.phase.is_terminal())
        .filter(|r| match scope {
            reach::Scope::All => true,
            reach::Scope::Namespace(ns) => r.namespace == *ns,
        })
        .filter(|r| queue.is_none_or(|q| r.queue == q))
        .collect();
    for r in rows {
        let submitted = jiff::Timestamp::from_millisecond(r.submitted_at_ms)
            .map(|t| t.strftime("%Y-%m-%d %H:%M:%S").to_string())
            .unwrap_or_default();
        let duration = r
            .started_at_ms
            .map(|s| human_duration(r.finished_at_ms.unwrap_or(now) - s))
            .unwrap_or_else(|| "-".into());
        let shown = crate::lifecycle::tasks::shown(&r);
        let (restarts, recoveries) = (shown.restarts, shown.recoveries);
        out.push_str(&format!(
            "{:>6}  {:<40} {:<16} {:<12} {:<16} {:>4} {:>4}  {:<20} {:>8}  {}\n",
            r.id,
            r.key(),
            r.phase.as_str(),
            r.schedule_state.as_str(),
            crate::lifecycle::tasks::progress(&r).unwrap_or_else(|| "-".into()),
            recoveries,
            restarts,
            submitted,
            duration,
            r.message
        ));
        if tasks {
            for (i, t) in r.tasks.iter().enumerate() {
                let duration = match (&t.started_at, &t.finished_at) {
                    (Some(s), f) => human_duration(
                        f.as_ref().map_or(now, |f| f.0.as_millisecond()) - s.0.as_millisecond(),
                    ),
                    _ => "-".into(),
                };
                out.push_str(&format!(
                    "{:>6}  {:<40} {:<16} {:<12} {:<16} {:>4} {:>4}  {:<20} {:>8}  {}\n",
                    "",
                    format!("  {}/{} {}", i + 1, r.tasks.len(), t.name),
                    format!("{:?}", t.phase),
                    "",
                    format!("attempt {}", t.attempt),
                    t.recovery_count,
                    t.restart_count,
                    "",
                    duration,
                    t.message.as_deref().unwrap_or("")
                ));
            }
        }
    }
    Ok(out)
}

/// The `queue --all-shards` table from the objects' status: per shard (the
/// `managedjobs.dev/shard` label; `-` for the default instance), the slots its jobs hold and
/// their queue, then its jobs (finished ones with `all`), ordered by shard and job id.
pub fn shards_table(jobs: &[crate::api::ManagedJob], all: bool) -> String {
    use crate::api::{LABEL_SHARD, ScheduleState};
    use kube::ResourceExt as _;
    let mut by_shard: std::collections::BTreeMap<String, Vec<&crate::api::ManagedJob>> =
        Default::default();
    for mj in jobs {
        let shard = mj
            .labels()
            .get(LABEL_SHARD)
            .cloned()
            .unwrap_or_else(|| "-".into());
        by_shard.entry(shard).or_default().push(mj);
    }
    let mut out = String::new();
    for (shard, jobs) in &mut by_shard {
        let state = |mj: &crate::api::ManagedJob| mj.status.as_ref().and_then(|s| s.schedule_state);
        let count =
            |f: &dyn Fn(Option<ScheduleState>) -> bool| jobs.iter().filter(|j| f(state(j))).count();
        let owner = if shard == "-" {
            "the default shard".to_string()
        } else {
            format!("shard {shard}")
        };
        // A job no operator has written yet: just created, or its shard has no operator.
        let suspended = jobs
            .iter()
            .filter(|j| {
                j.status.as_ref().and_then(|s| s.phase) == Some(crate::api::JobPhase::Suspended)
            })
            .count();
        out.push_str(&format!(
            "{owner}: {} jobs; launching {}, alive {}; queued {}; suspended {suspended}; finished {}; no status yet {}\n",
            jobs.len(),
            count(&|s| s == Some(ScheduleState::Launching)),
            count(&|s| s.is_some_and(|s| s.holds_run_slot())),
            count(&|s| matches!(s, Some(ScheduleState::Inactive | ScheduleState::Waiting)))
                - suspended,
            count(&|s| s == Some(ScheduleState::Done)),
            count(&|s| s.is_none()),
        ));
        out.push_str(&format!(
            "  {:>6}  {:<40} {:<16} {:<12} {:<16} {}\n",
            "ID", "NAMESPACE/NAME", "PHASE", "SCHEDULE", "TASK", "MESSAGE"
        ));
        jobs.sort_by_key(|j| j.status.as_ref().and_then(|s| s.job_id).unwrap_or(i64::MAX));
        for mj in jobs.iter() {
            let s = mj.status.clone().unwrap_or_default();
            if !all && s.phase.is_some_and(|p| p.is_terminal()) {
                continue;
            }
            out.push_str(&format!(
                "  {:>6}  {:<40} {:<16} {:<12} {:<16} {}\n",
                s.job_id.map_or("-".into(), |id| id.to_string()),
                format!("{}/{}", mj.namespace().unwrap_or_default(), mj.name_any()),
                s.phase.map_or("-", |p| p.as_str()),
                s.schedule_state.map_or("-", |p| p.as_str()),
                s.task_progress.as_deref().unwrap_or("-"),
                s.message.as_deref().unwrap_or("")
            ));
        }
    }
    out
}

/// `managed-jobs queue --all-shards`: every shard's jobs through the API.
async fn queue_all_shards(args: &QueueArgs) -> anyhow::Result<()> {
    let client = kube::Client::try_default()
        .await
        .context("--all-shards reads the Kubernetes API (KUBECONFIG)")?;
    let api: kube::Api<crate::api::ManagedJob> = match &args.namespace {
        Some(ns) => kube::Api::namespaced(client, ns),
        None => kube::Api::all(client),
    };
    let jobs = api.list(&Default::default()).await?.items;
    print!("{}", shards_table(&jobs, args.all));
    Ok(())
}

/// What the command line knows of the cluster before it reads anything: a client for the
/// API server (None without a kubeconfig or in-cluster configuration), the kubeconfig
/// context's namespace, and what discovery says of the visibility API.
struct Cluster {
    client: Option<kube::Client>,
    context: Option<String>,
    discovery: reach::Discovery,
}

/// How long discovery may take before the API server counts as unreachable: a kubeconfig
/// naming a cluster that is down must not hold the command for kube's 30 s connect timeout.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(10);

impl Cluster {
    /// Reads the kubeconfig (`KUBECONFIG`, `~/.kube/config`, or in-cluster configuration)
    /// and, with `discover`, asks the API server's discovery whether it serves the
    /// visibility API ([`reach::served`]). Never fails: what is missing is in `discovery`.
    async fn find(discover: bool) -> Cluster {
        use reach::Discovery;
        let config = match kube::Config::infer().await {
            Ok(c) => c,
            Err(e) => {
                return Cluster {
                    client: None,
                    context: None,
                    discovery: Discovery::NoApiServer(format!("no kubeconfig: {e}")),
                };
            }
        };
        let context = Some(config.default_namespace.clone());
        let client = match kube::Client::try_from(config) {
            Ok(c) => c,
            Err(e) => {
                return Cluster {
                    client: None,
                    context,
                    discovery: Discovery::NoApiServer(format!("the kubeconfig: {e}")),
                };
            }
        };
        let discovery = if !discover {
            Discovery::NoApiServer("not asked: --state-dir names the store".into())
        } else {
            match tokio::time::timeout(DISCOVERY_TIMEOUT, client.list_api_groups()).await {
                Ok(Ok(groups))
                    if reach::served(
                        &groups,
                        crate::visibility::GROUP,
                        crate::visibility::VERSION,
                    ) =>
                {
                    Discovery::Served
                }
                Ok(Ok(_)) => Discovery::NotServed,
                Ok(Err(e)) => {
                    Discovery::NoApiServer(format!("its discovery (GET /apis) failed: {e}"))
                }
                Err(_) => Discovery::NoApiServer(format!(
                    "its discovery (GET /apis) did not answer within {} s",
                    DISCOVERY_TIMEOUT.as_secs()
                )),
            }
        };
        Cluster {
            client: Some(client),
            context,
            discovery,
        }
    }

    /// Where to read from ([`reach::choose`]): `state_dir`, the visibility API, or the
    /// default state dir of an operator run by hand here (its note printed on stderr).
    fn source(&self, state_dir: Option<&Path>) -> anyhow::Result<reach::Source> {
        let here = default_state_dir();
        let has_store = StateDir::new(&here).store().exists();
        let source = reach::choose(
            state_dir.map(Path::to_path_buf),
            &self.discovery,
            here,
            has_store,
        )
        .map_err(anyhow::Error::msg)?;
        if let reach::Source::Store { note: Some(n), .. } = &source {
            eprintln!("{n}");
        }
        Ok(source)
    }

    /// The client, which [`reach::Source::Api`] implies.
    fn client(&self) -> anyhow::Result<kube::Client> {
        self.client
            .clone()
            .context("no API server to ask (no kubeconfig)")
    }
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// `managed-jobs queue`: the visibility API's `JobQueue` of the namespaces [`reach::scope`]
/// names, through the API server or computed from an operator's store by the same code
/// ([`crate::visibility::queue_from_store`]), as a table or as JSON; from a store, `--all`
/// and `--tasks` print its table of every job instead ([`queue_table`]).
pub fn queue(args: &QueueArgs) -> anyhow::Result<()> {
    let rt = runtime()?;
    if args.all_shards {
        return rt.block_on(queue_all_shards(args));
    }
    rt.block_on(async {
        let cluster = Cluster::find(args.state_dir.is_none()).await;
        let source = cluster.source(args.state_dir.as_deref())?;
        let scope = reach::scope(
            args.namespace.as_deref(),
            args.all_namespaces,
            args.state_dir.is_some(),
            cluster.context.as_deref(),
        );
        match source {
            reach::Source::Api => {
                anyhow::ensure!(
                    !args.all && !args.tasks,
                    "--all and --tasks print an operator's table of every job, finished ones too, from its store: \
                     give --state-dir DIR (the visibility API shows the jobs that wait and hold slots)"
                );
                queue_through_api(&cluster.client()?, &scope, args).await
            }
            reach::Source::Store { dir, .. } => {
                queue_in_store(&dir, &scope, args, cluster.client.as_ref()).await
            }
        }
    })
}

/// `managed-jobs queue` from the store in `dir`: the `JobQueue` the visibility API would
/// answer a caller of every namespace, cut to `scope` (or, with `--all`/`--tasks`, the
/// store's table of jobs).
async fn queue_in_store(
    dir: &Path,
    scope: &reach::Scope,
    args: &QueueArgs,
    client: Option<&kube::Client>,
) -> anyhow::Result<()> {
    let mut store = open_existing(dir)?;
    if args.all || args.tasks {
        anyhow::ensure!(
            args.output == "table" && args.limit.is_none(),
            "--all and --tasks print the store's table of jobs; -o json and --limit are the queue's (without --all and --tasks)"
        );
        print!(
            "{}",
            queue_table(&store, args.all, args.tasks, scope, args.queue.as_deref())?
        );
        return Ok(());
    }
    let queues = queues_in_force(client).await;
    let all = crate::visibility::queue_from_store(&mut store, &queues)?;
    let visible = match scope {
        reach::Scope::All => None,
        reach::Scope::Namespace(ns) => Some(std::collections::BTreeSet::from([ns.clone()])),
    };
    let shown = crate::visibility::view::restrict(
        &all,
        visible.as_ref(),
        args.queue.as_deref(),
        args.limit,
    );
    if args.output == "json" {
        println!("{}", serde_json::to_string(&shown)?);
    } else {
        print!("{}", render_job_queue(&shown, now_ms()));
    }
    Ok(())
}

/// The ManagedJobQueues in force, as the operator resolves them against the namespaces'
/// labels, listed with `client`; without a client, or when they cannot be listed, one pool
/// (what an operator without queue objects does), said on stderr: the reasons and the order
/// then assume no ManagedJobQueue.
async fn queues_in_force(client: Option<&kube::Client>) -> crate::queues::Queues {
    use crate::queues::Queues;
    let Some(client) = client else {
        return Queues::single_pool();
    };
    let listed = async {
        let objects = kube::Api::<crate::api::ManagedJobQueue>::all(client.clone())
            .list(&Default::default())
            .await?
            .items;
        if objects.is_empty() {
            return Ok::<_, kube::Error>(Queues::single_pool());
        }
        let namespaces = kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter_map(|n| Some((n.metadata.name?, n.metadata.labels.unwrap_or_default())))
            .collect();
        Ok(Queues::resolve(&objects, &namespaces, &[]))
    };
    match tokio::time::timeout(DISCOVERY_TIMEOUT, listed).await {
        Ok(Ok(queues)) => queues,
        Ok(Err(e)) => {
            eprintln!(
                "note: the ManagedJobQueues and namespaces could not be listed ({e}): the reasons and the order assume no ManagedJobQueue"
            );
            Queues::single_pool()
        }
        Err(_) => {
            eprintln!(
                "note: listing the ManagedJobQueues took over {} s: the reasons and the order assume no ManagedJobQueue",
                DISCOVERY_TIMEOUT.as_secs()
            );
            Queues::single_pool()
        }
    }
}

/// What a visibility API request's failure means to a user: unavailable (the operator not
/// running: 503), refused (401/403, the operator's own sentence), or other. Whether the API
/// is served at all was decided before, from discovery ([`reach::served`]).
pub fn visibility_error(e: kube::Error) -> anyhow::Error {
    match e {
        kube::Error::Api(s) if s.code == 503 => anyhow::anyhow!(
            "the visibility API is unavailable (is the operator running and Ready?): {}",
            s.message
        ),
        kube::Error::Api(s) => anyhow::anyhow!("{} ({})", s.message, s.reason),
        e => anyhow::Error::new(e).context("asking the visibility API"),
    }
}

/// `managed-jobs queue` through the API server: the visibility API's `JobQueue` of `scope`.
async fn queue_through_api(
    client: &kube::Client,
    scope: &reach::Scope,
    args: &QueueArgs,
) -> anyhow::Result<()> {
    let path = match scope {
        reach::Scope::All => format!("{}/queue", crate::visibility::PREFIX),
        reach::Scope::Namespace(ns) => {
            format!("{}/namespaces/{ns}/queue", crate::visibility::PREFIX)
        }
    };
    let mut query = Vec::new();
    if let Some(q) = &args.queue {
        query.push(format!("queue={q}"));
    }
    if let Some(n) = args.limit {
        query.push(format!("limit={n}"));
    }
    let uri = if query.is_empty() {
        path
    } else {
        format!("{path}?{}", query.join("&"))
    };
    let text = client
        .request_text(http::Request::get(uri).body(Vec::new())?)
        .await
        .map_err(visibility_error)?;
    if args.output == "json" {
        println!("{text}");
        return Ok(());
    }
    let q: crate::visibility::view::JobQueue =
        serde_json::from_str(&text).context("the visibility API's answer")?;
    print!("{}", render_job_queue(&q, now_ms()));
    Ok(())
}

/// The `queue` table of a visibility API answer at `now` (ms since epoch): a summary line per
/// namespace, then the waiting jobs in admission order (position, reason, estimated start)
/// and the jobs holding slots.
pub fn render_job_queue(q: &crate::visibility::view::JobQueue, now: i64) -> String {
    let since = |t: &str| {
        t.parse::<jiff::Timestamp>()
            .map(|t| human_duration(now - t.as_millisecond()))
            .unwrap_or_else(|_| "-".into())
    };
    let mut out = String::new();
    // An answer that shows no namespace has no caps: it is empty.
    if let Some(caps) = &q.caps {
        out.push_str(&format!(
            "caps: launch={},run={}{}",
            caps.launch,
            caps.run,
            match &caps.binding {
                Some(b) => format!(" ({b} binds: new jobs wait)"),
                None => String::new(),
            }
        ));
        if let Some(u) = &q.usage {
            out.push_str(&format!(
                "; in use: launching {}, alive {}; queued {}",
                u.launching, u.holding_run_slots, u.waiting
            ));
        }
        out.push('\n');
    }
    for c in &q.counts {
        out.push_str(&format!(
            "namespace {}: waiting {}, launching {}, holding run slots {}, suspended {}\n",
            c.namespace, c.waiting, c.launching, c.holding_run_slots, c.inactive
        ));
    }
    if !q.quotas.is_empty() {
        out.push_str(&format!(
            "\n{:<24} {:<20} {:<20} {:>10} {:>10} {:>10} {:>10}\n",
            "QUEUE", "POOL", "RESOURCE", "NOMINAL", "USED", "BORROWED", "LENT"
        ));
        for quota in &q.quotas {
            for pool in &quota.pools {
                for r in &pool.resources {
                    out.push_str(&format!(
                        "{:<24} {:<20} {:<20} {:>10} {:>10} {:>10} {:>10}\n",
                        quota.queue,
                        pool.name,
                        r.name,
                        r.nominal.0,
                        r.used.0,
                        r.borrowed.0,
                        r.lent.0
                    ));
                }
            }
        }
    }
    if !q.waiting.is_empty() {
        out.push_str(&format!(
            "\n{:>5}  {:<40} {:<12} {:>5}  {:<20} {:<16} {:>8}  {}\n",
            "POS", "NAMESPACE/NAME", "QUEUE", "PRIO", "REASON", "EST. START", "WAITING", "MESSAGE"
        ));
        for j in &q.waiting {
            let est = match j.estimated_start.in_seconds {
                Some(s) if s <= 0.0 => "next pass".to_string(),
                Some(s) => format!("~{}", human_duration((s * 1000.0) as i64)),
                None => "unknown".to_string(),
            };
            out.push_str(&format!(
                "{:>5}  {:<40} {:<12} {:>5}  {:<20} {:<16} {:>8}  {}\n",
                j.position,
                format!("{}/{}", j.namespace, j.name),
                j.queue,
                j.priority,
                j.reason,
                est,
                since(&j.waiting_since),
                j.message
            ));
        }
        if q.waiting_total > q.waiting.len() {
            out.push_str(&format!(
                "  ... and {} more waiting\n",
                q.waiting_total - q.waiting.len()
            ));
        }
    }
    if !q.live.is_empty() {
        out.push_str(&format!(
            "\n{:>6}  {:<40} {:<12} {:<12} {:<12} {:>7}  {:<28} {:>8}  {}\n",
            "ID",
            "NAMESPACE/NAME",
            "QUEUE",
            "PHASE",
            "SCHEDULE",
            "ATTEMPT",
            "WORKLOAD",
            "RUNNING",
            "MESSAGE"
        ));
        for j in &q.live {
            out.push_str(&format!(
                "{:>6}  {:<40} {:<12} {:<12} {:<12} {:>7}  {:<28} {:>8}  {}\n",
                j.job_id,
                format!("{}/{}", j.namespace, j.name),
                j.queue,
                j.phase,
                j.schedule_state,
                j.attempt,
                j.workload.as_deref().unwrap_or("-"),
                j.started_at.as_deref().map_or("-".into(), since),
                j.message
            ));
        }
    }
    for j in &q.inactive {
        out.push_str(&format!(
            "suspended: {}/{} ({}): {}\n",
            j.namespace, j.name, j.phase, j.message
        ));
    }
    if q.waiting.is_empty() && q.live.is_empty() && q.inactive.is_empty() {
        out.push_str("no job waits or runs\n");
    }
    out
}

/// `managed-jobs logs`: the job [`reach::job_ref`] names, read from the source
/// [`reach::choose`] picks: its logs through the visibility API as the caller, or from an
/// operator's store.
pub fn logs(args: &LogsArgs) -> anyhow::Result<()> {
    let (source, job) = runtime()?.block_on(async {
        let cluster = Cluster::find(args.state_dir.is_none()).await;
        let job = reach::job_ref(
            &args.job,
            args.namespace.as_deref(),
            cluster.context.as_deref(),
        )
        .map_err(anyhow::Error::msg)?;
        let source = cluster.source(args.state_dir.as_deref())?;
        if source == reach::Source::Api {
            logs_through_api(&cluster.client()?, &job, args).await?;
        }
        anyhow::Ok((source, job))
    })?;
    let reach::Source::Store { dir, .. } = source else {
        return Ok(());
    };
    logs_in_store(&dir, &job, args)
}

/// `managed-jobs logs` from the operator's store in `state_dir`.
fn logs_in_store(state_dir: &Path, job: &reach::JobRef, args: &LogsArgs) -> anyhow::Result<()> {
    let store = open_existing(state_dir)?;
    let row = match job {
        reach::JobRef::Id(id) => store.get(*id)?,
        reach::JobRef::Name { namespace, name } => store
            .find_by_name(namespace, name)?
            .into_iter()
            .max_by_key(|r| r.id)
            .with_context(|| {
                format!(
                    "no job {namespace}/{name} in the store at {}",
                    state_dir.display()
                )
            })?,
    };
    let dir = StateDir::new(state_dir);
    use std::io::Write as _;
    if args.controller {
        let path = dir.controller_log(row.id);
        let text = std::fs::read(&path)
            .with_context(|| format!("job {} has no log at {} yet", row.id, path.display()))?;
        std::io::stdout().write_all(&text)?;
        return Ok(());
    }
    let task = match &args.task {
        None => None,
        Some(_) if !row.spec.is_pipeline() => {
            anyhow::bail!("job {} is not a pipeline (it has no spec.tasks)", row.key())
        }
        Some(t) => Some(task_index(&row, t)?),
    };
    if let Some(rank) = args.rank {
        let nodes = match task {
            Some(i) => row.spec.task(i).nodes,
            None => crate::lifecycle::tasks::current_task(&row).nodes,
        };
        match nodes {
            None => anyhow::bail!(
                "job {} is not a multi-node job (it has no nodes): --rank needs one",
                row.key()
            ),
            Some(n) if rank >= n.max(1) as u32 => anyhow::bail!(
                "job {} has ranks 0..{} (nodes: {n}): there is no rank {rank}",
                row.key(),
                n - 1
            ),
            Some(_) => {}
        }
    }
    if row.executor.facts().api_objects {
        return print_pod_logs(&store, &dir, &row, task, args);
    }
    anyhow::ensure!(
        args.attempt.is_none(),
        "job {} is a local job: its log holds every attempt's output, in order (--attempt is for pod jobs)",
        row.key()
    );
    if !row.spec.is_pipeline() {
        let path = dir.workload_log(row.id);
        let text = std::fs::read(&path)
            .with_context(|| format!("job {} has no log at {} yet", row.id, path.display()))?;
        std::io::stdout().write_all(&text)?;
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    for (i, t) in row.spec.tasks.iter().enumerate() {
        if task.is_some_and(|k| k != i) {
            continue;
        }
        let text = std::fs::read(dir.task_log(row.id, i)).ok();
        if task.is_some() {
            match text {
                Some(text) => out.write_all(&text)?,
                None => anyhow::bail!(
                    "task {} of job {} has no log yet (it has not run)",
                    t.name,
                    row.key()
                ),
            }
        } else if let Some(text) = text {
            writeln!(
                out,
                "==> task {}/{} {} <==",
                i + 1,
                row.spec.tasks.len(),
                t.name
            )?;
            out.write_all(&text)?;
        }
    }
    Ok(())
}

/// `managed-jobs logs` through the API server: what the operator kept (or its job
/// controller's log, `--controller`), through the visibility API as the caller; for an
/// attempt that still runs (nothing kept yet), its Pods' logs read from the API with the
/// caller's own permissions.
async fn logs_through_api(
    client: &kube::Client,
    job: &reach::JobRef,
    args: &LogsArgs,
) -> anyhow::Result<()> {
    use futures::AsyncBufReadExt as _;
    use futures::AsyncReadExt as _;
    let (ns, name) = match job {
        reach::JobRef::Name { namespace, name } => (namespace.clone(), name.clone()),
        reach::JobRef::Id(id) => anyhow::bail!(
            "job id {id} is the operator's store's: give NAME (in the kubeconfig context's namespace, or -n NS) or NAMESPACE/NAME, or read the store with --state-dir DIR"
        ),
    };
    let base = format!(
        "{}/namespaces/{ns}/managedjobs/{name}",
        crate::visibility::PREFIX
    );
    let mut query = Vec::new();
    if args.controller {
        query.push("controller=true".to_string());
    }
    if let Some(a) = args.attempt {
        query.push(format!("attempt={a}"));
    }
    if let Some(t) = &args.task {
        query.push(format!("task={t}"));
    }
    if let Some(r) = args.rank {
        query.push(format!("rank={r}"));
    }
    let uri = format!("{base}/log?{}", query.join("&"));
    let mut out = Vec::new();
    match client
        .request_stream(http::Request::get(uri).body(Vec::new())?)
        .await
    {
        Ok(mut body) => {
            body.read_to_end(&mut out).await?;
            use std::io::Write as _;
            std::io::stdout().write_all(&out)?;
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 && args.attempt.is_none() && !args.controller => {
            // Nothing kept of the attempt asked for: it may still run; its Pods say.
            let detail: serde_json::Value = client
                .request(http::Request::get(base.clone()).body(Vec::new())?)
                .await
                .map_err(visibility_error)?;
            let pods: Vec<(u64, String)> = detail["pods"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| Some((p["rank"].as_u64()?, p["name"].as_str()?.to_string())))
                .filter(|(rank, _)| args.rank.is_none_or(|r| u64::from(r) == *rank))
                .collect();
            if pods.is_empty() {
                anyhow::bail!("{}", s.message);
            }
            let api: kube::Api<k8s_openapi::api::core::v1::Pod> =
                kube::Api::namespaced(client.clone(), &ns);
            let many = pods.len() > 1;
            for (rank, pod) in pods {
                if many {
                    println!("==> rank {rank}, Pod {pod} <==");
                }
                let mut lines = api
                    .log_stream(&pod, &Default::default())
                    .await
                    .with_context(|| format!("reading the log of Pod {ns}/{pod}"))?
                    .lines();
                use futures::StreamExt as _;
                while let Some(line) = lines.next().await {
                    println!("{}", line?);
                }
            }
            Ok(())
        }
        Err(e) => Err(visibility_error(e)),
    }
}

/// The index of the task `which` (a name, or an index from 0) of `row`'s pipeline.
fn task_index(row: &JobRow, which: &str) -> anyhow::Result<usize> {
    if let Some(i) = row.spec.tasks.iter().position(|t| t.name == which) {
        return Ok(i);
    }
    match which.parse::<usize>() {
        Ok(i) if i < row.spec.tasks.len() => Ok(i),
        _ => {
            let names: Vec<&str> = row.spec.tasks.iter().map(|t| t.name.as_str()).collect();
            anyhow::bail!(
                "job {} has no task {which:?} (its tasks: {})",
                row.key(),
                names.join(", ")
            )
        }
    }
}

/// Prints what [`pod_logs`] shows of pod job `row`: a kept log alone as it is; several, each
/// under a `==> ... <==` header; `kubectl logs` commands on stdout, notes on stderr. Fails,
/// naming why, when there is nothing to show.
fn print_pod_logs(
    store: &Store,
    dir: &StateDir,
    row: &JobRow,
    task: Option<usize>,
    args: &LogsArgs,
) -> anyhow::Result<()> {
    use std::io::Write as _;
    let last = row.attempt.max(row.launched_attempt);
    let mut seen = Vec::new();
    for attempt in 1..=last {
        seen.extend(store.pod_members(row.id, attempt)?);
    }
    let kept = crate::executor::pod::logs::kept_logs(dir, row, &Default::default());
    let kept_bytes = store.settings()?.kept_log_bytes;
    let pieces = pod_logs(row, &kept, &seen, task, args.rank, args.attempt, kept_bytes)
        .map_err(|why| anyhow::anyhow!(why))?;
    let shown = pieces
        .iter()
        .filter(|p| !matches!(p, PodLogPiece::Note(_)))
        .count();
    let mut out = std::io::stdout().lock();
    for piece in pieces {
        match piece {
            PodLogPiece::Kept { header, log } => {
                let mut file = std::fs::File::open(&log.path)
                    .with_context(|| format!("reading {}", log.path.display()))?;
                if shown > 1 {
                    writeln!(out, "==> {header} <==")?;
                } else if log.truncated {
                    eprintln!(
                        "note: {header}: only the last {} bytes were kept",
                        log.bytes
                    );
                }
                std::io::copy(&mut file, &mut out)?;
            }
            PodLogPiece::Command(line) => writeln!(out, "{line}")?,
            PodLogPiece::Note(note) => eprintln!("note: {note}"),
        }
    }
    Ok(())
}

/// Seconds (float) to a duration, refusing negatives.
pub fn seconds(s: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(s).map_err(|e| anyhow::anyhow!("invalid seconds {s}: {e}"))
}
