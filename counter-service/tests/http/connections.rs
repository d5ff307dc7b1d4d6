//! Connections cannot lock the service: 2,000 connections that each send
//! half a request head and nothing more, from one client, under a file
//! limit the service raises and under a hard limit of 1,024 it cannot; a
//! normal client's requests answer within a second throughout, and every
//! half-sent or idle connection is closed (evicted at the cap, or at its
//! timeout). RELIABILITY.md 49.

use std::time::{Duration, Instant};

use counter_tests::figures;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    process::{Child, Command},
};

const PARTIAL: usize = 2_000;
const HEADER_TIMEOUT_MS: u64 = 2_000;
const IDLE_TIMEOUT_MS: u64 = 3_000;
/// The longest a normal client's request may take.
const PROMPT: Duration = Duration::from_secs(1);

/// The real binary under `ulimit` settings `limits`, on a SQLite file.
async fn start(limits: &str, dir: &std::path::Path) -> (Child, u16) {
    let port = counter_tests::servers::free_port();
    let config = dir.join("service.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nopen = true\nheader_read_timeout_ms = {HEADER_TIMEOUT_MS}\nidle_timeout_ms = {IDLE_TIMEOUT_MS}\n\
             [database]\nurl = \"sqlite://{}?mode=rwc\"\n[namespaces.posts]\ntable = \"post_counters\"\nowner = \"integer\"\n[namespaces.posts.keys.likes]\n",
            dir.join("service.db").display()
        ),
    )
    .unwrap();
    let script = format!(
        "{limits} && exec '{}' --config '{}' --listen 127.0.0.1:{port} serve --migrate",
        env!("CARGO_BIN_EXE_counter-service"),
        config.display()
    );
    let mut command = Command::new("bash");
    command.args(["-c", &script]);
    let child =
        crate::support::start_command(command, &format!("the binary under `{limits}`")).await;
    (child, port)
}

/// One request on a fresh connection: its status line, or why not.
async fn request(port: u16, path: &str) -> Result<String, String> {
    let t0 = Instant::now();
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let connected = t0.elapsed();
    if connected > Duration::from_millis(500) {
        eprintln!("slow connect: {connected:?}");
    }
    let head = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream
        .write_all(head.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .await
        .map_err(|e| e.to_string())?;
    Ok(answer)
}

/// Whether `stream` is closed by the server within `wait`.
async fn closed(stream: &mut TcpStream, wait: Duration) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout(wait, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// A figure of the service's `/metrics`.
async fn metric(port: u16, name: &str) -> u64 {
    let text = request(port, "/metrics").await.unwrap();
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_and_half_sent_connections_cannot_lock_callers_out() {
    // The client holds 2,000 sockets itself.
    {
        use rustix::process::{Resource, getrlimit, setrlimit};
        let limit = getrlimit(Resource::Nofile);
        let _ = setrlimit(
            Resource::Nofile,
            rustix::process::Rlimit {
                current: limit.maximum,
                maximum: limit.maximum,
            },
        );
    }
    let hard = rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum;
    assert!(
        hard.is_none_or(|n| n > PARTIAL as u64 + 200),
        "the test needs {PARTIAL} sockets of its own"
    );
    for (case, limits) in [
        ("raised", "ulimit -Sn 1024"),
        ("hard_1024", "ulimit -Sn 1024 && ulimit -Hn 1024"),
    ] {
        let dir = std::env::temp_dir().join(format!(
            "counter-service-conns-{case}-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let (mut child, port) = start(limits, &dir).await;

        // A normal client, a request every 50 ms on a fresh connection.
        let probing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let prober = {
            let probing = probing.clone();
            tokio::spawn(async move {
                let (mut answered, mut slowest, mut failures) = (0u64, Duration::ZERO, Vec::new());
                while probing.load(std::sync::atomic::Ordering::Relaxed) {
                    let t0 = Instant::now();
                    match tokio::time::timeout(PROMPT, request(port, "/healthz")).await {
                        Ok(Ok(answer)) if answer.starts_with("HTTP/1.1 200") => answered += 1,
                        other => failures.push(format!("{other:?}")),
                    }
                    slowest = slowest.max(t0.elapsed());
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                (answered, slowest, failures)
            })
        };

        // 2,000 connections from one client, each half a request head.
        let t0 = Instant::now();
        let mut partial = Vec::with_capacity(PARTIAL);
        for _ in 0..PARTIAL {
            let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            let _ = stream
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                .await;
            partial.push(stream);
        }
        let opened_in = t0.elapsed();
        // A keep-alive connection that asked once and then went quiet.
        let mut quiet = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        quiet
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut first = [0u8; 12];
        quiet.read_exact(&mut first).await.unwrap();
        assert_eq!(&first, b"HTTP/1.1 200", "[{case}]");
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        probing.store(false, std::sync::atomic::Ordering::Relaxed);
        let (answered, slowest, failures) = prober.await.unwrap();
        assert!(
            failures.is_empty(),
            "[{case}] a normal request failed or took over {PROMPT:?}: {failures:?}"
        );
        assert!(answered >= 10, "[{case}] only {answered} probes");

        // Every half-sent connection is closed: at the cap to make room, or
        // at the header timeout; the quiet one at the idle timeout.
        let wait = Duration::from_millis(HEADER_TIMEOUT_MS.max(IDLE_TIMEOUT_MS) + 3_000);
        let deadline = Instant::now() + wait;
        let mut still_open = 0;
        for stream in &mut partial {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(50));
            if !closed(stream, left).await {
                still_open += 1;
            }
        }
        assert_eq!(still_open, 0, "[{case}] half-sent connections left open");
        assert!(
            closed(&mut quiet, Duration::from_millis(IDLE_TIMEOUT_MS + 2_000)).await,
            "[{case}] the idle keep-alive connection was not closed"
        );
        let evicted = metric(port, "counter_service_connections_evicted_total").await;
        if case == "hard_1024" {
            assert!(
                evicted > 0,
                "[{case}] nothing was evicted under a hard limit of 1,024"
            );
        } else {
            assert_eq!(
                evicted, 0,
                "[{case}] the raised limit holds {PARTIAL} connections without evicting"
            );
        }
        drop(partial);
        figures(
            "service_slowloris",
            case,
            &[
                ("partial_connections", PARTIAL as u64),
                ("opened_ms", opened_in.as_millis() as u64),
                ("probes_answered", answered),
                ("probe_slowest_ms", slowest.as_millis() as u64),
                ("probes_failed", failures.len() as u64),
                ("evicted", evicted),
                ("left_open", still_open),
            ],
        );
        child.kill().await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
