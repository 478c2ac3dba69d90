//! The matrix-tile GEMMs (issue 17, "GEMM on matrix units"): one tiling
//! (`shaders/mma.wgsl`) for the prefill GEMM over block-format weights
//! (`gemm_q_*`), over float weights (`gemm_*`), and the fused gate/up projection over
//! either (`gate_up_q_*`, `gate_up_*`: the gate and up matrices multiplied with the
//! same x tile, the gated activation in the epilogue).
//!
//! Each comes as `_coop16` / `_coop8` (wgpu's experimental cooperative matrices: x
//! and the weights as f16 tiles in workgroup memory, f32 accumulators, a tiling of
//! subgroups x matrices per subgroup; valid only where the adapter reports that
//! square f16 -> f32 shape, see [`GpuCaps::coop_f16_f32`]) and `_mma_emu` (the same
//! tiling with the matrix operations as plain loops: how the coop tiling runs and is
//! tested on adapters without matrix units). The weight staging is the format's:
//! `mma_q.wgsl` (ggml blocks dequantized) or `mma_f.wgsl` (f32 or packed f16 words).
//! The families register these variants from their own `variants()`.

use crate::device::GpuCaps;
use crate::gpu::{GpuProgram, Shader, groups};
use crate::kernels::contract::check_blocks;
use crate::kernels::contract::{KernelDef, KernelError, ParamSpec, Params, WgslImpl, WgslSetup, param, wrong_op};
use crate::kernels::problem::{Op, Problem};
use crate::kernels::quant::DType;
use crate::kernels::wgsl::{grid_dim, one_q_step, qfmt, vec_alignment};
use crate::shader;

static QGEMM_COOP16: Shader = shader!(head "coop.wgsl", "coop16.wgsl", "mma_tiling.wgsl"; "qgemm_mma.wgsl", "mma_coop.wgsl", "mma.wgsl", "mma_q.wgsl", "qblock.wgsl", "qgeom.wgsl", "act.wgsl");
static QGEMM_COOP8: Shader = shader!(head "coop.wgsl", "coop8.wgsl", "mma_tiling.wgsl"; "qgemm_mma.wgsl", "mma_coop.wgsl", "mma.wgsl", "mma_q.wgsl", "qblock.wgsl", "qgeom.wgsl", "act.wgsl");
static QGEMM_MMA_EMU: Shader = shader!(head "coop_emu.wgsl", "mma_tiling.wgsl"; "qgemm_mma.wgsl", "mma_emu.wgsl", "mma.wgsl", "mma_q.wgsl", "qblock.wgsl", "qgeom.wgsl", "act.wgsl");
static GEMM_COOP16: Shader = shader!(head "coop.wgsl", "coop16.wgsl", "mma_tiling.wgsl"; "gemm_mma.wgsl", "mma_coop.wgsl", "mma.wgsl", "mma_f.wgsl", "wload.wgsl", "act.wgsl");
static GEMM_COOP8: Shader = shader!(head "coop.wgsl", "coop8.wgsl", "mma_tiling.wgsl"; "gemm_mma.wgsl", "mma_coop.wgsl", "mma.wgsl", "mma_f.wgsl", "wload.wgsl", "act.wgsl");
static GEMM_MMA_EMU: Shader =
    shader!(head "coop_emu.wgsl", "mma_tiling.wgsl"; "gemm_mma.wgsl", "mma_emu.wgsl", "mma.wgsl", "mma_f.wgsl", "wload.wgsl", "act.wgsl");

