//! The correctness gate: random inputs for a problem, a variant run on the CPU or a
//! GPU, and the comparison with the f64 reference under dtype-aware tolerances.
//! Used by `kernels --verify`, the tests and the tuner.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use half::f16;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::contract::{CpuArgs, CpuIn, Impl, KernelDef, KernelError, Params, pass_position};
use super::problem::{BufSpec, Problem, Role};
use super::quant::DType;
use super::quant::{QFormat, QMatrix, QStack, RowFormats};
use super::reference;
use crate::device::Caps;
use crate::gpu::GpuCtx;

/// A host-side tensor in its storage type.
#[derive(Clone, Debug)]
pub enum HostTensor {
    F32(Vec<f32>),
    F16(Vec<f16>),
    /// A block-quantized weight matrix.
    Q(QMatrix),
    /// A weight of per-operand formats (row blocks in different block formats).
    Stack(QStack),
}

impl HostTensor {
    /// Backs this tensor's memory with huge pages where the system offers them,
    /// as the runtime's weights are ([`crate::kernels::memory::huge_pages`]), so a
    /// race reads its inputs as a decode step reads the weights.
    pub fn huge_pages(&self) {
        use crate::kernels::memory::huge_pages;
        match self {
            HostTensor::F32(v) => huge_pages(v),
            HostTensor::F16(v) => huge_pages(v),
            HostTensor::Q(m) => m.huge_pages(),
            HostTensor::Stack(s) => s.parts.iter().for_each(QMatrix::huge_pages),
        }
    }

    /// A copy in memory marked for huge pages before it is written
    /// ([`crate::kernels::memory::huge_vec`]): a race's rotating copies of its
    /// inputs land on huge pages without being moved there.
    pub fn huge_clone(&self) -> HostTensor {
        use crate::kernels::memory::huge_copy;
        match self {
            HostTensor::F32(v) => HostTensor::F32(huge_copy(v)),
            HostTensor::F16(v) => HostTensor::F16(huge_copy(v)),
            HostTensor::Q(m) => HostTensor::Q(m.huge_clone()),
            HostTensor::Stack(s) => HostTensor::Stack(QStack { parts: s.parts.iter().map(QMatrix::huge_clone).collect() }),
        }
    }

    /// The values as the kernels must see them (a quantized matrix dequantized:
    /// the reference computes with exactly the weights the kernels read).
    pub fn to_f64(&self) -> Vec<f64> {
        match self {
            HostTensor::F32(v) => v.iter().map(|&x| x as f64).collect(),
            HostTensor::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
            HostTensor::Q(m) => m.dequantize().into_iter().map(|x| x as f64).collect(),
            HostTensor::Stack(s) => s.dequantize().into_iter().map(|x| x as f64).collect(),
        }
    }
    /// The bytes a GPU buffer holds (a quantized matrix in its single-buffer layout).
    pub fn bytes(&self) -> Cow<'_, [u8]> {
        match self {
            HostTensor::F32(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            HostTensor::F16(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            HostTensor::Q(m) => Cow::Owned(m.gpu_bytes()),
            HostTensor::Stack(s) => Cow::Owned(s.gpu_bytes()),
        }
    }
    pub fn as_in(&self) -> CpuIn<'_> {
        match self {
            HostTensor::F32(v) => CpuIn::F32(v),
            HostTensor::F16(v) => CpuIn::F16(v),
            HostTensor::Q(m) => CpuIn::Q(m.view()),
            HostTensor::Stack(s) => CpuIn::Stack(s),
        }
    }
}

/// Quantizes `v` as a `[rows, cols]` matrix (the last dimension is the row); a
/// shape that is not whole blocks gives an empty matrix, which the registry's
/// length check then reports (the kernels' validity checks reject such shapes).
fn quantize_spec(spec: &BufSpec, format: QFormat, v: &[f32]) -> QMatrix {
    let cols = spec.shape.last().copied().unwrap_or(0);
    let rows = v.len().checked_div(cols).unwrap_or(0);
    QMatrix::quantize(format, rows, cols, v).unwrap_or(QMatrix {
        format,
        rows: 0,
        cols: 0,
        quants: Vec::new(),
        scales: Vec::new(),
        layout: Default::default(),
    })
}

