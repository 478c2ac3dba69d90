//! `--hf` and `ktune pull` against a hub served from inside the test (no
//! network): a std `TcpListener` on 127.0.0.1 answering in the Hugging Face Hub's
//! URL layout (the API's file list with LFS SHA-256s, `/{repo}/resolve/{rev}/{file}`
//! redirecting to a CDN-like path with `ETag`, `x-linked-etag`, `x-repo-commit`,
//! `x-linked-size`, Range requests), a tiny GGUF model and a sharded safetensors
//! model (the test fixtures), a gated
//! repository (401 without the token), a connection dropped mid-file (the retry
//! resumes with a Range) and a wrong SHA-256. Checked: the cache layout
//! huggingface_hub reads, a second run without any request, `HF_HUB_OFFLINE=1`,
//! and each failure's message and exit code.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use assert_cmd::Command;
use sha2::{Digest, Sha256};

use crate::common::{fixture, gguf_dir, ktune_in, tempdir};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const REPO: &str = "tiny/Model-GGUF";
const TOKEN: &str = "hf_test_token";

/// One file the fake hub serves.
struct File {
    name: &'static str,
    bytes: Vec<u8>,
    /// The SHA-256 the API lists (the true one unless a test wants a mismatch).
    listed_sha: String,
}

#[derive(Default)]
struct State {
    /// Every request as `METHOD PATH [range]`.
    log: Vec<String>,
    /// CDN keys whose next GET is cut after half the body.
    drop_once: Vec<String>,
}

struct FakeHub {
    port: u16,
    state: Arc<Mutex<State>>,
}

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

fn sharded(name: &str) -> Vec<u8> {
    std::fs::read(fixture("qwen2-tiny-sharded").join(name)).expect("fixture")
}

fn repos() -> BTreeMap<&'static str, Vec<File>> {
    let read = |f: &str| std::fs::read(gguf_dir().join(f)).expect("fixture");
    let file = |name, bytes: Vec<u8>| File { name, listed_sha: sha(&bytes), bytes };
    let q4 = read("llama-k-q4_k_m.gguf");
    let q8 = read("smollm2-tiny-q8_0.gguf");
    let mut bad = file("tiny-Q4_K_M.gguf", q4.clone());
    bad.listed_sha = sha(b"something else");
    BTreeMap::from([
        (
            REPO,
            vec![
                file("README.md", b"# tiny\n".to_vec()),
                file("tiny-Q4_K_M.gguf", q4.clone()),
                file("tiny-Q8_0.gguf", q8),
                file("mmproj-tiny-f16.gguf", b"not a model".to_vec()),
            ],
        ),
        ("tiny/Gated-GGUF", vec![file("tiny-Q4_K_M.gguf", q4)]),
        (
            "tiny/Qwen-Sharded",
            [
                "config.json",
                "model.safetensors.index.json",
                "model-00001-of-00004.safetensors",
                "model-00002-of-00004.safetensors",
                "model-00003-of-00004.safetensors",
                "model-00004-of-00004.safetensors",
            ]
            .into_iter()
            .map(|n| file(n, sharded(n)))
            .chain([file("README.md", b"# tiny\n".to_vec()), file("consolidated.safetensors", b"not in the index".to_vec())])
            .collect(),
        ),
        ("tiny/BadSha-GGUF", vec![bad]),
    ])
}

/// One request a stand-in hub read.
pub(crate) struct Request {
    pub method: String,
    /// The path and query.
    pub target: String,
    /// Header names in lower case.
    pub headers: BTreeMap<String, String>,
}

impl Request {
    /// The path without the query.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }
}

/// A stand-in hub on 127.0.0.1: each connection on a thread of its own, its
/// request read and handed to `handle` with the connection to answer on. The port.
pub(crate) fn listen(handle: impl Fn(Request, &mut TcpStream) + Send + Sync + 'static) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let handle = Arc::new(handle);
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let handle = handle.clone();
            std::thread::spawn(move || {
                if let Some(req) = read_request(&conn) {
                    handle(req, &mut conn);
                }
            });
        }
    });
    port
}

