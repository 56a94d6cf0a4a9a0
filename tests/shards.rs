//! Shards (docs/design.md#shards) on the real dev control plane: three operator instances
//! (the default one and `--shard a`, `--shard b`) share one namespace and one API server and
//! nothing else. Every job is handled by exactly one of them (their stores are disjoint and
//! match the labels), each instance's caps hold as seen through the API over the whole run,
//! killing one shard leaves the others' jobs untouched, a job's shard label is fixed at its
//! creation (and must name a shard), and a shard refuses another shard's state dir.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, ResourceExt};
use managed_jobs::api::{JobPhase, LABEL_SHARD, ManagedJob, ManagedJobStatus, ScheduleState};
use managed_jobs::state_dir::StateDir;
use managed_jobs::store::Store;

const JOBS: usize = 600;
const LAUNCH_CAP: usize = 2;
const RUN_CAP: usize = 4;
const T: Duration = Duration::from_secs(300);

/// The shard of job `i`: None (the default instance), a or b.
fn shard_of(i: usize) -> Option<&'static str> {
    [None, Some("a"), Some("b")][i % 3]
}

fn job(name: &str, shard: Option<&str>, run: &str) -> ManagedJob {
    let mut mj = ManagedJob::new(
        name,
        managed_jobs::api::ManagedJobSpec {
            run: Some(run.into()),
            ..Default::default()
        },
    );
    if let Some(shard) = shard {
        mj.labels_mut().insert(LABEL_SHARD.into(), shard.into());
    }
    mj
}

fn terminal(s: &ManagedJobStatus) -> bool {
    s.phase.is_some_and(|p| p.is_terminal())
}

/// Every status the API showed, by job name, and the most jobs each shard showed at once in
/// Launching and holding a run slot.
#[derive(Default)]
struct Seen {
    status: HashMap<String, ManagedJobStatus>,
    shard: HashMap<String, String>,
    peak: BTreeMap<String, (usize, usize)>,
}

fn follow(client: &Client, ns: &str) -> (tokio::task::JoinHandle<()>, Arc<Mutex<Seen>>) {
    let api: Api<ManagedJob> = Api::namespaced(client.clone(), ns);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let out = seen.clone();
    let task = tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Ok(Some(mj)) = stream.try_next().await {
            let name = mj.name_any();
            let shard = mj.labels().get(LABEL_SHARD).cloned().unwrap_or_default();
            let mut s = out.lock().unwrap();
            s.shard.insert(name.clone(), shard.clone());
            if let Some(status) = mj.status {
                s.status.insert(name, status);
            }
            let (mut launching, mut live) = (0, 0);
            for (n, st) in &s.status {
                if s.shard.get(n) != Some(&shard) {
                    continue;
                }
                let state = st.schedule_state.unwrap_or(ScheduleState::Inactive);
                launching += usize::from(state == ScheduleState::Launching);
                live += usize::from(state.holds_run_slot());
            }
            let peak = s.peak.entry(shard).or_default();
            *peak = (peak.0.max(launching), peak.1.max(live));
        }
    });
    (task, seen)
}

/// The uids of the jobs in an operator's store.
fn store_uids(op: &support::OperatorProcess) -> BTreeSet<String> {
    let store = Store::open(&StateDir::new(op.state_path()).store(), 1024).unwrap();
    store.all().unwrap().into_iter().map(|r| r.uid).collect()
}

async fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < timeout, "{what} not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn three_instances_share_a_namespace_and_nothing_else() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "shards").await;
    let caps = [
        "--launch-cap",
        &LAUNCH_CAP.to_string(),
        "--run-cap",
        &RUN_CAP.to_string(),
    ]
    .map(str::to_string);
    let args = |shard: Option<&str>| -> Vec<String> {
        let mut a = caps.to_vec();
        if let Some(s) = shard {
            a.extend(["--shard".to_string(), s.to_string()]);
        }
        a
    };
    let start = |shard: Option<&str>| {
        let a = args(shard);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        support::OperatorProcess::start(cp, &ns.name, &a)
    };
    let mut default = start(None);
    let mut shard_a = start(Some("a"));
    let shard_b = start(Some("b"));
    let (watch, seen) = follow(&client, &ns.name);

    // A running job of shard b keeps its label: the admission policy refuses a change.
    let api: Api<ManagedJob> = Api::namespaced(client.clone(), &ns.name);
    api.create(
        &PostParams::default(),
        &job("pinned", Some("b"), "sleep 60"),
    )
    .await
    .unwrap();
    support::wait_status(
        &client,
        &ns.name,
        "pinned",
        T,
        "Running",
        support::phase_is(JobPhase::Running),
    )
    .await;
    for change in ["managedjobs.dev/shard=a", "managedjobs.dev/shard-"] {
        let (ok, out) = support::kubectl(
            cp,
            &[
                "label",
                "-n",
                &ns.name,
                "mj",
                "pinned",
                change,
                "--overwrite",
            ],
        );
        assert!(!ok, "{change} was accepted: {out}");
        assert!(
            out.contains("metadata.labels[managedjobs.dev/shard] is fixed when the job is created"),
            "{out}"
        );
    }
    // A label no operator could take is refused at create.
    let (ok, out) = support::kubectl(
        cp,
        &[
            "label",
            "-n",
            &ns.name,
            "mj",
            "pinned",
            "managedjobs.dev/shard=B_1",
            "--overwrite",
        ],
    );
    assert!(!ok && out.contains("is not a shard name"), "{out}");
    support::cancel(&client, &ns.name, "pinned").await;
    support::wait_status(&client, &ns.name, "pinned", T, "finished", terminal).await;

    futures::stream::iter(0..JOBS)
        .map(|i| {
            let api = api.clone();
            async move {
                let mj = job(&format!("job-{i:03}"), shard_of(i), "sleep 0.2");
                api.create(&PostParams::default(), &mj).await.unwrap();
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;

    // Kill shard a (the operator and its job controllers) once it has finished some jobs.
    let finished_of = |shard: &str| {
        let s = seen.lock().unwrap();
        s.status
            .iter()
            .filter(|(n, st)| {
                n.starts_with("job-")
                    && s.shard.get(*n).map(String::as_str) == Some(shard)
                    && terminal(st)
            })
            .count()
    };
    wait_until("shard a finishing 10 jobs", T, || finished_of("a") >= 10).await;
    shard_a.kill_with_job_controllers();
    // Status writes sent before the kill may still reach the watch.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let frozen: BTreeMap<String, Option<JobPhase>> = {
        let s = seen.lock().unwrap();
        s.status
            .iter()
            .filter(|(n, _)| s.shard.get(*n).map(String::as_str) == Some("a"))
            .map(|(n, st)| (n.clone(), st.phase))
            .collect()
    };
    let per_shard = JOBS / 3;
    wait_until("the default shard and shard b finishing", T, || {
        finished_of("") >= per_shard && finished_of("b") >= per_shard
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    {
        let s = seen.lock().unwrap();
        let now: BTreeMap<String, Option<JobPhase>> = s
            .status
            .iter()
            .filter(|(n, _)| s.shard.get(*n).map(String::as_str) == Some("a"))
            .map(|(n, st)| (n.clone(), st.phase))
            .collect();
        assert_eq!(now, frozen, "another instance touched shard a's jobs");
    }
    assert!(finished_of("a") < per_shard, "shard a finished while dead");
    shard_a.start_again();
    wait_until("shard a finishing after its restart", T, || {
        finished_of("a") >= per_shard
    })
    .await;
    watch.abort();

    {
        let s = seen.lock().unwrap();
        let jobs: Vec<(&String, &ManagedJobStatus)> = s
            .status
            .iter()
            .filter(|(n, _)| n.starts_with("job-"))
            .collect();
        assert_eq!(jobs.len(), JOBS);
        for (name, st) in &jobs {
            assert_eq!(
                st.phase,
                Some(JobPhase::Succeeded),
                "{name}: {:?}",
                st.message
            );
            assert_eq!(
                st.attempt, 1,
                "{name} ran once: {:?}; attempts {:?}",
                st.message, st.attempts
            );
        }
        for (shard, (launching, live)) in &s.peak {
            assert!(
                *launching <= LAUNCH_CAP && *live <= RUN_CAP,
                "shard {shard:?} showed {launching} launching, {live} holding run slots"
            );
        }
    }

    // Each job in exactly one store: the one of its label.
    let labels: HashMap<String, Option<String>> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|mj| (mj.uid().unwrap(), mj.labels().get(LABEL_SHARD).cloned()))
        .collect();
    let stores = [
        (None, store_uids(&default)),
        (Some("a"), store_uids(&shard_a)),
        (Some("b"), store_uids(&shard_b)),
    ];
    let mut all = BTreeSet::new();
    for (shard, uids) in &stores {
        for uid in uids {
            assert!(all.insert(uid.clone()), "job {uid} is in two stores");
            let label = labels[uid].as_deref();
            assert!(
                label == *shard,
                "job {uid} labelled {label:?} is in the store of {shard:?}"
            );
        }
    }
    assert_eq!(all.len(), JOBS + 1);

    // Every shard's view through the API.
    let out = std::process::Command::new(support::binary())
        .args(["queue", "--all-shards", "--all", "--namespace", &ns.name])
        .env("KUBECONFIG", &cp.kubeconfig)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "the default shard: 200 jobs; launching 0, alive 0; queued 0; suspended 0; finished 200; no status yet 0",
        "shard a: 200 jobs; launching 0, alive 0; queued 0; suspended 0; finished 200; no status yet 0",
        "shard b: 201 jobs; launching 0, alive 0; queued 0; suspended 0; finished 201; no status yet 0",
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }

    // A shard whose store is lost comes back with its own jobs (and no other's).
    shard_a.kill_with_job_controllers();
    std::fs::remove_dir_all(shard_a.state_path()).unwrap();
    std::fs::create_dir_all(shard_a.state_path()).unwrap();
    shard_a.start_again();
    assert!(
        shard_a.wait_exit(Duration::from_secs(8)).is_none(),
        "shard a did not come back: {}",
        shard_a.log()
    );
    assert_eq!(
        store_uids(&shard_a),
        stores[1].1,
        "shard a restored its own jobs"
    );

    // A shard refuses another shard's state dir.
    default.kill();
    let mut intruder =
        support::OperatorProcess::start_sharing(cp, &ns.name, &["--shard", "b"], &default);
    let status = intruder.wait_exit(Duration::from_secs(30));
    assert!(status.is_some_and(|s| !s.success()), "{}", intruder.log());
    assert!(
        intruder
            .log()
            .contains("belongs to the default shard, not to shard b"),
        "{}",
        intruder.log()
    );
}
