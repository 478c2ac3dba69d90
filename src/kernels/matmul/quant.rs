//! GEMM over block-quantized weights (prefill): `y[m,n] = x[m,k] · w[n,k]ᵀ` with
//! `w` in ggml blocks (the split layout of [`QMatrix`](crate::kernels::quant::QMatrix)).
//!
//! WGSL: `gemm_q_tiled` (`tile_k` of w dequantized into workgroup memory with the x
//! tile, vec4 tile rows padded to an odd stride, `reg_m x reg_n` register blocks;
//! `QFMT` override, weight bound as quants and scales), `gemm_q_coop16` /
//! `gemm_q_coop8` (wgpu's experimental cooperative matrices: x and the dequantized
//! weights as f16 tiles in workgroup memory, f32 accumulators, a tiling of subgroups x
//! matrices per subgroup; valid only where the adapter reports that square f16 -> f32
//! shape, see [`GpuCaps::coop_f16_f32`]) and `gemm_q_mma_emu` (the same tiling with the
//! matrix operations as plain loops: how the coop tiling runs and is tested on adapters
//! without matrix units). CPU: `gemm_q_rows_cpu` (each weight row dequantized once into
//! L1, dotted with tiles of tokens), `gemm_q_panel_cpu` (blocks of weight rows
//! dequantized into an f32 panel, then the cache-blocked f32 GEMM of [`super`]) and
//! `gemm_q_i8_cpu` (int8 activations, interleaved rows, VNNI:
//! [`crate::kernels::cpu::qgemm`]).
//! k must be a whole number of 32-element blocks.

use super::{Blocking, Micro, Split, gemm_blocked};
use crate::device::GpuCaps;
use crate::gpu::{GpuProgram, Shader, groups};
use crate::kernels::cpu::qgemm::{I8_GEMM_PARAMS, XPanel, check_i8_gemm, rows_times_tokens_i8};
use crate::kernels::cpu::{ISA, Isa, check_quant, dequantize_row, par_row_blocks, qin, rows_times_tokens, scatter_row_blocks};
use crate::kernels::wgsl::{check_blocks, grid_dim, one_q_step, qfmt};
use crate::kernels::{
    CpuArgs, CpuImpl, CpuIn, DType, KernelDef, KernelError, Op, ParamSpec, Params, Problem, WgslImpl, WgslSetup, param, wrong_op,
};
use crate::shader;

static QGEMM_TILED: Shader = shader!("qgemm_tiled.wgsl", "qblock.wgsl");
static QGEMM_COOP16: Shader = shader!("qgemm_coop16.wgsl", "qgemm_coop.wgsl", "qgemm_mma.wgsl", "qblock.wgsl");
static QGEMM_COOP8: Shader = shader!("qgemm_coop8.wgsl", "qgemm_coop.wgsl", "qgemm_mma.wgsl", "qblock.wgsl");
static QGEMM_MMA_EMU: Shader = shader!("qgemm_mma_emu.wgsl", "qgemm_mma.wgsl", "qblock.wgsl");

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
];

/// The matrix-tile tiling the cooperative-matrix kernels and their plain-loop
/// emulation share (`shaders/qgemm_mma.wgsl`).
const SG_M: ParamSpec = ParamSpec { name: "sg_m", values: &[1, 2, 4], default: 2, help: "subgroups per workgroup along m" };
const SG_N: ParamSpec = ParamSpec { name: "sg_n", values: &[1, 2, 4], default: 2, help: "subgroups per workgroup along n" };
const MAT_M: ParamSpec = ParamSpec { name: "mat_m", values: &[1, 2, 4], default: 2, help: "matrices per subgroup along m" };
const MAT_N: ParamSpec = ParamSpec { name: "mat_n", values: &[1, 2, 4], default: 2, help: "matrices per subgroup along n" };
const MMA_TILE_K: ParamSpec = ParamSpec {
    name: "tile_k",
    values: &[32, 64],
    default: 32,
    help: "depth staged in workgroup memory per step (whole 32-element block chunks)",
};
/// Marks the f16 rounding of the activations (the matrix units' input type), which
/// the parity check judges with the f16-activation tolerance.
const ACT_F16: ParamSpec =
    ParamSpec { name: "act_bits", values: &[16], default: 16, help: "activations rounded to f16 in workgroup memory (matrix input type)" };
const COOP_PARAMS: &[ParamSpec] = &[SG_M, SG_N, MAT_M, MAT_N, MMA_TILE_K, ACT_F16];
const EMU_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "mat", values: &[8, 16], default: 16, help: "side of the emulated square matrices (8x8x8 or 16x16x16)" },
    SG_M,
    SG_N,
    MAT_M,
    MAT_N,
    MMA_TILE_K,
    ACT_F16,
];

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
/// f32, each row padded by one vec4 (an odd row stride in 16-byte units); twice
/// with `double_buf`.
fn tiled_shared(_: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    let (tm, tn, tk) = (param(params, "tile_m")? as u64, param(params, "tile_n")? as u64, param(params, "tile_k")? as u64);
    Ok(16 * (tm + tn) * (tk / 4 + 1) * (1 + param(params, "double_buf")?.min(1) as u64))
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
    one_q_step(s, 1, &consts, &[m as u32, n as u32, k as u32], [groups(n, tn).max(1), groups(m, tm).max(1), 1])
}

