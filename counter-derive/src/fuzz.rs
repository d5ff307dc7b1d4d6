//! Fuzzing the `#[counter(...)]` parser with generated attribute text.
//!
//! A derive that panics gives the user "proc-macro derive panicked" and no
//! span; one that accepts a bad option generates code that fails at run
//! time. So for any struct syn can parse, built from a grammar of valid and
//! mutated `#[counter]` options (unknown and repeated options, slot counts
//! out of range or of the wrong type, bad key and table names, nested
//! garbage, stray punctuation) and from random token soup, this checks that
//! [`model::build`] and the whole derive never panic, and that they either
//! accept a model counter-core itself accepts (slots in range, keys and
//! table names valid by counter-core's own rules) or return errors that say
//! something. Only `proc_macro2` is used: `proc_macro` panics outside a
//! macro.

use proptest::{prelude::*, strategy::ValueTree};
use syn::DeriveInput;

use crate::{
    attr::{self, Window},
    expand, model,
};

/// Slot counts as written: valid, at and past the edges, and not integers.
const SLOTS: &[&str] = &[
    "1",
    "16",
    "1024",
    "0",
    "1025",
    "65535",
    "65536",
    "-1",
    "\"16\"",
    "\"str\"",
    "99999999999999999999999999999999",
    "18446744073709551616",
    "1u8",
    "4i64",
    "1.5",
    "0x10",
    "1_0",
    "true",
    "x",
    "(8)",
    "{ 8 }",
    "8 + 8",
    "'c'",
    "b\"8\"",
];

/// Key names: valid ones, raw identifiers, keywords and names that break
/// the key rules.
const KEYS: &[&str] = &[
    "likes",
    "views",
    "downloads_v2",
    "a",
    "r#type",
    "r#match",
    "gen",
    "r#gen",
    "self",
    "Self",
    "super",
    "crate",
    "Likes",
    "_x",
    "_1",
    "_",
    "lik\u{e9}s",
    "\u{430}",
    "a__b",
    "a::b",
    "::likes",
    "likes_",
    "l1",
    "x_",
    "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk",
    "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk",
    "views_total",
    "views_Total",
];

/// `table = ...` values.
const TABLES: &[&str] = &[
    "\"post_counters\"",
    "\"posts\"",
    "\"POSTS\"",
    "\"\"",
    "\"1x\"",
    "\"excluded\"",
    "\"Excluded\"",
    "\"a-b\"",
    "\"a.b\"",
    "\"t; DROP TABLE posts; --\"",
    "\"t\u{e9}\"",
    "\"ttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttt\"",
    "\"tttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttt\"",
    "\"ttttttttttttttttttttttttttttttttttttttttttttttttttttttt\"",
    "post_counters",
    "5",
    "r\"raw\"",
];

/// Other values an option may be given.
const VALUES: &[&str] = &[
    "day",
    "hour",
    "week",
    "\"day\"",
    "\"hour\"",
    "Day",
    "3",
    "\"rotating\"",
    "\"random\"",
    "\"round_robin\"",
    "random",
    "true",
    "false",
    "()",
    "[1, 2]",
    "{}",
    "a::b",
    "|x| x",
];

/// Option names: the real ones, misspellings and strangers.
const OPTIONS: &[&str] = &[
    "keys",
    "slots",
    "table",
    "slot_strategy",
    "cascade",
    "window",
    "key",
    "slot",
    "tables",
    "Keys",
    "r#keys",
    "foo",
    "self",
    "a::keys",
];

/// Stray tokens.
const PUNCT: &[&str] = &[
    ",", ",,", "=", "==", "()", "(", ")", "::", "#", "@", ";", "'a", "{}", "[]", "!", "..", "=>",
    "- 1", "\"\"", "r#", "$x",
];

fn one(list: &'static [&'static str]) -> impl Strategy<Value = String> {
    proptest::sample::select(list).prop_map(str::to_owned)
}

/// `name = value`, `name(...)`, a bare `name`, or one of the three with a
/// stray token.
fn option_with(name: BoxedStrategy<String>, value: BoxedStrategy<String>) -> BoxedStrategy<String> {
    prop_oneof![
        (name.clone(), value.clone()).prop_map(|(n, v)| format!("{n} = {v}")),
        (name.clone(), value).prop_map(|(n, v)| format!("{n}({v})")),
        name.clone(),
        (name, one(PUNCT)).prop_map(|(n, p)| format!("{n} {p}")),
    ]
    .boxed()
}

