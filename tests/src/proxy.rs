//! A TCP proxy that can lose a transaction's `COMMIT` or its reply, or cut a
//! transaction mid-way.
//!
//! [`Proxy::start`] listens on `127.0.0.1:0` and forwards every connection
//! to the real server, both directions, byte for byte. [`Proxy::arm`] sets
//! one [`Fault`] for the next client packet that contains the bytes
//! `COMMIT` (any case): sqlx sends `COMMIT` as a plain text query on both
//! PostgreSQL (a simple `Q` message) and MySQL (`COM_QUERY`), so scanning
//! what the client sends finds it. Every such packet is logged to stderr.
//!
//! [`Proxy::arm_cut_in_transaction`] cuts a transaction mid-way instead: the
//! proxy splits what the client sends into protocol messages (PostgreSQL's
//! startup message then typed messages; MySQL's packets), finds the next
//! `BEGIN`, lets that many commands through after it (a PostgreSQL `Q` or
//! `Execute`, a MySQL `COM_QUERY` or `COM_STMT_EXECUTE`: each statement run,
//! `COMMIT` included; parse, bind, prepare and sync messages do not count),
//! and closes both sockets at the next command instead of forwarding it. The
//! server has then run part of the transaction and sees the connection drop
//! inside it.

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
    /// Commands to let through after the next `BEGIN` before the cut.
    cut_in_transaction: Mutex<Option<u32>>,
    cuts: AtomicU64,
    fired: AtomicU64,
    commits_seen: AtomicU64,
    connections: AtomicU64,
    /// Bumped by [`Proxy::cut_all`]: every connection open then closes.
    cut_all: tokio::sync::watch::Sender<u64>,
    /// Bumped by [`Proxy::stall_all`]: every connection open then goes
    /// silent, never closed.
    stall_all: tokio::sync::watch::Sender<u64>,
    /// While true, nothing from the server reaches any client (see
    /// [`Proxy::hold_replies`]).
    hold_replies: tokio::sync::watch::Sender<bool>,
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

    /// Arms a cut of the next transaction any connection begins: after its
    /// `BEGIN`, `commands` commands (statements run, see the module doc) are
    /// forwarded, and both sockets are closed at the next command (which may
    /// be the `COMMIT`) instead of forwarding it. If the transaction ends
    /// with fewer commands, nothing is cut and the fault is spent; see
    /// [`Proxy::cuts`]. Replaces a cut armed earlier and not claimed by a
    /// `BEGIN` yet.
    pub fn arm_cut_in_transaction(&self, commands: u32) {
        *self
            .control
            .cut_in_transaction
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(commands);
    }

    /// Transactions cut mid-way so far (see [`Proxy::arm_cut_in_transaction`]).
    pub fn cuts(&self) -> u64 {
        self.control.cuts.load(Ordering::SeqCst)
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

    /// Closes every connection open now, both sockets, as a cut network
    /// would (any protocol: the Redis cache's tests use it); connections
    /// made afterwards go through.
    pub fn cut_all(&self) {
        self.control.cut_all.send_modify(|cuts| *cuts += 1);
    }

    /// Every connection open now goes silent and stays open, as a link cut
    /// without a reset (a cable pulled, a NAT that forgot the connection):
    /// nothing more reaches either side, what the client sends is taken
    /// and dropped, and neither side is told. Each ends when its client
    /// closes; connections made afterwards go through.
    pub fn stall_all(&self) {
        self.control.stall_all.send_modify(|stalls| *stalls += 1);
    }

    /// While `hold` is true, what servers send stays unread (in the
    /// kernel's buffers) on every connection, while what clients send goes
    /// through: a request reaches the server and its answer does not reach
    /// the client, which times out; released, the held answers arrive late.
    pub fn hold_replies(&self, hold: bool) {
        self.control.hold_replies.send_replace(hold);
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
    let mut scanner = Scanner::default();
    // A claimed cut: (commands to let through, commands seen since BEGIN).
    let mut cut: Option<(u32, u32)> = None;
    let mut cut_all = control.cut_all.subscribe();
    let mut stall_all = control.stall_all.subscribe();
    let mut hold = control.hold_replies.subscribe();
    loop {
        let holding = *hold.borrow_and_update();
        tokio::select! {
            _ = cut_all.changed() => {
                eprintln!("[proxy #{id}] cut with every open connection");
                return;
            }
            _ = stall_all.changed() => {
                eprintln!("[proxy #{id}] stalled with every open connection");
                // The server's socket stays open, unread, until the client goes.
                while matches!(client.read(&mut from_client).await, Ok(n) if n > 0) {}
                return;
            }
            // A change of the hold: the loop reads the server again (or not).
            _ = hold.changed() => {}
            read = client.read(&mut from_client) => {
                let n = match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let packet = &from_client[..n];
                if let Some(at) = cut_point(id, &mut scanner, packet, &mut cut, control) {
                    let _ = server.write_all(&packet[..at]).await;
                    control.cuts.fetch_add(1, Ordering::SeqCst);
                    eprintln!(
                        "[proxy #{id}] transaction cut: {at} of {n} bytes forwarded, both sockets closed"
                    );
                    return;
                }
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
            read = server.read(&mut from_server), if !holding => {
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

/// Where a claimed transaction cut falls in `packet` (the offset of the
/// message not to forward), claiming an armed cut at a `BEGIN`.
fn cut_point(
    id: u64,
    scanner: &mut Scanner,
    packet: &[u8],
    cut: &mut Option<(u32, u32)>,
    control: &Control,
) -> Option<usize> {
    for (at, message) in scanner.feed(packet) {
        match message {
            Message::Begin => {
                let armed = control
                    .cut_in_transaction
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take();
                if let Some(commands) = armed {
                    eprintln!("[proxy #{id}] BEGIN: cut after {commands} command(s)");
                    *cut = Some((commands, 0));
                }
            }
            Message::Command { ends_transaction } => {
                if let Some((commands, seen)) = cut.as_mut() {
                    if seen == commands {
                        return Some(at);
                    }
                    *seen += 1;
                    if ends_transaction {
                        eprintln!(
                            "[proxy #{id}] transaction ended after {seen} command(s): nothing cut"
                        );
                        *cut = None;
                    }
                }
            }
            Message::Other => {}
        }
    }
    None
}

/// What a client message is, as far as a transaction cut cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Message {
    /// A text query `BEGIN` / `START TRANSACTION`.
    Begin,
    /// A statement run: a text query, or the execution of a prepared
    /// statement; `COMMIT` and `ROLLBACK` end the transaction.
    Command { ends_transaction: bool },
    /// Anything else: startup, authentication, parse, bind, prepare, sync.
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    Postgres,
    MySql,
}

/// Splits the client's byte stream into messages, across reads.
#[derive(Debug, Default)]
struct Scanner {
    /// Decided from the first 8 bytes: a PostgreSQL startup, SSL, GSS or
    /// cancel request has its code at bytes 4..8; anything else is MySQL.
    wire: Option<Wire>,
    /// PostgreSQL: the next message is untyped (startup and its requests).
    typed: bool,
    /// The first bytes of the current message, until it is classified.
    head: Vec<u8>,
    /// Bytes of the current, classified message still to come.
    remaining: usize,
}

/// Bytes of a message kept to classify it: header and a query's start.
const HEAD: usize = 32;
const PG_CODES: [[u8; 4]; 4] = [
    [0, 3, 0, 0],             // protocol 3.0 startup
    [0x04, 0xd2, 0x16, 0x2f], // SSLRequest
    [0x04, 0xd2, 0x16, 0x30], // GSSENCRequest
    [0x04, 0xd2, 0x16, 0x2e], // CancelRequest
];

impl Scanner {
    /// The messages that start in `chunk`, with their offsets (0 for one
    /// whose first bytes came in an earlier chunk).
    fn feed(&mut self, chunk: &[u8]) -> Vec<(usize, Message)> {
        let mut found = Vec::new();
        let mut i = 0;
        while i < chunk.len() {
            if self.remaining > 0 {
                let skip = self.remaining.min(chunk.len() - i);
                self.remaining -= skip;
                i += skip;
                continue;
            }
            let start = if self.head.is_empty() { i } else { 0 };
            while i < chunk.len() {
                self.head.push(chunk[i]);
                i += 1;
                if let Some(total) = self.length()
                    && self.head.len() >= total.min(HEAD)
                {
                    break;
                }
            }
            let Some(total) = self.length() else { break };
            if self.head.len() < total.min(HEAD) {
                break;
            }
            found.push((start, self.classify()));
            self.remaining = total.saturating_sub(self.head.len());
            self.head.clear();
        }
        found
    }

    /// The current message's whole length, once its header is in `head`.
    fn length(&mut self) -> Option<usize> {
        let h = &self.head;
        if self.wire.is_none() {
            if h.len() < 8 {
                return None;
            }
            let code: [u8; 4] = h[4..8].try_into().ok()?;
            self.wire = Some(if PG_CODES.contains(&code) {
                Wire::Postgres
            } else {
                Wire::MySql
            });
        }
        let h = &self.head;
        match self.wire? {
            Wire::Postgres if !self.typed => {
                let len = u32::from_be_bytes(h.get(0..4)?.try_into().ok()?);
                Some((len as usize).max(4))
            }
            Wire::Postgres => {
                let len = u32::from_be_bytes(h.get(1..5)?.try_into().ok()?);
                Some(1 + (len as usize).max(4))
            }
            Wire::MySql => {
                let len = h.get(0..3)?;
                Some(4 + (len[0] as usize | (len[1] as usize) << 8 | (len[2] as usize) << 16))
            }
        }
    }

    fn classify(&mut self) -> Message {
        let h = &self.head;
        match self.wire {
            Some(Wire::Postgres) if !self.typed => {
                // The startup message proper ends the untyped part; an SSL
                // or GSS request is followed by another untyped message.
                if h.get(4..8) == Some(&PG_CODES[0][..]) {
                    self.typed = true;
                }
                Message::Other
            }
            Some(Wire::Postgres) => match h[0] {
                b'Q' => query(&h[5..]),
                b'E' => Message::Command {
                    ends_transaction: false,
                },
                _ => Message::Other,
            },
            Some(Wire::MySql) => match (h.get(3), h.get(4)) {
                // A command packet has sequence number 0.
                (Some(0), Some(0x03)) => query(&h[5..]),
                (Some(0), Some(0x17)) => Message::Command {
                    ends_transaction: false,
                },
                _ => Message::Other,
            },
            None => Message::Other,
        }
    }
}

/// A text query, by its first word.
fn query(text: &[u8]) -> Message {
    let text = text.trim_ascii_start();
    let starts =
        |word: &[u8]| text.len() >= word.len() && text[..word.len()].eq_ignore_ascii_case(word);
    if starts(b"BEGIN") || starts(b"START TRANSACTION") {
        Message::Begin
    } else {
        Message::Command {
            ends_transaction: starts(b"COMMIT") || starts(b"ROLLBACK"),
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

    fn pg(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    fn my(seq: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut m = vec![len as u8, (len >> 8) as u8, (len >> 16) as u8, seq];
        m.extend_from_slice(payload);
        m
    }

    /// Feeds `stream` in chunks of `size` bytes.
    fn scan(stream: &[u8], size: usize) -> Vec<(usize, Message)> {
        let mut scanner = Scanner::default();
        let mut found = Vec::new();
        let mut base = 0;
        for chunk in stream.chunks(size) {
            for (at, m) in scanner.feed(chunk) {
                found.push((base + at, m));
            }
            base += chunk.len();
        }
        found
    }

    const RUN: Message = Message::Command {
        ends_transaction: false,
    };
    const END: Message = Message::Command {
        ends_transaction: true,
    };

    #[test]
    fn postgres_messages_are_told_apart_across_reads() {
        let params = b"user\0x\0\0";
        let mut startup = (8 + params.len() as u32).to_be_bytes().to_vec();
        startup.extend_from_slice(&[0, 3, 0, 0]);
        startup.extend_from_slice(params);
        let messages = [
            startup,
            pg(b'Q', b"BEGIN\0"),
            pg(b'P', &[b'x'; 100]),
            pg(b'B', &[0; 70]),
            pg(b'E', &[0; 5]),
            pg(b'S', b""),
            pg(b'Q', b"commit\0"),
        ];
        let stream = messages.concat();
        let kinds: Vec<Message> = scan(&stream, stream.len())
            .into_iter()
            .map(|(_, m)| m)
            .collect();
        use Message::*;
        assert_eq!(kinds, [Other, Begin, Other, Other, RUN, Other, END]);
        for size in [1, 3, 7, 40] {
            let found = scan(&stream, size);
            let kinds: Vec<Message> = found.iter().map(|(_, m)| *m).collect();
            assert_eq!(
                kinds,
                [Other, Begin, Other, Other, RUN, Other, END],
                "{size}"
            );
        }
        let execute_at = messages[..4].iter().map(Vec::len).sum::<usize>();
        assert_eq!(scan(&stream, stream.len())[4], (execute_at, RUN));
    }

    #[test]
    fn mysql_commands_have_sequence_zero() {
        let messages = [
            my(1, &[0x0d; 60]),   // handshake response
            my(0, b"\x03BEGIN"),  // COM_QUERY
            my(0, &[0x16; 40]),   // COM_STMT_PREPARE
            my(0, &[0x17; 3000]), // COM_STMT_EXECUTE
            my(0, b"\x03COMMIT"),
            my(0, b"\x03SELECT 1"),
        ];
        let stream = messages.concat();
        use Message::*;
        for size in [1, 5, 64, stream.len()] {
            let kinds: Vec<Message> = scan(&stream, size).into_iter().map(|(_, m)| m).collect();
            assert_eq!(kinds, [Other, Begin, Other, RUN, END, RUN], "{size}");
        }
    }
}
