//! One memory-mapped GGUF file (versions 2 and 3, little-endian): header,
//! metadata key/values of every type (arrays included), tensor infos and the
//! aligned data section.
//!
//! A metadata array is kept compactly ([`Array`]): numbers and bools as their
//! values, strings as one text with end offsets, arrays of arrays (which ktune
//! never reads) only as their count and byte range; so the metadata
//! takes no more memory than its bytes in the file, whatever it holds.
//!
//! Every count and length in the file is untrusted: it is checked against the
//! bytes left in the file before anything is allocated from it, so a truncated
//! or hostile file gives a [`ModelError::File`] naming the problem, never a
//! panic or an allocation larger than the file justifies. Tensor byte ranges
//! are checked to lie inside the data section, be aligned and not overlap.
//! Tensors of types ktune cannot decode are still bounds-checked (their block
//! sizes are known) and fail with a message naming them when read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use half::{bf16, f16};

use super::bytes::{FileBytes, WeightFile};
use super::{ModelError, Result};
use crate::kernels::DType;
use crate::kernels::quant::{QFormat, dequantize_block, split_block};

/// "GGUF" as a little-endian u32 at the start of the file.
const MAGIC: &[u8; 4] = b"GGUF";
/// ggml's limit on tensor dimensions.
const MAX_DIMS: u32 = 4;
/// Deepest array nesting accepted (arrays of arrays of …).
const MAX_NESTING: usize = 3;
/// Default alignment of the data section and of every tensor in it.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Array),
}

/// A metadata array (see the module docs): elements of one GGUF type.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    /// The strings one after another in `text`, the `i`th ending at `ends[i]`.
    Str {
        text: String,
        ends: Vec<usize>,
    },
    /// Arrays of arrays: their count and bytes in the file, checked but not
    /// decoded.
    Nested {
        len: usize,
        bytes: std::ops::Range<usize>,
    },
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::F64(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::Str { ends, .. } => ends.len(),
            Array::Nested { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The GGUF type id of the elements.
    pub fn elem_type(&self) -> u32 {
        match self {
            Array::U8(_) => 0,
            Array::I8(_) => 1,
            Array::U16(_) => 2,
            Array::I16(_) => 3,
            Array::U32(_) => 4,
            Array::I32(_) => 5,
            Array::F32(_) => 6,
            Array::Bool(_) => 7,
            Array::Str { .. } => 8,
            Array::Nested { .. } => 9,
            Array::U64(_) => 10,
            Array::I64(_) => 11,
            Array::F64(_) => 12,
        }
    }

    /// String `i` of an array of strings.
    pub fn str_at(&self, i: usize) -> Option<&str> {
        match self {
            Array::Str { text, ends } => {
                let start = if i == 0 { 0 } else { *ends.get(i - 1)? };
                text.get(start..*ends.get(i)?)
            }
            _ => None,
        }
    }

    /// The strings of an array of strings (None for another element type).
    pub fn strs(&self) -> Option<impl Iterator<Item = &str>> {
        matches!(self, Array::Str { .. }).then(|| (0..self.len()).map_while(|i| self.str_at(i)))
    }

    /// Element `i` as a value (None past the end, and for an array of arrays,
    /// whose elements are not decoded).
    pub fn get(&self, i: usize) -> Option<Value> {
        Some(match self {
            Array::U8(v) => Value::U8(*v.get(i)?),
            Array::I8(v) => Value::I8(*v.get(i)?),
            Array::U16(v) => Value::U16(*v.get(i)?),
            Array::I16(v) => Value::I16(*v.get(i)?),
            Array::U32(v) => Value::U32(*v.get(i)?),
            Array::I32(v) => Value::I32(*v.get(i)?),
            Array::U64(v) => Value::U64(*v.get(i)?),
            Array::I64(v) => Value::I64(*v.get(i)?),
            Array::F32(v) => Value::F32(*v.get(i)?),
            Array::F64(v) => Value::F64(*v.get(i)?),
            Array::Bool(v) => Value::Bool(*v.get(i)?),
            Array::Str { .. } => Value::Str(self.str_at(i)?.to_string()),
            Array::Nested { .. } => return None,
        })
    }

    /// The elements as values (none for an array of arrays).
    pub fn values(&self) -> impl Iterator<Item = Value> + '_ {
        (0..self.len()).map_while(|i| self.get(i))
    }

    /// Every element as a number (None when one is not a number).
    pub fn numbers(&self) -> Option<Vec<f64>> {
        let v: Vec<f64> = self.values().map(|x| x.as_f64()).collect::<Option<_>>()?;
        (v.len() == self.len()).then_some(v)
    }

    /// Every element as a bool (None when one is not a bool).
    pub fn bools(&self) -> Option<&[bool]> {
        match self {
            Array::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// An array of `values`, all of one scalar type (None when they are not, or
    /// there are none to tell the type by): what a GGUF writer builds from.
    pub fn from_values(values: Vec<Value>) -> Option<Array> {
        fn all<T>(values: &[Value], f: impl Fn(&Value) -> Option<T>) -> Option<Vec<T>> {
            values.iter().map(f).collect()
        }
        let v = &values;
        Some(match v.first()? {
            Value::U8(_) => Array::U8(all(v, |x| if let Value::U8(a) = x { Some(*a) } else { None })?),
            Value::I8(_) => Array::I8(all(v, |x| if let Value::I8(a) = x { Some(*a) } else { None })?),
            Value::U16(_) => Array::U16(all(v, |x| if let Value::U16(a) = x { Some(*a) } else { None })?),
            Value::I16(_) => Array::I16(all(v, |x| if let Value::I16(a) = x { Some(*a) } else { None })?),
            Value::U32(_) => Array::U32(all(v, |x| if let Value::U32(a) = x { Some(*a) } else { None })?),
            Value::I32(_) => Array::I32(all(v, |x| if let Value::I32(a) = x { Some(*a) } else { None })?),
            Value::U64(_) => Array::U64(all(v, |x| if let Value::U64(a) = x { Some(*a) } else { None })?),
            Value::I64(_) => Array::I64(all(v, |x| if let Value::I64(a) = x { Some(*a) } else { None })?),
            Value::F32(_) => Array::F32(all(v, |x| if let Value::F32(a) = x { Some(*a) } else { None })?),
            Value::F64(_) => Array::F64(all(v, |x| if let Value::F64(a) = x { Some(*a) } else { None })?),
            Value::Bool(_) => Array::Bool(all(v, Value::as_bool)?),
            Value::Str(_) => {
                let (mut text, mut ends) = (String::new(), Vec::with_capacity(v.len()));
                for x in v {
                    text.push_str(x.as_str()?);
                    ends.push(text.len());
                }
                Array::Str { text, ends }
            }
            Value::Array(_) => return None,
        })
    }
}

impl Value {
    /// The GGUF type name, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "uint8",
            Value::I8(_) => "int8",
            Value::U16(_) => "uint16",
            Value::I16(_) => "int16",
            Value::U32(_) => "uint32",
            Value::I32(_) => "int32",
            Value::U64(_) => "uint64",
            Value::I64(_) => "int64",
            Value::F32(_) => "float32",
            Value::F64(_) => "float64",
            Value::Bool(_) => "bool",
            Value::Str(_) => "string",
            Value::Array(_) => "array",
        }
    }

    /// A non-negative integer of any integer type.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// A number of any numeric type.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            Value::I8(v) => Some(v as f64),
            Value::I16(v) => Some(v as f64),
            Value::I32(v) => Some(v as f64),
            Value::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Short rendering for messages (arrays by length).
    pub fn describe(&self) -> String {
        match self {
            Value::Str(s) => {
                let p = crate::text::prefix(s, 40);
                format!("{p:?}{}", if p.len() < s.len() { "…" } else { "" })
            }
            Value::Array(a) => format!("[{} values]", a.len()),
            Value::U8(v) => v.to_string(),
            Value::I8(v) => v.to_string(),
            Value::U16(v) => v.to_string(),
            Value::I16(v) => v.to_string(),
            Value::U32(v) => v.to_string(),
            Value::I32(v) => v.to_string(),
            Value::U64(v) => v.to_string(),
            Value::I64(v) => v.to_string(),
            Value::F32(v) => v.to_string(),
            Value::F64(v) => v.to_string(),
            Value::Bool(v) => v.to_string(),
        }
    }
}

