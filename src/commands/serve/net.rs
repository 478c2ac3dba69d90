//! The HTTP side of `serve`, made for the open network: hyper's HTTP/1 server
//! (hyper 1 with hyper-util's tokio glue, no framework: four endpoints need no
//! router crate, and hyper's own connection builder is where every limit below is
//! set) on the caller's small tokio runtime, one task a connection, no thread.
//!
//! - Connections: at most `--max-connections` at once (by default half the soft
//!   `RLIMIT_NOFILE`, between 16 and 4096: a connection is one file descriptor,
//!   the other half is left to the model, the device and the refusals). Past it a
//!   connection gets a canned `503` and is closed; at most [`REFUSING`] of those are
//!   written at once, past that a connection is closed unanswered.
//! - Accept errors (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`: the process or the
//!   machine out of descriptors or memory) are logged at most once every
//!   [`LOG_EVERY`] with a count of those not logged, and the loop backs off
//!   ([`BACKOFF_MIN`] doubling to [`BACKOFF_MAX`]); errors of one connection
//!   (`ECONNABORTED`…) are counted and skipped. The server never stops on them.
//! - Request heads: at most [`MAX_HEADER_BYTES`] (start line and headers) and
//!   [`MAX_HEADERS`] header lines, else hyper answers `431` and closes; hyper's read
//!   buffer is bounded by [`MAX_BUF`]. A chunked body's size line holds nothing in
//!   memory (hyper decodes it byte by byte and answers 16 KiB of chunk extensions
//!   with an error, `400`); the body itself is the endpoint's (`--max-body`,
//!   `--body-timeout`).
//! - `--header-timeout`: hyper's header read timeout, which starts when the server
//!   waits for a request's head (a new connection, or a kept-alive one after its
//!   last response): it is the keep-alive idle timeout as well as the slowloris
//!   bound. An idle connection is closed silently; one whose head had begun gets
//!   a canned `408`.
//! - The first request line of a connection is checked before hyper reads it: a
//!   version other than HTTP/1.0 and HTTP/1.1 (`HTTP/2.0` as text, the h2
//!   preface, HTTP/0.9's line without one) gets `505`, a line that is not ASCII
//!   `400` (later requests of a kept-alive connection get hyper's `400` for both).
//! - Half-closed clients (write side shut after the request) are answered:
//!   hyper's `half_close(true)`. Only a failed write says a client left; a
//!   write the client takes nothing of for [`SEND_STALL`] fails too (a client
//!   that stopped reading, or a peer gone without a reset).
//! - Every connection ends with a lingering close: the write side shut, then what
//!   the client still sends read and dropped for up to [`LINGER`] or
//!   [`LINGER_BYTES`], so that an answer given before a body was read (`413`,
//!   `408`, `503`) reaches the client instead of being reset.
//! - Shutdown: the listener closes, every connection is told to finish (hyper's
//!   graceful shutdown: idle ones close at once, a request in flight gets its
//!   response), and after `--drain-timeout` whatever is left is dropped.

use std::future::Future;
use std::io;
use std::net::ToSocketAddrs;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::body::{Body, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{Semaphore, watch};

/// The largest request head (start line and headers), in bytes.
const MAX_HEADER_BYTES: usize = 16 * 1024;
/// The most header lines a request may have.
const MAX_HEADERS: usize = 100;
/// The bound of a connection's read buffer (hyper's `max_buf_size`, at least 8 KiB).
const MAX_BUF: usize = 64 * 1024;
/// Canned refusals (`503` past the connection limit) written at once; past it a
/// connection over the limit is closed unanswered.
const REFUSING: usize = 64;
/// How long a closing connection's unread input is read and dropped, at most.
const LINGER: Duration = Duration::from_secs(1);
/// How much of a closing connection's unread input is read and dropped, at most.
const LINGER_BYTES: usize = 256 * 1024;
/// The accept loop's pause after a resource error: the first, and the most it doubles to.
const BACKOFF_MIN: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_millis(100);
/// The least time between two log lines about accept errors.
const LOG_EVERY: Duration = Duration::from_secs(10);
/// How long a client may take none of the bytes written to it before the write
/// fails (a client that stopped reading, or a peer gone without a reset).
const SEND_STALL: Duration = Duration::from_secs(60);
/// The listen backlog.
const BACKLOG: u32 = 1024;

/// The limits and timeouts of the HTTP side.
pub(super) struct NetConfig {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub drain_timeout: Duration,
}

/// The default `--max-connections`: half the soft limit of open files, between
/// 16 and 4096.
pub(super) fn default_max_connections() -> usize {
    let soft = open_files_limit().unwrap_or(1024);
    usize::try_from(soft / 2).unwrap_or(usize::MAX).clamp(16, 4096)
}

#[cfg(unix)]
fn open_files_limit() -> Option<u64> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes the struct it is given.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0;
    #[allow(clippy::unnecessary_cast)] // rlim_t is not u64 everywhere
    ok.then_some(r.rlim_cur as u64)
}

