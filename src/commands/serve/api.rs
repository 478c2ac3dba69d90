//! The endpoints of `serve`: the OpenAI API's requests read and checked, queued
//! for the engine's worker, and answered: JSON, server-sent events, or the
//! OpenAI error object; the counters of `/metrics`. Every response body is one
//! [`Reply`]: a whole body, an event stream, or a non-streamed completion that
//! probes its client while it waits (the module doc of `serve` says why).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, ready};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::header::{AUTHORIZATION, CACHE_CONTROL, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::{Event, Job, State, error_json};
use crate::generate::{Completion, Limits, Prompter};
use crate::kernels::sample::SamplerParams;
use crate::report::StopReason;

/// How long a non-streamed completion may take before its `200` goes out and
/// its body starts probing the client (a space each time this passes again).
pub(super) const PROBE: Duration = Duration::from_millis(500);

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

/// The most choices (`n`) one request may ask for (OpenAI's own limit).
const MAX_CHOICES: usize = 128;

/// The endpoints, as /metrics names them (any other path is `other`).
const ENDPOINTS: [&str; 5] = ["/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions"];

/// One request: routed, answered.
pub(super) async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<Reply> {
    let path = req.uri().path().to_string();
    let endpoint = ENDPOINTS.into_iter().find(|e| *e == path).unwrap_or("other");
    let method = req.method().clone();
    match (&method, endpoint) {
        (&Method::GET, "/health") => json_response(&state, endpoint, 200, &json!({"status": "ok"})),
        (&Method::GET, "/metrics") => {
            record(&state, endpoint, 200);
            with_type(Response::new(Reply::full(metrics(&state))), "text/plain; version=0.0.4")
        }
        _ if path.starts_with("/v1/") && !authorized(&state, &req) => {
            error_response(&state, endpoint, 401, "a missing or wrong API key: send `Authorization: Bearer KEY` (the server's --api-key)")
        }
        (&Method::GET, "/v1/models") => {
            let body = json!({
                "object": "list",
                "data": [{
                    "id": state.model_id,
                    "object": "model",
                    "created": 0,
                    "owned_by": "ktune",
                    "concurrency": state.parallel,
                    "queue": state.queue,
                    "context_length": state.context,
                    "note": if state.parallel > 1 {
                        "up to `concurrency` sequences are decoded together, a batch a step; more requests wait in the queue"
                    } else {
                        "requests are served one at a time by one engine, in order"
                    },
                }],
            });
            json_response(&state, endpoint, 200, &body)
        }
        (&Method::POST, "/v1/chat/completions") => generate(&state, req, Kind::Chat).await,
        (&Method::POST, "/v1/completions") => generate(&state, req, Kind::Text).await,
        (_, "other") => error_response(&state, endpoint, 404, &format!("no such endpoint: {}", crate::text::shorten(&path, 200))),
        _ => error_response(&state, endpoint, 405, &format!("{method} is not allowed on {path}")),
    }
}

/// Reads a generating request's body within `--max-body` and `--body-timeout`.
async fn read_body(state: &State, req: Request<Incoming>) -> Result<Bytes, (u16, String)> {
    let declared = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > state.max_body as u64) {
        return Err((413, format!("the request body is {n} bytes; the server takes at most {} (--max-body)", state.max_body)));
    }
    let body = Limited::new(req.into_body(), state.max_body);
    match tokio::time::timeout(state.body_timeout, body.collect()).await {
        Ok(Ok(b)) => Ok(b.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            Err((413, format!("the request body is over {} bytes (--max-body)", state.max_body)))
        }
        Ok(Err(e)) => {
            let mut msg = format!("the request body could not be read: {e}");
            let mut source = e.source();
            while let Some(s) = source {
                msg.push_str(&format!(": {s}"));
                source = s.source();
            }
            Err((400, msg))
        }
        Err(_) => {
            Err((408, format!("the request body did not arrive within {}s (the server's --body-timeout)", state.body_timeout.as_secs())))
        }
    }
}

