//! Issue 30, class 2: no object too big for its status or its deletion, on the real dev control
//! plane. The API refuses, naming the bound, a spec whose scripts and environment (tasks
//! included) would leave no room in etcd for its largest status and its metadata
//! (`api::MAX_SPEC_PAYLOAD`); the largest spec it accepts runs, shows its status and is deleted;
//! and an object that leaves no room for its full status anyway (a pod template is not bounded)
//! still shows that it ended (its minimal status), says why in an Event, and can be deleted.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use managed_jobs::api::{ETCD_OBJECT_BYTES, JobPhase, MAX_SPEC_PAYLOAD, ManagedJob};

const T: Duration = Duration::from_secs(120);

/// A local pipeline of `tasks` tasks, each with a `run` of `run` bytes and a `setup` of
/// `setup` bytes (shell comments after `true`), and `spec.env` of `env` bytes of names and
/// values (values of at most 32,766 bytes).
fn pipeline(name: &str, tasks: usize, run: usize, setup: usize, env: usize) -> ManagedJob {
    let script = |n: usize| format!("true #{}", "x".repeat(n - 6));
    let mut vars = Vec::new();
    let mut left = env;
    let mut i = 0;
    while left > 0 {
        let name = format!("E{i}");
        let value = (left - name.len()).min(32_766);
        left -= name.len() + value;
        vars.push(serde_json::json!({"name": name, "value": "v".repeat(value)}));
        i += 1;
    }
    let tasks: Vec<serde_json::Value> = (0..tasks)
        .map(|i| serde_json::json!({"name": format!("t{i}"), "run": script(run), "setup": script(setup)}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "apiVersion": "managedjobs.dev/v1alpha1",
        "kind": "ManagedJob",
        "metadata": {"name": name},
        "spec": {"env": vars, "tasks": tasks},
    }))
    .unwrap()
}

/// The issue's inputs: 11 tasks of a 63,990-byte `run` and a 64,000-byte `setup` with 163,136
/// bytes of `spec.env` (every per-field bound holds); before, it was accepted, its status never
/// written (`etcdserver: request is too large`) and its deletion hung; the same job 4,096 bytes
/// smaller got its status but could not be deleted at all. Both are refused now, the message
/// naming the bound; the largest spec accepted (exactly the bound) and one character more.
#[tokio::test]
async fn the_issues_inputs_are_refused_naming_the_bound() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "sizes").await;
    let api = Api::<ManagedJob>::namespaced(client.clone(), &ns.name);
    for (name, env) in [("issue", 163_136), ("issue-smaller", 163_136 - 4_096)] {
        let mj = pipeline(name, 11, 63_990, 64_000, env);
        assert_eq!(
            managed_jobs::api::spec_payload(&mj.spec),
            11 * 127_990 + env
        );
        let err = api
            .create(&PostParams::default(), &mj)
            .await
            .expect_err("refused");
        let text = err.to_string();
        assert!(
            text.contains(&format!(
                "more than {MAX_SPEC_PAYLOAD} characters of scripts and environment"
            )) && text.contains("every task's run, setup and env")
                && text.contains(&ETCD_OBJECT_BYTES.to_string()),
            "{name}: {text}"
        );
    }
    // One character over the bound: refused; at the bound: accepted.
    let over = pipeline("over", 8, 65_536, 65_536, 1 + 3);
    assert_eq!(
        managed_jobs::api::spec_payload(&over.spec),
        MAX_SPEC_PAYLOAD + 4
    );
    assert!(api.create(&PostParams::default(), &over).await.is_err());
    let at = pipeline("at-the-bound", 8, 65_536, 65_536, 0);
    assert_eq!(managed_jobs::api::spec_payload(&at.spec), MAX_SPEC_PAYLOAD);
    api.create(&PostParams::default(), &at)
        .await
        .expect("the largest spec is accepted");
}

