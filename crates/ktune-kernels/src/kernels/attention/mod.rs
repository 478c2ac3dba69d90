//! Attention: causal grouped-query attention over the head-major KV cache, for
//! prefill (`tokens` new queries ending at `kv_len`) and decode (one query at
//! `kv_len - 1`, the op that bounds long-context decoding).
//!
//! WGSL prefill: `attention_prefill_naive` (scores materialised in a scratch buffer,
//! three dispatches: QKᵀ, row softmax, P·V) and `attention_prefill_flash` (tiled
//! online softmax, K/V tiles in workgroup memory, `block_q` × `block_kv` tiles),
//! `attention_prefill_flash2_sg` and `attention_prefill_flash2` (one body,
//! `flash2.wgsl`: the heads of a GQA group share each K/V tile, `lanes` invocations
//! per query row split head_dim and hold its Q slice in registers, a reduce-scatter
//! over the row's lanes gives each lane whole scores, one exponential per score; K/V
//! staged in workgroup memory, padded or not, or read straight from the cache; the
//! row collectives are subgroup shuffles, or workgroup memory and barriers on
//! adapters without subgroups).
//! WGSL decode: `attention_decode_stream` (one workgroup per query head streaming the
//! cache) and `attention_decode_splitkv` (flash decoding: the key range split into
//! `chunk`-key partials computed by one workgroup per GQA group, so the query heads
//! sharing a KV head read it once, then a merge pass) and
//! `attention_decode_splitkv_sg` (the same split-KV partials, one subgroup per
//! `chunk`-key partial with no workgroup memory or barriers: the lanes split each
//! K/V row's 16-byte words, a `subgroupAdd` gives the scores of `heads_per_wg`
//! query heads; merged by `attention_decode_splitkv`'s `reduce`).
//! CPU prefill: `attention_prefill_cpu` (pool over (token, head) rows, per-key online
//! softmax) and `attention_prefill_tiled_cpu` (pool over (token block, KV head),
//! key tiles with materialised score rows, the K/V tile shared by the group's heads).
//! CPU decode: `attention_decode_heads_cpu` (one task per head, exact two-pass
//! softmax) and `attention_decode_splitkv_cpu` (the key range split across tasks per
//! KV head, (m, l, acc) partials merged per head).
//! The CPU kernels use the SIMD dot products and the f32/f16 `axpy_row` of
//! [`super::cpu`]; every variant takes f32 or f16 caches.

use std::sync::Arc;

mod mma;

use super::cpu::{self, ISA, Isa, Row, axpy_row, row};
use super::wgsl::{shared_wg, subgroup_fits};
use super::{CpuArgs, CpuImpl, CpuIn, DType, KernelDef, KernelError, Op, ParamSpec, Params, Problem, WgslImpl, WgslSetup, param, wrong_op};
use crate::device::{CpuCaps, GpuCaps};
use crate::gpu::{GpuProgram, GpuStep, Shader, grid_2d, groups};
use crate::shader;

static PREFILL_NAIVE: Shader =
    shader!(head "attention_dims.wgsl"; "attention_prefill_naive.wgsl", "attention.wgsl", "reduce_wg.wgsl", "wload.wgsl");
static PREFILL_FLASH: Shader = shader!(head "attention_dims.wgsl"; "attention_prefill_flash.wgsl", "attention.wgsl", "wload.wgsl");
static PREFILL_FLASH2: Shader =
    shader!(head "attention_dims.wgsl"; "flash2.wgsl", "attention_prefill_flash2.wgsl", "attention.wgsl", "wload.wgsl");
static PREFILL_FLASH2_SG: Shader =
    shader!(head "attention_dims.wgsl"; "flash2.wgsl", "attention_prefill_flash2_sg.wgsl", "attention.wgsl", "wload.wgsl");
static DECODE_STREAM: Shader = shader!(head "attention_decode_head.wgsl", "attention_dims.wgsl"; "attention_decode_stream.wgsl", "attention.wgsl", "reduce_wg.wgsl", "wload.wgsl");
static DECODE_SPLITKV: Shader =
    shader!(head "attention_decode_head.wgsl", "attention_dims.wgsl"; "attention_decode_splitkv.wgsl", "attention.wgsl", "wload.wgsl");
static DECODE_SPLITKV_SG: Shader =
    shader!(head "attention_decode_head.wgsl", "attention_dims.wgsl"; "attention_decode_splitkv_sg.wgsl", "attention.wgsl", "wload.wgsl");

/// Query heads one `attention_decode_splitkv` workgroup handles at most (its
/// per-invocation score and accumulator arrays are sized for this many).
const SPLITKV_MAX_HEADS: usize = 8;

/// Accumulator slots (16-byte words of one head) of one `attention_decode_splitkv_sg`
/// lane: `heads_per_wg * words per lane` must fit.
const SPLITKV_SG_SLOTS: usize = 16;

const NAIVE_PARAMS: &[ParamSpec] =
    &[ParamSpec::new("workgroup_size", &[64, 128, 256], 128, "invocations per workgroup of the three passes (scores, softmax rows, P·V)")];

const FLASH_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "block_q", values: &[8, 16, 32, 64], default: 16, help: "queries per workgroup (Q tile rows)" },
    ParamSpec { name: "block_kv", values: &[16, 32, 64], default: 32, help: "keys per K/V tile staged in workgroup memory" },
    ParamSpec {
        name: "lanes",
        values: &[4, 8, 16],
        default: 8,
        help: "invocations per query row (workgroup = block_q * lanes); each owns head_dim / (4 * lanes) vec4 output columns",
    },
];

/// Register words (16-byte cache words of a row) one `attention_prefill_flash2*` lane
/// holds at most: `head_dim / (4 or 8) <= FLASH2_WORDS * lanes`.
const FLASH2_WORDS: usize = 8;

const FLASH2_PARAMS: &[ParamSpec] = &[
    ParamSpec::new("block_q", &[4, 8, 16, 32], 8, "query tokens per workgroup (Q tile), each with the heads_per_wg heads of its group"),
    ParamSpec::new(
        "heads_per_wg",
        &[1, 2, 4, 8],
        4,
        "query heads of one GQA group per workgroup sharing each K/V tile (at most the group)",
    ),
    ParamSpec::new("block_kv", &[16, 32, 64], 32, "keys per K/V tile (scores held in registers, block_kv / lanes per lane)"),
    ParamSpec::new(
        "lanes",
        &[4, 8, 16],
        8,
        "invocations per query row splitting head_dim (workgroup = block_q * heads_per_wg * lanes); each holds its Q slice and output columns",
    ),
    ParamSpec::new(
        "kv_tile",
        &[0, 1, 2],
        1,
        "0: K/V rows read straight from the cache; 1: K/V tiles staged in workgroup memory; 2: staged with rows padded by 16 bytes",
    ),
];

const STREAM_PARAMS: &[ParamSpec] = &[
    ParamSpec::new("workgroup_size", &[64, 128, 256], 128, "invocations per workgroup (one workgroup per query head)"),
    ParamSpec::new("keys_per_thread", &[1, 2, 4, 8], 2, "keys each invocation scores per tile (tile = workgroup_size * keys_per_thread)"),
];

const SPLITKV_PARAMS: &[ParamSpec] = &[
    ParamSpec::new("workgroup_size", &[64, 128, 256], 128, "invocations per workgroup (keys scored per inner tile)"),
    ParamSpec::new("chunk", &[64, 128, 256, 512, 1024, 2048], 256, "keys per split (splits = visible keys / chunk)"),
];

const SPLITKV_SG_PARAMS: &[ParamSpec] = &[
    ParamSpec::new("workgroup_size", &[32, 64, 128, 256], 128, "invocations per workgroup (its subgroups compute partials side by side)"),
    ParamSpec::new("heads_per_wg", &[1, 2, 4, 8], 4, "query heads of one GQA group per workgroup (sharing each K/V row load)"),
    ParamSpec::new("chunk", &[16, 32, 64, 128, 256, 512], 64, "keys per subgroup partial (partials = visible keys / chunk)"),
];

const PREFILL_ROWS_PARAMS: &[ParamSpec] =
    &[ParamSpec { name: "rows_per_task", values: &[1, 2, 4, 8, 16], default: 4, help: "(token, head) query rows per pool task" }, ISA];

const PREFILL_TILED_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "block_q", values: &[1, 4, 8, 16, 32], default: 8, help: "tokens per pool task (times the GQA group's heads)" },
    ParamSpec { name: "block_kv", values: &[16, 32, 64, 128, 256], default: 64, help: "keys per tile (score rows materialised per tile)" },
    ISA,
];

