//! The contract every kernel family builds on, below the registry that gathers
//! them ([`super::registry`]): one kernel's definition ([`KernelDef`]: id, op,
//! storage types, parameter space, and its CPU ([`CpuImpl`]) or WGSL
//! ([`WgslImpl`]) implementation), its parameters ([`ParamSpec`], [`Params`]),
//! the buffers a CPU kernel is handed ([`CpuIn`], [`CpuArgs`]) and what a WGSL
//! kernel prepares from ([`WgslSetup`]), the checks every variant passes before it
//! runs ([`KernelDef::check`]: dtype, parameters, device limits, the kernel's own
//! rules), the validity helpers families share (the block rule
//! [`check_blocks`] among them), the errors ([`KernelError`]), and the methods of
//! [`DType`] the set reads.

use std::collections::BTreeMap;

use half::f16;
use serde::Serialize;

use super::problem::{Op, Problem, Role};
use super::quant::{self, DType};
use crate::device::{Backend, Caps, CpuCaps, GpuCaps};
use crate::gpu::{GpuCtx, GpuProgram, Shader};

impl DType {
    /// Bytes per element of a float type. Quantized types have no per-element size
    /// (a block of 32 elements has one): use [`DType::bytes_for`] for buffer sizes;
    /// this returns 1 for them (the smallest whole number of bytes an element takes).
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 => 2,
            _ => 1,
        }
    }
    /// Bytes of a buffer of `n` elements in this type. Quantized: the single-buffer
    /// GPU layout of [`quant::QMatrix`] (blocks of [`quant::QFormat::gpu_quant_bytes`]
    /// padded to 256 bytes, then the f16
    /// scales) for `n / 32` blocks (a partial block counts whole).
    pub fn bytes_for(self, n: usize) -> u64 {
        match self.quant() {
            None => (n * self.size()) as u64,
            Some(f) => f.layout(f.blocks_for(n)).total as u64,
        }
    }
    pub fn name(self) -> &'static str {
        self.into()
    }
    pub fn is_quant(self) -> bool {
        self.quant().is_some()
    }
    /// Storage of the weights that stay floating point when the matrices are in
    /// this type (norm gains, biases): f32 under a quantized type, else itself.
    pub fn float_storage(self) -> DType {
        if self.is_quant() { DType::F32 } else { self }
    }
}

impl std::str::FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        use strum::IntoEnumIterator;
        DType::iter().find(|d| d.name().eq_ignore_ascii_case(s)).ok_or_else(|| {
            let allowed: Vec<&str> = DType::iter().map(DType::name).collect();
            format!("unknown dtype `{s}` (allowed: {})", allowed.join(", "))
        })
    }
}

/// One tunable parameter: its snake_case name (the same in YAML, Rust and as a WGSL
/// `override` constant), the values the tuner may pick, and the default.
#[derive(Clone, Debug, Serialize)]
pub struct ParamSpec {
    pub name: &'static str,
    pub values: &'static [u32],
    pub default: u32,
    pub help: &'static str,
}

impl ParamSpec {
    pub const fn new(name: &'static str, values: &'static [u32], default: u32, help: &'static str) -> ParamSpec {
        ParamSpec { name, values, default, help }
    }
}

/// Parameter values of one variant, by name.
pub type Params = BTreeMap<String, u32>;

/// Reads parameter `name` of a variant. A name the map lacks (a typo in a kernel,
/// or a map that skipped [`KernelDef::check_params`]) is an error, never a default.
pub fn param(params: &Params, name: &str) -> Result<u32, KernelError> {
    params.get(name).copied().ok_or_else(|| KernelError::Param {
        name: name.to_string(),
        known: params.keys().map(String::as_str).collect::<Vec<_>>().join(", "),
    })
}