#[cfg(not(unix))]
fn open_files_limit() -> Option<u64> {
    None
}

/// Counters of the HTTP side, for /metrics.
#[derive(Default)]
pub(super) struct NetCounters {
    pub open: AtomicU64,
    pub refused: AtomicU64,
    pub accept_errors: AtomicU64,
}

/// Binds `host:port` (the first of its addresses that binds).
pub(super) fn listen(host: &str, port: u16) -> io::Result<TcpListener> {
    let mut last = None;
    for addr in (host, port).to_socket_addrs()? {
        let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
        socket.set_reuseaddr(true)?;
        match socket.bind(addr).and_then(|()| socket.listen(BACKLOG)) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the host has no address")))
}

/// Accepts connections and serves each with `handler` until `shutdown`
/// resolves; then drains them within `--drain-timeout` and returns.
pub(super) async fn serve<F, Fut, B>(
    listener: TcpListener,
    config: &NetConfig,
    counters: Arc<NetCounters>,
    handler: F,
    shutdown: impl Future<Output = ()>,
) where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let max = config.max_connections.min(Semaphore::MAX_PERMITS).min(u32::MAX as usize);
    let slots = Arc::new(Semaphore::new(max));
    let refusing = Arc::new(Semaphore::new(REFUSING));
    let (stop, stopping) = watch::channel(false);
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(config.header_timeout)
        .max_headers(MAX_HEADERS)
        .max_header_size(MAX_HEADER_BYTES)
        .max_buf_size(MAX_BUF)
        .half_close(true)
        .keep_alive(true);
    let builder = Arc::new(builder);
    let mut errors = Throttled::default();
    let mut backoff = BACKOFF_MIN;
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                backoff = BACKOFF_MIN;
                stream
            }
            Err(e) => {
                counters.accept_errors.fetch_add(1, Ordering::Relaxed);
                let pause = match accept_error(&e) {
                    AcceptError::Resources => {
                        let p = backoff;
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                        Some(p)
                    }
                    AcceptError::OneConnection => None,
                    AcceptError::Other => Some(BACKOFF_MIN),
                };
                errors.log(&e, pause);
                if let Some(p) = pause {
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(p) => {}
                    }
                }
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            counters.refused.fetch_add(1, Ordering::Relaxed);
            if let Ok(permit) = refusing.clone().try_acquire_owned() {
                tokio::spawn(async move {
                    refuse(
                        stream,
                        503,
                        Some("too_many_connections"),
                        "the server has all the connections it takes (--max-connections); retry later",
                    )
                    .await;
                    drop(permit);
                });
            }
            continue;
        };
        let (builder, handler, counters, stopping) = (builder.clone(), handler.clone(), counters.clone(), stopping.clone());
        tokio::spawn(async move {
            counters.open.fetch_add(1, Ordering::Relaxed);
            connection(stream, &builder, handler, stopping).await;
            counters.open.fetch_sub(1, Ordering::Relaxed);
            drop(slot);
        });
    }
    drop(listener);
    let open = max - slots.available_permits();
    eprintln!("ktune serve: shutting down: {open} connection(s) finishing (--drain-timeout {}s)", config.drain_timeout.as_secs_f64());
    let _ = stop.send(true);
    if tokio::time::timeout(config.drain_timeout, slots.acquire_many(max as u32)).await.is_err() {
        let left = max - slots.available_permits();
        eprintln!("ktune serve: the drain deadline passed: {left} connection(s) dropped");
    }
}