const DECODE_HEADS_PARAMS: &[ParamSpec] =
    &[ParamSpec::new("keys_per_call", &[1, 4], 4, "K rows per dot-product microkernel call (4: dot4 shares each q load)"), ISA];

const DECODE_SPLIT_PARAMS: &[ParamSpec] =
    &[ParamSpec::new("chunk", &[64, 128, 256, 512, 1024, 2048], 256, "keys per split task (tasks = kv_heads * visible keys / chunk)"), ISA];

pub fn variants() -> Vec<KernelDef> {
    let mut v = vec![
        KernelDef::new(
            "attention_prefill_naive",
            Op::AttentionPrefill,
            DType::FLOAT,
            NAIVE_PARAMS,
            "scores materialised in a scratch buffer; three dispatches: QKᵀ, row softmax, P·V",
            WgslImpl::new(&PREFILL_NAIVE, prepare_naive).shared(shared_wg).check(check_naive),
        ),
        KernelDef::new(
            "attention_prefill_flash",
            Op::AttentionPrefill,
            DType::FLOAT,
            FLASH_PARAMS,
            "tiled online softmax: block_q queries per workgroup, K/V tiles of block_kv rows in workgroup memory",
            WgslImpl::new(&PREFILL_FLASH, prepare_flash).workgroup(flash_wg_size).shared(shared_flash).check(check_flash),
        ),
        KernelDef::new(
            "attention_prefill_flash2",
            Op::AttentionPrefill,
            DType::FLOAT,
            FLASH2_PARAMS,
            "flash v2 without subgroups: GQA heads share K/V tiles, Q slices in registers, head_dim split over lanes, workgroup-memory row reductions",
            WgslImpl::new(&PREFILL_FLASH2, prepare_flash2).workgroup(flash2_wg_size).shared(shared_flash2).check(check_flash2),
        ),
        KernelDef::new(
            "attention_prefill_flash2_sg",
            Op::AttentionPrefill,
            DType::FLOAT,
            FLASH2_PARAMS,
            "flash v2 on subgroups: GQA heads share K/V tiles, Q slices in registers, head_dim split over lanes, shuffle reduce-scatter scores",
            WgslImpl::new(&PREFILL_FLASH2_SG, prepare_flash2)
                .workgroup(flash2_wg_size)
                .shared(shared_flash2_sg)
                .subgroups()
                .check(check_flash2_sg),
        ),
        KernelDef::new(
            "attention_prefill_cpu",
            Op::AttentionPrefill,
            DType::FLOAT,
            PREFILL_ROWS_PARAMS,
            "pool over (token, head) rows; per-key online softmax, SIMD dot and axpy",
            CpuImpl { run: run_prefill_rows, check: check_cpu },
        ),
        KernelDef::new(
            "attention_prefill_tiled_cpu",
            Op::AttentionPrefill,
            DType::FLOAT,
            PREFILL_TILED_PARAMS,
            "pool over (token block, KV head); key tiles with materialised score rows (dot4), K/V tile shared by the GQA group",
            CpuImpl { run: run_prefill_tiled, check: check_cpu },
        ),
        KernelDef::new(
            "attention_decode_stream",
            Op::AttentionDecode,
            DType::FLOAT,
            STREAM_PARAMS,
            "one workgroup per query head streaming the cache; online softmax per tile, coalesced V rows",
            WgslImpl::new(&DECODE_STREAM, prepare_stream).shared(shared_stream).check(check_stream),
        ),
        KernelDef::new(
            "attention_decode_splitkv",
            Op::AttentionDecode,
            DType::FLOAT,
            SPLITKV_PARAMS,
            "flash decoding: chunk-key splits, one workgroup per GQA group reads each KV row once, then a merge pass",
            WgslImpl::new(&DECODE_SPLITKV, prepare_splitkv).shared(shared_splitkv).check(check_splitkv),
        ),
        KernelDef::new(
            "attention_decode_splitkv_sg",
            Op::AttentionDecode,
            DType::FLOAT,
            SPLITKV_SG_PARAMS,
            "flash decoding with subgroups: one subgroup per chunk-key partial, lanes split each K/V row, subgroupAdd scores; splitkv's merge",
            WgslImpl::new(&DECODE_SPLITKV_SG, prepare_splitkv_sg).subgroups().check(check_splitkv_sg),
        ),
        KernelDef::new(
            "attention_decode_heads_cpu",
            Op::AttentionDecode,
            DType::FLOAT,
            DECODE_HEADS_PARAMS,
            "one pool task per head; scores materialised, exact two-pass softmax, SIMD dot/dot4 and axpy",
            CpuImpl { run: run_decode_heads, check: check_cpu },
        ),
        KernelDef::new(
            "attention_decode_splitkv_cpu",
            Op::AttentionDecode,
            DType::FLOAT,
            DECODE_SPLIT_PARAMS,
            "key range split across pool tasks per KV head (the group's heads share each K/V row); (m, l, acc) partials merged",
            CpuImpl { run: run_decode_splitkv, check: check_cpu },
        ),
    ];
    v.extend(mma::variants());
    v
}

// ---------------------------------------------------------------------------
// Shapes and validity

/// One attention call; decode is `tokens = 1`.
#[derive(Clone, Copy, Debug)]
struct Shape {
    tokens: usize,
    kv_len: usize,
    kv_cap: usize,
    heads: usize,
    kv_heads: usize,
    d: usize,
    window: usize,
    scale: f32,
    /// The bidirectional block `[start, end)` of a prefill (equal: none).
    bidi: (usize, usize),
}

