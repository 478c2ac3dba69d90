//! The mixture-of-experts family (Qwen3-MoE, OLMoE): the router's choice and the
//! experts' projections. Between them flows one float buffer, the dense route
//! `[rows, experts]` (a token's top-k softmax weights, zero elsewhere): its nonzero
//! entries are the token's experts, in ascending order its slots, so no integer
//! buffer and no host round trip sits between the router and the experts, and a
//! decode step's experts are chosen on the device.
//!
//! Ops: [`Op::MoeRoute`] (softmax, top-k, optional renormalisation), [`Op::MoeGateUp`]
//! (each slot's gate and up projections with the activation product) and
//! [`Op::MoeDown`] (each slot's down projection, weighted by its route and summed).
//! The expert weights are one matrix of every expert's rows (the GGUF's 3-D
//! tensors as they lie; gate then up for `MoeGateUp`), in any storage format.
//!
//! WGSL: `moe_route_thread` (an invocation per token) and `moe_route_wg` (a
//! workgroup per token), `moe_gate_up_wg` / `moe_gate_up_q_wg` and `moe_down_wg` /
//! `moe_down_q_wg` (float / block-format weights: the gathered expert GEMV, a
//! workgroup per ROWS features of a slot or token reading only its expert's rows;
//! decode's form), and the grouped forms (prefill's) `moe_gate_up_grouped_wg` /
//! `_q_wg` and `moe_down_grouped_wg` / `_q_wg`: a workgroup per ROWS features of an
//! expert walks the tokens routed to it TT at a time, each unit of the expert's rows
//! decoded once for the tile (the down projection in two passes: the weighted
//! products into the slots, then a token's slots summed, as no float atomics add
//! into a token's row).
//! CPU: `moe_route_cpu` / `moe_route_passes_cpu`; `moe_gate_up_cpu` and
//! `moe_down_cpu` (gathered: block or float row dots of each slot's expert, f32 or
//! int8 activations, pool over features; decode's form); the grouped forms, the
//! tokens sorted by expert and gathered (prefill's): `_grouped_i8_cpu` (each
//! expert's tokens quantized to int8 once, its rows through the int8 GEMM tiles
//! straight from the blocks) and `_grouped_cpu` (its rows dequantized into f32
//! panels for the blocked f32 GEMM; any storage type, exact).

use std::cell::RefCell;

use smallvec::SmallVec;

use crate::device::CpuCaps;
use crate::device::GpuCaps;
use crate::gpu::{GpuProgram, Shader, grid_2d, groups};
use crate::kernels::contract::{
    CpuArgs, CpuImpl, CpuIn, KernelDef, KernelError, ParamSpec, Params, WgslImpl, WgslSetup, check_blocks, param, wrong_op,
};
use crate::kernels::cpu::qgemm::{I8_GEMM_PARAMS, I8Kernel, XPanel, check_i8_gemm, rows_times_tokens_i8};
use crate::kernels::cpu::{self, ACT_BITS, ActVec, ISA, Isa, ROWS_PER_TASK, Row, RowSplit, act_f32, par_rows, row};
use crate::kernels::problem::{Activation, Op, Problem};
use crate::kernels::quant::DType;
use crate::kernels::wgsl::{ROWS_WG_PARAMS, WORKGROUP_SIZE, one_q_step, qfmt, shared_rows};
use crate::shader;

static ROUTE: Shader = shader!("moe_route.wgsl");
static ROUTE_WG: Shader = shader!("moe_route_wg.wgsl", "reduce_wg.wgsl");
static GATE_UP: Shader = shader!("moe_gate_up.wgsl", "moe_wf.wgsl", "moe_slot.wgsl", "wload.wgsl", "act.wgsl", "reduce_wg.wgsl");
static GATE_UP_Q: Shader =
    shader!("moe_gate_up.wgsl", "moe_wq.wgsl", "moe_slot.wgsl", "qblock.wgsl", "qgeom.wgsl", "act.wgsl", "reduce_wg.wgsl");
static DOWN: Shader = shader!("moe_down.wgsl", "moe_wf.wgsl", "moe_slot.wgsl", "wload.wgsl", "reduce_wg.wgsl");
static DOWN_Q: Shader = shader!("moe_down.wgsl", "moe_wq.wgsl", "moe_slot.wgsl", "qblock.wgsl", "qgeom.wgsl", "reduce_wg.wgsl");
static GROUPED: Shader = shader!("moe_grouped.wgsl", "moe_wf.wgsl", "moe_tokens.wgsl", "wload.wgsl", "act.wgsl", "reduce_wg.wgsl");
static GROUPED_Q: Shader =
    shader!("moe_grouped.wgsl", "moe_wq.wgsl", "moe_tokens.wgsl", "qblock.wgsl", "qgeom.wgsl", "act.wgsl", "reduce_wg.wgsl");
/// The grouped down projection's second pass: a token's slots summed.
static DOWN_SUM: Shader = shader!("moe_down_sum.wgsl");
const DOWN_SUM_ALT: &[&Shader] = &[&DOWN_SUM];

