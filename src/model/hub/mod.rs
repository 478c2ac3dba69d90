//! Models from the Hugging Face Hub (`--hf REPO[:QUANT_OR_FILE][@REVISION]`): the
//! spec, the choice of files in a repository (a GGUF file by quant name, its split
//! parts whole; or a safetensors model's config, tokenizer and weights), and the
//! hub's own cache layout, shared with Python's `huggingface_hub`:
//! `$HF_HUB_CACHE` (else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`) holds
//! `models--OWNER--NAME/{blobs/<etag>, snapshots/<commit>/<file> -> ../../blobs/<etag>, refs/<revision>}`.
//!
//! A revision already in the cache (`refs/<rev>`, or a commit hash) whose
//! snapshot holds every chosen file resolves without any request; otherwise one
//! API request (`/api/models/{repo}/revision/{rev}?blobs=true`: the commit, the
//! file list, each file's size and LFS SHA-256) and a download per missing file
//! (`/{repo}/resolve/{commit}/{file}`, redirects followed), into
//! `blobs/<etag>.incomplete`, resumed with an HTTP Range after a dropped
//! connection, its SHA-256 checked against the LFS metadata before it becomes the
//! blob. `HF_HUB_OFFLINE=1` never asks; `HF_ENDPOINT` names the hub; `HF_TOKEN`
//! (else the token file `$HF_HOME/token`) is sent as a bearer token, to the hub's
//! host only. A download holds huggingface_hub's lock file
//! (`.locks/models--OWNER--NAME/<etag>.lock`), so two programs never write one blob.
//!
//! The hub is not trusted ([`names`]): every name it sends (commit, blob id,
//! SHA-256, file name) and the revision a user gives are checked before they
//! touch the file system, every folder written to is checked to lie inside the
//! cache once created (a link planted in the cache cannot lead a write out), a
//! body is read to the size the API lists and no further, a transfer slower than
//! [`MIN_RATE`] over a window is retried and then fails with its rate, and the
//! walk over a cached snapshot follows links only to files inside the
//! repository's cache folder (never to folders: no loop, no way out).

mod names;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use self::names::{file_name_problem, is_commit, is_hex, revision_problem};
use crate::progress::Progress;
use crate::text::escaped;

/// The hub everyone means when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Attempts at one file before a dropped connection is an error (each resumes
/// where the last one stopped).
const ATTEMPTS: usize = 4;

/// The slowest transfer accepted, in bytes a second, averaged over
/// [`RATE_WINDOW`]: a slower one is dropped and resumed, and after
/// [`ATTEMPTS`] fails saying its rate.
pub const MIN_RATE: u64 = 1024;
/// The window [`MIN_RATE`] is measured over (and the longest wait for one read).
/// The hidden `KTUNE_HUB_WINDOW_MS` shortens it for the tests.
const RATE_WINDOW: Duration = Duration::from_secs(30);

/// The largest API answer read (a file list of tens of thousands of files is a
/// few MB).
const MAX_API_BYTES: u64 = 64 << 20;
/// The largest `model.safetensors.index.json` or `refs/` file read.
const MAX_INDEX_BYTES: u64 = 64 << 20;
const MAX_REF_BYTES: u64 = 256;

/// The most entries and the deepest folder a walk over a cached snapshot takes.
const MAX_WALK_ENTRIES: usize = 100_000;
const MAX_WALK_DEPTH: usize = 32;

/// Quant names in ascending size (bits per weight), as llama.cpp's quantize lists
/// them; the default choice is the largest one at or below [`DEFAULT_QUANT`].
const QUANT_ORDER: [&str; 31] = [
    "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "Q2_K_S", "Q2_K", "IQ3_XXS", "IQ3_XS", "Q3_K_S", "IQ3_S", "IQ3_M", "Q3_K_M",
    "Q3_K_L", "IQ4_XS", "IQ4_NL", "Q4_0", "Q4_K_S", "Q4_K_M", "Q4_1", "Q5_0", "Q5_K_S", "Q5_1", "Q5_K_M", "Q6_K", "Q8_0", "BF16", "F16",
    "F32", "F64",
];

/// The quant `--hf REPO` takes when it names none (as llama.cpp's `-hf`).
pub const DEFAULT_QUANT: &str = "Q4_K_M";