const SG_M: ParamSpec = ParamSpec { name: "sg_m", values: &[1, 2, 4], default: 2, help: "subgroups per workgroup along m" };
const SG_N: ParamSpec = ParamSpec { name: "sg_n", values: &[1, 2, 4], default: 2, help: "subgroups per workgroup along n" };
const MAT_M: ParamSpec = ParamSpec { name: "mat_m", values: &[1, 2, 4], default: 2, help: "matrices per subgroup along m" };
const MAT_N: ParamSpec = ParamSpec { name: "mat_n", values: &[1, 2, 4], default: 2, help: "matrices per subgroup along n" };
/// gate_up keeps a gate and an up accumulator per matrix: one of each by default
/// (so the default tiling fits 16 KiB of workgroup memory).
const GU_MAT_M: ParamSpec = ParamSpec { default: 1, ..MAT_M };
const GU_MAT_N: ParamSpec =
    ParamSpec { name: "mat_n", values: &[1, 2, 4], default: 1, help: "matrices per subgroup along n (each a gate and an up matrix)" };
const TILE_K: ParamSpec = ParamSpec {
    name: "tile_k",
    values: &[32, 64],
    default: 32,
    help: "depth staged in workgroup memory per step (whole 32-element chunks)",
};
const STAGES: ParamSpec = ParamSpec {
    name: "stages",
    values: &[1, 2],
    default: 1,
    help: "tile buffers in workgroup memory: 2 puts the next step's loads in flight during the matrix work (one barrier a step)",
};
const MAT: ParamSpec =
    ParamSpec { name: "mat", values: &[8, 16], default: 16, help: "side of the emulated square matrices (8x8x8 or 16x16x16)" };
/// Marks the f16 rounding of the activations (the matrix units' input type), which
/// the parity check judges with the f16-activation tolerance.
const ACT_F16: ParamSpec =
    ParamSpec { name: "act_bits", values: &[16], default: 16, help: "activations rounded to f16 in workgroup memory (matrix input type)" };
/// Float weights: x and f32 weights rounded to f16 (f16 weights are copied).
const ACT_F16_FLOAT: ParamSpec =
    ParamSpec { help: "activations (and f32 weights) rounded to f16 in workgroup memory (matrix input type)", ..ACT_F16 };

const COOP_PARAMS: &[ParamSpec] = &[SG_M, SG_N, MAT_M, MAT_N, TILE_K, STAGES, ACT_F16];
const EMU_PARAMS: &[ParamSpec] = &[MAT, SG_M, SG_N, MAT_M, MAT_N, TILE_K, STAGES, ACT_F16];
const F_COOP_PARAMS: &[ParamSpec] = &[SG_M, SG_N, MAT_M, MAT_N, TILE_K, STAGES, ACT_F16_FLOAT];
const F_EMU_PARAMS: &[ParamSpec] = &[MAT, SG_M, SG_N, MAT_M, MAT_N, TILE_K, STAGES, ACT_F16_FLOAT];
const GU_COOP_PARAMS: &[ParamSpec] = &[SG_M, SG_N, GU_MAT_M, GU_MAT_N, TILE_K, STAGES, ACT_F16];
const GU_EMU_PARAMS: &[ParamSpec] = &[MAT, SG_M, SG_N, GU_MAT_M, GU_MAT_N, TILE_K, STAGES, ACT_F16];
const GU_F_COOP_PARAMS: &[ParamSpec] = &[SG_M, SG_N, GU_MAT_M, GU_MAT_N, TILE_K, STAGES, ACT_F16_FLOAT];
const GU_F_EMU_PARAMS: &[ParamSpec] = &[MAT, SG_M, SG_N, GU_MAT_M, GU_MAT_N, TILE_K, STAGES, ACT_F16_FLOAT];

/// Lanes of a subgroup in the matrix tiling (the coop shaders need subgroups of
/// exactly this size; the emulation groups invocations by it).
const MMA_LANES: u32 = 32;

/// The matrix tiling of a variant: (subgroups along m, along n, matrices per
/// subgroup along m, along n, tile_k).
fn mma_tiling(params: &Params) -> Result<(u32, u32, u32, u32, u32), KernelError> {
    Ok((param(params, "sg_m")?, param(params, "sg_n")?, param(params, "mat_m")?, param(params, "mat_n")?, param(params, "tile_k")?))
}