/// The grouped WGSL kernels: workgroup size, an expert's features per workgroup,
/// its tokens per tile (ROWS x TT at most 16: the registers). Two values each:
/// every value is a parity set on lavapipe, where these kernels' sets cost the
/// most of any family's (`tests/parity.rs`'s summary).
const GROUPED_WG_PARAMS: &[ParamSpec] = &[
    ParamSpec::new("workgroup_size", &[64, 128], 64, "invocations per workgroup"),
    ParamSpec::new("rows_per_wg", &[1, 2], 2, "an expert's features per workgroup"),
    ParamSpec::new("tokens_per_tile", &[4, 8], 4, "an expert's tokens each unit of its rows is decoded once for"),
];

/// The router's CPU kernels: tokens per pool task.
const ROUTE_CPU_PARAMS: &[ParamSpec] = &[ParamSpec::new("rows_per_task", &[1, 4, 16, 64], 4, "tokens per pool task")];

/// The gathered CPU kernels: features per pool task, ISA, activations' bits (block formats).
const GATHERED_PARAMS: &[ParamSpec] = &[ROWS_PER_TASK, ISA, ACT_BITS];
/// The grouped CPU kernels: an expert's features per dequantized panel, ISA.
const GROUPED_PARAMS: &[ParamSpec] =
    &[ParamSpec::new("nc", &[32, 64, 128, 256], 128, "an expert's features dequantized into one f32 panel for the GEMM"), ISA];

