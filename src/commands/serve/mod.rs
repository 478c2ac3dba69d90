//! `ktune serve`: the OpenAI API over HTTP for one model on one device, through
//! the shared [`Generator`] (source, profile and engine chosen as `run` chooses
//! them). `POST /v1/chat/completions` and `/v1/completions` (streamed by
//! server-sent events ending in `data: [DONE]`, or not), `GET /v1/models`,
//! `/health` and `/metrics` (Prometheus text); errors use OpenAI's JSON shape.
//!
//! Three parts: `net.rs`, the HTTP side made for the open network (hyper's
//! HTTP/1 on a current-thread tokio runtime on this thread: one task a
//! connection, the connection limit, header limits, timeouts, accept errors
//! survived, half-closed clients answered, the drain at shutdown); `api.rs`, the
//! endpoints (bodies past `--max-body` get 413 and bodies slower than
//! `--body-timeout` 408, malformed JSON 400 with serde's message, a missing or
//! wrong `--api-key` bearer 401); `worker.rs`, the engine's own thread, which
//! serves the generation jobs one at a time, in order: at most `--queue` wait
//! behind the one being generated (429 past that). The request's `model` is not
//! checked (one model is served).
//!
//! A client that leaves cancels its generation at the next token: its events
//! channel closes when its response is dropped, and a response is dropped when
//! a write to the client fails. Streaming, every token is a write. A
//! non-streamed reply that is not ready within `api::PROBE` (0.5 s) is sent as
//! `200` with a chunked JSON body that starts with a space every `PROBE` (JSON
//! allows leading whitespace) until the object itself: those writes fail once
//! the client has gone. Reading cannot tell: a client that shut down only its
//! write side after its request (a half-close) is still there and is answered.
//! An error after those headers went out (the engine failing mid-generation) is
//! the body's error object under the `200`.
//!
//! SIGINT/SIGTERM: no new connections, the requests in flight (the one being
//! generated included) finish within `--drain-timeout`, those queued for the
//! engine get 503, then whatever is left is dropped and the process exits 0.
//! Being a server, this command writes its log lines to stderr itself.

mod api;
mod net;
mod worker;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cli::ServeArgs;
use crate::generate::{self, Generator};
use crate::kernels::sample::SamplerParams;
use crate::{Error, Result};
use net::NetCounters;
use worker::{Event, Job};

/// How long the process waits for the engine's thread after the drain (it stops
/// at its next token once its requests are gone).
const WORKER_GRACE: Duration = Duration::from_secs(5);

