//! The hub client against a hostile stand-in hub (on 127.0.0.1, from
//! [`super::hub::listen`]): names that are paths out of the cache (absolute,
//! `..`, an existing system file as a blob id, a commit hash that climbs),
//! names with terminal escapes, a body longer than listed, a transfer that
//! trickles, a safetensors index naming shards outside, a revision that climbs,
//! and a cache planted with loops and links out. Each case is a `ktune pull`
//! in a sandbox folder; after it, the sandbox is walked: nothing may appear
//! outside `HF_HOME` and ktune's own cache, no link in `HF_HOME` may lead out
//! of it, and every refusal is exit 2 with one line naming what the hub sent.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use assert_cmd::Command;
use serde_json::{Value, json};

use super::hub::{listen, respond};
use crate::common::{ktune_in, tempdir};

const COMMIT: &str = "89abcdef0123456789abcdef0123456789abcdef";
const BLOB: &str = "0123456789abcdef0123456789abcdef01234567";

/// What the stand-in hub answers for a file's bytes.
#[derive(Clone)]
enum Body {
    /// These bytes, whole.
    Bytes(Vec<u8>),
    /// This many bytes of zeros, whatever the API listed.
    Zeros(usize),
    /// `chunk` bytes every `every`, for ever.
    Trickle { chunk: usize, every: Duration },
}

/// One hostile hub: its API answer and what every download gets.
struct Evil {
    port: u16,
    /// Every request as `METHOD TARGET`.
    log: Arc<Mutex<Vec<String>>>,
    /// Bytes of file bodies written to the socket without an error.
    sent: Arc<AtomicU64>,
}

impl Evil {
    fn start(api: Value, body: Body) -> Evil {
        let log = Arc::new(Mutex::new(Vec::new()));
        let sent = Arc::new(AtomicU64::new(0));
        let (l, n, api) = (log.clone(), sent.clone(), api.to_string());
        let port = listen(move |req, conn| {
            l.lock().expect("log").push(format!("{} {}", req.method, req.target));
            if req.path().starts_with("/api/models/") {
                respond(conn, "200 OK", &[("Content-Type", "application/json".into())], api.as_bytes(), false);
            } else if req.path().contains("/resolve/") {
                send_body(conn, &body, &n);
            } else {
                respond(conn, "404 Not Found", &[], b"{}", false);
            }
        });
        Evil { port, log, sent }
    }

    fn requests(&self) -> Vec<String> {
        self.log.lock().expect("log").clone()
    }
}

/// Writes `bytes`, counting them in `sent` when the write succeeds.
fn write_counted(conn: &mut TcpStream, bytes: &[u8], sent: &AtomicU64) -> bool {
    let ok = conn.write_all(bytes).is_ok();
    if ok {
        sent.fetch_add(bytes.len() as u64, Ordering::Relaxed);
    }
    ok
}

fn send_body(conn: &mut TcpStream, body: &Body, sent: &AtomicU64) {
    match body {
        Body::Bytes(b) => respond(conn, "200 OK", &[], b, false),
        Body::Zeros(n) => {
            let _ = conn.write_all(format!("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: {n}\r\n\r\n").as_bytes());
            let chunk = vec![0u8; 1 << 16];
            let mut left = *n;
            while left > 0 && write_counted(conn, &chunk[..left.min(chunk.len())], sent) {
                left -= left.min(chunk.len());
            }
        }
        Body::Trickle { chunk, every } => {
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");
            // Bounded: a client that never gives up would end the test here, not hang it.
            for _ in 0..2000 {
                if !write_counted(conn, &vec![b'x'; *chunk], sent) {
                    break;
                }
                std::thread::sleep(*every);
            }
        }
    }
}

/// A sandbox: `HF_HOME` and ktune's cache inside a folder whose every other
/// entry must stay as it was.
struct Sandbox {
    root: tempfile::TempDir,
}

impl Sandbox {
    fn new() -> Sandbox {
        let s = Sandbox { root: tempdir() };
        std::fs::create_dir_all(s.outside()).expect("outside");
        std::fs::write(s.outside().join("keep"), b"the user's file").expect("keep");
        s
    }

    fn path(&self) -> &Path {
        self.root.path()
    }

    fn hf(&self) -> PathBuf {
        self.path().join("hf")
    }

    /// A folder beside the caches the hostile names aim at.
    fn outside(&self) -> PathBuf {
        self.path().join("outside")
    }

