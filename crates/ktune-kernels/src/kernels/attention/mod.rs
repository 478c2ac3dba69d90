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
//! Paged batch (`attention_paged`: decode tokens and prefill chunks of many
//! sequences in one call, each sequence's keys and values in blocks of `page`
//! positions of one pool, found through its table): `attention_paged_stream`
//! (WGSL, one workgroup per query row and head, the decode stream's row body
//! through the table), `attention_paged_rows` (WGSL, one invocation per query row
//! and head), `attention_paged_cpu` (the tiled prefill's key tiles per sequence,
//! query block and KV head; a decode token a task per KV head, its query heads
//! a block of rows at a time) and `attention_paged_rows_cpu` (the per-row online
//! softmax over (query row, head) pairs).
//! The CPU kernels use the SIMD dot products and the f32/f16 `axpy_row` of
//! [`super::cpu`]; every variant takes f32 or f16 caches.
//!
//! Here: the registry (shaders, parameters, [`variants`]) and the dispatch step both
//! WGSL sides build (`step_with`). `shape.rs`: the call's shape and the validity
//! rules the kernels share; `wgsl_prefill.rs`, `wgsl_decode.rs`, `wgsl_paged.rs`:
//! the WGSL kernels' setup; `mma.rs`: prefill on matrix units; `cpu_kernels.rs`: the CPU kernels.

mod cpu_kernels;
mod mma;
mod shape;
mod wgsl_decode;
mod wgsl_paged;
mod wgsl_prefill;

pub use shape::kv_scales_word;

use std::sync::Arc;

use super::contract::{CpuImpl, KernelDef, KernelError, ParamSpec, WgslImpl, WgslSetup};
use super::cpu::ISA;
use super::problem::Op;
use super::quant::DType;
use super::wgsl::shared_wg;
use crate::gpu::{GpuStep, Shader};
use crate::shader;
use cpu_kernels::{
    check_cpu, check_paged_cpu, run_decode_heads, run_decode_splitkv, run_paged, run_paged_rows, run_prefill_rows, run_prefill_tiled,
};
use shape::{Shape, check_grid, check_wgsl_shape, flash_wg_size, shape_or_invalid};
use wgsl_decode::{
    check_splitkv, check_splitkv_sg, check_stream, prepare_splitkv, prepare_splitkv_sg, prepare_stream, shared_splitkv, shared_stream,
};
use wgsl_paged::{check_paged_rows, check_paged_stream, prepare_paged_rows, prepare_paged_stream, shared_paged_stream};
use wgsl_prefill::{
    check_flash, check_flash2, check_flash2_sg, check_naive, flash2_wg_size, prepare_flash, prepare_flash2, prepare_naive, shared_flash,
    shared_flash2, shared_flash2_sg,
};

static PREFILL_NAIVE: Shader =
    shader!(head "attention_dims.wgsl"; "attention_prefill_naive.wgsl", "attention.wgsl", "reduce_wg.wgsl", "wload.wgsl");
static PREFILL_FLASH: Shader = shader!(head "attention_dims.wgsl"; "attention_prefill_flash.wgsl", "attention.wgsl", "wload.wgsl");
static PREFILL_FLASH2: Shader =
    shader!(head "attention_dims.wgsl"; "flash2.wgsl", "attention_prefill_flash2.wgsl", "attention.wgsl", "wload.wgsl");
static PREFILL_FLASH2_SG: Shader =
    shader!(head "attention_dims.wgsl"; "flash2.wgsl", "attention_prefill_flash2_sg.wgsl", "attention.wgsl", "wload.wgsl");
static DECODE_STREAM: Shader = shader!(head "attention_decode_head.wgsl", "attention_dims.wgsl"; "attention_decode_stream.wgsl", "attention_stream.wgsl", "attention.wgsl", "reduce_wg.wgsl", "wload.wgsl", "position.wgsl");
static PAGED_STREAM: Shader = shader!(head "attention_decode_head.wgsl", "attention_dims.wgsl"; "attention_paged_stream.wgsl", "attention_paged.wgsl", "attention_stream.wgsl", "attention.wgsl", "grid.wgsl", "reduce_wg.wgsl", "wload.wgsl");
static PAGED_ROWS: Shader =
    shader!(head "attention_dims.wgsl"; "attention_paged_rows.wgsl", "attention_paged.wgsl", "attention.wgsl", "wload.wgsl");
