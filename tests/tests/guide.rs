//! The guide compiles: every Rust block of README.md, docs/guide/*.md and
//! the published crates' READMEs, each in a module of its own after its
//! page's context (`tests/guide/*.rs`), type-checked with this test binary.
//! `build.rs` extracts them; this file includes them and checks that none
//! was left out and that a block not compiled says why.

include!(concat!(env!("OUT_DIR"), "/guide_blocks.rs"));

/// `crate::models`, as the adoption guide's Loco files name the app's
/// models.
#[allow(warnings, clippy::all)]
pub mod models {
    include!("../guide/adoption.rs");
}

#[test]
fn every_rust_block_of_the_guide_is_compiled_or_says_why_not() {
    let mut fences = 0;
    let mut ignored_without_reason = Vec::new();
    for page in PAGES {
        let page = std::path::Path::new(page);
        let text = std::fs::read_to_string(page).expect("a page");
        let mut lines = text.lines().enumerate();
        while let Some((i, line)) = lines.next() {
            let Some(info) = line.trim_start().strip_prefix("```") else {
                continue;
            };
            let rust = info == "rust" || info.starts_with("rust,");
            if rust {
                fences += 1;
                if info.split(',').any(|o| o == "ignore") {
                    let first = lines.next().map(|(_, l)| l).unwrap_or_default();
                    if !first.trim_start().starts_with("// not compiled:") {
                        ignored_without_reason.push(format!("{}:{}", page.display(), i + 1));
                    }
                }
            }
            // The rest of the fence, whatever its language.
            for (_, inner) in lines.by_ref() {
                if inner.trim() == "```" {
                    break;
                }
            }
        }
    }
    assert_eq!(
        BLOCKS.len(),
        fences,
        "the build script compiled {} blocks, the pages have {fences} Rust fences",
        BLOCKS.len()
    );
    assert!(
        ignored_without_reason.is_empty(),
        "blocks not compiled without a `// not compiled: <why>` first line: {ignored_without_reason:?}"
    );
    let compiled = BLOCKS
        .iter()
        .filter(|(_, _, kind)| *kind != "ignored")
        .count();
    eprintln!("{compiled} of {fences} Rust blocks of the guide compiled");
    assert!(compiled > 20, "the guide has more blocks than {compiled}");
}