/// What can go wrong reaching or reading the hub and its cache.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error(
        "--hf {0}: expected OWNER/NAME[:QUANT_OR_FILE][@REVISION] (e.g. ggml-org/gemma-3-1b-it-GGUF:Q4_K_M) or a built-in model's name"
    )]
    Spec(String),
    #[error(
        "{repo}: access refused (HTTP {status}): the repository is gated or private. Accept its license at https://huggingface.co/{repo} \
         and give a token with read access in HF_TOKEN (or the file {token_file})"
    )]
    Gated { repo: String, status: u16, token_file: String },
    #[error("{what} not found on {endpoint} (HTTP 404): check the repository name, the file and the revision")]
    NotFound { what: String, endpoint: String },
    #[error("{url}: HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("{url}: network failure ({msg}); to use what is already cached without the network, set HF_HUB_OFFLINE=1")]
    Network { url: String, msg: String },
    #[error("{repo}@{revision}: not in the cache {} ({missing}) and HF_HUB_OFFLINE is set: run once with the network (`ktune pull --hf {repo}`)", cache.display())]
    NotCached { repo: String, revision: String, cache: PathBuf, missing: String },
    #[error("{repo}: {msg}")]
    Choice { repo: String, msg: String },
    #[error("{file}: SHA-256 {got} does not match the hub's {want}; the partial download was deleted, run again to fetch it anew")]
    Sha { file: String, want: String, got: String },
    #[error("{file}: the hub sent {got} bytes, the API lists {want}; the partial download was deleted, run again")]
    Size { file: String, want: u64, got: u64 },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{url}: unexpected answer: {msg}")]
    Api { url: String, msg: String },
    #[error("--hf {spec}: revision `{}` {why}: give a branch, tag or commit hash (e.g. @main, @v1.0)", escaped(rev, 80))]
    Revision { spec: String, rev: String, why: &'static str },
    #[error("{url}: the hub sent {what} `{}`, which {why}; refused, nothing was written for it", escaped(value, 120))]
    Unsafe { url: String, what: &'static str, value: String, why: &'static str },
    #[error("{file}: the hub sent more than the {want} bytes its file list gives; the partial download was deleted")]
    TooLong { file: String, want: u64 },
    #[error("{}: lies outside the hub cache {} (a link in the cache leads out of it); refused: remove it and run again", path.display(), cache.display())]
    Outside { path: PathBuf, cache: PathBuf },
}

pub type Result<T, E = HubError> = std::result::Result<T, E>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> HubError + '_ {
    move |source| HubError::Io { path: path.to_path_buf(), source }
}

/// `REPO[:QUANT_OR_FILE][@REVISION]`, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubSpec {
    /// `owner/name`.
    pub repo: String,
    /// A quant name (case-insensitive) or a file name in the repository.
    pub file: Option<String>,
    /// A branch, tag or commit hash (default `main`).
    pub revision: String,
}

impl HubSpec {
    /// Parses the spec; a built-in model's name (`gemma3-1b`) stands for its
    /// published GGUF repository ([`super::builtin_repo`]).
    pub fn parse(s: &str) -> Result<HubSpec> {
        let bad = || HubError::Spec(s.to_string());
        let (rest, revision) = match s.rsplit_once('@') {
            Some((r, rev)) if !rev.is_empty() => (r, rev.to_string()),
            Some(_) => return Err(bad()),
            None => (s, "main".to_string()),
        };
        if let Some(why) = revision_problem(&revision) {
            return Err(HubError::Revision { spec: escaped(s, 120).into_owned(), rev: revision, why });
        }
        // A commit hash names its snapshot folder as the hub writes it.
        let revision =
            if revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit()) { revision.to_ascii_lowercase() } else { revision };
        let (repo, file) = match rest.split_once(':') {
            Some((r, f)) if !f.is_empty() => (r, Some(f.to_string())),
            Some(_) => return Err(bad()),
            None => (rest, None),
        };
        let repo = match super::builtin_repo(repo) {
            Some(r) if !repo.contains('/') => r.to_string(),
            _ => repo.to_string(),
        };
        let ok_part = |p: &str| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) && !p.starts_with('.');
        match repo.split_once('/') {
            Some((o, n)) if ok_part(o) && ok_part(n) => Ok(HubSpec { repo, file, revision }),
            _ => Err(bad()),
        }
    }
}

/// One file of a repository as the hub lists it.
#[derive(Clone, Debug)]
pub struct RepoFile {
    /// Path in the repository (`/`-separated).
    pub name: String,
    pub size: u64,
    /// The cache's blob name: the LFS SHA-256 for LFS files, else the git blob id.
    pub etag: String,
    /// The LFS SHA-256 the content must have (None: a plain git file).
    pub sha256: Option<String>,
}

/// What a spec resolved to on this machine.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Resolved {
    pub repo: String,
    pub revision: String,
    pub commit: String,
    /// The path the model loads from: the GGUF file (the first part of a split
    /// one) or the snapshot directory of a safetensors model.
    pub path: PathBuf,
    /// Whether `path` is a GGUF file (else a model directory).
    pub gguf: bool,
    /// Every chosen file in the snapshot.
    pub files: Vec<PathBuf>,
    /// Bytes downloaded by this call (0: all from the cache).
    pub downloaded: u64,
}

/// Files of a safetensors model a run needs besides its weights.
const DIR_FILES: [&str; 7] = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
];
const INDEX_FILE: &str = "model.safetensors.index.json";

/// The quant tag of a GGUF file name (`Llama-3.2-1B-Instruct-Q4_K_M.gguf` ->
/// `Q4_K_M`): the last `-`/`.`-separated part of the stem that is a known quant.
fn quant_of(name: &str) -> Option<&'static str> {
    let base = name.rsplit('/').next().unwrap_or(name);
    let stem = base.strip_suffix(".gguf").unwrap_or(base).to_ascii_uppercase();
    let stem = split_part(&stem).map_or(stem.as_str(), |(s, _, _)| s);
    stem.rsplit(['-', '.']).find_map(|p| QUANT_ORDER.iter().copied().find(|q| *q == p))
}