/// A ggml tensor type: its id, name and block geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GgmlType {
    pub id: u32,
    pub name: &'static str,
    /// Elements per block.
    pub block: usize,
    /// Bytes per block.
    pub bytes: usize,
}

/// The ggml types ktune stores as no [`DType`] of its own, whose geometry is
/// known (ids as in ggml.h): BF16 (decoded to f32) and the types it cannot read.
/// ktune's own storage types come from the format list ([`DType::ALL`]).
const OTHER_GGML_TYPES: &[(u32, &str, usize, usize)] = &[
    (9, "Q8_1", 32, 40),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
];

impl GgmlType {
    pub fn from_id(id: u32) -> Option<GgmlType> {
        if let Some(d) = DType::from_ggml_type(id) {
            let (block, bytes) = d.ggml_block();
            return Some(GgmlType { id, name: d.ggml_name(), block, bytes });
        }
        OTHER_GGML_TYPES.iter().find(|t| t.0 == id).map(|&(id, name, block, bytes)| GgmlType { id, name, block, bytes })
    }

    pub const BF16: u32 = 30;

    /// What ktune can decode this type as.
    pub fn kind(self) -> Option<Stored> {
        if self.id == Self::BF16 {
            return Some(Stored::BF16);
        }
        DType::from_ggml_type(self.id).and_then(|d| match d {
            DType::F32 => Some(Stored::F32),
            DType::F16 => Some(Stored::F16),
            d => d.quant().map(Stored::Quant),
        })
    }
}

/// A storage type ktune decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    F32,
    F16,
    BF16,
    Quant(QFormat),
}

