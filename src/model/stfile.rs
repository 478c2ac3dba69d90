//! One memory-mapped safetensors file: its header checked against the file's length
//! before anything is trusted (a hostile or truncated file gives an error, never a
//! panic or a huge allocation), and raw little-endian tensor bytes converted to
//! f32 or f16 (in parallel for large tensors).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use ::safetensors::SafeTensors;
use ::safetensors::tensor::Dtype as StDtype;
use half::{bf16, f16};
use memmap2::Mmap;
use rayon::prelude::*;

use super::config::Dtype;
use super::{ModelError, Result};

/// The header of a safetensors file is at most this long (the safetensors crate's own limit).
const MAX_HEADER: u64 = 100_000_000;

/// A tensor inside one file: dtype (None when ktune cannot read it), shape, and
/// its byte range in the map.
#[derive(Clone, Debug)]
pub(super) struct Entry {
    pub dtype: Result<Dtype, String>,
    pub shape: Vec<usize>,
    pub start: usize,
    pub end: usize,
}

/// A mapped file and its tensors.
pub(super) struct StFile {
    pub path: PathBuf,
    pub map: Mmap,
    pub tensors: BTreeMap<String, Entry>,
}

impl std::fmt::Debug for StFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StFile").field("path", &self.path).field("bytes", &self.map.len()).field("tensors", &self.tensors.len()).finish()
    }
}

fn file_err(path: &Path, msg: impl Into<String>) -> ModelError {
    ModelError::File { path: path.to_path_buf(), msg: msg.into() }
}

impl StFile {
    /// Maps `path` and validates its header: length within the file, JSON, every
    /// tensor's offsets contiguous, inside the data and matching dtype × shape.
    pub fn open(path: &Path) -> Result<StFile> {
        let file = File::open(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
        let len = file.metadata().map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?.len();
        if len < 8 {
            return Err(file_err(path, format!("{len} bytes: too short for a safetensors header")));
        }
        // SAFETY: the map is read-only and private to this process; like every
        // memory-mapped loader we rely on the file not being truncated or rewritten
        // while it is mapped (checkpoints are not modified in place).
        let map = unsafe { Mmap::map(&file) }.map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
        let mut n = [0u8; 8];
        n.copy_from_slice(&map[..8]);
        let header_len = u64::from_le_bytes(n);
        if header_len > MAX_HEADER {
            return Err(file_err(path, format!("header length {header_len} is absurd (limit {MAX_HEADER}): not a safetensors file?")));
        }
        if 8 + header_len > len {
            return Err(file_err(path, format!("header claims {header_len} bytes but the file has only {len}: truncated?")));
        }
        let (n, meta) = SafeTensors::read_metadata(&map).map_err(|e| {
            let hint = match e {
                ::safetensors::SafeTensorError::MetadataIncompleteBuffer => {
                    " (the data section is shorter or longer than the header says: truncated?)"
                }
                _ => "",
            };
            file_err(path, format!("bad safetensors header: {e}{hint}"))
        })?;
        let data_start = 8 + n;
        let mut tensors = BTreeMap::new();
        for (name, info) in meta.tensors() {
            let (s, e) = info.data_offsets;
            // read_metadata checked these against the file; check again before indexing.
            let (start, end) = (data_start.checked_add(s), data_start.checked_add(e));
            let (Some(start), Some(end)) = (start, end) else {
                return Err(file_err(path, format!("tensor `{name}`: offsets overflow")));
            };
            if start > end || end > map.len() {
                return Err(file_err(path, format!("tensor `{name}`: bytes {start}..{end} lie outside the file ({} bytes)", map.len())));
            }
            let dtype = match info.dtype {
                StDtype::F32 => Ok(Dtype::F32),
                StDtype::F16 => Ok(Dtype::F16),
                StDtype::BF16 => Ok(Dtype::BF16),
                other => Err(format!("{other:?}")),
            };
            tensors.insert(name, Entry { dtype, shape: info.shape.clone(), start, end });
        }
        Ok(StFile { path: path.to_path_buf(), map, tensors })
    }

    /// The bytes of `e`.
    pub fn bytes(&self, e: &Entry) -> &[u8] {
        &self.map[e.start..e.end]
    }
}

/// Elements per parallel task when converting.
const PAR_CHUNK: usize = 1 << 16;

/// Converts little-endian `src` of `dtype` into `out` (exactly `src.len() / dtype.size()` values).
pub(super) fn to_f32(dtype: Dtype, src: &[u8], out: &mut [f32]) {
    let sz = dtype.size();
    let conv = |s: &[u8], o: &mut [f32]| match dtype {
        Dtype::F32 => o.iter_mut().zip(s.chunks_exact(4)).for_each(|(o, b)| *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        Dtype::F16 => o.iter_mut().zip(s.chunks_exact(2)).for_each(|(o, b)| *o = f16::from_le_bytes([b[0], b[1]]).to_f32()),
        Dtype::BF16 => o.iter_mut().zip(s.chunks_exact(2)).for_each(|(o, b)| *o = bf16::from_le_bytes([b[0], b[1]]).to_f32()),
    };
    if out.len() <= PAR_CHUNK {
        conv(src, out);
    } else {
        out.par_chunks_mut(PAR_CHUNK).zip(src.par_chunks(PAR_CHUNK * sz)).for_each(|(o, s)| conv(s, o));
    }
}

/// As [`to_f32`], into f16 (F32 and BF16 rounded to nearest).
pub(super) fn to_f16(dtype: Dtype, src: &[u8], out: &mut [f16]) {
    let sz = dtype.size();
    let conv = |s: &[u8], o: &mut [f16]| match dtype {
        Dtype::F32 => {
            o.iter_mut().zip(s.chunks_exact(4)).for_each(|(o, b)| *o = f16::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
        }
        Dtype::F16 => o.iter_mut().zip(s.chunks_exact(2)).for_each(|(o, b)| *o = f16::from_le_bytes([b[0], b[1]])),
        Dtype::BF16 => {
            o.iter_mut().zip(s.chunks_exact(2)).for_each(|(o, b)| *o = f16::from_f32(bf16::from_le_bytes([b[0], b[1]]).to_f32()))
        }
    };
    if out.len() <= PAR_CHUNK {
        conv(src, out);
    } else {
        out.par_chunks_mut(PAR_CHUNK).zip(src.par_chunks(PAR_CHUNK * sz)).for_each(|(o, s)| conv(s, o));
    }
}
