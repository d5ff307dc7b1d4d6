//! A TCP proxy that can lose a transaction's `COMMIT`, or its reply.
//!
//! [`Proxy::start`] listens on `127.0.0.1:0` and forwards every connection
//! to the real server, both directions, byte for byte. [`Proxy::arm`] sets
//! one [`Fault`] for the next client packet that contains the bytes
//! `COMMIT` (any case): sqlx sends `COMMIT` as a plain text query on both
//! PostgreSQL (a simple `Q` message) and MySQL (`COM_QUERY`), so scanning
//! what the client sends finds it. Every such packet is logged to stderr.

use std::{
    io,
    net::SocketAddr,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};

/// What the proxy does to the next client packet containing `COMMIT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward it, then close the client's socket at once so no reply
    /// reaches the client. The server side stays open until the server
    /// answers (the `COMMIT` has then been carried out), and is closed
    /// then: the commit happened, the client never learns it.
    CutAfterCommit,
    /// Close both sockets instead of forwarding it: the server sees the
    /// connection drop inside the transaction and rolls it back.
    CutInsteadOfCommit,
}

/// How long a [`Fault::CutAfterCommit`] waits for the server's reply
/// before closing the server side anyway.
const REPLY_WAIT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Control {
    armed: Mutex<Option<Fault>>,
    fired: AtomicU64,
    commits_seen: AtomicU64,
    connections: AtomicU64,
}

impl Control {
    fn take(&self) -> Option<Fault> {
        self.armed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// A running proxy; stops accepting when dropped (connections already
/// open keep forwarding until either side closes).
pub struct Proxy {
    addr: SocketAddr,
    control: Arc<Control>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on `127.0.0.1:0` and forwards to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let control = Arc::new(Control::default());
        let upstream = upstream.to_owned();
        let accept = tokio::spawn({
            let control = control.clone();
            async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    let id = control.connections.fetch_add(1, Ordering::Relaxed) + 1;
                    let (control, upstream) = (control.clone(), upstream.clone());
                    tokio::spawn(async move {
                        match TcpStream::connect(&upstream).await {
                            Ok(server) => forward(id, client, server, &control).await,
                            Err(e) => eprintln!("[proxy #{id}] connect {upstream}: {e}"),
                        }
                    });
                }
            }
        });
        Ok(Self {
            addr,
            control,
            accept,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets `fault` for the next client packet containing `COMMIT`
    /// (replacing one armed earlier and not fired yet).
    pub fn arm(&self, fault: Fault) {
        *self
            .control
            .armed
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(fault);
    }

    /// Whether a fault is armed and has not fired yet.
    pub fn is_armed(&self) -> bool {
        self.control
            .armed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// Faults fired so far.
    pub fn fired(&self) -> u64 {
        self.control.fired.load(Ordering::SeqCst)
    }

    /// Client packets containing `COMMIT` seen so far (forwarded or not).
    pub fn commits_seen(&self) -> u64 {
        self.control.commits_seen.load(Ordering::SeqCst)
    }

    /// Client connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.control.connections.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Whether `bytes` contain the word `COMMIT`, in any case: not inside an
/// identifier (a schema named `lost_commit_reply` is no `COMMIT`).
fn has_commit(bytes: &[u8]) -> bool {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    bytes.windows(6).enumerate().any(|(i, w)| {
        w.eq_ignore_ascii_case(b"COMMIT")
            && (i == 0 || !word(bytes[i - 1]))
            && bytes.get(i + 6).is_none_or(|&b| !word(b))
    })
}

async fn forward(id: u64, mut client: TcpStream, mut server: TcpStream, control: &Control) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let mut from_client = vec![0u8; 64 * 1024];
    let mut from_server = vec![0u8; 64 * 1024];
    // The last bytes of the previous client read: a `COMMIT` split across
    // two reads is still found.
    let mut tail: Vec<u8> = Vec::with_capacity(16);
    loop {
        tokio::select! {
            read = client.read(&mut from_client) => {
                let n = match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let packet = &from_client[..n];
                let mut scan = std::mem::take(&mut tail);
                scan.extend_from_slice(packet);
                let commit = has_commit(&scan);
                tail = scan[scan.len().saturating_sub(5)..].to_vec();
                if commit {
                    control.commits_seen.fetch_add(1, Ordering::SeqCst);
                    let fault = control.take();
                    eprintln!(
                        "[proxy #{id}] client->server {n} bytes with COMMIT: \"{}\"; fault: {fault:?}",
                        packet.escape_ascii()
                    );
                    match fault {
                        Some(Fault::CutInsteadOfCommit) => {
                            control.fired.fetch_add(1, Ordering::SeqCst);
                            eprintln!("[proxy #{id}] COMMIT not forwarded; both sockets closed");
                            return;
                        }
                        Some(Fault::CutAfterCommit) => {
                            let sent = server.write_all(packet).await;
                            drop(client);
                            control.fired.fetch_add(1, Ordering::SeqCst);
                            // Read (and drop) the server's answer: once it
                            // arrives the commit is done.
                            let reply = match sent {
                                Ok(()) => tokio::time::timeout(
                                    REPLY_WAIT,
                                    server.read(&mut from_server),
                                )
                                .await,
                                Err(e) => Ok(Err(e)),
                            };
                            match reply {
                                Ok(Ok(n)) => eprintln!(
                                    "[proxy #{id}] COMMIT forwarded; client cut; server's {n}-byte reply dropped: \"{}\"",
                                    from_server[..n].escape_ascii()
                                ),
                                Ok(Err(e)) => eprintln!("[proxy #{id}] COMMIT forwarded; client cut; server: {e}"),
                                Err(_) => eprintln!("[proxy #{id}] COMMIT forwarded; client cut; no reply in {REPLY_WAIT:?}"),
                            }
                            return;
                        }
                        None => {}
                    }
                }
                if server.write_all(packet).await.is_err() {
                    return;
                }
            }
            read = server.read(&mut from_server) => {
                let n = match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if client.write_all(&from_server[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_is_found_in_any_case() {
        assert!(has_commit(b"Q\0\0\0\x0bCOMMIT\0"));
        assert!(has_commit(b"\x07\0\0\0\x03commit"));
        assert!(!has_commit(b"COMMI"));
        assert!(!has_commit(b"SELECT 1"));
        assert!(!has_commit(b"SET search_path = \"ct_lost_commit_reply\""));
        assert!(!has_commit(b"commits"));
    }
}
