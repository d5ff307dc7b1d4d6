//! The layers of ARCHITECTURE.md, checked on `src/`: every `crate::`
//! path a file names leads to its own layer or one below, and the domain
//! names no HTTP crate. A new upward import fails here, with its file.

use std::path::{Path, PathBuf};

/// Layers, bottom up.
const FOUNDATION: u8 = 0;
const DOMAIN: u8 = 1;
const WIRING: u8 = 2;
const HTTP: u8 = 3;
const ENTRY: u8 = 4;

/// The layer of a file, by its path under `src/`.
fn layer_of_file(path: &str) -> u8 {
    match path {
        "config.rs" | "problem.rs" | "metrics.rs" => FOUNDATION,
        "state.rs" => WIRING,
        "lib.rs" | "main.rs" | "service.rs" | "local.rs" | "preflight.rs" => ENTRY,
        _ if path.starts_with("domain/") => DOMAIN,
        _ if path.starts_with("api/") => HTTP,
        _ => panic!("src/{path}: a file of no layer (add it to ARCHITECTURE.md and here)"),
    }
}

/// The layer of what `crate::<name>` names.
fn layer_of_name(name: &str) -> Option<u8> {
    Some(match name {
        "config" | "problem" | "metrics" => FOUNDATION,
        "domain" | "dispatch" => DOMAIN,
        "state" => WIRING,
        "api" => HTTP,
        "service" | "local" | "preflight" | "Service" | "Local" | "StartError" => ENTRY,
        // Re-exports at the root of what lives in a layer named above.
        "Config" | "ConfigError" | "ProblemBody" => FOUNDATION,
        "jobs" => DOMAIN,
        _ => return None,
    })
}

/// Every name right after `crate::` in `text`'s code (comments, where a
/// doc link may name a caller above, left out), a `{...}` group's
/// top-level names each.
fn crate_names(text: &str) -> Vec<String> {
    let code: String = text
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut names = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let (mut depth, mut item) = (0, String::new());
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => names.push(std::mem::take(&mut item)),
                    _ => item.push(c),
                }
            }
            names.push(item);
        } else {
            names.push(
                rest.chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect(),
            );
        }
    }
    names
        .into_iter()
        .map(|n| {
            n.trim()
                .split("::")
                .next()
                .unwrap_or_default()
                .trim()
                .to_owned()
        })
        .filter(|n| !n.is_empty())
        .collect()
}

fn sources(dir: &Path, under: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path: PathBuf = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, under, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let name = path
                .strip_prefix(under)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            out.push((name, std::fs::read_to_string(&path).unwrap()));
        }
    }
}

#[test]
fn every_import_goes_down_and_the_domain_speaks_no_http() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &src, &mut files);
    let mut upward = Vec::new();
    for (file, text) in &files {
        let layer = layer_of_file(file);
        for name in crate_names(text) {
            match layer_of_name(&name) {
                Some(to) if to > layer => upward.push(format!("src/{file} names crate::{name}")),
                Some(_) => {}
                None => upward.push(format!("src/{file}: crate::{name} is in no layer")),
            }
        }
        if layer == DOMAIN {
            for http in ["axum::", "hyper::", "tower::", "tower_http::"] {
                if text.contains(http) {
                    upward.push(format!(
                        "src/{file} names {http} (the domain speaks no HTTP)"
                    ));
                }
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports against the layers:\n{}",
        upward.join("\n")
    );
    // The check sees what it should: a sample with every form is read.
    assert_eq!(
        crate_names("use crate::{api::x, domain::{a, b}, state::AppState}; crate::metrics::X"),
        ["api", "domain", "state", "metrics"]
    );
}