/// Quantizes `v` as the stacked `[rows, cols]` weight of per-operand formats `f`,
/// each part's rows in its format (an empty stack when the shape is not whole
/// blocks, as [`quantize_spec`]).
fn stack_spec(spec: &BufSpec, f: RowFormats, v: &[f32]) -> HostTensor {
    let cols = spec.shape.last().copied().unwrap_or(0);
    let mut row0 = 0;
    let parts = f.parts().iter().map(|&(rows, format)| {
        let rows = rows as usize;
        let part = v.get(row0 * cols..(row0 + rows) * cols).map_or_else(Vec::new, <[f32]>::to_vec);
        row0 += rows;
        QMatrix::quantize(format, rows, cols, &part)
    });
    match parts.collect::<Result<Vec<_>, _>>().and_then(QStack::new) {
        Ok(s) => HostTensor::Stack(s),
        Err(_) => HostTensor::Q(quantize_spec(spec, f.parts()[0].1, &[])),
    }
}

/// Value written into output buffers before a run (f32, or f16 for an f16 cache
/// the kernel writes), so elements a kernel forgets to write show up as errors.
pub const SENTINEL: f32 = reference::SENTINEL;

/// Deterministic random inputs for `problem` (binding order, inputs only).
///
/// Values are uniform in [-1, 1], drawn in binding order from one ChaCha8 stream
/// of `seed`; `inv_freq` gets real RoPE frequencies; KV cache rows past `kv_len`
/// hold a large sentinel so reading them is caught.
pub fn make_inputs(problem: &Problem, dtype: DType, seed: u64) -> Vec<HostTensor> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    inputs_of(problem, dtype)
        .map(|spec| {
            let v = if spec.id == "inv_freq" { Vec::new() } else { (0..spec.len()).map(|_| rng.random_range(-1.0f32..1.0)).collect() };
            input_tensor(problem, &spec, v)
        })
        .collect()
}

/// Inputs for `problem` as [`make_inputs`] makes them, but each buffer's values
/// from its own stream ([`uniform`]: the seed, its id and shape alone, drawn in
/// parallel), and the large ones taken from (and kept in) `memo`: the slot races
/// draw an LM head's weight once for all the races that bind it.
pub fn make_inputs_shared(problem: &Problem, dtype: DType, seed: u64, memo: &InputMemo) -> Vec<Arc<HostTensor>> {
    inputs_of(problem, dtype)
        .map(|spec| {
            let make = || input_tensor(problem, &spec, if spec.id == "inv_freq" { Vec::new() } else { uniform(seed, &spec) });
            // A stacked weight is not the uniform one its spec also names.
            let stacked = problem.formats().is_some() && spec.role == Role::Weight && spec.id == "w";
            // A cache, and a paged batch's table (what the problem alone says, not a
            // draw), are never shared between problems.
            if spec.role == Role::Cache || stacked || spec.id == "pages" { Arc::new(make()) } else { memo.get_or_make(seed, &spec, make) }
        })
        .collect()
}

fn inputs_of(problem: &Problem, dtype: DType) -> impl Iterator<Item = BufSpec> {
    problem.buffers(dtype).into_iter().filter(|s| !s.is_output())
}

/// Buffer `spec`'s tensor from its values `v` (ignored for `inv_freq`, which holds
/// real RoPE frequencies; a `route` made a router's answer from them): a cache's tail masked, then stored in its type.
fn input_tensor(problem: &Problem, spec: &BufSpec, mut v: Vec<f32>) -> HostTensor {
    if spec.id == "inv_freq" {
        v = reference::rope_inv_freq(10000.0, 2 * spec.len(), None);
    }
    if spec.id == "pages" {
        v = paged_layout(problem).unwrap_or(v);
    }
    if spec.id == "route" {
        // A router's answer: the values as logits, each row's top_k kept.
        if let Problem::MoeGateUp { rows, experts, top_k, .. } | Problem::MoeDown { rows, experts, top_k, .. } = *problem {
            let logits: Vec<f64> = v.iter().map(|&x| 4.0 * x as f64).collect();
            v = reference::moe_route(&logits, rows, experts, top_k, true).into_iter().map(|x| x as f32).collect();
        }
    }
    if spec.role == Role::Cache {
        mask_cache_tail(problem, spec, &mut v);
    }
    if let Some(f) = problem.formats().filter(|_| spec.id == "w") {
        return stack_spec(spec, f, &v);
    }
    match spec.dtype {
        DType::F32 => HostTensor::F32(v),
        DType::F16 => HostTensor::F16(v.into_iter().map(f16::from_f32).collect()),
        q => match q.quant() {
            Some(f) => HostTensor::Q(quantize_spec(spec, f, &v)),
            None => HostTensor::F32(v),
        },
    }
}

