//! The committed CRD (`crds/`) is exactly what `managed-jobs crd` prints: regenerate it with
//! `cargo run -- crd > crds/managedjobs.dev_managedjobs.yaml` after changing the API types.

#[test]
fn committed_crd_is_up_to_date() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crds/managedjobs.dev_managedjobs.yaml"
    );
    let committed = std::fs::read_to_string(path).expect("crds/managedjobs.dev_managedjobs.yaml");
    assert!(
        committed == managed_jobs::api::crd_yaml(),
        "crds/ is stale: run `cargo run -- crd > crds/managedjobs.dev_managedjobs.yaml`"
    );
}

/// The same for the ManagedJobQueue CRD: `cargo run -- crd queue`.
#[test]
fn committed_queue_crd_is_up_to_date() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crds/managedjobs.dev_managedjobqueues.yaml"
    );
    let committed =
        std::fs::read_to_string(path).expect("crds/managedjobs.dev_managedjobqueues.yaml");
    assert!(
        committed == managed_jobs::api::queue_crd_yaml(),
        "crds/ is stale: run `cargo run -- crd queue > crds/managedjobs.dev_managedjobqueues.yaml`"
    );
    let crd = serde_json::to_value(managed_jobs::api::queue_crd()).unwrap();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    for (name, field) in spec["properties"].as_object().unwrap() {
        assert!(
            field["description"].is_string(),
            "ManagedJobQueue spec.{name} has no description"
        );
    }
}

/// The same for the ManagedJobPool CRD: `cargo run -- crd pool`.
#[test]
fn committed_pool_crd_is_up_to_date() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crds/managedjobs.dev_managedjobpools.yaml"
    );
    let committed =
        std::fs::read_to_string(path).expect("crds/managedjobs.dev_managedjobpools.yaml");
    assert!(
        committed == managed_jobs::api::pool_crd_yaml(),
        "crds/ is stale: run `cargo run -- crd pool > crds/managedjobs.dev_managedjobpools.yaml`"
    );
}

#[test]
fn every_spec_field_has_a_description() {
    let crd = serde_json::to_value(managed_jobs::api::crd()).unwrap();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    for (name, field) in spec["properties"].as_object().unwrap() {
        assert!(
            field["description"].is_string(),
            "spec.{name} has no description"
        );
    }
    let recovery = &spec["properties"]["recovery"]["properties"];
    for (name, field) in recovery.as_object().unwrap() {
        assert!(
            field["description"].is_string(),
            "spec.recovery.{name} has no description"
        );
    }
}

/// The API reference (`docs/reference/api.md`) is exactly what `managed-jobs crd --reference`
/// prints from the two CRDs: a field, default, bound or rule changed in the API types changes
/// it, and this test names the first line that differs and the command that rewrites it.
#[test]
fn committed_api_reference_is_up_to_date() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/reference/api.md");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    let generated = managed_jobs::api::api_reference();
    if committed == generated {
        return;
    }
    let line = committed
        .lines()
        .zip(generated.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()));
    panic!(
        "docs/reference/api.md is stale (first difference at line {}: committed {:?}, generated {:?}): run `{}`",
        line + 1,
        committed.lines().nth(line).unwrap_or("<end of file>"),
        generated.lines().nth(line).unwrap_or("<end of file>"),
        managed_jobs::api::reference::REGENERATE,
    );
}