/// Lanes of a subgroup in the matrix tiling (the coop shaders need subgroups of
/// exactly this size; the emulation groups invocations by it).
const MMA_LANES: u32 = 32;

/// The matrix tiling of a variant: (subgroups along m, along n, matrices per
/// subgroup along m, along n, tile_k).
fn mma_tiling(params: &Params) -> Result<(u32, u32, u32, u32, u32), KernelError> {
    Ok((param(params, "sg_m")?, param(params, "sg_n")?, param(params, "mat_m")?, param(params, "mat_n")?, param(params, "tile_k")?))
}

fn mma_wg(params: &Params) -> Result<[u32; 3], KernelError> {
    let (sm, sn, ..) = mma_tiling(params)?;
    Ok([sm * sn * MMA_LANES, 1, 1])
}

/// f16 x and w tiles (rows of tile_k + 8 halves) and one f32 result matrix per subgroup.
fn mma_shared(params: &Params, mat: u32) -> Result<u64, KernelError> {
    let (sm, sn, mm, mn, tk) = mma_tiling(params)?;
    let (tm, tn) = ((sm * mm * mat) as u64, (sn * mn * mat) as u64);
    Ok(2 * (tm + tn) * (tk as u64 + 8) + 4 * (sm * sn * mat * mat) as u64)
}

fn coop16_shared(_: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    mma_shared(params, 16)
}

fn coop8_shared(_: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    mma_shared(params, 8)
}

fn emu_shared(_: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    mma_shared(params, param(params, "mat")?)
}

/// What the tiling needs of any adapter (both the coop shaders and the emulation).
fn check_mma(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params, mat: u32) -> Result<(), String> {
    check_blocks(prob, dtype)?;
    if !caps.shader_f16 {
        return Err("needs SHADER_F16 (f16 tiles in workgroup memory), which this adapter lacks".into());
    }
    let (sm, sn, mm, mn, tk) = mma_tiling(params)?;
    if mm > 4 || mm * mn > 8 {
        return Err(format!("{mm}x{mn} matrices per subgroup exceed the shader's 4 A matrices and 8 accumulators"));
    }
    if tk % 32 != 0 || tk % mat != 0 {
        return Err(format!("tile_k = {tk} is not a whole number of 32-element block chunks and of {mat}-deep matrices"));
    }
    if let Problem::Gemm { m, n, .. } = *prob {
        grid_dim(caps, groups(n, sn * mn * mat) as usize, "n")?;
        grid_dim(caps, groups(m, sm * mm * mat) as usize, "m")?;
    }
    Ok(())
}

fn check_coop(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params, mat: u32) -> Result<(), String> {
    caps.coop_f16_f32(mat)?;
    if caps.subgroup_min_size != MMA_LANES || caps.subgroup_max_size != MMA_LANES {
        return Err(format!(
            "the matrix tiling needs subgroups of exactly {MMA_LANES} invocations; the adapter's are {}..{}",
            caps.subgroup_min_size, caps.subgroup_max_size
        ));
    }
    check_mma(caps, prob, dtype, params, mat)
}

fn check_coop16(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    check_coop(caps, prob, dtype, params, 16)
}

fn check_coop8(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    check_coop(caps, prob, dtype, params, 8)
}

fn check_emu(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    let mat = param(params, "mat")?;
    let (_, _, mm, mn, _) = mma_tiling(params)?;
    if mm * mn * mat * mat / MMA_LANES > 64 {
        return Err(format!("{mm}x{mn} matrices of {mat}x{mat} need more than the shader's 64 accumulators per invocation"));
    }
    check_mma(caps, prob, dtype, params, mat)
}

/// One prepare for the coop shaders and the emulation (which alone takes `MAT` as
/// an override; the coop shaders fix it with their matrix type).
fn prepare_mma(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let Problem::Gemm { m, n, k } = *s.problem else { return Err(wrong_op(s.kernel, s.problem)) };
    let (sm, sn, mm, mn, tk) = mma_tiling(s.params)?;
    let shader = s.shader();
    let (mat, emu) = match shader.name {
        n if n == QGEMM_COOP16.name => (16, false),
        n if n == QGEMM_COOP8.name => (8, false),
        _ => (s.param("mat")?, true),
    };
    let [wgs, _, _] = mma_wg(s.params)?;
    let mut consts = vec![
        ("SG_M", sm as f64),
        ("SG_N", sn as f64),
        ("MAT_M", mm as f64),
        ("MAT_N", mn as f64),
        ("TILE_K", tk as f64),
        ("WGS", wgs as f64),
        ("QFMT", qfmt(s.dtype)),
    ];
    if emu {
        consts.push(("MAT", mat as f64));
    }
    let grid = [groups(n, sn * mn * mat).max(1), groups(m, sm * mm * mat).max(1), 1];
    one_q_step(s, 1, &consts, &[m as u32, n as u32, k as u32], grid)
}

