//! The profile cache: `<cache>/profiles/<key>.yaml` keyed by sha256 of the device
//! fingerprint, model config, kernel-set hash, ktune version and the tuning options
//! that change results; `<cache>/slots/<key>.json` holds each finished slot race
//! keyed by the device, the op's own kernel hash and the shapes, so a changed
//! kernel family or driver re-measures only what it affects and an interrupted
//! tune resumes. Writes are atomic (temp file + rename); a lock file per profile
//! key keeps concurrent tunes from racing.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::kernels::{self, Op};

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cache directory {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("cannot write {path}: {source}{}", crate::atomic::write_hint(.source))]
    Write { path: PathBuf, source: std::io::Error },
    #[error("no cache directory: set KTUNE_CACHE_DIR")]
    NoDir,
}

/// The cache root: `KTUNE_CACHE_DIR`, else the user's cache directory.
pub fn root() -> Result<PathBuf, CacheError> {
    if let Some(d) = std::env::var_os("KTUNE_CACHE_DIR") {
        return Ok(PathBuf::from(d));
    }
    directories::ProjectDirs::from("", "", "ktune").map(|p| p.cache_dir().to_path_buf()).ok_or(CacheError::NoDir)
}

/// Hash of the kernels of one op (registry entries and their shaders), plus the
/// tool version (CPU kernels are compiled code).
pub fn op_hash(op: Op) -> String {
    let mut parts: Vec<String> = vec![env!("CARGO_PKG_VERSION").to_string()];
    for k in kernels::for_op(op) {
        parts.push(format!("{}|{:?}|{:?}", k.id, k.dtypes, k.backend()));
        for p in k.params {
            parts.push(format!("{}={:?}/{}", p.name, p.values, p.default));
        }
        if let kernels::Impl::Wgsl(w) = &k.imp {
            parts.push(w.shader.source.to_string());
            parts.extend(w.alt_shaders.iter().map(|s| s.source.to_string()));
        }
    }
    crate::hash::sha256_parts(&parts)
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> CacheError + '_ {
    move |source| CacheError::Io { path: path.to_path_buf(), source }
}

pub struct Cache {
    pub root: PathBuf,
}

impl Cache {
    pub fn open() -> Result<Cache, CacheError> {
        let root = root()?;
        for sub in ["profiles", "slots", "e2e"] {
            let d = root.join(sub);
            std::fs::create_dir_all(&d).map_err(io(&d))?;
        }
        Ok(Cache { root })
    }

    pub fn profile_path(&self, key: &str) -> PathBuf {
        self.root.join("profiles").join(format!("{key}.yaml"))
    }

    /// Takes the lock of `key`, waiting (and saying so through `waiting`) while
    /// another tune holds it. Released when the returned file is dropped.
    pub fn lock(&self, key: &str, waiting: impl FnOnce()) -> Result<File, CacheError> {
        let path = self.root.join("profiles").join(format!("{key}.lock"));
        let f = OpenOptions::new().create(true).truncate(false).write(true).open(&path).map_err(io(&path))?;
        match f.try_lock() {
            Ok(()) => Ok(f),
            Err(std::fs::TryLockError::WouldBlock) => {
                waiting();
                f.lock().map_err(io(&path))?;
                Ok(f)
            }
            Err(std::fs::TryLockError::Error(e)) => Err(io(&path)(e)),
        }
    }

    fn json_path(&self, kind: &str, key: &str) -> PathBuf {
        self.root.join(kind).join(format!("{key}.json"))
    }

    /// A saved record, if present and readable (a corrupt one is ignored and redone).
    pub fn get<T: DeserializeOwned>(&self, kind: &str, key: &str) -> Option<T> {
        let text = std::fs::read_to_string(self.json_path(kind, key)).ok()?;
        serde_json::from_str(&text).ok()
    }

    pub fn put<T: Serialize>(&self, kind: &str, key: &str, value: &T) -> Result<(), CacheError> {
        let path = self.json_path(kind, key);
        let text = serde_json::to_string(value).map_err(|e| io(&path)(std::io::Error::other(e)))?;
        crate::atomic::write_atomic(&path, text.as_bytes()).map_err(|source| CacheError::Write { path: path.clone(), source })
    }

    /// Every cached profile: (key, path).
    pub fn profiles(&self) -> Result<Vec<(String, PathBuf)>, CacheError> {
        let dir = self.root.join("profiles");
        let mut v = Vec::new();
        for e in std::fs::read_dir(&dir).map_err(io(&dir))? {
            let e = e.map_err(io(&dir))?;
            let p = e.path();
            if p.extension().is_some_and(|x| x == "yaml")
                && let Some(stem) = p.file_stem()
            {
                v.push((stem.to_string_lossy().to_string(), p));
            }
        }
        v.sort();
        Ok(v)
    }

    /// Removes every cached profile and measurement; returns how many files went.
    pub fn clear(&self) -> Result<usize, CacheError> {
        let mut n = 0;
        for sub in ["profiles", "slots", "e2e"] {
            let d = self.root.join(sub);
            for e in std::fs::read_dir(&d).map_err(io(&d))? {
                let p = e.map_err(io(&d))?.path();
                if p.extension().is_some_and(|x| x == "lock") {
                    continue;
                }
                std::fs::remove_file(&p).map_err(io(&p))?;
                n += 1;
            }
        }
        Ok(n)
    }
}
