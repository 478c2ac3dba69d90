//! The RoPE family: rotary position embedding (`rope`): rotate-half (Hugging Face) and interleaved
//! (GPT-J / GGUF) pair layouts, partial rotary (`rot_dim < head_dim`, the rest
//! copied), and [`inv_freq`], the inverse frequencies (with llama3 scaling) the
//! runtime uploads; the fused per-head RMSNorm + RoPE is in [`qk_norm`], the decode token's fused
//! split-QKV + RoPE (+ q/k norm) + KV-cache write in [`qkv_cache`].
//!
//! WGSL: `rope_pair` (one invocation per pair, each forming its own angle) and
//! `rope_shared` (one workgroup per token and group of heads, cos/sin computed once
//! per frequency into workgroup memory and reused across the heads). Both reduce
//! the angle exactly before the hardware cos/sin, so far positions stay accurate.
//! CPU: one SIMD rotation microkernel (AVX-512 / AVX2 / portable; rotate-half as
//! two contiguous streams, interleaved with an in-register pair swap) under two
//! orchestrators: `rope_table_cpu` builds a `[tokens, rot]` cos/sin table in a first
//! parallel phase, then rotates rows in parallel (prefill); `rope_token_cpu` fuses
//! both per task, each task computing its token's cos/sin and rotating a group of
//! heads (decode: the heads of one token split over threads).

pub mod qk_norm;
pub mod qkv_cache;

use super::contract::{CpuArgs, CpuImpl, KernelDef, KernelError, ParamSpec, Params, WgslImpl, WgslSetup, param, wrong_op};
use super::cpu::{self, ISA, Isa, Lanes, check_isa, isa_dispatch};
use super::problem::{Op, Problem, RopeLayout};
use super::quant::DType;
use super::reference::{self, Llama3Scaling};
use super::wgsl::grid_fits;
use crate::device::{CpuCaps, GpuCaps};
use crate::gpu::{GpuProgram, Shader, grid_2d, groups};
use crate::shader;

static ROPE_PAIR: Shader = shader!("rope_pair.wgsl", "rope.wgsl", "rotary.wgsl", "position.wgsl");
static ROPE_SHARED: Shader = shader!("rope_shared.wgsl", "rope.wgsl", "rotary.wgsl", "position.wgsl");

/// No weight buffer (x and inv_freq are f32 activations): only f32 is listed.
const F32_ONLY: &[DType] = &[DType::F32];

/// Positions the WGSL angle reduction keeps exact (see `shaders/rope_pair.wgsl`).
pub const WGSL_MAX_POSITION: usize = 500_000;

/// Inverse frequencies `theta^(-2i/rot_dim)`, `i < rot_dim/2`, with llama3 scaling
/// applied as transformers' `_compute_llama3_parameters` does: the buffer every
/// RoPE kernel reads as `inv_freq`.
pub fn inv_freq(theta: f64, rot_dim: usize, scaling: Option<Llama3Scaling>) -> Vec<f32> {
    reference::rope_inv_freq(theta, rot_dim, scaling)
}

const PAIR_PARAMS: &[ParamSpec] =
    &[ParamSpec { name: "workgroup_size", values: &[64, 128, 256, 512], default: 128, help: "invocations (pairs) per workgroup" }];

const SHARED_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "workgroup_size", values: &[32, 64, 128, 256], default: 64, help: "invocations per workgroup" },
    ParamSpec::new("heads_per_wg", &[1, 2, 4, 8, 16, 32], 4, "heads of one token per workgroup, sharing its cos/sin table"),
];

const TABLE_CPU_PARAMS: &[ParamSpec] =
    &[ParamSpec { name: "rows_per_task", values: &[1, 2, 4, 8, 16, 32, 64], default: 8, help: "(token, head) rows per pool task" }, ISA];

const TOKEN_CPU_PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "heads_per_task",
        values: &[1, 2, 4, 8, 16, 32, 64],
        default: 8,
        help: "heads of one token per pool task; each task computes that token's cos/sin",
    },
    ISA,
];

