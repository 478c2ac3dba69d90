//! The bytes of a weight file, memory-mapped (a file on disk) or owned (an image
//! parsed from memory by tests and fuzzing), read through one `&[u8]` view by the
//! safetensors and GGUF readers.

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use super::{ModelError, Result};

pub enum FileBytes {
    Mmap(Mmap),
    Owned(Vec<u8>),
}

impl FileBytes {
    /// Maps `path` read-only.
    pub fn map(path: &Path) -> Result<FileBytes> {
        let io = |source| ModelError::Io { path: path.to_path_buf(), source };
        // A directory or a device is refused saying which (mapping one fails
        // obscurely, or maps nothing).
        crate::input::regular_file(path).map_err(io)?;
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process; like every
        // memory-mapped loader we rely on the file not being truncated or rewritten
        // while it is mapped (model files are not modified in place).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Ok(FileBytes::Mmap(map))
    }
}

/// A weight file (GGUF, safetensors) parsed and validated from its bytes, which
/// it keeps: mapped from disk ([`WeightFile::open`]) or held in memory
/// ([`WeightFile::parse`]: tests and fuzzing).
pub trait WeightFile: Sized {
    /// Parses and validates `bytes`; `path` only names the file in messages.
    fn from_bytes(path: &Path, bytes: FileBytes) -> Result<Self>;

    /// Maps `path` read-only and parses it.
    fn open(path: &Path) -> Result<Self> {
        Self::from_bytes(path, FileBytes::map(path)?)
    }

    /// Parses an image held in memory; `path` only names it in messages.
    fn parse(path: &Path, bytes: Vec<u8>) -> Result<Self> {
        Self::from_bytes(path, FileBytes::Owned(bytes))
    }
}

impl std::ops::Deref for FileBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            FileBytes::Mmap(m) => m,
            FileBytes::Owned(v) => v,
        }
    }
}
