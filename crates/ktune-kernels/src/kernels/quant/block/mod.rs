//! One type per block format, candle's `GgmlType` shape: a [`BlockFormat`]
//! implementation holds everything the format is — its ggml type id and block
//! geometry (so its bits per weight), how its quant bytes become values
//! ([`BlockFormat::unpack_vals`], [`BlockFormat::unpack_scales`], the reference
//! dequantization built on them), how floats become its blocks
//! ([`BlockFormat::quantize`]), its GPU block ([`BlockFormat::gpu_block`]), the
//! format llama.cpp's quantizer falls back to for rows that are not whole blocks,
//! and which CPU kernels serve it ([`CpuKernels`]: the f32 and int8 decode dots,
//! the repacked layout and its loops, the prefill panel's packing). The x86
//! loops themselves stay in `cpu/` (which `quant/` does not reach); the choice
//! of loop is made here, once per format, and `cpu/` maps a kernel name to its
//! loop.
//!
//! [`FormatOps`] is the same as a table of plain values and function pointers
//! ([`FormatOps::of`]), and [`QFormat::ops`] the one lookup from the enum users
//! name (profiles, the command line, GGUF type ids) to it: code outside this
//! folder asks the table, never matches on formats. The homes: [`q32`] (the
//! 32-element blocks Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL), [`kquant`] (Q2_K,
//! Q3_K, Q4_K, Q5_K, Q6_K) and [`iq4xs`].
//!
//! Adding a block format: a type implementing [`BlockFormat`] in a file of this
//! folder (a family's file, or one of its own), and its row in the `formats!`
//! list of [`super::formats`] naming that type.

pub mod iq4xs;
pub mod kquant;
pub mod q32;

use half::f16;

use super::{GROUP, QFormat, QK_K};

/// One value per 16 elements of a block (the scales and offsets of
/// [`super::Unpacked`]).
pub type Groups = [f32; QK_K / GROUP];

/// The f32-activation decode dot (and SIMD dequantization) that serves a format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum F32Dot {
    /// A loop of its own over signed int8 codes (Q8_0).
    Bytes,
    /// A loop of its own over nibbles less 8 (Q4_0).
    Nibbles,
    /// A loop of its own over nibbles with a per-block minimum (Q4_1).
    NibblesMin,
    /// Each block unpacked to int8 values first ([`super::Unpacked`]), then dotted.
    Unpacked,
}

/// The int8-activation decode dot that serves a format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum I8Dot {
    /// The direct loop of the 32-element formats: values straight into registers,
    /// eight blocks' scales a step, and the four-row pass (`rows_per_pass` 4).
    Direct,
    /// Whole Q4_K super-blocks summed in integers against activations with one
    /// scale per 256 (llama.cpp's q4_K × q8_K).
    SuperQ4K,
    /// Whole Q6_K super-blocks, as [`I8Dot::SuperQ4K`].
    SuperQ6K,
    /// Each block unpacked to int8 values first, then dotted per 16 elements.
    Unpacked,
}

impl I8Dot {
    /// Whether the dot sums super-blocks against one activation scale per 256
    /// (the activations quantized as q8_K).
    pub fn per256(self) -> bool {
        matches!(self, I8Dot::SuperQ4K | I8Dot::SuperQ6K)
    }
}

/// A repacked CPU layout (`Layout::X8`: 8 rows interleaved per block column) and
/// the 8-row loops that read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum X8 {
    /// Q4_K's records: the 8 rows' unpacked 6-bit scales and minima, then their
    /// nibbles in 4-byte runs.
    K4,
    /// Q6_K's records: the 8 rows' int8 sub-block scales, then their low
    /// nibbles and high bit pairs in 4-byte runs.
    K6,
    /// A 32-element block's codes in 4-byte runs, read as [`Codes`].
    Codes32(Codes),
}

/// How the code bytes of a 32-element block read as values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codes {
    /// Nibbles less 8 (Q4_0).
    Nibbles = 0,
    /// Signed bytes (Q8_0).
    Bytes = 1,
    /// Nibbles through the IQ4 levels (IQ4_NL).
    Levels = 2,
}

/// How the prefill int8 GEMM packs a format's weight panel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Panel {
    /// Straight from rows of blocks (AVX-512), the codes plus this bias as
    /// unsigned bytes: the 32-element formats whose codes are bytes or nibbles as
    /// they are.
    pub direct: Option<u8>,
    /// Straight from the repacked records too.
    pub direct_x8: bool,
    /// Through the staging rows (any ISA, any layout).
    pub stage: Stage,
}

