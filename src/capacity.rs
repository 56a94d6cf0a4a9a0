//! The two caps (docs/design.md#capacity): how many jobs may be launching and how many alive.
//!
//! - launch cap = [`LAUNCHES_PER_CPU`] x usable CPUs (SkyPilot's `LAUNCHES_PER_CPU = 4`);
//! - run cap = (usable memory - reserve) / per-job budget, at least 1 (SkyPilot's
//!   `mem_total // JOB_MEMORY_MB`, with our budget instead of its 350 MB);
//! - each clamped by a hard ceiling ([`MAX_LAUNCH_CAP`], [`MAX_RUN_CAP`]) because shared
//!   bottlenecks (the SQLite file, the API server) do not grow with the machine.
//!
//! "Usable" honours cgroup limits: CPUs from `std::thread::available_parallelism` (cgroup quota and
//! affinity aware), memory from the cgroup's limit when lower than the machine's (sysinfo).

use std::fmt;

use crate::defaults::{JOB_MEMORY_MIB, RESERVED_MEMORY_MIB};

/// Launches per usable CPU (SkyPilot's `LAUNCHES_PER_CPU`).
pub const LAUNCHES_PER_CPU: usize = 4;
/// Hard ceiling on the launch cap (SkyPilot: "hard to handle more than 512 launches at once").
pub const MAX_LAUNCH_CAP: usize = 512;
/// Hard ceiling on the run cap: each alive job is a process, a few file descriptors and a SQLite
/// writer; past this the shared store and the API server become the bottleneck.
pub const MAX_RUN_CAP: usize = 10_000;
/// File descriptors the operator keeps for itself: the store, the API connections (up to
/// [`crate::operator::status_writer::STATUS_WRITERS`] status writes in flight), the watches, the
/// wake-up socket, logs.
pub const NOFILE_RESERVE: u64 = 96;
/// File descriptors the operator holds per live job: its job controller's pidfd.
pub const FDS_PER_JOB: u64 = 1;
/// Tasks (processes and threads, what a cgroup's `pids.max` counts) per live job: its job
/// controller (one thread: a current-thread runtime) and a local workload's wrapper shell, the
/// script's shell and one command. A pod job needs only the first; a script that starts more
/// processes needs more (raise the limit, or lower `--run-cap`).
pub const PIDS_PER_JOB: u64 = 4;
/// Tasks the operator keeps for itself: its runtime's worker and blocking threads, and the
/// commands it runs.
pub const PIDS_RESERVE: u64 = 64;

/// Slots in use and queue lengths, counted from the store (docs/design.md#two-state-machines).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotUsage {
    /// Jobs in Launching (launch slots in use).
    pub launching: usize,
    /// Jobs in Launching, Alive or AliveWaiting (run slots in use).
    pub alive: usize,
    /// Jobs in Waiting.
    pub waiting: usize,
    /// Jobs in AliveWaiting.
    pub alive_waiting: usize,
}

/// The caps in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Caps {
    /// Max jobs in Launching at once.
    pub launch: usize,
    /// Max jobs in Launching, Alive or AliveWaiting at once.
    pub run: usize,
}

/// Inputs and results of the capacity computation, for the start-up log and `queue`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Usable CPUs (cgroup-aware).
    pub cpus: usize,
    /// Usable memory in MiB (cgroup-aware).
    pub memory_mib: u64,
    /// Memory reserved for the operator and host, MiB.
    pub reserved_mib: u64,
    /// Per-job memory budget, MiB.
    pub job_memory_mib: u64,
    /// Caps derived from the above, before overrides.
    pub derived: Caps,
    /// Caps in force (overrides applied, ceilings enforced).
    pub caps: Caps,
    /// The operator's soft limit on open files (after raising it to the hard limit), when
    /// known; it bounds the run cap ([`limit_by_open_files`]).
    pub open_files: Option<u64>,
    /// The lowest `pids.max` of the operator's cgroup and its ancestors, when one is set; it
    /// bounds the run cap ([`limit_by_pids`]).
    pub pids_max: Option<u64>,
}

impl fmt::Display for Capacity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "launch cap {} (derived {} = {} x {} CPUs), run cap {} (derived {} = ({} MiB - {} MiB reserved) / {} MiB per job)",
            self.caps.launch,
            self.derived.launch,
            LAUNCHES_PER_CPU,
            self.cpus,
            self.caps.run,
            self.derived.run,
            self.memory_mib,
            self.reserved_mib,
            self.job_memory_mib
        )?;
        if let Some(n) = self.open_files {
            let bound = open_files_bound(n);
            if bound <= self.caps.run {
                write!(
                    f,
                    "; bound by open files: {bound} = ({n} - {NOFILE_RESERVE} reserved) / {FDS_PER_JOB} per job"
                )?;
            }
        }
        if let Some(n) = self.pids_max {
            let bound = pids_bound(n);
            if bound <= self.caps.run {
                write!(
                    f,
                    "; bound by the tasks allowed (cgroup pids.max, kernel pid_max): {bound} = ({n} - {PIDS_RESERVE} reserved) / {PIDS_PER_JOB} per job"
                )?;
            }
        }
        Ok(())
    }
}