/// Errors from kernel lookup, validity and execution.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("unknown kernel `{id}`; known kernels: {known}")]
    Unknown { id: String, known: String },
    #[error("kernel `{kernel}` does not compute `{got}` (it computes `{expected}`)")]
    WrongOp { kernel: String, expected: Op, got: Op },
    #[error("variant `{kernel}` is not valid here: {reason}")]
    Invalid { kernel: String, reason: String },
    #[error("kernel `{kernel}` got {got} buffers, expected {expected}")]
    Buffers { kernel: String, expected: usize, got: usize },
    #[error("kernel `{kernel}`: buffer `{buffer}` has {got} elements, expected {expected}")]
    BufferLen { kernel: String, buffer: String, expected: usize, got: usize },
    #[error("kernel `{kernel}`: buffer `{buffer}` must be {expected}")]
    BufferType { kernel: String, buffer: String, expected: &'static str },
    #[error("no parameter `{name}` in this variant (it has: {known})")]
    Param { name: String, known: String },
    #[error("kernel `{0}` is a CPU kernel and needs the CPU device")]
    NeedsCpu(String),
    #[error("kernel `{0}` is a WGSL kernel and needs a GPU adapter")]
    NeedsGpu(String),
    #[error(transparent)]
    Gpu(#[from] crate::gpu::GpuError),
}

/// Validity checks report reasons as text; a parameter lookup error becomes one.
impl From<KernelError> for String {
    fn from(e: KernelError) -> String {
        e.to_string()
    }
}

/// Read-only buffer handed to a CPU kernel.
#[derive(Clone, Copy, Debug)]
pub enum CpuIn<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    /// A block-quantized matrix (quants and scales of [`quant::QMatrix`]).
    Q(quant::QView<'a>),
    /// A matrix stacked from row blocks in different block formats (a weight of
    /// per-operand formats, [`Problem::formats`]).
    Stack(&'a quant::QStack),
}

impl<'a> CpuIn<'a> {
    /// Elements (for a quantized matrix: whole blocks times 32).
    pub fn len(&self) -> usize {
        match self {
            CpuIn::F32(s) => s.len(),
            CpuIn::F16(s) => s.len(),
            CpuIn::Q(q) => q.elems(),
            CpuIn::Stack(s) => s.rows() * s.cols(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn dtype(&self) -> DType {
        match self {
            CpuIn::F32(_) => DType::F32,
            CpuIn::F16(_) => DType::F16,
            CpuIn::Q(q) => q.format.into(),
            // A stack's kernels run as its first part's format (`KernelDef::check`).
            CpuIn::Stack(s) => s.parts.first().map_or(DType::F32, |p| p.format.into()),
        }
    }
    /// The quantized view, for buffers declared quantized.
    pub fn quant(&self) -> Option<quant::QView<'a>> {
        match *self {
            CpuIn::Q(q) => Some(q),
            _ => None,
        }
    }
    /// The f32 slice, for buffers that are always f32 (activations).
    pub fn f32(&self) -> &'a [f32] {
        match *self {
            CpuIn::F32(s) => s,
            // The registry checks dtypes against the op's buffer specs before a
            // kernel runs, so an f16 activation never reaches here.
            CpuIn::F16(_) | CpuIn::Q(_) | CpuIn::Stack(_) => &[],
        }
    }
    /// Element `i` widened to f32 (dequantized for a quantized matrix).
    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        match self {
            CpuIn::F32(s) => s[i],
            CpuIn::F16(s) => s[i].to_f32(),
            CpuIn::Q(q) => q.get(i),
            CpuIn::Stack(s) => {
                let mut i = i;
                for p in &s.parts {
                    let n = p.rows * p.cols;
                    if i < n {
                        return p.view().get(i);
                    }
                    i -= n;
                }
                0.0
            }
        }
    }
}

/// The buffers of one CPU kernel call, in the op's binding order:
/// `ins` are the input/weight/cache buffers, `outs` the outputs.
/// Inline vectors (no heap allocation for the buffer counts of any op), so a
/// decode step builds its calls without allocating.
pub struct CpuArgs<'a> {
    pub ins: CpuIns<'a>,
    pub outs: CpuOuts<'a>,
}

/// The input buffers of a CPU call (inline up to 6).
pub type CpuIns<'a> = smallvec::SmallVec<[CpuIn<'a>; 6]>;
/// The output buffers of a CPU call (inline up to 4).
pub type CpuOuts<'a> = smallvec::SmallVec<[&'a mut [f32]; 4]>;

