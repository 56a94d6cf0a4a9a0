//! The chart's RBAC is enough, and no more: the operator binary, running with a token of the
//! chart's ServiceAccount (real RBAC enforced by the dev control plane), completes a pod job and a
//! cancellation, holding its Lease; verbs it does not need are denied. Users installed by hand
//! (`kubectl apply -f crds/`) get ManagedJobs with the built-in `view` and `edit` roles.

mod support;

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use managed_jobs::api::JobPhase;

const T: Duration = Duration::from_secs(60);

fn helm() -> Option<std::path::PathBuf> {
    let out = Command::new(support::root().join("hack/controlplane.sh"))
        .args(["bin-dir", "helm"])
        .output()
        .ok()?;
    let path = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("helm");
    if !path.exists() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but helm is not built: hack/controlplane.sh build helm"
        );
        eprintln!("\n*** SKIPPED: the RBAC test needs helm: hack/controlplane.sh build helm ***\n");
        return None;
    }
    Some(path)
}

fn kubectl_stdin(cp: &support::ControlPlane, args: &[&str], input: &str) -> (bool, String) {
    let mut child = Command::new(support::root().join("hack/controlplane.sh"))
        .arg("kubectl")
        .args(args)
        .env("KUBECONFIG", &cp.kubeconfig)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// The chart's ServiceAccount and RBAC documents, as `helm install` of release `t` in `ns`
/// would create them.
fn chart_rbac(helm: &std::path::Path, ns: &str) -> Vec<String> {
    let out = Command::new(helm)
        .args(["template", "t"])
        .arg(support::root().join("charts/managed-jobs"))
        .args(["-n", ns, "--set", "crds.enabled=false"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = String::from_utf8(out.stdout).unwrap();
    let kinds = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ];
    let rbac: Vec<String> = rendered
        .split("\n---")
        .filter(|doc| {
            kinds
                .iter()
                .any(|k| doc.contains(&format!("\nkind: {k}\n")))
        })
        .map(str::to_string)
        .collect();
    assert!(rbac.len() >= 3, "the chart rendered no RBAC:\n{rendered}");
    rbac
}

/// The cluster-scoped objects the chart creates for release `t` in a namespace, deleted when
/// dropped (even when the test fails): they outlive the namespace.
struct ClusterRbac {
    cp: &'static support::ControlPlane,
    namespace: String,
}

impl Drop for ClusterRbac {
    fn drop(&mut self) {
        for suffix in [
            "",
            "-queues",
            "-nodes",
            "-auth-delegator",
            "-view",
            "-edit",
            "-visibility-every-namespace",
        ] {
            let name = format!("{}-t-managed-jobs{suffix}", self.namespace);
            for kind in ["clusterrole", "clusterrolebinding"] {
                support::kubectl(self.cp, &["delete", kind, &name, "--ignore-not-found"]);
            }
        }
    }
}

/// A kubeconfig of the control plane with a token of ServiceAccount `sa` of `ns` (in `dir`).
fn as_service_account(
    cp: &support::ControlPlane,
    ns: &str,
    sa: &str,
    dir: &std::path::Path,
) -> support::ControlPlane {
    let (ok, token) = support::kubectl(cp, &["create", "token", sa, "-n", ns]);
    assert!(ok, "{token}");
    let admin: serde_json::Value =
        serde_norway::from_str(&std::fs::read_to_string(&cp.kubeconfig).unwrap()).unwrap();
    let mut config = admin.clone();
    config["users"] =
        serde_json::json!([{ "name": "operator", "user": { "token": token.trim() } }]);
    config["contexts"][0]["context"]["user"] = serde_json::json!("operator");
    let path = dir.join("kubeconfig");
    std::fs::write(&path, serde_norway::to_string(&config).unwrap()).unwrap();
    support::ControlPlane { kubeconfig: path }
}

/// What `kubectl auth can-i VERB RESOURCE -n NS --as WHO` answers.
fn can_i(cp: &support::ControlPlane, verb: &str, resource: &str, ns: &str, who: &str) -> String {
    let (_, answer) = support::kubectl(
        cp,
        &["auth", "can-i", verb, resource, "-n", ns, "--as", who],
    );
    answer.lines().next().unwrap_or("").trim().to_string()
}

/// What the operator logs, once, when it may not watch Nodes.
const NODES_FORBIDDEN: &str = "may not list and watch Nodes";

/// A pod job with the kwok fates `annotations` on its template.
fn pod_job(name: &str, annotations: &str) -> String {
    format!(
        "apiVersion: managedjobs.dev/v1alpha1\nkind: ManagedJob\nmetadata:\n  name: {name}\nspec:\n  template:\n    metadata:\n      annotations: {{{annotations}}}\n    spec:\n      containers:\n        - name: main\n          image: busybox\n"
    )
}

#[tokio::test]
async fn the_charts_service_account_runs_pod_jobs_and_nothing_more() {
    let cp = control_plane_or_skip!();
    let Some(helm) = helm() else { return };
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "rbac").await;

    // The chart's ServiceAccount and RBAC, as `helm install` would create them.
    let rbac = chart_rbac(&helm, &ns.name);
    let _cluster = ClusterRbac {
        cp,
        namespace: ns.name.clone(),
    };
    let (ok, text) = kubectl_stdin(
        cp,
        // Every object names its namespace (the release's, or kube-system for the visibility
        // API's reader binding).
        &["apply", "-f", "-"],
        &rbac.join("\n---\n"),
    );
    assert!(ok, "applying the chart's RBAC: {text}");
    let sa = "t-managed-jobs";

    // Verbs the operator does not use are denied.
    let who = format!("system:serviceaccount:{}:{sa}", ns.name);
    for (verb, resource, expected) in [
        ("patch", "managedjobs.managedjobs.dev", "yes"),
        ("create", "pods", "yes"),
        ("update", "pods", "no"),
        // A multi-node job's headless Service and its attempts' PodGroups (kube-scheduler's
        // gang): created (and the PodGroups deleted), never changed; nothing else of Services.
        ("create", "services", "yes"),
        ("delete", "services", "no"),
        ("update", "services", "no"),
        ("create", "podgroups.scheduling.k8s.io", "yes"),
        ("delete", "podgroups.scheduling.k8s.io", "yes"),
        ("patch", "podgroups.scheduling.k8s.io", "no"),
        ("get", "secrets", "no"),
        // Nodes are watched (a lost node ends its Pods' attempts), and read (is the node of a
        // Pod stuck terminating Ready?); never changed.
        ("get", "nodes", "yes"),
        ("list", "nodes", "yes"),
        ("watch", "nodes", "yes"),
        ("delete", "nodes", "no"),
        ("patch", "nodes", "no"),
        ("update", "nodes/status", "no"),
        ("create", "managedjobs.managedjobs.dev", "no"),
        // Leader election (kube-lease-manager): get, create, and patches to take or renew.
        ("patch", "leases.coordination.k8s.io", "yes"),
        ("create", "leases.coordination.k8s.io", "yes"),
        ("delete", "leases.coordination.k8s.io", "no"),
        // The claims (one owner per job): the claim Leases are watched, created, and taken or
        // renewed by update, by name only.
        ("watch", "leases.coordination.k8s.io", "yes"),
        (
            "update",
            "leases.coordination.k8s.io/managed-jobs-owner",
            "yes",
        ),
        (
            "update",
            "leases.coordination.k8s.io/kube-controller-manager",
            "no",
        ),
        (
            "get",
            "leases.coordination.k8s.io/managed-jobs-owner",
            "yes",
        ),
        // Queues: watched, their status applied; never created, changed or deleted.
        ("watch", "managedjobqueues.managedjobs.dev", "yes"),
        ("create", "managedjobqueues.managedjobs.dev", "no"),
        ("patch", "managedjobqueues.managedjobs.dev", "no"),
        ("delete", "managedjobqueues.managedjobs.dev", "no"),
        // The node pools queues name: read only. Pods of every namespace are listed for
        // admission in resources (what each node has free), never changed outside ours.
        ("watch", "managedjobpools.managedjobs.dev", "yes"),
        ("create", "managedjobpools.managedjobs.dev", "no"),
        ("list", "pods", "yes"),
        // Which namespaces a queue admits: read only.
        ("list", "namespaces", "yes"),
        ("patch", "namespaces", "no"),
        // The visibility API: who a caller is and what it may list (system:auth-delegator).
        ("create", "tokenreviews.authentication.k8s.io", "yes"),
        ("create", "subjectaccessreviews.authorization.k8s.io", "yes"),
        (
            "create",
            "localsubjectaccessreviews.authorization.k8s.io",
            "no",
        ),
        ("get", "configmaps", "no"),
        // Events through the core API (they carry lastTimestamp, which kubectl sorts by).
        ("create", "events", "yes"),
        ("delete", "events", "no"),
    ] {
        let (_, answer) = support::kubectl(
            cp,
            &[
                "auth", "can-i", verb, resource, "-n", &ns.name, "--as", &who,
            ],
        );
        let answer = answer.lines().next().unwrap_or("").trim();
        assert_eq!(answer, expected, "can {sa} {verb} {resource}?");
    }
    // Pods' subresources: their logs are read (kept in the state dir when an attempt ends);
    // nothing is run in a Pod or attached to it.
    for (verb, resource, subresource, expected) in [
        ("get", "pods", "log", "yes"),
        ("create", "pods", "exec", "no"),
        ("get", "pods", "exec", "no"),
        ("create", "pods", "attach", "no"),
        ("create", "pods", "portforward", "no"),
        ("create", "pods", "eviction", "no"),
        ("patch", "pods", "status", "no"),
    ] {
        let (_, answer) = support::kubectl(
            cp,
            &[
                "auth",
                "can-i",
                verb,
                resource,
                &format!("--subresource={subresource}"),
                "-n",
                &ns.name,
                "--as",
                &who,
            ],
        );
        let answer = answer.lines().next().unwrap_or("").trim();
        assert_eq!(
            answer, expected,
            "can {sa} {verb} {resource}/{subresource}?"
        );
    }
    for (verb, resource, expected) in [
        ("patch", "managedjobqueues.managedjobs.dev", "yes"),
        ("update", "managedjobqueues.managedjobs.dev", "no"),
    ] {
        let (_, answer) = support::kubectl(
            cp,
            &[
                "auth",
                "can-i",
                verb,
                resource,
                "--subresource=status",
                "--as",
                &who,
            ],
        );
        let answer = answer.lines().next().unwrap_or("").trim();
        assert_eq!(answer, expected, "can {sa} {verb} {resource}/status?");
    }
    // The front proxy's CA and header names (extension-apiserver-authentication-reader), and
    // nothing else of kube-system.
    for (object, expected) in [
        ("configmaps/extension-apiserver-authentication", "yes"),
        ("configmaps/kube-root-ca.crt", "no"),
        ("secrets", "no"),
    ] {
        let (_, answer) = support::kubectl(
            cp,
            &[
                "auth",
                "can-i",
                "get",
                object,
                "-n",
                "kube-system",
                "--as",
                &who,
            ],
        );
        let answer = answer.lines().next().unwrap_or("").trim();
        assert_eq!(answer, expected, "can {sa} get {object} in kube-system?");
    }

    // A kubeconfig with a token of that ServiceAccount.
    let dir = tempfile::tempdir().unwrap();
    let as_sa = as_service_account(cp, &ns.name, sa, dir.path());

    // With leader election on, as the chart runs it: the Lease is taken with the chart's Role.
    let op = support::OperatorProcess::start(
        &as_sa,
        &ns.name,
        &[
            "--executors",
            "pod",
            "--leader-election",
            "--leader-election-namespace",
            &ns.name,
        ],
    );
    let job = pod_job;
    support::create_yaml(
        &client,
        &ns.name,
        &job("done", r#""managedjobs.dev/complete-after": "1s""#),
    )
    .await;
    support::create_yaml(&client, &ns.name, &job("stopped", "")).await;
    support::wait_status(&client, &ns.name, "done", T, "Succeeded", |s| {
        s.phase == Some(JobPhase::Succeeded)
    })
    .await;
    support::wait_status(&client, &ns.name, "stopped", T, "Running", |s| {
        s.phase == Some(JobPhase::Running)
    })
    .await;
    support::cancel(&client, &ns.name, "stopped").await;
    support::wait_status(&client, &ns.name, "stopped", T, "Cancelled", |s| {
        s.phase == Some(JobPhase::Cancelled)
    })
    .await;
    // Each job's controller asked for its Pod's log as the attempt ended (or before the
    // cancel stopped it), and was allowed to: kwok's nodes serve no logs, but the API server
    // authorized the request before it asked the node.
    let logs = op.state_path().join("logs");
    let mut asked = 0;
    for entry in std::fs::read_dir(&logs).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|x| x != "log") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        asked += text
            .lines()
            .filter(|l| l.contains("kept the end of the attempt's logs"))
            .count();
        let keeping = |l: &&str| l.contains("the container's log") || l.contains("its logs");
        for line in text.lines().filter(keeping) {
            assert!(
                !line.contains("forbidden") && !line.contains("403"),
                "{}: {line}",
                path.display()
            );
        }
    }
    assert!(asked >= 2, "a keep per job: {asked}");
    // The Node watch was allowed.
    let log = op.log();
    assert!(!log.contains(NODES_FORBIDDEN), "{log}");
}

