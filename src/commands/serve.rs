//! `ktune serve`: the OpenAI API over HTTP (tiny_http: a blocking server, one
//! thread a request) for one model on one device, through the shared
//! [`Generator`] (source, profile and engine chosen as `run` chooses them).
//! `POST /v1/chat/completions` and `/v1/completions` (streamed by server-sent
//! events ending in `data: [DONE]`, or not), `GET /v1/models`, `/health` and
//! `/metrics` (Prometheus text). The engine lives on one worker thread that
//! serves requests one at a time, in order; at most `--queue` wait behind the one
//! being served (429 past that). Bodies past `--max-body` get 413, malformed JSON
//! 400 with serde's message, a missing or wrong `--api-key` bearer 401; errors use
//! OpenAI's JSON shape. The request's `model` is not checked (one model is
//! served). A client that disconnects cancels its generation at the next token:
//! streaming, the send fails; waiting for a whole reply, Linux's TCP table shows
//! its connection closing ([`peer_gone`]). SIGINT/SIGTERM: no new connections, the request
//! being generated finishes, those waiting get 503, exit 0. Being a server, this
//! command writes its log lines to stderr itself.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use serde_json::{Value, json};
use tiny_http::{Header, Method, Request, Response, Server};

use crate::cli::ServeArgs;
use crate::generate::{self, Completion, Generator, Limits};
use crate::kernels::sample::SamplerParams;
use crate::report::StopReason;
use crate::{Error, Result};

/// The two generating endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Chat,
    Text,
}

impl Kind {
    fn path(self) -> &'static str {
        match self {
            Kind::Chat => "/v1/chat/completions",
            Kind::Text => "/v1/completions",
        }
    }
}

/// A message's content: a string, or OpenAI's list of parts (their text joined).
#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
struct Part {
    text: Option<String>,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: Option<Content>,
}

/// `stop`: one string or a list.
#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

/// `prompt`: one string or a list of one.
#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Default)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// The fields both endpoints read (others are ignored, as OpenAI clients send many).
#[derive(Deserialize)]
struct Body {
    messages: Option<Vec<Message>>,
    prompt: Option<Prompt>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<usize>,
    max_completion_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u32>,
    min_p: Option<f32>,
    repeat_penalty: Option<f32>,
    seed: Option<u64>,
    stop: Option<Stop>,
    n: Option<u32>,
}

/// What the worker is asked to generate from.
enum Input {
    Messages(Vec<(String, String)>),
    Text(String),
}

struct Job {
    input: Input,
    params: SamplerParams,
    limits: Limits,
    events: mpsc::Sender<Event>,
}

/// What the worker tells a request's handler.
enum Event {
    /// The prompt is accepted (its tokens counted): generation starts.
    Started,
    Text(String),
    Done(Box<Completion>),
    /// HTTP status and message.
    Failed(u16, String),
}

/// Counters for /metrics.
#[derive(Default)]
struct Metrics {
    requests: BTreeMap<(String, u16), u64>,
    prompt_tokens: u64,
    prefilled_tokens: u64,
    generated_tokens: u64,
    prefill_seconds: f64,
    decode_tokens: u64,
    decode_seconds: f64,
    cancelled: u64,
}

struct State {
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    /// Requests sent to the worker and not finished (the one generating included).
    pending: Mutex<usize>,
    queue: usize,
    metrics: Mutex<Metrics>,
    shutdown: AtomicBool,
    next_id: AtomicU64,
    model_id: String,
    api_key: Option<String>,
    max_body: usize,
    max_tokens: usize,
    /// `--ignore-eos`: every request generates its `max_tokens`.
    ignore_eos: bool,
    defaults: SamplerParams,
    context: usize,
    /// The port the server listens on (its side of every connection).
    port: u16,
}