impl Shape {
    fn of(p: &Problem) -> Option<Shape> {
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
    fn checked(p: &Problem) -> Result<Shape, String> {
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
    fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// Keys `[lo, hi)` the query at token index `i` sees.
    /// (Never decreasing with `i`, bounds included: a block of queries sees the keys
    /// between its first query's `lo` and its last query's `hi`.)
    fn range(&self, i: usize) -> (usize, usize) {
        super::attention_keys(self.kv_len - self.tokens + i, self.window, self.bidi)
    }

    /// The uniform words every WGSL attention kernel, prefill or decode, starts its
    /// `Dims` with (`shaders/attention_dims.wgsl`): tokens, kv_len, kv_cap, heads,
    /// kv_heads, window, scale (f32 bits), and the bidirectional block b0, b1; the
    /// kernel's own words (`own`, `own2`) may follow.
    fn prefill_words(&self) -> Vec<u32> {
        let mut w: Vec<u32> = [self.tokens, self.kv_len, self.kv_cap, self.heads, self.kv_heads, self.window].map(|v| v as u32).to_vec();
        w.extend([self.scale.to_bits(), self.bidi.0 as u32, self.bidi.1 as u32]);
        w
    }

    /// Cache row of key `j` of KV head `kh`.
    fn row_of(&self, kh: usize, j: usize) -> usize {
        kh * self.kv_cap + j
    }
}

/// What every CPU attention kernel starts from: the checked shape, the ISA level,
/// the caches and the queries.
fn cpu_call<'a>(kd: &KernelDef, prob: &Problem, params: &Params, a: &CpuArgs<'a>) -> Result<(Shape, Isa, Kv<'a>, &'a [f32]), KernelError> {
    let s = shape_or_invalid(kd, prob)?;
    Ok((s, Isa::of(params)?, Kv { k: a.ins[1], v: a.ins[2], s }, a.ins[0].f32()))
}

/// The checked shape of a CPU kernel's problem: [`wrong_op`] for another op
/// (prefill and decode included), `Invalid` for a shape the kernels cannot run.
fn shape_or_invalid(kd: &KernelDef, p: &Problem) -> Result<Shape, KernelError> {
    if p.op() != kd.op {
        return Err(wrong_op(kd, p));
    }
    Shape::checked(p).map_err(|reason| KernelError::Invalid { kernel: kd.id.to_string(), reason })
}

fn check_cpu(_: &CpuCaps, prob: &Problem, _: DType, params: &Params) -> Result<(), String> {
    Shape::checked(prob)?;
    Isa::param_available(param(params, "isa")?)
}

/// Cache elements per 16-byte word (the WGSL kernels' load unit).
fn per_word(dtype: DType) -> usize {
    if dtype == DType::F16 { 8 } else { 4 }
}

/// Shape rules shared by the WGSL kernels: 16-byte cache loads and u32 indexing.
fn check_wgsl_shape(prob: &Problem, dtype: DType) -> Result<Shape, String> {
    let s = Shape::checked(prob)?;
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

fn flash_wg_size(params: &Params) -> Result<[u32; 3], KernelError> {
    Ok([param(params, "block_q")? * param(params, "lanes")?, 1, 1])
}

/// 16-byte words per cache row must fit one workgroup (V rows are read by
/// `head_dim / per_word` invocations side by side).
fn check_row_fits(s: &Shape, dtype: DType, wg: u32) -> Result<(), String> {
    let words = s.d / per_word(dtype);
    if words > wg as usize {
        return Err(format!("head_dim = {} needs {words} invocations per V row, more than workgroup_size = {wg}", s.d));
    }
    Ok(())
}

fn check_grid(caps: &GpuCaps, what: &str, count: usize) -> Result<(), String> {
    if count > caps.max_workgroups_per_dimension as usize {
        return Err(format!("{count} {what} exceed the adapter's {} workgroups per dimension", caps.max_workgroups_per_dimension));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// WGSL: prefill

fn scores_bytes(s: &Shape) -> u64 {
    (s.tokens * s.heads * s.kv_len * 4) as u64
}

fn check_naive(caps: &GpuCaps, prob: &Problem, dtype: DType, _: &Params) -> Result<(), String> {
    let s = check_wgsl_shape(prob, dtype)?;
    let bytes = scores_bytes(&s);
    let limit = caps.max_storage_binding.min(caps.max_buffer_size);
    if bytes > limit {
        return Err(format!("the {bytes}-byte score matrix exceeds the adapter's {limit}-byte storage binding limit"));
    }
    if s.tokens * s.heads * s.kv_len >= u32::MAX as usize {
        return Err("the score matrix overflows the shader's u32 indices".into());
    }
    Ok(())
}

fn prepare_naive(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let sh = shape_or_invalid(s.kernel, s.problem)?;
    let wg = s.param("workgroup_size")?;
    let consts = [("WG", wg as f64), ("W_F16", s.w_f16())];
    let mut words = sh.prefill_words();
    words.push(sh.d as u32);
    let u = s.gpu.uniform(s.kernel.id, &words);
    let scores = s.gpu.storage("attention scores", scores_bytes(&sh));
    let (q, k, v, out) = (s.bufs[0], s.bufs[1], s.bufs[2], s.bufs[3]);
    let rows = sh.tokens * sh.heads;
    let words_per_row = sh.d / per_word(s.dtype);
    let steps = vec![
        step_at(s, "scores", &consts, &[(0, q), (1, k), (4, &u), (5, &scores)], grid_2d(groups(rows * sh.kv_len, wg)))?,
        step_at(s, "softmax", &consts, &[(4, &u), (5, &scores)], grid_2d(rows as u32))?,
        step_at(s, "pv", &consts, &[(2, v), (3, out), (4, &u), (5, &scores)], grid_2d(groups(rows * words_per_row, wg)))?,
    ];
    Ok(GpuProgram { steps, owned: vec![u, scores] })
}

fn shared_flash(prob: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    let d = Shape::of(prob).map_or(0, |s| s.d) as u64;
    let (bq, bkv) = (param(params, "block_q")? as u64, param(params, "block_kv")? as u64);
    Ok(4 * (bq * d + bkv * d + bq * bkv))
}

fn check_flash(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    let s = check_wgsl_shape(prob, dtype)?;
    let lanes = param(params, "lanes")? as usize;
    if s.d > 32 * lanes {
        return Err(format!(
            "head_dim = {} needs lanes >= {} (each invocation keeps at most 8 vec4 output columns)",
            s.d,
            s.d.div_ceil(32)
        ));
    }
    check_grid(caps, "query blocks", s.tokens.div_ceil(param(params, "block_q")? as usize))?;
    check_grid(caps, "heads", s.heads)
}

fn prepare_flash(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let sh = shape_or_invalid(s.kernel, s.problem)?;
    let (bq, bkv, lanes) = (s.param("block_q")?, s.param("block_kv")?, s.param("lanes")?);
    let consts = [("BQ", bq as f64), ("BKV", bkv as f64), ("LANES", lanes as f64), ("HD", sh.d as f64), ("W_F16", s.w_f16())];
    s.one_step("main", &consts, &sh.prefill_words(), [groups(sh.tokens, bq), sh.heads as u32, 1])
}

/// How `attention_prefill_flash2*` lays out one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Flash2Plan {
    /// Query tokens and heads per workgroup (`BQ`, `GH`), lanes per query row.
    bq: usize,
    gh: usize,
    lanes: usize,
    /// Head sub-blocks per KV head (`nsub` workgroups along y per KV head).
    nsub: usize,
    /// 16-byte words per cache row (`RW`) and per lane at most (`NW`).
    rw: usize,
    nw: usize,
    bkv: usize,
    stage: bool,
    /// Words of padding after each staged row (`PAD`).
    pad: usize,
}

impl Flash2Plan {
    fn of(s: &Shape, dtype: DType, params: &Params) -> Result<Flash2Plan, KernelError> {
        let gh = (param(params, "heads_per_wg")? as usize).clamp(1, s.group());
        let lanes = param(params, "lanes")? as usize;
        let rw = s.d / per_word(dtype);
        let tile = param(params, "kv_tile")?;
        Ok(Flash2Plan {
            bq: param(params, "block_q")? as usize,
            gh,
            lanes,
            nsub: s.group().div_ceil(gh),
            rw,
            nw: rw.div_ceil(lanes.max(1)),
            bkv: param(params, "block_kv")? as usize,
            stage: tile > 0,
            pad: usize::from(tile == 2),
        })
    }

    fn invocations(&self) -> u64 {
        (self.bq * self.gh * self.lanes) as u64
    }

    /// 16-byte words of the staged K/V tile (`TILE`; 1 without staging, an array
    /// must have an element).
    fn tile_words(&self) -> usize {
        if self.stage { self.bkv * (self.rw + self.pad) } else { 1 }
    }

    /// Bytes of the staged K/V tile, if any.
    fn tile_bytes(&self) -> u64 {
        if self.stage { 16 * self.tile_words() as u64 } else { 0 }
    }

    fn grid(&self, s: &Shape) -> [u32; 3] {
        [s.tokens.div_ceil(self.bq) as u32, (s.kv_heads * self.nsub) as u32, 1]
    }
}

/// The plan of a call, or zero heads/head_dim for a problem of another op (the
/// registry's generic checks run before the kernel's own).
fn flash2_plan(prob: &Problem, dtype: DType, params: &Params) -> Result<Flash2Plan, KernelError> {
    let s = Shape::of(prob).filter(|s| s.kv_heads > 0 && s.heads % s.kv_heads == 0).unwrap_or(Shape {
        tokens: 1,
        kv_len: 1,
        kv_cap: 1,
        heads: 1,
        kv_heads: 1,
        d: 0,
        window: 0,
        scale: 1.0,
        bidi: (0, 0),
    });
    Flash2Plan::of(&s, dtype, params)
}

/// The upper bound (heads_per_wg before it is clamped to the group).
fn flash2_wg_size(params: &Params) -> Result<[u32; 3], KernelError> {
    Ok([param(params, "block_q")? * param(params, "heads_per_wg")? * param(params, "lanes")?, 1, 1])
}

fn shared_flash2_sg(prob: &Problem, dtype: DType, params: &Params) -> Result<u64, KernelError> {
    Ok(flash2_plan(prob, dtype, params)?.tile_bytes())
}

/// The tile, the reduce-scatter buffer (LANES partials per invocation), the row
/// values and the tile's probabilities.
fn shared_flash2(prob: &Problem, dtype: DType, params: &Params) -> Result<u64, KernelError> {
    let p = flash2_plan(prob, dtype, params)?;
    let inv = p.invocations();
    Ok(p.tile_bytes() + 4 * (inv * p.lanes as u64 + inv + (p.bq * p.gh * p.bkv) as u64))
}

fn check_flash2_common(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<Flash2Plan, String> {
    let s = check_wgsl_shape(prob, dtype)?;
    let p = Flash2Plan::of(&s, dtype, params).map_err(|e| e.to_string())?;
    if p.nw > FLASH2_WORDS {
        return Err(format!(
            "head_dim = {} is {} {dtype} words of 16 bytes, {} per lane over {} lanes, more than the {FLASH2_WORDS} a lane holds; raise lanes",
            s.d, p.rw, p.nw, p.lanes
        ));
    }
    if p.bkv % p.lanes != 0 || p.bkv / p.lanes > 16 {
        return Err(format!("block_kv = {} must be a multiple of lanes = {} and at most 16 keys per lane", p.bkv, p.lanes));
    }
    check_grid(caps, "query blocks", s.tokens.div_ceil(p.bq))?;
    check_grid(caps, "KV head blocks", s.kv_heads * p.nsub)?;
    Ok(p)
}

fn check_flash2(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    check_flash2_common(caps, prob, dtype, params).map(|_| ())
}

fn check_flash2_sg(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    let p = check_flash2_common(caps, prob, dtype, params)?;
    let sg_min = caps.subgroup_min_size as usize;
    if sg_min == 0 {
        return Err("the adapter reports no subgroup size".into());
    }
    if p.lanes > sg_min {
        return Err(format!("rows of lanes = {} need subgroups at least that wide; the adapter's smallest is {sg_min}", p.lanes));
    }
    Ok(())
}

fn prepare_flash2(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let sh = shape_or_invalid(s.kernel, s.problem)?;
    let p = Flash2Plan::of(&sh, s.dtype, s.params)?;
    let consts = [
        ("BQ", p.bq as f64),
        ("GH", p.gh as f64),
        ("BKV", p.bkv as f64),
        ("LANES", p.lanes as f64),
        ("HD", sh.d as f64),
        ("RW", p.rw as f64),
        ("NW", p.nw as f64),
        ("STAGE", if p.stage { 1.0 } else { 0.0 }),
        ("PAD", p.pad as f64),
        ("TILE", p.tile_words() as f64),
        ("W_F16", s.w_f16()),
    ];
    let mut words = sh.prefill_words();
    words.push(p.nsub as u32);
    s.one_step("main", &consts, &words, p.grid(&sh))
}

// ---------------------------------------------------------------------------
// WGSL: decode

fn head_dim_of(prob: &Problem) -> u64 {
    Shape::of(prob).map_or(0, |s| s.d) as u64
}

fn shared_stream(prob: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    let wg = param(params, "workgroup_size")? as u64;
    let kpt = param(params, "keys_per_thread")? as u64;
    // q, tile scores, reduction, slice combine (2 vec4 per invocation)
    Ok(4 * head_dim_of(prob) + 4 * wg * kpt + 4 * wg + 32 * wg)
}

fn check_stream(_: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    let s = check_wgsl_shape(prob, dtype)?;
    check_row_fits(&s, dtype, param(params, "workgroup_size")?)
}

fn prepare_stream(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let sh = shape_or_invalid(s.kernel, s.problem)?;
    let (wg, kpt) = (s.param("workgroup_size")?, s.param("keys_per_thread")?);
    let consts = [("WG", wg as f64), ("KPT", kpt as f64), ("HD", sh.d as f64), ("W_F16", s.w_f16())];
    s.one_step("main", &consts, &sh.prefill_words(), grid_2d(sh.heads as u32))
}

/// How `attention_decode_splitkv` covers a GQA group: `nsub` workgroups of at most
/// `gh` heads each per KV head.
fn splitkv_groups(s: &Shape) -> (usize, usize) {
    let g = s.group();
    let nsub = g.div_ceil(SPLITKV_MAX_HEADS);
    (nsub, g.div_ceil(nsub))
}

/// Number of `chunk`-key splits of the visible keys.
fn splitkv_splits(s: &Shape, chunk: usize) -> usize {
    let (lo, hi) = s.range(0);
    (hi - lo).div_ceil(chunk.max(1))
}

fn shared_splitkv(prob: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    let wg = param(params, "workgroup_size")? as u64;
    let (d, gh) = match Shape::of(prob) {
        Some(s) if s.kv_heads > 0 => (s.d as u64, splitkv_groups(&s).1 as u64),
        _ => (0, 1),
    };
    // q of the group, per-head tile probabilities, reductions (2 vec4 per invocation)
    Ok(4 * gh * d + 4 * gh * wg + 32 * wg)
}

fn check_splitkv(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    let s = check_wgsl_shape(prob, dtype)?;
    check_row_fits(&s, dtype, param(params, "workgroup_size")?)?;
    let splits = splitkv_splits(&s, param(params, "chunk")? as usize);
    check_grid(caps, "splits", splits)?;
    check_grid(caps, "KV head groups", s.kv_heads * splitkv_groups(&s).0)?;
    let bytes = (splits * s.heads * (s.d + 2) * 4) as u64;
    if bytes > caps.max_storage_binding.min(caps.max_buffer_size) {
        return Err(format!("the {bytes}-byte partial buffer exceeds the adapter's storage binding limit"));
    }
    Ok(())
}

fn prepare_splitkv(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let sh = shape_or_invalid(s.kernel, s.problem)?;
    let (wg, chunk) = (s.param("workgroup_size")?, s.param("chunk")?);
    let (nsub, gh) = splitkv_groups(&sh);
    let splits = splitkv_splits(&sh, chunk as usize);
    let ml_off = splits * sh.heads * sh.d;
    let consts = [("WG", wg as f64), ("HD", sh.d as f64), ("GH", gh as f64), ("CHUNK", chunk as f64), ("W_F16", s.w_f16())];
    let mut words = sh.prefill_words();
    words.extend([nsub as u32, ml_off as u32]);
    let u = s.gpu.uniform(s.kernel.id, &words);
    let part = s.gpu.storage("attention partials", ((ml_off + 2 * splits * sh.heads) * 4) as u64);
    let (q, k, v, out) = (s.bufs[0], s.bufs[1], s.bufs[2], s.bufs[3]);
    let steps = vec![
        step_at(s, "split", &consts, &[(0, q), (1, k), (2, v), (4, &u), (5, &part)], [(sh.kv_heads * nsub) as u32, splits as u32, 1])?,
        step_at(s, "reduce", &consts, &[(3, out), (4, &u), (5, &part)], grid_2d(groups(sh.heads * sh.d, wg)))?,
    ];
    Ok(GpuProgram { steps, owned: vec![u, part] })
}

/// How `attention_decode_splitkv_sg` lays out one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SgPlan {
    /// Workgroups per KV head and query heads per workgroup (`GH`).
    nsub: usize,
    gh: usize,
    /// 16-byte words of a cache row each lane takes at most (`WPL`).
    wpl: usize,
    /// Partials per workgroup (`SPW`) and in all.
    spw: usize,
    parts: usize,
}

impl SgPlan {
    /// `None` when the adapter reports no subgroup size.
    fn of(s: &Shape, dtype: DType, caps: &GpuCaps, wg: u32, heads_per_wg: u32, chunk: u32) -> Option<SgPlan> {
        let sg_min = caps.subgroup_min_size as usize;
        if sg_min == 0 {
            return None;
        }
        let gh = (heads_per_wg as usize).clamp(1, s.group());
        let nsub = s.group().div_ceil(gh);
        let gh = s.group().div_ceil(nsub);
        let wpl = (s.d / per_word(dtype)).div_ceil(sg_min);
        let spw = (wg as usize / sg_min).max(1);
        Some(SgPlan { nsub, gh, wpl, spw, parts: splitkv_splits(s, chunk as usize) })
    }

    fn workgroups_y(&self) -> usize {
        self.parts.div_ceil(self.spw)
    }
}

fn check_splitkv_sg(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    let s = check_wgsl_shape(prob, dtype)?;
    subgroup_fits(caps, params)?;
    let (wg, hpw, chunk) = (param(params, "workgroup_size")?, param(params, "heads_per_wg")?, param(params, "chunk")?);
    let p = SgPlan::of(&s, dtype, caps, wg, hpw, chunk).ok_or("the adapter reports no subgroup size")?;
    if p.gh * p.wpl > SPLITKV_SG_SLOTS {
        return Err(format!(
            "head_dim = {} is {} words per lane on subgroups of {}, times {} heads per workgroup is over the {SPLITKV_SG_SLOTS} accumulator slots; lower heads_per_wg",
            s.d, p.wpl, caps.subgroup_min_size, p.gh
        ));
    }
    check_grid(caps, "partial blocks", p.workgroups_y())?;
    check_grid(caps, "KV head groups", s.kv_heads * p.nsub)?;
    let floats = p.parts * s.heads * (s.d + 2);
    if floats as u64 >= u32::MAX as u64 {
        return Err(format!("{floats} partial values overflow the shader's u32 indices"));
    }
    let bytes = (floats * 4) as u64;
    if bytes > caps.max_storage_binding.min(caps.max_buffer_size) {
        return Err(format!("the {bytes}-byte partial buffer exceeds the adapter's storage binding limit"));
    }
    Ok(())
}

fn prepare_splitkv_sg(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let sh = shape_or_invalid(s.kernel, s.problem)?;
    let (wg, hpw, chunk) = (s.param("workgroup_size")?, s.param("heads_per_wg")?, s.param("chunk")?);
    let p = SgPlan::of(&sh, s.dtype, &s.gpu.caps, wg, hpw, chunk)
        .ok_or_else(|| KernelError::Invalid { kernel: s.kernel.id.to_string(), reason: "the adapter reports no subgroup size".into() })?;
    let ml_off = p.parts * sh.heads * sh.d;
    let consts = [
        ("WG", wg as f64),
        ("HD", sh.d as f64),
        ("GH", p.gh as f64),
        ("CHUNK", chunk as f64),
        ("SPW", p.spw as f64),
        ("WPL", p.wpl as f64),
        ("W_F16", s.w_f16()),
    ];
    // splitkv's merge, over the same partial layout with CHUNK keys per partial
    let merge = [("WG", wg as f64), ("HD", sh.d as f64), ("CHUNK", chunk as f64), ("W_F16", s.w_f16())];
    let mut words = sh.prefill_words();
    words.extend([p.nsub as u32, ml_off as u32]);
    let u = s.gpu.uniform(s.kernel.id, &words);
    let part = s.gpu.storage("attention partials", ((ml_off + 2 * p.parts * sh.heads) * 4) as u64);
    let (q, k, v, out) = (s.bufs[0], s.bufs[1], s.bufs[2], s.bufs[3]);
    let grid = [(sh.kv_heads * p.nsub) as u32, p.workgroups_y() as u32, 1];
    let steps = vec![
        step_with(s, s.shader(), "split", &consts, &[(0, q), (1, k), (2, v), (4, &u), (5, &part)], grid)?,
        step_with(s, &DECODE_SPLITKV, "reduce", &merge, &[(3, out), (4, &u), (5, &part)], grid_2d(groups(sh.heads * sh.d, wg)))?,
    ];
    Ok(GpuProgram { steps, owned: vec![u, part] })
}

/// One dispatch of `entry` of the variant's shader binding `binds` at the given
/// binding numbers (multi-pass kernels bind a different subset per entry point).
fn step_at(
    s: &WgslSetup<'_>,
    entry: &str,
    constants: &[(&str, f64)],
    binds: &[(u32, &wgpu::Buffer)],
    workgroups: [u32; 3],
) -> Result<GpuStep, KernelError> {
    step_with(s, s.shader(), entry, constants, binds, workgroups)
}

/// [`step_at`] with an entry point of another shader (a shared merge pass).
pub(crate) fn step_with(
    s: &WgslSetup<'_>,
    shader: &'static Shader,
    entry: &str,
    constants: &[(&str, f64)],
    binds: &[(u32, &wgpu::Buffer)],
    workgroups: [u32; 3],
) -> Result<GpuStep, KernelError> {
    let pipeline: Arc<wgpu::ComputePipeline> = s.gpu.pipeline(shader, entry, constants)?;
    let label = format!("{}:{entry}", s.kernel.id);
    let entries = binds.iter().map(|&(binding, b)| (binding, b.clone(), 0, None)).collect();
    Ok(s.gpu.step_entries(label, pipeline, entries, workgroups)?)
}

// ---------------------------------------------------------------------------
// CPU orchestration

#[inline]
fn scale_in_place(y: &mut [f32], c: f32) {
    for v in y {
        *v *= c;
    }
}

/// Cache operands of one call.
#[derive(Clone, Copy)]
struct Kv<'a> {
    k: CpuIn<'a>,
    v: CpuIn<'a>,
    s: Shape,
}

impl<'a> Kv<'a> {
    fn k(&self, kh: usize, j: usize) -> Row<'a> {
        row(self.k, self.s.row_of(kh, j), self.s.d)
    }
    fn v(&self, kh: usize, j: usize) -> Row<'a> {
        row(self.v, self.s.row_of(kh, j), self.s.d)
    }
}