/// The `N` output buffers of a CPU call, by value (the registry checked the count;
/// a mismatch is a `Buffers` error, not a panic).
pub fn outs<'a, const N: usize>(kd: &KernelDef, outs: CpuOuts<'a>) -> Result<[&'a mut [f32]; N], KernelError> {
    let got = outs.len();
    let err = || KernelError::Buffers { kernel: kd.id.to_string(), expected: N, got };
    if got != N {
        return Err(err());
    }
    let mut it = outs.into_iter();
    let arr: [Option<&'a mut [f32]>; N] = std::array::from_fn(|_| it.next());
    if arr.iter().any(Option::is_none) {
        return Err(err());
    }
    Ok(arr.map(|o| o.unwrap_or_default()))
}

/// Runs a CPU kernel (itself, for its id in errors). Buffer count, lengths and
/// dtypes were checked by the registry; a problem of another op is [`wrong_op`].
pub type CpuRunFn = fn(&KernelDef, &Problem, &Params, CpuArgs<'_>) -> Result<(), KernelError>;
/// Extra validity rules of a CPU kernel (ISA, shapes): `Err(reason)` when invalid.
pub type CpuCheckFn = fn(&CpuCaps, &Problem, DType, &Params) -> Result<(), String>;
/// Extra validity rules of a WGSL kernel beyond the generic limits checks.
pub type WgslCheckFn = fn(&GpuCaps, &Problem, DType, &Params) -> Result<(), String>;

/// Everything a WGSL kernel needs to build its dispatches once.
pub struct WgslSetup<'a> {
    pub kernel: &'a KernelDef,
    /// The kernel's shader ([`WgslImpl::shader`]), so one prepare serves a family.
    shader: &'static Shader,
    pub gpu: &'a GpuCtx,
    pub problem: &'a Problem,
    pub dtype: DType,
    pub params: &'a Params,
    /// The op's buffers in binding order (see [`Problem::buffers`]).
    pub bufs: &'a [&'a wgpu::Buffer],
    /// The pass-position buffer a position-reading kernel binds
    /// ([`WgslSetup::position`]); None: its own, holding the problem's position.
    position: Option<&'a wgpu::Buffer>,
    /// `position` holds a position a row ([`PassPosition::Rows`]).
    rows: bool,
}

