//! `--scenario poolpass` (issue 44): admission in resources at scale, in process (no control
//! plane): the scheduling pass of the operator ([`scheduler::pass_resources`]) over a store of
//! real SQLite and a cluster view as the operator's watches build it.
//!
//! The load: 1,000 nodes of 8 `nvidia.com/gpu` (64 CPUs, 512 GiB, 110 Pods) in 5 pools of 200
//! (`gpu-0` .. `gpu-4`, one per cohort); 100 queues in 5 cohorts of 20, each with a nominal
//! quota of 80 GPUs on its cohort's pool (so the quotas add up to the 8,000 GPUs) and weights
//! 1 to 4; `--jobs` waiting jobs (10,000 in BENCHMARKS.md), the i-th in queue i mod 100, of mixed
//! sizes down each queue: one Pod of 1, 1, 2, 4 or 8 GPUs, every tenth a gang of 2 Pods of 8. The
//! launch cap is this machine's default (8: 4 x 2 CPUs), the run cap out of the way; each
//! admitted job is moved to Running at once after its pass (its launch slot freed).
//!
//! Reported:
//! - **fill**: from an empty cluster, passes until one admits nothing: jobs admitted, the
//!   passes' total time, admissions per second of pass time (after each pass the admitted jobs
//!   are moved to Running and their members bound, as kube-scheduler would: [`Binder`]);
//! - **steady**: 200 passes on the full cluster, each after one admitted
//!   job ended and one new job joined its queue (the operator's pass after a job ends): p50 /
//!   p99 and the jobs admitted;
//! - **idle**: the same number of passes with nothing changed: p50 / p99;
//! - the resident memory the cluster view of 1,000 nodes adds (`/proc/self/smaps_rollup` Rss
//!   before and after it is built).

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use managed_jobs::api::{ManagedJobPool, ManagedJobQueue, ManagedJobSpec};
use managed_jobs::capacity::Caps;
use managed_jobs::lifecycle;
use managed_jobs::lifecycle::Workload;
use managed_jobs::queues::Queues;
use managed_jobs::resources::Resources;
use managed_jobs::resources::amount::ONE;
use managed_jobs::resources::fit::{ClusterSnapshot, NodeInfo, members_in};
use managed_jobs::scheduler;
use managed_jobs::store::Store;
use serde_json::json;

use super::{Args, end_job, memory_kib, percentile, sorted};

const NODES: usize = 1_000;
const POOLS: usize = 5;
const QUEUES: usize = 100;
const GPUS_PER_NODE: i64 = 8;
const PASSES: usize = 200;

/// The resident memory of this process, KiB.
fn rss_kib() -> u64 {
    memory_kib(std::process::id() as i32).map_or(0, |(rss, _, _)| rss)
}

