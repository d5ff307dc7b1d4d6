//! The console at `/ui` in a real browser: Debian's headless Chromium,
//! driven through `chromedriver` (WebDriver) against a live service with
//! tokens and seeded counts. What the pages show, as rendered, is checked
//! against the API: every owner's counts and unique estimates, paging
//! through a ranking, a chart's range sum; a hostile owner name shown as
//! text; a reader without the admin buttons (and refused when it forges
//! the call), an admin's dry-run check; with Redis configured, the health
//! page's cache hit ratio over its window (not the last interval, not
//! since start). It saves screenshots of the main pages on the way
//! (`COUNTER_TEST_SCREENSHOTS`, for the guide).
//!
//! Runs where `COUNTER_TEST_CHROMEDRIVER` names the `chromedriver` binary
//! (Debian's `chromium-driver`, with `chromium` at `/usr/bin/chromium`).

use std::{
    collections::BTreeMap,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use chrono::{DateTime, Days, Utc};
use counter_tests::{Backend, TestDb, backend_test, servers::free_port};
use fantoccini::{Client, ClientBuilder, Locator};
use hyper::Method;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};

use crate::support::{
    ADMIN, Api, NAMESPACES, READER, Running, Scratch, TOKENS, WRITER, cache_section, config_text,
};

const CHROMEDRIVER_VAR: &str = "COUNTER_TEST_CHROMEDRIVER";
const SCREENSHOTS_VAR: &str = "COUNTER_TEST_SCREENSHOTS";
const CHROMIUM: &str = "/usr/bin/chromium";
/// The longest any page may take to show what it loads: a bound on a
/// hang, not a speed claim (a page shows in well under a second alone, but
/// CI runs this beside tests that keep both cores busy).
const WAIT: Duration = Duration::from_secs(30);
/// The longest the whole browsing part may take (alone: about 9 s).
const WHOLE: Duration = Duration::from_secs(240);
/// Where console.js keeps the token (`TOKEN_KEY`).
const TOKEN_KEY: &str = "counter-service.token";
/// Owners of `posts` with `likes`: more than two pages of 20.
const OWNERS: i64 = 45;
/// Owners of `posts` with every kind of key.
const FULL_OWNERS: [i64; 4] = [1, 2, 3, 4];
/// Owners no seed or page reads but the cache part of the health page.
const CACHE_OWNERS: &str = "/v1/posts/counts:batchGet?owners=2001,2002,2003,2004,2005&keys=likes";
/// Owner names that are markup.
const HOSTILE: [&str; 2] = [
    "<img src=x onerror=alert(1)>",
    "\"><script>alert(2)</script>",
];

