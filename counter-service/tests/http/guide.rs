//! The service guide (docs/guide/service.md) as a reader uses it: its route
//! table names every route of the OpenAPI document and nothing else, the
//! demo's printed curl lines are the guide's and answer what it shows, and
//! `check-config` lists every fault of a file at once and reads the
//! secrets of the configuration's `env_file`.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use tokio::io::{AsyncBufReadExt, BufReader};

fn guide() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/guide/service.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The `(METHOD, /path)` pairs of the guide's route table (the table under
/// `| call | body or query | answer |`). A row's first cell names one
/// method and one or more paths in backticks; a path without a leading
/// `/` is under `/v1/{ns}/`, and the guide's `{namespace}` is the
/// document's `{ns}`.
fn table_routes(guide: &str) -> BTreeSet<(String, String)> {
    let mut lines = guide
        .lines()
        .skip_while(|l| !l.starts_with("| call | body or query | answer |"))
        .skip(2);
    let mut routes = BTreeSet::new();
    for line in lines.by_ref().take_while(|l| l.starts_with('|')) {
        let cell = line.split('|').nth(1).expect("a first cell");
        let spans: Vec<&str> = cell.split('`').skip(1).step_by(2).collect();
        let (first, more) = spans
            .split_first()
            .unwrap_or_else(|| panic!("a row without a call: {line}"));
        let (method, path) = first
            .split_once(' ')
            .unwrap_or_else(|| panic!("a call is `METHOD path`: {line}"));
        for path in std::iter::once(path).chain(more.iter().copied()) {
            let path = match path.strip_prefix('/') {
                Some(_) => path.to_owned(),
                None => format!("/v1/{{ns}}/{path}"),
            };
            routes.insert((method.to_owned(), path.replace("{namespace}", "{ns}")));
        }
    }
    assert!(
        routes.len() > 10,
        "the route table was not found: {routes:?}"
    );
    routes
}

/// The guide's table lists every operation of the OpenAPI document, and
/// the document every route of the table: a route added to the service
/// without a row (as `GET /v1/namespaces` and `GET /v1/{ns}/admin/jobs`
/// once were) fails here.
#[test]
fn the_route_table_lists_every_route_of_the_openapi_document() {
    let document = serde_json::to_value(counter_service::api::openapi_document()).unwrap();
    let mut documented = BTreeSet::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if ["get", "post", "put", "patch", "delete"].contains(&method.as_str()) {
                documented.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    let listed = table_routes(&guide());
    let missing: Vec<_> = documented.difference(&listed).collect();
    let extra: Vec<_> = listed.difference(&documented).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "routes of the OpenAPI document missing from the guide's table: {missing:?}; \
         rows of the table the document does not have: {extra:?}"
    );
}