/// One tensor's info: GGUF name, dims as ggml orders them (`ne[0]` = elements of
/// a row, the fastest), type, and its byte range in the map.
#[derive(Clone, Debug)]
pub struct GgufTensor {
    pub name: String,
    pub ne: Vec<usize>,
    pub ty: GgmlType,
    pub start: usize,
    pub end: usize,
}

impl GgufTensor {
    /// Shape in row-major (Hugging Face / PyTorch) order: `ne` reversed.
    pub fn shape(&self) -> Vec<usize> {
        self.ne.iter().rev().copied().collect()
    }
    pub fn numel(&self) -> usize {
        self.ne.iter().product()
    }
    /// Elements per row (`ne[0]`).
    pub fn cols(&self) -> usize {
        self.ne.first().copied().unwrap_or(1)
    }
    pub fn rows(&self) -> usize {
        self.ne.iter().skip(1).product()
    }
    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.cols() / self.ty.block * self.ty.bytes
    }
}

/// A mapped GGUF file.
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub alignment: u64,
    /// Metadata in file order.
    pub meta: Vec<(String, Value)>,
    index: BTreeMap<String, usize>,
    pub tensors: Vec<GgufTensor>,
    tensor_index: BTreeMap<String, usize>,
    map: FileBytes,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.meta.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// A cursor over untrusted bytes; every read is bounds-checked.
struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn err(&self, msg: impl Into<String>) -> ModelError {
        ModelError::File { path: self.path.to_path_buf(), msg: msg.into() }
    }
    fn left(&self) -> usize {
        self.b.len() - self.pos
    }
    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.left() {
            return Err(self.err(format!(
                "truncated: {} at byte {} needs {n} bytes, the file has {} left (an incomplete download?)",
                what(),
                self.pos,
                self.left()
            )));
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }
    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    /// A length-prefixed UTF-8 string; the length is checked against the bytes left first.
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        self.str_ref(what).map(str::to_string)
    }

    /// [`Cursor::string`], borrowed from the file's bytes.
    fn str_ref(&mut self, what: &dyn Fn() -> String) -> Result<&'a str> {
        let at = self.pos;
        let n = self.u64(&|| format!("the length of {}", what()))?;
        if n > self.left() as u64 {
            return Err(self.err(format!(
                "{} at byte {at} claims {n} bytes, the file has {} left: corrupt or truncated",
                what(),
                self.left()
            )));
        }
        let bytes = self.take(n as usize, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s),
            Err(e) => Err(self.err(format!("{} at byte {at} is not valid UTF-8 ({e})", what()))),
        }
    }

    /// `n` fixed-size elements of `N` bytes each, converted by `conv`.
    fn fixed<T, const N: usize>(&mut self, n: usize, conv: fn([u8; N]) -> T, what: &dyn Fn() -> String) -> Result<Vec<T>> {
        let bytes = self.take(n.saturating_mul(N), what)?;
        Ok(bytes.chunks_exact(N).map(|b| conv(std::array::from_fn(|i| b[i]))).collect())
    }

    /// A bool's byte.
    fn bool(&self, b: u8, what: &dyn Fn() -> String) -> Result<bool> {
        match b {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(self.err(format!("{}: bool value {b} is neither 0 nor 1", what()))),
        }
    }

    /// The `n` elements of type `elem` of an array (`depth` enclosing arrays),
    /// whose count was checked against the bytes left.
    fn array_of(&mut self, elem: u32, n: usize, depth: usize, what: &dyn Fn() -> String) -> Result<Array> {
        Ok(match elem {
            0 => Array::U8(self.take(n, what)?.to_vec()),
            1 => Array::I8(self.fixed(n, i8::from_le_bytes, what)?),
            2 => Array::U16(self.fixed(n, u16::from_le_bytes, what)?),
            3 => Array::I16(self.fixed(n, i16::from_le_bytes, what)?),
            4 => Array::U32(self.fixed(n, u32::from_le_bytes, what)?),
            5 => Array::I32(self.fixed(n, i32::from_le_bytes, what)?),
            6 => Array::F32(self.fixed(n, f32::from_le_bytes, what)?),
            7 => Array::Bool(self.take(n, what)?.iter().map(|&b| self.bool(b, what)).collect::<Result<_>>()?),
            8 => {
                let (mut text, mut ends) = (String::new(), Vec::with_capacity(n));
                for i in 0..n {
                    text.push_str(self.str_ref(&|| format!("{}[{i}]", what()))?);
                    ends.push(text.len());
                }
                Array::Str { text, ends }
            }
            10 => Array::U64(self.fixed(n, u64::from_le_bytes, what)?),
            11 => Array::I64(self.fixed(n, i64::from_le_bytes, what)?),
            12 => Array::F64(self.fixed(n, f64::from_le_bytes, what)?),
            9 => {
                // Arrays of arrays: checked element by element, kept as their bytes.
                let start = self.pos;
                for i in 0..n {
                    self.value(elem, depth + 1, &|| format!("{}[{i}]", what()))?;
                }
                Array::Nested { len: n, bytes: start..self.pos }
            }
            other => return Err(self.err(format!("{}: unknown array element type {other}", what()))),
        })
    }

    /// A value of type `ty`; `depth` counts enclosing arrays.
    fn value(&mut self, ty: u32, depth: usize, what: &dyn Fn() -> String) -> Result<Value> {
        Ok(match ty {
            0 => Value::U8(self.array::<1>(what)?[0]),
            1 => Value::I8(self.array::<1>(what)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            4 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            5 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            7 => {
                let [b] = self.array::<1>(what)?;
                Value::Bool(self.bool(b, what)?)
            }
            8 => Value::Str(self.string(what)?),
            9 => {
                if depth >= MAX_NESTING {
                    return Err(self.err(format!("{}: arrays nested deeper than {MAX_NESTING} levels", what())));
                }
                let elem = self.u32(&|| format!("the element type of {}", what()))?;
                let at = self.pos;
                let n = self.u64(&|| format!("the length of {}", what()))?;
                let min = min_value_size(elem).ok_or_else(|| self.err(format!("{}: unknown array element type {elem}", what())))?;
                // Check the count against the bytes left before allocating anything for it.
                if n.checked_mul(min as u64).is_none_or(|need| need > self.left() as u64) {
                    return Err(self.err(format!(
                        "{} at byte {at} claims {n} elements, more than the {} bytes left can hold: corrupt or truncated",
                        what(),
                        self.left()
                    )));
                }
                Value::Array(self.array_of(elem, n as usize, depth, what)?)
            }
            10 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            11 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            other => return Err(self.err(format!("{}: unknown value type {other} (GGUF defines 0..=12)", what()))),
        })
    }
}

