//! The attention call's shape ([`Shape`]: a prefill or decode `Problem`, checked
//! once) and the validity rules the kernels share: the shape and grid checks of the
//! WGSL kernels, elements per 16-byte word, the flash workgroup size.

use crate::device::GpuCaps;
use crate::kernels::contract::{KernelDef, KernelError, Params, param, wrong_op};
use crate::kernels::problem::Problem;
use crate::kernels::quant::DType;

/// One attention call; decode is `tokens = 1`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Shape {
    pub(super) tokens: usize,
    pub(super) kv_len: usize,
    pub(super) kv_cap: usize,
    pub(super) heads: usize,
    pub(super) kv_heads: usize,
    pub(super) d: usize,
    pub(super) window: usize,
    pub(super) scale: f32,
    /// The bidirectional block `[start, end)` of a prefill (equal: none).
    pub(super) bidi: (usize, usize),
}

impl Shape {
    pub(super) fn of(p: &Problem) -> Option<Shape> {
        match *p {
            Problem::AttentionPrefill { tokens, kv_len, kv_cap, heads, kv_heads, head_dim, window, scale, bidi_start, bidi_end } => {
                Some(Shape { tokens, kv_len, kv_cap, heads, kv_heads, d: head_dim, window, scale, bidi: (bidi_start, bidi_end) })
            }
            Problem::AttentionDecode { kv_len, kv_cap, heads, kv_heads, head_dim, window, scale } => {
                Some(Shape { tokens: 1, kv_len, kv_cap, heads, kv_heads, d: head_dim, window, scale, bidi: (0, 0) })
            }
            _ => None,
        }
    }

    /// The shape rules every attention kernel relies on.
    pub(super) fn checked(p: &Problem) -> Result<Shape, String> {
        let s = Shape::of(p).ok_or_else(|| format!("{} is not an attention problem", p.op()))?;
        if s.d == 0 || s.heads == 0 || s.kv_heads == 0 {
            return Err("head_dim, heads and kv_heads must be at least 1".into());
        }
        if s.heads % s.kv_heads != 0 {
            return Err(format!("heads = {} is not a multiple of kv_heads = {}", s.heads, s.kv_heads));
        }
        if s.tokens == 0 || s.tokens > s.kv_len {
            return Err(format!("tokens = {} must be in 1..=kv_len ({})", s.tokens, s.kv_len));
        }
        if s.kv_len > s.kv_cap {
            return Err(format!("kv_len = {} exceeds kv_cap = {}", s.kv_len, s.kv_cap));
        }
        let (b0, b1) = s.bidi;
        if b0 != b1 && (b0 > b1 || b0 < s.kv_len - s.tokens || b1 > s.kv_len) {
            return Err(format!(
                "the bidirectional block [{b0}, {b1}) must lie within this call's positions [{}, {})",
                s.kv_len - s.tokens,
                s.kv_len
            ));
        }
        Ok(s)
    }

    /// Query heads per KV head.
    pub(super) fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// Keys `[lo, hi)` the query at token index `i` sees.
    /// (Never decreasing with `i`, bounds included: a block of queries sees the keys
    /// between its first query's `lo` and its last query's `hi`.)
    pub(super) fn range(&self, i: usize) -> (usize, usize) {
        crate::kernels::problem::attention_keys(self.kv_len - self.tokens + i, self.window, self.bidi)
    }

    /// The uniform words every WGSL attention kernel, prefill or decode, starts its
    /// `Dims` with (`shaders/attention_dims.wgsl`): tokens, kv_len, kv_cap, heads,
    /// kv_heads, window, scale (f32 bits), and the bidirectional block b0, b1; the
    /// kernel's own words (`own`, `own2`) may follow.
    pub(super) fn prefill_words(&self) -> Vec<u32> {
        let mut w: Vec<u32> = [self.tokens, self.kv_len, self.kv_cap, self.heads, self.kv_heads, self.window].map(|v| v as u32).to_vec();
        w.extend([self.scale.to_bits(), self.bidi.0 as u32, self.bidi.1 as u32]);
        w
    }

    /// Where a q8_0 cache's scales start ([`kv_scales_word`] of its
    /// `[kv_heads, kv_cap, head_dim]` values).
    pub(super) fn kv_scales_word(&self, dtype: DType) -> u32 {
        kv_scales_word(dtype, self.kv_heads * self.kv_cap * self.d)
    }