/// Where a position-reading kernel finds its positions ([`KernelDef::prepare_wgsl`]).
#[derive(Clone, Copy)]
pub enum PassPosition<'a> {
    /// The pass-position buffer (`shaders/position.wgsl`); None: the program's own.
    Pass(Option<&'a wgpu::Buffer>),
    /// One u32 a row (`shaders/position_rows.wgsl`): a batch of sequences.
    Rows(&'a wgpu::Buffer),
}

impl<'a> From<Option<&'a wgpu::Buffer>> for PassPosition<'a> {
    fn from(b: Option<&'a wgpu::Buffer>) -> PassPosition<'a> {
        PassPosition::Pass(b)
    }
}

/// Builds the pipelines, uniforms, scratch buffers and bind groups of one variant.
pub type WgslPrepareFn = fn(&WgslSetup<'_>) -> Result<GpuProgram, KernelError>;

/// A CPU kernel.
pub struct CpuImpl {
    pub run: CpuRunFn,
    pub check: CpuCheckFn,
}

/// A WGSL kernel.
pub struct WgslImpl {
    pub shader: &'static Shader,
    /// Workgroup size the variant's `override` constants give.
    pub workgroup_size: fn(&Params) -> Result<[u32; 3], KernelError>,
    /// Workgroup (shared) memory in bytes (`requiredSharedMemory`).
    pub shared_memory: fn(&Problem, DType, &Params) -> Result<u64, KernelError>,
    /// Needs `SHADER_F16` (for this dtype).
    pub needs_f16: fn(DType) -> bool,
    /// Needs subgroup operations.
    pub needs_subgroups: bool,
    /// Other shaders a parameter of the variant selects in its `prepare` (e.g. the
    /// f16-tile form of a GEMM): validated and hashed with the set like `shader`.
    pub alt_shaders: &'static [&'static Shader],
    pub check: WgslCheckFn,
    pub prepare: WgslPrepareFn,
}

pub enum Impl {
    Cpu(CpuImpl),
    Wgsl(WgslImpl),
}

/// One kernel of the set.
pub struct KernelDef {
    /// Stable id, used in profiles: `<op>_<name>`, unique across the set.
    pub id: &'static str,
    pub op: Op,
    pub summary: &'static str,
    pub dtypes: &'static [DType],
    pub params: &'static [ParamSpec],
    pub imp: Impl,
    /// Whether it takes per-operand formats ([`Problem::formats`]: a weight
    /// stacked from row blocks in different block formats).
    pub stacks: bool,
}

impl WgslImpl {
    /// A WGSL kernel with the common rules: workgroup `[workgroup_size, 1, 1]`, no
    /// workgroup memory, f16 read packed in u32 words (no feature), no subgroups, no
    /// check beyond the generic ones. The builder methods below change one rule each.
    pub const fn new(shader: &'static Shader, prepare: WgslPrepareFn) -> WgslImpl {
        WgslImpl {
            shader,
            workgroup_size: wg_size,
            shared_memory: no_shared,
            needs_f16: packed_f16,
            needs_subgroups: false,
            alt_shaders: &[],
            check: wgsl_any,
            prepare,
        }
    }
    pub const fn workgroup(self, workgroup_size: fn(&Params) -> Result<[u32; 3], KernelError>) -> WgslImpl {
        WgslImpl { workgroup_size, ..self }
    }
    pub const fn shared(self, shared_memory: fn(&Problem, DType, &Params) -> Result<u64, KernelError>) -> WgslImpl {
        WgslImpl { shared_memory, ..self }
    }
    /// Native f16 storage (`enable f16;`) in the f16 form: needs `SHADER_F16`.
    pub const fn native_f16(self) -> WgslImpl {
        WgslImpl { needs_f16: native_f16, ..self }
    }
    pub const fn subgroups(self) -> WgslImpl {
        WgslImpl { needs_subgroups: true, ..self }
    }
    /// Shaders a parameter selects instead of `shader` ([`WgslSetup::with_shader`]).
    pub const fn alt_shaders(self, alt_shaders: &'static [&'static Shader]) -> WgslImpl {
        WgslImpl { alt_shaders, ..self }
    }
    pub const fn check(self, check: WgslCheckFn) -> WgslImpl {
        WgslImpl { check, ..self }
    }
}

impl From<CpuImpl> for Impl {
    fn from(c: CpuImpl) -> Impl {
        Impl::Cpu(c)
    }
}

impl From<WgslImpl> for Impl {
    fn from(w: WgslImpl) -> Impl {
        Impl::Wgsl(w)
    }
}

/// How a variant is named in reports and profiles: `id`, or `id(a=1,b=2)` with
/// the parameters given.
pub fn variant_label(id: &str, params: &Params) -> String {
    if params.is_empty() {
        return id.to_string();
    }
    let ps: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{id}({})", ps.join(","))
}

impl KernelDef {
    /// The parameters of `params` that differ from this kernel's defaults (what a
    /// profile writes).
    pub fn non_default(&self, params: &Params) -> Params {
        let defaults = self.default_params();
        params.iter().filter(|(k, v)| defaults.get(*k) != Some(*v)).map(|(k, v)| (k.clone(), *v)).collect()
    }

    /// The variant's name: its id and the parameters that differ from the defaults.
    pub fn label(&self, params: &Params) -> String {
        variant_label(self.id, &self.non_default(params))
    }

    /// A kernel of the set: a [`CpuImpl`] or a [`WgslImpl`] with its id, op, storage
    /// types, parameter space and one-line summary.
    pub fn new(
        id: &'static str,
        op: Op,
        dtypes: &'static [DType],
        params: &'static [ParamSpec],
        summary: &'static str,
        imp: impl Into<Impl>,
    ) -> KernelDef {
        KernelDef { id, op, summary, dtypes, params, imp: imp.into(), stacks: false }
    }

    /// This kernel with per-operand formats taken ([`KernelDef::stacks`]).
    pub fn stacks(self) -> KernelDef {
        KernelDef { stacks: true, ..self }
    }
}

impl std::fmt::Debug for KernelDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.id)
    }
}

