//! The crash-free property at the command line (issue 33): the built binary run
//! over a generated set of hostile inputs, files and flag values, each case
//! asserting that the process
//! - exits with 0, 1 or 2 (never 101, a panic, nor a signal such as the abort
//!   of a failed allocation, 134);
//! - ends: a liveness guard kills it past a wall limit (a hang, not a timing claim);
//! - stays within a memory bound (its peak RSS, from `wait4`; the guard also
//!   kills a run whose memory passes the bound, as a run reading `/dev/zero`
//!   did, so a failure cannot take the machine's memory);
//! - writes nothing outside the cache (under a temporary `HOME` and
//!   `XDG_CACHE_HOME`) and the output it was told to write (the tree is compared).
//!
//! The inputs: every file flag given a directory, a device, a FIFO, an empty and
//! a garbage file, truncated models and bundles; bundles that amplify (a zstd
//! bomb, a GNU long name, one file listed thousands of times, duplicate
//! entries, every entry skipped); profiles with multibyte fields and YAML past
//! the parser's limits; every numeric flag zero, negative, huge and past its
//! type. GPU adapters are hidden (`WGPU_BACKEND=none`): the cases run on the
//! CPU, and a run starts in milliseconds. Beside the property, one regression test per class of the issue, and a
//! scan of the display code for byte-offset string cuts (`ktune::text` is the
//! one place that shortens text).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::fixture;

/// The liveness guard: a case still running after this is killed (and fails).
const WALL: Duration = Duration::from_secs(60);
/// The memory bound of one case (peak RSS), bytes.
const MAX_RSS: u64 = 1 << 30;

/// How one run of the binary ended.
struct Ended {
    /// The exit code, or None when a signal ended it.
    code: Option<i32>,
    signal: Option<i32>,
    /// Killed by the guard: past the wall limit or the memory bound.
    hung: bool,
    peak_rss: u64,
    stderr: String,
}

/// A temporary home for the runs: `root/` is what a run may see and change
/// (`home/` with the cache under `home/.cache/ktune`, `work/` the current
/// directory holding the inputs, `out/` for named outputs); logs live beside it.
struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    fn new() -> Sandbox {
        let s = Sandbox { dir: tempfile::tempdir().expect("tempdir") };
        for d in ["root/home/.cache", "root/work", "root/out", "logs"] {
            std::fs::create_dir_all(s.dir.path().join(d)).expect("mkdir");
        }
        s
    }
    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }
    fn work(&self) -> PathBuf {
        self.root().join("work")
    }
    fn cache(&self) -> PathBuf {
        self.root().join("home/.cache/ktune")
    }
    /// Writes an input file under `work/`.
    fn input(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.work().join(name);
        std::fs::write(&p, bytes).expect("write input");
        p
    }

    /// Runs ktune with `args` (`log` names its stderr file), guarded.
    fn run(&self, log: &str, args: &[String]) -> Ended {
        self.run_within(log, args, None)
    }

    /// [`Sandbox::run`], with `max_file` a limit on the size of every file
    /// the run writes (`RLIMIT_FSIZE`, `SIGXFSZ` ignored): a write past it
    /// fails with `EFBIG` as one on a full disk fails with `ENOSPC`.
    fn run_within(&self, log: &str, args: &[String], max_file: Option<u64>) -> Ended {
        use std::os::unix::process::CommandExt;
        let err_path = self.dir.path().join("logs").join(format!("{log}.stderr"));
        let err = std::fs::File::create(&err_path).expect("log");
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ktune"));
        if let Some(max) = max_file {
            // SAFETY: only async-signal-safe calls between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let lim = libc::rlimit { rlim_cur: max, rlim_max: max };
                    if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 || libc::signal(libc::SIGXFSZ, libc::SIG_IGN) == libc::SIG_ERR {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        // Reaped below by wait4, which also gives its peak RSS.
        #[allow(clippy::zombie_processes)]
        let child = cmd
            .args(args)
            .current_dir(self.work())
            .env("HOME", self.root().join("home"))
            .env("XDG_CACHE_HOME", self.root().join("home/.cache"))
            .env_remove("KTUNE_CACHE_DIR")
            // No GPU adapter is looked for: every case runs on the CPU.
            .env("WGPU_BACKEND", "none")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("spawns ktune");
        let pid = child.id() as libc::pid_t;
        // The child's exec recorded this process's high-water RSS as the
        // child's own maximum (Linux keeps the old memory's peak across exec,
        // and a spawned child ran on this process's memory until then): a
        // `ru_maxrss` at or below it says nothing of the child, whose own peak
        // then comes from polling its `VmHWM`.
        let inherited = status_kb(std::process::id() as libc::pid_t, "VmHWM:");
        let mut polled = 0;
        let t0 = Instant::now();
        let mut status = 0;
        // SAFETY: a zeroed rusage is a valid value for wait4 to fill.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let mut hung = false;
        loop {
            // SAFETY: `pid` is our child, not yet reaped (std's Child is never waited on).
            let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
            if r == pid {
                break;
            }
            assert_eq!(r, 0, "wait4 failed: {}", std::io::Error::last_os_error());
            // Killed past the wall limit, or past the memory bound (a run that
            // reads a device without end would take the shared machine's memory).
            polled = polled.max(status_kb(pid, "VmHWM:"));
            let over = t0.elapsed() > WALL || status_kb(pid, "VmRSS:") > MAX_RSS;
            if over && !hung {
                hung = true;
                // SAFETY: signalling our own unreaped child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let (code, signal) = if libc::WIFEXITED(status) {
            (Some(libc::WEXITSTATUS(status)), None)
        } else {
            (None, libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)))
        };
        Ended {
            code,
            signal,
            hung,
            // Linux reports kilobytes.
            peak_rss: if usage.ru_maxrss as u64 * 1024 > inherited { usage.ru_maxrss as u64 * 1024 } else { polled },
            stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
        }
    }
}

