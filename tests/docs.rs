//! Every relative link in the repository's Markdown resolves: README.md, docs/ and the other
//! `*.md` files (not `target/`, hidden directories or `tests/cases/`, a copy of the shared
//! cases). A `](path)` names a file or directory of the repository, relative to the file that
//! links; a `](path#anchor)` or `](#anchor)` also names a heading of that Markdown file, as
//! GitHub renders its anchor (or an explicit `<a id>`/`<a name>`). Links inside code (fenced
//! blocks, inline spans) are not links, and neither are their headings.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
    entries.sort_by_key(|e| e.path());
    for entry in entries {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            let rel = path.strip_prefix(root()).unwrap();
            if name.starts_with('.')
                || rel == Path::new("target")
                || rel == Path::new("tests/cases")
            {
                continue;
            }
            markdown_files(&path, out);
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// The lines of `text` outside fenced code blocks, inline code spans blanked.
fn prose(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fence: Option<&str> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => {
                fence = Some(m);
                out.push(String::new());
                continue;
            }
            (Some(open), Some(m)) if open == m => {
                fence = None;
                out.push(String::new());
                continue;
            }
            (Some(_), _) => {
                out.push(String::new());
                continue;
            }
            (None, None) => {}
        }
        // Inline code: the odd segments between backticks.
        let mut kept = String::new();
        for (i, segment) in line.split('`').enumerate() {
            if i % 2 == 0 {
                kept.push_str(segment);
            } else {
                kept.push_str("code");
            }
        }
        out.push(kept);
    }
    out
}

/// `[text](target)` on a line: (text, target) pairs, the target without a title.
fn links(line: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let text_start = rest[..at].rfind('[').map(|i| i + 1).unwrap_or(0);
        let text = rest[text_start..at].to_string();
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end]
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_string();
        out.push((text, target));
        rest = &after[end..];
    }
    out
}

/// GitHub's anchor for a heading's text: links reduced to their text, lowercased, every
/// character but letters, digits, `-`, `_` and spaces dropped, spaces made `-`.
fn slug(heading: &str) -> String {
    let mut text = heading.to_string();
    for (label, target) in links(heading) {
        text = text.replace(&format!("[{label}]({target})"), &label);
    }
    text.trim()
        .chars()
        .flat_map(char::to_lowercase)
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor a Markdown file offers: its headings' (a repeated one gets `-1`, `-2`...),
/// and explicit `<a id="...">` / `<a name="...">`.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    // Headings are read with their code spans (GitHub keeps a code span's text in the anchor).
    let raw: Vec<&str> = text.lines().collect();
    for (i, line) in prose(text).iter().enumerate() {
        if line.is_empty() {
            continue;
        }
        let original = raw[i];
        let hashes = original.chars().take_while(|c| *c == '#').count();
        if (1..=6).contains(&hashes) && original[hashes..].starts_with(' ') {
            let base = slug(&original[hashes..].replace('`', ""));
            let n = seen.entry(base.clone()).or_insert(0);
            out.insert(if *n == 0 {
                base.clone()
            } else {
                format!("{base}-{n}")
            });
            *n += 1;
        }
        for attr in ["id=\"", "name=\""] {
            let mut rest = line.as_str();
            while let Some(at) = rest.find(&format!("<a {attr}")) {
                let after = &rest[at + 3 + attr.len()..];
                if let Some(end) = after.find('"') {
                    out.insert(after[..end].to_string());
                }
                rest = after;
            }
        }
    }
    out
}

/// Every broken relative link of the repository's Markdown, as `file:line: target (why)`.
fn broken_links() -> Vec<String> {
    let root = root();
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let rel = file.strip_prefix(&root).unwrap().display().to_string();
        for (n, line) in prose(&text).iter().enumerate() {
            for (_, target) in links(line) {
                if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                    continue;
                }
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let dest = if path.is_empty() {
                    file.clone()
                } else {
                    file.parent().unwrap().join(path)
                };
                let why = if !dest.exists() {
                    Some("no such file".to_string())
                } else if !dest
                    .canonicalize()
                    .is_ok_and(|d| d.starts_with(root.canonicalize().unwrap()))
                {
                    Some("outside the repository".to_string())
                } else if let Some(anchor) = anchor {
                    if dest.extension().is_none_or(|e| e != "md") {
                        Some("an anchor into a file that is not Markdown".to_string())
                    } else {
                        let offered = anchors(&std::fs::read_to_string(&dest).unwrap());
                        (!offered.contains(anchor))
                            .then(|| format!("no heading renders to #{anchor}"))
                    }
                } else {
                    None
                };
                if let Some(why) = why {
                    broken.push(format!("{rel}:{}: {target} ({why})", n + 1));
                }
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let broken = broken_links();
    assert!(
        broken.is_empty(),
        "{} broken links:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// The docs the README maps are all there, and every file under docs/ is reachable from the
/// README (directly or through another doc).
#[test]
fn every_doc_is_reachable_from_the_readme() {
    let root = root();
    let mut docs = Vec::new();
    markdown_files(&root.join("docs"), &mut docs);
    let mut reached: BTreeSet<PathBuf> = BTreeSet::new();
    let mut todo = vec![root.join("README.md")];
    while let Some(file) = todo.pop() {
        let Ok(file) = file.canonicalize() else {
            continue;
        };
        if !reached.insert(file.clone()) || file.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for line in prose(&text) {
            for (_, target) in links(&line) {
                let path = target.split('#').next().unwrap();
                if !path.is_empty() && !target.contains("://") {
                    todo.push(file.parent().unwrap().join(path));
                }
            }
        }
    }
    let unreached: Vec<String> = docs
        .iter()
        .filter(|d| !reached.contains(&d.canonicalize().unwrap()))
        .map(|d| d.strip_prefix(&root).unwrap().display().to_string())
        .collect();
    assert!(
        unreached.is_empty(),
        "not linked from the README or the docs it links: {unreached:?}"
    );
}

#[test]
fn anchors_are_githubs() {
    let text = "# Title\n## `managed-jobs run` flags\n## GitOps (Flux, Argo CD)\n\
                ### Stopping without failing: suspend, resume, preemption\n## Title\n\
                ```sh\n# not a heading\n```\n## A [link](x.md) here\n<a id=\"custom\"></a>\n";
    let got = anchors(text);
    for want in [
        "title",
        "managed-jobs-run-flags",
        "gitops-flux-argo-cd",
        "stopping-without-failing-suspend-resume-preemption",
        "title-1",
        "a-link-here",
        "custom",
    ] {
        assert!(got.contains(want), "{want} not in {got:?}");
    }
    assert!(!got.contains("not-a-heading"), "{got:?}");
    assert_eq!(
        links("see [a](b.md#c) and [`d`](e/) `[x](no)`"),
        [
            ("a".to_string(), "b.md#c".to_string()),
            ("`d`".to_string(), "e/".to_string()),
            ("x".to_string(), "no".to_string())
        ]
    );
    // Inside code a link is no link.
    assert!(links(&prose("`[x](no)`")[0]).is_empty());
}