impl KernelDef {
    pub fn backend(&self) -> Backend {
        match self.imp {
            Impl::Cpu(_) => Backend::Cpu,
            Impl::Wgsl(_) => Backend::Wgsl,
        }
    }

    pub fn default_params(&self) -> Params {
        self.params.iter().map(|s| (s.name.to_string(), s.default)).collect()
    }

    /// The defaults with the values of `kv` set over them.
    pub fn params_with(&self, kv: &[(&str, u32)]) -> Params {
        let mut p = self.default_params();
        p.extend(kv.iter().map(|&(name, v)| (name.to_string(), v)));
        p
    }

    /// Every combination of parameter values (the variant space of this kernel).
    pub fn all_params(&self) -> Vec<Params> {
        let mut out = vec![Params::new()];
        for spec in self.params {
            let mut next = Vec::with_capacity(out.len() * spec.values.len());
            for base in &out {
                for &v in spec.values {
                    let mut p = base.clone();
                    p.insert(spec.name.to_string(), v);
                    next.push(p);
                }
            }
            out = next;
        }
        out
    }

    /// Checks names and values of `params` against the declared specs.
    pub fn check_params(&self, params: &Params) -> Result<(), String> {
        for name in params.keys() {
            if !self.params.iter().any(|s| s.name == name) {
                let known: Vec<_> = self.params.iter().map(|s| s.name).collect();
                return Err(format!("unknown parameter `{name}` (parameters: {})", known.join(", ")));
            }
        }
        for spec in self.params {
            match params.get(spec.name) {
                None => return Err(format!("missing parameter `{}`", spec.name)),
                Some(v) if !spec.values.contains(v) => {
                    return Err(format!("parameter `{}` = {v} is not one of {:?}", spec.name, spec.values));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Whether this variant can run `problem` in `dtype` on the device; `Err` says why not.
    /// This is `validateConfig`: dtype, parameters, backend, workgroup size and
    /// shared memory against the limits, features (f16, subgroups), binding sizes, and the
    /// kernel's own shape rules.
    pub fn check(&self, caps: Caps<'_>, problem: &Problem, dtype: DType, params: &Params) -> Result<(), String> {
        if problem.op() != self.op {
            return Err(format!("computes {}, not {}", self.op, problem.op()));
        }
        if !self.dtypes.contains(&dtype) {
            return Err(format!("no {dtype} variant"));
        }
        if let Some(f) = problem.formats() {
            if !self.stacks {
                return Err(format!("reads its weight in one format, not per-operand formats ({f})"));
            }
            if f.parts().first().is_none_or(|p| DType::from(p.1) != dtype) {
                return Err(format!("per-operand formats ({f}) run as their first part's format, not {dtype}"));
            }
            let rows = problem.buffers(dtype).iter().find(|b| b.role == Role::Weight && b.id == "w").and_then(|b| b.shape.first().copied());
            if rows != Some(f.rows()) {
                return Err(format!("per-operand formats ({f}) cover {} rows, the weight has {}", f.rows(), rows.unwrap_or(0)));
            }
        }
        self.check_params(params)?;
        match (&self.imp, caps) {
            (Impl::Cpu(c), Caps::Cpu(cpu)) => (c.check)(cpu, problem, dtype, params),
            (Impl::Wgsl(w), Caps::Gpu(gpu)) => {
                if (w.needs_f16)(dtype) && !gpu.shader_f16 {
                    return Err("needs SHADER_F16, which this adapter lacks".into());
                }
                if w.needs_subgroups && !gpu.subgroups {
                    return Err("needs subgroup operations, which this adapter lacks".into());
                }
                let [x, y, z] = (w.workgroup_size)(params)?;
                let inv = x * y * z;
                if inv > gpu.max_invocations_per_workgroup {
                    return Err(format!("workgroup of {inv} invocations exceeds the adapter's {}", gpu.max_invocations_per_workgroup));
                }
                let lim = gpu.max_workgroup_size;
                if x > lim[0] || y > lim[1] || z > lim[2] {
                    return Err(format!("workgroup size {x}x{y}x{z} exceeds the adapter's {}x{}x{}", lim[0], lim[1], lim[2]));
                }
                let shared = (w.shared_memory)(problem, dtype, params)?;
                if shared > gpu.max_workgroup_storage as u64 {
                    return Err(format!("needs {shared} bytes of workgroup memory, the adapter has {}", gpu.max_workgroup_storage));
                }
                for b in problem.buffers(dtype) {
                    if b.bytes() > gpu.max_storage_binding {
                        return Err(format!(
                            "buffer `{}` is {} bytes, over the adapter's storage binding limit of {}",
                            b.id,
                            b.bytes(),
                            gpu.max_storage_binding
                        ));
                    }
                }
                (w.check)(gpu, problem, dtype, params)
            }
            (Impl::Cpu(_), Caps::Gpu(_)) => Err("CPU kernel; select the CPU device".into()),
            (Impl::Wgsl(_), Caps::Cpu(_)) => Err("WGSL kernel; select a GPU adapter".into()),
        }
    }

    /// Runs a CPU variant. Checks buffer count, lengths and dtypes first.
    pub fn run_cpu(&self, problem: &Problem, dtype: DType, params: &Params, args: CpuArgs<'_>) -> Result<(), KernelError> {
        let Impl::Cpu(c) = &self.imp else {
            return Err(KernelError::NeedsGpu(self.id.to_string()));
        };
        if problem.op() != self.op {
            return Err(wrong_op(self, problem));
        }
        let specs = problem.buffers(dtype);
        let (ins, outs): (Vec<_>, Vec<_>) = specs.iter().partition(|s| !s.is_output());
        if ins.len() != args.ins.len() || outs.len() != args.outs.len() {
            return Err(KernelError::Buffers { kernel: self.id.into(), expected: specs.len(), got: args.ins.len() + args.outs.len() });
        }
        for (s, a) in ins.iter().zip(&args.ins) {
            if a.len() < s.len() {
                return Err(KernelError::BufferLen { kernel: self.id.into(), buffer: s.id.into(), expected: s.len(), got: a.len() });
            }
            if a.dtype() != s.dtype {
                return Err(KernelError::BufferType { kernel: self.id.into(), buffer: s.id.into(), expected: s.dtype.name() });
            }
        }
        for (s, a) in outs.iter().zip(&args.outs) {
            if a.len() < s.len() {
                return Err(KernelError::BufferLen { kernel: self.id.into(), buffer: s.id.into(), expected: s.len(), got: a.len() });
            }
        }
        (c.run)(self, problem, params, args)
    }

    /// Runs a CPU variant on buffers a plan bound and shape-checked when it was
    /// built (`plan::Plan::steps`): no per-call check, no allocation. A buffer
    /// shorter than the problem is still a bounds panic, never memory unsafety.
    pub fn run_cpu_planned(&self, problem: &Problem, params: &Params, args: CpuArgs<'_>) -> Result<(), KernelError> {
        let Impl::Cpu(c) = &self.imp else {
            return Err(KernelError::NeedsGpu(self.id.to_string()));
        };
        (c.run)(self, problem, params, args)
    }

    /// Builds the GPU program of a WGSL variant over the given buffers. `position`
    /// is for a caller that owns the pass-position buffer
    /// (`shaders/position.wgsl`, [`crate::gpu::position_words`]): a kernel whose
    /// results depend on the position (RoPE, the fused q/k norm + RoPE, decode
    /// attention) binds `position` and reads pos0 / kv_len from it, so its program
    /// serves every position up to the problem's capacity and the caller moves it
    /// by writing that buffer. With None each such program holds its problem's own.
    /// With [`PassPosition::Rows`] (RoPE and the fused q/k norm + RoPE) the rows of
    /// a batch of sequences each read their own ([`Shader::rows_form`]); a kernel
    /// whose shader reads no row positions is refused, naming it.
    pub fn prepare_wgsl<'a>(
        &self,
        gpu: &GpuCtx,
        problem: &Problem,
        dtype: DType,
        params: &Params,
        bufs: &[&wgpu::Buffer],
        position: impl Into<PassPosition<'a>>,
    ) -> Result<GpuProgram, KernelError> {
        let Impl::Wgsl(w) = &self.imp else {
            return Err(KernelError::NeedsCpu(self.id.to_string()));
        };
        let (position, rows) = match position.into() {
            PassPosition::Pass(b) => (b, false),
            PassPosition::Rows(b) => {
                if !matches!(problem, Problem::Rope { .. } | Problem::QkNormRope { .. }) || w.shader.rows_form().is_none() {
                    let reason = "reads no position a row (a batch of sequences)".into();
                    return Err(KernelError::Invalid { kernel: self.id.into(), reason });
                }
                (Some(b), true)
            }
        };
        let expected = problem.buffers(dtype).len();
        if expected != bufs.len() {
            return Err(KernelError::Buffers { kernel: self.id.into(), expected, got: bufs.len() });
        }
        (w.prepare)(&WgslSetup { kernel: self, shader: w.shader, gpu, problem, dtype, params, bufs, position, rows })
    }
}

/// Common validity helper: CPU kernels that accept any shape.
pub fn cpu_any(_: &CpuCaps, _: &Problem, _: DType, _: &Params) -> Result<(), String> {
    Ok(())
}

/// Common validity helper: WGSL kernels with no rule beyond the generic checks.
pub fn wgsl_any(_: &GpuCaps, _: &Problem, _: DType, _: &Params) -> Result<(), String> {
    Ok(())
}

/// `needs_f16` for kernels that read f16 through `unpack2x16float` (no feature needed).
pub fn packed_f16(_: DType) -> bool {
    false
}

/// `needs_f16` for kernels with native `enable f16;` storage in their f16 form.
pub fn native_f16(d: DType) -> bool {
    d == DType::F16
}

/// `shared_memory` for kernels that use none.
pub fn no_shared(_: &Problem, _: DType, _: &Params) -> Result<u64, KernelError> {
    Ok(0)
}

impl WgslSetup<'_> {
    /// The shader of the variant being prepared (its [`WgslImpl::shader`]).
    pub fn shader(&self) -> &'static Shader {
        match self.rows {
            true => self.shader.rows_form().unwrap_or(self.shader),
            false => self.shader,
        }
    }

    /// The same setup with one of the variant's [`WgslImpl::alt_shaders`] (chosen by
    /// a parameter) in place of its shader.
    pub fn with_shader(&self, shader: &'static Shader) -> WgslSetup<'_> {
        WgslSetup { shader, ..*self }
    }

    /// The same setup over other buffers in the op's binding order (a pass of a
    /// multi-pass kernel binding its own scratch in place of an op buffer).
    pub fn with_bufs<'b>(&'b self, bufs: &'b [&'b wgpu::Buffer]) -> WgslSetup<'b> {
        WgslSetup { bufs, ..*self }
    }

    /// Parameter `name` of the variant being prepared.
    pub fn param(&self, name: &str) -> Result<u32, KernelError> {
        param(self.params, name)
    }

    /// `1.0` when weights/caches are f16, for the `W_F16` override constant.
    pub fn w_f16(&self) -> f64 {
        if self.dtype == DType::F16 { 1.0 } else { 0.0 }
    }

    /// `("W_F16", 1.0 or 0.0)` for shaders that read f16 packed in u32 words; none for
    /// shaders with native f16 storage (`enable f16;`), which have no such constant.
    pub fn w_f16_const(&self) -> Option<(&'static str, f64)> {
        match &self.kernel.imp {
            Impl::Wgsl(w) if (w.needs_f16)(DType::F16) => None,
            _ => Some(("W_F16", self.w_f16())),
        }
    }

    /// The common case: one dispatch of the variant's shader at `entry` binding every
    /// op buffer in order and then a uniform block holding `uniform` (u32 words;
    /// floats as `to_bits`), and the pass position when the op reads one
    /// ([`WgslSetup::position`]).
    pub fn one_step(
        &self,
        entry: &str,
        constants: &[(&str, f64)],
        uniform: &[u32],
        workgroups: [u32; 3],
    ) -> Result<GpuProgram, KernelError> {
        let pipe = self.gpu.pipeline(self.shader(), entry, constants)?;
        let u = self.gpu.uniform(self.kernel.id, uniform);
        let mut entries: Vec<crate::gpu::BindEntry> =
            self.bufs.iter().chain([&&u]).enumerate().map(|(i, b)| (i as u32, (*b).clone(), 0, None)).collect();
        let mut owned = vec![u.clone()];
        if let Some((pos, own)) = self.position() {
            entries.push((crate::gpu::POSITION_BINDING, pos, 0, None));
            owned.extend(own);
        }
        let step = self.gpu.step_entries(self.kernel.id.to_string(), pipe, entries, workgroups)?;
        Ok(GpuProgram { steps: vec![step], owned })
    }

    /// The pass position of an op whose result depends on it (RoPE, the fused q/k
    /// norm + RoPE, decode attention; None for the others), to bind at
    /// [`crate::gpu::POSITION_BINDING`] (`shaders/position.wgsl`): the caller's
    /// buffer ([`KernelDef::prepare_wgsl`]), or a new one holding the problem's
    /// own position, which the program must own (the second value).
    pub fn position(&self) -> Option<(wgpu::Buffer, Option<wgpu::Buffer>)> {
        let (pos0, tokens) = pass_position(self.problem)?;
        Some(match self.position {
            Some(b) => (b.clone(), None),
            None => {
                let b = self.gpu.uniform("position", &crate::gpu::position_words(pos0, tokens));
                (b.clone(), Some(b))
            }
        })
    }
}