/// The options of one key: `slots = 64, window = day`, mutated.
fn key_options() -> BoxedStrategy<String> {
    let item = prop_oneof![
        one(SLOTS).prop_map(|v| format!("slots = {v}")),
        one(VALUES).prop_map(|v| format!("window = {v}")),
        option_with(one(OPTIONS).boxed(), one(VALUES).boxed()),
        one(PUNCT),
    ];
    proptest::collection::vec(item, 0..4)
        .prop_map(|items| items.join(", "))
        .boxed()
}

/// One entry of `keys(...)`.
fn key() -> BoxedStrategy<String> {
    prop_oneof![
        3 => one(KEYS),
        2 => (one(KEYS), key_options()).prop_map(|(k, o)| format!("{k}({o})")),
        1 => (one(KEYS), one(SLOTS)).prop_map(|(k, v)| format!("{k} = {v}")),
        1 => one(PUNCT),
    ]
    .boxed()
}

/// One option of `#[counter(...)]`.
fn counter_option() -> BoxedStrategy<String> {
    let keys =
        proptest::collection::vec(key(), 0..5).prop_map(|k| format!("keys({})", k.join(", ")));
    prop_oneof![
        4 => keys,
        1 => one(SLOTS).prop_map(|v| format!("slots = {v}")),
        1 => one(TABLES).prop_map(|v| format!("table = {v}")),
        1 => one(VALUES).prop_map(|v| format!("slot_strategy = {v}")),
        1 => one(TABLES).prop_map(|v| format!("slot_strategy = {v}")),
        1 => Just("cascade".to_owned()),
        1 => one(VALUES).prop_map(|v| format!("cascade = {v}")),
        1 => Just("keys".to_owned()),
        1 => one(SLOTS).prop_map(|v| format!("keys = {v}")),
        1 => option_with(one(OPTIONS).boxed(), one(VALUES).boxed()),
        1 => one(PUNCT),
    ]
    .boxed()
}

/// Keys the derive accepts.
const VALID_KEYS: &[&str] = &[
    "likes",
    "views",
    "downloads_v2",
    "a",
    "r#type",
    "gen",
    "l1",
    "x_",
    "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk",
];

/// Options the derive accepts, besides `keys`.
const VALID_OPTIONS: &[&str] = &[
    "slots = 1",
    "slots = 1024",
    "table = \"post_counters\"",
    "slot_strategy = \"random\"",
    "cascade",
];

/// A valid `#[counter(...)]` list: distinct valid keys, some with valid
/// options, and some valid table options.
fn valid_options() -> BoxedStrategy<Vec<String>> {
    let key_option = prop_oneof![
        Just(""),
        Just("(slots = 16)"),
        Just("(window = day)"),
        Just("(slots = 1024, window = \"hour\")"),
    ];
    let keys = proptest::sample::subsequence(VALID_KEYS, 1..4).prop_flat_map(move |keys| {
        let n = keys.len();
        proptest::collection::vec(key_option.clone(), n).prop_map(move |options| {
            let keys: Vec<String> = keys
                .iter()
                .zip(options)
                .map(|(k, o)| format!("{k}{o}"))
                .collect();
            format!("keys({})", keys.join(", "))
        })
    });
    let others = proptest::sample::subsequence(VALID_OPTIONS, 0..=VALID_OPTIONS.len());
    (keys, others)
        .prop_map(|(keys, others)| {
            std::iter::once(keys)
                .chain(others.into_iter().map(str::to_owned))
                .collect()
        })
        .boxed()
}

/// Whole `#[counter(...)]` attributes (one or two of them): valid, valid
/// with one mutation inserted, or made of mutations; sometimes none.
fn counter_attrs() -> BoxedStrategy<String> {
    let attr = proptest::collection::vec(counter_option(), 0..6)
        .prop_map(|options| format!("#[counter({})]", options.join(", ")));
    let valid = valid_options().prop_map(|options| format!("#[counter({})]", options.join(", ")));
    let mutated = (
        valid_options(),
        counter_option(),
        any::<prop::sample::Index>(),
    )
        .prop_map(|(mut options, mutation, at)| {
            options.insert(at.index(options.len() + 1), mutation);
            format!("#[counter({})]", options.join(", "))
        });
    prop_oneof![
        3 => valid,
        3 => mutated,
        4 => attr.clone(),
        1 => (attr.clone(), attr).prop_map(|(a, b)| format!("{a}\n{b}")),
        1 => Just("#[counter]".to_owned()),
        1 => Just("#[counter = \"keys(likes)\"]".to_owned()),
        1 => Just(String::new()),
    ]
    .boxed()
}

