//! The bytes of a weight file, memory-mapped (a file on disk) or owned (an image
//! parsed from memory by tests and fuzzing), read through one `&[u8]` view by the
//! safetensors and GGUF readers.

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use super::{ModelError, Result};

pub(super) enum FileBytes {
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

impl std::ops::Deref for FileBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            FileBytes::Mmap(m) => m,
            FileBytes::Owned(v) => v,
        }
    }
}