/// One query row with a per-key online softmax: the accumulator is rescaled only
/// when the running maximum grows.
fn attend_online(isa: Isa, kv: &Kv<'_>, q: &[f32], kh: usize, (lo, hi): (usize, usize), o: &mut [f32]) {
    o.fill(0.0);
    let mut m = f32::NEG_INFINITY;
    let mut l = 0.0f32;
    for j in lo..hi {
        let sc = cpu::dot(isa, q, kv.k(kh, j)) * kv.s.scale;
        if sc > m {
            let c = (m - sc).exp();
            if l > 0.0 {
                scale_in_place(o, c);
                l *= c;
            }
            m = sc;
        }
        let pj = (sc - m).exp();
        l += pj;
        axpy_row(isa, pj, kv.v(kh, j), o);
    }
    scale_in_place(o, 1.0 / l);
}

/// Scores `scale * q · K[j]` for `j` in `lo..lo + out.len()`, four K rows per
/// microkernel call when `four`.
fn scores_into(isa: Isa, kv: &Kv<'_>, q: &[f32], kh: usize, lo: usize, four: bool, out: &mut [f32]) {
    let n = out.len();
    let mut c = 0;
    if four {
        while c + 4 <= n {
            let j = lo + c;
            let r = cpu::dot4(isa, q, [kv.k(kh, j), kv.k(kh, j + 1), kv.k(kh, j + 2), kv.k(kh, j + 3)]);
            for (o, v) in out[c..c + 4].iter_mut().zip(r) {
                *o = v * kv.s.scale;
            }
            c += 4;
        }
    }
    for (cc, o) in out.iter_mut().enumerate().skip(c) {
        *o = cpu::dot(isa, q, kv.k(kh, lo + cc)) * kv.s.scale;
    }
}