/// A memory figure of process `pid` from its `/proc` status (`field`:
/// `VmRSS:` now, `VmHWM:` its peak), bytes; 0 once it is gone.
fn status_kb(pid: libc::pid_t, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = status.lines().find_map(|l| l.strip_prefix(field)).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
    kb.unwrap_or(0) * 1024
}

/// Every file under `root` with its size and modification time (a directory
/// by its presence: creating the cache changes its parent's time), except the
/// cache and `out/` (where runs may write).
fn tree(root: &Path, sandbox: &Sandbox) -> BTreeMap<PathBuf, (u64, std::time::SystemTime)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let p = e.path();
            if p.starts_with(sandbox.cache()) || p.starts_with(sandbox.root().join("out")) {
                continue;
            }
            let Ok(m) = std::fs::symlink_metadata(&p) else { continue };
            if m.is_dir() {
                stack.push(p.clone());
                out.insert(p, (0, std::time::SystemTime::UNIX_EPOCH));
            } else {
                out.insert(p, (m.len(), m.modified().expect("mtime")));
            }
        }
    }
    out
}

/// A `.tar.zst` of `entries`: (name, tar entry type, bytes); a name longer
/// than the header's 100 bytes goes as a GNU long name.
fn bundle(entries: &[(&str, tar::EntryType, &[u8])]) -> Vec<u8> {
    let mut t = tar::Builder::new(Vec::new());
    for (name, ty, bytes) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(*ty);
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        if *ty == tar::EntryType::Symlink {
            h.set_link_name("/etc/passwd").expect("link");
        }
        t.append_data(&mut h, name, *bytes).expect("append");
    }
    let raw = t.into_inner().expect("tar");
    ruzstd::encoding::compress_to_vec(raw.as_slice(), ruzstd::encoding::CompressionLevel::Fastest)
}

/// A zstd frame of `head` stored raw, then `zeros` zero bytes as RLE blocks of
/// four bytes each: a few kB that decompress to hundreds of MiB.
fn zstd_bomb(head: &[u8], zeros: usize) -> Vec<u8> {
    const BLOCK: usize = 128 << 10;
    // Magic, a frame header without content size, a 128 KiB window.
    let mut out = vec![0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x38];
    let block = |out: &mut Vec<u8>, last: bool, ty: u32, size: usize| {
        let v = last as u32 | (ty << 1) | ((size as u32) << 3);
        out.extend(&v.to_le_bytes()[..3]);
    };
    block(&mut out, false, 0, head.len());
    out.extend(head);
    let mut left = zeros;
    while left > 0 {
        let n = left.min(BLOCK);
        left -= n;
        block(&mut out, left == 0, 1, n);
        out.push(0);
    }
    out
}

fn sha256(bytes: &[u8]) -> String {
    ktune::hash::sha256_hex(bytes)
}