    fn ktune(&self, port: u16) -> Command {
        let mut c = ktune_in(&self.path().join("ktune"));
        c.env("HF_HOME", self.hf()).env("HF_ENDPOINT", format!("http://127.0.0.1:{port}"));
        for k in ["HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN_PATH", "KTUNE_HUB_WINDOW_MS"] {
            c.env_remove(k);
        }
        c.timeout(Duration::from_secs(120));
        c
    }

    /// Every entry below the sandbox outside the two caches (links not
    /// followed), with its size; and every link in `HF_HOME` that leads out of it.
    fn outside_caches(&self) -> (BTreeMap<PathBuf, u64>, Vec<PathBuf>) {
        fn visit(dir: &Path, out: &mut Vec<(PathBuf, std::fs::Metadata)>) {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let Ok(m) = e.path().symlink_metadata() else { continue };
                if m.is_dir() {
                    visit(&e.path(), out);
                }
                out.push((e.path(), m));
            }
        }
        let mut all = Vec::new();
        visit(self.path(), &mut all);
        let (hf, ktune) = (self.hf(), self.path().join("ktune"));
        let hf_real = hf.canonicalize().unwrap_or(hf.clone());
        let outside: BTreeMap<PathBuf, u64> =
            all.iter().filter(|(p, _)| !p.starts_with(&hf) && !p.starts_with(&ktune)).map(|(p, m)| (p.clone(), m.len())).collect();
        let links_out = all
            .iter()
            .filter(|(p, m)| p.starts_with(&hf) && m.is_symlink())
            .filter(|(p, _)| p.canonicalize().is_ok_and(|t| !t.starts_with(&hf_real)))
            .map(|(p, _)| p.clone())
            .collect();
        (outside, links_out)
    }
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A GGUF repository's answer with one hostile field.
fn api_with(commit: &str, sibling: Value) -> Value {
    json!({"id": "evil/Repo-GGUF", "sha": commit, "siblings": [{"rfilename": "README.md", "size": 3, "blobId": BLOB}, sibling]})
}

/// Runs `pull --hf spec` against `evil` in `s`: the output, after checking that
/// nothing appeared outside the caches and no link leads out of `HF_HOME`.
fn pull(s: &Sandbox, evil: &Evil, spec: &str, env: &[(&str, &str)]) -> std::process::Output {
    let before = s.outside_caches().0;
    let mut c = s.ktune(evil.port);
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.args(["pull", "--hf", spec]).output().expect("runs");
    let (after, links_out) = s.outside_caches();
    assert_eq!(after, before, "{spec}: entries outside HF_HOME changed: {}", stderr(&o));
    assert!(links_out.is_empty(), "{spec}: links in HF_HOME lead out of it: {links_out:?}");
    o
}

/// A refusal: exit 2, one line on stderr besides progress, holding each of
/// `want`, and no raw escape character.
fn refused(o: &std::process::Output, want: &[&str]) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    // Progress lines (`ktune: [  0.0 s] downloading …`) aside.
    let lines: Vec<&str> = e.lines().filter(|l| !l.starts_with("ktune: [")).collect();
    assert_eq!(lines.len(), 1, "one line: {e}");
    assert!(!e.contains('\u{1b}'), "a raw escape reached the terminal: {e:?}");
    for w in want {
        assert!(e.contains(w), "`{w}` not in: {e}");
    }
}

