//! The crate's import graph (`docs/design.md#layout`): every module uses only modules of lower
//! layers, and the files of a directory module form no cycle. `hack/layers.py` reads the `use`
//! lines and paths of `src/` and checks both; this test runs it.

use std::process::Command;

#[test]
fn every_arrow_points_down_and_nothing_cycles() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("python3")
        .arg(format!("{root}/hack/layers.py"))
        .arg(format!("{root}/src"))
        .output()
        .expect("python3 runs hack/layers.py");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(report.starts_with("ok:"), "{report}");
}