/// Runs until the input ends (chat) or a signal (serve); `warn` shows the
/// warnings of loading (the application's `output::warn`).
pub fn run(selector: Option<&str>, args: &ServeArgs, warn: &dyn Fn(&str)) -> Result<()> {
    let defaults = args.generate.sampler();
    generate::check_sampling(&defaults)?;
    let settings = args.generate.generator("serve")?;
    let g = Generator::open(selector, &settings)?;
    for w in &g.warnings {
        warn(w);
    }
    let server = Server::http((args.host.as_str(), args.port))
        .map_err(|e| Error::Usage(format!("cannot listen on {}:{}: {e}; give another --port or --host", args.host, args.port)))?;
    let server = Arc::new(server);
    let (tx, rx) = mpsc::channel::<Job>();
    let state = Arc::new(State {
        jobs: Mutex::new(Some(tx)),
        pending: Mutex::new(0),
        queue: args.queue,
        metrics: Mutex::new(Metrics::default()),
        shutdown: AtomicBool::new(false),
        next_id: AtomicU64::new(1),
        model_id: args.model_id.clone().unwrap_or_else(|| g.model.clone()),
        api_key: args.api_key.clone(),
        max_body: args.max_body,
        max_tokens: args.max_tokens,
        ignore_eos: args.generate.sampling.ignore_eos,
        defaults,
        context: g.context,
        port: server.server_addr().to_ip().map_or(0, |a| a.port()),
    });
    {
        let (server, state) = (server.clone(), state.clone());
        ctrlc::set_handler(move || {
            state.shutdown.store(true, Ordering::SeqCst);
            server.unblock();
        })
        .map_err(|e| Error::Usage(format!("cannot catch SIGINT/SIGTERM: {e}")))?;
    }
    eprintln!(
        "ktune serve: {} on {}, {}, context {}; listening on http://{}",
        state.model_id,
        g.device,
        g.profile.as_deref().map_or("the runtime's defaults".to_string(), |p| format!("profile {p}")),
        g.context,
        server.server_addr()
    );
    let worker = {
        let state = state.clone();
        std::thread::spawn(move || work(g, rx, &state))
    };
    let mut handlers: Vec<std::thread::JoinHandle<()>> = Vec::new();
    for request in server.incoming_requests() {
        if state.shutdown.load(Ordering::SeqCst) {
            let _ = respond_error(&state, request, "", 503, "the server is shutting down");
            break;
        }
        handlers.retain(|h| !h.is_finished());
        let state = state.clone();
        handlers.push(std::thread::spawn(move || handle(&state, request)));
    }
    eprintln!("ktune serve: shutting down: {} request(s) finishing", handlers.iter().filter(|h| !h.is_finished()).count());
    // No more jobs: the worker ends once the queue is drained.
    state.jobs.lock().map_err(|_| Error::Usage("a request handler failed".into()))?.take();
    for h in handlers {
        let _ = h.join();
    }
    let _ = worker.join();
    Ok(())
}

/// The worker: one job at a time, in order; jobs left when shutting down get 503.
fn work(mut g: Generator, jobs: mpsc::Receiver<Job>, state: &State) {
    for job in jobs {
        if state.shutdown.load(Ordering::SeqCst) {
            let _ = job.events.send(Event::Failed(503, "the server is shutting down".into()));
        } else {
            serve_job(&mut g, job, state);
        }
        if let Ok(mut p) = state.pending.lock() {
            *p = p.saturating_sub(1);
        }
    }
}

fn serve_job(g: &mut Generator, job: Job, state: &State) {
    let prompt = match &job.input {
        Input::Messages(m) => {
            let turns: Vec<(&str, &str)> = m.iter().map(|(r, c)| (r.as_str(), c.as_str())).collect();
            g.render(&turns).map_err(|e| e.to_string())
        }
        Input::Text(t) => g.encode(t, false).map_err(|e| e.to_string()),
    };
    let prompt = match prompt {
        Ok(p) if p.is_empty() => Err("the prompt encodes to no tokens".to_string()),
        Ok(p) if p.len() >= g.context => {
            Err(format!("the prompt is {} tokens and the context holds {}: shorten it (the server's --context)", p.len(), g.context))
        }
        other => other,
    };
    let prompt = match prompt {
        Ok(p) => p,
        Err(msg) => {
            let _ = job.events.send(Event::Failed(400, msg));
            return;
        }
    };
    if job.events.send(Event::Started).is_err() {
        return;
    }
    let events = &job.events;
    match g.complete(&prompt, job.params, &job.limits, None, &mut |t| events.send(Event::Text(t.to_string())).is_ok()) {
        Ok(c) => {
            if let Ok(mut m) = state.metrics.lock() {
                m.prompt_tokens += c.prompt_tokens as u64;
                m.prefilled_tokens += c.prefilled as u64;
                m.prefill_seconds += c.prefill_seconds;
                m.generated_tokens += c.decoded.generated.len() as u64;
                m.decode_tokens += c.decoded.decode_tokens as u64;
                m.decode_seconds += c.decoded.decode_seconds;
                if c.decoded.stop_reason == StopReason::Cancelled {
                    m.cancelled += 1;
                    eprintln!("ktune serve: a generation cancelled after {} tokens (client gone)", c.decoded.generated.len());
                }
            }
            let _ = events.send(Event::Done(Box::new(c)));
        }
        Err(e) => {
            let _ = events.send(Event::Failed(500, e.to_string()));
        }
    }
}