/// The run cap that `open_files` (the operator's soft RLIMIT_NOFILE) allows: every live job
/// costs the operator [`FDS_PER_JOB`], and it keeps [`NOFILE_RESERVE`]; at least 1.
pub fn open_files_bound(open_files: u64) -> usize {
    (open_files.saturating_sub(NOFILE_RESERVE) / FDS_PER_JOB).max(1) as usize
}

/// `c` with its run cap (derived and in force, an override included) bounded by the open files
/// the operator may hold: past it, starting a job controller would fail with EMFILE.
pub fn limit_by_open_files(mut c: Capacity, open_files: Option<u64>) -> Capacity {
    if let Some(n) = open_files {
        c.caps.run = c.caps.run.min(open_files_bound(n));
    }
    c.open_files = open_files;
    c
}

/// The run cap that a cgroup `pids.max` of `max` tasks allows: every live job costs
/// [`PIDS_PER_JOB`], the operator keeps [`PIDS_RESERVE`]; at least 1.
pub fn pids_bound(max: u64) -> usize {
    (max.saturating_sub(PIDS_RESERVE) / PIDS_PER_JOB).max(1) as usize
}

/// `c` with its run cap bounded by the cgroup's `pids.max` (past it, fork fails with EAGAIN:
/// job controllers could not start, workloads could not fork).
pub fn limit_by_pids(mut c: Capacity, pids_max: Option<u64>) -> Capacity {
    if let Some(n) = pids_max {
        c.caps.run = c.caps.run.min(pids_bound(n));
    }
    c.pids_max = pids_max;
    c
}

/// The lowest `pids.max` that applies to the process whose `/proc/PID/cgroup` reads
/// `proc_cgroup`, with the cgroup filesystem mounted at `root` (`/sys/fs/cgroup`): under
/// cgroup v2 (`0::/path`) the files at `root/path` and each ancestor; under v1 the `pids`
/// controller's (`N:pids:/path`) at `root/pids/path` and each ancestor. `max` means no limit.
/// None when no limit is set or nothing can be read.
pub fn pids_max_under(root: &std::path::Path, proc_cgroup: &str) -> Option<u64> {
    let (base, path) = proc_cgroup
        .lines()
        .find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            if controllers.split(',').any(|c| c == "pids") {
                Some((root.join("pids"), path))
            } else {
                None
            }
        })
        .or_else(|| {
            proc_cgroup
                .lines()
                .find_map(|l| l.strip_prefix("0::"))
                .map(|path| (root.to_path_buf(), path))
        })?;
    let mut dir = base.join(path.trim_start_matches('/'));
    let mut lowest: Option<u64> = None;
    loop {
        if let Ok(text) = std::fs::read_to_string(dir.join("pids.max"))
            && let Ok(n) = text.trim().parse::<u64>()
        {
            lowest = Some(lowest.map_or(n, |l| l.min(n)));
        }
        if dir == base || !dir.pop() || !dir.starts_with(&base) {
            break;
        }
    }
    lowest
}

/// The tasks this process may count on: [`pids_max_under`] for its cgroup, and the kernel's
/// own `pid_max` (every process and thread of the node takes one id; 32,768 on many machines).
pub fn pids_max() -> Option<u64> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|c| pids_max_under(std::path::Path::new("/sys/fs/cgroup"), &c));
    let kernel = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok());
    cgroup.into_iter().chain(kernel).min()
}

/// Raises this process' soft RLIMIT_NOFILE to its hard limit (as the Go runtime does for every
/// Go program: the soft default of 1,024 is a relic of select(2)); returns the soft limit now in
/// force, or None when it cannot be read.
pub fn raise_open_files_limit() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return Some(hard);
    }
    Some(soft)
}

/// Overrides from flags.
#[derive(Clone, Copy, Debug, Default)]
pub struct Overrides {
    /// Replace the derived launch cap.
    pub launch_cap: Option<usize>,
    /// Replace the derived run cap.
    pub run_cap: Option<usize>,
    /// Per-job memory budget, MiB (default [`JOB_MEMORY_MIB`]).
    pub job_memory_mib: Option<u64>,
    /// Reserved memory, MiB (default [`RESERVED_MEMORY_MIB`]).
    pub reserved_memory_mib: Option<u64>,
}