/// Stop strings a request may give, and the bytes of each: the engine's
/// thread looks for every one in the new text at each token, and 800 KB of
/// them (50,000 strings, or one of 400 KB) cost it about 10 ms a token of
/// their request, which every sequence of its passes waited for.
const MAX_STOPS: usize = 16;
const MAX_STOP_BYTES: usize = 512;

/// A request's places in the queue (`State::pending`) not yet handed to the
/// worker with a job: given back when it is dropped (the request refused,
/// or its client gone while its prompt was tokenized).
struct Places<'a> {
    state: &'a State,
    n: usize,
}

impl Drop for Places<'_> {
    fn drop(&mut self) {
        if self.n > 0
            && let Ok(mut p) = self.state.pending.lock()
        {
            *p = p.saturating_sub(self.n);
        }
    }
}

/// What a request asks to generate from.
enum Input {
    Messages(Vec<(String, String)>),
    Text(String),
}

/// The prompt's tokens, or the status and message that refuse it. Tokenized
/// on a blocking thread of the runtime, a few at once (`State::tokenizing`):
/// not on the event loop (every connection's), nor on the engine's thread,
/// where a megabyte of prompt held up every sequence it was decoding for as
/// long as its tokenizing took (0.75 s on SmolLM2's tokenizer, docs/serve.md).
/// The permit goes with the blocking task: a client that leaves while its
/// prompt is tokenized frees its place only when the tokenizing ends.
async fn tokenize(state: &Arc<State>, input: Input) -> Result<Vec<u32>, (u16, String)> {
    let Ok(permit) = state.tokenizing.clone().acquire_owned().await else { return Err((503, "the server is shutting down".into())) };
    let st = state.clone();
    let task = move || {
        let _permit = permit;
        prompt_tokens(&st.prompter, &input, st.context)
    };
    match tokio::task::spawn_blocking(task).await {
        Ok(r) => r.map_err(|msg| (400, msg)),
        Err(e) => Err((500, format!("tokenizing the prompt failed: {e}"))),
    }
}

/// `input` as tokens for a context of `context` positions, or the message
/// that refuses it.
fn prompt_tokens(p: &Prompter, input: &Input, context: usize) -> Result<Vec<u32>, String> {
    let prompt = match input {
        Input::Messages(m) => {
            let turns: Vec<(&str, &str)> = m.iter().map(|(r, c)| (r.as_str(), c.as_str())).collect();
            p.render(&turns).map_err(|e| e.to_string())
        }
        Input::Text(t) => p.encode(t, false).map_err(|e| e.to_string()),
    };
    match prompt {
        Ok(p) if p.is_empty() => Err("the prompt encodes to no tokens".to_string()),
        Ok(p) if p.len() >= context => {
            Err(format!("the prompt is {} tokens and the context holds {context}: shorten it (the server's --context)", p.len()))
        }
        other => other,
    }
}