/// The values of buffer `spec` for `seed`: uniform in [-1, 1), from the ChaCha8
/// stream named by the buffer's id and shape, drawn in chunks in parallel (each
/// chunk from its own word position), so they do not depend on the threads, and
/// the same buffer of another problem (an LM head's weight in the GEMM, the GEMV
/// and the norm-fused GEMV) gets the same values.
fn uniform(seed: u64, spec: &BufSpec) -> Vec<f32> {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 16;
    // FNV-1a of the id and shape: the stream.
    let mut stream = 0xcbf2_9ce4_8422_2325u64;
    for b in spec.id.bytes().chain(spec.shape.iter().flat_map(|d| (*d as u64).to_le_bytes())) {
        stream = (stream ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let mut v = vec![0f32; spec.len()];
    v.par_chunks_mut(CHUNK).enumerate().for_each(|(c, out)| {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(stream);
        rng.set_word_pos((c * CHUNK) as u128);
        out.iter_mut().for_each(|x| *x = rng.random_range(-1.0f32..1.0));
    });
    v
}

/// Input tensors of [`make_inputs_shared`] kept for reuse across problems: a large
/// weight (an LM head, hundreds of millions of elements quantized) is drawn once
/// for every slot race that binds it. Only tensors of `min_bytes` or more are kept.
pub struct InputMemo {
    min_bytes: usize,
    kept: Mutex<HashMap<MemoKey, Arc<HostTensor>>>,
}

/// A kept input: the seed, the buffer's id, shape and storage type.
type MemoKey = (u64, &'static str, Vec<usize>, DType);

impl InputMemo {
    pub fn new(min_bytes: usize) -> InputMemo {
        InputMemo { min_bytes, kept: Mutex::new(HashMap::new()) }
    }

    fn get_or_make(&self, seed: u64, spec: &BufSpec, make: impl FnOnce() -> HostTensor) -> Arc<HostTensor> {
        let key = (seed, spec.id, spec.shape.clone(), spec.dtype);
        let lock = || self.kept.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = lock().get(&key) {
            return t.clone();
        }
        let t = Arc::new(make());
        if t.bytes().len() >= self.min_bytes {
            lock().insert(key, t.clone());
        }
        t
    }
}

/// The `pages` of a [`Problem::AttentionPaged`] as the parity check, the races
/// and `bench-kernels` run it, a function of the problem alone: the tokens split
/// unevenly over the sequences (one at least each, the first a decode token
/// where the others can take the rest, so decode tokens and prefill chunks mix), KV lengths from the queries' own to the table's whole, each
/// sequence's blocks scattered over the pool, and from the second sequence on the
/// first half of the blocks it has in common with the first one shared with it (a
/// shared prefix); entries past a sequence's blocks name no block (`blocks`).
/// None for another op, or a problem whose tokens cannot fit its tables.
pub fn paged_layout(problem: &Problem) -> Option<Vec<f32>> {
    let Problem::AttentionPaged { seqs, tokens, page, blocks, max_blocks, .. } = *problem else { return None };
    let cap = page * max_blocks;
    if seqs == 0 || tokens < seqs || tokens > seqs * cap || blocks == 0 {
        return None;
    }
    // A small LCG: deterministic, no draw.
    let mut state = (tokens * 31 + seqs * 7 + blocks) as u64;
    let mut next = |n: usize| {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 33) % n.max(1) as u64) as usize
    };
    let mut q_len = vec![1usize; seqs];
    let mut left = tokens - seqs;
    // The first sequence a decode token where another can take the rest.
    let chunks = if seqs > 1 && left <= (seqs - 1) * (cap - 1) { 1 } else { 0 };
    while left > 0 {
        let s = chunks + next(seqs - chunks);
        if q_len[s] < cap {
            q_len[s] += 1;
            left -= 1;
        }
    }
    // The pool's blocks in a scattered order (a stride coprime with their count).
    let stride = (5..).step_by(2).find(|k| gcd(*k, blocks) == 1).unwrap_or(1);
    let mut fresh = (0..).map(|i: usize| (i * stride + 3) % blocks);
    let width = 2 + max_blocks;
    let mut out = vec![blocks as f32; seqs * width];
    let mut first: Vec<usize> = Vec::new();
    for s in 0..seqs {
        let kv = q_len[s] + next(cap - q_len[s] + 1);
        let n = kv.div_ceil(page);
        let shared = if s == 0 { 0 } else { n.min(first.len()) / 2 };
        let row = &mut out[s * width..][..width];
        row[0] = q_len[s] as f32;
        row[1] = kv as f32;
        let ids: Vec<usize> = first[..shared].iter().copied().chain(fresh.by_ref().take(n - shared)).collect();
        for (slot, id) in row[2..].iter_mut().zip(&ids) {
            *slot = *id as f32;
        }
        if s == 0 {
            first = ids;
        }
    }
    Some(out)
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The pool rows no query of a [`Problem::AttentionPaged`] sees set to the
/// sentinel (as a cache's tail is), so a kernel reading another sequence's
/// block, a row past a length or before a window shows.
fn mask_paged_pool(problem: &Problem, v: &mut [f32]) {
    let Problem::AttentionPaged { kv_heads, head_dim, page, max_blocks, window, .. } = *problem else { return };
    let Some(pages) = paged_layout(problem) else { return };
    let row = page * head_dim; // one KV head's rows of one block
    let mut seen = vec![false; v.len() / head_dim.max(1)];
    for meta in pages.chunks(2 + max_blocks) {
        let (q_len, kv) = (meta[0] as usize, meta[1] as usize);
        let lo = super::problem::attention_keys(kv - q_len, window, (0, 0)).0;
        for j in lo..kv {
            let block = meta[2 + j / page] as usize;
            for kh in 0..kv_heads {
                seen[((block * kv_heads + kh) * row + (j % page) * head_dim) / head_dim] = true;
            }
        }
    }
    for (r, chunk) in v.chunks_mut(head_dim.max(1)).enumerate() {
        if !seen[r] {
            chunk.fill(SENTINEL);
        }
    }
}

fn mask_cache_tail(problem: &Problem, spec: &BufSpec, v: &mut [f32]) {
    if matches!(problem, Problem::AttentionPaged { .. }) {
        return mask_paged_pool(problem, v);
    }
    let (kv_len, kv_cap, d) = match *problem {
        Problem::AttentionPrefill { kv_len, kv_cap, head_dim, .. } | Problem::AttentionDecode { kv_len, kv_cap, head_dim, .. } => {
            (kv_len, kv_cap, head_dim)
        }
        _ => return,
    };
    let heads = spec.shape[0];
    for h in 0..heads {
        for j in kv_len..kv_cap {
            v[(h * kv_cap + j) * d..][..d].fill(SENTINEL);
        }
    }
}

/// Output lengths of `problem`, binding order.
pub fn output_lens(problem: &Problem, dtype: DType) -> Vec<usize> {
    problem.buffers(dtype).iter().filter(|s| s.is_output()).map(BufSpec::len).collect()
}

/// Runs a CPU variant on host inputs; returns the outputs.
pub fn run_cpu(k: &KernelDef, problem: &Problem, dtype: DType, params: &Params, ins: &[HostTensor]) -> Result<Vec<Vec<f32>>, KernelError> {
    let mut outs: Vec<Vec<f32>> = output_lens(problem, dtype).into_iter().map(|n| vec![SENTINEL; n]).collect();
    let args = CpuArgs { ins: ins.iter().map(HostTensor::as_in).collect(), outs: outs.iter_mut().map(|v| v.as_mut_slice()).collect() };
    k.run_cpu(problem, dtype, params, args)?;
    Ok(outs)
}

/// GPU buffers of one problem, inputs uploaded and outputs filled with the sentinel.
pub struct GpuBuffers {
    pub buffers: Vec<wgpu::Buffer>,
    pub specs: Vec<BufSpec>,
}

impl GpuBuffers {
    pub fn new(gpu: &GpuCtx, problem: &Problem, dtype: DType, ins: &[HostTensor]) -> GpuBuffers {
        let specs = problem.buffers(dtype);
        let mut inputs = ins.iter();
        let buffers = specs
            .iter()
            .map(|s| {
                if s.is_output() && s.dtype == DType::F16 {
                    gpu.upload(s.id, bytemuck::cast_slice(&vec![f16::from_f32(SENTINEL); s.len()]))
                } else if s.is_output() {
                    let fill = vec![SENTINEL; s.len()];
                    gpu.upload(s.id, bytemuck::cast_slice(&fill))
                } else {
                    let t = inputs.next().map(HostTensor::bytes).unwrap_or_default();
                    gpu.upload(s.id, &t)
                }
            })
            .collect();
        GpuBuffers { buffers, specs }
    }

    pub fn refs(&self) -> Vec<&wgpu::Buffer> {
        self.buffers.iter().collect()
    }

    pub fn read_outputs(&self, gpu: &GpuCtx) -> Result<Vec<Vec<f32>>, KernelError> {
        let mut outs = Vec::new();
        for (s, b) in self.specs.iter().zip(&self.buffers) {
            if s.is_output() && s.dtype == DType::F16 {
                let bytes = gpu.read(b, s.bytes())?;
                outs.push(bytemuck::pod_collect_to_vec::<u8, f16>(&bytes).into_iter().map(f16::to_f32).collect());
            } else if s.is_output() {
                let bytes = gpu.read(b, (s.len() * 4) as u64)?;
                outs.push(bytemuck::pod_collect_to_vec(&bytes));
            }
        }
        Ok(outs)
    }
}

/// `problem` at another position than its own (the first or the capacity's last
/// KV length, position 0 or 1), for a problem that has one ([`pass_position`]).
fn elsewhere(problem: &Problem) -> Option<Problem> {
    let mut p = problem.clone();
    match &mut p {
        Problem::Rope { pos0, .. } | Problem::QkNormRope { pos0, .. } => *pos0 = usize::from(*pos0 == 0),
        // Another row of the cache, which must exist.
        Problem::QkvRopeCache { pos0, kv_cap, .. } => *pos0 = if *pos0 == 0 { kv_cap.saturating_sub(1) } else { 0 },
        Problem::AttentionDecode { kv_len, kv_cap, .. } => *kv_len = if *kv_len == *kv_cap { 1 } else { *kv_cap },
        _ => return None,
    }
    Some(p)
}

/// Runs a WGSL variant on host inputs; returns the outputs. A kernel that reads
/// the pass position is built as the runtime builds it, for another position
/// ([`elsewhere`]), and moved to the problem's by the position buffer
/// ([`KernelDef::prepare_wgsl`]): what it computes must come from that buffer.
pub fn run_gpu(
    gpu: &GpuCtx,
    k: &KernelDef,
    problem: &Problem,
    dtype: DType,
    params: &Params,
    ins: &[HostTensor],
) -> Result<Vec<Vec<f32>>, KernelError> {
    let bufs = GpuBuffers::new(gpu, problem, dtype, ins);
    let prog = match (pass_position(problem), elsewhere(problem)) {
        (Some((pos0, tokens)), Some(moved)) => {
            let position = gpu.uniform("position", &crate::gpu::position_words(pos0, tokens));
            k.prepare_wgsl(gpu, &moved, dtype, params, &bufs.refs(), Some(&position))?
        }
        _ => k.prepare_wgsl(gpu, problem, dtype, params, &bufs.refs(), None)?,
    };
    gpu.run(k.id, &[&prog])?;
    bufs.read_outputs(gpu)
}

/// Tolerance on the error relative to the output's scale.
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2e-4,
        // Inputs are exactly representable in f16 and accumulation is f32, so the
        // error budget covers reduction order and fast transcendental functions.
        DType::F16 => 1e-3,
        // The reference uses the dequantized weights, so only f32 accumulation
        // order differs; the weights' spread of magnitudes costs a little more.
        _ => 5e-4,
    }
}

