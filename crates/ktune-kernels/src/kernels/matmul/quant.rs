//! GEMM over block-quantized weights (prefill): `y[m,n] = x[m,k] · w[n,k]ᵀ` with
//! `w` in ggml blocks (the split layout of [`QMatrix`](crate::kernels::quant::QMatrix)).
//!
//! WGSL: `gemm_q_tiled` (`tile_k` of w dequantized into workgroup memory with the x
//! tile, vec4 tile rows padded to an odd stride, `reg_m x reg_n` register blocks;
//! with `f16_tiles` the tiles are f16, half the workgroup memory;
//! `QFMT` override, weight bound as quants and scales), `gemm_q_coop16` /
//! `gemm_q_coop8` / `gemm_q_mma_emu` (the matrix-tile GEMM on cooperative matrices
//! and its plain-loop emulation: [`super::mma`], registered here),
//! `gemm_q_rows_subgroup` (a few tokens: a subgroup a weight row, each unit
//! dequantized once and dotted with every token, the weights read once). CPU:
//! `gemm_q_rows_cpu` (each weight row dequantized once into L1, dotted with tiles
//! of tokens), `gemm_q_dots_cpu` (a decode batch: each token's dots as the
//! decode GEMV's, eight rows at a time through every token), `gemm_q_panel_cpu` (blocks of weight rows
//! dequantized into an f32 panel, then the cache-blocked f32 GEMM of [`super`]) and
//! `gemm_q_i8_cpu` (int8 activations, interleaved rows, VNNI:
//! [`crate::kernels::cpu::qgemm`]).
//! k must be a whole number of 32-element blocks.

use crate::device::GpuCaps;
use crate::gpu::{GpuProgram, Shader, grid_2d, groups};
use crate::kernels::contract::check_blocks;
use crate::kernels::contract::{CpuArgs, CpuImpl, CpuIn, KernelDef, KernelError, ParamSpec, Params, WgslImpl, WgslSetup, param, wrong_op};
use crate::kernels::cpu::qgemm::{I8_GEMM_PARAMS, I8Kernel, XPanel, active_panels, check_i8_gemm, rows_times_tokens_i8};
use crate::kernels::cpu::sgemm::{Blocking, Micro, Split, gemm_blocked};
use crate::kernels::cpu::{
    DOT_ROWS_PARAMS, ISA, Isa, check_quant, dequantize_row, qin, row_blocks, rows_times_tokens, rows_times_vectors, token_vectors,
};
use crate::kernels::problem::{Op, Problem};
use crate::kernels::quant::{DType, QView};
use crate::kernels::wgsl::{ROWS_SG_PARAMS, grid_dim, one_q_step, qfmt, subgroup_fits};
use crate::shader;

static QGEMM_TILED: Shader = shader!(head "qgemm_tiled_f32.wgsl"; "qgemm_tiled.wgsl", "qgemm.wgsl", "qgemm_tiled_body.wgsl", "reg_tile.wgsl", "qblock.wgsl", "qgeom.wgsl");
static QGEMM_TILED_F16: Shader = shader!(head "qgemm_tiled_f16.wgsl"; "qgemm_tiled.wgsl", "qgemm.wgsl", "qgemm_tiled_body.wgsl", "reg_tile.wgsl", "qblock.wgsl", "qgeom.wgsl");
static QGEMM_ROWS_SG: Shader =
    shader!("qgemm_rows_subgroup.wgsl", "qgemm.wgsl", "qblock.wgsl", "qgeom.wgsl", "row_sg.wgsl", "reduce_sg.wgsl");

/// The most tokens `gemm_q_rows_subgroup` takes (two passes of its eight accumulators).
pub const ROWS_SG_MAX_TOKENS: usize = 16;

/// The f16-tile form `f16_tiles = 1` selects.
static TILED_ALT: &[&Shader] = &[&QGEMM_TILED_F16];

const TILED_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "tile_m", values: &[16, 32, 64, 128], default: 32, help: "rows of y per workgroup" },
    ParamSpec { name: "tile_n", values: &[16, 32, 64, 128], default: 64, help: "columns of y per workgroup" },
    ParamSpec {
        name: "tile_k",
        values: &[32, 64],
        default: 32,
        help: "depth staged in workgroup memory per step (whole 32-element block chunks)",
    },
    ParamSpec { name: "reg_m", values: &[2, 4, 8], default: 4, help: "rows of y per invocation (register block)" },
    ParamSpec { name: "reg_n", values: &[2, 4, 8], default: 4, help: "columns of y per invocation (register block)" },
    ParamSpec {
        name: "double_buf",
        values: &[0, 1],
        default: 0,
        help: "1: two tile buffers, the next step staged while this one is read (one barrier per step instead of two)",
    },
    F16_TILES,
];