/// Without the chart's Node permission (its `-nodes` ClusterRoleBinding left out, as a user's
/// own RBAC may), the operator says so once, loudly, and goes on as before: it neither exits
/// nor keeps retrying aloud, and its pod jobs run.
#[tokio::test]
async fn without_the_node_permission_the_operator_says_so_once_and_runs_jobs() {
    let cp = control_plane_or_skip!();
    let Some(helm) = helm() else { return };
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "rbacnodes").await;
    let rbac: Vec<String> = chart_rbac(&helm, &ns.name)
        .into_iter()
        .filter(|doc| {
            !(doc.contains("\nkind: ClusterRoleBinding\n")
                && doc.contains(&format!("name: {}-t-managed-jobs-nodes\n", ns.name)))
        })
        .collect();
    let _cluster = ClusterRbac {
        cp,
        namespace: ns.name.clone(),
    };
    let (ok, text) = kubectl_stdin(cp, &["apply", "-f", "-"], &rbac.join("\n---\n"));
    assert!(ok, "applying the chart's RBAC: {text}");
    let sa = "t-managed-jobs";
    let who = format!("system:serviceaccount:{}:{sa}", ns.name);
    for verb in ["list", "watch"] {
        assert_eq!(can_i(cp, verb, "nodes", &ns.name, &who), "no");
    }
    let dir = tempfile::tempdir().unwrap();
    let as_sa = as_service_account(cp, &ns.name, sa, dir.path());
    let mut op = support::OperatorProcess::start(&as_sa, &ns.name, &["--executors", "pod"]);
    support::create_yaml(
        &client,
        &ns.name,
        &pod_job("done", r#""managedjobs.dev/complete-after": "1s""#),
    )
    .await;
    support::wait_status(&client, &ns.name, "done", T, "Succeeded", |s| {
        s.phase == Some(JobPhase::Succeeded)
    })
    .await;
    // Long enough for a few retries of an ordinary watch (every 2 s at most).
    tokio::time::sleep(Duration::from_secs(6)).await;
    let log = op.log();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(NODES_FORBIDDEN))
        .collect();
    assert_eq!(said.len(), 1, "said once: {said:#?}");
    assert!(said[0].contains("ERROR"), "loudly: {}", said[0]);
    assert!(
        op.wait_exit(Duration::from_millis(100)).is_none(),
        "the operator runs on"
    );
}

