//! The saved logits file (`eval --save-logits`, read back by `--reference FILE`
//! and by `tools/kld_check.py`): the log-probabilities of every scored position,
//! with the tokens they were computed on, so that a later run can check it scores
//! the same text the same way. Little-endian, in this order:
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `KTLOGPRB` |
//! | 4 | version, u32: 1 |
//! | 4 | value type, u32: 0 f32, 1 f16 |
//! | 4 | vocabulary size, u32 |
//! | 4 | context (tokens per chunk), u32 |
//! | 4 | first scored position of a chunk, u32 |
//! | 4 | chunks, u32 |
//! | 8 | positions (scored rows), u64: chunks × (context − 1 − first) |
//! | 4 × chunks × context | the token ids each chunk ran on, u32 |
//! | vocab × positions × 2 or 4 | the rows: chunk by chunk, position `first ..` `context − 2` of each (the row at position p predicts the chunk's token p + 1), log-probabilities as f16 or f32 |
//!
//! The header is checked when a file is opened (magic, version, type, sizes,
//! the file's length against them): a truncated or foreign file is an error that
//! names it. The writer writes a temporary file beside the target and renames it
//! once the last row is in, so an interrupted run leaves no half file.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use half::f16;

use super::EvalError;

/// The first 8 bytes of a logits file.
pub const MAGIC: &[u8; 8] = b"KTLOGPRB";
/// The format version this build writes and reads.
pub const VERSION: u32 = 1;
/// Bytes before the token ids.
pub const HEADER_BYTES: u64 = 40;

/// How a file stores the log-probabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogitsDtype {
    F32,
    F16,
}

impl std::str::FromStr for LogitsDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<LogitsDtype, String> {
        match s {
            "f32" => Ok(LogitsDtype::F32),
            "f16" => Ok(LogitsDtype::F16),
            other => Err(format!("`{other}`: the log-probabilities are saved as f32 or f16")),
        }
    }
}

impl LogitsDtype {
    fn code(self) -> u32 {
        match self {
            LogitsDtype::F32 => 0,
            LogitsDtype::F16 => 1,
        }
    }

    fn bytes(self) -> u64 {
        match self {
            LogitsDtype::F32 => 4,
            LogitsDtype::F16 => 2,
        }
    }
}

/// What a file's header says: the shape of the scored text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub dtype: LogitsDtype,
    pub vocab: usize,
    pub ctx: usize,
    pub first: usize,
    pub chunks: usize,
}

impl Header {
    /// Scored rows per chunk.
    pub fn rows_per_chunk(&self) -> usize {
        self.ctx.saturating_sub(1 + self.first)
    }

    /// Scored rows in all.
    pub fn positions(&self) -> u64 {
        (self.chunks * self.rows_per_chunk()) as u64
    }

    /// The file's length this header implies.
    fn file_len(&self) -> u64 {
        HEADER_BYTES + 4 * (self.chunks * self.ctx) as u64 + self.positions() * self.vocab as u64 * self.dtype.bytes()
    }

    fn encode(&self) -> Vec<u8> {
        let mut h = Vec::with_capacity(HEADER_BYTES as usize);
        h.extend_from_slice(MAGIC);
        for v in [VERSION, self.dtype.code(), self.vocab as u32, self.ctx as u32, self.first as u32, self.chunks as u32] {
            h.extend_from_slice(&v.to_le_bytes());
        }
        h.extend_from_slice(&self.positions().to_le_bytes());
        h
    }
}

/// Writes a logits file row by row; [`LogitsWriter::finish`] puts it in place.
pub struct LogitsWriter {
    path: PathBuf,
    header: Header,
    out: BufWriter<tempfile::NamedTempFile>,
    rows: u64,
    buf: Vec<u8>,
}