pub fn variants() -> Vec<KernelDef> {
    vec![
        KernelDef::new(
            "moe_route_thread",
            Op::MoeRoute,
            &[DType::F32],
            &[WORKGROUP_SIZE],
            "an invocation per token: top_k passes over its logits in (value, index) order, no per-token memory, then the row",
            WgslImpl::new(&ROUTE, prepare_route).check(check_route_wgsl),
        ),
        KernelDef::new(
            "moe_route_wg",
            Op::MoeRoute,
            &[DType::F32],
            &[WORKGROUP_SIZE],
            "a workgroup per token: maximum and softmax sum as reductions, each of the top_k rounds two reductions (value, \
             then its lowest index)",
            WgslImpl::new(&ROUTE_WG, prepare_route_wg).shared(shared_route).check(check_route_wgsl),
        ),
        route_cpu("moe_route_cpu", "per token: softmax, the top_k by a partial selection (select_nth); pool over tokens", run_route_select),
        route_cpu(
            "moe_route_passes_cpu",
            "per token: softmax, the top_k by top_k passes over the logits (no index array; few experts a token); pool over tokens",
            run_route_passes,
        ),
        KernelDef::new(
            "moe_gate_up_wg",
            Op::MoeGateUp,
            DType::FLOAT,
            ROWS_WG_PARAMS,
            "gathered expert GEMV: a workgroup per ROWS features of a token's slot, its expert found in the route, only its \
             gate and up rows read; workgroup reduction, activation product in the epilogue",
            WgslImpl::new(&GATE_UP, prepare_experts).shared(shared_gate_up).check(check_float_wgsl),
        ),
        KernelDef::new(
            "moe_gate_up_q_wg",
            Op::MoeGateUp,
            DType::QUANT,
            ROWS_WG_PARAMS,
            "gathered expert GEMV over block-format experts dequantized in registers: a workgroup per ROWS features of a \
             token's slot; workgroup reduction, activation product in the epilogue",
            WgslImpl::new(&GATE_UP_Q, prepare_experts).shared(shared_gate_up).check(check_q_wgsl),
        ),
        KernelDef::new(
            "moe_down_wg",
            Op::MoeDown,
            DType::FLOAT,
            ROWS_WG_PARAMS,
            "gathered expert GEMV: a workgroup per ROWS features of a token, every slot's expert rows weighted by its route \
             into the same registers, one workgroup reduction",
            WgslImpl::new(&DOWN, prepare_experts).shared(shared_rows).check(check_float_wgsl),
        ),
        KernelDef::new(
            "moe_down_q_wg",
            Op::MoeDown,
            DType::QUANT,
            ROWS_WG_PARAMS,
            "gathered expert GEMV over block-format experts dequantized in registers: a workgroup per ROWS features of a \
             token, its slots weighted by their routes, one workgroup reduction",
            WgslImpl::new(&DOWN_Q, prepare_experts).shared(shared_rows).check(check_q_wgsl),
        ),
        KernelDef::new(
            "moe_gate_up_grouped_wg",
            Op::MoeGateUp,
            DType::FLOAT,
            GROUPED_WG_PARAMS,
            "grouped (prefill): a workgroup per ROWS features of an expert, its tokens found in the route TT at a time, each \
             unit of its gate and up rows read once for the tile's tokens; workgroup reduction, activation product",
            WgslImpl::new(&GROUPED, prepare_grouped).shared(shared_grouped).check(check_grouped_float_wgsl),
        ),
        KernelDef::new(
            "moe_gate_up_grouped_q_wg",
            Op::MoeGateUp,
            DType::QUANT,
            GROUPED_WG_PARAMS,
            "grouped (prefill) over block-format experts: a workgroup per ROWS features of an expert, its tokens TT at a \
             time, each unit of its gate and up rows decoded once for the tile's tokens; workgroup reduction, activation product",
            WgslImpl::new(&GROUPED_Q, prepare_grouped).shared(shared_grouped).check(check_grouped_q_wgsl),
        ),
        KernelDef::new(
            "moe_down_grouped_wg",
            Op::MoeDown,
            DType::FLOAT,
            GROUPED_WG_PARAMS,
            "grouped (prefill), two passes: a workgroup per ROWS features of an expert, its tokens TT at a time, each unit \
             of its rows read once for the tile, the route-weighted products into the slots; then a token's slots summed",
            WgslImpl::new(&GROUPED, prepare_grouped).shared(shared_grouped).check(check_grouped_float_wgsl).alt_shaders(DOWN_SUM_ALT),
        ),
        KernelDef::new(
            "moe_down_grouped_q_wg",
            Op::MoeDown,
            DType::QUANT,
            GROUPED_WG_PARAMS,
            "grouped (prefill), two passes, block-format experts: each unit of an expert's rows decoded once for TT of its \
             tokens, the route-weighted products into the slots; then a token's slots summed",
            WgslImpl::new(&GROUPED_Q, prepare_grouped).shared(shared_grouped).check(check_grouped_q_wgsl).alt_shaders(DOWN_SUM_ALT),
        ),
        KernelDef::new(
            "moe_gate_up_cpu",
            Op::MoeGateUp,
            &DType::ALL,
            GATHERED_PARAMS,
            "gathered (decode): each slot's gate and up rows of its expert, block or float row dots, f32 or int8 \
             activations; pool over the slots' features",
            CpuImpl { run: run_gate_up, check: check_gathered },
        ),
        KernelDef::new(
            "moe_down_cpu",
            Op::MoeDown,
            &DType::ALL,
            GATHERED_PARAMS,
            "gathered (decode): each token's features over its slots' expert rows, weighted by the route; pool over features",
            CpuImpl { run: run_down, check: check_gathered },
        ),
        KernelDef::new(
            "moe_gate_up_grouped_cpu",
            Op::MoeGateUp,
            &DType::ALL,
            GROUPED_PARAMS,
            "grouped (prefill): the tokens sorted by expert and gathered, each expert's gate and up rows dequantized once \
             into f32 panels and multiplied by its tokens through the cache-blocked f32 GEMM, activation product on the way out",
            CpuImpl { run: run_gate_up_grouped, check: check_grouped },
        ),
        KernelDef::new(
            "moe_gate_up_grouped_i8_cpu",
            Op::MoeGateUp,
            DType::QUANT,
            I8_GEMM_PARAMS,
            "grouped (prefill), int8: the tokens sorted by expert, each expert's tokens quantized to int8 blocks once and its \
             gate and up rows through the VNNI tiles of the int8 GEMM straight from the blocks (each expert's weights read \
             once for all of its tokens, none dequantized); activation product on the way out",
            CpuImpl { run: run_gate_up_grouped_i8, check: check_grouped_i8 },
        ),
        KernelDef::new(
            "moe_down_grouped_i8_cpu",
            Op::MoeDown,
            DType::QUANT,
            I8_GEMM_PARAMS,
            "grouped (prefill), int8: the tokens sorted by expert, each expert's tokens quantized to int8 blocks once and its \
             down rows through the VNNI tiles of the int8 GEMM, each weighted into its token's sum",
            CpuImpl { run: run_down_grouped_i8, check: check_grouped_i8 },
        ),
        KernelDef::new(
            "moe_down_grouped_cpu",
            Op::MoeDown,
            &DType::ALL,
            GROUPED_PARAMS,
            "grouped (prefill): the tokens sorted by expert and gathered, each expert's down rows dequantized once into f32 \
             panels and multiplied by its tokens through the cache-blocked f32 GEMM, each weighted into its token's sum",
            CpuImpl { run: run_down_grouped, check: check_grouped },
        ),
    ]
}

/// A CPU router kernel over f32 logits, pool over tokens.
fn route_cpu(id: &'static str, help: &'static str, run: crate::kernels::contract::CpuRunFn) -> KernelDef {
    KernelDef::new(id, Op::MoeRoute, &[DType::F32], ROUTE_CPU_PARAMS, help, CpuImpl { run, check: check_route_cpu })
}

/// `(rows, experts, top_k, n, k, act)` of an expert problem (`act` 0 for the down projection).
fn expert_dims(prob: &Problem) -> Option<(usize, usize, usize, usize, usize, Option<Activation>)> {
    match *prob {
        Problem::MoeGateUp { rows, experts, top_k, n, k, act } => Some((rows, experts, top_k, n, k, Some(act))),
        Problem::MoeDown { rows, experts, top_k, n, k } => Some((rows, experts, top_k, n, k, None)),
        _ => None,
    }
}

// ---- checks ----

fn check_route_cpu(_: &CpuCaps, prob: &Problem, _: DType, _: &Params) -> Result<(), String> {
    route_dims(prob)
}

fn route_dims(prob: &Problem) -> Result<(), String> {
    match *prob {
        Problem::MoeRoute { experts, top_k, .. } if top_k == 0 || top_k > experts => {
            Err(format!("top_k = {top_k} must be 1 to the {experts} experts"))
        }
        _ => Ok(()),
    }
}