/// The staged panel packing of one format's block as unsigned bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Signed bytes plus 128 (Q8_0).
    Bytes,
    /// Nibbles as they are, the offset −8d or the block's minimum (Q4_0, Q4_1).
    Nibbles,
    /// Q4_K's nibbles with their sub-block scales and minima.
    K4Nibbles,
    /// The [`super::Unpacked`] values plus 128.
    Unpacked,
}

/// Which CPU kernels serve a format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuKernels {
    pub f32_dot: F32Dot,
    pub i8_dot: I8Dot,
    /// The repacked layout, if the format has one.
    pub x8: Option<X8>,
    pub panel: Panel,
}

/// A block format's ggml type id and geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// ggml's type id (GGUF tensor info `type`).
    pub ggml: u32,
    /// Elements per block.
    pub elems: usize,
    /// Bytes of one block on disk.
    pub bytes: usize,
    /// Byte offsets in a disk block of the 16-bit fields that go to `scales`.
    pub header: &'static [usize],
    /// Whether values carry an additive per-group offset (`m`, `dmin`).
    pub offset: bool,
    /// Elements sharing one scale (and offset): 16 or 32.
    pub scale_group: usize,
}

impl Layout {
    /// ggml's 32-element block of type `ggml`, `bytes` long: its scale `d` first,
    /// and with `min` the block's minimum `m` after it (values `d q + m`); both
    /// halves of [`super::Unpacked`] share them.
    pub const fn block32(ggml: u32, bytes: usize, min: bool) -> Layout {
        Layout { ggml, elems: 32, bytes, header: if min { &[0, 2] } else { &[0] }, offset: min, scale_group: 32 }
    }
}

/// One block format: its layout, its values, its quantizer and the kernels that
/// serve it. `quant bytes` are a block less its 16-bit header fields (the split
/// layout of [`super::QMatrix`]); `s` the header fields in their on-disk order.
pub trait BlockFormat: Sized {
    /// The ggml type id and the block geometry.
    const LAYOUT: Layout;
    /// The format llama.cpp's quantizer uses instead for a row that is not whole
    /// blocks of this one (`llama-quant.cpp`).
    const ROW_FALLBACK: Option<QFormat> = None;
    /// The CPU kernels that serve the format.
    const CPU: CpuKernels;
    /// The table of this format.
    const OPS: FormatOps = FormatOps::of::<Self>();

    /// The integer values of one block (`LAYOUT.elems` of `v`).
    fn unpack_vals(q: &[u8], v: &mut [i8; QK_K]);
    /// The scale and offset of each 16 elements of one block (`LAYOUT.elems / 16` of each):
    /// by default a 32-element block's one `d` (and `m`, with an offset) for both
    /// halves.
    fn unpack_scales(_q: &[u8], s: &[f16], sc: &mut Groups, off: &mut Groups) {
        sc[..2].fill(s[0].to_f32());
        off[..2].fill(if Self::LAYOUT.offset { s[1].to_f32() } else { 0.0 });
    }
    /// Quantizes `LAYOUT.elems` values into one block.
    fn quantize(x: &[f32], q: &mut [u8], s: &mut [f16]);
    /// One block's quant bytes (`src`) in the GPU layout (`dst`, as long or up to 4
    /// bytes longer): by default as they are, zeros after.
    fn gpu_block(src: &[u8], dst: &mut [u8]) {
        dst[..src.len()].copy_from_slice(src);
        dst[src.len()..].fill(0);
    }
}

/// A [`BlockFormat`] as values and function pointers, [`QFormat::ops`]' answer.
#[derive(Clone, Copy, Debug)]
pub struct FormatOps {
    pub layout: Layout,
    pub row_fallback: Option<QFormat>,
    pub cpu: CpuKernels,
    pub unpack_vals: fn(&[u8], &mut [i8; QK_K]),
    pub unpack_scales: fn(&[u8], &[f16], &mut Groups, &mut Groups),
    pub quantize: fn(&[f32], &mut [u8], &mut [f16]),
    pub gpu_block: fn(&[u8], &mut [u8]),
}

impl FormatOps {
    /// The table of format `T`.
    pub const fn of<T: BlockFormat>() -> FormatOps {
        FormatOps {
            layout: T::LAYOUT,
            row_fallback: T::ROW_FALLBACK,
            cpu: T::CPU,
            unpack_vals: T::unpack_vals,
            unpack_scales: T::unpack_scales,
            quantize: T::quantize,
            gpu_block: T::gpu_block,
        }
    }
}