/// Counters for /metrics.
#[derive(Default)]
struct Metrics {
    requests: BTreeMap<(&'static str, u16), u64>,
    prompt_tokens: u64,
    prefilled_tokens: u64,
    generated_tokens: u64,
    prefill_seconds: f64,
    decode_tokens: u64,
    decode_seconds: f64,
    cancelled: u64,
    /// Steps of the parallel worker by how many sequences each advanced (the
    /// last entry: that many or more).
    batch_steps: Vec<u64>,
    /// Positions the slots' KV caches hold in memory.
    kv_positions: usize,
    /// The paged KV cache's blocks held (a block shared by several sequences
    /// once) and in all; (0, 0) without one.
    kv_blocks: (usize, usize),
    /// Sequences the parallel worker is generating.
    processing: usize,
    /// Prompt chunks prefilled in a decode batch's pass.
    batched_chunks: u64,
}

/// What the request handlers and the worker share.
struct State {
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    /// Requests sent to the worker and not finished (the one generating included).
    pending: Mutex<usize>,
    queue: usize,
    /// Sequences generated at once (`--parallel`).
    parallel: usize,
    /// KV positions all sequences together may hold (`--kv-tokens`; 0: no limit).
    kv_tokens: usize,
    /// Prompt tokens prefilled between two decode steps (`--step-tokens`).
    step_tokens: usize,
    metrics: Mutex<Metrics>,
    net: Arc<NetCounters>,
    shutdown: AtomicBool,
    next_id: AtomicU64,
    model_id: String,
    api_key: Option<String>,
    max_body: usize,
    body_timeout: Duration,
    max_tokens: usize,
    /// `--ignore-eos`: every request generates its `max_tokens`.
    ignore_eos: bool,
    defaults: SamplerParams,
    context: usize,
    /// The engine's tokenizer and chat template, for the requests' own threads.
    prompter: crate::generate::Prompter,
    /// Prompts tokenized at once: half the machine's cores (at least one), the
    /// other half the engine's whatever the requests send.
    tokenizing: Arc<tokio::sync::Semaphore>,
}

/// Serves until SIGINT or SIGTERM; `warn` shows the warnings of loading (the
/// application's `output::warn`).
pub fn run(selector: Option<&str>, args: &ServeArgs, warn: &dyn Fn(&str)) -> Result<()> {
    let defaults = args.generate.sampler();
    generate::check_sampling(&defaults)?;
    let secs = |flag: &str, s: u64| {
        if s == 0 { Err(Error::Usage(format!("{flag} 0: give at least 1 second"))) } else { Ok(Duration::from_secs(s)) }
    };
    let config = net::NetConfig {
        max_connections: match args.max_connections {
            Some(0) => return Err(Error::Usage("--max-connections 0: give at least 1".into())),
            Some(n) => n,
            None => net::default_max_connections(),
        },
        header_timeout: secs("--header-timeout", args.header_timeout)?,
        drain_timeout: secs("--drain-timeout", args.drain_timeout)?,
    };
    let body_timeout = secs("--body-timeout", args.body_timeout)?;
    let mut settings = args.generate.generator("serve")?;
    if args.parallel == Some(0) {
        return Err(Error::Usage("--parallel 0: give at least 1".into()));
    }
    settings.parallel = args.parallel;
    let mut g = Generator::open(selector, &settings)?;
    for w in &g.warnings {
        warn(w);
    }
    let parallel = match args.parallel {
        // The profile's: the rows its plan was given (1 without batch sizes).
        // (A GPU engine batches only with its paged KV cache, made when asked.)
        None if g.engine.is_gpu() && g.engine.kv_blocks().is_none() => 1,
        None => g.batch_rows().max(1),
        Some(n) if n > 1 && g.engine.is_gpu() && g.engine.kv_blocks().is_none() => {
            return Err(Error::Usage(format!(
                "--parallel {n}: a vision model's sequences keep KV caches of their own, which run on the CPU only; serve it on --device cpu, or with --parallel 1"
            )));
        }
        Some(n) => n,
    };
    if parallel > 1 && g.engine.kv_blocks().is_some() {
        // The paged KV cache holds what --kv-tokens allows (and each sequence's
        // last, partly filled block), else every sequence's whole context; the
        // generator's own sequence too.
        let positions = if args.kv_tokens > 0 { args.kv_tokens } else { (parallel + 1) * g.context };
        // (Its notes on the attention choices were the generator's warnings.)
        let _ = g.engine.enable_paged(positions, parallel + 1)?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Usage(format!("cannot start the server's event loop: {e}")))?;
    let listener = {
        let _in_runtime = runtime.enter();
        net::listen(&args.host, args.port)
            .map_err(|e| Error::Usage(format!("cannot listen on {}:{}: {e}; give another --port or --host", args.host, args.port)))?
    };
    let addr = listener.local_addr().map_or_else(|_| format!("{}:{}", args.host, args.port), |a| a.to_string());
    let (tx, rx) = mpsc::channel::<Job>();
    let state = Arc::new(State {
        jobs: Mutex::new(Some(tx)),
        pending: Mutex::new(0),
        queue: args.queue,
        parallel,
        kv_tokens: args.kv_tokens,
        step_tokens: args.step_tokens.max(2),
        metrics: Mutex::new(Metrics { batch_steps: vec![0; parallel + 1], ..Metrics::default() }),
        net: Arc::new(NetCounters::default()),
        shutdown: AtomicBool::new(false),
        next_id: AtomicU64::new(1),
        model_id: args.model_id.clone().unwrap_or_else(|| g.model.clone()),
        api_key: args.api_key.clone(),
        max_body: args.max_body,
        body_timeout,
        max_tokens: args.max_tokens,
        ignore_eos: args.generate.sampling.ignore_eos,
        defaults,
        context: g.context,
        prompter: g.prompter.clone(),
        tokenizing: Arc::new(tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(1, |n| n.get() / 2).max(1))),
    });
    let signals = {
        let _in_runtime = runtime.enter();
        Signals::new().map_err(|e| Error::Usage(format!("cannot catch SIGINT/SIGTERM: {e}")))?
    };
    eprintln!(
        "ktune serve: {} on {}, {}, context {}, {} at once, at most {} connections; listening on http://{addr}",
        state.model_id,
        g.device,
        g.profile.as_deref().map_or("the runtime's defaults".to_string(), |p| format!("profile {p}")),
        g.context,
        parallel,
        config.max_connections,
    );
    let worker = {
        let state = state.clone();
        std::thread::Builder::new()
            .name("ktune-engine".into())
            .spawn(move || worker::work(g, rx, &state))
            .map_err(|e| Error::Usage(format!("cannot start the engine's thread: {e}")))?
    };
    let handler = {
        let state = state.clone();
        move |req| api::handle(state.clone(), req)
    };
    let stopped = {
        let state = state.clone();
        async move {
            signals.recv().await;
            // From now on the worker answers the jobs still queued with 503.
            state.shutdown.store(true, Ordering::SeqCst);
        }
    };
    runtime.block_on(net::serve(listener, &config, state.net.clone(), handler, stopped));
    // Dropping the runtime drops the connections the drain left: their
    // generations see their channels closed and stop.
    drop(runtime);
    // No more jobs: the worker ends once its queue is answered.
    if let Ok(mut jobs) = state.jobs.lock() {
        jobs.take();
    }
    let waited = Instant::now();
    while !worker.is_finished() && waited.elapsed() < WORKER_GRACE {
        std::thread::sleep(Duration::from_millis(10));
    }
    if worker.is_finished() {
        let _ = worker.join();
    } else {
        eprintln!("ktune serve: the engine did not stop within {}s; exiting", WORKER_GRACE.as_secs());
    }
    Ok(())
}

/// SIGINT and SIGTERM, caught by the runtime.
struct Signals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers (inside the runtime).
    fn new() -> std::io::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Signals { interrupt: signal(SignalKind::interrupt())?, terminate: signal(SignalKind::terminate())? })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    /// The first of them.
    async fn recv(mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
        #[cfg(not(unix))]
        {
            let _ = &mut self;
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`,
/// its type and code from the HTTP status (`code` replaces the latter).
fn error_json(status: u16, code: Option<&str>, msg: &str) -> Value {
    let (kind, default_code) = match status {
        401 => ("invalid_request_error", "invalid_api_key"),
        404 => ("invalid_request_error", "not_found"),
        408 => ("invalid_request_error", "request_timeout"),
        413 => ("invalid_request_error", "request_too_large"),
        429 => ("rate_limit_error", "queue_full"),
        503 => ("server_error", "shutting_down"),
        505 => ("invalid_request_error", "http_version_not_supported"),
        500.. => ("server_error", "internal_error"),
        _ => ("invalid_request_error", "invalid_request"),
    };
    json!({"error": {"message": msg, "type": kind, "param": null, "code": code.unwrap_or(default_code)}})
}