/// The problem as the shaders see it: (m, n, k, activation code, weight matrices).
fn mma_dims(prob: &Problem) -> Option<(usize, usize, usize, u32, u32)> {
    match *prob {
        Problem::Gemm { m, n, k } => Some((m, n, k, 0, 1)),
        Problem::GateUp { rows, n, k, act } => Some((rows, n, k, act.code(), 2)),
        _ => None,
    }
}

/// Weight matrices multiplied with each x tile (1 gemm, 2 gate_up).
fn w_mats(prob: &Problem) -> u32 {
    mma_dims(prob).map_or(1, |d| d.4)
}

fn mma_wg(params: &Params) -> Result<[u32; 3], KernelError> {
    let (sm, sn, ..) = mma_tiling(params)?;
    Ok([sm * sn * MMA_LANES, 1, 1])
}

/// f16 x and w tiles (rows of tile_k + 8 halves; `mats` weight tiles), `stages` of
/// each, and one f32 result matrix per subgroup and weight matrix.
fn mma_shared(prob: &Problem, params: &Params, mat: u32) -> Result<u64, KernelError> {
    let (sm, sn, mm, mn, tk) = mma_tiling(params)?;
    let stages = param(params, "stages")? as u64;
    let mats = w_mats(prob) as u64;
    let (tm, tn) = ((sm * mm * mat) as u64, (sn * mn * mat) as u64);
    Ok(2 * stages * (tm + mats * tn) * (tk as u64 + 8) + 4 * mats * (sm * sn * mat * mat) as u64)
}

/// Registers of one batch of staging slots (the shaders' `PRE`).
const PRE_SLOTS: u32 = 8;

/// Staging slots per invocation and step (`x_slots()`, `w_slots()` of mma.wgsl and
/// mma_q / mma_f.wgsl): 16-byte words of x, and weight words (float) or block units
/// within a 32-element chunk (block formats).
fn staging_slots(dtype: DType, params: &Params, mats: u32, mat: u32) -> Result<(u32, u32), KernelError> {
    let (sm, sn, mm, mn, tk) = mma_tiling(params)?;
    let wgs = sm * sn * MMA_LANES;
    let (tm, tn) = (sm * mm * mat, sn * mn * mat);
    let x = (tm * tk / 4).div_ceil(wgs);
    let w = match dtype.quant() {
        // units of a block per 32-element chunk (qblock.wgsl's qchunk): 4 values each
        // for q8_0 and the K-quants but iq4_xs, 8 for the others
        Some(f) => {
            use crate::kernels::quant::QFormat as Q;
            let units = if matches!(f, Q::Q8_0 | Q::Q2_K | Q::Q3_K | Q::Q4_K | Q::Q5_K | Q::Q6_K) { 8 } else { 4 };
            mats * (tk / 32) * (tn * units).div_ceil(wgs)
        }
        None => mats * (tn * tk / if dtype == DType::F16 { 8 } else { 4 }).div_ceil(wgs),
    };
    Ok((x, w))
}

fn coop16_shared(prob: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    mma_shared(prob, params, 16)
}

fn coop8_shared(prob: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    mma_shared(prob, params, 8)
}

fn emu_shared(prob: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    mma_shared(prob, params, param(params, "mat")?)
}