/// `NAME-00001-of-00003` -> (`NAME`, 1, 3).
fn split_part(stem: &str) -> Option<(&str, u32, u32)> {
    let (head, total) = stem.rsplit_once("-of-").or_else(|| stem.rsplit_once("-OF-"))?;
    let (base, part) = head.rsplit_once('-')?;
    let (p, t) = (part.parse().ok()?, total.parse().ok()?);
    (part.len() == 5 && total.len() == 5 && p >= 1 && p <= t).then_some((base, p, t))
}

fn is_gguf_model(name: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name).to_ascii_lowercase();
    base.ends_with(".gguf") && !base.starts_with("mmproj")
}

/// The files a run of `spec` needs among `names` (a repository's files, or a
/// snapshot's): a GGUF file by quant or name (every part of a split one, the
/// first part first), else a safetensors model. Err: the choice is impossible,
/// with what there is.
pub fn choose(repo: &str, names: &[&str], want: Option<&str>) -> Result<(Vec<String>, bool)> {
    let err = |msg: String| HubError::Choice { repo: repo.to_string(), msg };
    let ggufs: Vec<&str> = names.iter().copied().filter(|n| is_gguf_model(n)).collect();
    if ggufs.is_empty() {
        if let Some(w) = want {
            return Err(err(format!("`:{w}` names a GGUF file, and the repository has none")));
        }
        return choose_dir(names)
            .ok_or_else(|| err("neither a GGUF file nor a safetensors model (config.json and *.safetensors) in the repository".into()));
    }
    let picked: Option<&str> = match want {
        Some(w) => ggufs
            .iter()
            .copied()
            .find(|n| n.eq_ignore_ascii_case(w) || n.rsplit('/').next().is_some_and(|b| b.eq_ignore_ascii_case(w)))
            .or_else(|| ggufs.iter().copied().find(|n| quant_of(n).is_some_and(|q| q.eq_ignore_ascii_case(w)))),
        None => default_gguf(&ggufs),
    };
    let Some(first) = picked else {
        let have: BTreeSet<&str> = ggufs.iter().map(|n| quant_of(n).unwrap_or(n)).collect();
        return Err(err(match want {
            Some(w) => format!("no GGUF file for `:{w}`; it has {}", have.into_iter().collect::<Vec<_>>().join(", ")),
            None => {
                format!("several GGUF files and no quant name in them to choose by: name one with --hf {repo}:FILE ({})", ggufs.join(", "))
            }
        }));
    };
    Ok((gguf_parts(first), true))
}

/// The largest quant at or below Q4_K_M, else the smallest above it; a lone
/// file without a quant name is taken as it is.
fn default_gguf<'a>(ggufs: &[&'a str]) -> Option<&'a str> {
    let limit = QUANT_ORDER.iter().position(|q| *q == DEFAULT_QUANT).unwrap_or(0);
    let ranked: Vec<(usize, &str)> =
        ggufs.iter().filter_map(|n| quant_of(n).and_then(|q| QUANT_ORDER.iter().position(|o| *o == q)).map(|r| (r, *n))).collect();
    let below = ranked.iter().filter(|(r, _)| *r <= limit).max_by_key(|(r, n)| (*r, std::cmp::Reverse(*n)));
    let above = ranked.iter().filter(|(r, _)| *r > limit).min_by_key(|(r, n)| (*r, *n));
    below.or(above).map(|(_, n)| *n).or_else(|| (ggufs.len() == 1).then(|| ggufs[0]))
}

/// `first` and, when it is one part of a split file (`-0000K-of-0000N`), every
/// part of it in order (a part the repository lacks is then a 404 naming it).
fn gguf_parts(first: &str) -> Vec<String> {
    let stem = first.strip_suffix(".gguf").unwrap_or(first);
    match split_part(stem) {
        Some((base, _, total)) => (1..=total).map(|k| format!("{base}-{k:05}-of-{total:05}.gguf")).collect(),
        None => vec![first.to_string()],
    }
}

/// A safetensors model's files: config, tokenizer, chat template, and every
/// `*.safetensors` with its index. None without config.json or weights.
fn choose_dir(names: &[&str]) -> Option<(Vec<String>, bool)> {
    let weights: Vec<&str> = names.iter().copied().filter(|n| !n.contains('/') && n.ends_with(".safetensors")).collect();
    if !names.contains(&"config.json") || weights.is_empty() {
        return None;
    }
    let mut files: Vec<String> = names.iter().filter(|n| DIR_FILES.contains(n) || **n == INDEX_FILE).map(|n| n.to_string()).collect();
    files.extend(weights.iter().map(|w| w.to_string()));
    Some((files, false))
}