fn run_gemm_rows(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::Gemm { m, n, k } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let (x, w) = (a.ins[0].f32(), qin(kd.id, &a.ins[1])?);
    let grain = (param(params, "rows_per_task")? as usize).max(1);
    let tile = param(params, "tokens_per_tile")? as usize;
    let parts = par_row_blocks(n, grain, |r0, count| rows_times_tokens(isa, x, m, k, w, r0, count, tile));
    scatter_row_blocks(parts, m, n, &mut a.outs[0][..m * n]);
    Ok(())
}

fn run_gemm_i8(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::Gemm { m, n, k } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let (x, w) = (a.ins[0].f32(), qin(kd.id, &a.ins[1])?);
    let xp = XPanel::quantize(&x[..m * k], m, k);
    let grain = (param(params, "rows_per_task")? as usize).max(1);
    let parts = par_row_blocks(n, grain, |r0, count| rows_times_tokens_i8(isa, &xp, w, r0, count));
    scatter_row_blocks(parts, m, n, &mut a.outs[0][..m * n]);
    Ok(())
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

pub fn variants() -> Vec<KernelDef> {
    vec![
        KernelDef::new(
            "gemm_q_tiled",
            Op::Gemm,
            DType::QUANT,
            TILED_PARAMS,
            "tile_k of w dequantized into workgroup memory with the x tile (vec4 rows, padded to an odd stride), optionally double-buffered; reg_m x reg_n register blocks",
            WgslImpl::new(&QGEMM_TILED, prepare_tiled).workgroup(tiled_wg).shared(tiled_shared).check(check_tiled),
        ),
        KernelDef::new(
            "gemm_q_coop16",
            Op::Gemm,
            DType::QUANT,
            COOP_PARAMS,
            "16x16x16 cooperative matrices (matrix units): x and dequantized w as f16 tiles in workgroup memory, f32 accumulators; \
             sg_m x sg_n subgroups of mat_m x mat_n matrices",
            WgslImpl::new(&QGEMM_COOP16, prepare_mma).workgroup(mma_wg).shared(coop16_shared).subgroups().check(check_coop16),
        ),
        KernelDef::new(
            "gemm_q_coop8",
            Op::Gemm,
            DType::QUANT,
            COOP_PARAMS,
            "8x8x8 cooperative matrices (matrix units): x and dequantized w as f16 tiles in workgroup memory, f32 accumulators; \
             sg_m x sg_n subgroups of mat_m x mat_n matrices",
            WgslImpl::new(&QGEMM_COOP8, prepare_mma).workgroup(mma_wg).shared(coop8_shared).subgroups().check(check_coop8),
        ),
        KernelDef::new(
            "gemm_q_mma_emu",
            Op::Gemm,
            DType::QUANT,
            EMU_PARAMS,
            "the tiling of gemm_q_coop8/16 (same f16 tiles, matrix bases and result slots) with the matrix operations as plain loops \
             over 32-invocation groups",
            WgslImpl::new(&QGEMM_MMA_EMU, prepare_mma).workgroup(mma_wg).shared(emu_shared).check(check_emu),
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
            "activations quantized to int8 blocks once; weight rows interleaved 16 to a vector per task; VNNI tiles of 32 rows x 4 tokens",
            CpuImpl { run: run_gemm_i8, check: check_i8_gemm },
        ),
        KernelDef::new(
            "gemm_q_panel_cpu",
            Op::Gemm,
            DType::QUANT,
            CPU_PANEL_PARAMS,
            "nc weight rows dequantized into an f32 panel, then the cache-blocked f32 GEMM microkernel",
            CpuImpl { run: run_gemm_panel, check: check_quant },
        ),
    ]
}

#[cfg(test)]
mod tests {
    use crate::device::{CoopShape, GpuCaps};
    use crate::kernels::{Caps, DType, Params, Problem, find};

    fn with(id: &str, kv: &[(&str, u32)]) -> Params {
        let mut p = find(id).expect("registered").default_params();
        for &(name, v) in kv {
            p.insert(name.to_string(), v);
        }
        p
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
        let shape = |m, ab, cr| CoopShape { m, n: m, k: m, ab, cr };
        GpuCaps {
            subgroup_min_size: 32,
            subgroup_max_size: 32,
            max_workgroup_storage: 49152,
            max_invocations_per_workgroup: 1024,
            max_workgroup_size: [1024, 1024, 64],
            coop_matrix: vec![shape(16, "f16", "f32"), shape(16, "f16", "f16"), shape(8, "f32", "f32")],
            ..crate::testing::typical_gpu_caps()
        }
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
    }
}