fn queues() -> anyhow::Result<Queues> {
    let per_queue = GPUS_PER_NODE * (NODES / QUEUES) as i64;
    let mut objects = Vec::new();
    for q in 0..QUEUES {
        let cohort = q % POOLS;
        let queue: ManagedJobQueue = serde_json::from_value(json!({
            "apiVersion": "managedjobs.dev/v1alpha1", "kind": "ManagedJobQueue",
            "metadata": {"name": format!("queue-{q}")},
            "spec": {
                "weight": q % 4 + 1,
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": format!("team-{q}")}},
                "cohort": format!("cohort-{cohort}"),
                "pools": [{"name": format!("gpu-{cohort}"), "resources": [
                    {"name": "nvidia.com/gpu", "nominalQuota": per_queue}]}],
            },
        }))?;
        objects.push(queue);
    }
    let pools = (0..POOLS)
        .map(|p| {
            serde_json::from_value::<ManagedJobPool>(json!({
                "apiVersion": "managedjobs.dev/v1alpha1", "kind": "ManagedJobPool",
                "metadata": {"name": format!("gpu-{p}")},
                "spec": {"nodeLabels": {"pool": format!("gpu-{p}")}},
            }))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let namespaces = (0..QUEUES)
        .map(|q| {
            let ns = format!("team-{q}");
            let labels = BTreeMap::from([("kubernetes.io/metadata.name".to_string(), ns.clone())]);
            (ns, labels)
        })
        .collect();
    Ok(Queues::resolve(&objects, &namespaces, &pools))
}

fn cluster() -> ClusterSnapshot {
    let mut allocatable = Resources::new();
    allocatable.set("nvidia.com/gpu", GPUS_PER_NODE * ONE);
    allocatable.set("cpu", 64 * ONE);
    allocatable.set("memory", 512 * (1 << 30) * ONE);
    allocatable.set("pods", 110 * ONE);
    let nodes = (0..NODES)
        .map(|i| NodeInfo {
            name: format!("node-{i}"),
            labels: BTreeMap::from([("pool".to_string(), format!("gpu-{}", i % POOLS))]),
            taints: Vec::new(),
            allocatable: allocatable.clone(),
            requested: Resources::new(),
            ready: true,
            unschedulable: false,
        })
        .collect();
    ClusterSnapshot {
        nodes,
        bound: Default::default(),
        version: 1,
    }
}

/// The i-th job's spec: its queue, and one Pod of 1, 1, 2, 4 or 8 GPUs, or every tenth of a
/// queue's jobs a gang of 2 Pods of 8.
fn spec(i: usize) -> anyhow::Result<ManagedJobSpec> {
    // Sizes vary down each queue (the i-th job is queue i mod 100's (i / 100)-th).
    let k = i / QUEUES;
    let (gpus, nodes) = if k % 10 == 9 {
        (8, 2)
    } else {
        ([1, 1, 2, 4, 8][k % 5], 1)
    };
    Ok(serde_json::from_value(json!({
        "queue": format!("queue-{}", i % QUEUES),
        "nodes": nodes,
        "template": {"spec": {"restartPolicy": "Never", "containers": [{
            "name": "train", "image": "busybox", "command": ["sleep", "3600"],
            "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}},
    }))?)
}

fn add(store: &mut Store, uid: &str, i: usize) -> anyhow::Result<()> {
    let spec = spec(i)?;
    store.upsert(uid, &format!("team-{}", i % QUEUES), uid, 1, &spec)?;
    Ok(())
}

/// p50 and p99 in ms.
fn p50_p99(times: Vec<f64>) -> (f64, f64) {
    let t = sorted(times);
    (percentile(&t, 0.5), percentile(&t, 0.99))
}

/// kube-scheduler's stand-in: binds the members of the jobs just admitted (their demand and
/// pool from the store) to the pool's nodes with the most GPUs free, as its default
/// `LeastAllocated` scoring spreads them, counting them in the nodes' `requested` and in
/// `bound`; and unbinds the members of a job that ended.
struct Binder {
    /// Per job uid: the member's request and the node of each member.
    placed: HashMap<String, (Resources, Vec<usize>)>,
}

impl Binder {
    fn bind(
        &mut self,
        store: &Store,
        cluster: &mut ClusterSnapshot,
        rows: &[lifecycle::JobRow],
    ) -> anyhow::Result<()> {
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        let demands = store.demands_of(&ids)?;
        for row in rows {
            let Some((Some(demand), Some(pool))) = demands.get(&row.id) else {
                anyhow::bail!("job {} admitted without a demand and a pool", row.id);
            };
            let mut nodes = Vec::new();
            for _ in 0..demand.members {
                let best = cluster
                    .nodes
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| n.labels.get("pool") == Some(pool))
                    .map(|(i, n)| (i, members_in(&n.free(), &demand.per_member), n.free()))
                    .filter(|(_, k, _)| *k > 0)
                    .max_by_key(|(i, _, free)| (free.get("nvidia.com/gpu"), std::cmp::Reverse(*i)));
                let Some((i, _, _)) = best else {
                    anyhow::bail!("job {} admitted onto {pool} where it does not fit", row.id);
                };
                cluster.nodes[i].requested.add(&demand.per_member);
                nodes.push(i);
            }
            let names = nodes
                .iter()
                .map(|&i| cluster.nodes[i].name.clone())
                .collect();
            cluster.bound.insert((row.uid.clone(), 1), names);
            self.placed
                .insert(row.uid.clone(), (demand.per_member.clone(), nodes));
        }
        cluster.version += 1;
        Ok(())
    }

    fn unbind(&mut self, cluster: &mut ClusterSnapshot, uid: &str) {
        if let Some((member, nodes)) = self.placed.remove(uid) {
            for i in nodes {
                cluster.nodes[i].requested.sub(&member);
            }
        }
        cluster.bound.remove(&(uid.to_string(), 1));
        cluster.version += 1;
    }
}

/// Each admitted job's workload starts at once (Launching -> Alive, its launch slot freed) and
/// its members are bound.
fn launch(
    store: &mut Store,
    cluster: &mut ClusterSnapshot,
    binder: &mut Binder,
    rows: &[lifecycle::JobRow],
) -> anyhow::Result<()> {
    for row in rows {
        let t = lifecycle::running(row, 1, Workload::Pod(format!("{}-1", row.name)));
        store.transition(row.id, &t)?;
    }
    binder.bind(store, cluster, rows)
}

pub fn scenario(args: &Args) -> anyhow::Result<()> {
    let jobs = args.jobs;
    let passes = PASSES;
    let queues = queues()?;
    let before = rss_kib();
    let mut cluster = cluster();
    let view_kib = rss_kib().saturating_sub(before);
    let dir = tempfile::tempdir()?;
    let mut store = Store::open(&dir.path().join("bench.db"), 8 * 1024)?;
    let t = Instant::now();
    for i in 0..jobs {
        add(&mut store, &format!("j{i}"), i)?;
    }
    eprintln!(
        "[poolpass] {jobs} jobs stored in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    // The launch cap of this 2-core machine (4 x CPUs); a run cap above what the nodes take.
    let caps = Caps {
        launch: 8,
        run: 1_000_000,
    };
    let mut binder = Binder {
        placed: HashMap::new(),
    };
    // Fill: passes until one admits nothing.
    let mut admitted = Vec::new();
    let mut fill_ms = Vec::new();
    loop {
        let t = Instant::now();
        let r = scheduler::pass_resources(&mut store, caps, &queues, usize::MAX, Some(&cluster))?;
        fill_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        if r.started.is_empty() {
            break;
        }
        launch(&mut store, &mut cluster, &mut binder, &r.started)?;
        admitted.extend(r.started);
        anyhow::ensure!(fill_ms.len() < 100_000, "the cluster never filled");
    }
    let fill_total_s: f64 = fill_ms.iter().sum::<f64>() / 1000.0;
    let gpus_held: i64 = cluster
        .nodes
        .iter()
        .map(|n| n.requested.get("nvidia.com/gpu") / ONE)
        .sum();
    let (f50, f99) = p50_p99(fill_ms.clone());
    println!(
        "fill: {} jobs admitted ({gpus_held} of {} GPUs) in {} passes, {:.3} s of pass time: {:.0} admissions/s; pass p50 {f50:.2} ms, p99 {f99:.2} ms",
        admitted.len(),
        NODES as i64 * GPUS_PER_NODE,
        fill_ms.len(),
        fill_total_s,
        admitted.len() as f64 / fill_total_s,
    );

    // Steady: one admitted job ends and one new job joins before each pass.
    let mut steady_ms = Vec::new();
    let mut steady_admitted = 0usize;
    let mut steady_told = 0usize;
    for k in 0..passes {
        let next = jobs + k;
        let row = admitted.swap_remove((k * 7919) % admitted.len());
        let row = store.get(row.id)?;
        end_job(&mut store, &row)?;
        binder.unbind(&mut cluster, &row.uid);
        add(&mut store, &format!("j{next}"), next)?;

        let t = Instant::now();
        let r = scheduler::pass_resources(&mut store, caps, &queues, usize::MAX, Some(&cluster))?;
        steady_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        steady_admitted += r.started.len();
        steady_told += r.messages;
        launch(&mut store, &mut cluster, &mut binder, &r.started)?;
        admitted.extend(r.started);
    }
    let (s50, s99) = p50_p99(steady_ms);
    println!(
        "steady: {passes} passes after one job ended and one joined: p50 {s50:.2} ms, p99 {s99:.2} ms; {steady_admitted} admitted; {steady_told} waiting jobs told a new reason"
    );

    let mut idle_ms = Vec::new();
    let mut idle_told = 0usize;
    for _ in 0..passes {
        let t = Instant::now();
        let r = scheduler::pass_resources(&mut store, caps, &queues, usize::MAX, Some(&cluster))?;
        idle_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        idle_told += r.messages;
    }
    if std::env::var_os("MJ_POOLPASS_DEBUG").is_some() {
        let db = rusqlite::Connection::open(dir.path().join("bench.db"))?;
        let read = |db: &rusqlite::Connection| -> anyhow::Result<HashMap<i64, String>> {
            let mut st = db.prepare(
                "SELECT id, coalesce(wait_reason,'') || ' | ' || coalesce(message,'') FROM jobs WHERE schedule_state = 'Waiting'",
            )?;
            let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
            Ok(rows.collect::<Result<_, _>>()?)
        };
        let a = read(&db)?;
        scheduler::pass_resources(&mut store, caps, &queues, usize::MAX, Some(&cluster))?;
        let b = read(&db)?;
        scheduler::pass_resources(&mut store, caps, &queues, usize::MAX, Some(&cluster))?;
        let c = read(&db)?;
        let mut shown = 0;
        for (id, m) in &a {
            if b.get(id) != Some(m) && shown < 6 {
                shown += 1;
                eprintln!(
                    "job {id}:\n  before: {m}\n  pass 1: {}\n  pass 2: {}",
                    b[id], c[id]
                );
            }
        }
        eprintln!(
            "changed in pass 1: {}",
            a.iter().filter(|(id, m)| b.get(*id) != Some(*m)).count()
        );
    }
    let (i50, i99) = p50_p99(idle_ms);
    let waiting = store.slot_usage()?.waiting;
    println!(
        "idle: {passes} passes, nothing changed: p50 {i50:.2} ms, p99 {i99:.2} ms; {idle_told} waiting jobs told a new reason"
    );
    println!(
        "{waiting} jobs waiting at the end; the cluster view of {NODES} nodes: {view_kib} KiB resident"
    );
    Ok(())
}