pub fn variants() -> Vec<KernelDef> {
    vec![
        KernelDef::new(
            "rope_pair",
            Op::Rope,
            F32_ONLY,
            PAIR_PARAMS,
            "one invocation per rotary pair (or copied dim), each with its own exactly-reduced angle",
            WgslImpl::new(&ROPE_PAIR, prepare_pair).check(check_pair),
        ),
        KernelDef::new(
            "rope_shared",
            Op::Rope,
            F32_ONLY,
            SHARED_PARAMS,
            "one workgroup per (token, heads_per_wg heads): cos/sin once per frequency in workgroup memory, reused across heads",
            WgslImpl::new(&ROPE_SHARED, prepare_shared).shared(shared_table).check(check_shared),
        ),
        KernelDef::new(
            "rope_table_cpu",
            Op::Rope,
            F32_ONLY,
            TABLE_CPU_PARAMS,
            "cos/sin table for all tokens built in parallel first, then SIMD rotation of (token, head) rows in parallel (prefill)",
            CpuImpl { run: run_table, check: check_cpu },
        ),
        KernelDef::new(
            "rope_token_cpu",
            Op::Rope,
            F32_ONLY,
            TOKEN_CPU_PARAMS,
            "fused: each task computes its token's cos/sin then SIMD-rotates heads_per_task heads (decode splits heads)",
            CpuImpl { run: run_token, check: check_cpu },
        ),
    ]
}

// ---------------------------------------------------------------------------------
// Validity
// ---------------------------------------------------------------------------------

/// Shape rules every RoPE kernel shares: the rotated dims fit in the head.
fn check_shape(prob: &Problem) -> Result<(), String> {
    match *prob {
        Problem::Rope { head_dim, rot_dim, .. } if rot_dim / 2 * 2 > head_dim => {
            Err(format!("rot_dim = {rot_dim} exceeds head_dim = {head_dim}"))
        }
        _ => Ok(()),
    }
}

fn check_cpu(caps: &CpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    check_shape(prob)?;
    check_isa(caps, prob, dtype, params)
}

/// WGSL rules: shape, positions within the exact angle reduction, u32 indices.
fn check_wgsl(prob: &Problem) -> Result<(), String> {
    check_shape(prob)?;
    if let Problem::Rope { tokens, heads, head_dim, pos0, .. } = *prob {
        if pos0 + tokens > WGSL_MAX_POSITION {
            return Err(format!(
                "positions up to {} exceed {WGSL_MAX_POSITION}, where the f32 angle reduction stops being exact",
                pos0 + tokens
            ));
        }
        if tokens * heads * head_dim > u32::MAX as usize {
            return Err("more than 2^32 elements: indices are u32".into());
        }
    }
    Ok(())
}

fn check_pair(caps: &GpuCaps, prob: &Problem, _: DType, params: &Params) -> Result<(), String> {
    check_wgsl(prob)?;
    let (n, _) = pair_slots(prob);
    grid_fits(caps, groups(n, param(params, "workgroup_size")?) as usize, "one per workgroup_size pairs")
}