static DECODE_SPLITKV: Shader = shader!(head "attention_decode_head.wgsl", "attention_dims.wgsl"; "attention_decode_splitkv.wgsl", "attention.wgsl", "wload.wgsl", "position.wgsl");
static DECODE_SPLITKV_SG: Shader = shader!(head "attention_decode_head.wgsl", "attention_dims.wgsl"; "attention_decode_splitkv_sg.wgsl", "attention.wgsl", "wload.wgsl", "position.wgsl");

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

const PAGED_STREAM_PARAMS: &[ParamSpec] = &[
    ParamSpec::new("workgroup_size", &[64, 128, 256], 64, "invocations per workgroup (one workgroup per query row and head)"),
    ParamSpec::new("keys_per_thread", &[1, 2, 4, 8], 2, "keys each invocation scores per tile (tile = workgroup_size * keys_per_thread)"),
];

const PAGED_ROWS_PARAMS: &[ParamSpec] =
    &[ParamSpec::new("workgroup_size", &[32, 64, 128, 256], 64, "query rows (and heads) per workgroup, one an invocation")];

const PAGED_CPU_PARAMS: &[ParamSpec] = &[
    ParamSpec::new("block_q", &[1, 4, 8, 16, 32], 8, "a sequence's queries per pool task (times the GQA group's heads)"),
    ParamSpec::new("block_kv", &[16, 32, 64, 128, 256], 64, "keys per tile (score rows materialised per tile, read block by block)"),
    ISA,
];

const PAGED_ROWS_CPU_PARAMS: &[ParamSpec] =
    &[ParamSpec { name: "rows_per_task", values: &[1, 2, 4, 8, 16], default: 4, help: "(query row, head) pairs per pool task" }, ISA];

const DECODE_HEADS_PARAMS: &[ParamSpec] =
    &[ParamSpec::new("keys_per_call", &[1, 4], 4, "K rows per dot-product microkernel call (4: dot4 shares each q load)"), ISA];

const DECODE_SPLIT_PARAMS: &[ParamSpec] =
    &[ParamSpec::new("chunk", &[64, 128, 256, 512, 1024, 2048], 256, "keys per split task (tasks = kv_heads * visible keys / chunk)"), ISA];

pub fn variants() -> Vec<KernelDef> {
    let mut v = vec![
        KernelDef::new(
            "attention_prefill_naive",
            Op::AttentionPrefill,
            cpu_kernels::KV_TYPES,
            NAIVE_PARAMS,
            "scores materialised in a scratch buffer; three dispatches: QKᵀ, row softmax, P·V",
            WgslImpl::new(&PREFILL_NAIVE, prepare_naive).shared(shared_wg).check(check_naive),
        ),
        KernelDef::new(
            "attention_prefill_flash",
            Op::AttentionPrefill,
            cpu_kernels::KV_TYPES,
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
            cpu_kernels::KV_TYPES,
            PREFILL_ROWS_PARAMS,
            "pool over (token, head) rows; per-key online softmax, SIMD dot and axpy",
            CpuImpl { run: run_prefill_rows, check: check_cpu },
        ),
        KernelDef::new(
            "attention_prefill_tiled_cpu",
            Op::AttentionPrefill,
            cpu_kernels::KV_TYPES,
            PREFILL_TILED_PARAMS,
            "pool over (token block, KV head); key tiles with materialised score rows (dot4), K/V tile shared by the GQA group",
            CpuImpl { run: run_prefill_tiled, check: check_cpu },
        ),
        KernelDef::new(
            "attention_paged_stream",
            Op::AttentionPaged,
            cpu_kernels::KV_TYPES,
            PAGED_STREAM_PARAMS,
            "one workgroup per query row and head of the batch streaming its sequence's keys block by block (the decode stream's row)",
            WgslImpl::new(&PAGED_STREAM, prepare_paged_stream).shared(shared_paged_stream).check(check_paged_stream),
        ),
        KernelDef::new(
            "attention_paged_rows",
            Op::AttentionPaged,
            cpu_kernels::KV_TYPES,
            PAGED_ROWS_PARAMS,
            "one invocation per query row and head: per-key online softmax through the block table, the row in registers",
            WgslImpl::new(&PAGED_ROWS, prepare_paged_rows).check(check_paged_rows),
        ),
        KernelDef::new(
            "attention_paged_cpu",
            Op::AttentionPaged,
            cpu_kernels::KV_TYPES,
            PAGED_CPU_PARAMS,
            "each sequence as the defaults run it alone (a decode token as decode_heads, a chunk as the tiled prefill), keys and values through its block table",
            CpuImpl { run: run_paged, check: check_paged_cpu },
        ),
        KernelDef::new(
            "attention_paged_rows_cpu",
            Op::AttentionPaged,
            cpu_kernels::KV_TYPES,
            PAGED_ROWS_CPU_PARAMS,
            "pool over the batch's (query row, head) pairs; per-key online softmax through the sequence's block table",
            CpuImpl { run: run_paged_rows, check: check_paged_cpu },
        ),
        KernelDef::new(
            "attention_decode_stream",
            Op::AttentionDecode,
            cpu_kernels::KV_TYPES,
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
            cpu_kernels::KV_TYPES,
            DECODE_HEADS_PARAMS,
            "one pool task per head; scores materialised, exact two-pass softmax, SIMD dot/dot4 and axpy",
            CpuImpl { run: run_decode_heads, check: check_cpu },
        ),
        KernelDef::new(
            "attention_decode_splitkv_cpu",
            Op::AttentionDecode,
            cpu_kernels::KV_TYPES,
            DECODE_SPLIT_PARAMS,
            "key range split across pool tasks per KV head (the group's heads share each K/V row); (m, l, acc) partials merged",
            CpuImpl { run: run_decode_splitkv, check: check_cpu },
        ),
    ];
    v.extend(mma::variants());
    v
}