/// Workgroup tiles as f16 (`qgemm_tiled_f16.wgsl`): half the workgroup memory, x and
/// the dequantized weights rounded to f16, f32 accumulation; needs SHADER_F16.
pub(crate) const F16_TILES: ParamSpec = ParamSpec {
    name: "f16_tiles",
    values: &[0, 1],
    default: 0,
    help: "1: workgroup tiles stored as f16 (half the memory, so larger tiles fit; needs SHADER_F16), f32 accumulation",
};

const CPU_GEMM_ROWS_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "rows_per_task", values: &[4, 8, 16, 32, 64], default: 16, help: "weight rows per pool task" },
    ParamSpec::new("tokens_per_tile", &[4, 16, 64], 16, "tokens swept per dequantized weight row while it is in L1"),
    ISA,
];

const CPU_PANEL_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "nc", values: &[64, 128, 256, 512], default: 256, help: "weight rows dequantized into one f32 panel" },
    ParamSpec { name: "kc", values: &[128, 256, 512], default: 256, help: "depth of a packed block of the f32 GEMM" },
    ISA,
];

fn check_tiled(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    check_blocks(prob, dtype)?;
    let (tm, tn) = (param(params, "tile_m")?, param(params, "tile_n")?);
    let (rm, rn) = (param(params, "reg_m")?, param(params, "reg_n")?);
    if rm == 0 || rn == 0 || tm % rm != 0 || tn % rn != 0 {
        return Err(format!("tile {tm}x{tn} is not a whole number of {rm}x{rn} register blocks"));
    }
    if rm > 8 || rn > 8 {
        return Err(format!("register block {rm}x{rn} exceeds the shader's 8x8 accumulator array"));
    }
    if param(params, "f16_tiles")? == 1 && !caps.shader_f16 {
        return Err("f16_tiles = 1 needs SHADER_F16 (f16 workgroup tiles), which this adapter lacks".into());
    }
    let tk = param(params, "tile_k")?;
    if tk == 0 || tk % 32 != 0 {
        return Err(format!("tile_k = {tk} is not a whole number of 32-element block chunks"));
    }
    if let Problem::Gemm { m, n, .. } = *prob {
        grid_dim(caps, groups(n, tn) as usize, "n")?;
        grid_dim(caps, groups(m, tm) as usize, "m")?;
    }
    Ok(())
}

fn tiled_wg(params: &Params) -> Result<[u32; 3], KernelError> {
    let (rm, rn) = (param(params, "reg_m")?.max(1), param(params, "reg_n")?.max(1));
    Ok([(param(params, "tile_m")? / rm) * (param(params, "tile_n")? / rn), 1, 1])
}

/// The x tile `[tile_m, tile_k]` and the dequantized w tile `[tile_n, tile_k]` as
/// f32 (f16 with `f16_tiles`), each row padded by one vec4 (an odd row stride in
/// vec4 units); twice with `double_buf`.
fn tiled_shared(_: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    let (tm, tn, tk) = (param(params, "tile_m")? as u64, param(params, "tile_n")? as u64, param(params, "tile_k")? as u64);
    let vec4 = if param(params, "f16_tiles")? == 1 { 8 } else { 16 };
    Ok(vec4 * (tm + tn) * (tk / 4 + 1) * (1 + param(params, "double_buf")?.min(1) as u64))
}

fn prepare_tiled(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let Problem::Gemm { m, n, k } = *s.problem else { return Err(wrong_op(s.kernel, s.problem)) };
    let (tm, tn) = (s.param("tile_m")?, s.param("tile_n")?);
    let [wgs, _, _] = tiled_wg(s.params)?;
    let consts = [
        ("TILE_M", tm as f64),
        ("TILE_N", tn as f64),
        ("TILE_K", s.param("tile_k")? as f64),
        ("REG_M", s.param("reg_m")? as f64),
        ("REG_N", s.param("reg_n")? as f64),
        ("WGS", wgs as f64),
        ("DOUBLE_BUF", s.param("double_buf")?.min(1) as f64),
        ("QFMT", qfmt(s.dtype)),
    ];
    let grid = [groups(n, tn).max(1), groups(m, tm).max(1), 1];
    if s.param("f16_tiles")? == 1 {
        return one_q_step(&s.with_shader(&QGEMM_TILED_F16), 1, &consts, &[m as u32, n as u32, k as u32], grid);
    }
    one_q_step(s, 1, &consts, &[m as u32, n as u32, k as u32], grid)
}