/// The hub as the environment describes it.
pub struct Hub {
    endpoint: String,
    cache: PathBuf,
    token: Option<String>,
    token_file: PathBuf,
    offline: bool,
    agent: ureq::Agent,
    /// The window [`MIN_RATE`] is measured over.
    window: Duration,
}

fn env_nonempty(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

fn truthy(k: &str) -> bool {
    env_nonempty(k).is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
}

impl Hub {
    /// From `HF_ENDPOINT`, `HF_HOME`, `HF_HUB_CACHE`, `HF_TOKEN` (else
    /// `HF_TOKEN_PATH`, else `$HF_HOME/token`) and `HF_HUB_OFFLINE`.
    pub fn from_env() -> Hub {
        let home = env_nonempty("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            let base = env_nonempty("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| directories::BaseDirs::new().map(|d| d.home_dir().join(".cache")))
                .unwrap_or_else(|| PathBuf::from(".cache"));
            base.join("huggingface")
        });
        let cache =
            env_nonempty("HF_HUB_CACHE").or_else(|| env_nonempty("HUGGINGFACE_HUB_CACHE")).map_or_else(|| home.join("hub"), PathBuf::from);
        let token_file = env_nonempty("HF_TOKEN_PATH").map_or_else(|| home.join("token"), PathBuf::from);
        let token = env_nonempty("HF_TOKEN")
            .or_else(|| std::fs::read_to_string(&token_file).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty()));
        let endpoint = env_nonempty("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_string()).trim_end_matches('/').to_string();
        let window = env_nonempty("KTUNE_HUB_WINDOW_MS")
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|ms| *ms > 0)
            .map_or(RATE_WINDOW, Duration::from_millis);
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(20)))
            .timeout_per_read(Some(window))
            .user_agent(concat!("ktune/", env!("CARGO_PKG_VERSION")))
            // The token goes to the hub's own host (a moved repository), never to the CDN.
            .redirect_auth_headers(ureq::config::RedirectAuthHeaders::SameHost)
            .build()
            .into();
        Hub { endpoint, cache, token, token_file, offline: truthy("HF_HUB_OFFLINE"), agent, window }
    }

    /// The hub cache directory.
    pub fn cache_dir(&self) -> &Path {
        &self.cache
    }

    fn repo_dir(&self, repo: &str) -> PathBuf {
        self.cache.join(format!("models--{}", repo.replace('/', "--")))
    }

    /// The local files of `spec`: from the cache when its revision is there with
    /// every chosen file (no request; `refresh` asks the hub all the same, as
    /// `pull` does), else downloaded. Offline, only the cache.
    pub fn resolve(&self, spec: &HubSpec, refresh: bool, progress: &dyn Progress) -> Result<Resolved> {
        let dir = self.repo_dir(&spec.repo);
        if !refresh || self.offline {
            match cached(spec, &dir) {
                Ok(r) => return Ok(r),
                Err(missing) if self.offline => {
                    return Err(HubError::NotCached {
                        repo: spec.repo.clone(),
                        revision: spec.revision.clone(),
                        cache: self.cache.clone(),
                        missing,
                    });
                }
                Err(_) => {}
            }
        }
        self.download(spec, &dir, progress)
    }

    fn get(&self, url: &str, range_from: u64) -> Result<ureq::http::Response<ureq::Body>> {
        let mut req = self.agent.get(url);
        if let Some(t) = &self.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        if range_from > 0 {
            req = req.header("Range", format!("bytes={range_from}-"));
        }
        req.call().map_err(|e| HubError::Network { url: url.to_string(), msg: e.to_string() })
    }

    fn check_status(&self, url: &str, repo: &str, what: &str, status: u16) -> Result<()> {
        match status {
            200..=299 => Ok(()),
            401 | 403 => Err(HubError::Gated { repo: repo.to_string(), status, token_file: self.token_file.display().to_string() }),
            404 => Err(HubError::NotFound { what: what.to_string(), endpoint: self.endpoint.clone() }),
            _ => Err(HubError::Status { url: url.to_string(), status }),
        }
    }

    /// The commit and files of `spec.revision`, from the API: every name checked
    /// ([`names`]) before it is used, the answer read within [`MAX_API_BYTES`].
    fn list(&self, spec: &HubSpec) -> Result<(String, Vec<RepoFile>)> {
        // A revision such as `refs/pr/1` goes into the path as one segment.
        let url = format!("{}/api/models/{}/revision/{}?blobs=true", self.endpoint, spec.repo, spec.revision.replace('/', "%2F"));
        let resp = self.get(&url, 0)?;
        self.check_status(&url, &spec.repo, &format!("repository {} at revision {}", spec.repo, spec.revision), resp.status().as_u16())?;
        let api = |msg: String| HubError::Api { url: url.clone(), msg };
        let mut text = Vec::new();
        let body = resp.into_body().into_with_config().limit(MAX_API_BYTES).reader();
        Floor::new(body, self.window).read_to_end(&mut text).map_err(|e| HubError::Network { url: url.clone(), msg: e.to_string() })?;
        let v: serde_json::Value = serde_json::from_slice(&text).map_err(|e| api(e.to_string()))?;
        let unsafe_name = |what, value: &str, why| HubError::Unsafe { url: url.clone(), what, value: value.to_string(), why };
        let commit = v["sha"].as_str().ok_or_else(|| api("no commit hash (`sha`)".into()))?;
        if !is_commit(commit) {
            return Err(unsafe_name("the commit hash", commit, "is not 40 lowercase hex digits"));
        }
        let files = v["siblings"]
            .as_array()
            .ok_or_else(|| api("no file list (`siblings`)".into()))?
            .iter()
            .map(|s| {
                let name = s["rfilename"].as_str().ok_or_else(|| api("a file without `rfilename`".into()))?;
                if let Some(why) = file_name_problem(name) {
                    return Err(unsafe_name("the file name", name, why));
                }
                let sha256 = s["lfs"]["sha256"].as_str();
                if let Some(h) = sha256.filter(|h| !is_hex(h, 64)) {
                    return Err(unsafe_name("the SHA-256", h, "is not 64 lowercase hex digits"));
                }
                let etag = match (sha256, s["blobId"].as_str()) {
                    (Some(h), _) => h,
                    (None, Some(b)) if is_hex(b, 40) => b,
                    (None, Some(b)) => return Err(unsafe_name("the blob id", b, "is not 40 lowercase hex digits")),
                    (None, None) => {
                        return Err(api(format!(
                            "{}: neither `lfs.sha256` nor `blobId` (the API was asked with blobs=true)",
                            escaped(name, 120)
                        )));
                    }
                };
                let size = s["lfs"]["size"]
                    .as_u64()
                    .or_else(|| s["size"].as_u64())
                    .ok_or_else(|| api(format!("{}: no `size` (the API was asked with blobs=true)", escaped(name, 120))))?;
                Ok(RepoFile { name: name.to_string(), size, etag: etag.to_string(), sha256: sha256.map(str::to_string) })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((commit.to_string(), files))
    }

    fn download(&self, spec: &HubSpec, dir: &Path, progress: &dyn Progress) -> Result<Resolved> {
        let (commit, listed) = self.list(spec)?;
        std::fs::create_dir_all(&self.cache).map_err(io(&self.cache))?;
        make_dir_inside(&self.cache, dir)?;
        let names: Vec<&str> = listed.iter().map(|f| f.name.as_str()).collect();
        let (mut files, gguf) = choose(&spec.repo, &names, spec.file.as_deref())?;
        if !gguf && let Some(index) = listed.iter().find(|f| f.name == INDEX_FILE) {
            // Only the shards the index names (a repository may hold other weights too).
            self.fetch(spec, dir, &commit, index, progress)?;
            let shards = index_shards(&dir.join("snapshots").join(&commit).join(INDEX_FILE))?;
            files.retain(|f| !f.ends_with(".safetensors") || shards.contains(f));
        }
        let snap = dir.join("snapshots").join(&commit);
        let mut downloaded = 0;
        for f in &files {
            let meta = listed.iter().find(|l| &l.name == f).ok_or_else(|| HubError::NotFound {
                what: format!("{f} (a part of the chosen model) in {}@{}", spec.repo, spec.revision),
                endpoint: self.endpoint.clone(),
            })?;
            downloaded += self.fetch(spec, dir, &commit, meta, progress)?;
        }
        if spec.revision != commit {
            let refs = dir.join("refs");
            let r = refs.join(&spec.revision);
            make_dir_inside(dir, r.parent().unwrap_or(&refs))?;
            // Whole or not at all: a torn ref would point a later offline run nowhere.
            crate::atomic::write_atomic(&r, commit.as_bytes()).map_err(io(&r))?;
        }
        Ok(resolved(spec, commit, &snap, files, gguf, downloaded))
    }

    /// One file into the blob store and the snapshot; the bytes downloaded.
    /// Every folder is made inside the repository's cache folder `dir` (the
    /// locks inside the cache), and a blob or a snapshot link counts as there
    /// only when it is a file inside `dir`.
    fn fetch(&self, spec: &HubSpec, dir: &Path, commit: &str, f: &RepoFile, progress: &dyn Progress) -> Result<u64> {
        let blobs = dir.join("blobs");
        let blob = blobs.join(&f.etag);
        let link = dir.join("snapshots").join(commit).join(&f.name);
        let mut got = 0;
        if !is_regular(&blob) {
            make_dir_inside(dir, &blobs)?;
            // huggingface_hub's lock file for this blob: one download at a time,
            // whichever program makes it; the blob may be there once it is ours.
            let locks = self.cache.join(".locks").join(dir.file_name().unwrap_or_default());
            make_dir_inside(&self.cache, &locks)?;
            let lock_path = locks.join(format!("{}.lock", f.etag));
            unlink_unless_regular(&lock_path)?;
            let lock = std::fs::File::options().create(true).truncate(false).write(true).open(&lock_path).map_err(io(&lock_path))?;
            lock.lock().map_err(io(&lock_path))?;
            if !is_regular(&blob) {
                got = self.download_blob(spec, commit, f, &blob, progress)?;
            }
        }
        if !file_inside(dir, &link) {
            let parent = link.parent().unwrap_or(dir);
            make_dir_inside(dir, parent)?;
            let _ = std::fs::remove_file(&link);
            let depth = f.name.matches('/').count();
            let target = PathBuf::from(format!("{}../../blobs/{}", "../".repeat(depth), f.etag));
            link_or_copy(&target, &blob, &link)?;
        }
        Ok(got)
    }

    /// Downloads `f` into `<blob>.incomplete`, resuming what is there, checks it
    /// and renames it to `blob`; the bytes fetched.
    fn download_blob(&self, spec: &HubSpec, commit: &str, f: &RepoFile, blob: &Path, progress: &dyn Progress) -> Result<u64> {
        let part = blob.with_extension("incomplete");
        let url = format!("{}/{}/resolve/{}/{}", self.endpoint, spec.repo, commit, f.name);
        progress.phase(&format!("downloading {} ({})", f.name, indicatif::HumanBytes(f.size)), f.size);
        let mut fetched = 0;
        let mut last_err = None;
        for _ in 0..ATTEMPTS {
            match self.download_attempt(spec, &url, f, &part, progress) {
                Ok(n) => {
                    fetched += n;
                    last_err = None;
                    break;
                }
                Err((n, e @ HubError::Network { .. })) => {
                    fetched += n;
                    progress.note(&format!("{}: {e}; resuming", f.name));
                    last_err = Some(e);
                }
                Err((_, e)) => {
                    progress.done();
                    if matches!(e, HubError::TooLong { .. }) {
                        let _ = std::fs::remove_file(&part);
                    }
                    return Err(e);
                }
            }
        }
        progress.done();
        if let Some(e) = last_err {
            return Err(e);
        }
        let have = std::fs::metadata(&part).map_err(io(&part))?.len();
        if have != f.size {
            let _ = std::fs::remove_file(&part);
            return Err(HubError::Size { file: f.name.clone(), want: f.size, got: have });
        }
        if let Some(want) = &f.sha256 {
            let got = sha256_file(&part)?;
            if !got.eq_ignore_ascii_case(want) {
                let _ = std::fs::remove_file(&part);
                return Err(HubError::Sha { file: f.name.clone(), want: want.clone(), got });
            }
        }
        std::fs::rename(&part, blob).map_err(io(blob))?;
        Ok(fetched)
    }

    /// One GET of the rest of `f` appended to `part`: the bytes it wrote, and on
    /// failure what it wrote before the failure.
    fn download_attempt(
        &self,
        spec: &HubSpec,
        url: &str,
        f: &RepoFile,
        part: &Path,
        progress: &dyn Progress,
    ) -> Result<u64, (u64, HubError)> {
        unlink_unless_regular(part).map_err(|e| (0, e))?;
        let have = std::fs::metadata(part).map(|m| m.len()).ok();
        if have == Some(f.size) {
            return Ok(0);
        }
        let have = have.filter(|h| *h < f.size).unwrap_or(0);
        let resp = self.get(url, have).map_err(|e| (0, e))?;
        let status = resp.status().as_u16();
        self.check_status(url, &spec.repo, &format!("{} in {}@{}", f.name, spec.repo, spec.revision), status).map_err(|e| (0, e))?;
        // 206: the rest; 200: the whole file (a server that ignores Range).
        let append = status == 206 && have > 0;
        let mut out = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(part)
            .map_err(|e| (0, io(part)(e)))?;
        let start = if append { have } else { 0 };
        progress.advance_to(start);
        // One byte past the listed size is enough to know the hub sends more.
        let want = f.size - start;
        let mut reader = Floor::new(resp.into_body().into_reader(), self.window).take(want + 1);
        let mut buf = vec![0u8; 1 << 16];
        let mut wrote = 0u64;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => return Err((wrote, HubError::Network { url: url.to_string(), msg: e.to_string() })),
            };
            if wrote + n as u64 > want {
                return Err((wrote, HubError::TooLong { file: f.name.clone(), want: f.size }));
            }
            out.write_all(&buf[..n]).map_err(|e| (wrote, io(part)(e)))?;
            wrote += n as u64;
            progress.advance(n as u64);
        }
        out.flush().map_err(|e| (wrote, io(part)(e)))?;
        if start + wrote < f.size {
            let msg = format!("connection closed at byte {} of {}", start + wrote, f.size);
            return Err((wrote, HubError::Network { url: url.to_string(), msg }));
        }
        Ok(wrote)
    }
}