/// One connection: hyper serves its requests; at the end, a canned answer
/// where hyper gave none (a refused first line, a request head that timed
/// out), then a lingering close.
async fn connection<F, Fut, B>(stream: TcpStream, builder: &http1::Builder, handler: F, mut stopping: watch::Receiver<bool>)
where
    F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let _ = stream.set_nodelay(true);
    let mut io = TokioIo::new(Watched { stream, first_line: Some(Vec::new()), refused: None, head_begun: false, stalled: None });
    let result = {
        let service = service_fn(|req| {
            let reply = handler(req);
            async move { Ok::<_, std::convert::Infallible>(reply.await) }
        });
        let conn = builder.serve_connection(&mut io, service);
        tokio::pin!(conn);
        let mut told = false;
        loop {
            tokio::select! {
                r = conn.as_mut() => break r,
                _ = stopping.changed(), if !told => {
                    told = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    };
    let watched = io.into_inner();
    // A refused first line reads to hyper as the client closing before a request.
    let answer = match (&result, watched.refused) {
        (_, Some(refusal)) => Some(refusal),
        (Err(e), None) if e.is_timeout() && watched.head_begun => {
            Some((408, "the request head did not arrive within the server's --header-timeout"))
        }
        _ => None,
    };
    match answer {
        Some((status, msg)) => refuse(watched.stream, status, None, msg).await,
        None => linger(watched.stream).await,
    }
}

/// Writes a canned error response (`Connection: close`) and closes lingering.
async fn refuse(mut stream: TcpStream, status: u16, code: Option<&str>, msg: &str) {
    let _ = tokio::time::timeout(LINGER, stream.write_all(&canned(status, code, msg))).await;
    linger(stream).await;
}

/// A whole HTTP/1.1 response with the error JSON of `status`, `code` and `msg`.
fn canned(status: u16, code: Option<&str>, msg: &str) -> Vec<u8> {
    let body = super::error_json(status, code, msg).to_string();
    let reason = StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("Error");
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n{}\r\n{body}",
        body.len(),
        if status == 503 { "Retry-After: 1\r\n" } else { "" },
    )
    .into_bytes()
}

/// Shuts the write side, then reads and drops what the client still sends
/// (within [`LINGER`] and [`LINGER_BYTES`]) before the descriptor closes, so that
/// unread input does not turn the close into a reset that loses the answer.
async fn linger(mut stream: TcpStream) {
    let _ = stream.shutdown().await;
    let mut buf = vec![0u8; 8192];
    let mut left = LINGER_BYTES;
    let _ = tokio::time::timeout(LINGER, async {
        while left > 0 {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

/// What an accept error says about the listener.
enum AcceptError {
    /// Out of descriptors or memory: wait before the next accept.
    Resources,
    /// One connection's trouble: go on at once.
    OneConnection,
    Other,
}

fn accept_error(e: &io::Error) -> AcceptError {
    #[cfg(unix)]
    if let Some(code) = e.raw_os_error()
        && [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM].contains(&code)
    {
        return AcceptError::Resources;
    }
    match e.kind() {
        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset | io::ErrorKind::Interrupted => AcceptError::OneConnection,
        _ => AcceptError::Other,
    }
}

/// Accept errors logged at most once every [`LOG_EVERY`], with a count of the
/// ones in between.
#[derive(Default)]
struct Throttled {
    last: Option<Instant>,
    quiet: u64,
}

impl Throttled {
    fn log(&mut self, e: &io::Error, pause: Option<Duration>) {
        if self.last.is_some_and(|t| t.elapsed() < LOG_EVERY) {
            self.quiet += 1;
            return;
        }
        let more = if self.quiet > 0 { format!(" ({} more since the last such line)", self.quiet) } else { String::new() };
        let then = pause.map_or("going on".to_string(), |p| format!("pausing {} ms", p.as_millis()));
        eprintln!("ktune serve: accepting a connection failed: {e}{more}; {then}");
        self.last = Some(Instant::now());
        self.quiet = 0;
    }
}

/// A connection's stream as hyper reads and writes it, watched: the first
/// request line is checked as it arrives, and whether a request head has begun
/// since the last response bytes went out.
struct Watched {
    stream: TcpStream,
    /// The first request line so far; `None` once it was judged.
    first_line: Option<Vec<u8>>,
    /// The answer owed instead of hyper's, when the first line was refused.
    refused: Option<(u16, &'static str)>,
    /// Bytes arrived since the last write (a request head under way).
    head_begun: bool,
    /// Since when the client has taken none of the bytes written to it.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Watched {
    /// Notes a write's outcome: a client that takes no byte for [`SEND_STALL`]
    /// has its write fail (and its response, and generation, dropped).
    fn wrote(&mut self, cx: &mut Context<'_>, written: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        match written {
            Poll::Ready(Ok(n)) => {
                self.head_begun &= n == 0;
                self.stalled = None;
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                let stall = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(SEND_STALL)));
                ready!(stall.as_mut().poll(cx));
                let msg = format!("the client took nothing of its response for {} s", SEND_STALL.as_secs());
                Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, msg)))
            }
        }
    }
}

