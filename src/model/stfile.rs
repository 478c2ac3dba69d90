//! One memory-mapped safetensors file: its header checked against the file's length
//! before anything is trusted (a hostile or truncated file gives an error, never a
//! panic or a huge allocation), and raw little-endian tensor bytes converted to
//! f32 or f16 (in parallel for large tensors).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ::safetensors::SafeTensors;
use ::safetensors::tensor::Dtype as StDtype;
use rayon::prelude::*;

use super::bytes::{FileBytes, WeightFile};
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
    map: FileBytes,
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

/// Validates the header: length within the file, JSON, every tensor's offsets
/// contiguous, inside the data and matching dtype × shape.
impl WeightFile for StFile {
    fn from_bytes(path: &Path, map: FileBytes) -> Result<StFile> {
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
}

impl StFile {
    /// The bytes of `e`.
    pub fn bytes(&self, e: &Entry) -> &[u8] {
        &self.map[e.start..e.end]
    }
}

/// Elements per parallel task when converting.
pub(super) const PAR_CHUNK: usize = 1 << 16;

pub use crate::kernels::convert::Elem;

/// Converts little-endian `src` of `dtype` into `out` (exactly `src.len() / dtype.size()` values).
pub(super) fn decode_le<T: Elem>(dtype: Dtype, src: &[u8], out: &mut [T]) {
    let sz = dtype.size();
    let conv = |s: &[u8], o: &mut [T]| match dtype {
        Dtype::F32 => T::from_le_f32(s, o),
        Dtype::F16 => T::from_le_f16(s, o),
        Dtype::BF16 => T::from_le_bf16(s, o),
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
