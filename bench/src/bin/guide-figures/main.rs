//! The guide's figure tables, rendered from the benches' JSON in
//! `docs/bench/`: no number in them is copied by hand, so none drifts
//! from the run it came from.
//!
//! A generated table sits between `<!-- figures:NAME -->` and
//! `<!-- /figures:NAME -->` in a guide page; this rewrites every such block
//! from the JSON, or with `--check` fails (as CI runs it) when a block
//! differs from what the JSON gives. A page names its JSON in the text
//! around the block. Each module renders the tables of one bench and
//! names them in its `TABLES`; `render` holds what they share.
//!
//! `cargo run -p bench --bin guide-figures [-- --check]`

mod cache;
mod compaction;
mod counter;
mod floor;
mod growth;
mod limits;
mod mq;
mod readme;
mod render;
mod service;
mod unique;

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

type BoxError = Box<dyn std::error::Error>;

/// Renders one named table from the JSON in `docs/bench/`.
type Generator = fn(&Path) -> Result<String, BoxError>;

/// Every table by its marker's name, each module's own.
fn generator(name: &str) -> Option<Generator> {
    [
        limits::TABLES,
        floor::TABLES,
        service::TABLES,
        growth::TABLES,
        counter::TABLES,
        cache::TABLES,
        mq::TABLES,
        unique::TABLES,
        compaction::TABLES,
        readme::TABLES,
    ]
    .into_iter()
    .flatten()
    .find(|(table, _)| *table == name)
    .map(|(_, generate)| *generate)
}

/// The blocks of `page` rewritten: the new text, and the names of the
/// blocks that changed.
fn rewrite(page: &str, bench: &Path) -> Result<(String, Vec<String>), BoxError> {
    let mut out = String::new();
    let mut changed = Vec::new();
    let mut rest = page;
    while let Some(start) = rest.find("<!-- figures:") {
        let open_end = rest[start..]
            .find("-->")
            .ok_or("an unclosed figures marker")?
            + start
            + 3;
        let name = rest[start + "<!-- figures:".len()..open_end - 3]
            .trim()
            .to_owned();
        let close = format!("<!-- /figures:{name} -->");
        let end = rest[open_end..]
            .find(&close)
            .ok_or_else(|| format!("no {close}"))?
            + open_end;
        let generate =
            generator(&name).ok_or_else(|| format!("no figures table named `{name}`"))?;
        let fresh = generate(bench)?;
        let fresh = format!("\n{fresh}");
        if rest[open_end..end] != fresh {
            changed.push(name);
        }
        out.push_str(&rest[..open_end]);
        out.push_str(&fresh);
        rest = &rest[end..];
    }
    out.push_str(rest);
    Ok((out, changed))
}

fn run() -> Result<bool, BoxError> {
    let check = std::env::args().any(|a| a == "--check");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let bench = root.join("docs/bench");
    let mut stale = Vec::new();
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root.join("docs/guide"))?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.push(root.join("README.md"));
    pages.sort();
    for page in pages {
        let text = std::fs::read_to_string(&page)?;
        let (fresh, changed) = rewrite(&text, &bench)?;
        for name in &changed {
            stale.push(format!("{} ({name})", page.display()));
        }
        if !check && !changed.is_empty() {
            std::fs::write(&page, fresh)?;
        }
    }
    if stale.is_empty() {
        println!("guide-figures: every generated table matches docs/bench/");
        return Ok(true);
    }
    if check {
        eprintln!(
            "guide-figures: tables differ from docs/bench/ (run `cargo run -p bench --bin guide-figures`): {}",
            stale.join(", ")
        );
        return Ok(false);
    }
    println!("guide-figures: rewrote {}", stale.join(", "));
    Ok(true)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("guide-figures: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::number;

    #[test]
    fn numbers_are_grouped_and_rounded() {
        assert_eq!(number(1234567.891, 1), "1,234,567.9");
        assert_eq!(number(999.0, 0), "999");
        assert_eq!(number(1000.0, 0), "1,000");
        assert_eq!(number(-23749.3, 0), "-23,749");
        assert_eq!(number(0.456, 2), "0.46");
    }

    #[test]
    fn blocks_are_rewritten_from_the_json_and_stale_ones_named() {
        let dir = std::env::temp_dir().join(format!("guide-figures-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let run = serde_json::json!({"limits": {"cache_read": {"ratio": 1.5, "own_us": 3000.0, "raw_us": 2000.0}}});
        std::fs::write(dir.join("limits-postgres.json"), run.to_string()).unwrap();
        let page = "intro\n<!-- figures:limits -->\nold\n<!-- /figures:limits -->\nafter\n";
        let (fresh, changed) = rewrite(page, &dir).unwrap();
        assert_eq!(changed, ["limits"]);
        assert!(
            fresh.starts_with("intro\n<!-- figures:limits -->\n| figure |"),
            "{fresh}"
        );
        assert!(
            fresh.contains("| **1.50 (3.00 / 2.00 ms), missed** | n/a |"),
            "{fresh}"
        );
        assert!(!fresh.contains("mq_consume"), "{fresh}");
        assert!(
            fresh.ends_with("<!-- /figures:limits -->\nafter\n"),
            "{fresh}"
        );
        // Rendered again from the same JSON: nothing changes.
        let (again, changed) = rewrite(&fresh, &dir).unwrap();
        assert!(changed.is_empty());
        assert_eq!(again, fresh);
        // A run with the MQ figure shows its row; the other backend "n/a".
        let run = serde_json::json!({"limits": {"mq_consume": {"ratio": 1.25, "own_us": 50.0, "raw_us": 40.0}}});
        std::fs::write(dir.join("limits-mariadb.json"), run.to_string()).unwrap();
        let (with_mq, changed) = rewrite(&fresh, &dir).unwrap();
        assert_eq!(changed, ["limits"]);
        assert!(
            with_mq.contains("(target 1.3) | n/a | 1.25 (50.0 / 40.0 us) |"),
            "{with_mq}"
        );
        std::fs::remove_file(dir.join("limits-mariadb.json")).unwrap();
        let unknown = rewrite("<!-- figures:nope -->\n<!-- /figures:nope -->", &dir).unwrap_err();
        assert!(unknown.to_string().contains("`nope`"), "{unknown}");
        assert!(
            rewrite("<!-- figures:limits -->", &dir).is_err(),
            "an unclosed block"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
