//! `ktune serve` on loopback, driven by raw HTTP over `std::net::TcpStream`:
//! completions and chat completions, streamed (SSE) and not, equal to `run`'s
//! text for the same prompt and sampling; a request queued behind another and
//! 429 past `--queue`; a streaming client that disconnects cancels its
//! generation (seen in /metrics); 400 for malformed JSON, 413 past `--max-body`,
//! 401 without the `--api-key`; the counters of /metrics. And by the official
//! `openai` Python client (streamed text equal to `run`'s), from the venv
//! `.ci/run` makes under `target/` (`tools/requirements-serve.txt`). The tiny
//! SmolLM2-shaped GGUF fixture with the SmolLM2 chat template.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{fixture, gguf_dir, ktune_process, tempdir};

/// The fixture's model flags (the file has no chat template: the SmolLM2 one
/// given with `template`).
pub(crate) fn model_args(c: &mut Command, template: bool) -> &mut Command {
    c.args(["--gguf"]).arg(gguf_dir().join("smollm2-tiny-q8_0.gguf"));
    if template {
        c.arg("--chat-template").arg(fixture("chat_templates/smollm2.jinja"));
    }
    c
}

/// A running server (killed when dropped) and its log lines.
pub(crate) struct Served {
    pub child: Child,
    pub addr: String,
    pub log: Arc<Mutex<Vec<String>>>,
    _cache: Option<tempfile::TempDir>,
}

impl Served {
    /// Whether a log line containing `needle` arrives within `within` (the server
    /// writes it before the test's reader thread has it; a watchdog, not a timing).
    pub fn wait_log(&self, needle: &str, within: Duration) -> bool {
        let deadline = std::time::Instant::now() + within;
        loop {
            if self.log.lock().expect("log").iter().any(|l| l.contains(needle)) {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `serve --port 0` on the CPU with `flags`, once it prints the address it listens on.
pub(crate) fn serve(flags: &[&str]) -> Served {
    let cache = tempdir();
    let mut c = ktune_process(cache.path());
    c.args(["serve", "--port", "0"]);
    model_args(&mut c, true).args(flags);
    start(c, Some(cache))
}

/// Starts the `serve` command `c` and waits for the address it listens on.
pub(crate) fn start(mut c: Command, cache: Option<tempfile::TempDir>) -> Served {
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = c.spawn().expect("starts");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut addr = None;
    let mut head = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("stderr line");
        head.push(line.clone());
        if let Some(a) = line.split("listening on http://").nth(1) {
            addr = Some(a.trim().to_string());
            break;
        }
    }
    let addr = addr.unwrap_or_else(|| panic!("serve did not start: {head:?}"));
    let log = Arc::new(Mutex::new(head));
    let l = log.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            l.lock().expect("log").push(line);
        }
    });
    Served { child, addr, log, _cache: cache }
}

/// A response: status, body (chunked framing removed).
pub(crate) struct Reply {
    pub status: u16,
    pub body: String,
}

/// Sends one request (`Connection: close`) and reads the whole response.
pub(crate) fn request(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
    let mut s = TcpStream::connect(addr).expect("connects");
    s.set_read_timeout(Some(Duration::from_secs(120))).expect("timeout");
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).expect("writes");
    s.write_all(body).expect("writes");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("reads");
    parse(&raw)
}

pub(crate) fn parse(raw: &[u8]) -> Reply {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no header end: {text:?}"));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("status line: {head}"));
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(body) } else { body.to_string() };
    Reply { status, body }
}

/// The body of a chunked response.
fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

pub(crate) fn post(addr: &str, path: &str, body: &serde_json::Value) -> Reply {
    request(addr, "POST", path, &[("Content-Type", "application/json")], body.to_string().as_bytes())
}

pub(crate) fn json(r: &Reply) -> serde_json::Value {
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.body))
}

/// The text of an SSE body: the `content` deltas (chat) or `text` pieces, and
/// whether it ended with `data: [DONE]`.
pub(crate) fn sse_text(body: &str) -> (String, bool) {
    let (texts, _, done) = sse_choices(body);
    (texts.into_iter().next().unwrap_or_default(), done)
}

