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
    map: Bytes,
    pub tensors: BTreeMap<String, Entry>,
}

/// The file's bytes: memory-mapped, or owned (tests and fuzzing parse buffers).
enum Bytes {
    Mmap(Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mmap(m) => m,
            Bytes::Owned(v) => v,
        }
    }
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
        StFile::from_bytes(path, Bytes::Mmap(map))
    }

    /// Parses a safetensors image held in memory; `path` only names it in messages.
    pub fn parse(path: &Path, bytes: Vec<u8>) -> Result<StFile> {
        StFile::from_bytes(path, Bytes::Owned(bytes))
    }

    fn from_bytes(path: &Path, map: Bytes) -> Result<StFile> {
        let len = map.len() as u64;
        if len < 8 {
            return Err(file_err(path, format!("{len} bytes: too short for a safetensors header")));
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A safetensors image: header length, JSON header (padded as written), data.
    fn image(header: &str, data: usize) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.extend(std::iter::repeat_n(0u8, data));
        v
    }

    fn err(bytes: Vec<u8>) -> String {
        match StFile::parse(Path::new("t.safetensors"), bytes) {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    const GOOD: &str =
        r#"{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[4],"data_offsets":[16,24]}}"#;

    #[test]
    fn a_valid_image_parses() {
        let f = StFile::parse(Path::new("t"), image(GOOD, 24)).expect("valid");
        assert_eq!(f.tensors.len(), 2);
        assert_eq!(f.bytes(&f.tensors["b"]).len(), 8);
        assert_eq!(f.tensors["b"].dtype, Ok(Dtype::BF16));
    }

    #[test]
    fn short_files_and_header_lengths() {
        assert!(err(vec![1, 0, 0]).contains("too short"));
        // Header length past the end of the file.
        let mut v = image(GOOD, 24);
        let n = v.len() as u64;
        v[..8].copy_from_slice(&n.to_le_bytes());
        assert!(err(v).contains("truncated"), "header past the end");
        // An absurd header length.
        let mut v = image(GOOD, 24);
        v[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(err(v).contains("absurd"));
        // Every truncation of a valid image is an error.
        let full = image(GOOD, 24);
        for n in 0..full.len() {
            assert!(StFile::parse(Path::new("t"), full[..n].to_vec()).is_err(), "{n} bytes parsed");
        }
    }

    #[test]
    fn offsets_and_shapes_must_match_the_data() {
        // Offsets beyond the data.
        let h = r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,64]}}"#;
        assert!(err(image(h, 16)).contains("bad safetensors header"));
        // dtype x shape disagreeing with the byte range.
        let h = r#"{"a":{"dtype":"F16","shape":[4],"data_offsets":[0,16]}}"#;
        assert!(err(image(h, 16)).contains("bad safetensors header"));
        // Offsets reversed.
        let h = r#"{"a":{"dtype":"F32","shape":[0],"data_offsets":[16,0]}}"#;
        assert!(err(image(h, 16)).contains("bad safetensors header"));
        // Not JSON.
        assert!(err(image("{not json}", 0)).contains("bad safetensors header"));
        // A dtype ktune cannot read is kept as an error for that tensor only.
        let h = r#"{"a":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}}"#;
        let f = StFile::parse(Path::new("t"), image(h, 16)).expect("parses");
        assert!(f.tensors["a"].dtype.is_err());
    }
}
