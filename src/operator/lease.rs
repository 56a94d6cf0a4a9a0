//! Leader election on a Lease (kube-lease-manager): only the holder runs the engine.

use kube::Client;

/// Leader election settings.
#[derive(Clone, Debug)]
pub struct LeaderElection {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub lease_name: String,
    /// This instance's identity (the Pod name in a cluster).
    pub identity: String,
    /// Lease duration, seconds: a dead leader is replaced within this.
    pub duration_seconds: u64,
}

/// Waits until this instance holds the Lease, then watches it: losing it ends the process (a
/// restarted instance stands by again), so two operators never act at once.
pub(super) async fn acquire_lease(client: Client, le: &LeaderElection) -> anyhow::Result<()> {
    use kube_lease_manager::LeaseManagerBuilder;
    let manager = LeaseManagerBuilder::new(client, &le.lease_name)
        .with_namespace(&le.namespace)
        .with_identity(&le.identity)
        .with_duration(le.duration_seconds)
        .with_grace(le.duration_seconds.div_ceil(3).max(1))
        .build()
        .await?;
    let (mut leading, _task) = manager.watch().await;
    tracing::info!(lease = %le.lease_name, namespace = %le.namespace, identity = %le.identity, "waiting to lead");
    while !*leading.borrow_and_update() {
        leading.changed().await?;
    }
    tracing::info!(identity = %le.identity, "leading");
    tokio::spawn(async move {
        loop {
            if leading.changed().await.is_err() || !*leading.borrow_and_update() {
                tracing::error!("lost the lease; exiting so that only one operator acts");
                std::process::exit(1);
            }
        }
    });
    Ok(())
}