/// Installed by hand (`kubectl apply -f crds/`, as docs/tasks/install.md says; the support
/// module applies exactly that), a user with only the built-in `edit` in a namespace lists,
/// creates, changes and deletes the ManagedJobs there, and one with only `view` lists them and
/// may create none: the ClusterRoles of `crds/managedjobs.dev_user-roles.yaml` are aggregated
/// into the built-in roles. Neither sees another namespace's jobs.
#[tokio::test]
async fn a_namespace_user_with_only_edit_or_view_uses_managedjobs_there_after_kubectl_apply_crds() {
    use support::visibility::{self as vis, User};
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "rbac-team").await;
    let other = support::TestNamespace::new(&client, cp, "rbac-other").await;
    let editor = User::new(cp, &ns.name, "editor");
    vis::grant(cp, "edit", &ns.name, &editor);
    let viewer = User::new(cp, &ns.name, "viewer");
    vis::grant(cp, "view", &ns.name, &viewer);
    let hello = support::root().join("examples/hello.yaml");
    let hello = hello.to_str().unwrap();
    let as_user = |u: &User, args: &[&str]| support::kubectl(&u.control_plane(), args);

    // edit: create, list, get, change, delete in its namespace.
    let (ok, out) = as_user(&editor, &["create", "-f", hello]);
    assert!(ok, "edit creates a ManagedJob in {}: {out}", ns.name);
    let (ok, out) = as_user(&editor, &["get", "mj"]);
    assert!(ok && out.contains("hello"), "edit lists them: {out}");
    let (ok, out) = as_user(&editor, &["get", "mj", "hello", "-o", "name"]);
    assert!(ok, "{out}");
    let (ok, out) = as_user(
        &editor,
        &[
            "patch",
            "mj",
            "hello",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"priority":5}}"#,
        ],
    );
    assert!(ok, "edit changes a ManagedJob: {out}");
    // view: list and get, never create or delete.
    let (ok, out) = as_user(&viewer, &["get", "mj"]);
    assert!(ok && out.contains("hello"), "view lists them: {out}");
    let renamed = std::fs::read_to_string(hello)
        .unwrap()
        .replace("name: hello", "name: hello-from-a-viewer");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), renamed).unwrap();
    let (ok, out) = as_user(&viewer, &["create", "-f", file.path().to_str().unwrap()]);
    assert!(
        !ok && out.contains("Forbidden"),
        "view creates nothing: {out}"
    );
    let (ok, out) = as_user(&viewer, &["delete", "mj", "hello", "--wait=false"]);
    assert!(
        !ok && out.contains("Forbidden"),
        "view deletes nothing: {out}"
    );
    // Nothing of another namespace.
    for user in [&editor, &viewer] {
        let (ok, out) = as_user(user, &["get", "mj", "-n", &other.name]);
        assert!(!ok && out.contains("Forbidden"), "{}: {out}", user.username);
    }
    let (ok, out) = as_user(&editor, &["delete", "mj", "hello", "--wait=false"]);
    assert!(ok, "edit deletes a ManagedJob: {out}");
    // No operator runs here: the admin releases the finalizer the admission policy added.
    support::kubectl(
        cp,
        &[
            "patch",
            "mj",
            "hello",
            "-n",
            &ns.name,
            "--type",
            "merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ],
    );
}