fn check_route_wgsl(_: &GpuCaps, prob: &Problem, _: DType, _: &Params) -> Result<(), String> {
    route_dims(prob)
}

/// What every expert kernel needs: slots within the experts.
fn expert_rules(prob: &Problem) -> Result<(), String> {
    match expert_dims(prob) {
        Some((_, experts, top_k, ..)) if top_k == 0 || top_k > experts => {
            Err(format!("top_k = {top_k} must be 1 to the {experts} experts"))
        }
        _ => Ok(()),
    }
}

fn check_gathered(_: &CpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    Isa::param_available(param(params, "isa")?)?;
    if param(params, "act_bits")? == 8 && !dtype.is_quant() {
        return Err("int8 activations (act_bits 8) are for block-format weights".into());
    }
    if dtype.is_quant() {
        check_blocks(prob, dtype)?;
    }
    expert_rules(prob)
}

fn check_grouped_i8(caps: &CpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    check_i8_gemm(caps, prob, dtype, params)?;
    expert_rules(prob)
}

fn check_grouped(_: &CpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    Isa::param_available(param(params, "isa")?)?;
    if dtype.is_quant() {
        check_blocks(prob, dtype)?;
    }
    expert_rules(prob)
}

/// The grid's y is a token's slots (gate/up) or tokens (down); ROWS ≤ 8 (the registers).
fn grid_rules(caps: &GpuCaps, prob: &Problem, params: &Params) -> Result<(), String> {
    let Some((rows, _, top_k, ..)) = expert_dims(prob) else { return Ok(()) };
    let ys = if matches!(prob, Problem::MoeGateUp { .. }) { rows * top_k } else { rows };
    crate::kernels::wgsl::grid_dim(caps, ys, "y (tokens or their slots)")?;
    if params.get("rows_per_wg").is_some_and(|&r| r > 8) {
        return Err("rows_per_wg above 8 (the kernel's registers)".into());
    }
    expert_rules(prob)
}

/// The float interface's rule (`moe_wf.wgsl`): rows read 4 elements a unit.
fn float_units(prob: &Problem) -> Result<(), String> {
    match expert_dims(prob) {
        Some((.., k, _)) if !k.is_multiple_of(4) => Err(format!("k = {k} is not a multiple of 4 (rows are read 4 elements a unit)")),
        _ => Ok(()),
    }
}

fn check_float_wgsl(caps: &GpuCaps, prob: &Problem, _: DType, params: &Params) -> Result<(), String> {
    float_units(prob)?;
    grid_rules(caps, prob, params)
}

fn check_q_wgsl(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    check_blocks(prob, dtype)?;
    grid_rules(caps, prob, params)
}

/// The grouped kernels: grid y is the experts (and one more row of workgroups
/// for gate/up's empty slots), ROWS x TT accumulators per invocation at most 16.
fn grouped_rules(caps: &GpuCaps, prob: &Problem, params: &Params) -> Result<(), String> {
    let Some((_, experts, ..)) = expert_dims(prob) else { return Ok(()) };
    crate::kernels::wgsl::grid_dim(caps, experts + 1, "y (the experts)")?;
    let (rows, tt) = (param(params, "rows_per_wg")?, param(params, "tokens_per_tile")?);
    if rows * tt > 16 {
        return Err(format!("rows_per_wg x tokens_per_tile = {} is above 16 (the kernel's registers)", rows * tt));
    }
    expert_rules(prob)
}

fn check_grouped_float_wgsl(caps: &GpuCaps, prob: &Problem, _: DType, params: &Params) -> Result<(), String> {
    float_units(prob)?;
    grouped_rules(caps, prob, params)
}

fn check_grouped_q_wgsl(caps: &GpuCaps, prob: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
    check_blocks(prob, dtype)?;
    grouped_rules(caps, prob, params)
}

/// The grouped kernels' partials (room for a gate and an up one per feature and
/// token: the shader's one declaration), the tile's tokens and their slots, and
/// two words.
fn shared_grouped(_: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    let (wg, rows, tt) = (param(params, "workgroup_size")?, param(params, "rows_per_wg")?, param(params, "tokens_per_tile")?);
    Ok(4 * (2 * wg * rows * tt) as u64 + 8 * tt as u64 + 8)
}

/// A gate and an up partial per invocation and feature.
fn shared_gate_up(_: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    Ok(8 * param(params, "workgroup_size")? as u64 * param(params, "rows_per_wg")? as u64)
}

// ---- WGSL ----

fn route_uniform(s: &WgslSetup<'_>) -> Result<(usize, [u32; 4]), KernelError> {
    let Problem::MoeRoute { rows, experts, top_k, norm } = *s.problem else { return Err(wrong_op(s.kernel, s.problem)) };
    Ok((rows, [rows as u32, experts as u32, top_k as u32, norm as u32]))
}

fn prepare_route(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (rows, u) = route_uniform(s)?;
    let wg = s.param("workgroup_size")?;
    s.one_step("main", &[("WG", wg as f64)], &u, grid_2d(groups(rows, wg)))
}