/// Random tokens, most of them from the grammar's own words.
fn token_soup() -> BoxedStrategy<String> {
    let token = prop_oneof![
        one(KEYS),
        one(OPTIONS),
        one(SLOTS),
        one(TABLES),
        one(VALUES),
        one(PUNCT),
        "[a-z_]{1,8}",
    ];
    proptest::collection::vec(token, 0..24)
        .prop_map(|t| format!("#[counter({})]", t.join(" ")))
        .boxed()
}

/// The struct the attribute sits on: a proper entity `Model` most of the
/// time, or one lacking what the derive needs.
fn entity(attrs: BoxedStrategy<String>) -> impl Strategy<Value = String> {
    let sea_orm = prop_oneof![
        10 => Just("#[sea_orm(table_name = \"posts\")]"),
        1 => Just("#[sea_orm(table_name = \"ttttttttttttttttttttttttttttttttttttttttttttttttttttttt\")]"),
        1 => Just("#[sea_orm(table_name = \"\")]"),
        1 => Just("#[sea_orm(table_name = 5)]"),
        1 => Just(""),
    ];
    let name = prop_oneof![10 => Just("Model"), 1 => Just("ModelEx"), 1 => Just("Post")];
    let id = prop_oneof![
        6 => Just("#[sea_orm(primary_key)] pub id: i64,"),
        1 => Just("#[sea_orm(primary_key)] pub id: i32,"),
        1 => Just("#[sea_orm(primary_key, auto_increment = false)] pub id: String,"),
        1 => Just("#[sea_orm(primary_key)] pub id: uuid::Uuid,"),
        1 => Just("#[sea_orm(primary_key)] pub id: Vec<u8>,"),
        1 => Just("#[sea_orm(primary_key, enum_name = \"self\")] pub id: i64,"),
        1 => Just("#[sea_orm(primary_key, enum_name = \"\")] pub id: i64,"),
        1 => Just("#[sea_orm(primary_key)] pub _1: i64,"),
        1 => Just("#[sea_orm(primary_key)] pub a: i64, #[sea_orm(primary_key)] pub b: i64,"),
        1 => Just("pub id: i64,"),
    ];
    (sea_orm, attrs, name, id).prop_map(|(sea_orm, attrs, name, id)| {
        format!("{sea_orm}\n{attrs}\npub struct {name} {{ {id} pub title: String }}")
    })
}

/// The owner entity's `#[sea_orm(table_name = "...")]`, read independently
/// of the derive.
fn owner_table(input: &DeriveInput) -> Option<String> {
    input.attrs.iter().find_map(|attr| {
        let nv = attr.parse_args::<syn::MetaNameValue>().ok()?;
        match (
            attr.path().is_ident("sea_orm") && nv.path.is_ident("table_name"),
            nv.value,
        ) {
            (
                true,
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }),
            ) => Some(s.value()),
            _ => None,
        }
    })
}