/// Reads and checks a generating request, hands it to the worker and answers
/// once generation starts (or why it does not).
async fn generate(state: &Arc<State>, req: Request<Incoming>, kind: Kind) -> Response<Reply> {
    let endpoint = kind.path();
    let fail = |status: u16, msg: String| error_response(state, endpoint, status, &msg);
    let body = match read_body(state, req).await {
        Ok(b) => b,
        Err((status, msg)) => {
            // What is left of the body is not read: the connection ends here.
            let mut r = fail(status, msg);
            r.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
            return r;
        }
    };
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
    // `n` choices: as many sequences of the one prompt (the ones after the first
    // share its prefill: the worker copies a prefilled prefix), choice i sampled
    // with the seed plus i. All queued at once, or none.
    let n = b.n.unwrap_or(1) as usize;
    let most = MAX_CHOICES.min(state.queue + state.parallel);
    if !(1..=most).contains(&n) {
        return fail(400, format!("`n` is {n}: from 1 to {most} choices are served (at most {MAX_CHOICES}, and --parallel + --queue)"));
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
    if stop.len() > MAX_STOPS {
        return fail(400, format!("`stop`: {} strings; at most {MAX_STOPS} are served", stop.len()));
    }
    if let Some(s) = stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return fail(400, format!("`stop`: a string of {} bytes; each may be at most {MAX_STOP_BYTES}", s.len()));
    }
    let limits =
        Limits { max_tokens: b.max_completion_tokens.or(b.max_tokens).unwrap_or(state.max_tokens), stop, ignore_eos: state.ignore_eos };
    // Its places in the queue, or 429: taken before the prompt is tokenized,
    // so that --queue bounds the requests waiting to be tokenized too (a
    // client of large prompts gets 429 where it would hold up everyone
    // else's tokenizing), and given back if it is not queued in the end.
    let mut places = {
        let Ok(mut pending) = state.pending.lock() else { return fail(500, "the server's queue failed".into()) };
        if *pending + n > state.queue + state.parallel {
            let waiting = (*pending + n).saturating_sub(state.parallel);
            return fail(429, format!("the queue is full ({waiting} waiting, --queue {}); retry later", state.queue));
        }
        *pending += n;
        Places { state, n }
    };
    let prompt = match tokenize(state, input).await {
        Ok(p) => p,
        Err((status, msg)) => return fail(status, msg),
    };
    let mut receivers = Vec::with_capacity(n);
    {
        let Ok(jobs) = state.jobs.lock() else { return fail(500, "the server's queue failed".into()) };
        let Some(jobs) = jobs.as_ref() else { return fail(503, "the server is shutting down".into()) };
        for i in 0..n {
            let (tx, rx) = unbounded_channel();
            let params = SamplerParams { seed: params.seed.wrapping_add(i as u64), ..params };
            // Jobs sent before a failed send are dropped with their receivers: cancelled.
            if jobs.send(Job { prompt: prompt.clone(), params, limits: limits.clone(), events: tx }).is_err() {
                return fail(503, "the server is shutting down".into());
            }
            // The place is the job's now: the worker gives it back when it ends.
            places.n -= 1;
            receivers.push(rx);
        }
    }
    let mut events = Events::new(receivers);
    // The prompt accepted, or why not: the first choice's answer (the others,
    // of the same prompt, may start only after it, one sequence at a time; a
    // later failure comes as their event).
    match events.rx[0].recv().await {
        Some(Event::Started) => {}
        Some(Event::Failed(status, msg)) => return fail(status, msg),
        _ => return fail(500, "the worker stopped".into()),
    }
    let id = object_id(kind, state.next_id.fetch_add(1, Ordering::Relaxed));
    if b.stream {
        record(state, endpoint, 200);
        let include_usage = b.stream_options.unwrap_or_default().include_usage;
        let mut sse = Sse {
            state: state.clone(),
            events,
            kind,
            id,
            created: now(),
            include_usage,
            queue: VecDeque::new(),
            done: Vec::new(),
            ended: false,
        };
        if kind == Kind::Chat {
            for i in 0..n {
                sse.push(&sse.chunk(i, Some(""), None, true));
            }
        }
        let mut r = with_type(Response::new(Reply::Sse(Box::new(sse))), "text/event-stream");
        r.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return r;
    }
    let mut whole =
        Whole { state: state.clone(), texts: vec![String::new(); n], done: vec![None; n], events, kind, id, probe: None, ended: false };
    match tokio::time::timeout(PROBE, std::future::poll_fn(|cx| whole.poll_end(cx))).await {
        Ok((status, body)) => json_reply(status, &body),
        // Not ready: the 200 goes out now, and the body probes the client.
        Err(_) => with_type(Response::new(Reply::Whole(Box::new(whole))), "application/json"),
    }
}

/// A response body.
pub(super) enum Reply {
    /// Bytes known at once (taken when sent).
    Full(Option<Bytes>),
    Sse(Box<Sse>),
    Whole(Box<Whole>),
}

impl Reply {
    fn full(text: String) -> Reply {
        Reply::Full(Some(Bytes::from(text)))
    }
}

impl HttpBody for Reply {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let next = match self.get_mut() {
            Reply::Full(b) => Poll::Ready(b.take()),
            Reply::Sse(s) => s.poll_next(cx),
            Reply::Whole(w) => w.poll_next(cx),
        };
        next.map(|b| b.map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Reply::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Reply::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            _ => SizeHint::default(),
        }
    }
}