/// Turns scores into `exp(s - max)` in place; returns `(max, sum)`.
fn exp_row(sc: &mut [f32]) -> (f32, f32) {
    let m = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut l = 0.0;
    for v in sc.iter_mut() {
        *v = (*v - m).exp();
        l += *v;
    }
    (m, l)
}

// ---------------------------------------------------------------------------
// CPU: prefill

fn run_prefill_rows(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let (s, isa, kv, q) = cpu_call(kd, prob, params, &a)?;
    let grain = (param(params, "rows_per_task")? as usize).max(1);
    let d = s.d;
    let out = &mut a.outs[0][..s.tokens * s.heads * d];
    cpu::pool::for_chunks_mut(out, d * grain, |ci, chunk| {
        for (ri, o) in chunk.chunks_mut(d).enumerate() {
            let r = ci * grain + ri;
            let (i, h) = (r / s.heads, r % s.heads);
            attend_online(isa, &kv, &q[r * d..][..d], h / s.group(), s.range(i), o);
        }
    });
    Ok(())
}

/// `block` tokens starting at `i0`, all query heads of KV head `kh`, over key tiles of
/// `bkv` rows: scores of every row for the tile first (materialised), then one
/// rescale per row and the P·V update with each V row shared by all rows.
/// Returns the outputs, row `(token, g)` at `(t * group + g) * d`.
fn prefill_block(isa: Isa, kv: &Kv<'_>, q: &[f32], i0: usize, block: usize, kh: usize, bkv: usize) -> Vec<f32> {
    let s = kv.s;
    let (g_n, d) = (s.group(), s.d);
    let rows = block * g_n;
    let mut acc = vec![0.0f32; rows * d];
    let mut m = vec![f32::NEG_INFINITY; rows];
    let mut l = vec![0.0f32; rows];
    let mut sc = vec![0.0f32; rows * bkv];
    let klo = s.range(i0).0;
    let khi = s.range(i0 + block - 1).1;
    let mut t0 = klo;
    while t0 < khi {
        let t1 = (t0 + bkv).min(khi);
        let n = t1 - t0;
        for t in 0..block {
            let (lo, hi) = s.range(i0 + t);
            let (a, b) = (lo.max(t0), hi.min(t1));
            for g in 0..g_n {
                let r = t * g_n + g;
                let srow = &mut sc[r * bkv..][..n];
                srow.fill(0.0);
                if a >= b {
                    continue;
                }
                let h = kh * g_n + g;
                let qr = &q[((i0 + t) * s.heads + h) * d..][..d];
                scores_into(isa, kv, qr, kh, a, true, &mut srow[a - t0..b - t0]);
                let mt = srow[a - t0..b - t0].iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mn = m[r].max(mt);
                let c = (m[r] - mn).exp();
                if l[r] > 0.0 {
                    scale_in_place(&mut acc[r * d..][..d], c);
                    l[r] *= c;
                }
                m[r] = mn;
                for v in srow[a - t0..b - t0].iter_mut() {
                    *v = (*v - mn).exp();
                    l[r] += *v;
                }
            }
        }
        for c in 0..n {
            let vr = kv.v(kh, t0 + c);
            for r in 0..rows {
                let pr = sc[r * bkv + c];
                if pr != 0.0 {
                    axpy_row(isa, pr, vr, &mut acc[r * d..][..d]);
                }
            }
        }
        t0 = t1;
    }
    for r in 0..rows {
        scale_in_place(&mut acc[r * d..][..d], 1.0 / l[r]);
    }
    acc
}