/// The generated set: every hostile value in every field that names a path
/// (the blob id, the LFS SHA-256, the file name, the commit), each refused
/// before anything is written for it.
#[test]
fn hostile_names_from_the_hub_never_become_paths() {
    let s = Sandbox::new();
    let root = s.path().display().to_string();
    let etc = "/etc/hostname";
    let climbs = ["../../../../outside/pwned", "../../../../../../../../../../../../tmp/ktune-pwned"];
    let absolute = format!("{root}/outside/pwned");
    let mut cases: Vec<(String, Value, &str)> = Vec::new();
    for bad in [absolute.as_str(), climbs[0], climbs[1], etc, "0123456789ABCDEF0123456789ABCDEF01234567", ""] {
        let file = json!({"rfilename": "m-Q4_K_M.gguf", "size": 4, "blobId": bad});
        cases.push((format!("blobId {bad}"), api_with(COMMIT, file), "blob id"));
        let file = json!({"rfilename": "m-Q4_K_M.gguf", "size": 4, "blobId": BLOB, "lfs": {"sha256": bad, "size": 4}});
        cases.push((format!("lfs.sha256 {bad}"), api_with(COMMIT, file), "SHA-256"));
    }
    let names = [
        format!("{root}/outside/m-Q4_K_M.gguf"),
        "../../../../../outside/m-Q4_K_M.gguf".into(),
        "Q4/../../../../../../outside/m-Q4_K_M.gguf".into(),
        "Q4/./m-Q4_K_M.gguf".into(),
        "Q4//m-Q4_K_M.gguf".into(),
        "..\\..\\outside\\m-Q4_K_M.gguf".into(),
        "m\u{1b}]0;pwned\u{7}\u{1b}[2J-Q4_K_M.gguf".into(),
        "m\0-Q4_K_M.gguf".into(),
        String::new(),
    ];
    for bad in &names {
        let file = json!({"rfilename": bad, "size": 4, "blobId": BLOB});
        cases.push((format!("rfilename {bad:?}"), api_with(COMMIT, file), "file name"));
    }
    for bad in ["../../../../outside", absolute.as_str(), "0123456789abcdef0123456789abcdef0123456"] {
        let file = json!({"rfilename": "m-Q4_K_M.gguf", "size": 4, "blobId": BLOB});
        cases.push((format!("sha {bad}"), api_with(bad, file), "commit hash"));
    }
    for (label, api, what) in cases {
        let evil = Evil::start(api, Body::Bytes(b"GGUF".to_vec()));
        let o = pull(&s, &evil, "evil/Repo-GGUF", &[]);
        refused(&o, &["refused", what]);
        assert!(!evil.requests().iter().any(|r| r.contains("/resolve/")), "{label}: nothing is downloaded: {:?}", evil.requests());
    }
    assert!(!Path::new("/tmp/ktune-pwned").exists());
}

/// The same file list with sane names downloads, and is what the hostile
/// cases differ from (a stand-in that fails everything would pass the above).
#[test]
fn the_same_hub_with_sane_names_downloads() {
    let s = Sandbox::new();
    let file = json!({"rfilename": "Q4/m-Q4_K_M.gguf", "size": 4, "blobId": BLOB});
    let evil = Evil::start(api_with(COMMIT, file), Body::Bytes(b"GGUF".to_vec()));
    let o = pull(&s, &evil, "evil/Repo-GGUF", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let link = s.hf().join(format!("hub/models--evil--Repo-GGUF/snapshots/{COMMIT}/Q4/m-Q4_K_M.gguf"));
    assert_eq!(std::fs::read(&link).expect("the snapshot's file"), b"GGUF");
    assert_eq!(std::fs::read_link(&link).expect("a link"), PathBuf::from(format!("../../../blobs/{BLOB}")));
}

/// `--hf repo@../../x` is refused before any request, naming the revision.
#[test]
fn a_revision_that_climbs_is_refused_before_any_request() {
    let s = Sandbox::new();
    let evil = Evil::start(api_with(COMMIT, json!({"rfilename": "m.gguf", "size": 4, "blobId": BLOB})), Body::Bytes(b"GGUF".to_vec()));
    for rev in ["../../../../outside/x", "main/../../../x", "/abs", "a\u{1b}[2J"] {
        let o = pull(&s, &evil, &format!("evil/Repo-GGUF@{rev}"), &[]);
        refused(&o, &["revision", "branch, tag or commit"]);
    }
    assert!(evil.requests().is_empty(), "{:?}", evil.requests());
    assert!(!s.hf().exists(), "nothing is created for a refused spec");
}

/// A body longer than the listed size stops one byte past it: an error naming
/// the listed size, nothing of it kept, and the hub could not send it all.
#[test]
fn a_body_longer_than_listed_stops_at_the_listed_size() {
    let s = Sandbox::new();
    let sha = "a".repeat(64);
    let file = json!({"rfilename": "m-Q4_K_M.gguf", "size": 1000, "blobId": BLOB, "lfs": {"sha256": sha, "size": 1000}});
    let huge = 256 << 20;
    let evil = Evil::start(api_with(COMMIT, file), Body::Zeros(huge));
    let o = pull(&s, &evil, "evil/Repo-GGUF", &[]);
    refused(&o, &["more than the 1000 bytes", "m-Q4_K_M.gguf"]);
    std::thread::sleep(Duration::from_millis(200));
    let sent = evil.sent.load(Ordering::Relaxed);
    assert!(sent < (huge as u64) / 4, "the client stopped reading: the hub wrote {sent} of {huge} bytes");
    let blobs = s.hf().join("hub/models--evil--Repo-GGUF/blobs");
    let left: Vec<_> = std::fs::read_dir(&blobs).expect("blobs").flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "nothing of the long body is kept: {left:?}");
}