/// The guide's first curl block ("Run it"): each command (continuation
/// lines joined) with the answer its `# ` line shows.
fn guide_first_calls(guide: &str) -> Vec<(String, serde_json::Value)> {
    let block: Vec<&str> = guide
        .lines()
        .skip_while(|l| !l.starts_with("prints two `curl` lines to try:"))
        .skip_while(|l| !l.starts_with("```sh"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .collect();
    let mut calls = Vec::new();
    let mut command = String::new();
    for line in block {
        if let Some(answer) = line.strip_prefix("# ") {
            let json = answer.split("   ").next().unwrap();
            let answer = serde_json::from_str(json)
                .unwrap_or_else(|e| panic!("the guide's answer `{json}`: {e}"));
            calls.push((std::mem::take(&mut command), answer));
        } else {
            command.push_str(line.trim().trim_end_matches('\\'));
            command.push(' ');
        }
    }
    assert_eq!(calls.len(), 2, "the guide's two first calls: {calls:?}");
    calls
}

fn words(command: &str) -> String {
    command.split_whitespace().collect::<Vec<_>>().join(" ")
}

async fn curl(command: &str) -> serde_json::Value {
    let out = tokio::process::Command::new("sh")
        .args(["-c", command])
        .output()
        .await
        .expect("sh (and curl) to run the printed line");
    assert!(out.status.success(), "{command}: {out:?}");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{command}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// The demo (no configuration at all) prints the guide's two curl lines,
/// its address aside, and they answer what the guide shows: the add's
/// total, the same answer when sent again, then the owner's count beside
/// another owner's zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_curl_lines_answer_as_the_guide_shows() {
    let calls = guide_first_calls(&guide());
    let dir = std::env::temp_dir().join(format!("counter-service-demo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let port = counter_tests::servers::free_port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_counter-service"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .current_dir(&dir)
        .env_remove("COUNTER_SERVICE_CONFIG")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut printed = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while printed.len() < 2 {
        let line = tokio::time::timeout_at(deadline.into(), stdout.next_line())
            .await
            .expect("the demo's curl lines within 60 s")
            .unwrap()
            .expect("the demo exited before printing its curl lines");
        for prefix in ["try: ", "then: "] {
            if let Some(command) = line.strip_prefix(prefix) {
                printed.push(command.to_owned());
            }
        }
    }
    let address = format!("127.0.0.1:{port}");
    for ((command, _), line) in calls.iter().zip(&printed) {
        assert_eq!(
            words(&line.replace(&address, "127.0.0.1:8080")),
            words(command),
            "the printed line differs from the guide's"
        );
    }
    let (add, added) = (&printed[0], &calls[0].1);
    assert_eq!(&curl(add).await, added, "{add}");
    assert_eq!(&curl(add).await, added, "{add}, sent again");
    assert_eq!(curl(&printed[1]).await, calls[1].1, "{}", printed[1]);
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `counter-service --config <text> check-config` with `env`; its exit
/// code and everything it wrote.
async fn check_config(dir: &Path, text: &str, env: &[(&str, &str)]) -> (i32, String) {
    std::fs::create_dir_all(dir).unwrap();
    let config = dir.join("service.toml");
    std::fs::write(&config, text).unwrap();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_counter-service"));
    command
        .args(["--config", config.to_str().unwrap(), "check-config"])
        .env_remove("COUNTER_TOKEN_WEB");
    for (name, value) in env {
        command.env(name, value);
    }
    let out = command.output().await.unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// One file, six faults (four bounds, a short secret, an unknown
/// namespace): `check-config` names all six, not the first, and exits 1.
#[tokio::test]
async fn check_config_lists_every_fault_at_once() {
    let dir = std::env::temp_dir().join(format!("counter-service-check-{}", std::process::id()));
    let text = "[server]\nadd_workers = 0\nmax_batch_items = 0\nmax_batch_owners = 100000000\nmax_queue_wait_ms = 5\n\
                [database]\nurl = \"sqlite::memory:\"\n\
                [[tokens]]\nname = \"web\"\nsecret = \"fifteen-chars-x\"\nscopes = [\"read\"]\nnamespaces = [\"nope\"]\n\
                [namespaces.posts]\ntable = \"post_counters\"\nowner = \"integer\"\n[namespaces.posts.keys.likes]\n";
    assert_eq!("fifteen-chars-x".len(), 15);
    let (code, out) = check_config(&dir, text, &[]).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("6 configuration errors"), "{out}");
    for (path, why) in [
        ("server.add_workers", "0 is not 1 to 64"),
        ("server.max_batch_items", "0 is not 1 to 100000"),
        ("server.max_batch_owners", "100000000 is not 1 to 100000"),
        ("server.max_queue_wait_ms", "5 is not 10 to 60000"),
        ("tokens.0.secret", "at least 16 characters"),
        ("tokens.0.namespaces", "no namespace `nope`"),
    ] {
        let line = out
            .lines()
            .find(|l| l.contains(&format!("`{path}`")))
            .unwrap_or_else(|| panic!("{path} not named: {out}"));
        assert!(line.contains(why), "{path}: {line}");
    }
    assert!(
        !out.contains("fifteen-chars-x"),
        "a secret in the output: {out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A token's `secret_env` is found in the configuration's `env_file`, as
/// the Debian package's unit finds it in its `EnvironmentFile`: run by
/// hand, `check-config` accepts the file; without the variable there it
/// names it; the process's own environment wins over the file.
#[tokio::test]
async fn check_config_reads_the_secrets_of_env_file() {
    let dir = std::env::temp_dir().join(format!("counter-service-env-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secrets = dir.join("secrets");
    let text = format!(
        "env_file = \"{}\"\n[database]\nurl = \"sqlite::memory:\"\n\
         [[tokens]]\nname = \"web\"\nsecret_env = \"COUNTER_TOKEN_WEB\"\nscopes = [\"read\"]\n\
         [namespaces.posts]\ntable = \"post_counters\"\nowner = \"integer\"\n[namespaces.posts.keys.likes]\n",
        secrets.display()
    );
    std::fs::write(
        &secrets,
        "# the unit's secrets\n\nCOUNTER_TOKEN_WEB=\"web-secret-0123456789\"\n",
    )
    .unwrap();
    let (code, out) = check_config(&dir, &text, &[]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("the configuration is valid"), "{out}");
    assert!(
        !out.contains("web-secret-0123456789"),
        "the secret printed: {out}"
    );

    // The process's variable wins: a short one is refused.
    let (code, out) = check_config(&dir, &text, &[("COUNTER_TOKEN_WEB", "short")]).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("`tokens.0.secret`"), "{out}");

    std::fs::write(&secrets, "OTHER=1\n").unwrap();
    let (code, out) = check_config(&dir, &text, &[]).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("`tokens.0.secret_env`") && out.contains("env_file"),
        "{out}"
    );

    // A line that is not `NAME=value` is refused with its number.
    std::fs::write(
        &secrets,
        "COUNTER_TOKEN_WEB=web-secret-0123456789\nnot a variable\n",
    )
    .unwrap();
    let (code, out) = check_config(&dir, &text, &[]).await;
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("line 2"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}