/// The verdict on a connection's first request line.
enum Line {
    /// Not complete yet.
    More,
    /// hyper's to parse (and judge).
    Fine,
    Refused(u16, &'static str),
}

/// Adds `new` to the first request line `line` and judges it once complete.
/// Empty lines before it are skipped (RFC 9112 §2.2); a line longer than
/// [`MAX_HEADER_BYTES`] is left to hyper (414 or 431).
fn first_line(line: &mut Vec<u8>, new: &[u8]) -> Line {
    for &b in new {
        if b == b'\n' {
            let l = line.strip_suffix(b"\r").unwrap_or(line);
            if l.is_empty() {
                line.clear();
                continue;
            }
            return judge(l);
        }
        if line.len() >= MAX_HEADER_BYTES {
            return Line::Fine;
        }
        line.push(b);
    }
    Line::More
}

/// A complete request line (without its line end).
fn judge(l: &[u8]) -> Line {
    if !l.is_ascii() {
        return Line::Refused(400, "the request line is not ASCII");
    }
    let parts: Vec<&[u8]> = l.split(|&b| b == b' ').collect();
    match parts.as_slice() {
        [_, _] => Line::Refused(505, "HTTP/0.9 is not served: send HTTP/1.1"),
        [_, _, v] if v.starts_with(b"HTTP/") && *v != b"HTTP/1.1" && *v != b"HTTP/1.0" => {
            Line::Refused(505, "this HTTP version is not served: send HTTP/1.1 (or HTTP/1.0)")
        }
        _ => Line::Fine,
    }
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.stream).poll_read(cx, buf))?;
        let this = &mut *self;
        let new = &buf.filled()[before..];
        if new.is_empty() {
            return Poll::Ready(Ok(()));
        }
        this.head_begun = true;
        let Some(line) = &mut this.first_line else { return Poll::Ready(Ok(())) };
        match first_line(line, new) {
            Line::More => {}
            Line::Fine => this.first_line = None,
            Line::Refused(status, msg) => {
                // hyper never sees the line: its read fails, and the
                // connection's end writes this answer instead.
                this.first_line = None;
                this.refused = Some((status, msg));
                buf.set_filled(before);
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, msg)));
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write(cx, data);
        self.wrote(cx, written)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.wrote(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    /// Only flushes: the connection's end shuts the write side ([`linger`]),
    /// after the answer hyper could not give, if any.
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(text: &[u8]) -> Option<u16> {
        let mut line = Vec::new();
        // Fed a byte at a time, as a slow client sends it.
        for b in text {
            match first_line(&mut line, std::slice::from_ref(b)) {
                Line::More => {}
                Line::Fine => return None,
                Line::Refused(s, _) => return Some(s),
            }
        }
        Some(0)
    }

    #[test]
    fn first_request_lines_are_judged_as_they_arrive() {
        assert_eq!(verdict(b"GET /health HTTP/1.1\r\n"), None);
        assert_eq!(verdict(b"\r\nPOST /v1/completions HTTP/1.0\r\n"), None);
        assert_eq!(verdict(b"GET /health HTTP/2.0\r\n"), Some(505));
        assert_eq!(verdict(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), Some(505));
        assert_eq!(verdict(b"GET /health\r\n"), Some(505));
        assert_eq!(verdict("GET /h\u{e9}alth HTTP/1.1\r\n".as_bytes()), Some(400));
        // Malformed otherwise: hyper's to answer (400).
        assert_eq!(verdict(b"GET  /health  HTTP/1.1\r\n"), None);
        assert_eq!(verdict(b"GET /health HTTP/1.1"), Some(0), "incomplete");
    }

    #[test]
    fn canned_answers_are_whole_responses() {
        let r = String::from_utf8(canned(503, None, "full")).expect("text");
        let (head, body) = r.split_once("\r\n\r\n").expect("a head");
        assert!(head.starts_with("HTTP/1.1 503 Service Unavailable\r\n") && head.contains("Connection: close"), "{head}");
        assert!(head.contains(&format!("Content-Length: {}", body.len())), "{head}");
        let v: serde_json::Value = serde_json::from_str(body).expect("JSON");
        assert_eq!(v["error"]["message"], "full");
    }
}