/// [`tolerance`] for one variant on `problem`: quantized kernels that also quantize
/// their activations to int8 blocks (`act_bits = 8`, llama.cpp's q8 path) are
/// judged against the f32-activation reference with a 2% budget (about 0.5%
/// typical), twice that where each output is the product of two such dots (the
/// gated activation of a fused gate/up, or of the experts' gate/up: their errors add); those that round their
/// activations (and f32 weights: the matrix-tile GEMMs) to f16 (`act_bits = 16`,
/// or `f16_tiles = 1`) with 2e-3.
pub fn tolerance_for(problem: &Problem, params: &Params, dtype: DType) -> f64 {
    let gated = matches!(problem, Problem::GateUp { .. } | Problem::MoeGateUp { .. } | Problem::NormGemv { act: Some(_), .. });
    match params.get("act_bits") {
        Some(&8) if dtype.is_quant() && gated => 4e-2,
        Some(&8) if dtype.is_quant() => 2e-2,
        Some(&16) => 2e-3,
        // f16 workgroup tiles round activations and weights to f16 likewise
        _ if params.get("f16_tiles") == Some(&1) => 2e-3,
        _ => tolerance(dtype),
    }
}

/// Outcome of one parity check.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub kernel: String,
    pub dtype: DType,
    pub params: Params,
    pub problem: String,
    /// Largest absolute difference from the reference over all outputs.
    pub max_abs_err: f64,
    /// Largest absolute reference value (the scale errors are judged against).
    pub scale: f64,
    pub rel_err: f64,
    pub tolerance: f64,
    pub passed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Compares kernel outputs with reference outputs.
