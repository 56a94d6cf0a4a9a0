//! Issue 21, class 9 (a missing CRD), on the real dev control plane. This deletes the
//! ManagedJob CRD, which every other test needs: it lives alone in its test binary (cargo runs
//! test binaries one after another) and installs the CRD again however it ends.
//!
//! Started without the CRD, the operator exits with a message that names the CRD and how to
//! install it (before: `404 page not found: Failed to parse error data`). Running, it becomes
//! not ready, with one error line, when the CRD is deleted (before: nothing logged, still
//! ready), and ready again once the CRD is back.

mod support;

use std::time::{Duration, Instant};

const CRD: &str = "managedjobs.managedjobs.dev";

/// Installs the CRDs from `crds/` again when dropped (and when asked), and waits until they
/// are served.
struct Reinstall<'a> {
    cp: &'a support::ControlPlane,
}

impl Reinstall<'_> {
    fn now(&self) {
        let crds = support::root().join("crds");
        let (ok, out) = support::kubectl(self.cp, &["apply", "-f", crds.to_str().unwrap()]);
        assert!(ok, "installing the CRDs: {out}");
        let (ok, out) = support::kubectl(
            self.cp,
            &[
                "wait",
                "--for=condition=Established",
                &format!("crd/{CRD}"),
                "--timeout=60s",
            ],
        );
        assert!(ok, "{out}");
        let start = Instant::now();
        while !support::kubectl(self.cp, &["get", "managedjobs", "-A"]).0 {
            assert!(start.elapsed() < Duration::from_secs(60), "never served");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Reinstall<'_> {
    fn drop(&mut self) {
        self.now();
    }
}

/// Deletes the ManagedJob CRD, first dropping every ManagedJob's finalizer (their operators
/// may be gone: the CRD would stay Terminating), and waits until the API no longer serves it.
fn delete_crd(cp: &support::ControlPlane) {
    let (_, names) = support::kubectl(
        cp,
        &[
            "get",
            "managedjobs",
            "-A",
            "-o",
            "jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name}{\"\\n\"}{end}",
        ],
    );
    for line in names.lines().filter(|l| l.contains('/')) {
        let (ns, name) = line.split_once('/').unwrap();
        support::kubectl(
            cp,
            &[
                "-n",
                ns,
                "patch",
                "managedjob",
                name,
                "--type=merge",
                "-p",
                r#"{"metadata":{"finalizers":null}}"#,
            ],
        );
    }
    let (ok, out) = support::kubectl(cp, &["delete", "crd", CRD, "--timeout=120s"]);
    assert!(ok, "deleting the CRD: {out}");
    let start = Instant::now();
    // The group stays served while the queue CRD (managedjobqueues) is installed: wait until
    // its resource list no longer names managedjobs.
    while {
        let (ok, list) = support::kubectl(cp, &["get", "--raw", "/apis/managedjobs.dev/v1alpha1"]);
        ok && list.contains(r#""name":"managedjobs""#)
    } {
        assert!(start.elapsed() < Duration::from_secs(60), "still served");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[tokio::test]
async fn a_missing_crd_is_named_at_start_and_makes_a_running_operator_not_ready() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "nocrd").await;
    let reinstall = Reinstall { cp };
    delete_crd(cp);

    // Started without it: a clear error, naming the CRD and how to install it.
    let mut op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let status = op
        .wait_exit(Duration::from_secs(60))
        .expect("the operator exits without its CRD");
    assert!(!status.success());
    let log = op.log();
    assert!(
        log.contains(CRD) && log.contains("kubectl apply -f crds/"),
        "{log}"
    );
    assert!(!log.contains("Failed to parse error data"), "{log}");

    // Running: ready; without the CRD, not ready and saying why; ready again once it is back.
    reinstall.now();
    let port = support::free_port();
    let addr = format!("127.0.0.1:{port}");
    let op = support::OperatorProcess::start(cp, &ns.name, &["--metrics-addr", &addr]);
    let ready = |want: u16, timeout: Duration| {
        let start = Instant::now();
        loop {
            let (code, body) = support::http_get(port, "/readyz");
            if code == want {
                return body;
            }
            assert!(
                start.elapsed() < timeout,
                "/readyz never answered {want}: {code} {body}\n{}",
                op.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    ready(200, Duration::from_secs(60));
    delete_crd(cp);
    let body = ready(503, Duration::from_secs(60));
    assert!(body.contains(CRD), "{body}");
    let errors = op
        .log()
        .lines()
        .filter(|l| l.contains("ERROR") && l.contains(CRD))
        .count();
    assert_eq!(
        errors,
        1,
        "one error line, not one per retry:\n{}",
        op.log()
    );
    reinstall.now();
    ready(200, Duration::from_secs(120));
}