fn prepare_route_wg(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (rows, u) = route_uniform(s)?;
    s.one_step("main", &[("WG", s.param("workgroup_size")? as f64)], &u, grid_2d(rows as u32))
}

/// One partial per invocation.
fn shared_route(_: &Problem, _: DType, params: &Params) -> Result<u64, KernelError> {
    Ok(4 * param(params, "workgroup_size")? as u64)
}

/// One prepare for the four expert shaders: a workgroup per ROWS features (x) of
/// a slot (gate/up) or a token (down) (y).
fn prepare_experts(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let Some((rows, experts, top_k, n, k, act)) = expert_dims(s.problem) else { return Err(wrong_op(s.kernel, s.problem)) };
    let (wg, per) = (s.param("workgroup_size")?, s.param("rows_per_wg")?);
    let ys = if act.is_some() { rows * top_k } else { rows };
    let grid = [groups(n, per), ys.max(1) as u32, 1];
    let gelu = u32::from(act == Some(Activation::GeluTanh));
    let uniform = [rows as u32, experts as u32, top_k as u32, n as u32, k as u32, gelu];
    let mut consts = vec![("WG", wg as f64), ("ROWS", per as f64)];
    if s.dtype.is_quant() {
        consts.push(("QFMT", qfmt(s.dtype)));
        one_q_step(s, 2, &consts, &uniform, grid)
    } else {
        consts.extend(s.w_f16_const());
        s.one_step("main", &consts, &uniform, grid)
    }
}

/// The grouped kernels: a workgroup per ROWS features (x) of an expert (y; gate/up
/// one more row for the empty slots). The down projection's first pass writes the
/// route-weighted products into a scratch of the slots, its second sums them.
fn prepare_grouped(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let Some((rows, experts, top_k, n, k, act)) = expert_dims(s.problem) else { return Err(wrong_op(s.kernel, s.problem)) };
    let per = s.param("rows_per_wg")?;
    let gelu = u32::from(act == Some(Activation::GeluTanh));
    let uniform = [rows as u32, experts as u32, top_k as u32, n as u32, k as u32, gelu];
    let mut consts = vec![
        ("WG", s.param("workgroup_size")? as f64),
        ("ROWS", per as f64),
        ("TT", s.param("tokens_per_tile")? as f64),
        ("GATED", if act.is_some() { 1.0 } else { 0.0 }),
    ];
    if s.dtype.is_quant() {
        consts.push(("QFMT", qfmt(s.dtype)));
    } else {
        consts.extend(s.w_f16_const());
    }
    let pass = |s: &WgslSetup<'_>, ys: usize| {
        let grid = [groups(n, per), ys as u32, 1];
        if s.dtype.is_quant() { one_q_step(s, 2, &consts, &uniform, grid) } else { s.one_step("main", &consts, &uniform, grid) }
    };
    if act.is_some() {
        return pass(s, experts + 1);
    }
    let [h, route, w, out] = *s.bufs else {
        return Err(KernelError::Buffers { kernel: s.kernel.id.into(), expected: 4, got: s.bufs.len() });
    };
    let slots = s.gpu.storage("moe_down_grouped slots", (4 * rows * top_k * n).max(16) as u64);
    let mut program = pass(&s.with_bufs(&[h, route, w, &slots]), experts)?;
    let sum = s.with_shader(&DOWN_SUM);
    let sum_bufs = [&slots, route, out];
    let second = sum.with_bufs(&sum_bufs).one_step("main", &[("WG", 64.0)], &uniform, grid_2d(groups(rows * n, 64)))?;
    program.steps.extend(second.steps);
    program.owned.extend(second.owned);
    program.owned.push(slots);
    Ok(program)
}

// ---- CPU ----

/// A token's experts, or a step's slots' experts: inline up to 16 (a decode
/// step's), so decode allocates nothing.
type Small<T> = SmallVec<[T; 16]>;

/// How a CPU router kernel finds a token's `top_k` experts (ascending or not).
type TopK = fn(&[f32], usize) -> Small<usize>;

fn run_route(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>, top: TopK) -> Result<(), KernelError> {
    let Problem::MoeRoute { rows, experts, top_k, norm } = *prob else { return Err(wrong_op(kd, prob)) };
    let logits = a.ins[0].f32();
    let split = RowSplit::Dynamic(param(params, "rows_per_task")? as usize);
    par_rows(&mut a.outs[0][..rows * experts], experts, split, |first, out| {
        for (i, o) in out.chunks_mut(experts).enumerate() {
            let l = &logits[(first + i) * experts..][..experts];
            route_row(l, &top(l, top_k), norm, o);
        }
    });
    Ok(())
}

fn run_route_select(kd: &KernelDef, prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    run_route(kd, prob, params, a, top_select)
}

fn run_route_passes(kd: &KernelDef, prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    run_route(kd, prob, params, a, top_passes)
}

/// (value descending, index ascending): the router's order.
fn before(l: &[f32], a: usize, b: usize) -> std::cmp::Ordering {
    l[b].total_cmp(&l[a]).then(a.cmp(&b))
}