/// One request, on its own thread.
fn handle(state: &State, mut request: Request) {
    let path = request.url().split('?').next().unwrap_or("").to_string();
    let method = request.method().clone();
    let result = match (&method, path.as_str()) {
        (Method::Get, "/health") => respond_json(state, request, &path, 200, &json!({"status": "ok"})),
        (Method::Get, "/metrics") => {
            let text = metrics(state);
            let header = Header::from_bytes("Content-Type", "text/plain; version=0.0.4").expect("a valid header");
            record(state, &path, 200);
            request.respond(Response::from_string(text).with_header(header))
        }
        (_, p) if p.starts_with("/v1/") && !authorized(state, &request) => respond_error(
            state,
            request,
            &path,
            401,
            "a missing or wrong API key: send `Authorization: Bearer KEY` (the server's --api-key)",
        ),
        (Method::Get, "/v1/models") => {
            let body = json!({
                "object": "list",
                "data": [{
                    "id": state.model_id,
                    "object": "model",
                    "created": 0,
                    "owned_by": "ktune",
                    "concurrency": 1,
                    "queue": state.queue,
                    "context_length": state.context,
                    "note": "requests are served one at a time by one engine, in order",
                }],
            });
            respond_json(state, request, &path, 200, &body)
        }
        (Method::Post, "/v1/chat/completions") => generate(state, &mut request, Kind::Chat).and_then(|r| r.send(state, request)),
        (Method::Post, "/v1/completions") => generate(state, &mut request, Kind::Text).and_then(|r| r.send(state, request)),
        (_, "/health" | "/metrics" | "/v1/models" | "/v1/chat/completions" | "/v1/completions") => {
            respond_error(state, request, &path, 405, &format!("{method} is not allowed on {path}"))
        }
        _ => respond_error(state, request, &path, 404, &format!("no such endpoint: {path}")),
    };
    if let Err(e) = result {
        eprintln!("ktune serve: {method} {path}: the response failed: {e}");
    }
}

/// What a generating request ends in.
enum Reply {
    Error(u16, String),
    Json(Value),
    Stream { kind: Kind, events: mpsc::Receiver<Event>, include_usage: bool },
}

impl Reply {
    fn send(self, state: &State, request: Request) -> std::io::Result<()> {
        match self {
            Reply::Error(status, msg) => respond_error(state, request, "", status, &msg),
            Reply::Json(v) => respond_json(state, request, "", 200, &v),
            Reply::Stream { kind, events, include_usage } => stream(state, request, kind, events, include_usage),
        }
    }
}