/// The fewest bytes a value of type `ty` takes in the file (None: unknown type).
fn min_value_size(ty: u32) -> Option<usize> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 => 8,
        9 => 12,
        10..=12 => 8,
        _ => return None,
    })
}

impl WeightFile for GgufFile {
    fn from_bytes(path: &Path, map: FileBytes) -> Result<GgufFile> {
        let b = &map[..];
        let mut c = Cursor { b, pos: 0, path };
        let magic = c
            .take(4, &|| "the GGUF magic".into())
            .map_err(|_| ModelError::File { path: path.to_path_buf(), msg: format!("{} bytes: too short to be a GGUF file", b.len()) })?;
        if magic != MAGIC {
            return Err(c.err(format!("not a GGUF file (starts with {magic:02x?}, expected \"GGUF\")")));
        }
        let version = c.u32(&|| "the version".into())?;
        match version {
            2 | 3 => {}
            1 => return Err(c.err("GGUF version 1 (32-bit counts) is not supported: re-convert the model with a current llama.cpp")),
            v if v.swap_bytes() <= 3 => {
                return Err(c.err("a big-endian GGUF file: only little-endian files are supported (convert without --bigendian)"));
            }
            v => return Err(c.err(format!("GGUF version {v} is not supported (2 and 3 are)"))),
        }
        let n_tensors = c.u64(&|| "the tensor count".into())?;
        let n_kv = c.u64(&|| "the metadata count".into())?;
        // A key/value takes at least 13 bytes (key length, type, 1-byte value); a
        // tensor info at least 24 (name length, dims count, type, offset).
        if n_kv.checked_mul(13).is_none_or(|n| n > c.left() as u64) {
            return Err(c.err(format!("header claims {n_kv} metadata entries, more than the file's {} bytes can hold: corrupt", b.len())));
        }
        if n_tensors.checked_mul(24).is_none_or(|n| n > c.left() as u64) {
            return Err(c.err(format!("header claims {n_tensors} tensors, more than the file's {} bytes can hold: corrupt", b.len())));
        }
        let mut meta = Vec::with_capacity(n_kv as usize);
        let mut index = BTreeMap::new();
        for i in 0..n_kv {
            let key = c.string(&|| format!("metadata key #{i}"))?;
            let ty = c.u32(&|| format!("the type of metadata `{key}`"))?;
            let value = c.value(ty, 0, &|| format!("metadata `{key}`"))?;
            if index.insert(key.clone(), meta.len()).is_some() {
                return Err(c.err(format!("metadata key `{key}` appears twice")));
            }
            meta.push((key, value));
        }
        let alignment = match index.get("general.alignment").map(|&i| &meta[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(Value::U32(a)) if a.is_power_of_two() => *a as u64,
            Some(v) => {
                return Err(c.err(format!(
                    "`general.alignment` is {} ({}), it must be a uint32 power of two",
                    v.describe(),
                    v.type_name()
                )));
            }
        };
        struct Info {
            name: String,
            ne: Vec<usize>,
            ty: GgmlType,
            offset: u64,
            bytes: usize,
        }
        let mut infos: Vec<Info> = Vec::with_capacity(n_tensors as usize);
        let mut tensor_index = BTreeMap::new();
        for i in 0..n_tensors {
            let name = c.string(&|| format!("tensor name #{i}"))?;
            let n_dims = c.u32(&|| format!("the dimension count of tensor `{name}`"))?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(c.err(format!("tensor `{name}` has {n_dims} dimensions (ggml allows 1 to {MAX_DIMS})")));
            }
            let mut ne = Vec::with_capacity(n_dims as usize);
            for d in 0..n_dims {
                let v = c.u64(&|| format!("dimension {d} of tensor `{name}`"))?;
                let v = usize::try_from(v).ok().filter(|&v| v <= i64::MAX as usize && v > 0);
                let Some(v) = v else {
                    return Err(c.err(format!("tensor `{name}`: dimension {d} is 0 or too large")));
                };
                ne.push(v);
            }
            let ty_id = c.u32(&|| format!("the type of tensor `{name}`"))?;
            let offset = c.u64(&|| format!("the data offset of tensor `{name}`"))?;
            let Some(ty) = GgmlType::from_id(ty_id) else {
                return Err(c.err(format!("tensor `{name}` has unknown ggml type {ty_id}: a newer llama.cpp format ktune does not know")));
            };
            let numel = ne.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            let Some(numel) = numel.filter(|&n| n <= i64::MAX as usize) else {
                return Err(c.err(format!("tensor `{name}`: dimensions {ne:?} overflow")));
            };
            if ne[0] % ty.block != 0 {
                return Err(c.err(format!(
                    "tensor `{name}`: rows of {} elements are not a whole number of {} blocks ({} elements)",
                    ne[0], ty.name, ty.block
                )));
            }
            let Some(bytes) = (numel / ty.block).checked_mul(ty.bytes) else {
                return Err(c.err(format!("tensor `{name}`: its size overflows")));
            };
            if tensor_index.insert(name.clone(), infos.len()).is_some() {
                return Err(c.err(format!("tensor `{name}` appears twice")));
            }
            infos.push(Info { name, ne, ty, offset, bytes });
        }
        // The data section starts at the next multiple of the alignment.
        let data_start = (c.pos as u64).div_ceil(alignment).saturating_mul(alignment);
        let len = b.len() as u64;
        if data_start > len && !infos.is_empty() {
            return Err(
                c.err(format!("the data section would start at byte {data_start}, past the end of the file ({len} bytes): truncated?"))
            );
        }
        let mut tensors = Vec::with_capacity(infos.len());
        for info in infos {
            let name = &info.name;
            if info.offset % alignment != 0 {
                return Err(c.err(format!("tensor `{name}`: offset {} is not a multiple of the alignment {alignment}", info.offset)));
            }
            let start = data_start.checked_add(info.offset);
            let end = start.and_then(|s| s.checked_add(info.bytes as u64));
            let (Some(start), Some(end)) = (start, end) else {
                return Err(c.err(format!("tensor `{name}`: offset {} overflows", info.offset)));
            };
            if end > len {
                return Err(c.err(format!("tensor `{name}`: bytes {start}..{end} lie past the end of the file ({len} bytes): truncated?")));
            }
            tensors.push(GgufTensor { name: info.name, ne: info.ne, ty: info.ty, start: start as usize, end: end as usize });
        }
        let mut order: Vec<&GgufTensor> = tensors.iter().filter(|t| t.end > t.start).collect();
        order.sort_by_key(|t| t.start);
        for w in order.windows(2) {
            if w[1].start < w[0].end {
                return Err(c.err(format!(
                    "tensors `{}` (bytes {}..{}) and `{}` (bytes {}..{}) overlap: corrupt file",
                    w[0].name, w[0].start, w[0].end, w[1].name, w[1].start, w[1].end
                )));
            }
        }
        Ok(GgufFile { path: path.to_path_buf(), version, alignment, meta, index, tensors, tensor_index, map })
    }
}

