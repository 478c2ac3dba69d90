//! The sampler's WGSL program (`shaders/sample.wgsl`): built once over a logits
//! buffer, a state buffer and an output buffer, recorded after the LM head every
//! token. The step and the penalty history live in the state buffer, which the
//! program advances itself, so a program is never rebuilt between tokens; the id
//! lands in the output buffer's first word (for the next embedding lookup or a
//! readback of 4 bytes).

use super::{Derived, STATE_HEADER_WORDS, SampleError, SamplerParams, SamplerState};
use crate::gpu::{Bind, GpuCtx, GpuProgram, Shader, grid_2d, groups};

/// The sampler's shader.
pub static SHADER: Shader = crate::shader!("sample.wgsl", "argmax_wg.wgsl");

/// Invocations per workgroup (the shader's `WG`).
const WG: u32 = 256;

/// The params uniform's words (the shader's `Params`).
fn uniform_words(vocab: u32, seed: u64, d: &Derived) -> Vec<u32> {
    vec![
        vocab,
        d.top_k,
        u32::from(d.greedy),
        d.top_p_q,
        seed as u32,
        (seed >> 32) as u32,
        d.last_n,
        0,
        d.neg_scale_p.to_bits(),
        d.neg_scale_t.to_bits(),
        d.ln_min_p.to_bits(),
        d.penalty.to_bits(),
        d.inv_penalty.to_bits(),
    ]
}

/// Bytes of the state buffer for `params` (its history capacity).
pub fn state_bytes(params: &SamplerParams) -> u64 {
    4 * (STATE_HEADER_WORDS as u64 + params.derived().last_n as u64)
}

/// A state buffer holding `state` (a new generation: `SamplerState::new(params.derived().last_n)`).
pub fn state_buffer(gpu: &GpuCtx, state: &SamplerState) -> wgpu::Buffer {
    gpu.upload("sample state", bytemuck::cast_slice(&state.words()))
}

/// Overwrites a state buffer (a new generation on the same program).
pub fn write_state(gpu: &GpuCtx, buf: &wgpu::Buffer, state: &SamplerState) {
    gpu.queue.write_buffer(buf, 0, bytemuck::cast_slice(&state.words()));
}