    /// Cache row of key `j` of KV head `kh`.
    pub(super) fn row_of(&self, kh: usize, j: usize) -> usize {
        kh * self.kv_cap + j
    }
}

/// One paged batch call ([`Problem::AttentionPaged`]), checked once; each of its
/// sequences is a call of its own [`Shape`] whose rows come through its table.
#[derive(Clone, Copy, Debug)]
pub(super) struct Paged {
    pub(super) seqs: usize,
    pub(super) tokens: usize,
    pub(super) heads: usize,
    pub(super) kv_heads: usize,
    pub(super) d: usize,
    pub(super) page: usize,
    pub(super) blocks: usize,
    pub(super) max_blocks: usize,
    pub(super) window: usize,
    pub(super) scale: f32,
}

/// One sequence of a paged batch: its first query row in the call, its shape,
/// its blocks.
pub(super) struct PagedSeq<'a> {
    pub(super) t0: usize,
    pub(super) s: Shape,
    pub(super) table: &'a [f32],
}

impl Paged {
    pub(super) fn checked(p: &Problem) -> Result<Paged, String> {
        let Problem::AttentionPaged { seqs, tokens, heads, kv_heads, head_dim: d, page, blocks, max_blocks, window, scale } = *p else {
            return Err(format!("{} is not a paged attention problem", p.op()));
        };
        if d == 0 || heads == 0 || kv_heads == 0 || page == 0 || blocks == 0 || max_blocks == 0 || seqs == 0 {
            return Err("head_dim, heads, kv_heads, page, blocks, max_blocks and seqs must be at least 1".into());
        }
        if heads % kv_heads != 0 {
            return Err(format!("heads = {heads} is not a multiple of kv_heads = {kv_heads}"));
        }
        if tokens < seqs || tokens > seqs * page * max_blocks {
            return Err(format!("tokens = {tokens} must be in seqs..=seqs * page * max_blocks ({seqs}..={})", seqs * page * max_blocks));
        }
        Ok(Paged { seqs, tokens, heads, kv_heads, d, page, blocks, max_blocks, window, scale })
    }

    /// Positions one sequence's table reaches.
    pub(super) fn cap(&self) -> usize {
        self.page * self.max_blocks
    }

    /// The sequences `pages` describes, each checked against the pool: at least
    /// one query, no more than its KV length, a KV length its table reaches, each
    /// block it reads a whole number below `blocks`, and the queries summing to
    /// `tokens`.
    pub(super) fn sequences<'a>(&self, pages: &'a [f32]) -> Result<Vec<PagedSeq<'a>>, String> {
        let width = 2 + self.max_blocks;
        if pages.len() < self.seqs * width {
            return Err(format!("pages holds {} values, not seqs * (2 + max_blocks) = {}", pages.len(), self.seqs * width));
        }
        let mut t0 = 0;
        let mut out = Vec::with_capacity(self.seqs);
        for (i, meta) in pages.chunks(width).take(self.seqs).enumerate() {
            let whole = |x: f32| x >= 0.0 && x.fract() == 0.0 && x < (1u32 << 24) as f32;
            let (q_len, kv_len) = (meta[0] as usize, meta[1] as usize);
            if !whole(meta[0]) || !whole(meta[1]) || q_len == 0 || q_len > kv_len || kv_len > self.cap() {
                return Err(format!(
                    "sequence {i}: q_len {} and kv_len {} must satisfy 1 <= q_len <= kv_len <= {}",
                    meta[0],
                    meta[1],
                    self.cap()
                ));
            }
            let table = &meta[2..2 + kv_len.div_ceil(self.page)];
            if let Some(b) = table.iter().find(|&&b| !whole(b) || b as usize >= self.blocks) {
                return Err(format!("sequence {i}: block {b} is not one of the pool's {}", self.blocks));
            }
            let s = Shape {
                tokens: q_len,
                kv_len,
                kv_cap: self.cap(),
                heads: self.heads,
                kv_heads: self.kv_heads,
                d: self.d,
                window: self.window,
                scale: self.scale,
                bidi: (0, 0),
            };
            out.push(PagedSeq { t0, s, table });
            t0 += q_len;
        }
        if t0 != self.tokens {
            return Err(format!("the sequences' queries sum to {t0}, not tokens = {}", self.tokens));
        }
        Ok(out)
    }

    /// Query heads per KV head.
    pub(super) fn group(&self) -> usize {
        self.heads / self.kv_heads
    }
}

