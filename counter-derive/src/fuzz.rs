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
//! table names valid by counter-core's own rules, and exactly the options
//! and keys syn's own `Meta` grammar reads in the attributes) or return
//! errors that say something, with a fallback whose keys are valid and
//! distinct (it is generated beside the errors, and must add none of its
//! own). Text syn cannot parse is rejected, not passed;
//! a fixed-seed count proves both generators mostly parse and reach both
//! outcomes, and `edge_attributes` pins the exact outcome of each edge
//! input. Only `proc_macro2` is used: `proc_macro` panics outside a macro.

use proptest::{prelude::*, strategy::ValueTree};
use syn::DeriveInput;

use crate::{
    counter::{
        self,
        attr::{self, SlotCount, Window},
        model,
    },
    diagnostics::Checked,
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
    "adaptive(1..=256)",
    "adaptive(4..=4)",
    "adaptive(1..=1024)",
    "adaptive(0..=8)",
    "adaptive(2..=1025)",
    "adaptive(9..=8)",
    "adaptive(1..8)",
    "adaptive(..=8)",
    "adaptive(1..)",
    "adaptive(1, 8)",
    "adaptive()",
    "adaptive(x..=8)",
    "adaptive",
    "Adaptive(1..=8)",
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

/// `crate = ...` values: paths in strings, and what is not one.
const CRATES: &[&str] = &[
    "\"::counter_core\"",
    "\"my_counters\"",
    "\"crate::deps::counters\"",
    "\"\"",
    "\"a b\"",
    "\"a::<T>\"",
    "\"super::x\"",
    "counter_core",
    "5",
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
    "crate",
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
        1 => one(CRATES).prop_map(|v| format!("crate = {v}")),
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
    "crate = \"::counter_core\"",
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
/// with one mutation inserted (an option, or a key), or made of mutations;
/// sometimes none.
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
    // A valid list with one more key (often a duplicate) in `keys(...)`.
    let key_added =
        (valid_options(), key(), any::<bool>()).prop_map(|(mut options, key, first)| {
            let keys = &options[0];
            options[0] = if first {
                format!("keys({key}, {}", &keys["keys(".len()..])
            } else {
                format!("{}, {key})", &keys[..keys.len() - 1])
            };
            format!("#[counter({})]", options.join(", "))
        });
    prop_oneof![
        3 => valid,
        3 => mutated,
        3 => key_added,
        4 => attr.clone(),
        1 => (attr.clone(), attr).prop_map(|(a, b)| format!("{a}\n{b}")),
        1 => Just("#[counter]".to_owned()),
        1 => Just("#[counter = \"keys(likes)\"]".to_owned()),
        1 => Just(String::new()),
    ]
    .boxed()
}

/// Whole valid options, so that soup sometimes makes a valid list.
const CHUNKS: &[&str] = &[
    "keys(likes)",
    "keys(views(slots = 4))",
    "slots = 8",
    "cascade",
    "table = \"post_counters\"",
];

/// Random tokens, most of them from the grammar's own words, with whole
/// options (valid ones, and `slots = ...` of any kind) and commas among them.
fn token_soup() -> BoxedStrategy<String> {
    let token = prop_oneof![
        2 => one(CHUNKS),
        1 => one(SLOTS).prop_map(|v| format!("slots = {v}")),
        3 => Just(",".to_owned()),
        1 => one(KEYS),
        1 => one(OPTIONS),
        1 => one(SLOTS),
        1 => one(TABLES),
        1 => one(VALUES),
        1 => one(PUNCT),
        1 => "[a-z_]{1,8}",
    ];
    proptest::collection::vec(token, 0..12)
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

/// One entry of `keys(...)` as written: a name (any identifier, keywords
/// such as `type` or `true` included, as the derive reads it), its options,
/// or a value it must not have (`likes = 1`).
struct WrittenKey {
    ident: syn::Ident,
    options: Option<syn::punctuated::Punctuated<syn::Meta, syn::Token![,]>>,
    assigned: bool,
}

impl syn::parse::Parse for WrittenKey {
    fn parse(input: syn::parse::ParseStream) -> syn::Result<Self> {
        use syn::ext::IdentExt;
        let ident = input.call(syn::Ident::parse_any)?;
        if input.peek(syn::token::Paren) {
            let content;
            syn::parenthesized!(content in input);
            let options = content.parse_terminated(syn::Meta::parse, syn::Token![,])?;
            return Ok(Self {
                ident,
                options: Some(options),
                assigned: false,
            });
        }
        let assigned = input.peek(syn::Token![=]);
        if assigned {
            input.parse::<syn::Token![=]>()?;
            input.parse::<syn::Expr>()?;
        }
        Ok(Self {
            ident,
            options: None,
            assigned,
        })
    }
}

/// The keys the `#[counter]` attributes of an accepted input list, read
/// with syn's own `Meta` grammar (each key as a [`WrittenKey`]: `Meta`
/// refuses `true` as a name): an independent oracle that every option
/// is one the derive knows, written once, with a value where it needs one.
/// A parser that skipped an unknown or repeated option without an error
/// would accept what this refuses.
fn written(input: &DeriveInput) -> Result<Vec<String>, String> {
    use syn::{Meta, ext::IdentExt, punctuated::Punctuated};
    type List = Punctuated<Meta, syn::Token![,]>;
    let mut seen = Vec::new();
    let mut keys = Vec::new();
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("counter")) {
        let options = attr
            .parse_args_with(List::parse_terminated)
            .map_err(|e| format!("accepted, but no option list: {e}"))?;
        for option in options {
            let name = option.path().get_ident().map(|i| i.unraw().to_string());
            let name = name.ok_or("accepted an option that is a path")?;
            if seen.contains(&name) {
                return Err(format!("accepted `{name}` twice"));
            }
            match (name.as_str(), &option) {
                ("keys", Meta::List(list)) => {
                    for key in list
                        .parse_args_with(Punctuated::<WrittenKey, syn::Token![,]>::parse_terminated)
                        .map_err(|e| e.to_string())?
                    {
                        let ident = &key.ident;
                        if key.assigned {
                            return Err(format!("accepted `{ident} = ...`"));
                        }
                        let mut key_options = Vec::new();
                        for o in key.options.iter().flatten() {
                            let o = match &o {
                                Meta::NameValue(nv) => {
                                    nv.path.get_ident().map(|i| i.unraw().to_string())
                                }
                                _ => None,
                            };
                            match o {
                                Some(o)
                                    if ["slots", "window"].contains(&o.as_str())
                                        && !key_options.contains(&o) =>
                                {
                                    key_options.push(o)
                                }
                                o => {
                                    return Err(format!("accepted key option {o:?} of `{ident}`"));
                                }
                            }
                        }
                        keys.push(ident.unraw().to_string());
                    }
                }
                ("slots" | "table" | "slot_strategy" | "crate", Meta::NameValue(_))
                | ("cascade", Meta::Path(_)) => {}
                _ => return Err(format!("accepted the option `{name}` as written")),
            }
            seen.push(name);
        }
    }
    Ok(keys)
}

/// A slot count the derive may accept.
fn valid_slots(slots: SlotCount) -> bool {
    match slots {
        SlotCount::Fixed(n) => (1..=1024).contains(&n),
        SlotCount::Adaptive(min, max) => 1 <= min && min <= max && max <= 1024,
    }
}

/// counter-core's policy for `slots`.
fn policy(slots: SlotCount) -> counter_core::Result<counter_core::SlotPolicy> {
    match slots {
        SlotCount::Fixed(n) => counter_core::Slots::new(n).map(counter_core::SlotPolicy::Fixed),
        SlotCount::Adaptive(min, max) => counter_core::SlotPolicy::adaptive(min..=max),
    }
}

/// The derive on `input`: no panic, and either a model counter-core accepts
/// or errors with messages.
fn check(input: &DeriveInput) -> Result<(), TestCaseError> {
    match model::build(input) {
        Checked::Skip => prop_assert_eq!(input.ident.to_string(), "ModelEx"),
        Checked::Valid(model) => {
            prop_assert!(valid_slots(model.slots), "slots {}", model.slots);
            prop_assert!(!model.keys.is_empty());
            let written = written(input).map_err(TestCaseError::fail)?;
            let keys: Vec<&str> = model.keys.iter().map(|k| k.name.as_str()).collect();
            prop_assert_eq!(keys, written, "the model's keys are the keys written");
            prop_assert!(
                counter_core::CounterTable::new(model.table.clone()).is_ok(),
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
                .and_then(|t| Ok(t.with_slot_policy(policy(model.slots)?)))
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
                    prop_assert!(valid_slots(slots), "{}: {} slots", key.name, slots);
                    config = policy(slots)
                        .and_then(|policy| config.with_key_slot_policy(&key.name, policy))
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
        Checked::Invalid(errors, fallback) => {
            prop_assert!(!errors.to_string().trim().is_empty());
            for error in errors {
                prop_assert!(!error.to_string().trim().is_empty());
            }
            prop_assert!(
                fallback.is_none() || input.ident == "Model",
                "a fallback for `{}`",
                input.ident
            );
            for (i, key) in fallback.iter().flat_map(|f| &f.keys).enumerate() {
                prop_assert!(attr::key_name_problem(&key.name).is_none(), "{}", key.name);
                let keys = &fallback.as_ref().expect("has keys").keys;
                prop_assert!(
                    keys[..i]
                        .iter()
                        .all(|o| o.name != key.name && o.variant != key.variant),
                    "duplicate fallback key {}",
                    key.name
                );
            }
        }
    }
    // The whole derive: items, or `compile_error!`s and the fallback,
    // always valid tokens.
    let tokens = counter::derive(input);
    prop_assert!(syn::parse2::<syn::File>(tokens).is_ok());
    Ok(())
}

/// Runs [`check`] on `text`. Text syn cannot parse is no test case: it is
/// rejected (`prop_assume!`), so proptest generates another, and fails the
/// test if too many are rejected; the generators yield mostly parseable
/// text (see [`generators_reach_both_outcomes`]).
fn check_text(text: &str) -> Result<(), TestCaseError> {
    let input = syn::parse_str::<DeriveInput>(text);
    prop_assume!(input.is_ok(), "syn cannot parse it");
    check(&input.expect("assumed to parse"))
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

/// What `cases` inputs of `strategy` (fixed seed) come to: how many syn
/// parses, and of those how many the derive accepts and refuses.
fn outcomes(strategy: impl Strategy<Value = String>, cases: usize) -> (usize, usize, usize) {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let (mut parsed, mut accepted, mut refused) = (0, 0, 0);
    for _ in 0..cases {
        let text = strategy.new_tree(&mut runner).unwrap().current();
        if let Ok(input) = syn::parse_str::<DeriveInput>(&text) {
            parsed += 1;
            match model::build(&input) {
                Checked::Valid(_) => accepted += 1,
                Checked::Skip => {}
                Checked::Invalid(..) => refused += 1,
            }
        }
    }
    (parsed, accepted, refused)
}

/// Both generators mostly yield text syn parses (what does not is rejected,
/// not tested) and reach both outcomes: a fuzzer that only ever produced
/// unparseable text, or only errors, or only valid models, would prove
/// little.
#[test]
fn generators_reach_both_outcomes() {
    let (parsed, accepted, refused) = outcomes(entity(counter_attrs()), 2000);
    eprintln!("grammar, 2000 generated: {parsed} parsed, {accepted} accepted, {refused} refused");
    assert!(parsed > 1800, "grammar: {parsed} of 2000 parsed");
    assert!(
        accepted > 100 && refused > 1400,
        "grammar: {accepted} accepted, {refused} refused"
    );
    let (parsed, accepted, refused) = outcomes(entity(token_soup()), 2000);
    eprintln!(
        "token soup, 2000 generated: {parsed} parsed, {accepted} accepted, {refused} refused"
    );
    assert!(parsed > 1600, "token soup: {parsed} of 2000 parsed");
    assert!(
        accepted >= 5 && refused > 1500,
        "token soup: {accepted} accepted, {refused} refused"
    );
}

/// The model, in short: `table slots key[:slots][:window]...`.
fn summary(model: &model::CounterModel) -> String {
    let mut out = format!("{} {}", model.table, model.slots);
    for key in &model.keys {
        out.push(' ');
        out.push_str(&key.name);
        if let Some(slots) = key.slots {
            out.push_str(&format!(":{slots}"));
        }
        match key.window {
            Some(Window::Hour) => out.push_str(":hour"),
            Some(Window::Day) => out.push_str(":day"),
            None => {}
        }
    }
    out
}

/// What the derive must make of an edge input.
#[derive(Debug)]
enum Expect {
    /// Accepted, with this [`summary`].
    Model(String),
    /// Refused, with (at least) these messages, each within one error.
    Errors(&'static [&'static str]),
}

/// Inputs the fuzzer's grammar is built around, each with its exact
/// outcome: the model accepted, or the errors it is refused with.
#[test]
fn edge_attributes() {
    use Expect::{Errors, Model};
    let s = str::to_owned;
    let k64 = "k".repeat(64);
    let t55 = "t".repeat(55);
    let t56 = "t".repeat(56);
    let cases: Vec<(String, Expect)> = vec![
        ("#[counter(keys(likes), slots = 1024)]".into(), Model(s("posts_counters 1024 likes"))),
        ("#[counter(keys(likes), slots = 1)]".into(), Model(s("posts_counters 1 likes"))),
        ("#[counter(keys(likes), slots = 0x10)]".into(), Model(s("posts_counters 16 likes"))),
        ("#[counter(keys(likes), slots = 4i64)]".into(), Model(s("posts_counters 4 likes"))),
        ("#[counter(keys(likes), slots = 1025)]".into(), Errors(&["1025 slots is too many: at most 1024"])),
        ("#[counter(keys(likes), slots = 0)]".into(), Errors(&["slots must be at least 1"])),
        ("#[counter(keys(likes), slots = -1)]".into(), Errors(&["slots must be an integer literal from 1 to 1024"])),
        ("#[counter(keys(likes), slots = 65536)]".into(), Errors(&["65536 slots is too many: at most 1024"])),
        (
            "#[counter(keys(likes), slots = 99999999999999999999999999999999)]".into(),
            Errors(&["slots must be an integer literal from 1 to 1024"]),
        ),
        ("#[counter(keys(likes), slots = \"str\")]".into(), Errors(&["slots must be an integer literal from 1 to 1024"])),
        ("#[counter(keys(likes), slots = 1.5)]".into(), Errors(&["slots must be an integer literal from 1 to 1024"])),
        ("#[counter(keys(likes), slots)]".into(), Errors(&["`slots` takes a value: `slots = 64`"])),
        (
            "#[counter(keys(likes(slots = 0, window = week)))]".into(),
            Errors(&["slots must be at least 1", "unknown window `week`; expected one of: `hour`, `day`"]),
        ),
        (
            "#[counter(keys(likes(slots = 1024, window = \"hour\"), views(window = day)), slots = 8)]".into(),
            Model(s("posts_counters 8 likes:1024:hour views:day")),
        ),
        ("#[counter(keys(likes(slots)))]".into(), Errors(&["`slots` takes a value: `slots = 64`"])),
        ("#[counter(keys(likes(slot = 4)))]".into(), Errors(&["unknown key option `slot`; did you mean `slots`?"])),
        ("#[counter(keys(likes(window = 3)))]".into(), Errors(&["`window` is one of `hour` or `day`"])),
        ("#[counter(keys(likes(slots = 2, slots = 3)))]".into(), Errors(&["duplicate key option `slots`"])),
        ("#[counter(keys(likes = 4))]".into(), Errors(&["options of a key go in parentheses: `likes(slots = 64)`"])),
        // syn refuses empty parentheses before `attr` can say "`keys(...)`
        // needs at least one key".
        ("#[counter(keys())]".into(), Errors(&["expected nested attribute"])),
        ("#[counter(keys)]".into(), Errors(&["`keys` lists the counters in parentheses"])),
        ("#[counter(keys = 4)]".into(), Errors(&["`keys` lists the counters in parentheses"])),
        ("#[counter(slots = 4)]".into(), Errors(&["missing `keys`: name the counters"])),
        ("#[counter]".into(), Errors(&["missing `keys`: name the counters"])),
        ("#[counter(keys(likes, likes))]".into(), Errors(&["duplicate key `likes`"])),
        ("#[counter(keys(likes), keys(views))]".into(), Errors(&["duplicate option `keys`"])),
        ("#[counter(keys(likes))]\n#[counter(keys(views))]".into(), Errors(&["duplicate option `keys`"])),
        ("#[counter(keys(likes))]\n#[counter(slots = 4)]".into(), Model(s("posts_counters 4 likes"))),
        ("#[counter(keys(r#gen, gen))]".into(), Errors(&["duplicate key `gen`"])),
        ("#[counter(keys(r#type, gen, l1, x_))]".into(), Model(s("posts_counters 16 type gen l1 x_"))),
        // Found by `grammar_mutations_never_panic` (proptest-regressions/fuzz.txt).
        ("#[counter(r#keys(true))]".into(), Model(s("posts_counters 16 true"))),
        (
            "#[counter(keys(self, Self, _1, a::b))]".into(),
            Errors(&[
                "invalid key `self`: `self`, `super` and `crate` cannot name a struct field",
                "invalid key `Self`: keys are lowercase snake_case ASCII identifiers",
                "invalid key `_1`: keys are lowercase snake_case ASCII identifiers",
                "a key is a single identifier, like `likes`",
            ]),
        ),
        ("#[counter(keys(lik\u{e9}s))]".into(), Errors(&["invalid key `lik\u{e9}s`: keys are lowercase"])),
        (format!("#[counter(keys({k64}))]"), Model(format!("posts_counters 16 {k64}"))),
        (format!("#[counter(keys({k64}k))]"), Errors(&["a key is at most 64 bytes long"])),
        ("#[counter(keys(likes), table = \"excluded\")]".into(), Errors(&["`excluded` names the proposed row in upserts"])),
        (
            "#[counter(keys(likes), table = \"POSTS\")]".into(),
            Errors(&["the counter table cannot be the owner's own table"]),
        ),
        ("#[counter(keys(likes), table = \"\")]".into(), Errors(&["invalid table name \"\": a table name cannot be empty"])),
        ("#[counter(keys(likes), table = \"1x\")]".into(), Errors(&["a table name cannot start with a digit"])),
        (
            "#[counter(keys(likes), table = \"t; DROP TABLE posts; --\")]".into(),
            Errors(&["a table name may only contain ASCII letters, digits and '_'"]),
        ),
        ("#[counter(keys(likes), table = post_counters)]".into(), Errors(&["`table` takes a string literal"])),
        ("#[counter(keys(likes), table = \"post_counters\")]".into(), Model(s("post_counters 16 likes"))),
        ("#[counter(keys(likes), slot_strategy = \"random\", cascade)]".into(), Model(s("posts_counters 16 likes"))),
        ("#[counter(keys(likes), slot_strategy = random)]".into(), Errors(&["`slot_strategy` takes a string literal"])),
        (
            "#[counter(keys(likes), slot_strategy = \"round_robin\")]".into(),
            Errors(&["unknown slot strategy `round_robin`"]),
        ),
        ("#[counter(keys(likes), cascade = true)]".into(), Errors(&["`cascade` is a flag and takes no value"])),
        ("#[counter(keys(likes), slot = 4)]".into(), Errors(&["unknown option `slot`; did you mean `slots`?"])),
        (
            "#[counter(keys(likes), foo)]".into(),
            Errors(&[
                "unknown option `foo`; expected one of: `keys`, `slots`, `table`, `slot_strategy`, `cascade`, `crate`",
            ]),
        ),
        ("#[counter(keys(likes), crate = \"::my_counters\")]".into(), Model(s("posts_counters 16 likes"))),
        ("#[counter(keys(likes), crate = \"crate::deps::cc\")]".into(), Model(s("posts_counters 16 likes"))),
        ("#[counter(keys(likes), crate = my_counters)]".into(), Errors(&["`crate` takes a string literal"])),
        ("#[counter(keys(likes), crate = \"a b\")]".into(), Errors(&["\"a b\" is no path"])),
        ("#[counter(keys(likes), crate = \"a::<T>\")]".into(), Errors(&["\"a::<T>\" is no path"])),
        (
            "#[counter(keys(likes), crate = \"super::deps::cc\")]".into(),
            Errors(&["is read from the generated `counters` module too"]),
        ),
        ("#[counter(keys(likes), crate)]".into(), Errors(&["`crate` takes a value"])),
        ("#[counter(keys(likes), a::keys(views))]".into(), Errors(&["unknown option `a::keys`"])),
        ("#[counter(keys(likes) slots = 4)]".into(), Errors(&["expected `,`"])),
        ("#[counter(keys(likes), ,)]".into(), Errors(&["unexpected token in nested attribute, expected ident"])),
        ("#[counter(keys(likes(slots = 4 window = day)))]".into(), Errors(&["expected `,`"])),
        (
            format!("#[counter(keys(likes(window = day)), table = \"{t55}\")]"),
            Model(format!("{t55} 16 likes:day")),
        ),
        (
            format!("#[counter(keys(likes(window = day)), table = \"{t56}\")]"),
            Errors(&["a windowed key keeps its buckets in"]),
        ),
    ];
    let mut wrong = Vec::new();
    for (attrs, expect) in cases {
        let text = format!(
            "#[sea_orm(table_name = \"posts\")]\n{attrs}\n\
             pub struct Model {{ #[sea_orm(primary_key)] pub id: i64 }}"
        );
        let input = syn::parse_str::<DeriveInput>(&text)
            .unwrap_or_else(|e| panic!("{attrs} did not parse: {e}"));
        check(&input).unwrap_or_else(|e| panic!("{attrs}: {e}"));
        match (model::build(&input), expect) {
            (Checked::Valid(model), Model(expected)) if summary(&model) == expected => {}
            (Checked::Valid(model), expected) => {
                wrong.push(format!(
                    "{attrs}: accepted as {:?}, expected {expected:?}",
                    summary(&model)
                ));
            }
            (Checked::Invalid(errors, _), Errors(expected)) => {
                let messages: Vec<String> = errors.into_iter().map(|e| e.to_string()).collect();
                for wanted in expected {
                    if !messages.iter().any(|m| m.contains(wanted)) {
                        wrong.push(format!(
                            "{attrs}: no error says {wanted:?}; got {messages:?}"
                        ));
                    }
                }
            }
            (Checked::Invalid(errors, _), expected) => {
                wrong.push(format!(
                    "{attrs}: refused ({errors}), expected {expected:?}"
                ));
            }
            (Checked::Skip, _) => wrong.push(format!("{attrs}: nothing to generate")),
        }
    }
    assert!(
        wrong.is_empty(),
        "{} edge inputs went wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