/// The derive on `input`: no panic, and either a model counter-core accepts
/// or errors with messages.
fn check(input: &DeriveInput) -> Result<(), TestCaseError> {
    match model::build(input) {
        Ok(None) => prop_assert_eq!(input.ident.to_string(), "ModelEx"),
        Ok(Some(model)) => {
            prop_assert!((1..=1024).contains(&model.slots), "slots {}", model.slots);
            prop_assert!(!model.keys.is_empty());
            prop_assert!(
                counter_core::validate_table_name(&model.table).is_ok(),
                "{}",
                model.table
            );
            let owner_table = owner_table(input);
            prop_assert!(
                owner_table
                    .as_ref()
                    .is_some_and(|owner| !owner.eq_ignore_ascii_case(&model.table)),
                "{} next to the owner's table {:?}",
                model.table,
                owner_table
            );
            let mut config = counter_core::CounterTable::new(model.table.clone())
                .and_then(|t| t.with_slots(model.slots))
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            for (i, key) in model.keys.iter().enumerate() {
                prop_assert!(
                    counter_core::validate_key(&key.name).is_ok(),
                    "{}",
                    key.name
                );
                prop_assert!(attr::key_name_problem(&key.name).is_none(), "{}", key.name);
                prop_assert!(
                    model.keys[..i]
                        .iter()
                        .all(|o| o.name != key.name && o.variant != key.variant),
                    "duplicate key {}",
                    key.name
                );
                if let Some(slots) = key.slots {
                    prop_assert!((1..=1024).contains(&slots), "{}: {} slots", key.name, slots);
                    config = config
                        .with_key_slots(&key.name, slots)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                }
                if let Some(window) = key.window {
                    let window = match window {
                        Window::Hour => counter_core::Window::Hour,
                        Window::Day => counter_core::Window::Day,
                    };
                    config = config
                        .with_key_window(&key.name, window)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                }
            }
        }
        Err(errors) => {
            prop_assert!(!errors.to_string().trim().is_empty());
            for error in errors {
                prop_assert!(!error.to_string().trim().is_empty());
            }
        }
    }
    // The whole derive: items or `compile_error!`s, always valid tokens.
    let tokens = expand::derive(input);
    prop_assert!(syn::parse2::<syn::File>(tokens).is_ok());
    Ok(())
}

/// Runs [`check`] on `text` if syn parses it; whether it did.
fn check_text(text: &str) -> Result<bool, TestCaseError> {
    match syn::parse_str::<DeriveInput>(text) {
        Ok(input) => check(&input).map(|()| true),
        Err(_) => Ok(false),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn grammar_mutations_never_panic(text in entity(counter_attrs())) {
        check_text(&text)?;
    }

    #[test]
    fn token_soup_never_panics(text in entity(token_soup())) {
        check_text(&text)?;
    }
}

/// The generator reaches both outcomes: a fuzzer that only ever produced
/// errors (or only valid models) would prove little.
#[test]
fn the_grammar_reaches_accepted_and_refused_models() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = entity(counter_attrs());
    let (mut parsed, mut accepted, mut refused) = (0, 0, 0);
    for _ in 0..2000 {
        let text = strategy.new_tree(&mut runner).unwrap().current();
        if let Ok(input) = syn::parse_str::<DeriveInput>(&text) {
            parsed += 1;
            match model::build(&input) {
                Ok(Some(_)) => accepted += 1,
                Ok(None) => {}
                Err(_) => refused += 1,
            }
        }
    }
    eprintln!("2000 generated: {parsed} parsed, {accepted} accepted, {refused} refused");
    assert!(parsed > 1000, "{parsed} of 2000 parsed");
    assert!(
        accepted > 20 && refused > 200,
        "{accepted} accepted, {refused} refused"
    );
}

/// Inputs the fuzzer's grammar is built around, checked by name.
#[test]
fn edge_attributes() {
    for attrs in [
        "#[counter(keys(likes), slots = 1024)]",
        "#[counter(keys(likes), slots = 1025)]",
        "#[counter(keys(likes), slots = 0)]",
        "#[counter(keys(likes), slots = -1)]",
        "#[counter(keys(likes), slots = 65536)]",
        "#[counter(keys(likes), slots = 99999999999999999999999999999999)]",
        "#[counter(keys(likes), slots = \"str\")]",
        "#[counter(keys(likes(slots = 0, window = week)))]",
        "#[counter(keys())]",
        "#[counter(keys(likes, likes))]",
        "#[counter(keys(likes), keys(views))]",
        "#[counter(keys(r#gen, gen))]",
        "#[counter(keys(self, Self, _1, a::b))]",
        "#[counter(keys(likes), table = \"excluded\")]",
        "#[counter(keys(likes), table = \"POSTS\")]",
        "#[counter(keys(likes), cascade = true)]",
        "#[counter(keys(likes) slots = 4)]",
        "#[counter(keys(likes), ,)]",
        "#[counter(keys(likes(slots = 4 window = day)))]",
        "#[counter(keys(likes(window = day)), table = \"ttttttttttttttttttttttttttttttttttttttttttttttttttttttt\")]",
    ] {
        let text = format!(
            "#[sea_orm(table_name = \"posts\")]\n{attrs}\n\
             pub struct Model {{ #[sea_orm(primary_key)] pub id: i64 }}"
        );
        let parsed = check_text(&text).unwrap_or_else(|e| panic!("{attrs}: {e}"));
        assert!(parsed, "{attrs} did not parse");
    }
}