/// A transfer slower than the floor is dropped, resumed, and fails with its
/// rate (the window shortened by the hidden KTUNE_HUB_WINDOW_MS).
#[test]
fn a_trickling_transfer_fails_with_its_rate() {
    let s = Sandbox::new();
    let file = json!({"rfilename": "m-Q4_K_M.gguf", "size": 100_000, "blobId": BLOB});
    let evil = Evil::start(api_with(COMMIT, file), Body::Trickle { chunk: 16, every: Duration::from_millis(40) });
    let o = pull(&s, &evil, "evil/Repo-GGUF", &[("KTUNE_HUB_WINDOW_MS", "400")]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    let last = e.trim_end().lines().last().unwrap_or_default();
    assert!(last.contains("transfer too slow") && last.contains("B/s") && last.contains("1024 B/s"), "{e}");
    let gets = evil.requests().iter().filter(|r| r.contains("/resolve/")).count();
    assert_eq!(gets, 4, "retried, then failed: {:?}", evil.requests());
}

/// A safetensors index naming a shard outside the snapshot is refused.
#[test]
fn an_index_naming_shards_outside_is_refused() {
    let s = Sandbox::new();
    let index = json!({"weight_map": {"w": "../../../../../outside/model.safetensors"}}).to_string().into_bytes();
    let api = json!({"id": "evil/Repo", "sha": COMMIT, "siblings": [
        {"rfilename": "config.json", "size": index.len(), "blobId": BLOB},
        {"rfilename": "model.safetensors.index.json", "size": index.len(), "blobId": "1123456789abcdef0123456789abcdef01234567"},
        {"rfilename": "model.safetensors", "size": index.len(), "blobId": "2123456789abcdef0123456789abcdef01234567"},
    ]});
    let evil = Evil::start(api, Body::Bytes(index));
    let o = pull(&s, &evil, "evil/Repo", &[]);
    refused(&o, &["shard name", "outside/model.safetensors", "refused"]);
}

/// A cached snapshot planted with `.` links (a loop a following walk takes
/// 3^depth paths through) and a link to a file outside the cache: the offline
/// walk ends at once and counts neither.
#[test]
fn a_cached_snapshot_with_loops_and_links_out_is_walked_safely() {
    let s = Sandbox::new();
    let repo = s.hf().join("hub/models--evil--Loop-GGUF");
    let snap = repo.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(&snap).expect("snapshot");
    std::fs::create_dir_all(repo.join("refs")).expect("refs");
    std::fs::write(repo.join("refs/main"), COMMIT).expect("ref");
    for l in ["a", "b", "c"] {
        std::os::unix::fs::symlink(".", snap.join(l)).expect("loop");
    }
    std::fs::write(s.outside().join("m-Q4_K_M.gguf"), b"GGUF").expect("outside file");
    std::os::unix::fs::symlink(s.outside().join("m-Q4_K_M.gguf"), snap.join("m-Q4_K_M.gguf")).expect("link out");
    let evil = Evil::start(json!({}), Body::Bytes(Vec::new()));
    let o = s
        .ktune(evil.port)
        .env("HF_HUB_OFFLINE", "1")
        .args(["--device", "cpu", "run", "--hf", "evil/Loop-GGUF", "--tokens", "1", "--max-tokens", "1"])
        .output()
        .expect("runs");
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("not in the cache") && e.contains("no files"), "the link out does not count: {e}");
}

/// A folder of the cache planted as a link out of it: the download refuses to
/// write through it.
#[test]
fn a_cache_folder_linked_out_is_not_written_through() {
    let s = Sandbox::new();
    let repo = s.hf().join("hub/models--evil--Repo-GGUF");
    std::fs::create_dir_all(&repo).expect("repo");
    let target = s.outside().join("blobs");
    std::fs::create_dir_all(&target).expect("target");
    std::os::unix::fs::symlink(&target, repo.join("blobs")).expect("planted link");
    let evil =
        Evil::start(api_with(COMMIT, json!({"rfilename": "m-Q4_K_M.gguf", "size": 4, "blobId": BLOB})), Body::Bytes(b"GGUF".to_vec()));
    let mut c = s.ktune(evil.port);
    let o = c.args(["pull", "--hf", "evil/Repo-GGUF"]).output().expect("runs");
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("outside the hub cache"), "{e}");
    assert_eq!(std::fs::read_dir(&target).expect("target").count(), 0, "nothing was written through the link");
}
