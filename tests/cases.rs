//! The test inputs the project needs live in the repository (`tests/cases/`). They are copies of
//! the shared cases (`../shared/cases/`, outside the repository, present on the developers'
//! machines); while that folder exists, the copies must stay identical to it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir).unwrap().to_path_buf();
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

#[test]
fn the_repositorys_cases_match_the_shared_ones() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let ours = files(&root.join("tests/cases"));
    assert!(
        ours.keys().any(|p| p.starts_with("invalid"))
            && ours.keys().any(|p| p.starts_with("valid")),
        "tests/cases must hold the valid and invalid inputs"
    );
    let shared = root.join("../shared/cases");
    if !shared.is_dir() {
        // A clone on its own: the repository's copies are the inputs.
        return;
    }
    let theirs = files(&shared);
    let names = |m: &BTreeMap<PathBuf, Vec<u8>>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        names(&ours),
        names(&theirs),
        "tests/cases lists other files than ../shared/cases: copy them again"
    );
    for (path, bytes) in &theirs {
        assert!(
            ours.get(path) == Some(bytes),
            "tests/cases/{} differs from ../shared/cases/{}: copy it again",
            path.display(),
            path.display()
        );
    }
}