// ---------------------------------------------------------------------------
// WGSL: one dispatch step (prefill and decode)

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

#[cfg(test)]
mod tests {
    use super::wgsl_decode::{splitkv_groups, splitkv_splits};
    use super::*;
    use crate::device::Caps;
    use crate::device::{CpuCaps, GpuCaps};
    use crate::kernels::contract::Params;
    use crate::kernels::problem::Problem;
    use crate::kernels::registry;
    use crate::kernels::verify::{Runner, check_one};

    /// Shapes beyond the op's test set: GQA groups wider than one splitkv workgroup
    /// (12 and 10 heads per KV head), MQA, head_dim not a power of two, a window
    /// longer than the context, a prefill continuing a long cache.
    fn extra_problems() -> Vec<Problem> {
        vec![
            Problem::AttentionDecode { kv_len: 150, kv_cap: 160, heads: 12, kv_heads: 1, head_dim: 16, window: 0, scale: 0.25 },
            Problem::AttentionDecode { kv_len: 333, kv_cap: 333, heads: 20, kv_heads: 2, head_dim: 24, window: 100, scale: 0.2 },
            Problem::AttentionDecode { kv_len: 40, kv_cap: 64, heads: 3, kv_heads: 3, head_dim: 80, window: 4096, scale: 0.11 },
            causal_prefill((9, 30, 31), (12, 1, 8), 0, 0.35),
            causal_prefill((3, 90, 96), (4, 2, 24), 7, 0.2),
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

    /// A prefill cut into two calls anywhere gives each query row the values of
    /// one call, bit for bit (what makes a prompt's logits independent of its
    /// passes and of a reused KV cache): sliding windows longer than a key tile
    /// (whose tiles start at multiples of the tile from key 0) and plain causal.
    #[test]
    fn cpu_prefill_rows_do_not_depend_on_where_a_call_starts() {
        use crate::kernels::verify::{HostTensor, make_inputs, run_cpu};
        let (t, cap, heads, kv_heads, d) = (200, 208, 4, 2, 16);
        for id in ["attention_prefill_tiled_cpu", "attention_prefill_cpu"] {
            let k = crate::kernels::find(id).expect("registered");
            for window in [0, 100, 150] {
                let whole = causal_prefill((t, t, cap), (heads, kv_heads, d), window, 0.2);
                let ins = make_inputs(&whole, DType::F32, 5);
                let all = run_cpu(k, &whole, DType::F32, &k.default_params(), &ins).expect("runs").remove(0);
                let HostTensor::F32(q) = &ins[0] else { panic!("f32 queries") };
                for a in [37, 101, 150] {
                    let tail = causal_prefill((t - a, t, cap), (heads, kv_heads, d), window, 0.2);
                    let mut part = ins.clone();
                    part[0] = HostTensor::F32(q[a * heads * d..].to_vec());
                    let got = run_cpu(k, &tail, DType::F32, &k.default_params(), &part).expect("runs").remove(0);
                    let want = &all[a * heads * d..];
                    let moved = got.iter().zip(want).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
                    assert_eq!(moved, 0, "{id} window {window}, a call from token {a}: {moved} values differ from one call's");
                }
            }
        }
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
        k.params_with(&[("workgroup_size", wg), ("heads_per_wg", hpw), ("chunk", chunk)])
    }

    /// GQA groups of 1, 4, 6 and 12 heads per KV head, key counts that are no
    /// multiple of the chunk, a window, head_dim 8 to 128, every heads_per_wg in
    /// both dtypes, with chunks of 16 and 64 alternating: each combination must be
    /// valid on the test adapter and match the reference.
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
        for (pi, prob) in probs.iter().enumerate() {
            for (hi, hpw) in [1, 2, 4, 8].into_iter().enumerate() {
                for (di, dtype) in [DType::F32, DType::F16].into_iter().enumerate() {
                    // the two chunks alternate over heads_per_wg, dtype and shape:
                    // at every shape each pair of the three meets
                    let chunk = [16, 64][(pi + hi + di) % 2];
                    let params = sg_params(wg, hpw, chunk);
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
        assert!(ran >= 36, "only {ran} checks ran");
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

    /// A causal prefill (no bidirectional block): `tokens` queries ending at key
    /// `kv_len - 1` of a cache of `kv_cap` rows, `heads` query heads over `kv_heads`
    /// key/value heads of `head_dim`.
    pub(super) fn causal_prefill(
        (tokens, kv_len, kv_cap): (usize, usize, usize),
        (heads, kv_heads, head_dim): (usize, usize, usize),
        window: usize,
        scale: f32,
    ) -> Problem {
        Problem::AttentionPrefill { tokens, kv_len, kv_cap, heads, kv_heads, head_dim, window, scale, bidi_start: 0, bidi_end: 0 }
    }

    pub(super) fn flash2_params(bq: u32, hpw: u32, bkv: u32, lanes: u32, tile: u32) -> Params {
        let k = crate::kernels::find("attention_prefill_flash2").expect("registered");
        k.params_with(&[("block_q", bq), ("heads_per_wg", hpw), ("block_kv", bkv), ("lanes", lanes), ("kv_tile", tile)])
    }

    /// Both flash2 forms over every lanes and K/V tile form their validity allows on
    /// the test adapter, each with one of four Q tile / head block / key tile
    /// combinations (each combination with each form at one shape and dtype or
    /// more; the parity sweep varies them one at a time), at shapes of the models (head_dim 64 with a GQA group of 4,
    /// head_dim 256 with one KV head, Gemma 3's), a group of 6 (no multiple of
    /// heads_per_wg), a window and a prefill continuing a cache, in f32 and f16;
    /// and the subgroup form's defaults accept head_dim 256 (Gemma 3) in f16 on an
    /// adapter with 16 KiB of workgroup memory and subgroups of 8 or more.
    #[test]
    fn flash2_matches_reference_over_its_parameters() {
        let Some(gpu) = crate::testing::test_gpu() else { return };
        let probs = [
            causal_prefill((19, 19, 24), (8, 2, 64), 0, 0.125),
            causal_prefill((13, 40, 41), (4, 1, 256), 0, 0.0625),
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
            // Q tiles, head blocks and key tiles from smallest to largest
            let tiles = [(4, 1, 16), (8, 4, 32), (32, 2, 64), (16, 8, 16)];
            for (pi, prob) in probs.iter().enumerate() {
                for (di, dtype) in [DType::F32, DType::F16].into_iter().enumerate() {
                    // every lanes and K/V tile form, each with one of the tile
                    // combinations, rotated from one shape and dtype to the next:
                    // over the six, every combination meets every form
                    for (li, lanes) in [4, 8, 16].into_iter().enumerate() {
                        for (ti, tile) in [0, 1, 2].into_iter().enumerate() {
                            let (bq, hpw, bkv) = tiles[(li * 3 + ti + pi * 2 + di) % tiles.len()];
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
        assert!(ran >= 60, "only {ran} checks ran");
    }

    #[test]
    fn flash2_validity_gives_reasons() {
        let k = crate::kernels::find("attention_prefill_flash2_sg").expect("registered");
        let tree = crate::kernels::find("attention_prefill_flash2").expect("registered");
        let caps = crate::testing::typical_gpu_caps();
        let reason = |k: &KernelDef, p: &Problem, d: DType, params: &Params, c: &GpuCaps| k.check(Caps::Gpu(c), p, d, params).unwrap_err();
        let gemma = causal_prefill((128, 128, 128), (4, 1, 256), 0, 0.0625);
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
        let odd = causal_prefill((4, 4, 8), (2, 2, 12), 0, 1.0);
        assert!(reason(tree, &odd, DType::F16, &flash2_params(8, 4, 32, 8, 1), &caps).contains("multiple of 8"));
    }

    /// The parity problems' tables (`verify::paged_layout`) are what a server's
    /// batch holds: every sequence's queries summing to the batch, blocks of the
    /// pool, decode tokens beside prefill chunks, blocks shared between
    /// sequences, lengths past one block and a window shorter than a sequence.
    #[test]
    fn paged_test_batches_mix_decode_chunks_and_shared_blocks() {
        use crate::kernels::problem::{Op, test_problems};
        use crate::kernels::verify::paged_layout;
        let (mut mixed, mut shared, mut windowed) = (false, false, false);
        for p in test_problems(Op::AttentionPaged) {
            let Problem::AttentionPaged { seqs, tokens, page, blocks, max_blocks, window, .. } = p else { panic!("{p:?}") };
            let pages = paged_layout(&p).expect("a layout");
            let rows: Vec<&[f32]> = pages.chunks(2 + max_blocks).collect();
            assert_eq!(rows.len(), seqs);
            assert_eq!(rows.iter().map(|r| r[0] as usize).sum::<usize>(), tokens, "{}", p.describe());
            let used: Vec<Vec<usize>> =
                rows.iter().map(|r| r[2..2 + (r[1] as usize).div_ceil(page)].iter().map(|&b| b as usize).collect()).collect();
            assert!(used.iter().flatten().all(|&b| b < blocks));
            let q_lens: Vec<usize> = rows.iter().map(|r| r[0] as usize).collect();
            mixed |= q_lens.contains(&1) && q_lens.iter().any(|&q| q > 1);
            shared |= used.iter().skip(1).any(|u| u.iter().any(|b| used[0].contains(b)));
            windowed |= window > 0 && rows.iter().any(|r| r[1] as usize > window && r[1] as usize > page);
        }
        assert!(mixed && shared && windowed, "mixed {mixed}, shared {shared}, windowed {windowed}");
    }

    /// `attention_paged_cpu` gives each sequence of a batch the bits the runtime's
    /// default kernels give it alone over a head-major cache holding the same
    /// rows (`attention_decode_heads_cpu` for a decode token,
    /// `attention_prefill_tiled_cpu` for a chunk), windows included, f32 and f16:
    /// a batch over the paged cache answers as a lone sequence does.
    #[test]
    fn paged_cpu_gives_each_sequence_the_lone_kernels_bits() {
        use crate::kernels::problem::{Op, test_problems};
        use crate::kernels::verify::{HostTensor, make_inputs, run_cpu};
        let paged = crate::kernels::find("attention_paged_cpu").expect("registered");
        let (mut compared, mut q8_seqs) = ((0, 0), 0);
        for p in test_problems(Op::AttentionPaged) {
            let Problem::AttentionPaged { heads, kv_heads, head_dim: d, page, max_blocks, window, scale, .. } = p else { panic!() };
            let q8 = d.is_multiple_of(crate::kernels::cpu::Q8_BLOCK).then_some(DType::Q8_0);
            for dtype in [DType::F32, DType::F16].into_iter().chain(q8) {
                let ins = make_inputs(&p, dtype, 9);
                let got = run_cpu(paged, &p, dtype, &paged.default_params(), &ins).expect("runs").remove(0);
                let (HostTensor::F32(q), HostTensor::F32(pages)) = (&ins[0], &ins[3]) else { panic!("f32 q and pages") };
                let mut t0 = 0;
                for meta in pages.chunks(2 + max_blocks) {
                    let (q_len, kv) = (meta[0] as usize, meta[1] as usize);
                    // The sequence's rows gathered into head-major caches.
                    let gather = |pool: &HostTensor| {
                        let at = |kh: usize, j: usize| ((meta[2 + j / page] as usize * kv_heads + kh) * page + j % page) * d;
                        let rows = |kh: usize, j: usize| at(kh, j)..at(kh, j) + d;
                        match pool {
                            HostTensor::F32(v) => {
                                HostTensor::F32((0..kv_heads).flat_map(|kh| (0..kv).flat_map(move |j| v[rows(kh, j)].to_vec())).collect())
                            }
                            HostTensor::F16(v) => {
                                HostTensor::F16((0..kv_heads).flat_map(|kh| (0..kv).flat_map(move |j| v[rows(kh, j)].to_vec())).collect())
                            }
                            // q8_0 rows of whole blocks: a row's codes and its d / 32 scales.
                            HostTensor::Q(m) => {
                                let b = crate::kernels::cpu::Q8_BLOCK;
                                let each = || (0..kv_heads).flat_map(|kh| (0..kv).map(move |j| rows(kh, j)));
                                HostTensor::Q(crate::kernels::quant::QMatrix {
                                    rows: kv_heads * kv * d / b,
                                    cols: b,
                                    quants: each().flat_map(|r| m.quants[r].to_vec()).collect(),
                                    scales: each().flat_map(|r| m.scales[r.start / b..r.end / b].to_vec()).collect(),
                                    ..m.clone()
                                })
                            }
                            _ => panic!("a float or q8_0 pool"),
                        }
                    };
                    let q_rows = HostTensor::F32(q[t0 * heads * d..(t0 + q_len) * heads * d].to_vec());
                    let lone_ins = [q_rows, gather(&ins[1]), gather(&ins[2])];
                    let (id, lone) = if q_len == 1 {
                        (
                            "attention_decode_heads_cpu",
                            Problem::AttentionDecode { kv_len: kv, kv_cap: kv, heads, kv_heads, head_dim: d, window, scale },
                        )
                    } else {
                        ("attention_prefill_tiled_cpu", causal_prefill((q_len, kv, kv), (heads, kv_heads, d), window, scale))
                    };
                    let k = crate::kernels::find(id).expect("registered");
                    let want = run_cpu(k, &lone, dtype, &k.default_params(), &lone_ins).expect("runs").remove(0);
                    let mine = &got[t0 * heads * d..(t0 + q_len) * heads * d];
                    let moved = mine.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                    assert_eq!(moved, 0, "{} {dtype}: the sequence at row {t0} ({q_len} of {kv}) differs from {id}", p.describe());
                    if q_len == 1 {
                        compared.0 += 1
                    } else {
                        compared.1 += 1
                    }
                    q8_seqs += usize::from(dtype == DType::Q8_0);
                    t0 += q_len;
                }
            }
        }
        assert!(compared.0 >= 6 && compared.1 >= 6, "{compared:?} decode tokens and chunks compared");
        assert!(q8_seqs >= 6, "{q8_seqs} sequences over q8_0 pools compared");
    }

    /// A table the pool cannot serve is the kernel's error, naming what is wrong,
    /// never a read out of bounds.
    #[test]
    fn paged_tables_the_pool_cannot_serve_are_refused() {
        use crate::kernels::problem::{Op, test_problems};
        use crate::kernels::verify::{HostTensor, make_inputs, run_cpu};
        let p = test_problems(Op::AttentionPaged).remove(2);
        let Problem::AttentionPaged { blocks, max_blocks, page, .. } = p else { panic!() };
        let ins = make_inputs(&p, DType::F32, 3);
        let with = |edit: &dyn Fn(&mut Vec<f32>)| {
            let mut ins = ins.clone();
            let HostTensor::F32(pages) = &mut ins[3] else { panic!("f32 pages") };
            edit(pages);
            ins
        };
        type Edit<'a> = &'a dyn Fn(&mut Vec<f32>);
        let cases: [(Edit<'_>, &str); 4] = [
            (&|t| t[2] = blocks as f32, "not one of the pool's"),
            (&|t| t[2] = 1.5, "not one of the pool's"),
            (&|t| t[1] = (page * max_blocks + 1) as f32, "kv_len"),
            // one more query in a sequence that has the keys for it
            (
                &|t| {
                    let w = 2 + max_blocks;
                    let s = (0..t.len() / w).find(|s| t[s * w] < t[s * w + 1]).expect("a sequence with past keys");
                    t[s * w] += 1.0;
                },
                "sum to",
            ),
        ];
        for id in ["attention_paged_cpu", "attention_paged_rows_cpu"] {
            let k = crate::kernels::find(id).expect("registered");
            assert!(run_cpu(k, &p, DType::F32, &k.default_params(), &ins).is_ok());
            for (edit, says) in &cases {
                let err = run_cpu(k, &p, DType::F32, &k.default_params(), &with(*edit)).expect_err("refused").to_string();
                assert!(err.contains(says), "{id}: {err}");
            }
        }
    }

    /// heads_per_wg is clamped to the group; a group it does not divide takes
    /// ceil(group / heads_per_wg) workgroups per KV head.

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