/// The events of a request's choices, one channel each (dropping this drops
/// them all: the worker cancels every choice at its next token).
pub(super) struct Events {
    rx: Vec<UnboundedReceiver<Event>>,
    /// Choices whose channel has ended.
    closed: Vec<bool>,
    /// The channel polled first next time (each in turn: no choice starves).
    next: usize,
}

impl Events {
    fn new(rx: Vec<UnboundedReceiver<Event>>) -> Events {
        Events { closed: vec![false; rx.len()], rx, next: 0 }
    }

    fn len(&self) -> usize {
        self.rx.len()
    }

    /// The next event of any choice with the choice's index; None once every
    /// channel has ended.
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<(usize, Event)>> {
        let n = self.rx.len();
        for k in 0..n {
            let i = (self.next + k) % n;
            if self.closed[i] {
                continue;
            }
            match self.rx[i].poll_recv(cx) {
                Poll::Ready(Some(e)) => {
                    self.next = (i + 1) % n;
                    return Poll::Ready(Some((i, e)));
                }
                Poll::Ready(None) => self.closed[i] = true,
                Poll::Pending => {}
            }
        }
        if self.closed.iter().all(|&c| c) { Poll::Ready(None) } else { Poll::Pending }
    }
}

/// Server-sent events: a chunk a text piece, the last with the finish reason
/// (and the usage when asked), then `data: [DONE]`. hyper writes each event as
/// it comes (chunked framing); a client gone fails a write, hyper drops this
/// body and with it the events channel, and the worker cancels.
pub(super) struct Sse {
    state: Arc<State>,
    events: Events,
    kind: Kind,
    id: String,
    created: u64,
    include_usage: bool,
    /// Events ready to go.
    queue: VecDeque<Bytes>,
    /// The choices' completions, as they end.
    done: Vec<Completion>,
    ended: bool,
}

impl Sse {
    fn object(&self) -> &'static str {
        if self.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" }
    }

    fn chunk(&self, index: usize, text: Option<&str>, finish: Option<&str>, role: bool) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                let mut delta = serde_json::Map::new();
                if role {
                    delta.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = text {
                    delta.insert("content".into(), json!(t));
                }
                json!({"index": index, "delta": delta, "finish_reason": finish, "logprobs": null})
            }
            Kind::Text => json!({"index": index, "text": text.unwrap_or(""), "finish_reason": finish, "logprobs": null}),
        };
        json!({"id": self.id, "object": self.object(), "created": self.created, "model": self.state.model_id, "choices": [choice]})
    }

    fn push(&mut self, v: &Value) {
        self.queue.push_back(Bytes::from(format!("data: {v}\n\n")));
    }

    fn end(&mut self) {
        self.queue.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
        self.ended = true;
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        loop {
            if let Some(b) = self.queue.pop_front() {
                return Poll::Ready(Some(b));
            }
            if self.ended {
                return Poll::Ready(None);
            }
            match ready!(self.events.poll_recv(cx)) {
                Some((i, Event::Text(t))) => self.push(&self.chunk(i, Some(&t), None, false)),
                Some((i, Event::Done(c))) => {
                    self.push(&self.chunk(i, None, Some(finish(&c)), false));
                    self.done.push(*c);
                    if self.done.len() < self.events.len() {
                        continue;
                    }
                    if self.include_usage {
                        let v = json!({"id": self.id, "object": self.object(), "created": self.created, "model": self.state.model_id, "choices": [], "usage": usage(&self.done)});
                        self.push(&v);
                    }
                    self.end();
                }
                Some((_, Event::Failed(_, msg))) => {
                    self.push(&json!({"error": {"message": msg, "type": "server_error", "param": null, "code": null}}));
                    self.end();
                }
                Some((_, Event::Started)) => {}
                None => self.end(),
            }
        }
    }
}