pub fn compare(outs: &[Vec<f32>], want: &[Vec<f64>]) -> (f64, f64) {
    let mut err: f64 = 0.0;
    let mut scale: f64 = 0.0;
    for (o, w) in outs.iter().zip(want) {
        if o.len() != w.len() {
            return (f64::INFINITY, 1.0);
        }
        for (a, b) in o.iter().zip(w) {
            let d = (*a as f64 - b).abs();
            err = if d.is_nan() { f64::INFINITY } else { err.max(d) };
            scale = scale.max(b.abs());
        }
    }
    (err, scale.max(1e-3))
}

/// Where a variant runs for a check.
pub enum Runner<'a> {
    Cpu,
    Gpu(&'a GpuCtx),
}

/// Runs one variant on one problem and judges it against the reference.
pub fn check_one(runner: &Runner<'_>, k: &KernelDef, problem: &Problem, dtype: DType, params: &Params, seed: u64) -> Check {
    let ins = make_inputs(problem, dtype, seed);
    let want = reference::compute(problem, &ins.iter().map(HostTensor::to_f64).collect::<Vec<_>>());
    let got = match runner {
        Runner::Cpu => run_cpu(k, problem, dtype, params, &ins),
        Runner::Gpu(g) => run_gpu(g, k, problem, dtype, params, &ins),
    };
    let tol = tolerance_for(problem, params, dtype);
    let base = Check {
        kernel: k.id.to_string(),
        dtype,
        params: params.clone(),
        problem: problem.describe(),
        max_abs_err: f64::INFINITY,
        scale: 0.0,
        rel_err: f64::INFINITY,
        tolerance: tol,
        passed: false,
        error: None,
    };
    match got {
        Err(e) => Check { error: Some(e.to_string()), ..base },
        Ok(outs) => {
            let (err, scale) = compare(&outs, &want);
            let rel = err / scale;
            Check { max_abs_err: err, scale, rel_err: rel, passed: rel <= tol, ..base }
        }
    }
}