/// Reads and checks a generating request and hands it to the worker. The
/// endpoint's metrics are recorded here for errors and by the sender otherwise.
fn generate(state: &State, request: &mut Request, kind: Kind) -> std::io::Result<Reply> {
    let endpoint = kind.path();
    let fail = |status: u16, msg: String| {
        record(state, endpoint, status);
        Ok(Reply::Error(status, msg))
    };
    if request.body_length().is_some_and(|n| n > state.max_body) {
        return fail(
            413,
            format!(
                "the request body is {} bytes; the server takes at most {} (--max-body)",
                request.body_length().unwrap_or(0),
                state.max_body
            ),
        );
    }
    let mut body = Vec::new();
    request.as_reader().take(state.max_body as u64 + 1).read_to_end(&mut body)?;
    if body.len() > state.max_body {
        return fail(413, format!("the request body is over {} bytes (--max-body)", state.max_body));
    }
    let b: Body = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return fail(400, format!("malformed JSON body: {e}")),
    };
    let input = match (kind, b.messages, b.prompt) {
        (Kind::Chat, Some(m), _) if !m.is_empty() => Input::Messages(
            m.into_iter()
                .map(|m| {
                    let text = match m.content {
                        None => String::new(),
                        Some(Content::Text(t)) => t,
                        Some(Content::Parts(p)) => p.into_iter().filter_map(|p| p.text).collect::<Vec<_>>().join(""),
                    };
                    (m.role, text)
                })
                .collect(),
        ),
        (Kind::Chat, _, _) => return fail(400, "`messages` is required: a non-empty list of {role, content}".into()),
        (Kind::Text, _, Some(Prompt::One(p))) => Input::Text(p),
        (Kind::Text, _, Some(Prompt::Many(mut p))) if p.len() == 1 => Input::Text(p.remove(0)),
        (Kind::Text, _, Some(Prompt::Many(_))) => return fail(400, "`prompt`: one string (a batch of prompts is not served)".into()),
        (Kind::Text, _, None) => return fail(400, "`prompt` is required".into()),
    };
    if b.n.is_some_and(|n| n != 1) {
        return fail(400, "`n`: only 1 is served".into());
    }
    let d = state.defaults;
    let params = SamplerParams {
        temperature: b.temperature.unwrap_or(d.temperature),
        top_k: b.top_k.unwrap_or(d.top_k),
        top_p: b.top_p.unwrap_or(d.top_p),
        min_p: b.min_p.unwrap_or(d.min_p),
        repeat_penalty: b.repeat_penalty.unwrap_or(d.repeat_penalty),
        repeat_last_n: d.repeat_last_n,
        seed: b.seed.unwrap_or(d.seed),
    };
    if let Err(e) = params.validate() {
        return fail(400, e.to_string());
    }
    let stop = match b.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(s)) => s,
    };
    let limits =
        Limits { max_tokens: b.max_completion_tokens.or(b.max_tokens).unwrap_or(state.max_tokens), stop, ignore_eos: state.ignore_eos };
    // Queue it, or 429.
    let (tx, rx) = mpsc::channel();
    {
        let Ok(mut pending) = state.pending.lock() else { return fail(500, "the server's queue failed".into()) };
        if *pending > state.queue {
            return fail(429, format!("the queue is full ({} waiting, --queue {}); retry later", *pending - 1, state.queue));
        }
        let sent = state.jobs.lock().ok().and_then(|j| j.as_ref().map(|j| j.send(Job { input, params, limits, events: tx }).is_ok()));
        if sent != Some(true) {
            return fail(503, "the server is shutting down".into());
        }
        *pending += 1;
    }
    // The prompt accepted, or why not.
    match rx.recv() {
        Ok(Event::Started) => {}
        Ok(Event::Failed(status, msg)) => return fail(status, msg),
        _ => return fail(500, "the worker stopped".into()),
    }
    if b.stream {
        let include_usage = b.stream_options.unwrap_or_default().include_usage;
        return Ok(Reply::Stream { kind, events: rx, include_usage });
    }
    let mut text = String::new();
    // A client waiting for the whole reply sends nothing a read could see, and
    // tiny_http keeps the socket: the kernel's TCP table says when it has gone.
    let peer = request.remote_addr().copied();
    let mut checked = std::time::Instant::now();
    loop {
        let e = match rx.recv_timeout(PEER_CHECK) {
            Ok(e) => e,
            Err(mpsc::RecvTimeoutError::Timeout) => Event::Started,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        if checked.elapsed() >= PEER_CHECK {
            checked = std::time::Instant::now();
            if peer.is_some_and(|p| peer_gone(state.port, p)) {
                // Dropping the events ends the worker's next send: it cancels.
                return Err(std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "the client closed the connection"));
            }
        }
        match e {
            Event::Text(t) => text.push_str(&t),
            Event::Done(c) => {
                let id = state.next_id.fetch_add(1, Ordering::Relaxed);
                let choice = match kind {
                    Kind::Chat => {
                        json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish(&c), "logprobs": null})
                    }
                    Kind::Text => json!({"index": 0, "text": text, "finish_reason": finish(&c), "logprobs": null}),
                };
                let body = json!({
                    "id": object_id(kind, id),
                    "object": if kind == Kind::Chat { "chat.completion" } else { "text_completion" },
                    "created": now(),
                    "model": state.model_id,
                    "choices": [choice],
                    "usage": usage(&c),
                });
                record(state, endpoint, 200);
                return Ok(Reply::Json(body));
            }
            Event::Failed(status, msg) => return fail(status, msg),
            Event::Started => {}
        }
    }
    fail(500, "the worker stopped".into())
}

/// How often a non-streamed generation looks whether its client is still there.
const PEER_CHECK: std::time::Duration = std::time::Duration::from_millis(200);