/// The row-block GEMMs: `block` gets the ISA, the tokens `x`, the weight and
/// `(m, k)` and gives what computes weight rows `r0..r0 + count` against every
/// token (into a token-major `[m][count]` block); tasks of `rows_per_task` rows run over the
/// pool, each writing its block into `y[m, n]` token-major ([`row_blocks`]).
fn by_row_blocks<'a, F>(
    kd: &KernelDef,
    prob: &Problem,
    params: &Params,
    mut a: CpuArgs<'a>,
    block: impl FnOnce(Isa, &'a [f32], QView<'a>, (usize, usize)) -> Result<F, KernelError>,
) -> Result<(), KernelError>
where
    F: Fn(usize, usize, &mut [f32]) + Sync,
{
    let Problem::Gemm { m, n, k } = *prob else { return Err(wrong_op(kd, prob)) };
    let (x, w) = (a.ins[0].f32(), qin(kd.id, &a.ins[1])?);
    let rows = block(Isa::of(params)?, x, w, (m, k))?;
    row_blocks(&mut a.outs[0][..m * n], m, n, (param(params, "rows_per_task")? as usize).max(1), rows);
    Ok(())
}

fn run_gemm_rows(kd: &KernelDef, prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    let tile = param(params, "tokens_per_tile")? as usize;
    by_row_blocks(kd, prob, params, a, |isa, x, w, (m, k)| {
        Ok(move |r0, count, out: &mut [f32]| rows_times_tokens(isa, x, m, k, w, r0, count, tile, out))
    })
}

fn run_gemm_i8(kd: &KernelDef, prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    let kernel = I8Kernel::of(params)?;
    by_row_blocks(kd, prob, params, a, |isa, x, w, (m, k)| {
        let xp = XPanel::quantize(&x[..m * k], m, k);
        let kept = active_panels().and_then(|c| c.weight(isa, w, k));
        Ok(move |r0, count, out: &mut [f32]| rows_times_tokens_i8(kernel, &xp, w, r0, count, kept.as_ref(), out))
    })
}

/// A few tokens (a server's decode batch) as the decode GEMV computes each
/// ([`rows_times_vectors`]): every weight row read from memory once for all of
/// them, no panel to pack or keep.
fn run_gemm_dots(kd: &KernelDef, prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    let four = param(params, "rows_per_pass")? == 4;
    by_row_blocks(kd, prob, params, a, |isa, x, w, (m, k)| {
        let xs = token_vectors(x, m, k, params, w.format)?;
        Ok(move |r0, count, out: &mut [f32]| rows_times_vectors(isa, &xs, w, k, r0, count, four, out))
    })
}

fn run_gemm_panel(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::Gemm { m, n, k } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let micro = Micro::for_isa(isa);
    let (x, w) = (a.ins[0].f32(), qin(kd.id, &a.ins[1])?);
    let nc = (param(params, "nc")? as usize).max(1);
    let blk = Blocking { mc: 96, nc: 128.min(nc), kc: (param(params, "kc")? as usize).max(1) };
    let y = &mut a.outs[0][..m * n];
    let mut panel = vec![0f32; nc.min(n) * k];
    let mut tmp = vec![0f32; m * nc.min(n)];
    for j0 in (0..n).step_by(nc) {
        let nb = nc.min(n - j0);
        crate::kernels::cpu::pool::for_chunks_mut(&mut panel[..nb * k], k, |i, row| dequantize_row(isa, w, j0 + i, k, row));
        gemm_blocked(micro, blk, Split::Auto, m, nb, k, x, CpuIn::F32(&panel[..nb * k]), &mut tmp[..m * nb]);
        for t in 0..m {
            y[t * n + j0..][..nb].copy_from_slice(&tmp[t * nb..][..nb]);
        }
    }
    Ok(())
}

fn check_rows_sg(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    subgroup_fits(caps, params)?;
    if let Problem::Gemm { m, .. } = *prob
        && m > ROWS_SG_MAX_TOKENS
    {
        return Err(format!("m = {m} tokens: more than the {ROWS_SG_MAX_TOKENS} it holds (the tiled GEMMs take these)"));
    }
    check_blocks(prob, dtype)
}