/// A reader that fails when less than [`MIN_RATE`] bytes a second arrived
/// over its last window (a hub that trickles a file would otherwise hold the
/// download for ever: each read alone stays within the read timeout).
struct Floor<R> {
    inner: R,
    window: Duration,
    since: std::time::Instant,
    bytes: u64,
}

impl<R> Floor<R> {
    fn new(inner: R, window: Duration) -> Floor<R> {
        Floor { inner, window, since: std::time::Instant::now(), bytes: 0 }
    }
}

impl<R: Read> Read for Floor<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        let elapsed = self.since.elapsed();
        if n > 0 && elapsed >= self.window {
            let floor = (MIN_RATE as f64 * elapsed.as_secs_f64()) as u64;
            if self.bytes < floor {
                let rate = self.bytes as f64 / elapsed.as_secs_f64();
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "transfer too slow: {} bytes in {:.1} s ({rate:.0} B/s, below the floor of {MIN_RATE} B/s)",
                        self.bytes,
                        elapsed.as_secs_f64()
                    ),
                ));
            }
            (self.since, self.bytes) = (std::time::Instant::now(), 0);
        }
        Ok(n)
    }
}

/// The cached commit of `spec.revision` and its snapshot's chosen files, or
/// what is missing. The cache is read as untrusted as the hub: the ref must
/// hold a commit hash, and only the files [`walk`] finds count.
fn cached(spec: &HubSpec, dir: &Path) -> Result<Resolved, String> {
    let commit = if is_commit(&spec.revision) {
        spec.revision.clone()
    } else {
        let r = dir.join("refs").join(&spec.revision);
        let text = crate::input::read_limited(&r, MAX_REF_BYTES, "ref file").map_err(|e| format!("no {} ({e})", r.display()))?;
        let commit = String::from_utf8_lossy(&text).trim().to_string();
        if !is_commit(&commit) {
            return Err(format!("{} holds no commit hash", r.display()));
        }
        commit
    };
    let snap = dir.join("snapshots").join(&commit);
    let names = walk(dir, &snap);
    if names.is_empty() {
        return Err(format!("no files in {}", snap.display()));
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let (files, gguf) = choose(&spec.repo, &refs, spec.file.as_deref()).map_err(|e| e.to_string())?;
    if let Some(f) = files.iter().find(|f| !refs.contains(&f.as_str())) {
        return Err(format!("{f} is not in {}", snap.display()));
    }
    if !gguf && refs.contains(&INDEX_FILE) {
        let shards = index_shards(&snap.join(INDEX_FILE)).map_err(|e| e.to_string())?;
        if let Some(s) = shards.iter().find(|s| !refs.contains(&s.as_str())) {
            return Err(format!("{s} is not in {}", snap.display()));
        }
    }
    Ok(resolved(spec, commit, &snap, files, gguf, 0))
}

fn resolved(spec: &HubSpec, commit: String, snap: &Path, files: Vec<String>, gguf: bool, downloaded: u64) -> Resolved {
    let path = if gguf { snap.join(&files[0]) } else { snap.to_path_buf() };
    Resolved {
        repo: spec.repo.clone(),
        revision: spec.revision.clone(),
        commit,
        path,
        gguf,
        files: files.iter().map(|f| snap.join(f)).collect(),
        downloaded,
    }
}

/// The files of the snapshot `snap` as `/`-separated paths below it, sorted:
/// real folders are entered (at most [`MAX_WALK_DEPTH`] deep, [`MAX_WALK_ENTRIES`]
/// entries in all), and a link counts when it leads to a regular file inside
/// the repository's cache folder `repo`. Links to folders are never followed,
/// so no link leads the walk out of the cache or round a loop; names that
/// could not have come from the hub ([`file_name_problem`]) are skipped.
fn walk(repo: &Path, snap: &Path) -> Vec<String> {
    fn visit(root: &Path, dir: &Path, prefix: &str, depth: usize, budget: &mut usize, out: &mut Vec<String>) {
        let Ok(rd) = std::fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            if *budget == 0 {
                return;
            }
            *budget -= 1;
            let (Ok(name), Ok(kind)) = (e.file_name().into_string(), e.file_type()) else { continue };
            let rel = format!("{prefix}{name}");
            if file_name_problem(&rel).is_some() {
                continue;
            }
            if kind.is_dir() && depth < MAX_WALK_DEPTH {
                visit(root, &e.path(), &format!("{rel}/"), depth + 1, budget, out);
            } else if kind.is_file() || (kind.is_symlink() && resolves_inside(root, &e.path())) {
                out.push(rel);
            }
        }
    }
    let (mut out, mut budget) = (Vec::new(), MAX_WALK_ENTRIES);
    if let Ok(root) = repo.canonicalize() {
        visit(&root, snap, "", 0, &mut budget, &mut out);
    }
    out.sort();
    out
}