/// An SSE body's text of each choice (by its `index`), how many chunks gave
/// each a finish reason, and whether it ended with `data: [DONE]`.
fn sse_choices(body: &str) -> (Vec<String>, Vec<usize>, bool) {
    let (mut texts, mut finished) = (Vec::<String>::new(), Vec::<usize>::new());
    let events: Vec<&str> = body.split("\n\n").filter_map(|e| e.strip_prefix("data: ")).collect();
    for e in &events {
        if *e == "[DONE]" {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(e).unwrap_or_else(|err| panic!("{err}: {e}"));
        for c in v["choices"].as_array().into_iter().flatten() {
            let i = c["index"].as_u64().unwrap_or_else(|| panic!("a choice without its index: {e}")) as usize;
            if texts.len() <= i {
                texts.resize(i + 1, String::new());
                finished.resize(i + 1, 0);
            }
            texts[i].push_str(c["delta"]["content"].as_str().or(c["text"].as_str()).unwrap_or(""));
            finished[i] += usize::from(c["finish_reason"].is_string());
        }
    }
    (texts, finished, events.last() == Some(&"[DONE]"))
}

/// `run`'s text for `prompt` (with `--chat` when `chat`) and these sampling flags.
fn run_text(prompt: &str, chat: bool, flags: &[&str]) -> String {
    run_text_on("cpu", prompt, chat, flags)
}

/// [`run_text`] on the device `device` names.
fn run_text_on(device: &str, prompt: &str, chat: bool, flags: &[&str]) -> String {
    let cache = tempdir();
    let mut c = ktune_process(cache.path());
    c.args(["run", "--device", device, "--prompt", prompt, "--format", "json"]);
    if chat {
        c.arg("--chat");
    }
    let out = model_args(&mut c, chat).args(flags).output().expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    v["text"].as_str().expect("text").to_string()
}

/// The value of a /metrics line (`name{labels}` exactly), 0 when absent.
pub(crate) fn metric(addr: &str, name: &str) -> f64 {
    let r = request(addr, "GET", "/metrics", &[], b"");
    assert_eq!(r.status, 200);
    r.body.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.parse().ok())).unwrap_or(0.0)
}

#[test]
fn serve_completions_equal_run_streamed_and_not() {
    let s = serve(&["--device", "cpu"]);
    let a = s.addr.as_str();
    assert_eq!(request(a, "GET", "/health", &[], b"").status, 200);
    let models = json(&request(a, "GET", "/v1/models", &[], b""));
    assert_eq!(models["data"][0]["concurrency"], 1, "{models}");
    // Sampled (temperature, top-p, top-k, seed): the same text as run's.
    let flags = ["--max-tokens", "8", "--temperature", "0.8", "--top-p", "0.9", "--top-k", "40", "--seed", "7"];
    let want = run_text("Once upon a time", false, &flags);
    let body = serde_json::json!({"model": "anything", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0.8, "top_p": 0.9, "top_k": 40, "seed": 7});
    let r = post(a, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = json(&r);
    assert_eq!(v["choices"][0]["text"], want.as_str(), "{v}");
    assert_eq!(v["usage"]["completion_tokens"].as_u64().expect("usage") as usize, 8, "{v}");
    let mut streamed = body.clone();
    streamed["stream"] = true.into();
    let r = post(a, "/v1/completions", &streamed);
    assert_eq!(r.status, 200);
    assert_eq!(sse_text(&r.body), (want.clone(), true), "{}", r.body);
    // Chat: the template's turn, greedy; streamed and not.
    let want = run_text("hello", true, &["--max-tokens", "6"]);
    let body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 6, "temperature": 0});
    let v = json(&post(a, "/v1/chat/completions", &body));
    assert_eq!(v["choices"][0]["message"]["content"], want.as_str(), "{v}");
    let mut streamed = body.clone();
    streamed["stream"] = true.into();
    let r = post(a, "/v1/chat/completions", &streamed);
    assert_eq!(sse_text(&r.body), (want, true), "{}", r.body);
    // A stop string ends the text before it.
    let text = v["choices"][0]["message"]["content"].as_str().expect("text").to_string();
    if let Some(cut) = text.char_indices().nth(3).map(|(i, _)| i).filter(|&i| i > 0 && !text[i..].trim().is_empty()) {
        let mut stopped = body.clone();
        stopped["stop"] = serde_json::json!([text[cut..].chars().take(2).collect::<String>()]);
        let v = json(&post(a, "/v1/chat/completions", &stopped));
        let got = v["choices"][0]["message"]["content"].as_str().expect("text");
        assert!(text.starts_with(got) && got.len() <= cut, "stop at {cut}: {got:?} of {text:?}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }
    assert_eq!(metric(a, "ktune_requests_total{endpoint=\"/v1/completions\",status=\"200\"}"), 2.0);
    assert!(metric(a, "ktune_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"}") >= 2.0);
    assert!(metric(a, "ktune_generated_tokens_total") >= 28.0);
}

/// The same sampled request answers the same text however often it is sent:
/// its prompt's KV cache is reused, and a repeat used to feed the prompt's last
/// token again in a one-token pass, whose arithmetic differs from the prefill's
/// (the second of two identical requests answered other text than the first and
/// than `run`).
#[test]
fn serve_answers_a_repeated_request_alike_whether_its_prompt_was_cached() {
    let s = serve(&["--device", "cpu"]);
    let a = s.addr.as_str();
    let want = run_text("hello", true, &["--max-tokens", "6", "--temperature", "0.7", "--seed", "3"]);
    let body = serde_json::json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 6, "temperature": 0.7, "seed": 3});
    let other = serde_json::json!({"prompt": "Once upon a time", "max_tokens": 3});
    for i in 0..4 {
        if i == 2 {
            assert_eq!(post(a, "/v1/completions", &other).status, 200);
        }
        let v = json(&post(a, "/v1/chat/completions", &body));
        assert_eq!(v["choices"][0]["message"]["content"], want.as_str(), "request {i}: {v}");
    }
}