fn prepare_rows_sg(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let Problem::Gemm { m, n, k } = *s.problem else { return Err(wrong_op(s.kernel, s.problem)) };
    let (wg, rows) = (s.param("workgroup_size")?, s.param("rows_per_wg")?);
    let consts = [("WG", wg as f64), ("ROWS", rows as f64), ("QFMT", qfmt(s.dtype))];
    one_q_step(s, 1, &consts, &[m as u32, n as u32, k as u32], grid_2d(groups(n, rows)))
}

pub fn variants() -> Vec<KernelDef> {
    let mut v = vec![
        KernelDef::new(
            "gemm_q_tiled",
            Op::Gemm,
            DType::QUANT,
            TILED_PARAMS,
            "tile_k of w dequantized into workgroup memory with the x tile (vec4 rows, padded to an odd stride; f32 or f16), optionally \
             double-buffered; reg_m x reg_n register blocks",
            WgslImpl::new(&QGEMM_TILED, prepare_tiled).workgroup(tiled_wg).shared(tiled_shared).alt_shaders(TILED_ALT).check(check_tiled),
        ),
        KernelDef::new(
            "gemm_q_rows_subgroup",
            Op::Gemm,
            DType::QUANT,
            ROWS_SG_PARAMS,
            "a few tokens (a decode batch, a short prompt): one subgroup per weight row, each block unit dequantized once in \
             registers and dotted with every token (eight accumulators a lane), subgroupAdd; the weights read once",
            WgslImpl::new(&QGEMM_ROWS_SG, prepare_rows_sg).subgroups().check(check_rows_sg),
        ),
        KernelDef::new(
            "gemm_q_rows_cpu",
            Op::Gemm,
            DType::QUANT,
            CPU_GEMM_ROWS_PARAMS,
            "each weight row dequantized once into L1, dotted with tiles of tokens; pool over rows",
            CpuImpl { run: run_gemm_rows, check: check_quant },
        ),
        KernelDef::new(
            "gemm_q_i8_cpu",
            Op::Gemm,
            DType::QUANT,
            I8_GEMM_PARAMS,
            "activations quantized to int8 blocks once; weight rows interleaved 16 to a vector per task; VNNI tiles of 32 rows x 4 tokens \
             (or, `amx` 1 and 2, AMX tile multiplies of 16 rows x 16 tokens, the same bits)",
            CpuImpl { run: run_gemm_i8, check: check_i8_gemm },
        ),
        KernelDef::new(
            "gemm_q_dots_cpu",
            Op::Gemm,
            DType::QUANT,
            DOT_ROWS_PARAMS,
            "a few tokens (a decode batch): each token's dots as the decode GEMV's (int8 or f32 activations), eight weight rows \
             at a time through every token, read from memory once; pool over rows",
            CpuImpl { run: run_gemm_dots, check: check_quant },
        ),
        KernelDef::new(
            "gemm_q_panel_cpu",
            Op::Gemm,
            DType::QUANT,
            CPU_PANEL_PARAMS,
            "nc weight rows dequantized into an f32 panel, then the cache-blocked f32 GEMM microkernel",
            CpuImpl { run: run_gemm_panel, check: check_quant },
        ),
    ];
    // the matrix-tile GEMMs (matmul/mma.rs) after the SIMT one
    v.splice(1..1, super::mma::gemm_q_variants());
    v
}

#[cfg(test)]
mod tests {
    use crate::device::Caps;
    use crate::device::GpuCaps;
    use crate::kernels::contract::Params;
    use crate::kernels::find;
    use crate::kernels::problem::Problem;
    use crate::kernels::quant::DType;