/// A non-streamed completion: the text gathered until the worker is done, then
/// one JSON object. Sent as a body only when not done within [`PROBE`]: then a
/// space (leading JSON whitespace) goes out every [`PROBE`] until the object,
/// and the write that fails once the client has gone drops this body and
/// cancels the generation.
pub(super) struct Whole {
    state: Arc<State>,
    events: Events,
    kind: Kind,
    id: String,
    /// Each choice's text so far.
    texts: Vec<String>,
    /// Each choice's completion, once it ended.
    done: Vec<Option<Completion>>,
    /// The probes' clock, from the first poll as a body.
    probe: Option<tokio::time::Interval>,
    ended: bool,
}

impl Whole {
    /// The status and JSON the completion ends in, once the worker is done.
    fn poll_end(&mut self, cx: &mut Context<'_>) -> Poll<(StatusCode, Value)> {
        let endpoint = self.kind.path();
        loop {
            let (status, body) = match ready!(self.events.poll_recv(cx)) {
                Some((i, Event::Text(t))) => {
                    self.texts[i].push_str(&t);
                    continue;
                }
                Some((_, Event::Started)) => continue,
                Some((i, Event::Done(c))) => {
                    self.done[i] = Some(*c);
                    if self.done.iter().any(Option::is_none) {
                        continue;
                    }
                    let done: Vec<Completion> = std::mem::take(&mut self.done).into_iter().flatten().collect();
                    let choices: Vec<Value> = done
                        .iter()
                        .zip(std::mem::take(&mut self.texts))
                        .enumerate()
                        .map(|(i, (c, text))| match self.kind {
                            Kind::Chat => json!({"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": finish(c), "logprobs": null}),
                            Kind::Text => json!({"index": i, "text": text, "finish_reason": finish(c), "logprobs": null}),
                        })
                        .collect();
                    let body = json!({
                        "id": self.id,
                        "object": if self.kind == Kind::Chat { "chat.completion" } else { "text_completion" },
                        "created": now(),
                        "model": self.state.model_id,
                        "choices": choices,
                        "usage": usage(&done),
                    });
                    (200, body)
                }
                Some((_, Event::Failed(status, msg))) => (status, error_json(status, None, &msg)),
                None => (500, error_json(500, None, "the worker stopped")),
            };
            record(&self.state, endpoint, status);
            return Poll::Ready((StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), body));
        }
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if let Poll::Ready((_, body)) = self.poll_end(cx) {
            self.ended = true;
            return Poll::Ready(Some(Bytes::from(body.to_string())));
        }
        let probe = self.probe.get_or_insert_with(|| {
            let mut i = tokio::time::interval_at(tokio::time::Instant::now() + PROBE, PROBE);
            i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            i
        });
        ready!(probe.poll_tick(cx));
        Poll::Ready(Some(Bytes::from_static(b" ")))
    }
}

fn with_type(mut r: Response<Reply>, content_type: &'static str) -> Response<Reply> {
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn json_reply(status: StatusCode, body: &Value) -> Response<Reply> {
    let mut r = Response::new(Reply::full(body.to_string()));
    *r.status_mut() = status;
    with_type(r, "application/json")
}

/// A JSON response, counted for /metrics.
fn json_response(state: &State, endpoint: &'static str, status: u16, body: &Value) -> Response<Reply> {
    record(state, endpoint, status);
    json_reply(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), body)
}

fn error_response(state: &State, endpoint: &'static str, status: u16, msg: &str) -> Response<Reply> {
    json_response(state, endpoint, status, &error_json(status, None, msg))
}

fn authorized(state: &State, req: &Request<Incoming>) -> bool {
    let Some(key) = &state.api_key else { return true };
    req.headers()
        .get_all(AUTHORIZATION)
        .iter()
        .any(|v| v.to_str().ok().and_then(|v| v.strip_prefix("Bearer ")).is_some_and(|v| v.trim() == key.as_str()))
}

