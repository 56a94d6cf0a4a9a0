//! `managed-jobs smoke-test`: proves that an installed operator admits and finishes a job. The
//! chart's `helm test` hook runs it in a Pod: it creates the ManagedJob the chart renders (a Pod
//! that runs this image's `managed-jobs --version`), follows its status until it finishes,
//! prints each phase it saw, deletes it, and exits 0 only if it Succeeded.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use kube::api::{Api, DeleteParams, PostParams};

use crate::api::{JobPhase, ManagedJob};

/// Flags of `managed-jobs smoke-test`.
#[derive(Debug, clap::Args)]
pub struct SmokeTestArgs {
    /// The ManagedJob to create, as JSON or YAML. Without `metadata.name`, a
    /// `metadata.generateName` of `smoke-test-` is used.
    #[arg(long, env = "MJ_SMOKE_TEST_JOB")]
    pub job: String,
    /// Namespace to create it in (default: `$POD_NAMESPACE`, else the client's namespace).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// Seconds to wait for the job to finish.
    #[arg(long, default_value_t = 180)]
    pub timeout_seconds: u64,
}

/// Runs the smoke test with a client from the environment (in-cluster, or `KUBECONFIG`).
///
/// Errors: the job cannot be parsed or created, it ends in any phase but Succeeded (the error
/// names the phase, the failure reason and the message), or it is not finished within
/// `--timeout-seconds`.
pub async fn run(args: SmokeTestArgs) -> anyhow::Result<()> {
    let mut job: ManagedJob =
        serde_norway::from_str(&args.job).context("parsing --job (a ManagedJob, JSON or YAML)")?;
    if job.metadata.name.is_none() && job.metadata.generate_name.is_none() {
        job.metadata.generate_name = Some("smoke-test-".into());
    }
    let client = kube::Client::try_default().await?;
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let api: Api<ManagedJob> = Api::namespaced(client, &namespace);
    let created = api
        .create(&PostParams::default(), &job)
        .await
        .with_context(|| format!("creating the ManagedJob in namespace {namespace}"))?;
    let name = created.metadata.name.clone().unwrap_or_default();
    println!("created managedjob {namespace}/{name}");
    let outcome = follow(&api, &name, Duration::from_secs(args.timeout_seconds)).await;
    // Never seen by an operator (no job id): nothing was launched, and no operator would ever
    // release the finalizer the admission policy added. Drop it so the delete goes through.
    let unseen = api
        .get_opt(&name)
        .await
        .ok()
        .flatten()
        .is_some_and(|j| j.status.as_ref().and_then(|s| s.job_id).is_none());
    if unseen {
        let patch = serde_json::json!({"metadata": {"finalizers": null}});
        let _ = api
            .patch(
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await;
    }
    match api.delete(&name, &DeleteParams::background()).await {
        Ok(_) => println!("deleted managedjob {namespace}/{name}"),
        Err(e) => eprintln!("deleting managedjob {namespace}/{name}: {e}"),
    }
    outcome
}

/// Polls the job once a second, printing each (phase, schedule state, message) it has not
/// printed before, until its phase is terminal or `timeout` passes.
async fn follow(api: &Api<ManagedJob>, name: &str, timeout: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    let mut last = String::new();
    loop {
        let job = api.get(name).await?;
        let status = job.status.unwrap_or_default();
        let line = format!(
            "phase {} schedule {} attempt {}: {}",
            status.phase.map_or("-", JobPhase::as_str),
            status.schedule_state.map_or("-", |s| s.as_str()),
            status.attempt,
            status.message.as_deref().unwrap_or("")
        );
        if line != last {
            println!("{:>5.1}s {line}", start.elapsed().as_secs_f64());
            last.clone_from(&line);
        }
        match status.phase {
            Some(JobPhase::Succeeded) => {
                let id = status.job_id.map_or("-".to_string(), |i| i.to_string());
                println!("smoke test passed: job id {id}");
                return Ok(());
            }
            Some(p) if p.is_terminal() => anyhow::bail!(
                "the job ended {} ({}): {}",
                p.as_str(),
                status.failure_reason.as_deref().unwrap_or("no reason"),
                status.message.as_deref().unwrap_or("")
            ),
            _ => {}
        }
        if start.elapsed() >= timeout {
            let hint = if status.job_id.is_none() {
                "; no operator has taken the job (no job id): is the operator running, Ready, and watching this namespace?"
            } else {
                ""
            };
            anyhow::bail!(
                "the job did not finish within {} s; last seen: {line}{hint}",
                timeout.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