    /// A decode batch through `gemm_q_dots_cpu` gives each token what the
    /// decode's GEMV (`gemv_q_cpu`) gives it alone, bit for bit, and
    /// `gate_up_q_dots_cpu` what `gate_up_q_cpu` gives one token: every format,
    /// f32 and int8 activations, the four-row pass where a format has it, rows
    /// in the 8-row repacked layout too, in tasks that split them unevenly.
    #[test]
    fn a_decode_batch_gets_each_tokens_lone_dots_bit_for_bit() {
        use crate::device::CpuCaps;
        use crate::kernels::problem::Activation;
        use crate::kernels::quant::{QFormat, QMatrix};
        use crate::kernels::verify::{HostTensor, run_cpu};
        let (m, n, k, act) = (6, 40, 512, Activation::Silu);
        let caps = CpuCaps::detect();
        let data = |len: usize, seed: u64| crate::kernels::cpu::testdata::signed(len, seed);
        let x = data(m * k, 1);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        // (batch kernel, its problem, the lone kernel, its problem, weight rows)
        let pairs = [
            ("gemm_q_dots_cpu", Problem::Gemm { m, n, k }, "gemv_q_cpu", Problem::Gemv { n, k }, n),
            ("gate_up_q_dots_cpu", Problem::GateUp { rows: m, n, k, act }, "gate_up_q_cpu", Problem::GateUp { rows: 1, n, k, act }, 2 * n),
        ];
        for f in QFormat::ALL {
            let dtype = DType::from(f);
            for (batch, bp, lone, lp, rows) in &pairs {
                let (batch, lone, rows) = (*batch, *lone, *rows);
                let plain = QMatrix::quantize(f, rows, k, &data(rows * k, 2)).expect("quantized");
                for w in [plain.repack_x8(), plain] {
                    let layout = w.layout;
                    let w = HostTensor::Q(w);
                    for (act_bits, pass) in [(32, 1), (8, 1), (8, 4)] {
                        let kd = find(batch).expect("registered");
                        // gate_up passes one row at a time, as its lone kernel.
                        let passes = kd.params.iter().any(|p| p.name == "rows_per_pass");
                        if pass == 4 && !passes {
                            continue;
                        }
                        let with_pass = |id: &str, more: &[(&str, u32)]| {
                            let mut kv = vec![("act_bits", act_bits)];
                            kv.extend(passes.then_some(("rows_per_pass", pass)));
                            kv.extend_from_slice(more);
                            find(id).expect("registered").params_with(&kv)
                        };
                        let bparams = with_pass(batch, &[("rows_per_task", 16)]);
                        if kd.check(Caps::Cpu(&caps), bp, dtype, &bparams).is_err() {
                            continue;
                        }
                        let lparams = with_pass(lone, &[]);
                        let got = run_cpu(kd, bp, dtype, &bparams, &[HostTensor::F32(x.clone()), w.clone()]).expect("batch").remove(0);
                        for t in 0..m {
                            let xt = HostTensor::F32(x[t * k..(t + 1) * k].to_vec());
                            let want =
                                run_cpu(find(lone).expect("registered"), lp, dtype, &lparams, &[xt, w.clone()]).expect("lone").remove(0);
                            let what = format!("{batch} {f} {layout:?} act_bits {act_bits} rows_per_pass {pass}: token {t}");
                            assert_eq!(bits(&got[t * n..(t + 1) * n]), bits(&want[..n]), "{what}");
                        }
                    }
                }
            }
        }
    }

    fn with(id: &str, kv: &[(&str, u32)]) -> Params {
        find(id).expect("registered").params_with(kv)
    }

    fn reason(id: &str, params: &Params, caps: &GpuCaps) -> String {
        let p = Problem::Gemm { m: 70, n: 96, k: 256 };
        find(id).expect("registered").check(Caps::Gpu(caps), &p, DType::Q4_K, params).expect_err("invalid")
    }

    fn valid(id: &str, params: &Params, caps: &GpuCaps) -> bool {
        let p = Problem::Gemm { m: 70, n: 96, k: 256 };
        find(id).expect("registered").check(Caps::Gpu(caps), &p, DType::Q4_K, params).is_ok()
    }

    /// An adapter with 16x16x16 f16 -> f32 matrices and subgroups of 32 (the shape
    /// and subgroup size NVIDIA's Vulkan driver reports).
    fn coop_caps() -> GpuCaps {
        crate::testing::coop_gpu_caps(&[(16, "f16", "f32"), (16, "f16", "f16"), (8, "f32", "f32")])
    }

    #[test]
    fn coop_variants_need_the_reported_matrix_shape() {
        let plain = crate::testing::typical_gpu_caps();
        let r = reason("gemm_q_coop16", &with("gemm_q_coop16", &[]), &plain);
        assert!(r.contains("no cooperative matrices"), "{r}");
        let c = coop_caps();
        assert!(valid("gemm_q_coop16", &with("gemm_q_coop16", &[]), &c));
        let r = reason("gemm_q_coop8", &with("gemm_q_coop8", &[]), &c);
        assert!(r.contains("no 8x8x8 f16->f32") && r.contains("16x16x16 f16->f32"), "{r}");
        let wide = GpuCaps { subgroup_max_size: 64, ..c.clone() };
        let r = reason("gemm_q_coop16", &with("gemm_q_coop16", &[]), &wide);
        assert!(r.contains("exactly 32"), "{r}");
        let no_f16 = GpuCaps { shader_f16: false, ..c.clone() };
        assert!(reason("gemm_q_coop16", &with("gemm_q_coop16", &[]), &no_f16).contains("SHADER_F16"));
        let no_sg = GpuCaps { subgroups: false, ..c.clone() };
        assert!(reason("gemm_q_coop16", &with("gemm_q_coop16", &[]), &no_sg).contains("subgroup"));
    }