/// The checked shape of a CPU kernel's problem: [`wrong_op`] for another op
/// (prefill and decode included), `Invalid` for a shape the kernels cannot run.
pub(super) fn shape_or_invalid(kd: &KernelDef, p: &Problem) -> Result<Shape, KernelError> {
    if p.op() != kd.op {
        return Err(wrong_op(kd, p));
    }
    Shape::checked(p).map_err(|reason| KernelError::Invalid { kernel: kd.id.to_string(), reason })
}

/// Cache elements per 16-byte word (the WGSL kernels' load unit; a q8_0 pool's word is
/// 8 codes, half a load: `attention.wgsl`'s `k_word`).
pub(super) fn per_word(dtype: DType) -> usize {
    if matches!(dtype, DType::F16 | DType::Q8_0) { 8 } else { 4 }
}

/// A cache of `dtype` values the WGSL kernels read, rows of `d`: f32, f16, or
/// q8_0 rows of whole blocks.
pub(super) fn check_kv_type(dtype: DType, d: usize) -> Result<(), String> {
    if let Some(f) = dtype.quant() {
        let be = f.block_elems();
        if f != crate::kernels::quant::QFormat::Q8_0 || !d.is_multiple_of(be) {
            return Err(format!("a cache of {dtype} rows of head_dim = {d} (q8_0 rows of whole {be}-value blocks only)"));
        }
    }
    Ok(())
}

/// The cache's constants: `W_F16` (8 values a 16-byte word: f16, and q8_0's
/// codes) and `KV_Q8` (`attention_dims.wgsl`).
pub(super) fn kv_consts(dtype: DType) -> [(&'static str, f64); 2] {
    let q8 = dtype == DType::Q8_0;
    [("W_F16", f64::from(u8::from(q8 || dtype == DType::F16))), ("KV_Q8", f64::from(u8::from(q8)))]
}

/// The u32 word where the scales of a q8_0 cache of `elems` values start (a
/// q8_0 matrix's single-buffer layout; the uniform's `own2`, which
/// `attention.wgsl`'s `k_word` reads); 0 for a float cache.
pub fn kv_scales_word(dtype: DType, elems: usize) -> u32 {
    dtype.quant().map_or(0, |f| (f.layout(f.blocks_for(elems)).scales_offset / 4) as u32)
}

/// Shape rules shared by the WGSL kernels: 16-byte cache loads and u32 indexing.
pub(super) fn check_wgsl_shape(prob: &Problem, dtype: DType) -> Result<Shape, String> {
    let s = Shape::checked(prob)?;
    check_kv_type(dtype, s.d)?;
    let need = per_word(dtype);
    if s.d % need != 0 {
        return Err(format!("head_dim = {} is not a multiple of {need} (16-byte {dtype} cache loads)", s.d));
    }
    let elems = (s.kv_heads * s.kv_cap * s.d).max(s.tokens * s.heads * s.d) as u64;
    if elems >= u32::MAX as u64 {
        return Err(format!("{elems} elements overflow the shader's u32 indices"));
    }
    Ok(s)
}

pub(super) fn flash_wg_size(params: &Params) -> Result<[u32; 3], KernelError> {
    Ok([param(params, "block_q")? * param(params, "lanes")?, 1, 1])
}

/// 16-byte words per cache row must fit one workgroup (V rows are read by
/// `head_dim / per_word` invocations side by side).
pub(super) fn check_row_fits(s: &Shape, dtype: DType, wg: u32) -> Result<(), String> {
    let words = s.d / per_word(dtype);
    if words > wg as usize {
        return Err(format!("head_dim = {} needs {words} invocations per V row, more than workgroup_size = {wg}", s.d));
    }
    Ok(())
}

pub(super) fn check_grid(caps: &GpuCaps, what: &str, count: usize) -> Result<(), String> {
    if count > caps.max_workgroups_per_dimension as usize {
        return Err(format!("{count} {what} exceed the adapter's {} workgroups per dimension", caps.max_workgroups_per_dimension));
    }
    Ok(())
}
