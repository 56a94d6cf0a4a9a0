//! The Helm chart: `charts/managed-jobs/tests/chart-test.sh` (CRD in sync, `helm lint --strict`,
//! `helm template | kubectl apply --dry-run=server` for the default and every ci/ values file)
//! against the dev control plane, and the operator binary accepts every flag the chart renders.

mod support;

use std::path::PathBuf;
use std::process::Command;

/// The path of `binary`, built by `hack/controlplane.sh build <tool>`, if it was built.
fn built(tool: &str, binary: &str) -> Option<PathBuf> {
    let out = Command::new(support::root().join("hack/controlplane.sh"))
        .args(["bin-dir", tool])
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join(binary);
    path.exists().then_some(path)
}

fn helm() -> Option<PathBuf> {
    let helm = built("helm", "helm");
    if helm.is_none() {
        assert!(
            std::env::var("CI").unwrap_or_default().is_empty(),
            "CI is set but helm is not built: hack/controlplane.sh build helm"
        );
        support::record_skip("chart tests need helm: hack/controlplane.sh build helm");
    }
    helm
}

#[test]
fn chart_lints_renders_and_dry_runs_on_the_api_server() {
    let Some(cp) = support::control_plane() else {
        support::record_skip("chart_lints_renders_and_dry_runs_on_the_api_server");
        return;
    };
    let Some(helm) = helm() else { return };
    let kubectl = built("kubernetes", "kubectl").expect("kubectl is built with the control plane");
    let out = Command::new(support::root().join("charts/managed-jobs/tests/chart-test.sh"))
        .env("KUBECONFIG", &cp.kubeconfig)
        .env("HELM", &helm)
        .env("KUBECTL", &kubectl)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "chart-test.sh failed:\n{text}");
}

#[test]
fn the_binary_accepts_every_flag_the_chart_renders() {
    let Some(helm) = helm() else { return };
    let chart = support::root().join("charts/managed-jobs");
    for values in [None, Some("ci/all-options-values.yaml")] {
        let mut cmd = Command::new(&helm);
        cmd.args(["template", "t"])
            .arg(&chart)
            .args(["--show-only", "templates/statefulset.yaml"]);
        if let Some(v) = values {
            cmd.arg("-f").arg(chart.join(v));
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let sts: serde_json::Value = serde_norway::from_slice(&out.stdout).unwrap();
        let container = &sts["spec"]["template"]["spec"]["containers"][0];
        let args: Vec<String> = container["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().replace("$(POD_NAMESPACE)", "ns"))
            .collect();
        assert_eq!(args[0], "run", "{args:?}");
        // clap validates every argument before it acts on --help.
        let out = Command::new(support::binary())
            .args(&args)
            .arg("--help")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the binary refuses the chart's args {args:?} ({values:?}):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