/// What the tiling needs of any adapter (both the coop shaders and the emulation).
fn check_mma(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params, mat: u32) -> Result<(), String> {
    if dtype.is_quant() {
        check_blocks(prob, dtype)?;
    }
    if !caps.shader_f16 {
        return Err("needs SHADER_F16 (f16 tiles in workgroup memory), which this adapter lacks".into());
    }
    let (sm, sn, mm, mn, tk) = mma_tiling(params)?;
    let mats = w_mats(prob);
    if mm > 4 || mats * mm * mn > 8 {
        return Err(format!(
            "{mm}x{mn} matrices per subgroup (x{mats} weight matrices) exceed the shader's 4 A matrices and 8 accumulators"
        ));
    }
    if tk % 32 != 0 || tk % mat != 0 {
        return Err(format!("tile_k = {tk} is not a whole number of 32-element chunks and of {mat}-deep matrices"));
    }
    if param(params, "stages").map_err(|e| e.to_string())? == 2 {
        let (x, w) = staging_slots(dtype, params, mats, mat).map_err(|e| e.to_string())?;
        if x.max(w) > PRE_SLOTS {
            return Err(format!(
                "stages = 2 holds a step's loads in {PRE_SLOTS} registers per invocation; this tiling needs {x} for x and {w} for the \
                 weights (use fewer matrices per subgroup, more subgroups, or tile_k 32)"
            ));
        }
    }
    if let Some((m, n, k, _, _)) = mma_dims(prob) {
        if !dtype.is_quant() {
            vec_alignment(k, dtype)?;
        }
        if matches!(prob, Problem::GateUp { .. }) && m < 2 {
            return Err("a prefill GEMM (its tiles waste all but one row on one token); decode uses a gate_up GEMV".into());
        }
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
    let mats = w_mats(prob);
    if mats * mm * mn * mat * mat / MMA_LANES > 64 {
        return Err(format!(
            "{mm}x{mn} matrices of {mat}x{mat} (x{mats} weight matrices) need more than the shader's 64 accumulators per invocation"
        ));
    }
    check_mma(caps, prob, dtype, params, mat)
}

/// The matrix side a shader fixes with its matrix type (none: the emulation, which
/// takes `MAT` as an override).
fn coop_side(shader: &Shader) -> Option<u32> {
    [(&QGEMM_COOP16, 16), (&QGEMM_COOP8, 8), (&GEMM_COOP16, 16), (&GEMM_COOP8, 8)]
        .into_iter()
        .find(|(s, _)| std::ptr::eq(*s, shader))
        .map(|(_, m)| m)
}

/// One prepare for every variant: gemm or gate_up, float or block-format weights,
/// coop shaders or the emulation.
fn prepare_mma(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (m, n, k, act, mats) = mma_dims(s.problem).ok_or_else(|| wrong_op(s.kernel, s.problem))?;
    let (sm, sn, mm, mn, tk) = mma_tiling(s.params)?;
    let coop = coop_side(s.shader());
    let mat = match coop {
        Some(side) => side,
        None => s.param("mat")?,
    };
    let [wgs, _, _] = mma_wg(s.params)?;
    let mut consts = vec![
        ("SG_M", sm as f64),
        ("SG_N", sn as f64),
        ("MAT_M", mm as f64),
        ("MAT_N", mn as f64),
        ("TILE_K", tk as f64),
        ("STAGES", s.param("stages")? as f64),
        ("W_MATS", mats as f64),
        ("WGS", wgs as f64),
    ];
    if coop.is_none() {
        consts.push(("MAT", mat as f64));
    }
    let uniform = [m as u32, n as u32, k as u32, act];
    let grid = [groups(n, sn * mn * mat).max(1), groups(m, sm * mm * mat).max(1), 1];
    if s.dtype.is_quant() {
        consts.push(("QFMT", qfmt(s.dtype)));
        one_q_step(s, 1, &consts, &uniform, grid)
    } else {
        consts.push(("W_F16", s.w_f16()));
        s.one_step("main", &consts, &uniform, grid)
    }
}

fn coop16(shader: &'static Shader) -> WgslImpl {
    WgslImpl::new(shader, prepare_mma).workgroup(mma_wg).shared(coop16_shared).subgroups().check(check_coop16)
}

fn coop8(shader: &'static Shader) -> WgslImpl {
    WgslImpl::new(shader, prepare_mma).workgroup(mma_wg).shared(coop8_shared).subgroups().check(check_coop8)
}

fn emu(shader: &'static Shader) -> WgslImpl {
    WgslImpl::new(shader, prepare_mma).workgroup(mma_wg).shared(emu_shared).check(check_emu)
}

/// The three variants of one tiling: on 16x16x16 and 8x8x8 cooperative matrices
/// (`<id>_coop16`, `<id>_coop8`) and emulated (`<id>_mma_emu`); `$tiles` says what
/// the workgroup stages and accumulates.
macro_rules! mma_trio {
    ($id:literal, $op:expr, $dtype:expr, $coop_params:expr, $emu_params:expr, $tiles:literal, [$c16:expr, $c8:expr, $emu:expr]) => {{
        let def = |id, params, summary, wgsl| KernelDef::new(id, $op, $dtype, params, summary, wgsl);
        [
            def(concat!($id, "_coop16"), $coop_params, concat!("16x16x16 cooperative matrices (matrix units): ", $tiles), coop16($c16)),
            def(concat!($id, "_coop8"), $coop_params, concat!("8x8x8 cooperative matrices (matrix units): ", $tiles), coop8($c8)),
            def(
                concat!($id, "_mma_emu"),
                $emu_params,
                concat!("the tiling of ", $id, "_coop8/16 with the matrix operations as plain loops over 32-invocation groups"),
                emu($emu),
            ),
        ]
    }};
}

/// The block-format GEMMs (registered by [`super::quant::variants`]).
pub fn gemm_q_variants() -> Vec<KernelDef> {
    mma_trio!(
        "gemm_q",
        Op::Gemm,
        DType::QUANT,
        COOP_PARAMS,
        EMU_PARAMS,
        "x and dequantized w as f16 tiles in workgroup memory, f32 accumulators; sg_m x sg_n subgroups of mat_m x mat_n matrices",
        [&QGEMM_COOP16, &QGEMM_COOP8, &QGEMM_MMA_EMU]
    )
    .into()
}

/// The float GEMMs (registered by [`super::variants`]).
pub fn gemm_variants() -> Vec<KernelDef> {
    mma_trio!(
        "gemm",
        Op::Gemm,
        DType::FLOAT,
        F_COOP_PARAMS,
        F_EMU_PARAMS,
        "x and w as f16 tiles in workgroup memory, f32 accumulators; sg_m x sg_n subgroups of mat_m x mat_n matrices",
        [&GEMM_COOP16, &GEMM_COOP8, &GEMM_MMA_EMU]
    )
    .into()
}

/// The fused gate/up prefill GEMMs, block-format and float (registered by
/// [`crate::kernels::matvec::gate_up::variants`]).
pub fn gate_up_variants() -> Vec<KernelDef> {
    let quant = mma_trio!(
        "gate_up_q",
        Op::GateUp,
        DType::QUANT,
        GU_COOP_PARAMS,
        GU_EMU_PARAMS,
        "prefill with x and the dequantized gate and up rows as f16 tiles, a gate and an up accumulator per matrix, \
         act(gate)·up on the way out",
        [&QGEMM_COOP16, &QGEMM_COOP8, &QGEMM_MMA_EMU]
    );
    let float = mma_trio!(
        "gate_up",
        Op::GateUp,
        DType::FLOAT,
        GU_F_COOP_PARAMS,
        GU_F_EMU_PARAMS,
        "prefill with x and the gate and up rows as f16 tiles, a gate and an up accumulator per matrix, act(gate)·up on \
         the way out",
        [&GEMM_COOP16, &GEMM_COOP8, &GEMM_MMA_EMU]
    );
    quant.into_iter().chain(float).collect()
}

#[cfg(test)]
mod tests {
    use crate::device::{Caps, GpuCaps};
    use crate::kernels::contract::Params;
    use crate::kernels::find;
    use crate::kernels::problem::{Activation, Problem};
    use crate::kernels::quant::DType;

    fn with(id: &str, kv: &[(&str, u32)]) -> Params {
        find(id).expect("registered").params_with(kv)
    }

    fn check(id: &str, prob: &Problem, dtype: DType, params: &Params, caps: &GpuCaps) -> Result<(), String> {
        find(id).expect("registered").check(Caps::Gpu(caps), prob, dtype, params)
    }

    fn coop_caps() -> GpuCaps {
        crate::testing::coop_gpu_caps(&[(16, "f16", "f32"), (8, "f16", "f32")])
    }

    const GU: Problem = Problem::GateUp { rows: 9, n: 70, k: 64, act: Activation::GeluTanh };
    const GEMM: Problem = Problem::Gemm { m: 70, n: 96, k: 128 };

    #[test]
    fn float_and_gate_up_variants_give_reasons() {
        let c = coop_caps();
        let plain = crate::testing::typical_gpu_caps();
        for (id, prob, dt) in [
            ("gemm_coop16", GEMM, DType::F16),
            ("gemm_coop8", GEMM, DType::F32),
            ("gate_up_coop16", GU, DType::F32),
            ("gate_up_q_coop8", GU, DType::Q8_0),
        ] {
            let r = check(id, &prob, dt, &with(id, &[]), &plain).expect_err("no matrix units");
            assert!(r.contains("no cooperative matrices"), "{id}: {r}");
            assert!(check(id, &prob, dt, &with(id, &[]), &c).is_ok(), "{id}");
        }
        // f16 weights need k a multiple of 8 (16-byte words)
        let r = check("gemm_mma_emu", &Problem::Gemm { m: 9, n: 16, k: 36 }, DType::F16, &with("gemm_mma_emu", &[]), &plain).unwrap_err();
        assert!(r.contains("multiple of 8"), "{r}");
        assert!(check("gemm_mma_emu", &Problem::Gemm { m: 9, n: 16, k: 36 }, DType::F32, &with("gemm_mma_emu", &[]), &plain).is_ok());
        // gate_up holds two accumulators per matrix: 2x4 matrices are 16 of them
        let r = check("gate_up_coop16", &GU, DType::F32, &with("gate_up_coop16", &[("mat_m", 2), ("mat_n", 4)]), &c).unwrap_err();
        assert!(r.contains("8 accumulators"), "{r}");
        // 2x2 matrices of 16 for gate and up: 2·2·2·256/32 = 64 accumulators fit; 4x2 do not
        assert!(check("gate_up_mma_emu", &GU, DType::F32, &with("gate_up_mma_emu", &[("mat_m", 2), ("mat_n", 2)]), &c).is_ok());
        let r = check("gate_up_mma_emu", &GU, DType::F32, &with("gate_up_mma_emu", &[("mat_m", 4), ("mat_n", 2)]), &c).unwrap_err();
        assert!(r.contains("64 accumulators") || r.contains("8 accumulators"), "{r}");
        // two tile buffers: the default tiling's step fits the registers; 4 A
        // matrices over one subgroup column (16 x words an invocation) do not
        assert!(check("gemm_q_coop16", &GEMM, DType::Q8_0, &with("gemm_q_coop16", &[("stages", 2)]), &c).is_ok());
        let deep = [("mat_m", 4), ("sg_n", 1)];
        assert!(check("gemm_q_coop16", &GEMM, DType::Q8_0, &with("gemm_q_coop16", &deep), &c).is_ok());
        let r = check("gemm_q_coop16", &GEMM, DType::Q8_0, &with("gemm_q_coop16", &[deep[0], deep[1], ("stages", 2)]), &c).unwrap_err();
        assert!(r.contains("registers") && r.contains("16 for x"), "{r}");
        // one token is a GEMV's work
        let one = Problem::GateUp { rows: 1, n: 70, k: 64, act: Activation::Silu };
        let r = check("gate_up_q_mma_emu", &one, DType::Q8_0, &with("gate_up_q_mma_emu", &[]), &plain).unwrap_err();
        assert!(r.contains("GEMV"), "{r}");
        // the default gate_up tiling fits 16 KiB; gate and up tiles of 2x2 matrices do not
        assert!(check("gate_up_q_mma_emu", &GU, DType::Q8_0, &with("gate_up_q_mma_emu", &[]), &plain).is_ok());
        let r =
            check("gate_up_q_mma_emu", &GU, DType::Q8_0, &with("gate_up_q_mma_emu", &[("mat_m", 2), ("mat_n", 2)]), &plain).unwrap_err();
        assert!(r.contains("workgroup memory"), "{r}");
    }
}