/// Whether `path` (links followed) is a regular file inside the folder whose
/// canonical path is `root`.
fn resolves_inside(root: &Path, path: &Path) -> bool {
    path.canonicalize().is_ok_and(|p| p.starts_with(root) && p.is_file())
}

/// Whether `path` is a regular file inside the folder `root`.
fn file_inside(root: &Path, path: &Path) -> bool {
    root.canonicalize().is_ok_and(|r| resolves_inside(&r, path))
}

/// Whether `path` itself (not a link's target) is a regular file.
fn is_regular(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file())
}

/// Removes what `path` names unless it is a regular file (or nothing), so an
/// open for writing never follows a link planted there.
fn unlink_unless_regular(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.is_file() => std::fs::remove_file(path).map_err(io(path)),
        _ => Ok(()),
    }
}

/// Creates the folder `dir` inside the folder `root` (which exists) and checks
/// that it lies there, before and after: a link planted in the cache cannot
/// lead a write out of it.
fn make_dir_inside(root: &Path, dir: &Path) -> Result<()> {
    let root_real = root.canonicalize().map_err(io(root))?;
    let outside = || HubError::Outside { path: dir.to_path_buf(), cache: root.to_path_buf() };
    // The deepest part of `dir` that exists already must lie inside.
    let existing = dir.ancestors().find(|a| a.exists()).unwrap_or(root);
    if !existing.canonicalize().is_ok_and(|p| p.starts_with(&root_real)) {
        return Err(outside());
    }
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    if !dir.canonicalize().is_ok_and(|p| p.starts_with(&root_real)) {
        return Err(outside());
    }
    Ok(())
}