/// The `top_k` largest by a partial selection (over an index array kept per thread).
fn top_select(l: &[f32], top_k: usize) -> Small<usize> {
    INDEX.with_borrow_mut(|order| {
        order.clear();
        order.extend(0..l.len());
        let k = top_k.min(l.len());
        if k < order.len() {
            order.select_nth_unstable_by(k, |&a, &b| before(l, a, b));
        }
        order[..k].iter().copied().collect()
    })
}

/// The `top_k` largest by `top_k` passes, each the first in the router's order
/// after the last taken.
fn top_passes(l: &[f32], top_k: usize) -> Small<usize> {
    let mut kept = Small::new();
    for _ in 0..top_k.min(l.len()) {
        let after = |e: usize| kept.last().is_none_or(|&p| before(l, p, e).is_lt());
        let best = (0..l.len()).filter(|&e| after(e)).min_by(|&a, &b| before(l, a, b));
        kept.extend(best);
    }
    kept
}

/// One token's route from its router logits and its experts `kept`: softmax, kept
/// ones only, renormalised over them when `norm`.
pub fn route_row(logits: &[f32], kept: &[usize], norm: bool, out: &mut [f32]) {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let z: f32 = logits.iter().map(|v| (v - m).exp()).sum();
    let sum: f32 = kept.iter().map(|&e| (logits[e] - m).exp()).sum();
    out.fill(0.0);
    for &e in kept {
        out[e] = (logits[e] - m).exp() / if norm { sum } else { z };
    }
}

/// Each slot's expert (`None` past the token's experts), slot `p = t * top_k + j`.
fn slot_experts(route: &[f32], rows: usize, experts: usize, top_k: usize) -> Small<Option<usize>> {
    let mut out = Small::new();
    for r in route.chunks(experts).take(rows) {
        let mut chosen = (0..experts).filter(|&e| r[e] != 0.0);
        out.extend((0..top_k).map(|_| chosen.next()));
    }
    out
}

/// A token's activations for row dots against `w`: f32, or (block formats) as
/// [`ActVec`] quantizes them.
enum Act<'a> {
    F(&'a [f32]),
    Q(ActVec<'a>),
}

impl<'a> Act<'a> {
    fn new(x: &'a [f32], w: CpuIn<'_>, params: &Params) -> Result<Act<'a>, KernelError> {
        Ok(match w.quant() {
            Some(q) => Act::Q(ActVec::new(x, params, q.format)?),
            None => Act::F(x),
        })
    }

    /// Rows `first..first + y.len()` of the `[_, k]` matrix `w` dotted with the activations.
    fn rows(&self, isa: Isa, w: CpuIn<'_>, k: usize, first: usize, y: &mut [f32]) {
        match (self, w.quant()) {
            (Act::Q(x), Some(q)) => x.rows(isa, q, k, first, y, false),
            (Act::F(x), _) => y.iter_mut().enumerate().for_each(|(i, o)| *o = cpu::dot(isa, x, row(w, first + i, k))),
            (Act::Q(_), None) => y.fill(0.0),
        }
    }
}