fn run_prefill_tiled(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let (s, isa, kv, q) = cpu_call(kd, prob, params, &a)?;
    let bq = (param(params, "block_q")? as usize).max(1);
    let bkv = (param(params, "block_kv")? as usize).max(1);
    let (g_n, d) = (s.group(), s.d);
    let tasks: Vec<(usize, usize)> = (0..s.tokens.div_ceil(bq)).flat_map(|b| (0..s.kv_heads).map(move |kh| (b, kh))).collect();
    let mut blocks: Vec<(usize, usize, usize, Vec<f32>)> =
        tasks.iter().map(|&(b, kh)| (b * bq, bq.min(s.tokens - b * bq), kh, Vec::new())).collect();
    cpu::pool::for_chunks_mut(&mut blocks, 1, |_, t| {
        let (i0, block, kh, acc) = &mut t[0];
        *acc = prefill_block(isa, &kv, q, *i0, *block, *kh, bkv);
    });
    let out = &mut a.outs[0];
    for (i0, block, kh, acc) in blocks {
        for t in 0..block {
            let dst = ((i0 + t) * s.heads + kh * g_n) * d;
            out[dst..dst + g_n * d].copy_from_slice(&acc[t * g_n * d..][..g_n * d]);
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// CPU: decode

thread_local! {
    /// Every query head's score row (decode), held by the calling thread and
    /// reused across calls: the pool's workers get their rows from it, so which
    /// worker runs which head never decides whether a call allocates.
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn run_decode_heads(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let (s, isa, kv, q) = cpu_call(kd, prob, params, &a)?;
    let four = param(params, "keys_per_call")? == 4;
    let d = s.d;
    let (lo, hi) = s.range(0);
    let n = hi - lo; // at least the query's own key
    cpu::with_scratch_cap(&SCORES, s.heads * n, s.heads * s.kv_cap, |scores| {
        cpu::pool::for_chunks_mut2(&mut a.outs[0][..s.heads * d], d, scores, n, |h, o, sc| {
            let kh = h / s.group();
            scores_into(isa, &kv, &q[h * d..][..d], kh, lo, four, sc);
            let (_, l) = exp_row(sc);
            let inv = 1.0 / l;
            o.fill(0.0);
            for (c, pc) in sc.iter().enumerate() {
                axpy_row(isa, pc * inv, kv.v(kh, lo + c), o);
            }
        })
    });
    Ok(())
}

thread_local! {
    /// Split-KV decode: every split's partial softmax states and score rows, held
    /// by the calling thread and sized for the cache once.
    static SPLIT_PARTS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    static SPLIT_SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Keys `a..b` of KV head `kh` for all the query heads of its group: each K row is
/// scored against every query of the group, each V row accumulated into all of
/// them. `parts` gets per query head `[max, sum, acc[d]]`; `sc` holds the group's
/// score rows (`g_n * (b - a)` floats at least).
#[allow(clippy::too_many_arguments)]
fn split_partials(isa: Isa, kv: &Kv<'_>, q: &[f32], kh: usize, a: usize, b: usize, parts: &mut [f32], sc: &mut [f32]) {
    let s = kv.s;
    let (g_n, d, n) = (s.group(), s.d, b - a);
    for c in 0..n {
        let kr = kv.k(kh, a + c);
        for g in 0..g_n {
            sc[g * n + c] = cpu::dot(isa, &q[(kh * g_n + g) * d..][..d], kr) * s.scale;
        }
    }
    for (row, part) in sc[..g_n * n].chunks_mut(n).zip(parts.chunks_mut(d + 2)) {
        let (m, l) = exp_row(row);
        part[0] = m;
        part[1] = l;
        part[2..].fill(0.0);
    }
    for c in 0..n {
        let vr = kv.v(kh, a + c);
        for (g, part) in parts.chunks_mut(d + 2).enumerate() {
            axpy_row(isa, sc[g * n + c], vr, &mut part[2..]);
        }
    }
}

fn run_decode_splitkv(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let (s, isa, kv, q) = cpu_call(kd, prob, params, &a)?;
    let chunk = (param(params, "chunk")? as usize).max(1);
    let (g_n, d) = (s.group(), s.d);
    let (lo, hi) = s.range(0);
    let splits = (hi - lo).div_ceil(chunk);
    let most = s.kv_heads * s.kv_cap.div_ceil(chunk);
    let (per_part, per_sc) = (g_n * (d + 2), g_n * chunk.min(hi - lo));
    // parts[(kh * splits + c) * per_part ..]: query head g's [max, sum, acc]
    cpu::with_scratch_cap(&SPLIT_PARTS, s.kv_heads * splits * per_part, most * per_part, |parts| {
        cpu::with_scratch_cap(&SPLIT_SCORES, s.kv_heads * splits * per_sc, most * g_n * chunk, |scores| {
            cpu::pool::for_chunks_mut2(parts, per_part, scores, per_sc, |t, p, sc| {
                let (kh, c) = (t / splits, t % splits);
                let a0 = lo + c * chunk;
                split_partials(isa, &kv, q, kh, a0, (a0 + chunk).min(hi), p, sc);
            });
        });
        let parts = &*parts;
        cpu::pool::for_chunks_mut(&mut a.outs[0][..s.heads * d], d, |h, o| {
            let (kh, g) = (h / g_n, h % g_n);
            let mine = |c: usize| &parts[(kh * splits + c) * per_part + g * (d + 2)..][..d + 2];
            let mx = (0..splits).map(|c| mine(c)[0]).fold(f32::NEG_INFINITY, f32::max);
            o.fill(0.0);
            let mut l = 0.0;
            for c in 0..splits {
                let p = mine(c);
                let w = (p[0] - mx).exp();
                l += w * p[1];
                cpu::axpy(isa, w, &p[2..], o);
            }
            scale_in_place(o, 1.0 / l);
        });
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::CpuCaps;
    use crate::kernels::verify::{Runner, check_one};
    use crate::kernels::{Caps, registry};

    /// Shapes beyond the op's test set: GQA groups wider than one splitkv workgroup
    /// (12 and 10 heads per KV head), MQA, head_dim not a power of two, a window
    /// longer than the context, a prefill continuing a long cache.
    fn extra_problems() -> Vec<Problem> {
        vec![
            Problem::AttentionDecode { kv_len: 150, kv_cap: 160, heads: 12, kv_heads: 1, head_dim: 16, window: 0, scale: 0.25 },
            Problem::AttentionDecode { kv_len: 333, kv_cap: 333, heads: 20, kv_heads: 2, head_dim: 24, window: 100, scale: 0.2 },
            Problem::AttentionDecode { kv_len: 40, kv_cap: 64, heads: 3, kv_heads: 3, head_dim: 80, window: 4096, scale: 0.11 },
            Problem::AttentionPrefill {
                tokens: 9,
                kv_len: 30,
                kv_cap: 31,
                heads: 12,
                kv_heads: 1,
                head_dim: 8,
                window: 0,
                scale: 0.35,
                bidi_start: 0,
                bidi_end: 0,
            },
            Problem::AttentionPrefill {
                tokens: 3,
                kv_len: 90,
                kv_cap: 96,
                heads: 4,
                kv_heads: 2,
                head_dim: 24,
                window: 7,
                scale: 0.2,
                bidi_start: 0,
                bidi_end: 0,
            },
        ]
    }

    fn run_all(runner: &Runner<'_>, caps: Caps<'_>, backend: super::super::Backend) -> usize {
        let mut ran = 0;
        let ops = [Op::AttentionPrefill, Op::AttentionDecode];
        for k in registry().iter().filter(|k| ops.contains(&k.op) && k.backend() == backend) {
            for prob in extra_problems().iter().filter(|pr| pr.op() == k.op) {
                for &dtype in k.dtypes {
                    let params = k.default_params();
                    if k.check(caps, prob, dtype, &params).is_err() {
                        continue;
                    }
                    let c = check_one(runner, k, prob, dtype, &params, 7);
                    assert!(c.passed, "{} {dtype} on {}: rel err {:e} {:?}", k.id, c.problem, c.rel_err, c.error);
                    ran += 1;
                }
            }
        }
        ran
    }

    #[test]
    fn cpu_kernels_handle_wide_groups_and_windows() {
        let caps = CpuCaps::detect();
        assert!(run_all(&Runner::Cpu, Caps::Cpu(&caps), super::super::Backend::Cpu) > 0);
    }

    #[test]
    fn wgsl_kernels_handle_wide_groups_and_windows() {
        let Some(gpu) = crate::testing::test_gpu() else { return };
        assert!(run_all(&Runner::Gpu(&gpu), Caps::Gpu(&gpu.caps), super::super::Backend::Wgsl) > 0);
    }

    #[test]
    fn splitkv_covers_wide_groups_with_few_workgroups() {
        let s = Shape::of(&extra_problems()[0]).expect("attention");
        assert_eq!(splitkv_groups(&s), (2, 6));
        let s = Shape::of(&extra_problems()[1]).expect("attention");
        assert_eq!(splitkv_groups(&s), (2, 5));
        assert_eq!(splitkv_splits(&s, 64), 2);
    }

    fn sg_params(wg: u32, hpw: u32, chunk: u32) -> Params {
        let k = crate::kernels::find("attention_decode_splitkv_sg").expect("registered");
        let mut p = k.default_params();
        p.insert("workgroup_size".into(), wg);
        p.insert("heads_per_wg".into(), hpw);
        p.insert("chunk".into(), chunk);
        p
    }

    /// GQA groups of 1, 4, 6 and 12 heads per KV head, key counts that are no
    /// multiple of the chunk, a window, head_dim 8 to 128, every heads_per_wg: each
    /// combination must be valid on the test adapter and match the reference.
    #[test]
    fn splitkv_sg_matches_reference_over_heads_per_wg_and_chunks() {
        let Some(gpu) = crate::testing::test_gpu() else { return };
        if !gpu.caps.subgroups {
            return;
        }
        let k = crate::kernels::find("attention_decode_splitkv_sg").expect("registered");
        let probs = [
            Problem::AttentionDecode { kv_len: 1, kv_cap: 4, heads: 2, kv_heads: 2, head_dim: 8, window: 0, scale: 0.35 },
            Problem::AttentionDecode { kv_len: 77, kv_cap: 80, heads: 8, kv_heads: 2, head_dim: 32, window: 0, scale: 0.2 },
            Problem::AttentionDecode { kv_len: 301, kv_cap: 320, heads: 12, kv_heads: 2, head_dim: 64, window: 0, scale: 0.125 },
            Problem::AttentionDecode { kv_len: 150, kv_cap: 160, heads: 12, kv_heads: 1, head_dim: 16, window: 0, scale: 0.25 },
            Problem::AttentionDecode { kv_len: 333, kv_cap: 333, heads: 4, kv_heads: 4, head_dim: 24, window: 100, scale: 0.2 },
        ];
        let wg = gpu.caps.subgroup_max_size.clamp(32, 256);
        let mut ran = 0;
        for prob in &probs {
            for hpw in [1, 2, 4, 8] {
                for chunk in [16, 64] {
                    let params = sg_params(wg, hpw, chunk);
                    for dtype in [DType::F32, DType::F16] {
                        if check_wgsl_shape(prob, dtype).is_err() {
                            continue; // head_dim 24 has no f16 form
                        }
                        if let Err(e) = k.check(Caps::Gpu(&gpu.caps), prob, dtype, &params) {
                            panic!("{dtype} {hpw} heads/wg chunk {chunk} rejected on {}: {e}", gpu.name);
                        }
                        let c = check_one(&Runner::Gpu(&gpu), k, prob, dtype, &params, 11);
                        assert!(c.passed, "{dtype} heads/wg {hpw} chunk {chunk} on {}: rel err {:e} {:?}", c.problem, c.rel_err, c.error);
                        ran += 1;
                    }
                }
            }
        }
        assert!(ran >= 60, "only {ran} checks ran");
        // head_dim 128 (one whole subgroup-wide row or more per lane) at the default parameters
        let big = Problem::AttentionDecode { kv_len: 517, kv_cap: 600, heads: 8, kv_heads: 2, head_dim: 128, window: 0, scale: 0.0884 };
        let params = sg_params(wg, 2, 64);
        for dtype in [DType::F32, DType::F16] {
            let c = check_one(&Runner::Gpu(&gpu), k, &big, dtype, &params, 5);
            assert!(c.passed, "{dtype} on {}: rel err {:e} {:?}", c.problem, c.rel_err, c.error);
        }
    }

    #[test]
    fn splitkv_sg_validity_gives_reasons() {
        let k = crate::kernels::find("attention_decode_splitkv_sg").expect("registered");
        let caps = crate::testing::typical_gpu_caps();
        let reason = |p: &Problem, d: DType, params: &Params, c: &GpuCaps| k.check(Caps::Gpu(c), p, d, params).unwrap_err();
        let p = Problem::AttentionDecode { kv_len: 100, kv_cap: 128, heads: 16, kv_heads: 2, head_dim: 128, window: 0, scale: 0.1 };
        assert!(k.check(Caps::Gpu(&caps), &p, DType::F32, &sg_params(128, 4, 64)).is_ok());
        // 32 words per row over 8 lanes = 4 per lane; 8 heads need 32 slots
        assert!(reason(&p, DType::F32, &sg_params(128, 8, 64), &caps).contains("lower heads_per_wg"));
        // f16 rows are half as many words: 8 heads fit
        assert!(k.check(Caps::Gpu(&caps), &p, DType::F16, &sg_params(128, 8, 64)).is_ok());
        let wide = Problem::AttentionDecode { kv_len: 100, kv_cap: 128, heads: 4, kv_heads: 4, head_dim: 1024, window: 0, scale: 0.1 };
        assert!(reason(&wide, DType::F32, &sg_params(128, 1, 64), &caps).contains("words per lane"));
        // head_dim not whole 16-byte words
        let odd = Problem::AttentionDecode { kv_len: 4, kv_cap: 8, heads: 2, kv_heads: 2, head_dim: 12, window: 0, scale: 1.0 };
        assert!(reason(&odd, DType::F16, &sg_params(128, 1, 64), &caps).contains("multiple of 8"));
        // no subgroups; a workgroup narrower than a subgroup
        assert!(reason(&p, DType::F32, &sg_params(128, 4, 64), &GpuCaps { subgroups: false, ..caps.clone() }).contains("subgroup"));
        assert!(
            reason(&p, DType::F32, &sg_params(32, 4, 64), &GpuCaps { subgroup_max_size: 64, ..caps.clone() }).contains("subgroup size 64")
        );
        // more partial blocks than the grid allows
        let long = Problem::AttentionDecode { kv_len: 1 << 20, kv_cap: 1 << 20, heads: 2, kv_heads: 2, head_dim: 8, window: 0, scale: 0.1 };
        assert!(
            reason(&long, DType::F32, &sg_params(32, 1, 16), &GpuCaps { max_workgroups_per_dimension: 1024, ..caps })
                .contains("partial blocks")
        );
    }

    #[test]
    fn splitkv_sg_plan_clamps_heads_to_the_group() {
        let caps_min = |n: u32| GpuCaps {
            shader_f16: false,
            subgroup_min_size: n,
            subgroup_max_size: 64,
            timestamp_query: false,
            ..crate::testing::typical_gpu_caps()
        };
        // 6 heads per KV head, 8 asked: one workgroup of 6; 4 asked: two of 3
        let s =
            Shape::of(&Problem::AttentionDecode { kv_len: 300, kv_cap: 300, heads: 12, kv_heads: 2, head_dim: 64, window: 0, scale: 0.1 })
                .expect("attention");
        let p = SgPlan::of(&s, DType::F32, &caps_min(32), 128, 8, 64).expect("subgroups");
        assert_eq!((p.nsub, p.gh, p.wpl, p.spw, p.parts, p.workgroups_y()), (1, 6, 1, 4, 5, 2));
        let p = SgPlan::of(&s, DType::F16, &caps_min(4), 64, 4, 64).expect("subgroups");
        assert_eq!((p.nsub, p.gh, p.wpl, p.spw), (2, 3, 2, 16));
        assert!(SgPlan::of(&s, DType::F32, &caps_min(0), 64, 4, 64).is_none());
    }

    fn flash2_params(bq: u32, hpw: u32, bkv: u32, lanes: u32, tile: u32) -> Params {
        let k = crate::kernels::find("attention_prefill_flash2").expect("registered");
        let mut p = k.default_params();
        for (name, v) in [("block_q", bq), ("heads_per_wg", hpw), ("block_kv", bkv), ("lanes", lanes), ("kv_tile", tile)] {
            p.insert(name.into(), v);
        }
        p
    }

    /// Both flash2 forms over every lanes and K/V tile form (with four Q tile / head
    /// block / key tile combinations) their validity allows on the test adapter, at shapes of the models (head_dim 64 with a GQA group of 4,
    /// head_dim 256 with one KV head, Gemma 3's), a group of 6 (no multiple of
    /// heads_per_wg), a window and a prefill continuing a cache, in f32 and f16;
    /// and the subgroup form's defaults accept head_dim 256 (Gemma 3) in f16 on an
    /// adapter with 16 KiB of workgroup memory and subgroups of 8 or more.
    #[test]
    fn flash2_matches_reference_over_its_parameters() {
        let Some(gpu) = crate::testing::test_gpu() else { return };
        let probs = [
            Problem::AttentionPrefill {
                tokens: 19,
                kv_len: 19,
                kv_cap: 24,
                heads: 8,
                kv_heads: 2,
                head_dim: 64,
                window: 0,
                scale: 0.125,
                bidi_start: 0,
                bidi_end: 0,
            },
            Problem::AttentionPrefill {
                tokens: 13,
                kv_len: 40,
                kv_cap: 41,
                heads: 4,
                kv_heads: 1,
                head_dim: 256,
                window: 0,
                scale: 0.0625,
                bidi_start: 0,
                bidi_end: 0,
            },
            Problem::AttentionPrefill {
                tokens: 21,
                kv_len: 29,
                kv_cap: 32,
                heads: 12,
                kv_heads: 2,
                head_dim: 32,
                window: 9,
                scale: 0.18,
                bidi_start: 14,
                bidi_end: 25,
            },
        ];
        let mut ran = 0;
        for id in ["attention_prefill_flash2", "attention_prefill_flash2_sg"] {
            let k = crate::kernels::find(id).expect("registered");
            let rejects = k.check(Caps::Gpu(&gpu.caps), &probs[1], DType::F16, &k.default_params()).is_err();
            if rejects
                && id.ends_with("_sg")
                && gpu.caps.subgroups
                && gpu.caps.subgroup_min_size >= 8
                && gpu.caps.max_workgroup_storage >= 16384
            {
                panic!("{id} rejects head_dim 256 f16 at its defaults on {}", gpu.name);
            }
            for prob in &probs {
                for dtype in [DType::F32, DType::F16] {
                    // every lanes and K/V tile form, with Q tiles, head blocks and
                    // key tiles from smallest to largest
                    for (bq, hpw, bkv) in [(4, 1, 16), (8, 4, 32), (32, 2, 64), (16, 8, 16)] {
                        for lanes in [4, 8, 16] {
                            for tile in [0, 1, 2] {
                                let params = flash2_params(bq, hpw, bkv, lanes, tile);
                                if k.check(Caps::Gpu(&gpu.caps), prob, dtype, &params).is_err() {
                                    continue;
                                }
                                let c = check_one(&Runner::Gpu(&gpu), k, prob, dtype, &params, 3);
                                assert!(c.passed, "{id} {dtype} {params:?} on {}: rel err {:e} {:?}", c.problem, c.rel_err, c.error);
                                ran += 1;
                            }
                        }
                    }
                }
            }
        }
        assert!(ran >= 60, "only {ran} checks ran");
    }

    #[test]
    fn flash2_validity_gives_reasons() {
        let k = crate::kernels::find("attention_prefill_flash2_sg").expect("registered");
        let tree = crate::kernels::find("attention_prefill_flash2").expect("registered");
        let caps = crate::testing::typical_gpu_caps();
        let reason = |k: &KernelDef, p: &Problem, d: DType, params: &Params, c: &GpuCaps| k.check(Caps::Gpu(c), p, d, params).unwrap_err();
        let gemma = Problem::AttentionPrefill {
            tokens: 128,
            kv_len: 128,
            kv_cap: 128,
            heads: 4,
            kv_heads: 1,
            head_dim: 256,
            window: 0,
            scale: 0.0625,
            bidi_start: 0,
            bidi_end: 0,
        };
        assert!(k.check(Caps::Gpu(&caps), &gemma, DType::F16, &flash2_params(8, 4, 32, 8, 1)).is_ok());
        // 64 f32 words per row over 4 lanes is 16 per lane
        assert!(reason(k, &gemma, DType::F32, &flash2_params(8, 4, 32, 4, 0), &caps).contains("raise lanes"));
        // the staged f16 tile of 32 keys is 32 * 32 * 16 bytes, 32 * 33 * 16 padded
        assert!(reason(k, &gemma, DType::F16, &flash2_params(8, 4, 32, 8, 2), &caps).contains("workgroup memory"));
        // the staged f32 tile of 64 keys is 64 * 64 * 16 bytes; straight reads need none
        assert!(reason(k, &gemma, DType::F32, &flash2_params(4, 4, 64, 16, 1), &caps).contains("workgroup memory"));
        let wide = GpuCaps { subgroup_min_size: 16, ..caps.clone() };
        assert!(k.check(Caps::Gpu(&wide), &gemma, DType::F32, &flash2_params(4, 4, 64, 16, 0)).is_ok());
        // the tree form's reduce buffers count too
        assert!(
            reason(tree, &gemma, DType::F16, &flash2_params(16, 1, 16, 16, 0), &GpuCaps { max_workgroup_storage: 8192, ..caps.clone() })
                .contains("workgroup memory")
        );
        // more invocations than a workgroup may have
        assert!(reason(k, &gemma, DType::F16, &flash2_params(32, 4, 32, 8, 1), &caps).contains("invocations"));
        // no subgroups; rows wider than the adapter's smallest subgroup
        assert!(
            reason(k, &gemma, DType::F16, &flash2_params(8, 4, 32, 8, 1), &GpuCaps { subgroups: false, ..caps.clone() })
                .contains("subgroup")
        );
        assert!(
            tree.check(Caps::Gpu(&GpuCaps { subgroups: false, ..caps.clone() }), &gemma, DType::F16, &flash2_params(4, 4, 32, 4, 0))
                .is_ok()
        );
        assert!(
            reason(k, &gemma, DType::F16, &flash2_params(4, 4, 32, 16, 1), &GpuCaps { subgroup_min_size: 8, ..caps.clone() })
                .contains("smallest is 8")
        );
        // head_dim not whole 16-byte words
        let odd = Problem::AttentionPrefill {
            tokens: 4,
            kv_len: 4,
            kv_cap: 8,
            heads: 2,
            kv_heads: 2,
            head_dim: 12,
            window: 0,
            scale: 1.0,
            bidi_start: 0,
            bidi_end: 0,
        };
        assert!(reason(tree, &odd, DType::F16, &flash2_params(8, 4, 32, 8, 1), &caps).contains("multiple of 8"));
    }

    /// heads_per_wg is clamped to the group; a group it does not divide takes
    /// ceil(group / heads_per_wg) workgroups per KV head.
    #[test]
    fn flash2_plan_covers_the_group() {
        let llama = Shape::of(&Problem::AttentionPrefill {
            tokens: 128,
            kv_len: 128,
            kv_cap: 128,
            heads: 32,
            kv_heads: 8,
            head_dim: 64,
            window: 0,
            scale: 0.125,
            bidi_start: 0,
            bidi_end: 0,
        })
        .expect("attention");
        let p = Flash2Plan::of(&llama, DType::F16, &flash2_params(8, 8, 32, 4, 1)).expect("params");
        assert_eq!((p.gh, p.nsub, p.rw, p.nw, p.grid(&llama)), (4, 1, 8, 2, [16, 8, 1]));
        let six = Shape { heads: 12, kv_heads: 2, ..llama };
        let p = Flash2Plan::of(&six, DType::F32, &flash2_params(16, 4, 32, 16, 0)).expect("params");
        assert_eq!((p.gh, p.nsub, p.rw, p.nw, p.grid(&six), p.tile_bytes()), (4, 2, 16, 1, [8, 4, 1], 0));
        let p = Flash2Plan::of(&six, DType::F32, &flash2_params(16, 4, 32, 16, 2)).expect("params");
        assert_eq!((p.tile_words(), p.tile_bytes()), (32 * 17, 16 * 32 * 17));
    }

    #[test]
    fn invalid_shapes_are_rejected_with_reasons() {
        let bad = Problem::AttentionDecode { kv_len: 10, kv_cap: 8, heads: 4, kv_heads: 2, head_dim: 8, window: 0, scale: 1.0 };
        assert!(Shape::checked(&bad).unwrap_err().contains("kv_cap"));
        let bad = Problem::AttentionDecode { kv_len: 4, kv_cap: 8, heads: 6, kv_heads: 4, head_dim: 8, window: 0, scale: 1.0 };
        assert!(Shape::checked(&bad).unwrap_err().contains("multiple"));
        let odd = Problem::AttentionDecode { kv_len: 4, kv_cap: 8, heads: 2, kv_heads: 2, head_dim: 12, window: 0, scale: 1.0 };
        assert!(check_wgsl_shape(&odd, DType::F32).is_ok());
        assert!(check_wgsl_shape(&odd, DType::F16).unwrap_err().contains("multiple of 8"));
    }
}