impl LogitsWriter {
    /// Starts `path` for `header`'s rows of `tokens` (`chunks × ctx` ids).
    pub fn create(path: &Path, header: Header, tokens: &[u32]) -> Result<LogitsWriter, EvalError> {
        let io = |source| EvalError::Io { path: path.to_path_buf(), source };
        if tokens.len() != header.chunks * header.ctx {
            return Err(EvalError::Internal(format!("{} token ids for {} chunks of {}", tokens.len(), header.chunks, header.ctx)));
        }
        let tmp = crate::atomic::temp_beside(path).map_err(io)?;
        let mut out = BufWriter::with_capacity(1 << 20, tmp);
        out.write_all(&header.encode()).map_err(io)?;
        for t in tokens {
            out.write_all(&t.to_le_bytes()).map_err(io)?;
        }
        Ok(LogitsWriter { path: path.to_path_buf(), header, out, rows: 0, buf: Vec::new() })
    }

    /// Appends the next row of log-probabilities.
    pub fn row(&mut self, logp: &[f32]) -> Result<(), EvalError> {
        if logp.len() != self.header.vocab || self.rows >= self.header.positions() {
            return Err(EvalError::Internal(format!(
                "row {} of {} values for a file of {} rows of {}",
                self.rows,
                logp.len(),
                self.header.positions(),
                self.header.vocab
            )));
        }
        self.buf.clear();
        match self.header.dtype {
            LogitsDtype::F32 => logp.iter().for_each(|v| self.buf.extend_from_slice(&v.to_le_bytes())),
            LogitsDtype::F16 => logp.iter().for_each(|&v| self.buf.extend_from_slice(&f16::from_f32(v).to_le_bytes())),
        }
        self.out.write_all(&self.buf).map_err(|source| EvalError::Io { path: self.path.clone(), source })?;
        self.rows += 1;
        Ok(())
    }

    /// Every row written: the file goes in place (renamed over `path`).
    pub fn finish(self) -> Result<PathBuf, EvalError> {
        let io = |source| EvalError::Io { path: self.path.clone(), source };
        if self.rows != self.header.positions() {
            return Err(EvalError::Internal(format!("{} of {} rows written", self.rows, self.header.positions())));
        }
        let tmp = self.out.into_inner().map_err(|e| io(e.into_error()))?;
        tmp.persist(&self.path).map_err(|e| io(e.error))?;
        Ok(self.path)
    }
}

/// Reads a logits file: the header and tokens at once, the rows in order.
pub struct LogitsReader {
    pub path: PathBuf,
    pub header: Header,
    /// `chunks × ctx` token ids.
    pub tokens: Vec<u32>,
    input: BufReader<File>,
    buf: Vec<u8>,
    rows: u64,
}

impl LogitsReader {
    /// Opens `path` and checks its header against the file's length.
    pub fn open(path: &Path) -> Result<LogitsReader, EvalError> {
        let bad = |msg: String| EvalError::LogitsFile { path: path.to_path_buf(), msg };
        let io = |source| EvalError::Io { path: path.to_path_buf(), source };
        crate::input::regular_file(path).map_err(io)?;
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let mut input = BufReader::with_capacity(1 << 20, file);
        let mut head = [0u8; HEADER_BYTES as usize];
        if len < HEADER_BYTES {
            return Err(bad(format!(
                "{len} bytes, shorter than the {HEADER_BYTES}-byte header: truncated or not a logits file; save it again with --save-logits"
            )));
        }
        input.read_exact(&mut head).map_err(io)?;
        if &head[..8] != MAGIC {
            return Err(bad("not a ktune logits file (no `KTLOGPRB` magic); write one with `ktune eval --save-logits`".into()));
        }
        let u32_at = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        let version = u32_at(8);
        if version != VERSION {
            return Err(bad(format!(
                "format version {version}; this ktune reads version {VERSION}: save the reference again with this build"
            )));
        }
        let dtype = match u32_at(12) {
            0 => LogitsDtype::F32,
            1 => LogitsDtype::F16,
            other => return Err(bad(format!("value type {other} is unknown (0 f32, 1 f16)"))),
        };
        let header =
            Header { dtype, vocab: u32_at(16) as usize, ctx: u32_at(20) as usize, first: u32_at(24) as usize, chunks: u32_at(28) as usize };
        let positions = u64::from_le_bytes(head[32..40].try_into().map_err(|_| bad("header".into()))?);
        if header.vocab == 0 || header.ctx < 2 || header.first + 1 >= header.ctx || header.chunks == 0 {
            return Err(bad(format!("header {header:?} describes no scored position")));
        }
        if positions != header.positions() {
            return Err(bad(format!("header says {positions} positions, its chunks hold {}", header.positions())));
        }
        let want = header.file_len();
        if len != want {
            let what = if len < want { "truncated" } else { "longer than its header says" };
            return Err(bad(format!(
                "{what}: {len} bytes, the header ({} chunks of {} tokens, {positions} rows of {}) needs {want}; save it again with --save-logits",
                header.chunks, header.ctx, header.vocab
            )));
        }
        let mut raw = vec![0u8; 4 * header.chunks * header.ctx];
        input.read_exact(&mut raw).map_err(io)?;
        let tokens = raw.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        Ok(LogitsReader { path: path.to_path_buf(), header, tokens, input, buf: Vec::new(), rows: 0 })
    }

