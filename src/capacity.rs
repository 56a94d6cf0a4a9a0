//! The two caps (DESIGN.md section 5): how many jobs may be launching and how many alive.
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

/// Launches per usable CPU (SkyPilot's `LAUNCHES_PER_CPU`).
pub const LAUNCHES_PER_CPU: usize = 4;
/// Hard ceiling on the launch cap (SkyPilot: "hard to handle more than 512 launches at once").
pub const MAX_LAUNCH_CAP: usize = 512;
/// Hard ceiling on the run cap: each alive job is a process, a few file descriptors and a SQLite
/// writer; past this the shared store and the API server become the bottleneck.
pub const MAX_RUN_CAP: usize = 10_000;
/// Default per-job memory budget in MiB. A job controller process measures about 2-4 MiB of
/// private memory (USS; see BENCHMARKS.md); the budget leaves room for its page-table and kernel
/// overhead and for bursts while it launches.
pub const DEFAULT_JOB_MEMORY_MIB: u64 = 16;
/// Default memory kept for the operator itself and the host, in MiB.
pub const DEFAULT_RESERVED_MEMORY_MIB: u64 = 512;

/// Slots in use and queue lengths, counted from the store (DESIGN.md section 4's invariants).
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
        )
    }
}

/// Overrides from flags.
#[derive(Clone, Copy, Debug, Default)]
pub struct Overrides {
    /// Replace the derived launch cap.
    pub launch_cap: Option<usize>,
    /// Replace the derived run cap.
    pub run_cap: Option<usize>,
    /// Per-job memory budget, MiB (default [`DEFAULT_JOB_MEMORY_MIB`]).
    pub job_memory_mib: Option<u64>,
    /// Reserved memory, MiB (default [`DEFAULT_RESERVED_MEMORY_MIB`]).
    pub reserved_memory_mib: Option<u64>,
}

/// The pure formula: caps from usable CPUs and memory, with overrides and ceilings.
pub fn compute(cpus: usize, memory_mib: u64, o: Overrides) -> Capacity {
    let cpus = cpus.max(1);
    let reserved_mib = o.reserved_memory_mib.unwrap_or(DEFAULT_RESERVED_MEMORY_MIB);
    let job_memory_mib = o.job_memory_mib.unwrap_or(DEFAULT_JOB_MEMORY_MIB).max(1);
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

/// Caps for this machine (or container) with the given overrides.
pub fn detect(o: Overrides) -> Capacity {
    compute(usable_cpus(), usable_memory_mib(), o)
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
}