/// The first `words` u32s of `buf` (waits for the GPU): `1` for the id of an
/// output buffer.
pub fn read_words(gpu: &GpuCtx, buf: &wgpu::Buffer, words: usize) -> Result<Vec<u32>, SampleError> {
    let bytes = gpu.read(buf, 4 * words as u64)?;
    Ok(bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// Reads a state buffer back (waits for the GPU).
pub fn read_state(gpu: &GpuCtx, buf: &wgpu::Buffer) -> Result<SamplerState, SampleError> {
    let words = read_words(gpu, buf, (buf.size() / 4) as usize)?;
    SamplerState::from_words(&words).ok_or_else(|| SampleError::Buffer("the state buffer does not hold a sampler state".into()))
}

/// The program sampling `vocab` f32 logits of `logits` with `params`: three
/// dispatches (prep, penalty, pick) that read and advance `state` (made by
/// [`state_buffer`] with this `params`' history capacity) and write the id as a
/// u32 to the first word of `out`. It owns its uniform and its scratch (`vocab`
/// f32s).
pub fn prepare_wgsl(
    gpu: &GpuCtx,
    logits: &wgpu::Buffer,
    vocab: usize,
    params: &SamplerParams,
    state: &wgpu::Buffer,
    out: &wgpu::Buffer,
) -> Result<GpuProgram, SampleError> {
    params.validate()?;
    let d = params.derived();
    let need = |what: &str, buf: &wgpu::Buffer, bytes: u64| {
        if buf.size() < bytes {
            return Err(SampleError::Buffer(format!("the {what} buffer has {} bytes, it needs {bytes}", buf.size())));
        }
        Ok(())
    };
    if vocab == 0 || vocab > u32::MAX as usize / 2 {
        return Err(SampleError::Buffer(format!("a vocabulary of {vocab} tokens (1 to 2^31 - 1)")));
    }
    need("logits", logits, 4 * vocab as u64)?;
    need("state", state, state_bytes(params))?;
    need("output", out, 4)?;
    let u = gpu.uniform("sample params", &uniform_words(vocab as u32, params.seed, &d));
    let xs = gpu.storage("sample scratch", 4 * vocab as u64);
    let step = |entry: &str, binds: &[(u32, &wgpu::Buffer)], workgroups: [u32; 3]| -> Result<_, SampleError> {
        let pipe = gpu.pipeline(&SHADER, entry, &[])?;
        let entries = binds.iter().map(|&(i, b)| Bind::Whole(b).entry(i)).collect();
        Ok(gpu.step_entries(format!("sample.{entry}"), pipe, entries, workgroups)?)
    };
    let steps = vec![
        step("prep", &[(0, logits), (1, &xs), (4, &u)], grid_2d(groups(vocab, WG)))?,
        step("penalty", &[(1, &xs), (2, state), (4, &u)], [1, 1, 1])?,
        step("pick", &[(1, &xs), (2, state), (3, out), (4, &u)], [1, 1, 1])?,
    ];
    Ok(GpuProgram { steps, owned: vec![u, xs] })
}

/// The program with its own state and output buffers: what an executor records
/// after its LM head (`program`), hands to the embedding lookup (`out`, the id in
/// its first word) and restarts for each generation ([`GpuSampler::restart`]).
pub struct GpuSampler {
    pub program: GpuProgram,
    pub state: wgpu::Buffer,
    pub out: wgpu::Buffer,
    capacity: u32,
}

impl GpuSampler {
    /// A sampler of `vocab` logits of `logits` at step 0 with an empty history.
    pub fn new(gpu: &GpuCtx, logits: &wgpu::Buffer, vocab: usize, params: &SamplerParams) -> Result<GpuSampler, SampleError> {
        let capacity = params.derived().last_n;
        let state = state_buffer(gpu, &SamplerState::new(capacity));
        let out = gpu.storage("sample id", 4);
        let program = prepare_wgsl(gpu, logits, vocab, params, &state, &out)?;
        Ok(GpuSampler { program, state, out, capacity })
    }

    /// A new generation: step 0, no history (one queue write).
    pub fn restart(&self, gpu: &GpuCtx) {
        write_state(gpu, &self.state, &SamplerState::new(self.capacity));
    }

    /// The last id written (waits for the GPU).
    pub fn read_id(&self, gpu: &GpuCtx) -> Result<u32, SampleError> {
        Ok(read_words(gpu, &self.out, 1)?[0])
    }
}

/// The shader's primitives over `inputs` (for the tests): per input `x` at `i`,
/// Philox4x32-10 of counter `(x, i, next, !x)` under `seed`, `mulhilo(x, next)`
/// (`next` the following input, cyclically), and the weights of
/// `d = -|canon(x)|` at `params`' two scales: 8 words.
pub fn probe(gpu: &GpuCtx, inputs: &[u32], seed: u64, params: &SamplerParams) -> Result<Vec<u32>, SampleError> {
    let n = inputs.len();
    let u = gpu.uniform("sample probe params", &uniform_words(n as u32, seed, &params.derived()));
    let xs = gpu.upload("sample probe inputs", bytemuck::cast_slice(inputs));
    let out = gpu.storage("sample probe out", 32 * n as u64);
    let pipe = gpu.pipeline(&SHADER, "probe", &[])?;
    let entries = [(1, &xs), (3, &out), (4, &u)].iter().map(|&(i, b)| Bind::Whole(b).entry(i)).collect();
    let s = gpu.step_entries("sample.probe".into(), pipe, entries, [groups(n, WG), 1, 1])?;
    gpu.run("sample probe", &[&GpuProgram { steps: vec![s], owned: Vec::new() }])?;
    read_words(gpu, &out, 8 * n)
}