    #[test]
    fn mma_tilings_past_the_limits_are_rejected_with_reasons() {
        let c = coop_caps();
        // 4x4 matrices: over the 8 accumulators
        let r = reason("gemm_q_coop16", &with("gemm_q_coop16", &[("mat_m", 4), ("mat_n", 4)]), &c);
        assert!(r.contains("8 accumulators"), "{r}");
        // 4x4 subgroups of 32 on a 256-invocation adapter
        let small = crate::testing::typical_gpu_caps();
        let r = reason("gemm_q_mma_emu", &with("gemm_q_mma_emu", &[("sg_m", 4), ("sg_n", 4)]), &small);
        assert!(r.contains("512 invocations"), "{r}");
        // 4x2 subgroups x 4x2 matrices of 16 at tile_k 64: 2·(512+256)·72 + 4·8·1024 bytes
        let big = with("gemm_q_mma_emu", &[("sg_m", 4), ("mat_m", 4), ("tile_k", 64)]);
        let r =
            reason("gemm_q_mma_emu", &big, &GpuCaps { max_invocations_per_workgroup: 1024, max_workgroup_size: [1024, 1024, 64], ..small });
        assert!(r.contains("workgroup memory"), "{r}");
        // the emulation needs f16 too, but no matrix units
        assert!(valid("gemm_q_mma_emu", &with("gemm_q_mma_emu", &[]), &crate::testing::typical_gpu_caps()));
        let r =
            reason("gemm_q_mma_emu", &with("gemm_q_mma_emu", &[]), &GpuCaps { shader_f16: false, ..crate::testing::typical_gpu_caps() });
        assert!(r.contains("SHADER_F16"), "{r}");
    }

    #[test]
    fn tiled_register_blocks_past_the_limits_are_rejected_with_reasons() {
        let c = crate::testing::typical_gpu_caps();
        // 128x128 tile of 2x2 blocks: 4096 invocations
        let r = reason("gemm_q_tiled", &with("gemm_q_tiled", &[("tile_m", 128), ("tile_n", 128), ("reg_m", 2), ("reg_n", 2)]), &c);
        assert!(r.contains("4096 invocations"), "{r}");
        // 128x128 at tile_k 64: 16·256·17 bytes of tiles
        let r = reason(
            "gemm_q_tiled",
            &with("gemm_q_tiled", &[("tile_m", 128), ("tile_n", 128), ("reg_m", 8), ("reg_n", 8), ("tile_k", 64)]),
            &c,
        );
        assert!(r.contains("workgroup memory"), "{r}");
        // 16x64 of 2x4 blocks at tile_k 64: 128 invocations, 16·80·17 bytes (over 16 KiB) unless the depth is 32
        assert!(valid("gemm_q_tiled", &with("gemm_q_tiled", &[("reg_m", 2), ("tile_m", 16)]), &c));
        let r = reason("gemm_q_tiled", &with("gemm_q_tiled", &[("reg_m", 2), ("tile_m", 16), ("tile_k", 64)]), &c);
        assert!(r.contains("21760 bytes"), "{r}");
        // f16 tiles: half of it fits, and a 128x64 tile at depth 32 (8·192·9 bytes, 16·192·9 as f32)
        let f16 = with("gemm_q_tiled", &[("reg_m", 2), ("tile_m", 16), ("tile_k", 64), ("f16_tiles", 1)]);
        assert!(valid("gemm_q_tiled", &f16, &c));
        let big = [("tile_m", 128), ("tile_n", 64), ("reg_m", 8), ("reg_n", 8), ("f16_tiles", 1)];
        assert!(valid("gemm_q_tiled", &with("gemm_q_tiled", &big), &c));
        assert!(!valid("gemm_q_tiled", &with("gemm_q_tiled", &big[..4]), &c));
        let r = reason("gemm_q_tiled", &f16, &GpuCaps { shader_f16: false, ..c.clone() });
        assert!(r.contains("SHADER_F16"), "{r}");
    }
}