    /// The next row of log-probabilities into `out`.
    pub fn next_row(&mut self, out: &mut Vec<f32>) -> Result<(), EvalError> {
        if self.rows >= self.header.positions() {
            return Err(EvalError::LogitsFile { path: self.path.clone(), msg: format!("read past its {} rows", self.header.positions()) });
        }
        let n = self.header.vocab;
        self.buf.resize(n * self.header.dtype.bytes() as usize, 0);
        self.input.read_exact(&mut self.buf).map_err(|source| EvalError::Io { path: self.path.clone(), source })?;
        out.clear();
        match self.header.dtype {
            LogitsDtype::F32 => out.extend(self.buf.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
            LogitsDtype::F16 => out.extend(self.buf.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())),
        }
        self.rows += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(dtype: LogitsDtype) -> Header {
        Header { dtype, vocab: 3, ctx: 4, first: 2, chunks: 2 }
    }

    /// A file of [`header`]'s shape with these two rows.
    fn write(path: &Path, dtype: LogitsDtype, tokens: &[u32], rows: [[f32; 3]; 2]) {
        let mut w = LogitsWriter::create(path, header(dtype), tokens).expect("create");
        for r in rows {
            w.row(&r).expect("row");
        }
        w.finish().expect("finish");
    }

    #[test]
    fn rows_round_trip_in_both_types() {
        let dir = tempfile::tempdir().expect("tempdir");
        for dtype in [LogitsDtype::F32, LogitsDtype::F16] {
            let path = dir.path().join("l.bin");
            let tokens: Vec<u32> = (0..8).collect();
            write(&path, dtype, &tokens, [[-0.5, -1.25, -3.0], [-2.0, -0.125, -4.5]]);
            let mut r = LogitsReader::open(&path).expect("open");
            assert_eq!((r.header.clone(), r.tokens.clone()), (header(dtype), tokens));
            let mut row = Vec::new();
            r.next_row(&mut row).expect("row");
            r.next_row(&mut row).expect("row");
            assert_eq!(row, [-2.0, -0.125, -4.5]);
            assert!(r.next_row(&mut row).is_err());
        }
    }

    #[test]
    fn truncated_and_foreign_files_are_refused_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("l.bin");
        write(&path, LogitsDtype::F32, &[0; 8], [[0.0; 3]; 2]);
        let bytes = std::fs::read(&path).expect("read");
        std::fs::write(&path, &bytes[..bytes.len() - 1]).expect("cut");
        let e = LogitsReader::open(&path).err().expect("truncated").to_string();
        assert!(e.contains("truncated") && e.contains("l.bin"), "{e}");
        std::fs::write(&path, b"GGUF and more bytes than a header holds, surely more than forty").expect("write");
        let e = LogitsReader::open(&path).err().expect("foreign").to_string();
        assert!(e.contains("not a ktune logits file"), "{e}");
    }

    #[test]
    fn an_unfinished_writer_leaves_no_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("l.bin");
        let mut w = LogitsWriter::create(&path, header(LogitsDtype::F16), &[0; 8]).expect("create");
        w.row(&[0.0; 3]).expect("row");
        drop(w);
        assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 0);
    }
}
