//! managed-jobs: a Kubernetes operator that runs managed jobs.
//!
//! Users apply `ManagedJob` resources ([`api`]); the [`operator`] mirrors them into a SQLite
//! [`store`], admits them within the [`capacity`] caps ([`scheduler`]), starts one
//! [`job_controller`] process per admitted job, which runs the workload through an [`executor`],
//! and writes progress back as [`status`]. Every rule is a pure function of [`lifecycle`]; the
//! processes carry its decisions out. See `docs/design.md` for the semantics and the layers
//! (`hack/layers.py` checks that every import points down them).

pub mod admission;
pub mod api;
pub mod capacity;
pub mod cli;
pub mod defaults;
pub mod engine;
pub mod events;
pub mod executor;
pub mod job_controller;
pub mod lifecycle;
pub mod metrics;
pub mod operator;
pub mod pacing;
pub mod preemption;
pub mod process;
pub mod queues;
pub mod resources;
pub mod scheduler;
pub mod smoke_test;
pub mod state_dir;
pub mod status;
pub mod store;
pub mod telemetry;
pub mod visibility;
pub mod wake;