/// The largest spec the API accepts (a pipeline of 8 tasks of 64 KiB scripts) runs, shows
/// every status in full and is deleted: the bound leaves room for its largest status and its
/// deletion.
#[tokio::test]
async fn the_largest_spec_accepted_shows_its_status_and_is_deleted() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "largest").await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let api = Api::<ManagedJob>::namespaced(client.clone(), &ns.name);
    api.create(
        &PostParams::default(),
        &pipeline("largest", 8, 65_536, 65_536, 0),
    )
    .await
    .expect("accepted");
    let done = support::wait_status(&client, &ns.name, "largest", T, "Succeeded", |s| {
        s.phase.is_some_and(|p| p.is_terminal())
    })
    .await;
    let s = done.status.unwrap();
    assert_eq!(s.phase, Some(JobPhase::Succeeded), "{:?}", s.message);
    assert_eq!(s.tasks.len(), 8, "the full status, every task's record");
    assert_eq!(s.observed_generation, Some(1));
    api.delete("largest", &DeleteParams::default())
        .await
        .expect("deleted");
    support::wait_gone(&client, &ns.name, "largest", T).await;
}

fn padded_pod_job(name: &str, pad: usize) -> ManagedJob {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "managedjobs.dev/v1alpha1",
        "kind": "ManagedJob",
        "metadata": {"name": name},
        "spec": {"template": {
            "metadata": {"annotations": {"managedjobs.dev/complete-after": "2s"}},
            "spec": {"containers": [{
                "name": "main", "image": "busybox",
                "env": [{"name": "PAD", "value": "p".repeat(pad)}],
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
            }]},
        }},
    }))
    .unwrap()
}

/// The bytes `mj` takes as the API returns it, without its status.
fn stored_bytes(mut mj: ManagedJob) -> usize {
    mj.status = None;
    serde_json::to_vec(&mj).unwrap().len()
}

/// A pod job whose template (which the schema leaves open) makes its object take all but
/// about 4 KB of etcd's limit: its full status (about 3 KB, with the 8 KiB the operator keeps
/// free) does not fit. It still shows that it ended (its minimal status: phase and conditions,
/// so GitOps tools see it finish), says why in a Warning Event `StatusTooLarge`, and is
/// deleted (its finalizer released, room kept for the deletion); one Pod.
#[tokio::test]
async fn a_job_without_room_for_its_full_status_still_ends_says_why_and_is_deleted() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "nostatus").await;
    let api = Api::<ManagedJob>::namespaced(client.clone(), &ns.name);
    // What the object takes beside its pad, measured on a small one (no operator runs yet).
    let probe = api
        .create(&PostParams::default(), &padded_pod_job("probe", 1_000))
        .await
        .expect("probe");
    let overhead = stored_bytes(probe) - 1_000;
    api.patch(
        "probe",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    api.delete("probe", &DeleteParams::default()).await.unwrap();
    let pad = ETCD_OBJECT_BYTES - 4_000 - overhead;
    let created = api
        .create(&PostParams::default(), &padded_pod_job("huge", pad))
        .await
        .expect("an object within etcd's limit is accepted");
    let size = stored_bytes(created);
    assert!(
        (ETCD_OBJECT_BYTES - 4_300..=ETCD_OBJECT_BYTES - 3_700).contains(&size),
        "{size} bytes"
    );
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let (watch, names) = support::watch_pod_names(&client, &ns.name);
    let done = support::wait_status(&client, &ns.name, "huge", T, "Succeeded", |s| {
        s.phase.is_some_and(|p| p.is_terminal())
    })
    .await;
    let s = done.status.unwrap();
    assert_eq!(s.phase, Some(JobPhase::Succeeded), "{:?}", s.message);
    assert!(
        s.conditions
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True"),
        "{:?}",
        s.conditions
    );
    assert!(
        s.attempts.is_empty(),
        "the minimal status: {:?}",
        s.attempts
    );
    let event = support::wait_event(&client, &ns.name, "huge", "StatusTooLarge", T).await;
    let note = event.message.unwrap_or_default();
    assert!(
        note.contains("only its minimal status is written") && note.contains("can be deleted"),
        "{note}"
    );
    api.delete("huge", &DeleteParams::default())
        .await
        .expect("the deletion fits");
    support::wait_gone(&client, &ns.name, "huge", T).await;
    watch.abort();
    let seen = names.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "one Pod: {seen:?}");
    let _: BTreeSet<String> = seen;
}