thread_local! {
    /// A pool task's up-projection values (gathered gate/up) or one slot's partial
    /// sums (gathered down).
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// A router's index array (partial selection).
    static INDEX: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

fn run_gate_up(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::MoeGateUp { rows, experts, top_k, n, k, act } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let (x, w) = (a.ins[0].f32(), a.ins[2]);
    let slots = slot_experts(a.ins[1].f32(), rows, experts, top_k);
    let xs = (0..rows).map(|t| Act::new(&x[t * k..][..k], w, params)).collect::<Result<SmallVec<[_; 2]>, _>>()?;
    par_rows(&mut a.outs[0][..rows * top_k * n], 1, RowSplit::dynamic(params)?, |first, y| {
        by_row(first, y, n, |p, f, seg, up| match slots[p] {
            None => seg.fill(0.0),
            Some(e) => {
                let xt = &xs[p / top_k];
                xt.rows(isa, w, k, e * n + f, seg);
                xt.rows(isa, w, k, (experts + e) * n + f, up);
                seg.iter_mut().zip(up.iter()).for_each(|(g, u)| *g = act_f32(act, *g) * u);
            }
        })
    });
    Ok(())
}

fn run_down(kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::MoeDown { rows, experts, top_k, n, k } = *prob else { return Err(wrong_op(kd, prob)) };
    let isa = Isa::of(params)?;
    let (h, route, w) = (a.ins[0].f32(), a.ins[1].f32(), a.ins[2]);
    let slots = slot_experts(route, rows, experts, top_k);
    let hs = (0..rows * top_k)
        .map(|p| slots[p].map(|_| Act::new(&h[p * k..][..k], w, params)).transpose())
        .collect::<Result<SmallVec<[_; 8]>, _>>()?;
    par_rows(&mut a.outs[0][..rows * n], 1, RowSplit::dynamic(params)?, |first, y| {
        by_row(first, y, n, |t, f, seg, part| {
            seg.fill(0.0);
            for j in 0..top_k {
                let (Some(e), Some(hj)) = (slots[t * top_k + j], &hs[t * top_k + j]) else { break };
                hj.rows(isa, w, k, e * n + f, part);
                let g = route[t * experts + e];
                seg.iter_mut().zip(part.iter()).for_each(|(o, v)| *o += g * v);
            }
        })
    });
    Ok(())
}

/// Walks the flat chunk `y` (elements `first..`) of a `[_, n]` output in pieces
/// that each lie in one row: `f(row, first feature, piece, scratch of its length)`.
fn by_row(first: usize, y: &mut [f32], n: usize, mut f: impl FnMut(usize, usize, &mut [f32], &mut [f32])) {
    SCRATCH.with_borrow_mut(|scratch| {
        let mut i = 0;
        while i < y.len() {
            let (r, c) = ((first + i) / n, (first + i) % n);
            let len = (n - c).min(y.len() - i);
            scratch.resize(len, 0.0);
            f(r, c, &mut y[i..i + len], &mut scratch[..len]);
            i += len;
        }
    })
}

/// The slots sorted by expert: for expert `e`, `slots[start[e]..start[e + 1]]`.
struct ByExpert {
    start: Vec<usize>,
    slots: Vec<usize>,
}

impl ByExpert {
    fn new(slot_experts: &[Option<usize>], experts: usize) -> ByExpert {
        let mut start = vec![0usize; experts + 1];
        for e in slot_experts.iter().flatten() {
            start[e + 1] += 1;
        }
        for e in 0..experts {
            start[e + 1] += start[e];
        }
        let mut next = start.clone();
        let mut slots = vec![0usize; start[experts]];
        for (p, e) in slot_experts.iter().enumerate() {
            if let Some(e) = *e {
                slots[next[e]] = p;
                next[e] += 1;
            }
        }
        ByExpert { start, slots }
    }

    fn of(&self, e: usize) -> &[usize] {
        &self.slots[self.start[e]..self.start[e + 1]]
    }
}

/// Row `r` of `w` as f32 into `out` (dequantized, converted or copied).
fn row_f32(isa: Isa, w: CpuIn<'_>, r: usize, k: usize, out: &mut [f32]) {
    match (w.quant(), row(w, r, k)) {
        (Some(q), _) => cpu::qdot::dequantize_row(isa, q, r, k, &mut out[..k]),
        (None, Row::F32(s)) => out[..k].copy_from_slice(s),
        (None, Row::F16(s)) => out[..k].iter_mut().zip(s).for_each(|(o, v)| *o = v.to_f32()),
        (None, Row::Q8(s)) => out[..k].iter_mut().enumerate().for_each(|(i, o)| *o = cpu::Elems::get(s, i)),
    }
}

/// How a grouped kernel multiplies an expert's rows by its gathered tokens.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Grouped {
    /// Rows dequantized into f32 panels of `nc` for the blocked f32 GEMM.
    F32,
    /// The tokens quantized to int8 blocks once, the rows through the int8 GEMM
    /// tiles straight from the blocks, in pool tasks of `rows_per_task`.
    I8,
}

impl Grouped {
    /// The parameter that sizes its blocks of rows.
    fn block(self, params: &Params) -> Result<usize, KernelError> {
        Ok((param(params, if self == Grouped::F32 { "nc" } else { "rows_per_task" })? as usize).max(1))
    }
}

/// One call of a grouped kernel: how it multiplies, its ISA, the slots sorted by
/// expert, the expert weights and `(experts, n, k, rows a block)`.
struct GroupedCall<'a> {
    kind: Grouped,
    isa: Isa,
    /// The int8 GEMM's multiplier (the int8 kind's `tiles` parameter).
    i8: I8Kernel,
    by: ByExpert,
    w: CpuIn<'a>,
    dims: (usize, usize, usize, usize),
}