/// Whether the client at `peer` has closed its connection to our `port`: Linux's
/// table of TCP sockets (`/proc/net/tcp`, `/proc/net/tcp6`) lists our side in
/// CLOSE_WAIT (the client's FIN received) or later closing states. Only a listed
/// closing state counts, never a missing table or line: elsewhere than Linux a
/// non-streamed generation runs to its limit.
fn peer_gone(port: u16, peer: std::net::SocketAddr) -> bool {
    // CLOSE_WAIT, LAST_ACK, CLOSING (include/net/tcp_states.h)
    const CLOSED_BY_PEER: [&str; 3] = ["08", "09", "0B"];
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().filter_map(|t| std::fs::read_to_string(t).ok()).any(|table| {
        table.lines().skip(1).any(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            f.len() > 3
                && CLOSED_BY_PEER.contains(&f[3])
                && proc_addr(f[1]).is_some_and(|l| l.port() == port)
                && proc_addr(f[2]).is_some_and(|r| r.port() == peer.port() && r.ip().to_canonical() == peer.ip().to_canonical())
        })
    })
}

/// An address of `/proc/net/tcp{,6}`: the IP as the kernel's 32-bit words in
/// hex (each in host order, i.e. little-endian here), a colon, the port in hex.
fn proc_addr(s: &str) -> Option<std::net::SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let mut bytes = Vec::with_capacity(16);
    for w in 0..ip.len() / 8 {
        bytes.extend(u32::from_str_radix(ip.get(w * 8..w * 8 + 8)?, 16).ok()?.to_le_bytes());
    }
    let ip = match bytes.len() {
        4 => std::net::IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?),
        16 => std::net::IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?),
        _ => return None,
    };
    Some(std::net::SocketAddr::new(ip, port))
}

fn object_id(kind: Kind, id: u64) -> String {
    match kind {
        Kind::Chat => format!("chatcmpl-{id}"),
        Kind::Text => format!("cmpl-{id}"),
    }
}

fn finish(c: &Completion) -> &'static str {
    match c.decoded.stop_reason {
        StopReason::MaxTokens => "length",
        StopReason::Eos | StopReason::Stop | StopReason::Cancelled => "stop",
    }
}