/// The shard files a `model.safetensors.index.json` names, each checked as a
/// file name of the repository.
fn index_shards(path: &Path) -> Result<BTreeSet<String>> {
    let bytes = crate::input::read_limited(path, MAX_INDEX_BYTES, "safetensors index").map_err(io(path))?;
    let source = path.display().to_string();
    let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| HubError::Api { url: source.clone(), msg: e.to_string() })?;
    let shards: BTreeSet<String> =
        v["weight_map"].as_object().map(|m| m.values().filter_map(|s| s.as_str().map(str::to_string)).collect()).unwrap_or_default();
    for s in &shards {
        if let Some(why) = file_name_problem(s) {
            return Err(HubError::Unsafe { url: source, what: "the shard name", value: s.clone(), why });
        }
    }
    Ok(shards)
}

/// The snapshot's link to its blob (relative, as huggingface_hub makes it); a
/// copy where the file system has no symlinks.
fn link_or_copy(target: &Path, blob: &Path, link: &Path) -> Result<()> {
    #[cfg(unix)]
    let linked = std::os::unix::fs::symlink(target, link);
    #[cfg(not(unix))]
    let linked: std::io::Result<()> = Err(std::io::Error::other(format!("no symlinks: {}", target.display())));
    match linked {
        Ok(()) => Ok(()),
        Err(_) => std::fs::copy(blob, link).map(|_| ()).map_err(io(link)),
    }
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(io(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_parts_and_builtin_names() {
        let s = HubSpec::parse("ggml-org/gemma-3-1b-it-GGUF:q4_k_m@v1.0").unwrap();
        assert_eq!((s.repo.as_str(), s.file.as_deref(), s.revision.as_str()), ("ggml-org/gemma-3-1b-it-GGUF", Some("q4_k_m"), "v1.0"));
        let s = HubSpec::parse("gemma3-1b").unwrap();
        assert_eq!((s.repo.as_str(), s.file, s.revision.as_str()), ("ggml-org/gemma-3-1b-it-GGUF", None, "main"));
        for bad in ["noslash", "a/b/c", "a/b:", "a/b@", "/b", "a/.x"] {
            assert!(HubSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn default_quant_is_the_largest_up_to_q4_k_m() {
        let names = ["m-Q2_K.gguf", "m-Q4_0.gguf", "m-Q4_K_M.gguf", "m-Q8_0.gguf", "mmproj-m-f16.gguf", "README.md"];
        assert_eq!(choose("r", &names, None).unwrap().0, ["m-Q4_K_M.gguf"]);
        assert_eq!(choose("r", &names[..2], None).unwrap().0, ["m-Q4_0.gguf"]);
        assert_eq!(choose("r", &["m.Q8_0.gguf", "m.F16.gguf"], None).unwrap().0, ["m.Q8_0.gguf"]);
        assert_eq!(choose("r", &names, Some("q8_0")).unwrap().0, ["m-Q8_0.gguf"]);
        assert_eq!(choose("r", &names, Some("M-Q2_K.GGUF")).unwrap().0, ["m-Q2_K.gguf"]);
        let e = choose("r", &names, Some("Q6_K")).unwrap_err().to_string();
        assert!(e.contains("Q4_K_M") && e.contains("Q6_K"), "{e}");
    }

    #[test]
    fn split_files_come_whole_and_directories_take_their_files() {
        let names = ["Q4_K_M/m-Q4_K_M-00002-of-00002.gguf", "Q4_K_M/m-Q4_K_M-00001-of-00002.gguf", "m-Q8_0.gguf"];
        let (files, gguf) = choose("r", &names, None).unwrap();
        assert!(gguf);
        assert_eq!(files, ["Q4_K_M/m-Q4_K_M-00001-of-00002.gguf", "Q4_K_M/m-Q4_K_M-00002-of-00002.gguf"]);
        let names = ["config.json", "model.safetensors", "tokenizer.json", "README.md", "onnx/model.safetensors"];
        let (files, gguf) = choose("r", &names, None).unwrap();
        assert!(!gguf);
        assert_eq!(files, ["config.json", "tokenizer.json", "model.safetensors"]);
        assert!(choose("r", &["README.md"], None).is_err());
    }
}