#[test]
fn serve_refuses_bad_requests_with_openai_errors() {
    let s = serve(&["--device", "cpu", "--api-key", "sesame", "--max-body", "2000", "--context", "64"]);
    let a = s.addr.as_str();
    let auth = [("Authorization", "Bearer sesame"), ("Content-Type", "application/json")];
    let r = request(a, "POST", "/v1/completions", &auth, b"{\"prompt\": \"hi\", ");
    assert_eq!(r.status, 400, "{}", r.body);
    let v = json(&r);
    assert!(v["error"]["message"].as_str().expect("message").contains("malformed JSON"), "{v}");
    let big = serde_json::json!({"prompt": "x".repeat(3000)}).to_string();
    assert_eq!(request(a, "POST", "/v1/completions", &auth, big.as_bytes()).status, 413);
    let ok = br#"{"prompt": "hi", "max_tokens": 2}"#;
    let r = request(a, "POST", "/v1/completions", &[("Authorization", "Bearer wrong")], ok);
    assert_eq!(r.status, 401);
    assert_eq!(json(&r)["error"]["code"], "invalid_api_key");
    assert_eq!(request(a, "GET", "/v1/models", &[], b"").status, 401);
    assert_eq!(request(a, "POST", "/v1/completions", &auth, ok).status, 200);
    let r = request(a, "POST", "/v1/chat/completions", &auth, br#"{"messages": []}"#);
    assert_eq!(r.status, 400, "{}", r.body);
    let r = request(a, "POST", "/v1/completions", &auth, br#"{"prompt": "hi", "temperature": -1}"#);
    assert_eq!(r.status, 400, "{}", r.body);
    // Prompts the request's handler refuses once tokenized: past the context
    // (more of them than the queue holds: each gives its place back), and none.
    let long = serde_json::json!({"prompt": "tide ".repeat(200)}).to_string();
    for _ in 0..20 {
        let r = request(a, "POST", "/v1/completions", &auth, long.as_bytes());
        assert_eq!(r.status, 400, "{}", r.body);
        assert!(json(&r)["error"]["message"].as_str().expect("message").contains("the context holds 64"), "{}", r.body);
    }
    let r = request(a, "POST", "/v1/completions", &auth, br#"{"prompt": ""}"#);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(json(&r)["error"]["message"].as_str().expect("message").contains("no tokens"), "{}", r.body);
    // Stop strings past what the engine looks for at each token: too many, too long.
    let many = serde_json::json!({"prompt": "hi", "stop": vec!["zq"; 17]}).to_string();
    let r = request(a, "POST", "/v1/completions", &auth, many.as_bytes());
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(json(&r)["error"]["message"].as_str().expect("message").contains("at most 16"), "{}", r.body);
    let long = serde_json::json!({"prompt": "hi", "stop": ["z".repeat(513)]}).to_string();
    let r = request(a, "POST", "/v1/completions", &auth, long.as_bytes());
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(json(&r)["error"]["message"].as_str().expect("message").contains("at most 512"), "{}", r.body);
    let fits = serde_json::json!({"prompt": "hi", "max_tokens": 2, "stop": vec!["z".repeat(512); 2]}).to_string();
    assert_eq!(request(a, "POST", "/v1/completions", &auth, fits.as_bytes()).status, 200);
    assert_eq!(request(a, "POST", "/v1/completions", &auth, ok).status, 200, "the server goes on");
    assert_eq!(request(a, "GET", "/nowhere", &[], b"").status, 404);
    // /metrics and /health need no key.
    assert_eq!(metric(a, "ktune_requests_total{endpoint=\"/v1/completions\",status=\"400\"}"), 25.0);
    assert_eq!(metric(a, "ktune_requests_total{endpoint=\"/v1/completions\",status=\"413\"}"), 1.0);
    assert_eq!(metric(a, "ktune_requests_total{endpoint=\"/v1/completions\",status=\"401\"}"), 1.0);
}

/// Opens a streaming completion of `max_tokens` and reads until its first text event.
/// A completion request sent on a connection of its own, nothing read.
pub(crate) fn send_completion(addr: &str, max_tokens: usize, stream: bool) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connects");
    let body = serde_json::json!({"prompt": "Once upon a time", "max_tokens": max_tokens, "stream": stream}).to_string();
    let head = format!("POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    s.write_all(head.as_bytes()).expect("writes");
    s
}

/// The metric once it reaches `want`, or its last value after `tries` looks 20 ms apart.
pub(crate) fn metric_reaching(addr: &str, name: &str, want: f64, tries: usize) -> f64 {
    let mut v = 0.0;
    for _ in 0..tries {
        v = metric(addr, name);
        if v >= want {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    v
}

fn open_stream(addr: &str, max_tokens: usize) -> TcpStream {
    let s = send_completion(addr, max_tokens, true);
    let mut r = BufReader::new(s.try_clone().expect("clone"));
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        assert!(r.read_line(&mut line).expect("reads") > 0, "the stream ended early");
    }
    s
}

#[test]
fn serve_queues_refuses_past_the_bound_and_cancels_on_disconnect() {
    let s = serve(&["--device", "cpu", "--queue", "1", "--ignore-eos", "--context", "4096"]);
    let a = s.addr.clone();
    // A long generation holds the engine; one request may wait, the next gets 429.
    let hold = open_stream(&a, 4000);
    let waiting = {
        let a = a.clone();
        std::thread::spawn(move || post(&a, "/v1/completions", &serde_json::json!({"prompt": "hi", "max_tokens": 2})).status)
    };
    assert_eq!(metric_reaching(&a, "ktune_queue_length", 1.0, 200), 1.0, "the second request waits");
    let r = post(&a, "/v1/completions", &serde_json::json!({"prompt": "hi", "max_tokens": 2}));
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(json(&r)["error"]["code"], "queue_full");
    // The held stream's client goes away: its generation stops, the waiting one is served.
    drop(hold);
    assert_eq!(waiting.join().expect("joins"), 200);
    assert_eq!(metric(&a, "ktune_cancelled_total"), 1.0);
    let generated = metric(&a, "ktune_generated_tokens_total");
    assert!(generated < 4000.0, "the cancelled generation stopped early: {generated} tokens");
    assert!(s.wait_log("cancelled", Duration::from_secs(60)), "the log says so: {:?}", s.log.lock().expect("log"));
    // A client waiting for a whole (non-streamed) reply goes away: its generation stops too.
    let before = metric(&a, "ktune_generated_tokens_total");
    let whole = send_completion(&a, 4000, false);
    // Sent and (most likely) generating; gone before or after, it is cancelled.
    std::thread::sleep(Duration::from_millis(300));
    drop(whole);
    let cancelled = metric_reaching(&a, "ktune_cancelled_total", 2.0, 1000);
    assert_eq!(cancelled, 2.0, "the non-streamed generation is cancelled when its client goes");
    let generated = metric(&a, "ktune_generated_tokens_total") - before;
    assert!(generated < 4000.0, "the cancelled generation stopped early: {generated} tokens");
}

/// `serve --parallel` on a GPU (lavapipe in CI; skipped loudly without one
/// unless required): the sequences share the GPU's paged KV cache and advance in
/// one pass a step; three requests at once (greedy and seeded, chat and text),
/// in two rounds (the second's prompts held by the slots' caches), answer as
/// `run` alone on the same GPU.
#[test]
fn serve_parallel_on_a_gpu_answers_as_run() {
    let cache = tempdir();
    let Some(dev) = crate::common::gpu_index(cache.path(), "serve --parallel") else { return };
    let s = serve(&["--device", &dev, "--parallel", "3", "--context", "256", "--step-tokens", "4"]);
    let a = s.addr.clone();
    assert_eq!(json(&request(&a, "GET", "/v1/models", &[], b""))["data"][0]["concurrency"], 3);
    let cases = parallel_cases(&dev);
    for round in 0..2 {
        answers_at_once(&a, &cases, &format!("round {round} on the GPU"));
    }
    assert!(metric(&a, "ktune_kv_cache_blocks_total") > 0.0, "a paged KV cache on the GPU");
    assert!(metric(&a, "ktune_prefix_cache_hit_tokens_total") > 0.0, "the repeated prompts reused their slots' caches");
}

/// Three requests (greedy and seeded, chat and text) and the text `run` gives
/// each alone on `device`: what the parallel servers are sent at once.
fn parallel_cases(device: &str) -> Vec<(serde_json::Value, String, &'static str)> {
    let sampled = ["--max-tokens", "8", "--temperature", "0.8", "--top-p", "0.9", "--seed", "7"];
    vec![
        (
            serde_json::json!({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0.8, "top_p": 0.9, "seed": 7}),
            run_text_on(device, "Once upon a time", false, &sampled),
            "/v1/completions",
        ),
        (
            serde_json::json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 6, "temperature": 0}),
            run_text_on(device, "hello", true, &["--max-tokens", "6"]),
            "/v1/chat/completions",
        ),
        (
            serde_json::json!({"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 12, "temperature": 0}),
            run_text_on(device, "What is the capital of France?", true, &["--max-tokens", "12"]),
            "/v1/chat/completions",
        ),
    ]
}

/// The completion's text (a chat's message or a text completion's).
fn completion_text(v: &serde_json::Value) -> Option<String> {
    v["choices"][0]["text"].as_str().or(v["choices"][0]["message"]["content"].as_str()).map(String::from)
}

/// Sends every case at once to the server at `addr`; each answers its text.
fn answers_at_once(addr: &str, cases: &[(serde_json::Value, String, &'static str)], what: &str) {
    let threads: Vec<_> = cases
        .iter()
        .cloned()
        .map(|(body, want, path)| {
            let a = addr.to_string();
            std::thread::spawn(move || (json(&post(&a, path, &body)), want))
        })
        .collect();
    for t in threads {
        let (v, want) = t.join().expect("joins");
        assert_eq!(completion_text(&v).as_deref(), Some(want.as_str()), "{what}: {v}");
    }
}

/// The venv `.ci/run` makes with `tools/requirements-serve.txt`; None (a loud
/// skip) without it, unless CI / KTUNE_REQUIRE_GPU require it.
fn openai_python() -> Option<PathBuf> {
    let py = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/venv-serve/bin/python");
    if py.is_file() {
        return Some(py);
    }
    let required = std::env::var_os("CI").is_some() || std::env::var_os("KTUNE_REQUIRE_GPU").is_some();
    assert!(!required, "{} is missing: .ci/run makes it (python3 -m venv, pip install -r tools/requirements-serve.txt)", py.display());
    eprintln!("\n!!!! SKIPPING the openai client test: no {} (see .ci/run) !!!!\n", py.display());
    None
}

#[test]
fn serve_answers_the_official_openai_client_like_run() {
    let Some(py) = openai_python() else { return };
    let s = serve(&["--device", "cpu", "--api-key", "k"]);
    let want_chat = run_text("hello", true, &["--max-tokens", "6", "--temperature", "0.7", "--seed", "3"]);
    let want_text = run_text("Once upon a time", false, &["--max-tokens", "6"]);
    let script = r#"
import json, sys, openai
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="k")
msgs = [{"role": "user", "content": "hello"}]
chat = c.chat.completions.create(model="m", messages=msgs, max_tokens=6, temperature=0.7, seed=3)
parts = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(model="m", messages=msgs, max_tokens=6, temperature=0.7, seed=3, stream=True) if ch.choices]
text = c.completions.create(model="m", prompt="Once upon a time", max_tokens=6, temperature=0)
tparts = [ch.choices[0].text for ch in c.completions.create(model="m", prompt="Once upon a time", max_tokens=6, temperature=0, stream=True) if ch.choices]
try:
    openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="bad").models.list()
    bad = "accepted"
except openai.AuthenticationError:
    bad = "401"
print(json.dumps({"chat": chat.choices[0].message.content, "chat_stream": "".join(parts), "text": text.choices[0].text,
                  "text_stream": "".join(tparts), "usage": chat.usage.completion_tokens, "bad_key": bad}))
"#;
    let out = Command::new(py).arg("-c").arg(script).arg(format!("http://{}", s.addr)).output().expect("python runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["chat_stream"], want_chat.as_str(), "{v}");
    assert_eq!(v["chat"], want_chat.as_str(), "{v}");
    assert_eq!(v["text_stream"], want_text.as_str(), "{v}");
    assert_eq!(v["text"], want_text.as_str(), "{v}");
    assert_eq!(v["bad_key"], "401");
}

/// On lavapipe with a tuned profile in the cache: `serve` and `chat` use it (their
/// startup lines name it), and the streamed chat completion is `run`'s text.
#[test]
fn serve_and_chat_use_the_cached_tuned_profile_on_a_gpu() {
    let cache = tempdir();
    let Some(dev) = crate::common::gpu_index(cache.path(), "serve") else { return };
    let mut tune = ktune_process(cache.path());
    tune.args(["tune", "--device", &dev, "--budget", "1s", "--prefill-tokens", "8", "--context", "128", "--decode-tokens", "8"]);
    let o = model_args(&mut tune, false).output().expect("tune runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The server, with the same cache.
    let mut c = ktune_process(cache.path());
    c.args(["serve", "--port", "0", "--device", &dev, "--context", "128"]);
    model_args(&mut c, true);
    let s = start(c, None);
    let started = s.log.lock().expect("log").join("\n");
    assert!(started.contains("profile cached"), "{started}");
    let mut run = ktune_process(cache.path());
    run.args(["run", "--device", &dev, "--prompt", "hello", "--chat", "--context", "128", "--max-tokens", "6", "--format", "json"]);
    let out = model_args(&mut run, true).output().expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(v["profile"].as_str().is_some_and(|p| p.starts_with("cached")), "{}", v["profile"]);
    let body = serde_json::json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 6, "stream": true});
    let r = post(&s.addr, "/v1/chat/completions", &body);
    assert_eq!(sse_text(&r.body), (v["text"].as_str().expect("text").to_string(), true), "{}", r.body);
    drop(s);
    // chat on the same device names the profile too.
    let mut chat = ktune_process(cache.path());
    chat.args(["chat", "--device", &dev, "--context", "128", "--max-tokens", "4"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = model_args(&mut chat, true).spawn().expect("chat runs");
    child.stdin.take().expect("stdin").write_all(b"hello\n").expect("writes");
    let out = child.wait_with_output().expect("ends");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.contains("profile cached"), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).ends_with("---\n"));
}

/// A model without a chat template is served: completions answer, chat
/// completions get 400 naming the missing template.
#[test]
fn serve_without_a_chat_template_answers_completions_only() {
    let cache = tempdir();
    let mut c = ktune_process(cache.path());
    c.args(["serve", "--port", "0", "--device", "cpu"]);
    model_args(&mut c, false);
    let s = start(c, Some(cache));
    let r = post(&s.addr, "/v1/completions", &serde_json::json!({"prompt": "hi", "max_tokens": 2}));
    assert_eq!(r.status, 200, "{}", r.body);
    let r = post(&s.addr, "/v1/chat/completions", &serde_json::json!({"messages": [{"role": "user", "content": "hi"}]}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(json(&r)["error"]["message"].as_str().expect("message").contains("no chat template"), "{}", r.body);
}

/// `--parallel 3`: requests generated at once, each in a sequence of its own,
/// answer what `run` answers alone (greedy and seeded sampling, chat and plain
/// text, prompts prefilled 4 tokens a step), however they interleave and
/// whatever their slots' caches held; a
/// streaming client that leaves frees its slot while the others go on;
/// /v1/models and /metrics say how many run.
#[test]
fn serve_parallel_sequences_answer_as_alone() {
    let s = serve(&["--device", "cpu", "--parallel", "3", "--queue", "2", "--context", "4096", "--step-tokens", "4"]);
    let a = s.addr.clone();
    assert_eq!(json(&request(&a, "GET", "/v1/models", &[], b""))["data"][0]["concurrency"], 3);
    let cases = parallel_cases("cpu");
    // Three rounds of every case at once: the slots keep their caches between rounds.
    for round in 0..3 {
        answers_at_once(&a, &cases, &format!("round {round}"));
    }
    assert!(metric(&a, "ktune_prefix_cache_hit_tokens_total") > 0.0, "the repeated prompts reused their slots' caches");
    assert!(metric(&a, "ktune_kv_cache_tokens") > 0.0);
    // A long stream holds a slot; its client leaves: the slot frees, the others
    // answer, decoded in steps beside it (whatever the machine's load did to
    // the rounds above, where three requests of a few tokens each may also
    // have come one after another).
    let fresh = ("Name three rivers.", run_text("Name three rivers.", true, &["--max-tokens", "6"]));
    let hold = open_stream(&a, 3000);
    let (body, want, path) = cases[1].clone();
    assert_eq!(completion_text(&json(&post(&a, path, &body))).as_deref(), Some(want.as_str()), "answered beside a long stream");
    let together = metric(&a, "ktune_batch_steps_total{sequences=\"2\"}") + metric(&a, "ktune_batch_steps_total{sequences=\"3\"}");
    assert!(together > 0.0, "sequences advanced together in one step");
    // A prompt no slot holds comes while the stream decodes: its chunks run in
    // the stream's decode passes, and it answers as alone.
    let chunks = metric(&a, "ktune_prompt_chunks_batched_total");
    let body = serde_json::json!({"messages": [{"role": "user", "content": fresh.0}], "max_tokens": 6, "temperature": 0});
    assert_eq!(
        completion_text(&json(&post(&a, "/v1/chat/completions", &body))).as_deref(),
        Some(fresh.1.as_str()),
        "a new prompt beside a stream"
    );
    assert!(metric(&a, "ktune_prompt_chunks_batched_total") > chunks, "its chunks joined the stream's decode passes");
    drop(hold);
    assert_eq!(metric_reaching(&a, "ktune_cancelled_total", 1.0, 1000), 1.0, "the left stream is cancelled");
}

/// `n` choices of one request: choice i is the text the request gives alone
/// with the seed plus i, streamed (chunks by index, each choice finished once,
/// one `[DONE]`) and not, one sequence at a time and in one batch; the prompt
/// counted once in the usage. An `n` past --parallel + --queue (or 0) is 400.
#[test]
fn serve_answers_n_choices_each_as_its_seed_alone() {
    for parallel in ["1", "3"] {
        let s = serve(&["--device", "cpu", "--parallel", parallel, "--queue", "2", "--context", "4096"]);
        let a = s.addr.as_str();
        let body =
            serde_json::json!({"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0.9, "top_p": 0.95, "seed": 11, "n": 3});
        let alone: Vec<serde_json::Value> = (0..3)
            .map(|i| {
                let mut b = body.clone();
                (b["n"], b["seed"]) = (1.into(), (11 + i).into());
                json(&post(a, "/v1/completions", &b))
            })
            .collect();
        let texts: Vec<&str> = alone.iter().map(|v| v["choices"][0]["text"].as_str().expect("text")).collect();
        assert!(texts.iter().any(|t| *t != texts[0]), "the seeds sample different texts: {texts:?}");
        let v = json(&post(a, "/v1/completions", &body));
        let choices = v["choices"].as_array().unwrap_or_else(|| panic!("--parallel {parallel}: {v}"));
        assert_eq!(choices.len(), 3, "--parallel {parallel}: {v}");
        for (i, c) in choices.iter().enumerate() {
            assert_eq!((c["index"].as_u64(), c["text"].as_str()), (Some(i as u64), Some(texts[i])), "--parallel {parallel}: {v}");
        }
        let (u, one) = (&v["usage"], &alone[0]["usage"]);
        let generated: u64 = alone.iter().map(|v| v["usage"]["completion_tokens"].as_u64().expect("tokens")).sum();
        assert_eq!((&u["prompt_tokens"], u["completion_tokens"].as_u64()), (&one["prompt_tokens"], Some(generated)), "{v}");
        let mut streamed = body.clone();
        streamed["stream"] = true.into();
        let r = post(a, "/v1/completions", &streamed);
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(sse_choices(&r.body), (texts.iter().map(|t| t.to_string()).collect(), vec![1; 3], true), "{}", r.body);
        for n in [0, 6] {
            let mut b = body.clone();
            b["n"] = n.into();
            let r = post(a, "/v1/completions", &b);
            assert_eq!(r.status, 400, "n = {n}: {}", r.body);
            assert!(json(&r)["error"]["message"].as_str().is_some_and(|m| m.contains("`n`")), "{}", r.body);
        }
    }
}

/// `n` copies of the completion request `body` sent at once to the server at
/// `addr`, each from a thread of its own: their answers.
fn completions_at_once(addr: &str, body: &serde_json::Value, n: usize) -> Vec<serde_json::Value> {
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let (a, body) = (addr.to_string(), body.clone());
            std::thread::spawn(move || json(&post(&a, "/v1/completions", &body)))
        })
        .collect();
    threads.into_iter().map(|t| t.join().expect("joins")).collect()
}

/// `--kv-tokens`: every request reserves its prompt and max_tokens; past the
/// limit a request waits for a running one to end (never an error mid-stream),
/// so no more run at once than fit; one larger than the whole gets 400.
#[test]
fn serve_parallel_keeps_within_its_kv_memory() {
    let s = serve(&["--device", "cpu", "--parallel", "4", "--kv-tokens", "80", "--queue", "8"]);
    let a = s.addr.clone();
    let want = run_text("Once upon a time", false, &["--max-tokens", "24"]);
    let body = serde_json::json!({"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0});
    for v in completions_at_once(&a, &body, 4) {
        assert_eq!(v["choices"][0]["text"], want.as_str(), "{v}");
    }
    // A request reserves 4 + 24 positions: two fit in 80, never three.
    for n in 3..=4 {
        assert_eq!(metric(&a, &format!("ktune_batch_steps_total{{sequences=\"{n}\"}}")), 0.0, "{n} sequences at once");
    }
    assert!(metric(&a, "ktune_batch_steps_total{sequences=\"2\"}") > 0.0, "two at once");
    assert!(metric(&a, "ktune_kv_cache_tokens") <= 80.0);
    // The sequences' blocks in the paged cache: what the requests' 80
    // positions take at most, a partly filled last block each.
    let blocks = metric(&a, "ktune_kv_cache_blocks_used");
    assert!(blocks > 0.0 && blocks <= (80 / ktune::runtime::KV_PAGE + 4) as f64, "{blocks} blocks held");
    assert!(metric(&a, "ktune_kv_cache_blocks_total") >= blocks);
    let big = serde_json::json!({"prompt": "Once upon a time", "max_tokens": 100});
    let r = post(&a, "/v1/completions", &big);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("--kv-tokens"), "{}", r.body);
}

/// `--kv-tokens` counts a prefix the sequences share once: four requests of a
/// prompt past three blocks (about 210 tokens, and 40 more each), whose
/// positions one at a time would not fit twice in the limit, run at once (the
/// prompt's whole blocks held once, each its own copy of the last), and each
/// answers as alone.
#[test]
fn serve_parallel_holds_a_shared_prompt_once_in_its_kv_memory() {
    let page = ktune::runtime::KV_PAGE;
    let prompt =
        "Once upon a time there was a little robot who lived in a quiet town by the sea. ".repeat(3) + "It liked to sing and dance.";
    let body = serde_json::json!({"prompt": prompt, "max_tokens": 40, "temperature": 0});
    // The prompt's tokens, and its answer alone, from a server without a limit.
    let (tokens, want) = {
        let s = serve(&["--device", "cpu", "--parallel", "1"]);
        let v = json(&post(&s.addr, "/v1/completions", &body));
        (v["usage"]["prompt_tokens"].as_u64().expect("prompt tokens") as usize, completion_text(&v).expect("text"))
    };
    assert!((3 * page + 1..4 * page - 40).contains(&tokens), "a prompt of {tokens} tokens: past three blocks, within four");
    // The shared blocks once, and each request's last block (a copy) to its end.
    let kv = 3 * page + 4 * (tokens + 40 - 3 * page);
    assert!(2 * (tokens + 40) > kv, "by positions alone not even two would fit in {kv}");
    let kv_flag = kv.to_string();
    let s = serve(&["--device", "cpu", "--parallel", "4", "--kv-tokens", &kv_flag, "--queue", "8"]);
    let a = s.addr.clone();
    for v in completions_at_once(&a, &body, 4) {
        assert_eq!(completion_text(&v).as_deref(), Some(want.as_str()), "{v}");
    }
    assert!(metric(&a, "ktune_batch_steps_total{sequences=\"4\"}") > 0.0, "four at once within {kv} positions");
    assert!(metric(&a, "ktune_prefix_cache_hit_tokens_total") >= (3 * 3 * page) as f64, "three shared the first's prompt");
    assert!(metric(&a, "ktune_kv_cache_tokens") <= kv as f64, "what is held now, shared blocks once");
    assert!(metric(&a, "ktune_kv_cache_usage_ratio") <= 1.0);
}