fn chromedriver_binary(t: &TestDb) -> Option<PathBuf> {
    match std::env::var_os(CHROMEDRIVER_VAR) {
        Some(path) => Some(PathBuf::from(path)),
        None => {
            eprintln!(
                "[{}] {}: browser skipped, {CHROMEDRIVER_VAR} is not set",
                t.backend,
                t.label()
            );
            None
        }
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_console_in_a_browser_shows_what_the_api_answers(t: TestDb) {
        let Some(chromedriver) = chromedriver_binary(&t) else {
            t.finish().await;
            return;
        };
        let b = t.backend.to_string();
        let scratch = Scratch::of(&t).await;
        // A cache where Redis is configured: the health page's hit ratio.
        let cache = cache_section(&t).unwrap_or_default();
        let service = Running::start(&config_text("", &scratch, &format!("{NAMESPACES}\n{TOKENS}\n{cache}"))).await;
        let seeded = seed(&service.api, &b).await;

        let started = Instant::now();
        let driver = Chromedriver::start(&chromedriver, &b).await;
        // The guide's screenshots are PostgreSQL's (one backend writes them).
        let shots = match std::env::var_os(SCREENSHOTS_VAR) {
            Some(dir) if t.backend == Backend::Postgres => Shots { dir: PathBuf::from(dir), keep: true },
            _ => Shots { dir: driver.dir.join("screenshots"), keep: false },
        };
        std::fs::create_dir_all(&shots.dir).unwrap_or_else(|e| panic!("{}: {e}", shots.dir.display()));
        tokio::time::timeout(WHOLE, async {
            let page = Page::open(&driver, &service.api, &b).await;
            browse(&page, &service.api, &seeded, &shots).await;
            page.client.close().await.unwrap_or_else(|e| panic!("[{b}] closing the browser: {e}"));
        })
        .await
        .unwrap_or_else(|_| panic!("[{b}] the browser test took over {WHOLE:?}"));
        drop(driver);
        eprintln!("[{b}] browser: the console checked in {:?}", started.elapsed());

        service.stop().await;
        t.finish().await;
    }
}

/// Everything the browser does, in order: the pages a reader sees, then
/// an admin's.
async fn browse(page: &Page, api: &Api, seeded: &Seeded, shots: &Shots) {
    let b = &page.backend;

    // No token yet: the page asks for one.
    page.client
        .goto(&format!("{}/ui", api.base))
        .await
        .unwrap_or_else(|e| panic!("[{b}] opening /ui: {e}"));
    page.wait(
        "the page asking for a token",
        "return view.querySelector('[data-test=need-token]') !== null",
    )
    .await;

    // The reader's token, typed into the box.
    page.use_token(READER).await;
    let stored = page
        .script(&format!("return sessionStorage.getItem('{TOKEN_KEY}')"))
        .await;
    assert_eq!(
        stored,
        json!(READER),
        "[{b}] the token kept in sessionStorage"
    );
    let namespaces = page
        .wait(
            "the namespaces",
            "const list = view.querySelector('[data-test=namespace-list]');
             if (!list) return null;
             return [...list.querySelectorAll('[data-test=key-row]')].map((r) => r.dataset.ns + '/' + r.dataset.key);",
        )
        .await;
    for key in [
        "posts/likes",
        "posts/views",
        "posts/comments",
        "posts/viewers",
        "posts/reaction:heart",
        "users/followers",
        "tags/uses",
        "tags/visitors",
    ] {
        assert!(
            namespaces.as_array().unwrap().contains(&json!(key)),
            "[{b}] the namespaces page lacks the key row {key}: {namespaces}"
        );
    }
    shots.save(page, "namespaces").await;

    // 1. Every owner's counts and estimates equal the API's.
    for owner in FULL_OWNERS.into_iter().chain([OWNERS]) {
        page.navigate(&format!("#/owner/posts/{owner}")).await;
        let shown = owner_page(page, api, "posts", &json!(owner), &owner.to_string()).await;
        let likes = shown.counts.get("likes").map(String::as_str);
        assert_eq!(
            likes,
            Some(en_us(seeded.likes[&owner]).as_str()),
            "[{b}] owner {owner}: the likes shown against the seeded total"
        );
        if owner == 4 {
            shots.save(page, "owner").await;
        }
    }

    // 3. A chosen range's sum equals the series over it.
    range_sum(page, api, seeded).await;

    // 2. Paging through the ranking reaches every owner once.
    ranking(page, seeded, shots).await;

    // 4. Hostile owner names are text.
    hostile_names(page, api).await;

    // 6. The owner page and the ranking's first page follow adds live.
    live(page, api, seeded).await;

    // 5. A reader has no admin button, and is refused the call it forges.
    page.navigate("#/checks").await;
    let checks = page
        .wait(
            "the reader's check page",
            "if (view.querySelectorAll('[data-test=checks-ns]').length !== 3) return null;
             return {
               note: view.querySelector('[data-test=checks-need-admin]') !== null,
               buttons: document.querySelectorAll('[data-test=check-now], [data-test=compact-now]').length,
             };",
        )
        .await;
    assert_eq!(
        checks,
        json!({"note": true, "buttons": 0}),
        "[{b}] a reader's check page: the admin note and no admin button"
    );
    let forged = page
        .script(&format!(
            "return fetch('/v1/posts/admin:check?dry_run=true', {{
               method: 'POST',
               headers: {{ Authorization: 'Bearer ' + sessionStorage.getItem('{TOKEN_KEY}') }},
             }}).then(async (r) => ({{ status: r.status, type: r.headers.get('content-type'), body: await r.text() }}));"
        ))
        .await;
    let body: Value =
        serde_json::from_str(forged["body"].as_str().unwrap_or_default()).unwrap_or(Value::Null);
    assert_eq!(
        (
            forged["status"].clone(),
            forged["type"].clone(),
            body["kind"].clone(),
            body["status"].clone()
        ),
        (
            json!(403),
            json!("application/problem+json"),
            json!("forbidden"),
            json!(403)
        ),
        "[{b}] an admin call forged from the page with the reader's token: {forged}"
    );

    // An admin's token, on the same page: the buttons, and a dry-run check
    // that ends in the history.
    page.use_token(ADMIN).await;
    let ready = page
        .wait(
            "the admin's check page",
            "const sections = [...view.querySelectorAll('[data-test=checks-ns]')];
             if (sections.length !== 3 || sections.some((s) => !s.querySelector('.history')?.childElementCount)) return null;
             return sections.map((s) => [s.dataset.ns, s.querySelectorAll('[data-test=check-now], [data-test=compact-now]').length]);",
        )
        .await;
    assert_eq!(
        ready,
        json!([["posts", 2], ["tags", 2], ["users", 2]]),
        "[{b}] the admin's buttons per namespace"
    );
    page.find("[data-test=check-now][data-ns=posts]")
        .await
        .click()
        .await
        .unwrap_or_else(|e| panic!("[{b}] clicking check-now: {e}"));
    let run = page
        .wait(
            "the finished dry-run check",
            "const status = view.querySelector('[data-test=job-status][data-ns=posts]');
             const row = view.querySelector('[data-test=check-runs][data-ns=posts] [data-test=check-run]');
             if (!status || !status.dataset.state || !row) return null;
             return { state: status.dataset.state, cells: [...row.cells].slice(1).map((c) => c.innerText) };",
        )
        .await;
    let jobs = api.get("/v1/posts/admin/jobs", Some(ADMIN)).await.ok();
    let job = &jobs["jobs"][0];
    let report = &job["report"]["checks"][0];
    assert_eq!(
        (job["kind"].as_str(), job["state"].as_str()),
        (Some("check_dry_run"), Some("done")),
        "[{b}] the job the button started: {jobs}"
    );
    let expected = json!({
        "state": "done",
        "cells": ["dry run", "done", "comments", en_us(report["owners_checked"].as_i64().unwrap()),
                  en_us(report["owners_drifted"].as_i64().unwrap()), en_us(report["total_abs_drift"].as_i64().unwrap()), "no"],
    });
    assert_eq!(
        run, expected,
        "[{b}] the check run shown against the job's report {job}"
    );
    assert_eq!(
        report["total_abs_drift"],
        json!(seeded.comments),
        "[{b}] the seeded drift: {report}"
    );
    shots.save(page, "checks").await;

    // Health: `/readyz`'s components (and the rates, for a kept screenshot).
    // With a cache, owners never read are read first, before the page
    // opens: misses its window must not count. A fill is stored after its
    // read answers, so they are read until a read misses none.
    let cached = api.get("/readyz", None).await.json.get("cache").is_some();
    if cached {
        let deadline = Instant::now() + WAIT;
        loop {
            let misses = api.metric("counter_service_cache_misses_total").await;
            api.get(CACHE_OWNERS, Some(READER)).await.ok();
            if api.metric("counter_service_cache_misses_total").await == misses {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "[{b}] {CACHE_OWNERS} still misses the cache after {WAIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    page.navigate("#/health").await;
    let health = page
        .wait(
            "the health page",
            "const db = view.querySelector('[data-test=component][data-name=database]');
             if (!db) return null;
             return { ok: db.dataset.ok, status: view.querySelector('[data-test=ready-status]').innerText };",
        )
        .await;
    assert_eq!(
        health,
        json!({"ok": "true", "status": "Status: ready"}),
        "[{b}] the health page"
    );
    if cached {
        cache_ratio_over_its_window(page, api).await;
    }
    if shots.keep {
        // For the guide: traffic, and two intervals of rates (6 s).
        let traffic = {
            let api = api.clone();
            tokio::spawn(async move {
                loop {
                    api.post(
                        "/v1/posts/counters:add",
                        Some(WRITER),
                        json!({"owner": 1000, "key": "likes"}),
                    )
                    .await;
                    api.get(
                        "/v1/posts/counts:batchGet?owners=1,2,3&keys=likes,views",
                        Some(READER),
                    )
                    .await;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        };
        page.wait(
            "the health page's rates",
            "const line = view.querySelector('[data-test=requests-spark] polyline');
             return line !== null && line.getAttribute('points').split(' ').length >= 2;",
        )
        .await;
        traffic.abort();
    }
    shots.save(page, "health").await;

    page.assert_no_alert("the end").await;
    shots.check(b);
}

/// The health page's cache hit ratio is the window's: reads that missed
/// before the page opened do not count, and an interval without a read
/// keeps the ratio of the window's reads (the last interval alone would
/// have none, and the service's ratio since start is far below 100 %).
async fn cache_ratio_over_its_window(page: &Page, api: &Api) {
    let b = &page.backend;
    // Hits only (the owners were read, so filled, before the page opened),
    // through the page's first interval; then nothing.
    let until = Instant::now() + Duration::from_millis(1_500);
    while Instant::now() < until {
        api.get(CACHE_OWNERS, Some(READER)).await.ok();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Two intervals computed: the one with the hits, one with no read.
    page.wait(
        "two intervals of rates",
        "const line = view.querySelector('[data-test=requests-spark] polyline');
         return line !== null && line.getAttribute('points').split(' ').length >= 2;",
    )
    .await;
    let shown = page
        .wait(
            "the cache hit ratio",
            "const cell = view.querySelector('[data-test=rate][data-rate=cache]');
             return cell && cell.innerText;",
        )
        .await;
    assert_eq!(
        shown,
        json!("100.0 %"),
        "[{b}] the cache hit ratio of the page's window"
    );
}

// ---------------------------------------------------------------- pages

/// What an owner page shows, by key.
struct OwnerPage {
    counts: BTreeMap<String, String>,
}

/// Waits for the owner page of `owner` (`text` as the page names it),
/// then checks each count cell against `counts:batchGet`, each unique
/// estimate against `uniques:batchGet` and each range sum against `series`
/// over the range the page shows.
async fn owner_page(page: &Page, api: &Api, ns: &str, owner: &Value, text: &str) -> OwnerPage {
    let b = &page.backend;
    let shown = page
        .wait(
            &format!("the owner page of {text}"),
            "const name = view.querySelector('[data-test=owner-name]');
             const form = view.querySelector('[data-test=range-form]');
             const cells = [...view.querySelectorAll('[data-test=count], [data-test=range-sum], [data-test=unique-estimate]')];
             if (!name || !form || cells.some((c) => c.textContent === '…')) return null;
             const byKey = (test) => Object.fromEntries([...view.querySelectorAll(`[data-test=${test}]`)].map((c) => [c.dataset.key, c.innerText]));
             return {
               name: name.innerText,
               counts: byKey('count'),
               sums: byKey('range-sum'),
               uniques: byKey('unique-estimate'),
               from: view.querySelector('[data-test=range-from]').value,
               to: view.querySelector('[data-test=range-to]').value,
             };",
        )
        .await;
    let what = format!("[{b}] {ns} owner {text}");
    assert_eq!(
        shown["name"],
        json!(text),
        "{what}: the owner's name in the heading"
    );
    let counts: BTreeMap<String, String> = serde_json::from_value(shown["counts"].clone()).unwrap();
    assert!(!counts.is_empty(), "{what}: no count shown");

    let keys: Vec<&String> = counts.keys().collect();
    let totals = api
        .totals(ns, Some(READER), json!([owner]), json!(keys))
        .await;
    let totals = totals
        .as_object()
        .and_then(|o| o.values().next())
        .unwrap_or_else(|| panic!("{what}: counts:batchGet {totals}"));
    for (key, shown) in &counts {
        let api_total = totals[key]
            .as_i64()
            .unwrap_or_else(|| panic!("{what}: counts:batchGet has no {key}: {totals}"));
        assert_eq!(
            shown,
            &en_us(api_total),
            "{what}: the count of {key} shown against counts:batchGet"
        );
    }

    let (from, to) = (
        range_end(&shown["from"], &what),
        range_end(&shown["to"], &what),
    );
    let uniques: BTreeMap<String, String> =
        serde_json::from_value(shown["uniques"].clone()).unwrap();
    for (key, shown) in &uniques {
        // `viewers` has a window: over the page's range; `visitors` all time.
        let mut body = json!({"owners": [owner], "keys": [key]});
        if key == "viewers" {
            body["from"] = json!(from);
            body["to"] = json!(to);
        }
        let reply = api
            .post(
                &format!("/v1/{ns}/uniques:batchGet"),
                Some(READER),
                body.clone(),
            )
            .await
            .ok();
        let estimate = reply["uniques"]
            .as_object()
            .and_then(|o| o.values().next())
            .map(|v| v[key].clone());
        let estimate = estimate
            .and_then(|v| v.as_i64())
            .unwrap_or_else(|| panic!("{what}: uniques:batchGet {body}: {reply}"));
        assert_eq!(
            shown,
            &format!("≈ {}", en_us(estimate)),
            "{what}: the estimate of {key} shown against uniques:batchGet {body}"
        );
    }

    let sums: BTreeMap<String, String> = serde_json::from_value(shown["sums"].clone()).unwrap();
    for (key, shown_sum) in &sums {
        let series = series(api, ns, text, key, &from, &to).await;
        assert_eq!(
            shown_sum,
            &en_us(series.iter().sum()),
            "{what}: the range sum of {key} from {from} to {to} against series"
        );
    }
    OwnerPage { counts }
}

/// On owner 4's page: a range of three whole days chosen by hand, day
/// buckets, applied; its sum and each bar against `series`.
async fn range_sum(page: &Page, api: &Api, seeded: &Seeded) {
    let b = &page.backend;
    page.navigate("#/owner/posts/4").await;
    owner_page(page, api, "posts", &json!(4), "4").await;
    let from = seeded.today - Days::new(4);
    let to = seeded.today - Days::new(1);
    let (from_value, to_value) = (
        from.format("%Y-%m-%dT%H:%M").to_string(),
        to.format("%Y-%m-%dT%H:%M").to_string(),
    );
    // datetime-local inputs take their value from script (typing into
    // them depends on the locale); the `input` event is the user's.
    page.script(&format!(
        "for (const [id, value] of [['range-from', '{from_value}'], ['range-to', '{to_value}']]) {{
           const input = document.getElementById(id);
           input.value = value;
           input.dispatchEvent(new Event('input', {{ bubbles: true }}));
         }}
         for (const figure of document.querySelectorAll('[data-test=series]')) figure.setAttribute('data-stale', '');
         return null;"
    ))
    .await;
    page.find("[data-test=range-bucket]")
        .await
        .select_by_value("day")
        .await
        .unwrap_or_else(|e| panic!("[{b}] choosing day buckets: {e}"));
    page.find("[data-test=range-apply]")
        .await
        .click()
        .await
        .unwrap_or_else(|e| panic!("[{b}] applying the range: {e}"));
    let shown = page
        .wait(
            "the chart over the chosen range",
            "const figure = view.querySelector('[data-test=series][data-key=views]:not([data-stale])');
             const sum = figure && figure.querySelector('[data-test=range-sum]');
             const chart = figure && figure.querySelector('[data-test=chart]');
             if (!sum || sum.textContent === '…' || !chart) return null;
             return {
               preset: view.querySelector('[data-test=range-preset]').value,
               from: view.querySelector('[data-test=range-from]').value,
               to: view.querySelector('[data-test=range-to]').value,
               sum: sum.innerText,
               buckets: chart.dataset.buckets,
               bars: [...chart.querySelectorAll('rect.bar')].map((r) => Number(r.dataset.count)),
             };",
        )
        .await;
    assert_eq!(
        (
            shown["preset"].as_str(),
            shown["from"].as_str(),
            shown["to"].as_str()
        ),
        (
            Some("custom"),
            Some(from_value.as_str()),
            Some(to_value.as_str())
        ),
        "[{b}] the range chosen"
    );
    let (from, to) = (rfc3339(from), rfc3339(to));
    let counts = series(api, "posts", "4", "views", &from, &to).await;
    let sum: i64 = counts.iter().sum();
    assert!(
        sum > 0 && sum < seeded.views[&4],
        "[{b}] the chosen range holds some of the views and not all: {sum} of {}",
        seeded.views[&4]
    );
    assert_eq!(
        shown["sum"],
        json!(en_us(sum)),
        "[{b}] the range sum shown against the sum of GET /v1/posts/series from {from} to {to}"
    );
    assert_eq!(
        shown["bars"],
        json!(counts),
        "[{b}] the chart's day bars against the series' buckets from {from} to {to}"
    );
    assert_eq!(
        shown["buckets"],
        json!(counts.len().to_string()),
        "[{b}] the chart's bucket count"
    );
}

/// An add lands while owner 4's page is open, then while the ranking's
/// first page is: each shows it without a reload (`counts:watch`,
/// `top:watch`). The adds are taken back after, for the steps that follow.
async fn live(page: &Page, api: &Api, seeded: &Seeded) {
    let b = &page.backend;
    page.navigate("#/owner/posts/4").await;
    let likes = "view.querySelector('[data-test=count][data-key=likes]')";
    page.wait(
        "owner 4's page, live",
        &format!("const badge = view.querySelector('[data-test=live]'); const cell = {likes};
                  return badge && badge.dataset.live === 'true' && cell && cell.textContent !== '…';"),
    )
    .await;
    // Marked: the same view must change, not a new one load.
    page.script(
        "document.querySelector('#main > section.view').dataset.before = 'add'; return null;",
    )
    .await;
    add(api, b, json!({"owner": 4, "key": "likes", "delta": 7})).await;
    let expected = en_us(seeded.likes[&4] + 7);
    let began = Instant::now();
    page.wait(
        "owner 4's likes after an add, with no reload",
        &format!(
            "const cell = {likes};
                  return view.dataset.before === 'add' && cell && cell.innerText === '{expected}';"
        ),
    )
    .await;
    let owner_ms = began.elapsed().as_millis();

    page.navigate("#/top/posts/likes").await;
    let first = page
        .wait(
            "the ranking's first page, live",
            "const badge = view.querySelector('[data-test=live]');
             const row = view.querySelector('[data-test=top-row]');
             if (!badge || badge.dataset.live !== 'true' || !row) return null;
             return [row.dataset.owner, row.cells[2].innerText];",
        )
        .await;
    let top: i64 = first[1].as_str().unwrap().replace(',', "").parse().unwrap();
    // The lowest owner passes the first.
    let (&last, &last_likes) = seeded
        .likes
        .iter()
        .min_by_key(|(_, likes)| **likes)
        .unwrap();
    let delta = top - last_likes + 1;
    page.script(
        "document.querySelector('#main > section.view').dataset.before = 'add'; return null;",
    )
    .await;
    add(
        api,
        b,
        json!({"owner": last, "key": "likes", "delta": delta}),
    )
    .await;
    let began = Instant::now();
    page.wait(
        "the ranking after an owner passed the first, with no reload",
        &format!(
            "const row = view.querySelector('[data-test=top-row]');
                  return view.dataset.before === 'add' && row && row.dataset.owner === '{last}'
                    && row.cells[2].innerText === '{}';",
            en_us(top + 1)
        ),
    )
    .await;
    let ranking_ms = began.elapsed().as_millis();
    eprintln!(
        "[{b}] live console: owner page {owner_ms} ms, ranking {ranking_ms} ms after the add's 200"
    );
    add(api, b, json!({"owner": 4, "key": "likes", "delta": -7})).await;
    add(
        api,
        b,
        json!({"owner": last, "key": "likes", "delta": -delta}),
    )
    .await;
}

/// The ranking of `posts/likes`, followed page by page.
async fn ranking(page: &Page, seeded: &Seeded, shots: &Shots) {
    let b = &page.backend;
    page.navigate("#/top/posts/likes").await;
    let mut rows: Vec<(i64, String, String)> = Vec::new();
    let mut pages = 0;
    loop {
        pages += 1;
        assert!(pages <= 10, "[{b}] the ranking goes on past 10 pages");
        let shown = page
            .wait(
                &format!("page {pages} of the ranking"),
                "if (!view.querySelector('[data-test=top-table]')) return null;
                 return {
                   rows: [...view.querySelectorAll('[data-test=top-row]')].map((r) =>
                     [Number(r.cells[0].innerText), r.dataset.owner, r.cells[2].innerText]),
                   next: view.querySelector('[data-test=top-next]') !== null,
                 };",
            )
            .await;
        let page_rows: Vec<(i64, String, String)> =
            serde_json::from_value(shown["rows"].clone()).unwrap();
        assert!(
            page_rows.len() <= 20,
            "[{b}] ranking page {pages} shows {} rows",
            page_rows.len()
        );
        rows.extend(page_rows);
        if pages == 1 {
            shots.save(page, "top").await;
        }
        if shown["next"] != json!(true) {
            break;
        }
        page.click("[data-test=top-next]").await;
    }
    let mut owners: Vec<i64> = rows
        .iter()
        .map(|(_, owner, _)| {
            owner
                .parse()
                .unwrap_or_else(|_| panic!("[{b}] a ranked owner {owner}"))
        })
        .collect();
    let ranks: Vec<i64> = rows.iter().map(|(rank, _, _)| *rank).collect();
    assert_eq!(
        ranks,
        (1..=rows.len() as i64).collect::<Vec<_>>(),
        "[{b}] the ranks over {pages} pages"
    );
    let totals: Vec<i64> = rows
        .iter()
        .map(|(_, _, total)| total.replace(',', "").parse().unwrap())
        .collect();
    assert!(
        totals.windows(2).all(|w| w[0] > w[1]),
        "[{b}] the totals over {pages} pages are not descending: {totals:?}"
    );
    for ((_, owner, total), parsed) in rows.iter().zip(&owners) {
        assert_eq!(
            total,
            &en_us(seeded.likes[parsed]),
            "[{b}] the ranked total of owner {owner}"
        );
    }
    owners.sort_unstable();
    assert_eq!(
        owners,
        (1..=OWNERS).collect::<Vec<_>>(),
        "[{b}] the owners reached by paging the ranking ({pages} pages): each seeded owner once"
    );
    assert_eq!(pages, 3, "[{b}] {OWNERS} owners at 20 a page");
}

/// The ranking of `tags/uses` and each hostile owner's page.
async fn hostile_names(page: &Page, api: &Api) {
    let b = &page.backend;
    page.navigate("#/top/tags/uses").await;
    page.wait(
        "the ranking of tags",
        "return view.querySelectorAll('[data-test=top-row]').length === 3;",
    )
    .await;
    page.assert_no_markup("the ranking of tags").await;
    for name in HOSTILE {
        let row = page.find_all("[data-test=top-row]").await;
        let mut found = None;
        for r in row {
            if r.attr("data-owner")
                .await
                .unwrap_or_else(|e| panic!("[{b}] data-owner: {e}"))
                .as_deref()
                == Some(name)
            {
                found = Some(r);
            }
        }
        let row = found.unwrap_or_else(|| panic!("[{b}] no ranking row has data-owner {name:?}"));
        let link = row
            .find(Locator::Css("[data-test=owner-link]"))
            .await
            .unwrap_or_else(|e| panic!("[{b}] the link of {name:?}: {e}"));
        let text = link
            .text()
            .await
            .unwrap_or_else(|e| panic!("[{b}] the link's text: {e}"));
        assert_eq!(
            text, name,
            "[{b}] the ranking shows the owner's name as text"
        );
        page.mark_stale().await;
        link.click()
            .await
            .unwrap_or_else(|e| panic!("[{b}] opening the owner {name:?}: {e}"));
        owner_page(page, api, "tags", &json!(name), name).await;
        let heading = page
            .find("[data-test=owner-name]")
            .await
            .text()
            .await
            .unwrap_or_else(|e| panic!("[{b}] the heading: {e}"));
        assert_eq!(
            heading, name,
            "[{b}] the owner page's heading shows the name as text"
        );
        page.assert_no_markup(&format!("the owner page of {name:?}"))
            .await;
        page.navigate("#/top/tags/uses").await;
        page.wait(
            "the ranking of tags",
            "return view.querySelectorAll('[data-test=top-row]').length === 3;",
        )
        .await;
    }
}

// ---------------------------------------------------------------- the API

/// What the seeding counted, for the expectations.
struct Seeded {
    likes: BTreeMap<i64, i64>,
    views: BTreeMap<i64, i64>,
    comments: i64,
    /// The start of today (UTC), the seeded days' reference.
    today: DateTime<Utc>,
}

/// `likes` for 45 owners (distinct totals), `views` over a week and one
/// day three weeks ago, `viewers` members in and out of the last week,
/// pattern keys, a counted `comments` with no comment rows (drift for the
/// check), and `tags` owners named with markup.
async fn seed(api: &Api, b: &str) -> Seeded {
    let now = Utc::now();
    let today = now.date_naive().and_hms_opt(0, 0, 0).unwrap().and_utc();
    let day = |d: u64, hour: u32| {
        rfc3339(today - Days::new(d) + chrono::Duration::hours(i64::from(hour)))
    };
    let mut likes = BTreeMap::new();
    let items: Vec<Value> = (1..=OWNERS)
        .map(|owner| {
            likes.insert(owner, 10 * owner);
            json!({"owner": owner, "key": "likes", "delta": 10 * owner})
        })
        .collect();
    let reply = api
        .post(
            "/v1/posts/counters:batchAdd",
            Some(WRITER),
            json!({"items": items}),
        )
        .await;
    assert_eq!(reply.status, 200, "[{b}] seeding likes: {reply:?}");
    let mut views = BTreeMap::new();
    for owner in FULL_OWNERS {
        // Single adds on top: still distinct totals.
        for _ in 0..owner {
            add(api, b, json!({"owner": owner, "key": "likes"})).await;
        }
        *likes.get_mut(&owner).unwrap() += owner;
        let mut total = 0;
        for d in 1..=6_u64 {
            let delta = owner * 100 + d as i64 * 37;
            add(
                api,
                b,
                json!({"owner": owner, "key": "views", "delta": delta, "at": day(d, 2 + d as u32)}),
            )
            .await;
            total += delta;
        }
        add(api, b, json!({"owner": owner, "key": "views", "delta": 5})).await;
        add(
            api,
            b,
            json!({"owner": owner, "key": "views", "delta": 1000, "at": day(21, 12)}),
        )
        .await;
        views.insert(owner, total + 1005);
        let mut observations: Vec<Value> = (0..owner * 3)
            .map(|m| json!({"owner": owner, "key": "viewers", "member": format!("user-{m}"), "at": day((m % 6) as u64 + 1, 1)}))
            .collect();
        observations.push(
            json!({"owner": owner, "key": "viewers", "member": "an-old-viewer", "at": day(12, 1)}),
        );
        let reply = api
            .post(
                "/v1/posts/counters:observe",
                Some(WRITER),
                json!({"observations": observations}),
            )
            .await;
        assert_eq!(reply.status, 200, "[{b}] seeding viewers: {reply:?}");
        if owner <= 2 {
            add(
                api,
                b,
                json!({"owner": owner, "key": "reaction:heart", "delta": 3}),
            )
            .await;
        }
    }
    let comments = 2;
    add(
        api,
        b,
        json!({"owner": 1, "key": "comments", "delta": comments}),
    )
    .await;
    for (name, uses) in HOSTILE.iter().zip([5, 3]).chain([(&"plain-tag", 1)]) {
        add_to(
            api,
            b,
            "tags",
            json!({"owner": name, "key": "uses", "delta": uses}),
        )
        .await;
    }
    let observations: Vec<Value> = (0..4)
        .map(|m| json!({"owner": HOSTILE[0], "key": "visitors", "member": m}))
        .collect();
    let reply = api
        .post(
            "/v1/tags/counters:observe",
            Some(WRITER),
            json!({"observations": observations}),
        )
        .await;
    assert_eq!(reply.status, 200, "[{b}] seeding visitors: {reply:?}");
    Seeded {
        likes,
        views,
        comments,
        today,
    }
}

async fn add(api: &Api, b: &str, body: Value) {
    add_to(api, b, "posts", body).await;
}

async fn add_to(api: &Api, b: &str, ns: &str, body: Value) {
    let reply = api
        .post(
            &format!("/v1/{ns}/counters:add"),
            Some(WRITER),
            body.clone(),
        )
        .await;
    assert_eq!(reply.status, 200, "[{b}] seeding {ns} {body}: {reply:?}");
}

/// `GET /v1/{ns}/series`: the buckets' counts, checked against its `sum`.
async fn series(api: &Api, ns: &str, owner: &str, key: &str, from: &str, to: &str) -> Vec<i64> {
    let owner: String = form_urlencoded::byte_serialize(owner.as_bytes()).collect();
    let path = format!("/v1/{ns}/series?owner={owner}&key={key}&from={from}&to={to}");
    let reply = api.get(&path, Some(READER)).await.ok();
    let counts: Vec<i64> = reply["buckets"]
        .as_array()
        .unwrap_or_else(|| panic!("{path}: {reply}"))
        .iter()
        .map(|b| b["count"].as_i64().unwrap())
        .collect();
    assert_eq!(
        reply["sum"],
        json!(counts.iter().sum::<i64>()),
        "{path}: the sum of its buckets"
    );
    counts
}

fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// A `datetime-local` value as the page reads it: UTC, to the minute.
fn range_end(value: &Value, what: &str) -> String {
    let value = value
        .as_str()
        .unwrap_or_else(|| panic!("{what}: no range shown"));
    let at = DateTime::parse_from_rfc3339(&format!("{value}:00Z"))
        .unwrap_or_else(|e| panic!("{what}: the range end {value:?}: {e}"));
    rfc3339(at.with_timezone(&Utc))
}

/// A number as the page formats it (`toLocaleString('en-US')`).
fn en_us(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

// ---------------------------------------------------------------- the browser

/// The browser's tab, for one backend's test.
struct Page {
    client: Client,
    base: String,
    backend: String,
}

impl Page {
    /// A new session: headless Chromium with a fresh profile.
    async fn open(driver: &Chromedriver, api: &Api, backend: &str) -> Self {
        let profile = driver.dir.join("profile");
        let capabilities = json!({
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--window-size=1280,900",
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
            // An alert stays open for the check to see it.
            "unhandledPromptBehavior": "ignore",
            "timeouts": {"script": WAIT.as_millis() as u64, "pageLoad": WAIT.as_millis() as u64},
        });
        let Value::Object(capabilities) = capabilities else {
            unreachable!()
        };
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&driver.url)
            .await
            .unwrap_or_else(|e| {
                panic!("[{backend}] a Chromium session through {}: {e}", driver.url)
            });
        let page = Page {
            client,
            base: api.base.clone(),
            backend: backend.to_owned(),
        };
        // `--window-size` is the window's: the viewport is made 1280x900.
        let chrome = page.script("return [window.outerWidth - window.innerWidth, window.outerHeight - window.innerHeight];").await;
        let extra = |i: usize| u32::try_from(chrome[i].as_u64().unwrap_or(0)).unwrap_or(0);
        page.client
            .set_window_size(1280 + extra(0), 900 + extra(1))
            .await
            .unwrap_or_else(|e| panic!("[{backend}] sizing the window: {e}"));
        page
    }

    /// Runs `body` (a function body) in the page, its promise awaited.
    async fn script(&self, body: &str) -> Value {
        self.client
            .execute(body, Vec::new())
            .await
            .unwrap_or_else(|e| panic!("[{}] a script in the page: {e}\n{body}", self.backend))
    }

    /// Polls `condition` (a function body over `view`, the page's current
    /// view) until it returns something other than null or false, for at
    /// most [`WAIT`]; the page's error box fails it at once.
    async fn wait(&self, what: &str, condition: &str) -> Value {
        let script = format!(
            "const error = document.getElementById('error');
             if (error && !error.hidden) return {{ pageError: error.textContent }};
             const view = document.querySelector('#main > section.view:not([data-stale])');
             if (!view) return null;
             return (function (view) {{ {condition} }})(view);"
        );
        let deadline = Instant::now() + WAIT;
        loop {
            let value = self.script(&script).await;
            if let Some(error) = value.get("pageError") {
                panic!(
                    "[{}] {what}: the page shows an error: {error}",
                    self.backend
                );
            }
            if !value.is_null() && value != json!(false) {
                return value;
            }
            if Instant::now() >= deadline {
                let main = self
                    .script("return document.getElementById('main').innerText")
                    .await;
                panic!(
                    "[{}] {what}: not shown within {WAIT:?}; the page shows: {main}",
                    self.backend
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Marks the current view, so that [`Page::wait`] waits for the next.
    async fn mark_stale(&self) {
        self.script("for (const v of document.querySelectorAll('#main > section.view')) v.setAttribute('data-stale', ''); return null;").await;
    }

    /// Goes to the console's route `hash` (`#/top/posts/likes`).
    async fn navigate(&self, hash: &str) {
        self.mark_stale().await;
        let url = format!("{}/ui{hash}", self.base);
        let current = self
            .client
            .current_url()
            .await
            .unwrap_or_else(|e| panic!("[{}] the current URL: {e}", self.backend));
        let done = if current.as_str() == url {
            self.client.refresh().await
        } else {
            self.client.goto(&url).await
        };
        done.unwrap_or_else(|e| panic!("[{}] going to {url}: {e}", self.backend));
    }

    async fn find(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("[{}] finding {css}: {e}", self.backend))
    }

    async fn find_all(&self, css: &str) -> Vec<fantoccini::elements::Element> {
        self.client
            .find_all(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("[{}] finding {css}: {e}", self.backend))
    }

    /// Clicks `css`, which renders a new view.
    async fn click(&self, css: &str) {
        let element = self.find(css).await;
        self.mark_stale().await;
        element
            .click()
            .await
            .unwrap_or_else(|e| panic!("[{}] clicking {css}: {e}", self.backend));
    }

    /// Types `token` into the token box and uses it.
    async fn use_token(&self, token: &str) {
        let input = self.find("[data-test=token-input]").await;
        input
            .clear()
            .await
            .unwrap_or_else(|e| panic!("[{}] clearing the token box: {e}", self.backend));
        input
            .send_keys(token)
            .await
            .unwrap_or_else(|e| panic!("[{}] typing the token: {e}", self.backend));
        self.click("[data-test=token-use]").await;
    }

    /// No element made of an owner's name: no image anywhere, the one
    /// script, nothing but text in the tables and the heading; no alert.
    async fn assert_no_markup(&self, what: &str) {
        let found = self
            .script(
                "return {
                   images: document.images.length,
                   scripts: [...document.scripts].map((s) => s.getAttribute('src')),
                   inTables: document.querySelectorAll('#main table img, #main table script, #main h1 img, #main h1 script').length,
                 };",
            )
            .await;
        assert_eq!(
            found,
            json!({"images": 0, "scripts": ["/ui/console.js"], "inTables": 0}),
            "[{}] {what}: elements made of an owner's name",
            self.backend
        );
        self.assert_no_alert(what).await;
    }

    async fn assert_no_alert(&self, what: &str) {
        match self.client.get_alert_text().await {
            Err(e) if e.is_no_such_alert() => {}
            Ok(text) => panic!("[{}] {what}: an alert opened: {text:?}", self.backend),
            Err(e) => panic!("[{}] {what}: asking for an alert: {e}", self.backend),
        }
    }
}

/// Where the screenshots go: `COUNTER_TEST_SCREENSHOTS`, or the
/// chromedriver's scratch directory (removed with it).
struct Shots {
    dir: PathBuf,
    keep: bool,
}

/// The pages saved, as `console-<name>.png`.
const SHOTS: [&str; 5] = ["namespaces", "top", "owner", "checks", "health"];

impl Shots {
    async fn save(&self, page: &Page, name: &str) {
        let png = page
            .client
            .screenshot()
            .await
            .unwrap_or_else(|e| panic!("[{}] a screenshot of {name}: {e}", page.backend));
        let path = self.dir.join(format!("console-{name}.png"));
        std::fs::write(&path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }

    fn check(&self, b: &str) {
        for name in SHOTS {
            let path = self.dir.join(format!("console-{name}.png"));
            let bytes =
                std::fs::read(&path).unwrap_or_else(|e| panic!("[{b}] {}: {e}", path.display()));
            assert!(
                bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
                "[{b}] {} is not a PNG",
                path.display()
            );
        }
    }
}

/// A private chromedriver on a free loopback port, in a process group of
/// its own with the browsers it starts, and its scratch directory (the
/// profile, the screenshots unless kept).
struct Chromedriver {
    child: std::process::Child,
    url: String,
    dir: PathBuf,
}

impl Chromedriver {
    async fn start(binary: &Path, b: &str) -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!(
            "counter-chromedriver-{}-{port}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let child = std::process::Command::new(binary)
            .arg(format!("--port={port}"))
            .arg(format!(
                "--log-path={}",
                dir.join("chromedriver.log").display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("[{b}] {} ({CHROMEDRIVER_VAR}): {e}", binary.display()));
        let driver = Chromedriver {
            child,
            url: format!("http://127.0.0.1:{port}"),
            dir,
        };
        let status = Api::new(driver.url.clone());
        let deadline = Instant::now() + WAIT;
        while !matches!(status.try_call(Method::GET, "/status", None, &[], None).await, Ok(r) if r.json["value"]["ready"] == json!(true))
        {
            assert!(
                Instant::now() < deadline,
                "[{b}] chromedriver not ready on port {port} within {WAIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        driver
    }
}

/// The driver and every browser it started go, and the profile with them,
/// even when the test fails.
impl Drop for Chromedriver {
    fn drop(&mut self) {
        let pid = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A browser process may still be writing its profile as it dies.
        for _ in 0..20 {
            if std::fs::remove_dir_all(&self.dir).is_ok() || !self.dir.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