impl GgufFile {
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The value of metadata `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.meta[i].1)
    }

    pub fn tensor(&self, name: &str) -> Option<&GgufTensor> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The stored bytes of `t`.
    pub fn data(&self, t: &GgufTensor) -> &[u8] {
        &self.bytes()[t.start..t.end]
    }

    fn err(&self, msg: String) -> ModelError {
        ModelError::File { path: self.path.clone(), msg }
    }

    /// What `t` is stored as, or an error naming its unsupported type.
    pub fn stored(&self, t: &GgufTensor) -> Result<Stored> {
        t.ty.kind().ok_or_else(|| {
            self.err(format!(
                "tensor `{}` is stored as {}, which ktune cannot read yet (supported: {}, BF16, {}): \
                 convert the model with one of those types (llama-quantize … Q4_K_M)",
                t.name,
                t.ty.name,
                DType::FLOAT.iter().map(|d| d.ggml_name()).collect::<Vec<_>>().join(", "),
                DType::QUANT.iter().map(|d| d.ggml_name()).collect::<Vec<_>>().join(", ")
            ))
        })
    }

    /// Decodes row `row` of `t` (`t.cols()` values) into `out` as f32.
    pub fn decode_row(&self, t: &GgufTensor, row: usize, out: &mut [f32]) -> Result<()> {
        let kind = self.stored(t)?;
        let rb = t.row_bytes();
        let src = row
            .checked_mul(rb)
            .and_then(|s| self.data(t).get(s..s + rb))
            .filter(|_| out.len() == t.cols())
            .ok_or_else(|| self.err(format!("tensor `{}`: row {row} is out of range ({} rows)", t.name, t.rows())))?;
        decode(kind, src, out);
        Ok(())
    }
}

/// Typed reads of one GGUF file's metadata under a key prefix (`llama`, `gemma3`:
/// a text model's architecture; `clip`: a vision projector), the one reader the
/// text model's config ([`super::gguf_model`]) and the projector's
/// ([`super::mmproj`]) use: errors name the file and the full key, and the keys
/// read are remembered, so [`MetaReader::unused`] lists the prefix's keys ktune
/// did not read.
pub struct MetaReader<'a> {
    f: &'a GgufFile,
    prefix: &'a str,
    used: BTreeSet<String>,
}

impl<'a> MetaReader<'a> {
    pub fn new(f: &'a GgufFile, prefix: &'a str) -> MetaReader<'a> {
        MetaReader { f, prefix, used: BTreeSet::new() }
    }

    /// The file read.
    pub fn file(&self) -> &'a GgufFile {
        self.f
    }

    /// The full name of `key` (`{prefix}.{key}`).
    pub fn key(&self, key: &str) -> String {
        format!("{}.{key}", self.prefix)
    }

    /// A metadata problem of this file.
    pub fn err(&self, msg: String) -> ModelError {
        ModelError::Config { path: self.f.path.clone(), msg }
    }

    /// Something this file holds that ktune does not run.
    pub fn unsupported(&self, what: String) -> ModelError {
        ModelError::Unsupported { path: self.f.path.clone(), what }
    }

    /// The value of `{prefix}.{key}`, marked as read.
    pub fn get(&mut self, key: &str) -> Option<&'a Value> {
        let full = self.key(key);
        let v = self.f.get(&full);
        self.used.insert(full);
        v
    }

    /// `key` read by `read` (`None` when absent); a value of another type is an
    /// error naming `what` was expected.
    pub fn typed<T>(&mut self, key: &str, what: &str, read: impl Fn(&'a Value) -> Option<T>) -> Result<Option<T>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        read(v).map(Some).ok_or_else(|| self.err(format!("`{}` must be {what}, got {} ({})", self.key(key), v.describe(), v.type_name())))
    }

    /// An integer, or an array of equal integers (per-layer values).
    pub fn usize_opt(&mut self, key: &str) -> Result<Option<usize>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let one = |v: &Value| v.as_u64().and_then(|u| usize::try_from(u).ok());
        let got = match v {
            Value::Array(a) if !a.is_empty() => {
                let first = a.get(0).and_then(|x| one(&x));
                if first.is_some() && a.values().any(|x| one(&x) != first) {
                    return Err(self.unsupported(format!("`{}` with different values per layer", self.key(key))));
                }
                first
            }
            v => one(v),
        };
        got.map(Some).ok_or_else(|| {
            self.err(format!("`{}` must be a non-negative integer, got {} ({})", self.key(key), v.describe(), v.type_name()))
        })
    }

    /// [`MetaReader::usize_opt`] of a key the file must hold.
    pub fn usize_req(&mut self, key: &str) -> Result<usize> {
        self.usize_opt(key)?.ok_or_else(|| self.err(format!("missing metadata `{}`: not a complete llama.cpp conversion?", self.key(key))))
    }

    pub fn f64_opt(&mut self, key: &str) -> Result<Option<f64>> {
        self.typed(key, "a number", Value::as_f64)
    }

    pub fn str_opt(&mut self, key: &str) -> Result<Option<&'a str>> {
        self.typed(key, "a string", Value::as_str)
    }

    pub fn bool_opt(&mut self, key: &str) -> Result<Option<bool>> {
        self.typed(key, "a bool", Value::as_bool)
    }

    /// An array of numbers.
    pub fn f64s_opt(&mut self, key: &str) -> Result<Option<Vec<f64>>> {
        let numbers = |v: &Value| v.as_array()?.numbers();
        self.typed(key, "an array of numbers", numbers)
    }

    /// A top-level token id (`tokenizer.ggml.*`, outside the prefix).
    pub fn token(&self, key: &str) -> Result<Option<u32>> {
        match self.f.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|t| u32::try_from(t).ok())
                .map(Some)
                .ok_or_else(|| self.err(format!("`{key}` must be a token id, got {} ({})", v.describe(), v.type_name()))),
        }
    }

    /// The prefix's keys present in the file that were not read, in file order.
    pub fn unused(&self) -> Vec<String> {
        let prefix = format!("{}.", self.prefix);
        self.f.meta.iter().map(|(k, _)| k).filter(|k| k.starts_with(&prefix) && !self.used.contains(*k)).cloned().collect()
    }
}

/// Decodes whole blocks of `kind` from `src` into `out` (`out.len()` elements).
pub fn decode(kind: Stored, src: &[u8], out: &mut [f32]) {
    match kind {
        Stored::F32 => out.iter_mut().zip(src.chunks_exact(4)).for_each(|(o, b)| *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        Stored::F16 => out.iter_mut().zip(src.chunks_exact(2)).for_each(|(o, b)| *o = f16::from_le_bytes([b[0], b[1]]).to_f32()),
        Stored::BF16 => out.iter_mut().zip(src.chunks_exact(2)).for_each(|(o, b)| *o = bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        Stored::Quant(f) => {
            thread_local! {
                /// One block's quants and header, reused (decoding a row allocates nothing).
                static BLOCK: std::cell::RefCell<(Vec<u8>, Vec<f16>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
            }
            let (bb, be) = (f.block_bytes(), f.block_elems());
            BLOCK.with(|cell| {
                let mut fresh = (Vec::new(), Vec::new());
                let mut held = cell.try_borrow_mut();
                let (q, s) = match held.as_deref_mut() {
                    Ok(b) => b,
                    Err(_) => &mut fresh,
                };
                for (block, o) in src.chunks_exact(bb).zip(out.chunks_exact_mut(be)) {
                    q.clear();
                    s.clear();
                    split_block(f.header(), block, q, s);
                    dequantize_block(f, q, s, o);
                }
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal GGUF writer for the hostile-file tests.
    struct W(Vec<u8>);
    impl W {
        fn new(version: u32, tensors: u64, kvs: u64) -> W {
            let mut w = W(b"GGUF".to_vec());
            w.u32(version);
            w.u64(tensors);
            w.u64(kvs);
            w
        }
        fn u8(&mut self, v: u8) -> &mut W {
            self.0.push(v);
            self
        }
        fn u16(&mut self, v: u16) -> &mut W {
            self.0.extend_from_slice(&v.to_le_bytes());
            self
        }
        fn u32(&mut self, v: u32) -> &mut W {
            self.0.extend_from_slice(&v.to_le_bytes());
            self
        }
        fn u64(&mut self, v: u64) -> &mut W {
            self.0.extend_from_slice(&v.to_le_bytes());
            self
        }
        fn str(&mut self, s: &[u8]) -> &mut W {
            self.u64(s.len() as u64);
            self.0.extend_from_slice(s);
            self
        }
        fn kv_u32(&mut self, k: &str, v: u32) -> &mut W {
            self.str(k.as_bytes()).u32(4).u32(v)
        }
        fn tensor(&mut self, name: &str, ne: &[u64], ty: u32, offset: u64) {
            self.str(name.as_bytes());
            self.u32(ne.len() as u32);
            ne.iter().for_each(|d| {
                self.u64(*d);
            });
            self.u32(ty);
            self.u64(offset);
        }
        fn pad_data(&mut self, bytes: usize) {
            while !self.0.len().is_multiple_of(32) {
                self.0.push(0);
            }
            self.0.extend(std::iter::repeat_n(0x3cu8, bytes));
        }
        fn parse(self) -> Result<GgufFile> {
            GgufFile::parse(Path::new("t.gguf"), self.0)
        }
    }

    fn msg(r: Result<GgufFile>) -> String {
        match r {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    fn valid() -> W {
        let mut w = W::new(3, 2, 2);
        w.kv_u32("general.alignment", 32);
        w.str(b"tok");
        w.u32(9);
        w.u32(8);
        w.u64(2);
        w.str(b"a");
        w.str(b"bc");
        w.tensor("a", &[4, 2], 0, 0);
        w.tensor("b", &[32], 8, 32);
        w.pad_data(32 + 34);
        w
    }

    #[test]
    fn a_valid_file_parses() {
        let f = valid().parse().expect("valid");
        assert_eq!(f.version, 3);
        // Strings kept as one text and their ends.
        assert_eq!(f.get("tok"), Some(&Value::Array(Array::Str { text: "abc".into(), ends: vec![1, 3] })));
        let tok = f.get("tok").and_then(Value::as_array).expect("array");
        assert_eq!((tok.str_at(1), tok.strs().map(|s| s.collect::<Vec<_>>())), (Some("bc"), Some(vec!["a", "bc"])));
        assert_eq!(Array::from_values(tok.values().collect()).as_ref(), Some(tok));
        let a = f.tensor("a").expect("a");
        assert_eq!(a.shape(), vec![2, 4]);
        assert_eq!(f.data(a).len(), 32);
        let b = f.tensor("b").expect("b");
        assert_eq!(f.stored(b).expect("q8"), Stored::Quant(QFormat::Q8_0));
        let mut row = [0f32; 32];
        f.decode_row(b, 0, &mut row).expect("decodes");
        // d = f16 0x3c3c, qs = 0x3c = 60.
        let d = f16::from_bits(0x3c3c).to_f32();
        assert!(row.iter().all(|&x| x == 60.0 * d));
    }

    #[test]
    fn every_truncation_is_an_error() {
        let full = valid().0;
        for n in 0..full.len() {
            let r = GgufFile::parse(Path::new("t.gguf"), full[..n].to_vec());
            assert!(r.is_err(), "{n} bytes parsed");
        }
    }

    #[test]
    fn bad_magic_and_versions() {
        assert!(msg(GgufFile::parse(Path::new("x"), b"GGML\x03\0\0\0".to_vec())).contains("not a GGUF file"));
        assert!(msg(W::new(1, 0, 0).parse()).contains("version 1"));
        assert!(msg(W::new(7, 0, 0).parse()).contains("version 7"));
        assert!(msg(W::new(3u32.swap_bytes(), 0, 0).parse()).contains("big-endian"));
    }

    #[test]
    fn absurd_counts_are_refused_before_allocating() {
        assert!(msg(W::new(3, 0, u64::MAX).parse()).contains("metadata entries"));
        assert!(msg(W::new(3, 1 << 40, 0).parse()).contains("tensors"));
        // A string claiming more bytes than the file has.
        let mut w = W::new(3, 0, 1);
        w.u64(u64::MAX - 3);
        assert!(msg(w.parse()).contains("claims"));
        // An array claiming 2^61 u64 elements.
        let mut w = W::new(3, 0, 1);
        w.str(b"arr");
        w.u32(9);
        w.u32(10);
        w.u64(1 << 61);
        assert!(msg(w.parse()).contains("elements"));
    }

    #[test]
    fn bad_values() {
        let one = |w: &mut W, what: &str| {
            let w = std::mem::replace(w, W(Vec::new()));
            assert!(msg(w.parse()).contains(what), "{what}");
        };
        one(W::new(3, 0, 1).str(b"\xff\xfe").u32(4).u32(1), "UTF-8");
        one(W::new(3, 0, 1).str(b"k").u32(13), "unknown value type 13");
        one(W::new(3, 0, 1).str(b"k").u32(7).u8(2), "bool");
        one(W::new(3, 0, 2).kv_u32("k", 1).kv_u32("k", 2), "twice");
        one(W::new(3, 0, 1).kv_u32("general.alignment", 24), "power of two");
        // Arrays nested too deep.
        let mut w = W::new(3, 0, 1);
        w.str(b"k").u32(9);
        for _ in 0..5 {
            w.u32(9).u64(1);
        }
        one(&mut w, "nested");
        // Numbers as their own type; arrays of arrays as their bytes, checked.
        let mut w = W::new(3, 0, 2);
        // "n": an array (9) of 2 i16 (3); "nest": an array of 2 arrays of one u8 each.
        w.str(b"n").u32(9).u32(3).u64(2).u16(7).u16(9);
        w.str(b"nest").u32(9).u32(9).u64(2);
        for _ in 0..2 {
            w.u32(0).u64(1).u8(5);
        }
        let f = w.parse().expect("valid");
        assert_eq!(f.get("n"), Some(&Value::Array(Array::I16(vec![7, 9]))));
        match f.get("nest") {
            Some(Value::Array(Array::Nested { len: 2, bytes, .. })) => assert_eq!(bytes.len(), 2 * 13),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bad_tensor_infos() {
        let one = |ne: &[u64], ty: u32, offset: u64, data: usize| {
            let mut w = W::new(3, 1, 0);
            w.tensor("t", ne, ty, offset);
            w.pad_data(data);
            msg(w.parse())
        };
        assert!(one(&[4], 0, 0, 8).contains("past the end"));
        assert!(one(&[4], 0, 32, 16).contains("past the end"));
        assert!(one(&[4], 0, u64::MAX - 7, 16).contains("not a multiple"));
        assert!(one(&[4], 0, u64::MAX - 31, 16).contains("overflow"));
        assert!(one(&[1 << 40, 1 << 40], 0, 0, 16).contains("overflow"));
        assert!(one(&[0], 0, 0, 16).contains("dimension 0"));
        assert!(one(&[1, 1, 1, 1, 1], 0, 0, 16).contains("5 dimensions"));
        assert!(one(&[4], 99, 0, 16).contains("unknown ggml type 99"));
        assert!(one(&[16], 8, 0, 64).contains("whole number"));
        // Overlapping tensors and duplicate names.
        let mut w = W::new(3, 2, 0);
        w.tensor("a", &[16], 0, 0);
        w.tensor("b", &[16], 0, 32);
        w.pad_data(128);
        assert!(msg(w.parse()).contains("overlap"));
        let mut w = W::new(3, 2, 0);
        w.tensor("a", &[8], 0, 0);
        w.tensor("a", &[8], 0, 32);
        w.pad_data(64);
        assert!(msg(w.parse()).contains("twice"));
    }

    #[test]
    fn unsupported_types_fail_when_read_naming_the_tensor() {
        let mut w = W::new(3, 1, 0);
        // IQ2_XXS (id 16): 66 bytes per 256 elements, geometry known, decoding not.
        w.tensor("blk.0.ffn_down.weight", &[256], 16, 0);
        w.pad_data(66);
        let f = w.parse().expect("IQ2_XXS is bounds-checked and accepted");
        let t = f.tensor("blk.0.ffn_down.weight").expect("t");
        let e = f.stored(t).expect_err("IQ2_XXS").to_string();
        assert!(e.contains("blk.0.ffn_down.weight") && e.contains("IQ2_XXS") && e.contains("Q4_K"), "{e}");
    }
}
