use clap::Parser;
use managed_jobs::cli::{self, Cli, Command};
use managed_jobs::{api, capacity, engine, job_controller, operator, smoke_test, telemetry};

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd { kind, reference } => {
            if reference {
                print!("{}", api::api_reference());
            } else if kind == "queue" {
                print!("{}", api::queue_crd_yaml());
            } else if kind == "pool" {
                print!("{}", api::pool_crd_yaml());
            } else {
                print!("{}", api::crd_yaml());
            }
            Ok(())
        }
        Command::Queue(args) => cli::queue(&args),
        Command::Logs(args) => cli::logs(&args),
        Command::SmokeTest(args) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(smoke_test::run(args)),
        Command::OutputSink { file, .. } => {
            std::process::exit(managed_jobs::executor::output::run(&file))
        }
        Command::JobController(args) => {
            telemetry::init(cli.log_format);
            // A small single-threaded runtime: there are many of these processes.
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(job_controller::run(
                    args.state_dir,
                    args.job_id,
                    args.start_gate_fd,
                ))
        }
        Command::Run(args) => {
            telemetry::init(cli.log_format);
            let cfg = engine::Config {
                state_dir: args.state_dir.clone(),
                namespace: args.namespace.clone(),
                executors: args.executors()?,
                capacity: capacity::detect(args.overrides()),
                cancel_grace: cli::seconds(args.cancel_grace_seconds)?,
                restart_backoff: cli::seconds(args.restart_backoff_seconds)?,
                max_controller_crashes: args.max_controller_crashes.max(1),
                launch_timeout: {
                    anyhow::ensure!(
                        args.launch_timeout_seconds > 0.0,
                        "--launch-timeout-seconds must be > 0"
                    );
                    cli::seconds(args.launch_timeout_seconds)?
                },
                max_launch_timeouts: args.max_launch_timeouts.max(1),
                // Job controllers run this very build even when the binary's file is replaced
                // while the operator runs (an upgrade installed in place): docs/upgrades.md.
                self_exe: if std::path::Path::new(engine::OWN_EXECUTABLE).exists() {
                    engine::OWN_EXECUTABLE.into()
                } else {
                    std::env::current_exe()?
                },
                shard: args.shard()?,
                gang_scheduling: args.gang_scheduling == "auto",
                queues_from_api: true,
                claims: true,
                kept_log_bytes: args.kept_log_bytes,
                burst: managed_jobs::pacing::BurstPolicy {
                    threshold_per_s: args.burst_threshold,
                    launch_rate: args.burst_launch_rate.max(1),
                    api_qps: args.burst_api_qps.max(1),
                    hold: std::time::Duration::from_secs(args.burst_hold_seconds),
                },
            };
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(async move {
                    let client = kube::Client::try_default().await?;
                    let options = operator::Options {
                        budget: operator::ApiBudget {
                            qps: args.api_qps,
                            burst: args.api_burst,
                        },
                        metrics_addr: args.metrics_addr()?,
                        leader_election: args.leader_election(),
                        events: args.events,
                        visibility: args.visibility()?,
                        claim_duration: std::time::Duration::from_secs(
                            args.lease_duration_seconds.max(2),
                        ),
                        node_lost_grace: cli::seconds(args.node_lost_grace_seconds)?,
                    };
                    operator::run(client, cfg, options).await
                })
        }
    }
}