/// The parameter sets a parity sweep covers for `k`: the defaults, then each
/// parameter moved through all its values with the others at their defaults
/// (every value of every parameter is exercised), then all at their last values
/// together. `all` gives the full product.
pub fn param_sweep(k: &KernelDef, all: bool) -> Vec<Params> {
    if all {
        return k.all_params();
    }
    let base = k.default_params();
    let mut out = vec![base.clone()];
    out.extend(axis_neighbours(k, &base));
    // Every parameter at its last value together: reaches values that are only
    // valid in combination (e.g. rows_per_pass 4 needs act_bits 8).
    let mut last = base.clone();
    for spec in k.params {
        if let Some(&v) = spec.values.last() {
            last.insert(spec.name.to_string(), v);
        }
    }
    if !out.contains(&last) {
        out.push(last);
    }
    out
}

/// The parameter sets one axis away from `center`: each parameter moved through
/// its other values with the rest as in `center`.
pub fn axis_neighbours(k: &KernelDef, center: &Params) -> Vec<Params> {
    let mut out = Vec::new();
    for spec in k.params {
        let at = center.get(spec.name).copied().unwrap_or(spec.default);
        for &v in spec.values {
            if v == at {
                continue;
            }
            let mut p = center.clone();
            p.insert(spec.name.to_string(), v);
            out.push(p);
        }
    }
    out
}

