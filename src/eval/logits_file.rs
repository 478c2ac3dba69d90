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
//! The header is checked when a file is opened (magic, version, type, each size
//! within its limit, the file's length against what they add up to, in checked
//! arithmetic): a truncated, foreign or hostile file is an error that names it,
//! before anything is allocated from its sizes. The reader then holds one chunk's
//! token ids or one row at a time. The writer is [`crate::atomic`]'s output: a
//! temporary file beside the target renamed once the last row is in (so an
//! interrupted run leaves no half file), or a character device written through.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use half::f16;

use super::EvalError;
use crate::atomic::{Inputs, OutputFile, WriteError};

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

/// The most values a row may hold (the largest vocabularies have ~262k tokens).
pub const MAX_VOCAB: usize = 1 << 24;
/// The most tokens a chunk may hold.
pub const MAX_CTX: usize = 1 << 24;

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

    /// Scored rows in all (saturating: a header read from a file is checked
    /// with [`Header::sizes`] first).
    pub fn positions(&self) -> u64 {
        (self.chunks as u64).saturating_mul(self.rows_per_chunk() as u64)
    }

    /// (bytes of the token ids, the file's whole length) this header implies,
    /// None when that does not fit in 64 bits.
    fn sizes(&self) -> Option<(u64, u64)> {
        let tokens = (self.chunks as u64).checked_mul(self.ctx as u64)?.checked_mul(4)?;
        let positions = (self.chunks as u64).checked_mul(self.rows_per_chunk() as u64)?;
        let rows = positions.checked_mul(self.vocab as u64)?.checked_mul(self.dtype.bytes())?;
        Some((tokens, HEADER_BYTES.checked_add(tokens)?.checked_add(rows)?))
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

/// Writes a logits file row by row, a chunk's worth buffered at most (never
/// the whole file); [`LogitsWriter::finish`] puts it in place.
pub struct LogitsWriter {
    header: Header,
    out: BufWriter<OutputFile>,
    rows: u64,
    buf: Vec<u8>,
}

impl LogitsWriter {
    /// Starts `path`, a file the user named (`--save-logits`, never one of
    /// `inputs`: [`crate::atomic`]), for `header`'s rows of `chunks` (`ctx` ids each).
    pub fn create(path: &Path, inputs: &Inputs<'_>, header: Header, chunks: &[Vec<u32>]) -> Result<LogitsWriter, EvalError> {
        let io = write_error(path);
        if chunks.len() != header.chunks || chunks.iter().any(|c| c.len() != header.ctx) {
            return Err(EvalError::Internal(format!(
                "{} chunks of token ids for {} chunks of {}",
                chunks.len(),
                header.chunks,
                header.ctx
            )));
        }
        let mut out = BufWriter::with_capacity(1 << 20, OutputFile::create(path, inputs)?);
        out.write_all(&header.encode()).map_err(&io)?;
        for t in chunks.iter().flatten() {
            out.write_all(&t.to_le_bytes()).map_err(&io)?;
        }
        Ok(LogitsWriter { header, out, rows: 0, buf: Vec::new() })
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
        let io = write_error(self.out.get_ref().path());
        self.out.write_all(&self.buf).map_err(io)?;
        self.rows += 1;
        Ok(())
    }

    /// Every row written: the file goes in place (renamed over the path, or
    /// written through a device). Returns the path.
    pub fn finish(self) -> Result<PathBuf, EvalError> {
        let path = self.out.get_ref().path().to_path_buf();
        if self.rows != self.header.positions() {
            return Err(EvalError::Internal(format!("{} of {} rows written", self.rows, self.header.positions())));
        }
        let out = self.out.into_inner().map_err(|e| write_error(&path)(e.into_error()))?;
        out.finish()?;
        Ok(path)
    }
}

/// A failed write of `path`, with what to do about it ([`crate::atomic::write_hint`]).
fn write_error(path: &Path) -> impl Fn(std::io::Error) -> EvalError + use<> {
    let path = path.to_path_buf();
    move |source| EvalError::Write(WriteError::Io { path: path.clone(), source })
}

/// Reads a logits file a piece at a time: the header when opened, then each
/// chunk's token ids ([`LogitsReader::next_tokens`]), then the rows in order
/// ([`LogitsReader::next_row`]); what it holds at once is one chunk's ids or one
/// row, whatever the file's size.
pub struct LogitsReader<R = BufReader<File>> {
    pub path: PathBuf,
    pub header: Header,
    input: R,
    buf: Vec<u8>,
    /// Chunks whose ids were read.
    token_chunks: usize,
    /// Where the rows start, and whether the reader is there yet.
    rows_at: u64,
    in_rows: bool,
    rows: u64,
}

impl LogitsReader {
    /// Opens `path` and checks its header against the file's length.
    pub fn open(path: &Path) -> Result<LogitsReader, EvalError> {
        let io = |source| EvalError::Io { path: path.to_path_buf(), source };
        crate::input::regular_file(path).map_err(io)?;
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        LogitsReader::from_reader(path, BufReader::with_capacity(1 << 20, file), len)
    }
}

impl<R: Read + Seek> LogitsReader<R> {
    /// Reads the header of `input`, `len` bytes long (`path` names it in
    /// errors), and checks it: every size within its limit, the length they
    /// add up to (in checked arithmetic) the file's.
    pub fn from_reader(path: &Path, mut input: R, len: u64) -> Result<LogitsReader<R>, EvalError> {
        let bad = |msg: String| EvalError::LogitsFile { path: path.to_path_buf(), msg };
        let io = |source| EvalError::Io { path: path.to_path_buf(), source };
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
        let positions = u64::from_le_bytes([head[32], head[33], head[34], head[35], head[36], head[37], head[38], head[39]]);
        if header.vocab == 0 || header.ctx < 2 || header.first >= header.ctx - 1 || header.chunks == 0 {
            return Err(bad(format!("header {header:?} describes no scored position; save it again with --save-logits")));
        }
        if header.vocab > MAX_VOCAB || header.ctx > MAX_CTX {
            return Err(bad(format!(
                "header says a vocabulary of {} and chunks of {} tokens; this reader takes at most {MAX_VOCAB} and {MAX_CTX}: not a logits file ktune wrote",
                header.vocab, header.ctx
            )));
        }
        if positions != header.positions() {
            return Err(bad(format!("header says {positions} positions, its chunks hold {}", header.positions())));
        }
        let Some((tokens, want)) = header.sizes() else {
            return Err(bad(format!(
                "header sizes ({} chunks of {} tokens, {positions} rows of {}) add up to more than 2^64 bytes: not a logits file ktune wrote",
                header.chunks, header.ctx, header.vocab
            )));
        };
        if len != want {
            let what = if len < want { "truncated" } else { "longer than its header says" };
            return Err(bad(format!(
                "{what}: {len} bytes, the header ({} chunks of {} tokens, {positions} rows of {}) needs {want}; save it again with --save-logits",
                header.chunks, header.ctx, header.vocab
            )));
        }
        Ok(LogitsReader {
            path: path.to_path_buf(),
            header,
            input,
            buf: Vec::new(),
            token_chunks: 0,
            rows_at: HEADER_BYTES + tokens,
            in_rows: false,
            rows: 0,
        })
    }

    /// The next chunk's token ids into `out` (before any row is read).
    pub fn next_tokens(&mut self, out: &mut Vec<u32>) -> Result<(), EvalError> {
        if self.in_rows || self.token_chunks >= self.header.chunks {
            return Err(EvalError::Internal(format!(
                "{}: chunk {}'s tokens read after the rows started or past its {} chunks",
                self.path.display(),
                self.token_chunks,
                self.header.chunks
            )));
        }
        self.buf.resize(4 * self.header.ctx, 0);
        self.input.read_exact(&mut self.buf).map_err(|source| EvalError::Io { path: self.path.clone(), source })?;
        out.clear();
        out.extend(self.buf.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])));
        self.token_chunks += 1;
        Ok(())
    }

    /// The next row of log-probabilities into `out`.
    pub fn next_row(&mut self, out: &mut Vec<f32>) -> Result<(), EvalError> {
        let io = |source| EvalError::Io { path: self.path.clone(), source };
        if self.rows >= self.header.positions() {
            return Err(EvalError::LogitsFile { path: self.path.clone(), msg: format!("read past its {} rows", self.header.positions()) });
        }
        if !self.in_rows {
            self.input.seek(SeekFrom::Start(self.rows_at)).map_err(io)?;
            self.in_rows = true;
        }
        self.buf.resize(self.header.vocab * self.header.dtype.bytes() as usize, 0);
        self.input.read_exact(&mut self.buf).map_err(io)?;
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
    fn write(path: &Path, dtype: LogitsDtype, chunks: &[Vec<u32>], rows: [[f32; 3]; 2]) {
        let mut w = LogitsWriter::create(path, &[], header(dtype), chunks).expect("create");
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
            let chunks = vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]];
            write(&path, dtype, &chunks, [[-0.5, -1.25, -3.0], [-2.0, -0.125, -4.5]]);
            let mut r = LogitsReader::open(&path).expect("open");
            assert_eq!(r.header, header(dtype));
            let mut ids = Vec::new();
            r.next_tokens(&mut ids).expect("tokens");
            assert_eq!(ids, chunks[0]);
            // The rows follow whichever chunks' ids were read.
            let mut row = Vec::new();
            r.next_row(&mut row).expect("row");
            assert_eq!(row, [-0.5, -1.25, -3.0]);
            assert!(r.next_tokens(&mut ids).is_err(), "no ids once the rows started");
            r.next_row(&mut row).expect("row");
            assert_eq!(row, [-2.0, -0.125, -4.5]);
            assert!(r.next_row(&mut row).is_err());
        }
    }

    #[test]
    fn truncated_and_foreign_files_are_refused_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("l.bin");
        write(&path, LogitsDtype::F32, &[vec![0; 4], vec![0; 4]], [[0.0; 3]; 2]);
        let bytes = std::fs::read(&path).expect("read");
        for cut in [bytes.len() - 1, 41, 39, 0] {
            std::fs::write(&path, &bytes[..cut]).expect("cut");
            let e = LogitsReader::open(&path).err().expect("truncated").to_string();
            assert!((e.contains("truncated") || e.contains("shorter than")) && e.contains("l.bin"), "{cut}: {e}");
        }
        std::fs::write(&path, b"GGUF and more bytes than a header holds, surely more than forty").expect("write");
        let e = LogitsReader::open(&path).err().expect("foreign").to_string();
        assert!(e.contains("not a ktune logits file"), "{e}");
    }

    /// A 40-byte header whose sizes, multiplied out, wrap a 64-bit length to the
    /// file's own 40 bytes.
    pub(crate) fn wrapping_header() -> Vec<u8> {
        // chunks 2^31 × ctx 2^24 × 4 bytes of ids wrap to 2^57 alone; the rows
        // (2^31 × (2^24 − 1) positions × 2^24 × 4 bytes) wrap again.
        let (vocab, ctx, first, chunks) = (1u32 << 24, 1u32 << 24, 0u32, 1u32 << 31);
        let positions = chunks as u64 * (ctx as u64 - 1);
        let mut h = MAGIC.to_vec();
        for v in [VERSION, 0, vocab, ctx, first, chunks] {
            h.extend_from_slice(&v.to_le_bytes());
        }
        h.extend_from_slice(&positions.to_le_bytes());
        h
    }

    /// Regression (issue 45): a 40-byte file whose header sizes wrapped the
    /// length check panicked (`capacity overflow`) or aborted allocating 64 TiB.
    #[test]
    fn a_header_whose_sizes_wrap_the_length_check_is_an_error() {
        let h = wrapping_header();
        assert_eq!(h.len(), 40);
        let e = LogitsReader::from_reader(Path::new("w.bin"), std::io::Cursor::new(&h), 40).err().expect("refused").to_string();
        assert!(e.contains("w.bin") && e.contains("more than 2^64 bytes"), "{e}");
        // Each size past its limit is named.
        let mut big = h.clone();
        big[16..20].copy_from_slice(&(u32::MAX).to_le_bytes());
        let e = LogitsReader::from_reader(Path::new("w.bin"), std::io::Cursor::new(&big), 40).err().expect("refused").to_string();
        assert!(e.contains(&format!("at most {MAX_VOCAB}")), "{e}");
    }

    #[test]
    fn an_unfinished_writer_leaves_no_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("l.bin");
        let mut w = LogitsWriter::create(&path, &[], header(LogitsDtype::F16), &[vec![0; 4], vec![0; 4]]).expect("create");
        w.row(&[0.0; 3]).expect("row");
        drop(w);
        assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 0);
    }
}