/// The pure formula: caps from usable CPUs and memory, with overrides and ceilings.
pub fn compute(cpus: usize, memory_mib: u64, o: Overrides) -> Capacity {
    let cpus = cpus.max(1);
    let reserved_mib = o.reserved_memory_mib.unwrap_or(RESERVED_MEMORY_MIB);
    let job_memory_mib = o.job_memory_mib.unwrap_or(JOB_MEMORY_MIB).max(1);
    let derived = Caps {
        launch: (LAUNCHES_PER_CPU * cpus).clamp(1, MAX_LAUNCH_CAP),
        run: ((memory_mib.saturating_sub(reserved_mib) / job_memory_mib) as usize)
            .clamp(1, MAX_RUN_CAP),
    };
    let caps = Caps {
        launch: o
            .launch_cap
            .unwrap_or(derived.launch)
            .clamp(1, MAX_LAUNCH_CAP),
        run: o.run_cap.unwrap_or(derived.run).clamp(1, MAX_RUN_CAP),
    };
    Capacity {
        cpus,
        memory_mib,
        reserved_mib,
        job_memory_mib,
        derived,
        caps,
        open_files: None,
        pids_max: None,
    }
}

/// Usable CPUs: `available_parallelism` honours cgroup CPU quotas and the affinity mask.
pub fn usable_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Usable memory in MiB: the machine's total, or the cgroup's limit when lower.
pub fn usable_memory_mib() -> u64 {
    let Ok(mut sys) = sysinfo::System::new() else {
        return 1024;
    };
    sys.refresh_memory();
    let mut bytes = sys.total_memory();
    if let Some(limits) = sys.cgroup_limits()
        && limits.total_memory > 0
    {
        bytes = bytes.min(limits.total_memory);
    }
    bytes / (1024 * 1024)
}

/// Caps for this machine (or container) with the given overrides, after raising the open-files
/// limit of this process (the operator) as far as it goes.
pub fn detect(o: Overrides) -> Capacity {
    let open_files = raise_open_files_limit();
    let c = limit_by_open_files(compute(usable_cpus(), usable_memory_mib(), o), open_files);
    limit_by_pids(c, pids_max())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_formulas() {
        let c = compute(2, 8 * 1024, Overrides::default());
        assert_eq!(c.caps.launch, 8);
        assert_eq!(c.caps.run, (8 * 1024 - 512) / 16);
    }

    #[test]
    fn run_cap_is_at_least_one_and_ceilings_hold() {
        let c = compute(1000, 100, Overrides::default());
        assert_eq!(c.caps.run, 1);
        assert_eq!(c.caps.launch, MAX_LAUNCH_CAP);
        let o = Overrides {
            run_cap: Some(1_000_000),
            ..Default::default()
        };
        assert_eq!(compute(2, 100, o).caps.run, MAX_RUN_CAP);
    }

    /// Under a hard limit of 256 open files the run cap leaves the operator its reserve, even
    /// when a flag asks for more; a generous limit does not bind.
    #[test]
    fn open_files_bound_the_run_cap() {
        let c = limit_by_open_files(compute(2, 24 * 1024, Overrides::default()), Some(256));
        assert_eq!(c.caps.run, 160);
        assert!(c.to_string().contains("bound by open files: 160"), "{c}");
        let o = Overrides {
            run_cap: Some(5_000),
            ..Default::default()
        };
        assert_eq!(
            limit_by_open_files(compute(2, 24 * 1024, o), Some(256))
                .caps
                .run,
            160
        );
        let free = limit_by_open_files(compute(2, 8 * 1024, Overrides::default()), Some(1 << 20));
        assert_eq!(free.caps.run, (8 * 1024 - 512) / 16);
        assert!(!free.to_string().contains("open files"));
        assert_eq!(open_files_bound(10), 1);
    }

    fn fixtures() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cgroup")
    }

    /// cgroup v2: the lowest pids.max of the cgroup and its ancestors (`max` is no limit).
    #[test]
    fn pids_max_is_the_lowest_on_the_path_under_cgroup_v2() {
        let root = fixtures().join("v2");
        assert_eq!(
            pids_max_under(&root, "0::/kubepods/pod1/operator\n"),
            Some(1000),
            "the pod's 1000 binds, not the container's max"
        );
        assert_eq!(pids_max_under(&root, "0::/unlimited\n"), None);
        let c = limit_by_pids(compute(2, 24 * 1024, Overrides::default()), Some(1000));
        assert_eq!(c.caps.run, (1000 - 64) / 4);
        assert!(c.to_string().contains("pid_max): 234"), "{c}");
    }

    /// cgroup v1: the `pids` controller's hierarchy.
    #[test]
    fn pids_max_follows_the_pids_controller_under_cgroup_v1() {
        let root = fixtures().join("v1");
        let cgroup = "9:memory:/docker/abc\n8:pids:/docker/abc\n0::/\n";
        assert_eq!(pids_max_under(&root, cgroup), Some(4096));
        let free = limit_by_pids(compute(2, 8 * 1024, Overrides::default()), Some(1 << 22));
        assert_eq!(free.caps.run, (8 * 1024 - 512) / 16);
        assert!(!free.to_string().contains("pids.max"));
    }
}