/// Result of sweeping one kernel over its test problems.
#[derive(Clone, Debug, Serialize)]
pub struct KernelVerdict {
    pub kernel: String,
    pub backend: &'static str,
    pub checks: usize,
    pub failed: usize,
    /// Worst relative error over the checks that ran.
    pub worst_rel_err: f64,
    pub worst_abs_err: f64,
    /// Variants skipped because they are not valid for a shape or this device.
    pub skipped: usize,
    /// Failing checks (all of them) and, when nothing ran, the reason.
    pub failures: Vec<Check>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_run: Option<String>,
}

/// Checks every parameter set of `k` (see [`param_sweep`]) in each dtype on every
/// test problem of its op that the variant accepts on this device.
/// Which parameter sets and storage types a parity sweep of one kernel covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sweep {
    /// [`param_sweep`]'s axes, each set on every storage type the kernel takes.
    Axes,
    /// The axes, the defaults on every storage type and test problem, each
    /// other set on [`FORMATS_PER_SET`] of the storage types and
    /// [`PROBLEMS_PER_SET`] of the problems valid for it, both rotating, so that
    /// every storage type and problem meets several sets and every set several
    /// of each: the test suite's sweep (on a software adapter each check is a
    /// shader compile or a dispatch the CPU runs; the tuner's gate still checks
    /// every variant it races on the shapes and device it tunes).
    AxesRotating,
    /// The full product of the parameters, each on every storage type.
    Full,
}

/// Storage types each non-default parameter set of [`Sweep::AxesRotating`] runs on.
pub const FORMATS_PER_SET: usize = 3;

/// Test problems each non-default parameter set of [`Sweep::AxesRotating`] runs
/// on (of those valid for it and the storage type).
pub const PROBLEMS_PER_SET: usize = 2;

/// The `per` of `all` that parameter set number `set` of `sweep` takes: all of
/// them, or for a non-default set of [`Sweep::AxesRotating`] `per`, rotating.
fn rotated<T: Copy>(sweep: Sweep, set: usize, all: &[T], per: usize) -> Vec<T> {
    let n = all.len();
    if sweep != Sweep::AxesRotating || set == 0 || n <= per {
        return all.to_vec();
    }
    (0..per).map(|j| all[((set - 1) * per + j) % n]).collect()
}

/// The storage types parameter set number `set` of `sweep` runs on.
pub fn sweep_dtypes(k: &KernelDef, sweep: Sweep, set: usize) -> Vec<DType> {
    rotated(sweep, set, k.dtypes, FORMATS_PER_SET)
}

/// The test problems (numbered, of those valid: `valid`) parameter set number
/// `set` of `sweep` runs on.
pub fn sweep_problems<'p>(sweep: Sweep, set: usize, valid: &[(usize, &'p Problem)]) -> Vec<(usize, &'p Problem)> {
    rotated(sweep, set, valid, PROBLEMS_PER_SET)
}