impl<'a> GroupedCall<'a> {
    /// The call for `route` (`rows` tokens' `[experts]` rows), the op's `n` x `k`
    /// expert matrices `w` and the kernel's parameters.
    fn new(
        kind: Grouped,
        params: &Params,
        route: &[f32],
        (rows, experts, top_k): (usize, usize, usize),
        w: CpuIn<'a>,
        (n, k): (usize, usize),
    ) -> Result<GroupedCall<'a>, KernelError> {
        let by = ByExpert::new(&slot_experts(route, rows, experts, top_k), experts);
        let isa = Isa::of(params)?;
        let i8 = if kind == Grouped::I8 { I8Kernel::of(params)? } else { I8Kernel::vnni(isa) };
        Ok(GroupedCall { kind, isa, i8, by, w, dims: (experts, n, k, kind.block(params)?) })
    }

    /// The grouped kernels' one loop. For every expert with tokens: its tokens'
    /// rows of `xs` gathered (`row_of(slot)`) and multiplied, block by block of
    /// its `n` features, by its rows (gate then up when `pair`, the up rows
    /// `experts n` further); `emit(e, its slots, j0, nb, [1 + pair][m_e][nb])`
    /// (each half token-major, as the int8 tiles write it).
    fn run(
        &self,
        pair: bool,
        xs: &[f32],
        row_of: impl Fn(usize) -> usize,
        mut emit: impl FnMut(usize, &[usize], usize, usize, &[f32]),
    ) -> Result<(), KernelError> {
        use crate::kernels::cpu::sgemm::{Blocking, Micro, Split, gemm_blocked};
        let (isa, w, (experts, n, k, block)) = (self.isa, self.w, self.dims);
        let width = 1 + usize::from(pair);
        let block = block.min(n.max(1));
        let (mut gathered, mut panel, mut y, mut part) = (Vec::new(), vec![0f32; width * block * k], Vec::new(), Vec::new());
        for e in 0..experts {
            let slots = self.by.of(e);
            if slots.is_empty() {
                continue;
            }
            let m = slots.len();
            gathered.clear();
            slots.iter().for_each(|&s| gathered.extend_from_slice(&xs[row_of(s) * k..][..k]));
            // Weight row of feature j of half h (gate 0, up 1).
            let wrow = |h: usize, j: usize| (h * experts + e) * n + j;
            if self.kind == Grouped::I8 {
                let q = w.quant().ok_or_else(|| KernelError::Invalid {
                    kernel: "moe_grouped_i8".into(),
                    reason: "float weights for the int8 tiles".into(),
                })?;
                let xp = XPanel::quantize(&gathered, m, k);
                let parts = cpu::par_row_blocks(n, block, |j0, count| {
                    let mut part = vec![0f32; width * count * m];
                    for (h, out) in part.chunks_exact_mut(count * m).enumerate() {
                        rows_times_tokens_i8(self.i8, &xp, q, wrow(h, j0), count, None, out);
                    }
                    part
                });
                parts.iter().for_each(|(j0, nb, part)| emit(e, slots, *j0, *nb, part));
                continue;
            }
            for j0 in (0..n).step_by(block) {
                let nb = block.min(n - j0);
                cpu::pool::for_chunks_mut(&mut panel[..width * nb * k], k, |i, r| row_f32(isa, w, wrow(i / nb, j0 + i % nb), k, r));
                y.resize(m * width * nb, 0.0);
                let blk = Blocking { mc: 96, nc: 128.min(width * nb), kc: 256 };
                gemm_blocked(
                    Micro::for_isa(isa),
                    blk,
                    Split::Auto,
                    m,
                    width * nb,
                    k,
                    &gathered,
                    CpuIn::F32(&panel[..width * nb * k]),
                    &mut y,
                );
                // [m][width nb] to the int8 tiles' [width][m][nb].
                part.resize(m * width * nb, 0.0);
                for (i, row) in y.chunks(width * nb).enumerate() {
                    for (h, half) in row.chunks(nb).enumerate() {
                        part[(h * m + i) * nb..][..nb].copy_from_slice(half);
                    }
                }
                emit(e, slots, j0, nb, &part);
            }
        }
        Ok(())
    }
}

fn run_gate_up_grouped_as(kind: Grouped, kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::MoeGateUp { rows, experts, top_k, n, k, act } = *prob else { return Err(wrong_op(kd, prob)) };
    let call = GroupedCall::new(kind, params, a.ins[1].f32(), (rows, experts, top_k), a.ins[2], (n, k))?;
    let h = &mut a.outs[0][..rows * top_k * n];
    h.fill(0.0);
    call.run(
        true,
        a.ins[0].f32(),
        |p| p / top_k,
        |_, slots, j0, nb, part| {
            let m = slots.len();
            let (g, u) = part.split_at(nb * m);
            for (i, &p) in slots.iter().enumerate() {
                for f in 0..nb {
                    h[p * n + j0 + f] = act_f32(act, g[i * nb + f]) * u[i * nb + f];
                }
            }
        },
    )
}

fn run_down_grouped_as(kind: Grouped, kd: &KernelDef, prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::MoeDown { rows, experts, top_k, n, k } = *prob else { return Err(wrong_op(kd, prob)) };
    let route = a.ins[1].f32();
    let call = GroupedCall::new(kind, params, route, (rows, experts, top_k), a.ins[2], (n, k))?;
    let y = &mut a.outs[0][..rows * n];
    y.fill(0.0);
    // Experts in ascending order: each token's slots summed in the order the
    // gathered kernel sums them.
    call.run(
        false,
        a.ins[0].f32(),
        |p| p,
        |e, slots, j0, nb, part| {
            for (i, &p) in slots.iter().enumerate() {
                let g = route[(p / top_k) * experts + e];
                for f in 0..nb {
                    y[(p / top_k) * n + j0 + f] += g * part[i * nb + f];
                }
            }
        },
    )
}

fn run_gate_up_grouped(kd: &KernelDef, prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    run_gate_up_grouped_as(Grouped::F32, kd, prob, params, a)
}

fn run_gate_up_grouped_i8(kd: &KernelDef, prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    run_gate_up_grouped_as(Grouped::I8, kd, prob, params, a)
}

fn run_down_grouped(kd: &KernelDef, prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    run_down_grouped_as(Grouped::F32, kd, prob, params, a)
}

fn run_down_grouped_i8(kd: &KernelDef, prob: &Problem, params: &Params, a: CpuArgs<'_>) -> Result<(), KernelError> {
    run_down_grouped_as(Grouped::I8, kd, prob, params, a)
}