fn read_request(conn: &TcpStream) -> Option<Request> {
    let mut reader = BufReader::new(conn.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let mut parts = line.split_whitespace();
    Some(Request { method: parts.next()?.to_string(), target: parts.next()?.to_string(), headers })
}

impl FakeHub {
    fn start() -> FakeHub {
        let state = Arc::new(Mutex::new(State::default()));
        let (st, repos) = (state.clone(), repos());
        let port = listen(move |req, conn| serve(req, conn, &st, &repos));
        FakeHub { port, state }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn log(&self) -> Vec<String> {
        self.state.lock().expect("state").log.clone()
    }

    /// `ktune` with this hub and its cache under `home`, and nothing from the
    /// user's environment about the hub.
    fn ktune(&self, home: &Path) -> Command {
        let mut c = ktune_in(&home.join("ktune"));
        c.env("HF_HOME", home.join("hf")).env("HF_ENDPOINT", self.endpoint());
        for k in ["HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN_PATH"] {
            c.env_remove(k);
        }
        c
    }
}

pub(crate) fn respond(conn: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8], cut: bool) {
    let mut head = format!("HTTP/1.1 {status}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = conn.write_all(head.as_bytes());
    let _ = conn.write_all(if cut { &body[..body.len() / 2] } else { body });
    let _ = conn.flush();
}

fn serve(req: Request, conn: &mut TcpStream, state: &Mutex<State>, repos: &BTreeMap<&'static str, Vec<File>>) {
    let range = req.headers.get("range").cloned();
    state.lock().expect("state").log.push(format!("{} {} {}", req.method, req.target, range.clone().unwrap_or_default()));
    let authorized = req.headers.get("authorization").is_some_and(|a| a == &format!("Bearer {TOKEN}"));
    let path = req.path();
    let not_found = |conn: &mut TcpStream| respond(conn, "404 Not Found", &[("X-Error-Code", "RepoNotFound".into())], b"{}", false);
    let gated = |repo: &str| repo.contains("Gated") && !authorized;

    if let Some(rest) = path.strip_prefix("/api/models/") {
        let Some((repo, _rev)) = rest.split_once("/revision/") else { return not_found(conn) };
        let Some(files) = repos.get(repo) else { return not_found(conn) };
        if gated(repo) {
            return respond(conn, "401 Unauthorized", &[], b"{\"error\":\"gated\"}", false);
        }
        let siblings: Vec<serde_json::Value> = files
            .iter()
            .map(|f| {
                if f.name.ends_with(".gguf") {
                    serde_json::json!({"rfilename": f.name, "size": f.bytes.len(), "blobId": &sha(f.name.as_bytes())[..40],
                        "lfs": {"sha256": f.listed_sha, "size": f.bytes.len(), "pointerSize": 134}})
                } else {
                    serde_json::json!({"rfilename": f.name, "size": f.bytes.len(), "blobId": &sha(&f.bytes)[..40]})
                }
            })
            .collect();
        let body = serde_json::json!({"id": repo, "sha": COMMIT, "siblings": siblings}).to_string();
        return respond(conn, "200 OK", &[("Content-Type", "application/json".into())], body.as_bytes(), false);
    }
    if let Some(key) = path.strip_prefix("/cdn/") {
        let Some(f) = repos.values().flatten().find(|f| sha(&f.bytes) == key) else { return not_found(conn) };
        let cut = {
            let mut s = state.lock().expect("state");
            let i = s.drop_once.iter().position(|k| k == key);
            i.map(|i| s.drop_once.remove(i)).is_some()
        };
        let from =
            range.as_deref().and_then(|r| r.strip_prefix("bytes=")).and_then(|r| r.strip_suffix('-')).and_then(|n| n.parse::<usize>().ok());
        return match from {
            Some(n) if n < f.bytes.len() => {
                let cr = format!("bytes {n}-{}/{}", f.bytes.len() - 1, f.bytes.len());
                respond(conn, "206 Partial Content", &[("Content-Range", cr)], &f.bytes[n..], cut)
            }
            _ => respond(conn, "200 OK", &[], &f.bytes, cut),
        };
    }
    // /{owner}/{name}/resolve/{rev}/{file}
    let segs: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    if let [owner, name, "resolve", _rev, file] = segs[..] {
        let repo = format!("{owner}/{name}");
        let Some(f) = repos.get(repo.as_str()).and_then(|fs| fs.iter().find(|f| f.name == file)) else { return not_found(conn) };
        if gated(&repo) {
            return respond(conn, "401 Unauthorized", &[], b"", false);
        }
        let key = sha(&f.bytes);
        let headers = [
            ("Location", format!("/cdn/{key}")),
            ("ETag", format!("\"{}\"", &sha(file.as_bytes())[..40])),
            ("X-Linked-Etag", format!("\"{}\"", f.listed_sha)),
            ("X-Linked-Size", f.bytes.len().to_string()),
            ("X-Repo-Commit", COMMIT.to_string()),
        ];
        return respond(conn, "302 Found", &headers, b"", false);
    }
    not_found(conn)
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `pull` downloads once into huggingface_hub's layout, resuming a dropped
/// connection; `tune --hf` tunes the cached file, and `run --hf` then generates
/// text from the cache on that profile without a request, also with
/// `HF_HUB_OFFLINE=1`; offline, an uncached quant is a clear error.
#[test]
fn pull_then_run_from_the_cache() {
    let hub = FakeHub::start();
    let home = tempdir();
    let q4 = std::fs::read(gguf_dir().join("llama-k-q4_k_m.gguf")).expect("fixture");
    let key = sha(&q4);
    hub.state.lock().expect("state").drop_once.push(key.clone());

    let o = hub.ktune(home.path()).args(["pull", "--hf", REPO, "--format", "json"]).output().expect("runs");
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let repo_dir = home.path().join("hf/hub/models--tiny--Model-GGUF");
    let link = repo_dir.join(format!("snapshots/{COMMIT}/tiny-Q4_K_M.gguf"));
    assert_eq!(PathBuf::from(r["path"].as_str().expect("path")), link, "the default quant is Q4_K_M");
    assert_eq!(r["commit"], COMMIT);
    // The layout huggingface_hub reads: refs/main, a relative link to blobs/<sha256>.
    assert_eq!(std::fs::read_to_string(repo_dir.join("refs/main")).expect("ref"), COMMIT);
    assert_eq!(std::fs::read_link(&link).expect("symlink"), PathBuf::from(format!("../../blobs/{key}")));
    assert_eq!(sha(&std::fs::read(&link).expect("blob")), key, "the resumed file is whole");
    assert!(!repo_dir.join(format!("blobs/{key}.incomplete")).exists());
    let log = hub.log();
    let cdn: Vec<&String> = log.iter().filter(|l| l.contains(&format!("/cdn/{key}"))).collect();
    assert_eq!(cdn.len(), 2, "one dropped GET and one resumed: {log:?}");
    assert!(cdn[1].contains("bytes=") && !cdn[1].ends_with("bytes=0-"), "the retry asks for the rest with a Range: {log:?}");
    assert!(!log.iter().any(|l| l.contains("Q8_0") || l.contains("mmproj")), "only the chosen file: {log:?}");

    let run = |offline: bool| {
        let mut c = hub.ktune(home.path());
        if offline {
            c.env("HF_HUB_OFFLINE", "1").env("HF_ENDPOINT", "http://127.0.0.1:9");
        }
        c.args([
            "--device",
            "cpu",
            "run",
            "--hf",
            "tiny/Model-GGUF:q4_k_m",
            "--prompt",
            "The kernel",
            "--max-tokens",
            "3",
            "--format",
            "json",
        ])
        .output()
        .expect("runs")
    };
    // `tune --hf` tunes the cached file; its profile then serves `run --hf`.
    let o = hub
        .ktune(home.path())
        .args(["tune", "--device", "cpu", "--hf", "tiny/Model-GGUF:Q4_K_M", "--budget", "2s", "--prefill-tokens", "8"])
        .args(["--context", "32", "--decode-tokens", "4", "--format", "json"])
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", stderr(&o));
    let tuned: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let tuned = PathBuf::from(tuned["path"].as_str().expect("profile path"));
    let key_of = tuned.file_stem().expect("key").to_string_lossy().into_owned();
    let requests = hub.log().len();
    let mut texts = Vec::new();
    for offline in [false, true] {
        let o = run(offline);
        assert!(o.status.success(), "offline {offline}: {}", stderr(&o));
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        assert_eq!(r["generated"].as_array().map(Vec::len), Some(3));
        let used = r["profile"].as_str().unwrap_or_default();
        assert!(used.starts_with(&format!("cached {}", &key_of[..8])), "the profile tuned on the cached file serves the run: {used}");
        texts.push(r["text"].clone());
    }
    assert_eq!(texts[0], texts[1]);
    assert_eq!(hub.log().len(), requests, "a cached revision makes no request: {:?}", &hub.log()[requests..]);

    let o = hub.ktune(home.path()).env("HF_HUB_OFFLINE", "1").args(["pull", "--hf", "tiny/Model-GGUF:Q8_0"]).output().expect("runs");
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("HF_HUB_OFFLINE") && e.contains("not in the cache") && e.contains("tiny/Model-GGUF"), "{e}");
    assert_eq!(hub.log().len(), requests, "offline makes no request");
}

/// A safetensors repository resolves to its snapshot directory with the config,
/// the index and the shards it names (not the other files), and runs as the same
/// `--model-dir` does.
#[test]
fn a_safetensors_repository_is_a_model_directory() {
    let hub = FakeHub::start();
    let home = tempdir();
    let run = |source: &[&str]| -> serde_json::Value {
        let o = hub
            .ktune(home.path())
            .args(["--device", "cpu", "run"])
            .args(source)
            .args(["--tokens", "1,2,3", "--max-tokens", "3", "--format", "json"])
            .output()
            .expect("runs");
        assert!(o.status.success(), "{source:?}: {}", stderr(&o));
        serde_json::from_slice(&o.stdout).expect("json")
    };
    let dir = fixture("qwen2-tiny-sharded");
    let want = run(&["--model-dir", dir.to_str().expect("utf-8")]);
    let got = run(&["--hf", "tiny/Qwen-Sharded"]);
    assert_eq!(got["generated"], want["generated"]);
    let snap = home.path().join(format!("hf/hub/models--tiny--Qwen-Sharded/snapshots/{COMMIT}"));
    let mut files: Vec<String> =
        std::fs::read_dir(&snap).expect("snapshot").flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    files.sort();
    assert_eq!(files.len(), 6, "config, index and the 4 shards it names: {files:?}");
    assert!(!files.iter().any(|f| f == "README.md" || f.starts_with("consolidated")), "{files:?}");
}

/// A gated repository without the token names its license page and HF_TOKEN (and
/// with the token downloads); a wrong SHA-256 deletes the partial file; a missing
/// repository, a quant the repository lacks and an unreachable hub say so; a
/// built-in model's synthetic weights name the `--hf` of the published model.
#[test]
fn failures_name_the_cause_and_the_fix() {
    let hub = FakeHub::start();
    let home = tempdir();
    let fails = |args: &[&str], env: &[(&str, &str)], want: &[&str]| {
        let mut c = hub.ktune(home.path());
        for (k, v) in env {
            c.env(k, v);
        }
        let o = c.args(args).output().expect("runs");
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let e = stderr(&o);
        for w in want {
            assert!(e.contains(w), "{args:?}: `{w}` not in: {e}");
        }
    };
    fails(&["pull", "--hf", "tiny/Gated-GGUF"], &[], &["https://huggingface.co/tiny/Gated-GGUF", "HF_TOKEN", "401"]);
    let o = hub.ktune(home.path()).env("HF_TOKEN", TOKEN).args(["pull", "--hf", "tiny/Gated-GGUF"]).output().expect("runs");
    assert!(o.status.success(), "with the token: {}", stderr(&o));

    fails(&["pull", "--hf", "tiny/BadSha-GGUF"], &[], &["SHA-256", "tiny-Q4_K_M.gguf", "deleted"]);
    let blobs = home.path().join("hf/hub/models--tiny--BadSha-GGUF/blobs");
    let left: Vec<_> = std::fs::read_dir(&blobs).expect("blobs").flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "nothing of the bad download is kept: {left:?}");

    fails(&["pull", "--hf", "tiny/Nothing"], &[], &["not found", "tiny/Nothing"]);
    fails(&["pull", "--hf", "tiny/Model-GGUF:Q6_K"], &[], &["Q6_K", "Q4_K_M", "Q8_0"]);
    fails(&["pull", "--hf", "not a repo"], &[], &["OWNER/NAME"]);
    fails(&["pull", "--hf", REPO], &[("HF_ENDPOINT", "http://127.0.0.1:9")], &["network failure", "HF_HUB_OFFLINE"]);
    fails(&["run", "--model", "smollm2-135m", "--prompt", "hi"], &[], &["--hf bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M"]);
}