/// A manifest listing `profiles`: (key, file, sha256).
fn manifest(profiles: &[(String, String, String)]) -> Vec<u8> {
    let entries: Vec<serde_json::Value> = profiles
        .iter()
        .map(|(key, file, sha)| {
            serde_json::json!({"key": key, "file": file, "sha256": sha, "model": "m", "device_name": "d",
                "fingerprint": "f", "kernel_set": "k"})
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({"format": "ktune-bundle", "version": 1, "ktune_version": "0", "kernel_set": "k",
        "profiles": entries}))
    .expect("json")
}

/// The snapshot profile with multibyte text where a byte-offset cut once fell
/// (fingerprint, kernel set: one ASCII letter first, so bytes 8 and 12 fall
/// inside a character), and no device class.
fn multibyte_profile() -> String {
    let a = std::fs::read_to_string(fixture("profiles/a.yaml")).expect("a.yaml");
    a.replace("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "aéééééééééééééééééééé")
        .replace("fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210", "x🦀🦀🦀🦀🦀🦀")
        .replace("device_name: Snapshot CPU", "device_name: Ünïcödé ÇPU")
}

/// A GGUF image with no tensors and `kv` metadata: (key, type id, value bytes).
fn gguf(kv: &[(&str, u32, Vec<u8>)]) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(0u64.to_le_bytes());
    out.extend((kv.len() as u64).to_le_bytes());
    for (k, ty, v) in kv {
        out.extend((k.len() as u64).to_le_bytes());
        out.extend(k.as_bytes());
        out.extend(ty.to_le_bytes());
        out.extend(v);
    }
    out
}

/// A GGUF array value of `n` u8 elements.
fn u8_array(n: usize) -> Vec<u8> {
    let mut v = 0u32.to_le_bytes().to_vec();
    v.extend((n as u64).to_le_bytes());
    v.resize(v.len() + n, 7);
    v
}

/// The hostile files, by name, written into the sandbox.
struct Inputs {
    files: BTreeMap<&'static str, PathBuf>,
}

impl Inputs {
    fn new(s: &Sandbox) -> Inputs {
        let mut files = BTreeMap::new();
        files.insert("dir", s.work().join("a-directory"));
        std::fs::create_dir_all(&files["dir"]).expect("dir");
        files.insert("device", PathBuf::from("/dev/zero"));
        let fifo = s.work().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        files.insert("fifo", fifo);
        files.insert("missing", s.work().join("no-such-file"));
        files.insert("empty", s.input("empty", b""));
        files.insert("text", s.input("text.txt", "The kernel tuner runs every variant. ".repeat(40).as_bytes()));
        files.insert("garbage", s.input("garbage", &(0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect::<Vec<_>>()));
        let tiny = std::fs::read(fixture("gguf/smollm2-tiny-f16.gguf")).expect("fixture");
        files.insert("gguf-truncated", s.input("truncated.gguf", &tiny[..tiny.len() / 3]));
        files.insert("gguf-metadata-16m", s.input("meta.gguf", &gguf(&[("junk.bytes", 9, u8_array(16 << 20))])));
        files.insert("profile-multibyte", s.input("multibyte.yaml", multibyte_profile().as_bytes()));
        let deep = format!("name: x\nmodel: m\nversion: 1\ndevice: {}{}\n", "[".repeat(200), "]".repeat(200));
        files.insert("profile-deep", s.input("deep.yaml", deep.as_bytes()));
        let many =
            format!("name: x\nmodel: m\nversion: 1\nlayers:\n{}", (0..260_000).map(|i| format!("  {i}: {{}}\n")).collect::<String>());
        files.insert("profile-many-nodes", s.input("many.yaml", many.as_bytes()));
        files.insert("profile-dup-key", s.input("dup.yaml", b"name: x\nmodel: m\nname: y\nversion: 1\n"));
        // Bundles.
        let key = |c: char| c.to_string().repeat(64);
        let text = multibyte_profile();
        let good = (key('a'), "profiles/a.yaml".to_string(), sha256(text.as_bytes()));
        let mb_manifest = manifest(std::slice::from_ref(&good));
        // The manifest `listing` and the one profile as `profiles/a.yaml`.
        let one_profile = |listing: &[u8]| {
            bundle(&[
                ("ktune-bundle.json", tar::EntryType::Regular, listing),
                ("profiles/a.yaml", tar::EntryType::Regular, text.as_bytes()),
            ])
        };
        files.insert("bundle-multibyte", s.input("multibyte.tar.zst", &one_profile(&mb_manifest)));
        let repeated: Vec<_> = (0..5000).map(|_| good.clone()).collect();
        files.insert("bundle-repeated", s.input("repeated.tar.zst", &one_profile(&manifest(&repeated))));
        let skipped = manifest(&[
            (key('b'), "profiles/b.yaml".into(), "0".repeat(64)),
            (key('c'), "profiles/c.yaml".into(), sha256(b"")),
            (key('d'), "profiles/missing.yaml".into(), sha256(b"")),
        ]);
        files.insert(
            "bundle-all-skipped",
            s.input(
                "skipped.tar.zst",
                &bundle(&[
                    ("ktune-bundle.json", tar::EntryType::Regular, skipped.as_slice()),
                    ("profiles/b.yaml", tar::EntryType::Regular, b"name: x\n".as_slice()),
                    ("profiles/c.yaml", tar::EntryType::Symlink, b"".as_slice()),
                ]),
            ),
        );
        files.insert(
            "bundle-duplicate-entry",
            s.input(
                "dup.tar.zst",
                &bundle(&[
                    ("ktune-bundle.json", tar::EntryType::Regular, mb_manifest.as_slice()),
                    ("profiles/a.yaml", tar::EntryType::Regular, text.as_bytes()),
                    ("profiles/a.yaml", tar::EntryType::Regular, text.as_bytes()),
                ]),
            ),
        );
        let long = "x".repeat(8 << 20);
        files.insert("bundle-long-name", s.input("long.tar.zst", &bundle(&[(long.as_str(), tar::EntryType::Regular, b"x".as_slice())])));
        // A directory entry whose header claims 300 MiB of data, the zeros as RLE blocks.
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_path("d").expect("path");
        h.set_size(300 << 20);
        h.set_cksum();
        files.insert("bundle-bomb", s.input("bomb.tar.zst", &zstd_bomb(h.as_bytes(), 300 << 20)));
        let whole = one_profile(&mb_manifest);
        files.insert("bundle-truncated", s.input("cut.tar.zst", &whole[..whole.len() / 2]));
        Inputs { files }
    }
    fn get(&self, name: &str) -> String {
        self.files[name].display().to_string()
    }
}

/// A case: its label and arguments.
type Case = (String, Vec<String>);

/// Adds the case `label` of `args`.
fn push(v: &mut Vec<Case>, label: String, args: &[&str]) {
    v.push((label, args.iter().map(|s| s.to_string()).collect()));
}

/// Adds one case per (flag, value): `base` with the flag and its value.
fn flagged(v: &mut Vec<Case>, command: &str, base: &[&str], values: &[(&str, &str)]) {
    for (flag, n) in values {
        let args: Vec<&str> = base.iter().copied().chain([*flag, *n]).collect();
        push(v, format!("{command} {flag} {n}"), &args);
    }
}

/// The hostile cases.
fn cases(inputs: &Inputs) -> Vec<Case> {
    let tiny = fixture("gguf/smollm2-tiny-f16.gguf").display().to_string();
    let mut v: Vec<Case> = Vec::new();
    // A flag given twice is clap's error: the base leaves out what the cases vary.
    let run = ["run", "--device", "cpu", "--gguf", tiny.as_str(), "--tokens", "1,2"];
    // Every numeric flag of `run`, past, at and beyond its bounds.
    let numbers = ["0", "-1", "4294967297", "18446744073709551615", "99999999999999999999", "nan", "1e30"];
    let run_flags = [
        "--max-tokens",
        "--context",
        "--prefill-chunk",
        "--top-k",
        "--repeat-last-n",
        "--layers",
        "--temperature",
        "--top-p",
        "--min-p",
        "--repeat-penalty",
        "--seed",
    ];
    let mut pairs: Vec<(&str, &str)> = run_flags.iter().flat_map(|f| numbers.iter().map(move |n| (*f, *n))).collect();
    pairs.extend([("--tokens", "4294967295"), ("--tokens", "-3"), ("--max-tokens", "1000000")]);
    flagged(&mut v, "run", &run, &pairs);
    // `tune`, `bench`, `eval`, `diff-profiles`: numbers refused before any work.
    let tune = ["tune", "--device", "cpu", "--gguf", tiny.as_str(), "--budget", "2s"];
    let tune_values = [
        ("--context", "0"),
        ("--context", "4294967297"),
        ("--context", "18446744073709551615"),
        ("--prefill-tokens", "0"),
        ("--prefill-tokens", "99999999999999999999"),
        ("--gpu-l2-bytes", "18446744073709551615G"),
        ("--max-kld", "nan"),
        ("--layers", "0"),
        ("--layers", "4294967297"),
    ];
    flagged(&mut v, "tune", &tune, &tune_values);
    flagged(&mut v, "tune", &tune[..5], &[("--budget", "1e30"), ("--budget", "-5m"), ("--budget", "0"), ("--budget", "9999999999h")]);
    let bench = ["bench", "--device", "cpu", "--gguf", tiny.as_str(), "--no-profile"];
    let bench_values = [
        ("--rounds", "0"),
        ("--rounds", "-1"),
        ("--prefill-tokens", "18446744073709551615"),
        ("--decode-tokens", "18446744073709551615"),
        ("--prefill-tokens", "4294967297"),
    ];
    flagged(&mut v, "bench", &bench, &bench_values);
    let text = inputs.get("text");
    let eval = ["eval", "--device", "cpu", "--gguf", tiny.as_str(), "--file", text.as_str()];
    flagged(&mut v, "eval", &eval, &[("--ctx", "0"), ("--ctx", "4294967297"), ("--chunks", "0"), ("--ctx", "18446744073709551615")]);
    let mb = inputs.get("profile-multibyte");
    let diff = ["diff-profiles", mb.as_str(), mb.as_str()];
    flagged(&mut v, "diff-profiles", &diff, &[("--threshold", "1e400"), ("--threshold", "-5"), ("--threshold", "nan")]);
    // Every file flag, given every hostile file of its kind and the others.
    let files = ["dir", "device", "fifo", "missing", "empty", "garbage"];
    for f in files.iter().chain(&["gguf-truncated"]) {
        let p = inputs.get(f);
        push(&mut v, format!("run --gguf {f}"), &["run", "--device", "cpu", "--gguf", &p, "--tokens", "1"]);
        push(
            &mut v,
            format!("run --mmproj {f}"),
            &["run", "--device", "cpu", "--gguf", &tiny, "--mmproj", &p, "--image", &p, "--tokens", "1"],
        );
        push(&mut v, format!("run --image {f}"), &["run", "--device", "cpu", "--gguf", &tiny, "--image", &p, "--tokens", "1"]);
    }
    for f in files.iter().chain(&["profile-multibyte", "profile-deep", "profile-many-nodes", "profile-dup-key"]) {
        let p = inputs.get(f);
        flagged(&mut v, "run", &run, &[("--profile", &p)]);
        push(&mut v, format!("diff-profiles {f}"), &["diff-profiles", &p, &mb]);
        push(&mut v, format!("report {f}"), &["report", &p, "-o", "../out/r.html"]);
        push(&mut v, format!("profiles show {f}"), &["profiles", "show", &p]);
    }
    for f in files {
        let p = inputs.get(f);
        let chat = ["run", "--device", "cpu", "--gguf", tiny.as_str(), "--prompt", "hi", "--chat"];
        flagged(&mut v, "run", &chat, &[("--chat-template", &p)]);
        flagged(&mut v, "eval", &eval[..5], &[("--file", &p)]);
        flagged(&mut v, "eval", &eval, &[("--reference", &p)]);
    }
    let bundles = [
        "bundle-multibyte",
        "bundle-repeated",
        "bundle-all-skipped",
        "bundle-duplicate-entry",
        "bundle-long-name",
        "bundle-bomb",
        "bundle-truncated",
    ];
    for f in files.iter().chain(&bundles) {
        let p = inputs.get(f);
        push(&mut v, format!("profiles import {f}"), &["profiles", "import", &p]);
        push(&mut v, format!("profiles merge {f}"), &["profiles", "merge", &p, "-o", "../out/m.tar.zst"]);
        push(&mut v, format!("diff-profiles bundle {f}"), &["diff-profiles", &p, &inputs.get("bundle-multibyte")]);
    }
    // After an import of multibyte fields, the commands that read the cache.
    push(&mut v, "profiles list".into(), &["profiles", "list"]);
    push(&mut v, "profiles export".into(), &["profiles", "export", "-o", "../out/e.tar.zst"]);
    push(&mut v, "run (cache lookup)".into(), &run);
    v
}

/// The property: every hostile case ends in time, with 0, 1 or 2, within the
/// memory bound, writing only to the cache and `out/`.
#[test]
fn no_hostile_input_crashes_hangs_or_writes_outside_the_cache() {
    let s = Sandbox::new();
    let inputs = Inputs::new(&s);
    let all = cases(&inputs);
    let before = tree(&s.root(), &s);
    // A few at a time (the machine has 2 cores; most cases end at validation).
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((label, args)) = all.get(i) else { break };
                    let e = s.run(&format!("case{i}"), args);
                    let mut why = Vec::new();
                    if e.hung {
                        why.push(format!("killed: still running after {WALL:?}, or past {} MiB", MAX_RSS >> 20));
                    } else if !matches!(e.code, Some(0..=2)) {
                        why.push(format!("exit {:?}, signal {:?}", e.code, e.signal));
                    }
                    if e.peak_rss > MAX_RSS {
                        why.push(format!("peak RSS {} MiB", e.peak_rss >> 20));
                    }
                    if e.stderr.lines().any(|l| l.len() > 64 << 10) {
                        why.push("an error line longer than 64 KiB".into());
                    }
                    if !why.is_empty() {
                        let tail: String = e.stderr.chars().rev().take(600).collect::<Vec<_>>().into_iter().rev().collect();
                        failures.lock().expect("lock").push(format!("{label}: {}\n  stderr: …{tail}", why.join("; ")));
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().expect("lock");
    assert!(failures.is_empty(), "{} of {} hostile cases failed:\n{}", failures.len(), all.len(), failures.join("\n"));
    assert_eq!(tree(&s.root(), &s), before, "a run wrote outside the cache and out/");
}

/// The messages of a few cases, and the classes' regressions, one run each.
fn one(s: &Sandbox, args: &[&str]) -> Ended {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    s.run("one", &args)
}

/// Class 1: multibyte profile fields once panicked `run --profile`,
/// `profiles import` (a stale profile's note) and `diff-profiles` of bundles.
#[test]
fn multibyte_profile_fields_are_shown_not_cut_mid_character() {
    let s = Sandbox::new();
    let inputs = Inputs::new(&s);
    let tiny = fixture("gguf/smollm2-tiny-f16.gguf").display().to_string();
    let mb = inputs.get("profile-multibyte");
    let e = one(&s, &["run", "--device", "cpu", "--gguf", &tiny, "--tokens", "1", "--max-tokens", "1", "--profile", &mb]);
    assert_eq!(e.code, Some(0), "{}", e.stderr);
    assert!(e.stderr.contains("ééééé"), "the fingerprint is shown: {}", e.stderr);
    let b = inputs.get("bundle-multibyte");
    let e = one(&s, &["profiles", "import", &b]);
    assert_eq!(e.code, Some(0), "{}", e.stderr);
    let e = one(&s, &["diff-profiles", &b, &b]);
    assert!(matches!(e.code, Some(0 | 1)), "{}", e.stderr);
}

/// Class 1's lint: the display code cuts text only through `ktune::text`
/// (a byte-offset cut of a multibyte character panics).
#[test]
fn display_code_cuts_text_only_through_the_text_module() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    // A range index whose bound is computed from a length or a char boundary, or a
    // literal cut of a borrowed string.
    let cut = regex::Regex::new(r"\[\s*\.\.[^\]]*(\.len\(\)\.min\(|_char_boundary)|&[A-Za-z_][\w.()]*\[\.\.\d+\]").expect("regex");
    let mut found = Vec::new();
    for dir in ["profile", "output", "commands", "model", "report.rs", "session.rs", "app.rs", "error.rs"] {
        let mut stack = vec![src.join(dir)];
        while let Some(p) = stack.pop() {
            if p.is_dir() {
                stack.extend(std::fs::read_dir(&p).expect("src").flatten().map(|e| e.path()));
                continue;
            }
            let text = std::fs::read_to_string(&p).expect("source");
            // Byte buffers (file headers) are not text: the model readers' literal cuts are of bytes.
            let literal_ok = p.starts_with(src.join("model"));
            for (n, line) in text.split("#[cfg(test)]").next().unwrap_or("").lines().enumerate() {
                for m in cut.find_iter(line) {
                    if literal_ok && !m.as_str().contains("len()") && !m.as_str().contains("boundary") {
                        continue;
                    }
                    found.push(format!("{}:{}: {}", p.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(found.is_empty(), "cut text with ktune::text::prefix / shorten instead:\n{}", found.join("\n"));
}

/// Class 2: `--context` and `--max-tokens` past the model once aborted on a
/// failed allocation (exit 134) or panicked on an overflowing KV size.
#[test]
fn context_and_max_tokens_past_the_model_are_refused_naming_the_limit() {
    let s = Sandbox::new();
    let tiny = fixture("gguf/smollm2-tiny-f16.gguf").display().to_string();
    let run = ["run", "--device", "cpu", "--gguf", tiny.as_str(), "--tokens", "1,2"];
    let with = |extra: &[&str]| one(&s, &run.iter().chain(extra).copied().collect::<Vec<_>>());
    let e = with(&["--context", "99999999999999999"]);
    assert_eq!(e.code, Some(2), "{}", e.stderr);
    assert!(e.stderr.contains("--context") && e.stderr.contains("max_position_embeddings"), "{}", e.stderr);
    let e = with(&["--max-tokens", "18446744073709551615"]);
    assert_eq!(e.code, Some(2), "{}", e.stderr);
    assert!(e.stderr.contains("--max-tokens") && e.stderr.contains("positions"), "{}", e.stderr);
    let e = with(&["--context", "8", "--max-tokens", "7"]);
    assert_eq!(e.code, Some(2), "{}", e.stderr);
    assert!(e.stderr.contains("leaves room for 6 tokens"), "{}", e.stderr);
    let e = with(&["--context", "8", "--max-tokens", "6"]);
    assert_eq!(e.code, Some(0), "{}", e.stderr);
}

/// Class 3: bundles that amplify or say nothing. One file listed thousands of
/// times, a GNU long name of megabytes, a zstd bomb, an entry twice: each refused
/// quickly with the limit named; every entry skipped: exit 2 with the reasons.
#[test]
fn bundles_are_bounded_and_an_import_of_nothing_fails() {
    let s = Sandbox::new();
    let inputs = Inputs::new(&s);
    let import = |name: &str| one(&s, &["profiles", "import", &inputs.get(name)]);
    let e = import("bundle-repeated");
    assert_eq!(e.code, Some(2), "{}", e.stderr);
    assert!(e.stderr.contains("more than the 4096") || e.stderr.contains("twice"), "{}", e.stderr);
    let e = import("bundle-long-name");
    assert_eq!(e.code, Some(2), "{}", e.stderr);
    assert!(e.stderr.contains("more than the 4096 a bundle entry's name"), "{}", e.stderr);
    assert!(e.stderr.len() < 4096 && e.peak_rss < 200 << 20, "{} bytes of message, {} MiB", e.stderr.len(), e.peak_rss >> 20);
    let e = import("bundle-bomb");
    assert_eq!(e.code, Some(2), "{}", e.stderr);
    assert!(e.stderr.contains("more than 256 MiB"), "the limit is named: {}", e.stderr);
    let e = import("bundle-duplicate-entry");
    assert_eq!(e.code, Some(2), "{}", e.stderr);
    assert!(e.stderr.contains("appears twice"), "{}", e.stderr);
    let e = import("bundle-all-skipped");
    assert_eq!(e.code, Some(2), "{}", e.stderr);
    for why in ["checksum mismatch", "a link", "listed but missing"] {
        assert!(e.stderr.contains(why), "names `{why}`: {}", e.stderr);
    }
    let e = import("dir");
    assert_eq!(e.code, Some(2), "{}", e.stderr);
    assert!(e.stderr.contains("a directory"), "{}", e.stderr);
}

/// Class 4: a GGUF file's metadata arrays once took ~33x their size (16 MB of
/// u8 reached 548 MB); kept compactly, the file's bytes bound the memory.
#[test]
fn gguf_metadata_arrays_take_about_their_file_size() {
    let s = Sandbox::new();
    let inputs = Inputs::new(&s);
    let e = one(&s, &["run", "--device", "cpu", "--gguf", &inputs.get("gguf-metadata-16m"), "--tokens", "1"]);
    assert_eq!(e.code, Some(2), "no architecture: an error, {}", e.stderr);
    // The 16 MiB mapped once and held once, beside the binary's own footprint.
    assert!(e.peak_rss < 160 << 20, "peak RSS {} MiB for 16 MiB of metadata", e.peak_rss >> 20);
}

/// Class 5: messages in the user's terms: a directory or device given as
/// `--gguf`, YAML past the parser's limits, a key given twice.
#[test]
fn directories_devices_and_yaml_limits_are_named_in_the_users_terms() {
    let s = Sandbox::new();
    let inputs = Inputs::new(&s);
    let tiny = fixture("gguf/smollm2-tiny-f16.gguf").display().to_string();
    for (file, says) in [("dir", "a directory"), ("device", "device"), ("fifo", "pipe")] {
        let e = one(&s, &["run", "--device", "cpu", "--gguf", &inputs.get(file), "--tokens", "1"]);
        assert_eq!(e.code, Some(2), "{}", e.stderr);
        assert!(e.stderr.contains(says) && !e.stderr.contains("no such file"), "{file}: {}", e.stderr);
    }
    for (file, says) in [("profile-many-nodes", "more than 250000 values"), ("profile-dup-key", "`name` is given twice")] {
        let e = one(&s, &["run", "--device", "cpu", "--gguf", &tiny, "--tokens", "1", "--profile", &inputs.get(file)]);
        assert_eq!(e.code, Some(2), "{}", e.stderr);
        assert!(e.stderr.contains(says), "{file}: {}", e.stderr);
        for internal in ["budget breached", "DuplicateKeyPolicy", "Options", "Nodes {"] {
            assert!(!e.stderr.contains(internal), "{file}: the parser's internals: {}", e.stderr);
        }
    }
}

/// Every cached profile's bytes, and whether a temporary file of an atomic
/// write was left anywhere in the cache.
fn cached_profiles(s: &Sandbox) -> (BTreeMap<PathBuf, Vec<u8>>, bool) {
    let mut out = BTreeMap::new();
    if let Ok(dir) = std::fs::read_dir(s.cache().join("profiles")) {
        for e in dir.flatten().filter(|e| e.path().extension().is_some_and(|x| x == "yaml")) {
            out.insert(e.path(), std::fs::read(e.path()).expect("read profile"));
        }
    }
    let mut stack = vec![s.cache()];
    let mut temp = false;
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            temp |= e.file_name().to_string_lossy().ends_with(".tmp");
            if e.path().is_dir() {
                stack.push(e.path());
            }
        }
    }
    (out, temp)
}

/// Class 6: a full disk (here every file limited to 2 KiB, less than a
/// profile, `EFBIG`, as `ENOSPC` fails a write) while a bundle is imported or
/// a tune writes its races and profile: exit 2 naming the file, the cause and
/// what to do; the profiles cached before are byte for byte as they were and
/// no temporary file is left. A stderr that cannot take the message (16
/// bytes) once made the error's print panic (exit 101).
#[test]
fn a_full_disk_leaves_the_cached_profiles_as_they_were_and_says_what_failed() {
    let s = Sandbox::new();
    let inputs = Inputs::new(&s);
    let e = one(&s, &["profiles", "import", &inputs.get("bundle-multibyte")]);
    assert_eq!(e.code, Some(0), "{}", e.stderr);
    let before = cached_profiles(&s);
    assert!(before.0.len() == 1 && !before.1, "one profile cached, no temporary: {:?}", before.0.keys());
    // Another profile (key `e`) to import.
    let text = multibyte_profile().replace("Ünïcödé ÇPU", "Another CPU");
    let listing = manifest(&[("e".repeat(64), "profiles/e.yaml".into(), sha256(text.as_bytes()))]);
    let other = s.input(
        "other.tar.zst",
        &bundle(&[
            ("ktune-bundle.json", tar::EntryType::Regular, listing.as_slice()),
            ("profiles/e.yaml", tar::EntryType::Regular, text.as_bytes()),
        ]),
    );
    let tiny = fixture("gguf/smollm2-tiny-f16.gguf").display().to_string();
    let runs: [(&str, Vec<&str>); 2] = [
        ("import", vec!["profiles", "import", other.to_str().expect("utf-8")]),
        (
            "tune",
            vec![
                "tune",
                "--device",
                "cpu",
                "--gguf",
                &tiny,
                "--budget",
                "2s",
                "--prefill-tokens",
                "8",
                "--context",
                "32",
                "--decode-tokens",
                "4",
            ],
        ),
    ];
    for (what, args) in runs {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let e = s.run_within(what, &args, Some(2048));
        assert_eq!(e.code, Some(2), "{what}: {}", e.stderr);
        assert!(e.stderr.contains("cannot write") && e.stderr.contains("the disk is full"), "{what} names the cause: {}", e.stderr);
        assert!(cached_profiles(&s) == before, "{what} left the cached profiles as they were");
        let e = s.run_within(what, &args, Some(16));
        assert_eq!(e.code, Some(2), "{what} with no room for its message: {}", e.stderr);
        assert!(cached_profiles(&s) == before, "{what} left the cached profiles as they were");
    }
    // With room again, the import goes through.
    let e = one(&s, &["profiles", "import", other.to_str().expect("utf-8")]);
    assert_eq!(e.code, Some(0), "{}", e.stderr);
    assert_eq!(cached_profiles(&s).0.len(), 2);
}