fn record(state: &State, endpoint: &'static str, status: u16) {
    if let Ok(mut m) = state.metrics.lock() {
        *m.requests.entry((endpoint, status)).or_insert(0) += 1;
    }
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

/// Token counts of a request's choices: their one prompt counted once.
fn usage(choices: &[Completion]) -> Value {
    let prompt = choices.first().map_or(0, |c| c.prompt_tokens);
    let n: usize = choices.iter().map(|c| c.decoded.generated.len()).sum();
    json!({"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n})
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The Prometheus text of the counters.
fn metrics(state: &State) -> String {
    let Ok(m) = state.metrics.lock() else { return String::new() };
    let pending = state.pending.lock().map_or(0, |p| *p);
    // Being generated: the parallel worker's running sequences, else the one job.
    let processing = if state.parallel > 1 { m.processing.min(pending) } else { pending.min(1) };
    let mut s = String::new();
    s.push_str("# HELP ktune_requests_total Requests answered, by endpoint and HTTP status.\n# TYPE ktune_requests_total counter\n");
    for ((endpoint, status), n) in &m.requests {
        s.push_str(&format!("ktune_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}\n"));
    }
    let rate = |n: u64, secs: f64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    let net = &state.net;
    let rows: [(&str, &str, &str, String); 18] = [
        ("ktune_prompt_tokens_total", "counter", "Prompt tokens of the requests served.", m.prompt_tokens.to_string()),
        (
            "ktune_prefilled_tokens_total",
            "counter",
            "Prompt tokens prefilled (the rest were in the KV cache).",
            m.prefilled_tokens.to_string(),
        ),
        (
            "ktune_prompt_chunks_batched_total",
            "counter",
            "Prompt chunks prefilled in the decode batch's pass, beside other sequences' decode tokens (--parallel, a paged KV cache).",
            m.batched_chunks.to_string(),
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
        (
            "ktune_queue_length",
            "gauge",
            "Requests waiting for a sequence slot (requests deferred).",
            pending.saturating_sub(state.parallel).to_string(),
        ),
        ("ktune_in_flight", "gauge", "Requests being generated (at most --parallel).", pending.min(state.parallel).to_string()),
        (
            "ktune_prefix_cache_hit_tokens_total",
            "counter",
            "Prompt tokens a sequence's KV cache held already (not prefilled again).",
            (m.prompt_tokens - m.prefilled_tokens.min(m.prompt_tokens)).to_string(),
        ),
        (
            "ktune_kv_cache_tokens",
            "gauge",
            "KV-cache positions the sequences hold in memory, a block several share counted once (llama-server's kv_cache_tokens).",
            m.kv_positions.to_string(),
        ),
        (
            "ktune_kv_cache_usage_ratio",
            "gauge",
            "KV-cache positions held over --kv-tokens (0 without a limit).",
            format!("{:.4}", if state.kv_tokens > 0 { m.kv_positions as f64 / state.kv_tokens as f64 } else { 0.0 }),
        ),
        (
            "ktune_kv_cache_blocks_used",
            "gauge",
            "Blocks of the paged KV cache some sequence holds (a prefix's blocks shared by several sequences count once).",
            m.kv_blocks.0.to_string(),
        ),
        (
            "ktune_kv_cache_blocks_total",
            "gauge",
            "Blocks of the paged KV cache (64 positions each; 0: not paged).",
            m.kv_blocks.1.to_string(),
        ),
        (
            "ktune_requests_deferred",
            "gauge",
            "Requests waiting for KV memory or a sequence slot (llama-server's requests_deferred).",
            pending.saturating_sub(processing).to_string(),
        ),
        ("ktune_connections_open", "gauge", "Connections being served.", net.open.load(Ordering::Relaxed).to_string()),
        (
            "ktune_connections_refused_total",
            "counter",
            "Connections refused past --max-connections (503).",
            net.refused.load(Ordering::Relaxed).to_string(),
        ),
        (
            "ktune_accept_errors_total",
            "counter",
            "Failed accepts (out of descriptors, aborted connections).",
            net.accept_errors.load(Ordering::Relaxed).to_string(),
        ),
    ];
    for (name, kind, help, value) in rows {
        s.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"));
    }
    s.push_str("# HELP ktune_batch_steps_total Steps by the sequences they advanced (--parallel above 1; the last: that many or more).\n# TYPE ktune_batch_steps_total counter\n");
    for (n, steps) in m.batch_steps.iter().enumerate().skip(1) {
        s.push_str(&format!("ktune_batch_steps_total{{sequences=\"{n}\"}} {steps}\n"));
    }
    s
}