fn check_shared(caps: &GpuCaps, prob: &Problem, _: DType, params: &Params) -> Result<(), String> {
    check_wgsl(prob)?;
    if let Problem::Rope { tokens, heads, .. } = *prob {
        grid_fits(caps, tokens * heads.div_ceil(param(params, "heads_per_wg")? as usize), "one per token and heads_per_wg heads")?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// WGSL
// ---------------------------------------------------------------------------------

/// Capacity of the cos/sin table of `rope_shared`: rot/2 rounded up to a power of
/// two, so few pipelines cover every model.
fn half_cap(prob: &Problem) -> usize {
    match *prob {
        Problem::Rope { rot_dim, .. } => (rot_dim / 2).max(1).next_power_of_two(),
        _ => 1,
    }
}

fn shared_table(prob: &Problem, _: DType, _: &Params) -> Result<u64, KernelError> {
    Ok(8 * half_cap(prob) as u64)
}

/// Invocations of `rope_pair` (pairs plus copied dims, over all heads) and rot/2.
fn pair_slots(prob: &Problem) -> (usize, usize) {
    match *prob {
        Problem::Rope { tokens, heads, head_dim, rot_dim, .. } => (tokens * heads * head_dim.saturating_sub(rot_dim / 2), rot_dim / 2),
        _ => (0, 0),
    }
}

fn uniform(s: &WgslSetup<'_>) -> Result<Vec<u32>, KernelError> {
    match *s.problem {
        Problem::Rope { tokens, heads, head_dim, rot_dim, pos0, layout } => {
            Ok(vec![tokens as u32, heads as u32, head_dim as u32, (rot_dim / 2) as u32, pos0 as u32, layout.code()])
        }
        _ => Err(wrong_op(s.kernel, s.problem)),
    }
}

fn prepare_pair(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let u = uniform(s)?;
    let wg = s.param("workgroup_size")?;
    let (n, _) = pair_slots(s.problem);
    s.one_step("main", &[("WG", wg as f64)], &u, grid_2d(groups(n, wg)))
}

fn prepare_shared(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let u = uniform(s)?;
    let Problem::Rope { tokens, heads, .. } = *s.problem else { return Err(wrong_op(s.kernel, s.problem)) };
    let (wg, per) = (s.param("workgroup_size")?, s.param("heads_per_wg")?);
    let consts = [("WG", wg as f64), ("HEADS", per as f64), ("HALF_CAP", half_cap(s.problem) as f64)];
    s.one_step("main", &consts, &u, grid_2d((tokens * heads.div_ceil(per as usize)) as u32))
}

// ---------------------------------------------------------------------------------
// CPU
// ---------------------------------------------------------------------------------

/// Geometry of one RoPE call.
#[derive(Clone, Copy, Debug)]
struct Geom {
    heads: usize,
    head_dim: usize,
    half: usize,
    layout: RopeLayout,
}

impl Geom {
    /// Floats of one token's cos/sin table: `[cos(half) | sin(half)]` for rotate-half,
    /// `[cos per lane (rot) | ∓sin per lane (rot)]` for interleaved.
    fn table_len(self) -> usize {
        match self.layout {
            RopeLayout::Half => 2 * self.half,
            RopeLayout::Interleaved => 4 * self.half,
        }
    }
}

/// Fills one token's cos/sin table. The angle `pos * f` is formed and reduced in
/// f64 (exact for any position), then rounded to f32.
fn fill_table(g: Geom, pos: usize, inv_freq: &[f32], t: &mut [f32]) {
    let half = g.half;
    for (i, f) in inv_freq[..half].iter().enumerate() {
        let (s, c) = (pos as f64 * *f as f64).sin_cos();
        let (s, c) = (s as f32, c as f32);
        match g.layout {
            RopeLayout::Half => {
                t[i] = c;
                t[half + i] = s;
            }
            RopeLayout::Interleaved => {
                t[2 * i] = c;
                t[2 * i + 1] = c;
                t[2 * half + 2 * i] = -s;
                t[2 * half + 2 * i + 1] = s;
            }
        }
    }
}

/// Tables a thread keeps ([`with_table`]): per frequency family (the
/// `inv_freq` buffer's values, the layout and the pairs), recent positions'.
struct TableCache {
    families: Vec<Family>,
}

/// One family's tables, direct-mapped: position `p` in slot `p % slots`
/// (`tags[slot]` the position it holds, `usize::MAX` none), all the storage
/// taken when the family is first met, so a decode step allocates nothing.
struct Family {
    freq: Vec<f32>,
    layout: RopeLayout,
    half: usize,
    tags: Vec<usize>,
    tables: Vec<f32>,
}

/// Frequency families a thread keeps (Gemma 3's local and global layers: two).
const CACHED_FAMILIES: usize = 4;
/// Floats of a family's tables a thread keeps (1 MiB for all its families):
/// 1024 positions at head_dim 64, 128 at 256 interleaved.
const CACHED_FLOATS: usize = (1 << 18) / CACHED_FAMILIES;

thread_local! {
    static TABLES: std::cell::RefCell<TableCache> = const { std::cell::RefCell::new(TableCache { families: Vec::new() }) };
}

/// The table of `pos` computed now ([`fill_table`]), in scratch.
fn fresh_table(g: Geom, pos: usize, inv_freq: &[f32]) -> cpu::Scratch {
    let mut table = cpu::Scratch::zeroed(g.table_len());
    fill_table(g, pos, inv_freq, &mut table);
    table
}

/// Whether two frequency lists hold the same values bit for bit (so -0.0 and
/// 0.0, whose sines differ in sign, are two families).
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// `f` with the table of `pos` ([`fill_table`]'s values, bit for bit), computed
/// once on this thread and kept while its slot is not taken by another
/// position: every layer's q and k of a decode token rotate by the same
/// angles, so a decode step computes each position's sines once a thread
/// rather than twice a layer.
fn with_table<R>(g: Geom, pos: usize, inv_freq: &[f32], f: impl FnOnce(&[f32]) -> R) -> R {
    let (freq, tl) = (&inv_freq[..g.half], g.table_len());
    TABLES.with(|cell| {
        let Ok(mut cache) = cell.try_borrow_mut() else { return f(&fresh_table(g, pos, inv_freq)) };
        let at = match cache.families.iter().position(|fam| fam.layout == g.layout && fam.half == g.half && same_bits(&fam.freq, freq)) {
            Some(i) => i,
            None => {
                if cache.families.len() >= CACHED_FAMILIES {
                    cache.families.remove(0);
                }
                let slots = (CACHED_FLOATS / tl.max(1)).max(1);
                let (tags, tables) = (vec![usize::MAX; slots], vec![0.0; slots * tl]);
                cache.families.push(Family { freq: freq.to_vec(), layout: g.layout, half: g.half, tags, tables });
                cache.families.len() - 1
            }
        };
        let fam = &mut cache.families[at];
        let slot = pos % fam.tags.len();
        let table = &mut fam.tables[slot * tl..(slot + 1) * tl];
        if fam.tags[slot] != pos {
            fill_table(g, pos, inv_freq, table);
            fam.tags[slot] = pos;
        }
        f(table)
    })
}

/// Rotates one head `x` into `y` with its token's table `t`; copies dims past rot.
#[inline(always)]
fn rotate_head_k<L: Lanes>(l: L, g: Geom, x: &[f32], t: &[f32], y: &mut [f32]) {
    let (half, rot) = (g.half, 2 * g.half);
    let (x, y) = (&x[..g.head_dim], &mut y[..g.head_dim]);
    match g.layout {
        RopeLayout::Half => {
            // y0 = x0 c - x1 s, y1 = x1 c + x0 s over two contiguous halves
            let (c, s) = t[..rot].split_at(half);
            let (x0, x1) = x[..rot].split_at(half);
            let (y0, y1) = y[..rot].split_at_mut(half);
            let mut i = 0;
            while i + L::N <= half {
                let (a, b) = (l.load(&x0[i..]), l.load(&x1[i..]));
                let (cv, sv) = (l.load(&c[i..]), l.load(&s[i..]));
                l.store(&mut y0[i..], l.sub(l.mul(a, cv), l.mul(b, sv)));
                l.store(&mut y1[i..], l.fma(a, sv, l.mul(b, cv)));
                i += L::N;
            }
            for j in i..half {
                y0[j] = x0[j] * c[j] - x1[j] * s[j];
                y1[j] = x1[j] * c[j] + x0[j] * s[j];
            }
        }
        RopeLayout::Interleaved => {
            // y = x * cos + swap_pairs(x) * (-sin, +sin): one stream, pairs in register
            let (c, s) = t[..2 * rot].split_at(rot);
            let mut i = 0;
            while i + L::N <= rot {
                let v = l.load(&x[i..]);
                let r = l.fma(l.swap_pairs(v), l.load(&s[i..]), l.mul(v, l.load(&c[i..])));
                l.store(&mut y[i..], r);
                i += L::N;
            }
            while i < rot {
                y[i] = x[i] * c[i] + x[i + 1] * s[i];
                y[i + 1] = x[i + 1] * c[i + 1] + x[i] * s[i + 1];
                i += 2;
            }
        }
    }
    y[rot..].copy_from_slice(&x[rot..]);
}

/// Rotates consecutive (token, head) rows `first ..` of `x` into `y`; `table(token)`
/// gives each row's table.
#[inline(always)]
fn rotate_rows_k<'t, L: Lanes>(l: L, g: Geom, x: &[f32], first: usize, table: impl Fn(usize) -> &'t [f32], y: &mut [f32]) {
    for (r, yr) in y.chunks_exact_mut(g.head_dim).enumerate() {
        let row = first + r;
        rotate_head_k(l, g, &x[row * g.head_dim..], table(row / g.heads), yr);
    }
}

/// Rows `first ..` with a table covering every token (`tables[token * table_len ..]`).
fn rotate_rows(isa: Isa, g: Geom, x: &[f32], first: usize, tables: &[f32], y: &mut [f32]) {
    isa_dispatch!(isa, |l| (g: Geom = g, x: &[f32] = x, first: usize = first, tables: &[f32] = tables, y: &mut [f32] = y) -> () {
        let tl = g.table_len();
        rotate_rows_k(l, g, x, first, |t| &tables[t * tl..], y)
    })
}

/// Rows `first ..` all of one token, with that token's table.
fn rotate_token_rows(isa: Isa, g: Geom, x: &[f32], first: usize, table: &[f32], y: &mut [f32]) {
    isa_dispatch!(isa, |l| (g: Geom = g, x: &[f32] = x, first: usize = first, table: &[f32] = table, y: &mut [f32] = y) -> () {
        rotate_rows_k(l, g, x, first, |_| table, y)
    })
}

fn geom(prob: &Problem) -> Option<(usize, usize, Geom)> {
    match *prob {
        Problem::Rope { tokens, heads, head_dim, rot_dim, pos0, layout } if head_dim > 0 && heads > 0 => {
            Some((tokens, pos0, Geom { heads, head_dim, half: rot_dim / 2, layout }))
        }
        _ => None,
    }
}

/// Tokens up to which [`run_table`] rotates with the kept tables ([`with_table`])
/// on the calling thread; a prompt's computes its tables on the pool.
const CACHED_TOKENS: usize = 4;

fn run_table(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Some((tokens, pos0, g)) = geom(prob) else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let per = (param(params, "rows_per_task")? as usize).max(1);
    let (x, inv_freq) = (a.ins[0].f32(), a.ins[1].f32());
    let tl = g.table_len();
    let d = g.head_dim;
    if tokens <= CACHED_TOKENS {
        // A few tokens (a decode token, a batch pass's sequence): their kept tables.
        let out = &mut a.outs[0][..tokens * g.heads * d];
        for (t, y) in out.chunks_mut(g.heads * d).enumerate() {
            with_table(g, pos0 + t, inv_freq, |table| rotate_token_rows(isa, g, x, t * g.heads, table, y));
        }
        return Ok(());
    }
    let mut tables = cpu::Scratch::zeroed(tokens * tl);
    if tl > 0 {
        cpu::pool::for_chunks_mut(&mut tables, tl, |t, tab| fill_table(g, pos0 + t, inv_freq, tab));
    }
    cpu::pool::for_chunks_mut(&mut a.outs[0][..tokens * g.heads * d], per * d, |i, y| rotate_rows(isa, g, x, i * per, &tables, y));
    Ok(())
}

fn run_token(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Some((tokens, pos0, g)) = geom(prob) else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let per = (param(params, "heads_per_task")? as usize).max(1).min(g.heads);
    let (x, inv_freq) = (a.ins[0].f32(), a.ins[1].f32());
    let d = g.head_dim;
    let out = &mut a.outs[0][..tokens * g.heads * d];
    if tokens == 1 {
        // A decode token: the calling thread's kept table for every task (a
        // worker's cache would allocate the first time that worker met the
        // family, whichever step that is).
        with_table(g, pos0, inv_freq, |table| {
            cpu::pool::for_row_chunks_mut(out, g.heads * d, per * d, |_, c, y| rotate_token_rows(isa, g, x, c * per, table, y))
        });
        return Ok(());
    }
    cpu::pool::for_row_chunks_mut(out, g.heads * d, per * d, |t, c, y| {
        rotate_token_rows(isa, g, x, t * g.heads + c * per, &fresh_table(g, pos0 + t, inv_freq), y)
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// transformers' `_compute_llama3_parameters` for Llama 3.1 (theta 500000,
    /// head_dim 128, factor 32, low 1, high 4, original context 8192), evaluated in
    /// f64: high frequencies (i <= 28) unchanged, the band 29..=34 blended, the rest
    /// divided by 32.
    #[test]
    fn llama3_inv_freq_matches_transformers_values() {
        let s = Llama3Scaling { factor: 32.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 8192.0 };
        let f = inv_freq(500000.0, 128, Some(s));
        assert_eq!(f.len(), 64);
        let known: [(usize, f64); 8] = [
            (0, 1.0),
            (1, 0.8146172338565447),
            (28, 0.0032114459947525913),
            (29, 0.002118406996779608),
            (32, 0.00042955679655936815),
            (34, 9.70828780262767e-05),
            (35, 2.3890530884911708e-05),
            (63, 7.672314972286278e-08),
        ];
        for (i, want) in known {
            assert!((f[i] as f64 - want).abs() <= 1e-6 * want, "inv_freq[{i}] = {}, transformers gives {want}", f[i]);
        }
        let plain = inv_freq(500000.0, 128, None);
        assert!((0..=28).all(|i| f[i] == plain[i]));
        assert!((35..64).all(|i| (f[i] as f64 - plain[i] as f64 / 32.0).abs() <= 1e-6 * f[i] as f64));
        // without scaling: theta^(-2i/d)
        assert!((plain[32] as f64 - 500000f64.powf(-0.5)).abs() < 1e-9);
    }

    /// A kept table is [`fill_table`]'s, bit for bit, whichever families and
    /// positions came before it: two frequency lists that differ only in a
    /// zero's sign, both layouts, more families than are kept, more positions
    /// than a family keeps.
    #[test]
    fn kept_tables_are_the_computed_ones() {
        let a = inv_freq(10000.0, 64, None);
        let mut b = a.clone();
        b[31] = 0.0;
        let mut c = b.clone();
        c[31] = -0.0;
        let bits = |t: &[f32]| t.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let mut families: Vec<(Vec<f32>, RopeLayout)> = Vec::new();
        for f in [&a, &b, &c] {
            for layout in [RopeLayout::Half, RopeLayout::Interleaved] {
                families.push((f.clone(), layout));
            }
        }
        for round in 0..2 {
            for (fi, (f, layout)) in families.iter().enumerate() {
                let g = Geom { heads: 1, head_dim: 64, half: 32, layout: *layout };
                let kept = CACHED_FLOATS / g.table_len();
                let positions: Vec<usize> = if fi == 0 && round == 0 { (0..kept + 3).collect() } else { vec![0, 7, 70_000] };
                for pos in positions {
                    let mut fresh = vec![0.0; g.table_len()];
                    fill_table(g, pos, f, &mut fresh);
                    let kept = with_table(g, pos, f, |t| t.to_vec());
                    assert_eq!(bits(&kept), bits(&fresh), "family {fi} position {pos} round {round}");
                }
            }
        }
    }

    #[test]
    fn rotation_microkernel_matches_scalar_rotation_on_every_isa() {
        for layout in [RopeLayout::Half, RopeLayout::Interleaved] {
            for (d, rot) in [(8, 8), (64, 64), (96, 32), (80, 72), (6, 2)] {
                let g = Geom { heads: 1, head_dim: d, half: rot / 2, layout };
                let freqs = inv_freq(10000.0, rot, None);
                let x: Vec<f32> = (0..d).map(|i| (i as f32 * 0.37).sin()).collect();
                let pos = 1234;
                let mut want = x.clone();
                for (i, f) in freqs.iter().enumerate() {
                    let (s, c) = (pos as f64 * *f as f64).sin_cos();
                    let (a, b) = if layout == RopeLayout::Half { (i, i + rot / 2) } else { (2 * i, 2 * i + 1) };
                    want[a] = (x[a] as f64 * c - x[b] as f64 * s) as f32;
                    want[b] = (x[b] as f64 * c + x[a] as f64 * s) as f32;
                }
                let mut table = cpu::Scratch::zeroed(g.table_len());
                fill_table(g, pos, &freqs, &mut table);
                for isa in [Isa::Scalar, Isa::from_param(2), Isa::best()] {
                    let mut y = vec![f32::NAN; d];
                    rotate_token_rows(isa, g, &x, 0, &table, &mut y);
                    for i in 0..d {
                        assert!((y[i] - want[i]).abs() < 1e-6, "{isa:?} {layout:?} d={d} rot={rot} i={i}: {} vs {}", y[i], want[i]);
                    }
                }
            }
        }
    }
}