fn usage(c: &Completion) -> Value {
    let n = c.decoded.generated.len();
    json!({"prompt_tokens": c.prompt_tokens, "completion_tokens": n, "total_tokens": c.prompt_tokens + n})
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Server-sent events: a chunk a text piece, the last with the finish reason
/// (and the usage when asked), then `data: [DONE]`. HTTP chunked framing over
/// the connection's own writer, flushed each event, so pieces go out as they come
/// and a client gone fails the next write (its generation is then cancelled).
fn stream(state: &State, request: Request, kind: Kind, events: mpsc::Receiver<Event>, include_usage: bool) -> std::io::Result<()> {
    record(state, kind.path(), 200);
    let id = object_id(kind, state.next_id.fetch_add(1, Ordering::Relaxed));
    let created = now();
    let object = if kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" };
    let chunk = |text: Option<&str>, finish: Option<&str>, role: bool| {
        let choice = match kind {
            Kind::Chat => {
                let mut delta = serde_json::Map::new();
                if role {
                    delta.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = text {
                    delta.insert("content".into(), json!(t));
                }
                json!({"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null})
            }
            Kind::Text => json!({"index": 0, "text": text.unwrap_or(""), "finish_reason": finish, "logprobs": null}),
        };
        json!({"id": id, "object": object, "created": created, "model": state.model_id, "choices": [choice]})
    };
    let mut w = request.into_writer();
    w.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")?;
    let mut send = |v: &Value| -> std::io::Result<()> {
        let data = format!("data: {v}\n\n");
        write!(w, "{:x}\r\n{data}\r\n", data.len())?;
        w.flush()
    };
    if kind == Kind::Chat {
        send(&chunk(Some(""), None, true))?;
    }
    for e in events {
        match e {
            Event::Text(t) => send(&chunk(Some(&t), None, false))?,
            Event::Done(c) => {
                send(&chunk(None, Some(finish(&c)), false))?;
                if include_usage {
                    send(
                        &json!({"id": id, "object": object, "created": created, "model": state.model_id, "choices": [], "usage": usage(&c)}),
                    )?;
                }
                break;
            }
            Event::Failed(_, msg) => {
                send(&json!({"error": {"message": msg, "type": "server_error", "param": null, "code": null}}))?;
                break;
            }
            Event::Started => {}
        }
    }
    let done = "data: [DONE]\n\n";
    write!(w, "{:x}\r\n{done}\r\n0\r\n\r\n", done.len())?;
    w.flush()
}

fn authorized(state: &State, request: &Request) -> bool {
    let Some(key) = &state.api_key else { return true };
    request
        .headers()
        .iter()
        .any(|h| h.field.equiv("Authorization") && h.value.as_str().strip_prefix("Bearer ").is_some_and(|v| v.trim() == key.as_str()))
}

fn record(state: &State, endpoint: &str, status: u16) {
    if endpoint.is_empty() {
        return;
    }
    if let Ok(mut m) = state.metrics.lock() {
        *m.requests.entry((endpoint.to_string(), status)).or_insert(0) += 1;
    }
}

fn respond_json(state: &State, request: Request, endpoint: &str, status: u16, body: &Value) -> std::io::Result<()> {
    record(state, endpoint, status);
    let header = Header::from_bytes("Content-Type", "application/json").expect("a valid header");
    request.respond(Response::from_string(body.to_string()).with_status_code(status).with_header(header))
}

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
fn respond_error(state: &State, request: Request, endpoint: &str, status: u16, msg: &str) -> std::io::Result<()> {
    let (kind, code) = match status {
        401 => ("invalid_request_error", "invalid_api_key"),
        404 => ("invalid_request_error", "not_found"),
        413 => ("invalid_request_error", "request_too_large"),
        429 => ("rate_limit_error", "queue_full"),
        503 => ("server_error", "shutting_down"),
        500.. => ("server_error", "internal_error"),
        _ => ("invalid_request_error", "invalid_request"),
    };
    respond_json(state, request, endpoint, status, &json!({"error": {"message": msg, "type": kind, "param": null, "code": code}}))
}

/// The Prometheus text of the counters.
fn metrics(state: &State) -> String {
    let Ok(m) = state.metrics.lock() else { return String::new() };
    let pending = state.pending.lock().map_or(0, |p| *p);
    let mut s = String::new();
    s.push_str("# HELP ktune_requests_total Requests answered, by endpoint and HTTP status.\n# TYPE ktune_requests_total counter\n");
    for ((endpoint, status), n) in &m.requests {
        s.push_str(&format!("ktune_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}\n"));
    }
    let rate = |n: u64, secs: f64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    let rows: [(&str, &str, &str, String); 8] = [
        ("ktune_prompt_tokens_total", "counter", "Prompt tokens of the requests served.", m.prompt_tokens.to_string()),
        (
            "ktune_prefilled_tokens_total",
            "counter",
            "Prompt tokens prefilled (the rest were in the KV cache).",
            m.prefilled_tokens.to_string(),
        ),
        ("ktune_generated_tokens_total", "counter", "Tokens generated.", m.generated_tokens.to_string()),
        (
            "ktune_prefill_tokens_per_second",
            "gauge",
            "Prefill throughput over the requests served.",
            format!("{:.3}", rate(m.prefilled_tokens, m.prefill_seconds)),
        ),
        (
            "ktune_decode_tokens_per_second",
            "gauge",
            "Decode throughput over the requests served.",
            format!("{:.3}", rate(m.decode_tokens, m.decode_seconds)),
        ),
        ("ktune_cancelled_total", "counter", "Generations cancelled (client gone).", m.cancelled.to_string()),
        ("ktune_queue_length", "gauge", "Requests waiting behind the one being generated.", pending.saturating_sub(1).to_string()),
        ("ktune_in_flight", "gauge", "Requests being generated (0 or 1).", pending.min(1).to_string()),
    ];
    for (name, kind, help, value) in rows {
        s.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_tcp_addresses_parse_as_the_kernel_writes_them() {
        // 127.0.0.1:8080 and [::1]:443 as /proc/net/tcp{,6} list them on x86_64
        assert_eq!(proc_addr("0100007F:1F90"), Some("127.0.0.1:8080".parse().unwrap()));
        assert_eq!(proc_addr("00000000000000000000000001000000:01BB"), Some("[::1]:443".parse().unwrap()));
        assert_eq!(proc_addr("0100007F"), None);
        assert_eq!(proc_addr("0100007G:1F90"), None);
    }
}
