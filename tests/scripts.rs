//! The project's shell scripts check only what they say they check: no pipeline into a reader
//! that may exit before its producer is done (`producer | grep -q`, `| grep -m`, `| head`) in a
//! script run under `set -o pipefail`. There the producer gets SIGPIPE when it writes after
//! the reader exited, the pipeline fails, and the check fails for a reason other than its own
//! (issue 29: the real node's setup stopped with "the sandbox image ... was not imported" while
//! containerd listed it). Read the whole output first (`out="$(producer)"`, then
//! `grep -q ... <<<"$out"`), or use the tool's own query.

use std::path::{Path, PathBuf};

fn scripts(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            scripts(&path, out);
        } else if path.extension().is_some_and(|e| e == "sh") {
            out.push(path);
        }
    }
}

/// True when `line` (a line of shell, comments dropped) pipes into a reader that may stop
/// reading early.
fn pipes_into_an_early_exit(line: &str) -> bool {
    line.split('|').skip(1).any(|reader| {
        let words: Vec<&str> = reader.split_whitespace().collect();
        match words.as_slice() {
            ["head", ..] => true,
            ["grep", flags @ ..] => flags
                .iter()
                .take_while(|w| w.starts_with('-'))
                .any(|w| !w.starts_with("--") && (w.contains('q') || w.contains('m'))),
            _ => false,
        }
    })
}

#[test]
fn no_check_reads_a_pipe_that_can_fail_for_another_reason() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["hack", "charts", ".ci"] {
        if root.join(dir).is_dir() {
            scripts(&root.join(dir), &mut files);
        }
    }
    files.push(root.join(".ci/run"));
    let mut found = Vec::new();
    for file in files.iter().filter(|f| f.exists()) {
        let text = std::fs::read_to_string(file).unwrap();
        if !text.contains("pipefail") {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            let code = line.split(" #").next().unwrap_or("");
            if code.trim_start().starts_with('#') {
                continue;
            }
            if pipes_into_an_early_exit(code) {
                found.push(format!(
                    "{}:{}: {}",
                    file.strip_prefix(&root).unwrap().display(),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "pipelines into a reader that exits early, under pipefail:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_rule_sees_what_it_is_for() {
    assert!(pipes_into_an_early_exit(
        "ctr images ls -q | grep -qxF \"$X\""
    ));
    assert!(pipes_into_an_early_exit("curl -sf url | grep -q ok"));
    assert!(pipes_into_an_early_exit("queue | head -4"));
    assert!(pipes_into_an_early_exit("x | grep -m1 y"));
    assert!(!pipes_into_an_early_exit("grep -qxF \"$X\" <<<\"$out\""));
    assert!(!pipes_into_an_early_exit("ldd \"$bin\" | awk '{print $3}'"));
    assert!(!pipes_into_an_early_exit("a || b"));
    assert!(!pipes_into_an_early_exit("x | grep -v '^#'"));
}