pub fn verify_kernel(runner: &Runner<'_>, caps: Caps<'_>, k: &KernelDef, sweep: Sweep) -> KernelVerdict {
    let mut v = KernelVerdict {
        kernel: k.id.to_string(),
        backend: k.backend().name(),
        checks: 0,
        failed: 0,
        worst_rel_err: 0.0,
        worst_abs_err: 0.0,
        skipped: 0,
        failures: Vec::new(),
        not_run: None,
    };
    let mut last_reason = None;
    let problems = super::problem::test_problems(k.op);
    for (pi, params) in param_sweep(k, sweep == Sweep::Full).iter().enumerate() {
        for dtype in sweep_dtypes(k, sweep, pi) {
            let mut valid = Vec::with_capacity(problems.len());
            for (qi, problem) in problems.iter().enumerate() {
                match k.check(caps, problem, dtype, params) {
                    Ok(()) => valid.push((qi, problem)),
                    Err(reason) => {
                        v.skipped += 1;
                        last_reason = Some(reason);
                    }
                }
            }
            for (qi, problem) in sweep_problems(sweep, pi, &valid) {
                let seed = 0x5eed ^ ((pi as u64) << 32) ^ ((qi as u64) << 8) ^ dtype as u64;
                let c = check_one(runner, k, problem, dtype, params, seed);
                v.checks += 1;
                if c.rel_err.is_finite() {
                    v.worst_rel_err = v.worst_rel_err.max(c.rel_err);
                    v.worst_abs_err = v.worst_abs_err.max(c.max_abs_err);
                }
                if !c.passed {
                    v.failed += 1;
                    v.worst_rel_err = v.worst_rel_err.max(c.rel_err);
                    v.failures.push(c);
                }
            }
        }
    }
    if v.checks == 0 {
        v.not_run = last_reason.or_else(|| Some("no test problem".into()));
    }
    v
}

/// Whether `k` runs on the runner's kind of device.
pub fn runs_on(k: &KernelDef, runner: &Runner<'_>) -> bool {
    matches!((&k.imp, runner), (Impl::Cpu(_), Runner::Cpu) | (Impl::Wgsl(_), Runner::Gpu(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rotating sweep runs the defaults on every valid test problem and each
    /// other set on a few, rotating: every problem meets some other sets.
    #[test]
    fn rotating_problems_cover_every_problem_with_the_defaults_and_with_other_sets() {
        let p: Vec<Problem> = (1..=5).map(|n| Problem::Gemm { m: n, n: 8, k: 8 }).collect();
        let valid: Vec<(usize, &Problem)> = p.iter().enumerate().collect();
        let numbers = |sweep, set| sweep_problems(sweep, set, &valid).iter().map(|(i, _)| *i).collect::<Vec<_>>();
        assert_eq!(numbers(Sweep::AxesRotating, 0), vec![0, 1, 2, 3, 4], "the defaults on every problem");
        assert_eq!(numbers(Sweep::Axes, 3), vec![0, 1, 2, 3, 4]);
        assert_eq!(numbers(Sweep::AxesRotating, 1), vec![0, 1]);
        assert_eq!(numbers(Sweep::AxesRotating, 3), vec![4, 0]);
        let mut met: Vec<usize> = (1..4).flat_map(|s| numbers(Sweep::AxesRotating, s)).collect();
        met.sort_unstable();
        met.dedup();
        assert_eq!(met, vec![0, 1, 2, 3, 4], "three other sets meet every problem");
        assert_eq!(sweep_problems(Sweep::AxesRotating, 2, &valid[..1]).len(), 1, "fewer problems than a set takes: all");
    }

    /// The rotating sweep keeps the defaults on every format and gives every format
    /// of a many-format kernel some other parameter sets too.
    #[test]
    fn rotating_formats_cover_every_format_with_the_defaults_and_with_other_sets() {
        let many = crate::kernels::registry().iter().filter(|k| k.dtypes.len() > FORMATS_PER_SET && param_sweep(k, false).len() > 1);
        let mut seen = 0;
        for k in many {
            let sets = param_sweep(k, false).len();
            assert_eq!(sweep_dtypes(k, Sweep::AxesRotating, 0), k.dtypes.to_vec(), "{}: the defaults on every format", k.id);
            let mut met: Vec<DType> = Vec::new();
            for d in (1..sets).flat_map(|s| sweep_dtypes(k, Sweep::AxesRotating, s)) {
                if !met.contains(&d) {
                    met.push(d);
                }
            }
            let want = ((sets - 1) * FORMATS_PER_SET).min(k.dtypes.len());
            assert_eq!(met.len(), want, "{}: {} of {} formats meet a non-default set", k.id, met.len(), k.dtypes.len());
            assert_eq!(sweep_dtypes(k, Sweep::Axes, 1), k.dtypes.to_vec());
            seen += 1;
        }
        assert!(seen > 0, "no kernel takes more than {FORMATS_PER_SET} formats");
    }
}