/// `(pos0, tokens)` of the pass a problem whose result depends on the position
/// belongs to (RoPE, the fused q/k norm + RoPE, decode attention: one token at
/// kv_len - 1); None for the others. Its WGSL kernels read it from the position
/// buffer ([`WgslSetup::position`]).
pub fn pass_position(problem: &Problem) -> Option<(usize, usize)> {
    match *problem {
        Problem::Rope { pos0, tokens, .. } | Problem::QkNormRope { pos0, tokens, .. } => Some((pos0, tokens)),
        Problem::QkvRopeCache { pos0, .. } => Some((pos0, 1)),
        Problem::AttentionDecode { kv_len, .. } => Some((kv_len.saturating_sub(1), 1)),
        _ => None,
    }
}

/// Error for a kernel handed a problem of another op (the registry prevents it).
pub fn wrong_op(k: &KernelDef, p: &Problem) -> KernelError {
    KernelError::WrongOp { kernel: k.id.to_string(), expected: k.op, got: p.op() }
}

/// `[workgroup_size, 1, 1]`.
pub fn wg_size(params: &Params) -> Result<[u32; 3], KernelError> {
    Ok([param(params, "workgroup_size")?, 1, 1])
}

/// The reduction depth of each op's weight, for the block rule.
fn depth(prob: &Problem) -> Option<usize> {
    match *prob {
        Problem::Gemv { k, .. }
        | Problem::Gemm { k, .. }
        | Problem::GateUp { k, .. }
        | Problem::QkvProj { k, .. }
        | Problem::NormGemv { k, .. }
        | Problem::MoeGateUp { k, .. }
        | Problem::MoeDown { k, .. } => Some(k),
        _ => None,
    }
}

/// k must be a whole number of 32-element blocks (rows are whole blocks); the rule
/// of every block-format kernel, CPU and WGSL.
pub fn check_blocks(prob: &Problem, dtype: DType) -> Result<(), String> {
    if !dtype.is_quant() {
        return Err(format!("{dtype} is not a quantized format"));
    }
    // Per-operand formats: every part's rows whole blocks of its format.
    let be = prob.formats().map_or_else(|| dtype.quant().map_or(1, |f| f.block_elems()), |f| f.block_elems());
    match depth(prob) {
        Some(k) if k == 0 || !k.is_multiple_of(be) => {
            Err(format!("k = {k} is not a positive multiple of {be} (the {dtype} block size); quantized rows are whole blocks"))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k_must_be_whole_blocks() {
        assert!(check_blocks(&Problem::Gemv { n: 4, k: 48 }, DType::Q8_0).is_err());
        assert!(check_blocks(&Problem::Gemv { n: 4, k: 0 }, DType::Q4_0).is_err());
        assert!(check_blocks(&Problem::Gemm { m: 3, n: 4, k: 64 }, DType::Q4_1).is_ok());
        assert!(check_blocks(&Problem::Gemm { m: 3, n: 4, k: 64 }, DType::F32).is_err());
    }
}
