//! `counter-service`: serve, migrate, check a configuration, print the
//! OpenAPI document.

use std::{path::PathBuf, process::ExitCode};

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};
use counter_service::{Config, Service, config::LogFormat};

/// The counting service: slotted counters over HTTP and a queue.
///
/// With no configuration at all it serves a demo namespace on an embedded
/// SQLite file, on 127.0.0.1:8080, and prints a `curl` line to try.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// The configuration file (TOML); without one, the built-in demo.
    #[arg(long, short, env = "COUNTER_SERVICE_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Overrides one configuration value: `--set server.listen=0.0.0.0:8080`.
    #[arg(long = "set", value_name = "PATH=VALUE", global = true)]
    set: Vec<String>,
    /// Shorthand for `--set server.listen=ADDR`.
    #[arg(long, global = true)]
    listen: Option<String>,
    /// Shorthand for `--set database.url=URL`.
    #[arg(long, global = true)]
    database_url: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve (the default).
    Serve {
        /// Create missing tables first (what `migrate` does).
        #[arg(long)]
        migrate: bool,
    },
    /// Create or upgrade the namespaces' tables and the idempotency tables.
    Migrate,
    /// Check the configuration as `serve` does before it connects (every
    /// refusal listed, exit code 1 on any) and print it, secrets redacted.
    CheckConfig,
    /// Print the OpenAPI document.
    Openapi,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut overrides = cli.set.clone();
    if let Some(listen) = &cli.listen {
        overrides.push(format!("server.listen=\"{listen}\""));
    }
    if let Some(url) = &cli.database_url {
        overrides.push(format!("database.url=\"{url}\""));
    }
    let demo = cli.config.is_none();
    let config = match &cli.config {
        Some(path) => Config::load(path, &overrides),
        None => Config::demo(&overrides),
    };
    let config = match config {
        Ok(config) => config,
        Err(error) => {
            eprintln!("counter-service: {error}");
            return ExitCode::from(2);
        }
    };
    let log_format = config.server.log_format;
    init_logs(log_format);
    let outcome: Result<(), Box<dyn std::error::Error>> =
        match cli.command.unwrap_or(Command::Serve { migrate: false }) {
            Command::Openapi => {
                println!(
                    "{}",
                    counter_service::api::openapi_document()
                        .to_pretty_json()
                        .unwrap_or_default()
                );
                Ok(())
            }
            // The rules `serve` runs first, every refusal listed; exits 1 on any.
            Command::CheckConfig => config.check().map_err(Into::into).map(|()| {
                println!("{config:#?}");
                println!("counter-service: the configuration is valid");
            }),
            Command::Migrate => Service::migrate(&config)
                .await
                .map(|tables| println!("ready: {}", tables.join(", ")))
                .map_err(Into::into),
            // The demo creates its own tables: its one command must just work.
            Command::Serve { migrate } => serve(config, migrate || demo, demo).await,
        };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            match log_format {
                LogFormat::Text => eprintln!("counter-service: {error}"),
                LogFormat::Json => tracing::error!(%error, "counter-service stopped"),
            }
            ExitCode::FAILURE
        }
    }
}

async fn serve(
    config: Config,
    migrate: bool,
    demo: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    if migrate {
        Service::migrate(&config).await?;
    }
    let listen = config.server.listen;
    let open = config.server.open;
    let console = config.server.console;
    let say = StartLines(config.server.log_format);
    // The first namespace's first counted key, and an owner of its type:
    // the lines below must work as printed.
    let first = config.namespaces.iter().find_map(|(name, ns)| {
        let key = ns
            .keys
            .iter()
            .filter(|(_, key)| !key.unique)
            .min_by_key(|(_, key)| key.check.is_some())
            .map(|(key, _)| key.clone())?;
        Some((
            name.clone(),
            key,
            ns.owner.example(),
            ns.owner.other_example(),
        ))
    });
    let service = Service::start(config).await?;
    let listener = listen_on(listen).map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let address = listener.local_addr()?;
    if open && !address.ip().is_loopback() {
        tracing::warn!(%address, "serving without tokens on a non-loopback address");
    }
    say.say(&format!("counter-service listening on http://{address}"));
    if console {
        say.say(&format!("console: http://{address}/ui"));
    }
    // The guide's first steps show these two lines and their answers
    // (`{"applied":true,"total":1}`, then the owner's 1 beside another's
    // zero); the HTTP test `guide::the_printed_curl_lines_answer_as_the_guide_shows`
    // runs them.
    if let Some((namespace, key, owner, other)) = first {
        let auth = if open {
            ""
        } else {
            " -H 'Authorization: Bearer <token>'"
        };
        say.say(&format!(
            "try: curl -s -X POST http://{address}/v1/{namespace}/counters:addAndGet{auth} \
             -H 'Content-Type: application/json' -H 'Idempotency-Key: try-1' \
             -d '{{\"owner\": \"{owner}\", \"key\": \"{key}\", \"delta\": 1}}'"
        ));
        say.say(&format!(
            "then: curl -s 'http://{address}/v1/{namespace}/counts:batchGet?owners={owner},{other}&keys={key}'{auth}"
        ));
    }
    if demo {
        say.say(
            "(the built-in demo: an embedded SQLite file; `--config FILE` for your own, see counter-service.example.toml)",
        );
    }
    service.serve(listener, shutdown_signal()).await?;
    Ok(())
}

/// How many handshaken connections the kernel queues for `accept` (it
/// caps this at `net.core.somaxconn`, 4096 by default). Tokio's `bind`
/// asks for 1,024: a flood of connections that outruns the accept loop for
/// a moment would fill that, and a normal caller's handshake would then be
/// dropped and retried by its kernel only a second later.
const LISTEN_BACKLOG: u32 = 4096;

fn listen_on(address: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if address.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Ctrl-C, or SIGTERM (what an orchestrator sends).
async fn shutdown_signal() {
    let ctrl_c = async {
        tokio::signal::ctrl_c().await.ok();
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    let signal = tokio::select! {
        _ = ctrl_c => "SIGINT",
        _ = term => "SIGTERM",
    };
    tracing::info!(signal, "shutting down");
}

fn init_logs(format: LogFormat) {
    use std::io::IsTerminal;
    use tracing_subscriber::{EnvFilter, fmt};
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a person at a terminal: a file or a collector gets
    // plain text, not escape codes.
    let builder = fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// What the service says once it listens: lines for a person on stdout
/// with text logs; with JSON logs, one JSON log event each (stderr, like
/// every other line), so a collector never meets a line it cannot parse.
struct StartLines(LogFormat);

impl StartLines {
    fn say(&self, line: &str) {
        match self.0 {
            LogFormat::Text => println!("{line}"),
            LogFormat::Json => tracing::info!(target: "counter_service::start", "{line}"),
        }
    }
}
