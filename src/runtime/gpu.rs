//! The GPU executor: plan buffers as wgpu storage buffers (weights uploaded once),
//! each step's program (pipelines and bind groups) built once and kept. The
//! position lives in one 16-byte uniform, written once a pass
//! ([`crate::gpu::position_words`]), that RoPE, the q/k norm + RoPE, the KV write
//! and decode attention read: their programs serve every position, so a decode
//! token after the first rebuilds nothing and creates no GPU object. Its
//! embedding is looked up on the GPU (`shaders/embed.wgsl`, the token id in that
//! uniform) when the table is the tied LM head's buffers, so the uniform is its
//! only queue write (else the host writes the row too); greedy decoding takes the
//! argmax there as well ([`Selector`]) and reads back 8 bytes, not the logits.
//! Prefill attention, whose grid follows the pass's keys, is rebuilt as the
//! position moves, reusing the old program's uniform and scratch buffers and bind
//! groups ([`GpuCtx::rebuild`]). With `batch`
//! one command buffer and one submit per forward pass, the logits' copy to
//! persistent staging buffers included, and one wait; without, one submit per step.
//! [`GpuExec::run`] splits its host time into phases ([`Phases`]); what it asks of
//! the device is counted by the context ([`crate::gpu::GpuCounters`]).

use std::collections::HashMap;
use std::sync::Arc;

use super::counters::{Lap, Phases};
use super::{RuntimeError, SlotTimes};
use crate::gpu::builtin::{EMBED, RUNTIME_PLUMB as PLUMB, SELECT_ARGMAX};
use crate::gpu::{Bind, GpuCtx, GpuProgram, POSITION_BINDING, grid_2d, groups, position_words};
use crate::kernels::{DType, Params, Problem};
use crate::plan::{BufId, Plan, Plumb, Step, StepKind};

const WG: u32 = 256;

/// What a prepared program was built for, the position left out (the programs
/// that depend on it read the position buffer); a step whose signature changes is
/// rebuilt.
#[derive(Clone, PartialEq)]
enum Sig {
    Kernel(&'static str, Params, DType, Problem, Vec<BufId>),
    Plumb(Plumb),
}

/// `problem` without the position its program reads from the position buffer
/// (RoPE's and q/k norm + RoPE's first position, decode attention's KV length).
fn unplaced(problem: &Problem) -> Problem {
    let mut p = problem.clone();
    match &mut p {
        Problem::Rope { pos0, .. } | Problem::QkNormRope { pos0, .. } | Problem::QkvRopeCache { pos0, .. } => *pos0 = 0,
        Problem::AttentionDecode { kv_len, .. } => *kv_len = 0,
        _ => {}
    }
    p
}

/// `plumb` without the position the KV write reads from the position buffer.
fn unplaced_plumb(plumb: &Plumb) -> Plumb {
    let mut p = plumb.clone();
    if let Plumb::KvWrite { pos0, .. } = &mut p {
        *pos0 = 0;
    }
    p
}

impl Sig {
    fn of(step: &Step) -> Sig {
        match &step.kind {
            StepKind::Kernel { kernel, params, dtype, problem, binds, .. } => {
                Sig::Kernel(kernel.id, params.clone(), *dtype, unplaced(problem), binds.clone())
            }
            StepKind::Plumb(p) => Sig::Plumb(unplaced_plumb(p)),
        }
    }

    /// Whether `step` is what this signature was taken of (without building a
    /// signature of it: no allocation).
    fn matches(&self, step: &Step) -> bool {
        match (self, &step.kind) {
            (Sig::Kernel(id, p, d, prob, b), StepKind::Kernel { kernel, params, dtype, problem, binds, .. }) => {
                *id == kernel.id && p == params && d == dtype && b == binds && *prob == unplaced(problem)
            }
            (Sig::Plumb(a), StepKind::Plumb(b)) => *a == unplaced_plumb(b),
            _ => false,
        }
    }

    /// Whether `other` is the same kernel (or plumbing entry) with the same
    /// parameters over the same buffers, whatever the problem's values.
    fn same_program(&self, other: &Sig) -> bool {
        match (self, other) {
            (Sig::Kernel(a, pa, da, _, ba), Sig::Kernel(b, pb, db, _, bb)) => a == b && pa == pb && da == db && ba == bb,
            (Sig::Plumb(a), Sig::Plumb(b)) => std::mem::discriminant(a) == std::mem::discriminant(b),
            _ => false,
        }
    }
}

pub struct GpuExec {
    pub ctx: Arc<GpuCtx>,
    pub bufs: Vec<wgpu::Buffer>,
    /// Byte size of each buffer's contents.
    pub sizes: Vec<u64>,
    progs: HashMap<(usize, usize), (Sig, Option<GpuProgram>)>,
    /// One submit per forward pass (the profile's `execution.batchCommands`).
    pub batch: bool,
    /// Time each step with timestamp queries (one pass per step) on the next run.
    pub profile: bool,
    /// Programs built since creation (pipelines come from the context's cache).
    pub programs_built: usize,
    /// Mappable buffers the reads of [`GpuExec::run`] land in, one per buffer read.
    staging: HashMap<BufId, wgpu::Buffer>,
    /// The pass position (`shaders/position.wgsl`), written once per [`GpuExec::run`].
    position: wgpu::Buffer,
    /// The on-GPU token selection of [`GpuExec::run`] with `select` (built on first use).
    selector: Option<Selector>,
    /// A decode token's embedding looked up on the GPU (`shaders/embed.wgsl`)
    /// from the tied LM head's buffers ([`embed_program`]); `None`: the host
    /// writes the row.
    embed: Option<GpuProgram>,
}

/// The GPU embedding of a decode token: `shaders/embed.wgsl` over the LM head's
/// buffers when they are the embedding table (tied embeddings), in their storage
/// type (f32, f16 or a block format), writing the scaled row into the plan's
/// first hidden state: one step per LM-head block, the block holding the token
/// writes. `None` when the table is not on the GPU (an untied head, or a type
/// the shader does not read), and not called when the head holds other values
/// than the table's (rounded or requantized): the host path, reported by
/// [`GpuExec::embeds_on_gpu`].
fn embed_program(ctx: &GpuCtx, plan: &Plan, bufs: &[wgpu::Buffer], position: &wgpu::Buffer) -> Result<Option<GpuProgram>, RuntimeError> {
    let c = &plan.config;
    let Some(dtype) = plan.lm_head.first().map(|b| plan.buffers[b.weight].dtype) else { return Ok(None) };
    if !c.tie_word_embeddings {
        return Ok(None);
    }
    let x = &bufs[plan.x[0]];
    let (entry, items) = match dtype.quant() {
        Some(fmt) if c.hidden_size.is_multiple_of(fmt.block_elems()) => {
            // Block units, qblock.wgsl's qunits(): 4 values each for q8_0, else 8.
            let units = fmt.block_elems() / if fmt.wgsl_id() == 0 { 4 } else { 8 };
            ("embed_q", c.hidden_size / fmt.block_elems() * units)
        }
        None if dtype == DType::F16 || dtype == DType::F32 => ("embed_f", c.hidden_size),
        _ => return Ok(None),
    };
    let f16 = if dtype == DType::F16 { 1.0 } else { 0.0 };
    let consts = [("WG", WG as f64), ("QFMT", crate::kernels::wgsl::qfmt(dtype)), ("F16", f16)];
    let pipe = ctx.pipeline(&EMBED, entry, &consts).map_err(err)?;
    let mut prog = GpuProgram { steps: Vec::new(), owned: Vec::new() };
    for head in &plan.lm_head {
        let table = &bufs[head.weight];
        let words = [c.hidden_size as u32, (c.embedding_scale() as f32).to_bits(), head.start as u32, head.rows as u32];
        let u = ctx.uniform("embed", &words);
        let binds = match dtype.quant() {
            Some(fmt) => {
                let l = fmt.layout(fmt.blocks_for(head.rows * c.hidden_size));
                vec![
                    Bind::Range(table, 0, l.quants.max(16) as u64),
                    Bind::Range(table, l.scales_offset as u64, l.scales.max(4) as u64),
                    Bind::Whole(x),
                    Bind::Whole(&u),
                ]
            }
            None => vec![Bind::Whole(table), Bind::Whole(x), Bind::Whole(&u)],
        };
        let mut entries: Vec<_> = binds.iter().enumerate().map(|(i, b)| b.entry(i as u32)).collect();
        entries.push((POSITION_BINDING, position.clone(), 0, None));
        prog.steps.push(ctx.step_entries(entry.to_string(), pipe.clone(), entries, grid_2d(groups(items, WG))).map_err(err)?);
        prog.owned.push(u);
    }
    Ok(Some(prog))
}

/// An LM-head block as the selector reads it: its logits buffer, rows and first
/// vocabulary row.
pub type PickBlock = (BufId, usize, usize);

/// Greedy token selection on the GPU (`shaders/select_argmax.wgsl`): one
/// program per LM-head block writes its argmax (vocabulary index, logit) pair to
/// `out`, and with several blocks one more combines them into the pair after
/// theirs; that final pair (8 bytes) is copied to `staging` in the pass's submit
/// and read back. A sampler replaces these programs by its own over the same
/// logits buffers.
pub struct Selector {
    progs: Vec<GpuProgram>,
    out: wgpu::Buffer,
    /// Byte offset of the final pair in `out`.
    at: u64,
    staging: wgpu::Buffer,
}

impl Selector {
    /// `blocks`: each LM-head block's logits buffer, rows and first vocabulary
    /// row, in vocabulary order; `cap`: the final logit softcapping (0: none).
    pub fn new(ctx: &GpuCtx, bufs: &[wgpu::Buffer], blocks: &[PickBlock], cap: f32) -> Result<Selector, RuntimeError> {
        let pipe = ctx.pipeline(&SELECT_ARGMAX, "argmax", &[("WG", WG as f64)]).map_err(err)?;
        let n = blocks.len();
        let out = ctx.storage("selected", (8 * (n + 1)) as u64);
        let mut progs = Vec::with_capacity(n + 1);
        for (k, &(logits, rows, start)) in blocks.iter().enumerate() {
            let u = ctx.uniform("select", &[rows as u32, k as u32, cap.to_bits(), start as u32]);
            let step = ctx.step("argmax", pipe.clone(), &[&bufs[logits], &out, &u], [1, 1, 1]).map_err(err)?;
            progs.push(GpuProgram { steps: vec![step], owned: vec![u] });
        }
        let at = if n > 1 {
            let pipe = ctx.pipeline(&SELECT_ARGMAX, "argmax_blocks", &[("WG", WG as f64)]).map_err(err)?;
            let u = ctx.uniform("select blocks", &[n as u32, 0, 0, 0]);
            let entries = vec![(1, out.clone(), 0, None), (2, u.clone(), 0, None)];
            let step = ctx.step_entries("argmax_blocks".into(), pipe, entries, [1, 1, 1]).map_err(err)?;
            progs.push(GpuProgram { steps: vec![step], owned: vec![u] });
            (8 * n) as u64
        } else {
            0
        };
        Ok(Selector { progs, out, at, staging: ctx.staging(8) })
    }

    /// The token of the final (index, logit bits) pair: 0 when every logit is NaN.
    fn token(pair: &[u32]) -> u32 {
        pair.first().copied().filter(|&i| i != u32::MAX).unwrap_or(0)
    }
}

fn err(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Gpu(e.to_string())
}

impl GpuExec {
    /// Device buffers for `plan`, weights given as bytes by `fill(buffer index)`;
    /// `embed_exact`: the LM head's buffers hold the embedding table's values
    /// exactly (then a tied table is looked up there, [`embed_program`]).
    pub fn new(
        ctx: Arc<GpuCtx>,
        plan: &Plan,
        embed_exact: bool,
        mut fill: impl FnMut(usize) -> Result<Option<Vec<u8>>, RuntimeError>,
    ) -> Result<GpuExec, RuntimeError> {
        let mut bufs = Vec::with_capacity(plan.buffers.len());
        let mut sizes = Vec::with_capacity(plan.buffers.len());
        for (i, b) in plan.buffers.iter().enumerate() {
            if b.bytes() > ctx.caps.max_buffer_size {
                return Err(RuntimeError::Gpu(format!(
                    "buffer `{}` needs {} bytes, over the adapter's max buffer size of {}; use a smaller model or the CPU",
                    b.name,
                    b.bytes(),
                    ctx.caps.max_buffer_size
                )));
            }
            let buf = match fill(i)? {
                Some(bytes) => ctx.upload(&b.name, &bytes),
                None => match &b.constant {
                    Some(c) => ctx.upload(&b.name, bytemuck::cast_slice(c)),
                    None => ctx.storage(&b.name, b.bytes()),
                },
            };
            bufs.push(buf);
            sizes.push(b.bytes());
        }
        let position = ctx.uniform("position", &position_words(0, 0));
        let embed = if embed_exact { embed_program(&ctx, plan, &bufs, &position)? } else { None };
        Ok(GpuExec {
            ctx,
            bufs,
            sizes,
            progs: HashMap::new(),
            batch: true,
            profile: false,
            programs_built: 0,
            staging: HashMap::new(),
            position,
            selector: None,
            embed,
        })
    }

    /// Builds (or keeps) the program of every step of this pass.
    pub fn prepare(&mut self, tokens: usize, steps: &[Step]) -> Result<(), RuntimeError> {
        for (i, step) in steps.iter().enumerate() {
            if self.progs.get(&(tokens, i)).is_some_and(|(old, _)| old.matches(step)) {
                continue;
            }
            let sig = Sig::of(step);
            let old = self.progs.remove(&(tokens, i));
            let build = || -> Result<Option<GpuProgram>, RuntimeError> {
                match &step.kind {
                    StepKind::Kernel { kernel, params, dtype, problem, binds, .. } => {
                        let refs: Vec<&wgpu::Buffer> = binds.iter().map(|&b| &self.bufs[b]).collect();
                        let prog = kernel.prepare_wgsl(&self.ctx, problem, *dtype, params, &refs, Some(&self.position));
                        Ok(Some(prog.map_err(|e| RuntimeError::Kernel {
                            slot: step.slot.name().into(),
                            layer: step.layer,
                            source: Box::new(e),
                        })?))
                    }
                    StepKind::Plumb(p) => self.plumb_program(p),
                }
            };
            // The same kernel over the same buffers with other values (prefill
            // attention's keys): its buffers and bind groups carry over.
            let prog = match old {
                Some((old, Some(prog))) if old.same_program(&sig) => self.ctx.rebuild(prog, build)?,
                _ => build()?,
            };
            self.programs_built += 1;
            self.progs.insert((tokens, i), (sig, prog));
        }
        Ok(())
    }

    fn plumb_program(&self, p: &Plumb) -> Result<Option<GpuProgram>, RuntimeError> {
        let ctx = &self.ctx;
        let consts = [("WG", WG as f64)];
        let b = |id: BufId| &self.bufs[id];
        let (entry, words, binds, items): (&str, Vec<u32>, Vec<&wgpu::Buffer>, usize) = match *p {
            Plumb::Copy { .. } => return Ok(None),
            Plumb::SplitQkv { src, bias, q, k, v, tokens, nq, nkv } => (
                "split_qkv",
                vec![tokens as u32, nq as u32, nkv as u32, bias.is_some() as u32, 0],
                vec![b(src), bias.map_or(b(src), b), b(q), b(k), b(v)],
                tokens * (nq + 2 * nkv),
            ),
            Plumb::BiasAdd { buf, bias, rows, n } => ("bias_add", vec![rows as u32, n as u32, 0, 0, 0], vec![b(bias), b(buf)], rows * n),
            Plumb::KvWrite { k, v, k_cache, v_cache, tokens, kv_heads, head_dim, kv_cap, .. } => {
                let f16 = self.sizes[k_cache] == (kv_heads * kv_cap * head_dim * 2) as u64;
                let entry = if f16 { "kv_write_f16" } else { "kv_write_f32" };
                // The rows land at the position buffer's pos0 (the block's last word is unread).
                let words = vec![tokens as u32, kv_heads as u32, head_dim as u32, kv_cap as u32, 0];
                let n = tokens * kv_heads * head_dim;
                let items = if f16 { n / 2 } else { n };
                let pipe = ctx.pipeline(&PLUMB, entry, &consts).map_err(err)?;
                let mut steps = Vec::new();
                let mut owned = Vec::new();
                for (src, dst) in [(k, k_cache), (v, v_cache)] {
                    let u = ctx.uniform(entry, &words);
                    let entries = [(0, b(src)), (1, b(dst)), (2, &u), (POSITION_BINDING, &self.position)]
                        .map(|(i, buf)| (i, buf.clone(), 0, None))
                        .to_vec();
                    steps.push(ctx.step_entries(entry.to_string(), pipe.clone(), entries, grid_2d(groups(items, WG))).map_err(err)?);
                    owned.push(u);
                }
                return Ok(Some(GpuProgram { steps, owned }));
            }
        };
        let pipe = ctx.pipeline(&PLUMB, entry, &consts).map_err(err)?;
        let u = ctx.uniform(entry, &words);
        let mut all = binds;
        all.push(&u);
        let step = ctx.step(entry, pipe, &all, grid_2d(groups(items, WG))).map_err(err)?;
        Ok(Some(GpuProgram { steps: vec![step], owned: vec![u] }))
    }

    /// Runs one forward pass of `tokens` tokens from position `pos0` (written to
    /// the position buffer) and returns the first `len` floats of each buffer of
    /// `reads` (copied to persistent staging buffers in the same submit, one wait
    /// for both); per-step GPU times go to `times` when profiling
    /// (timestamp queries), else the pass's wall time goes to `times.total`. Its
    /// host time is added to `phases` (prepare, encode, submit, wait, post).
    /// With `select` (`(blocks, cap)` as [`Selector::new`] takes them) the pass
    /// ends with the on-GPU selection and its token comes back too (8 bytes
    /// read back). With `token` (a decode step, when
    /// [`GpuExec::embeds_on_gpu`]) the pass starts with that token's embedding,
    /// its id written with the position (the step's only queue write).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &mut self,
        tokens: usize,
        pos0: usize,
        token: Option<u32>,
        steps: &[Step],
        times: &mut SlotTimes,
        reads: &[(BufId, usize)],
        select: Option<(&[PickBlock], f32)>,
        phases: &mut Phases,
    ) -> Result<(Vec<Vec<f32>>, Option<u32>), RuntimeError> {
        let mut lap = Lap::start();
        self.prepare(tokens, steps)?;
        if let Some((blocks, cap)) = select
            && self.selector.is_none()
        {
            self.selector = Some(Selector::new(&self.ctx, &self.bufs, blocks, cap)?);
        }
        let mut words = position_words(pos0, tokens);
        let embed = self.embed.as_ref().filter(|_| token.is_some());
        if embed.is_some() {
            words[2] = token.unwrap_or(0);
        }
        self.ctx.write(&self.position, 0, bytemuck::cast_slice(&words));
        for &(id, len) in reads {
            if self.staging.get(&id).is_none_or(|b| b.size() < crate::gpu::padded((len * 4) as u64)) {
                self.staging.insert(id, self.ctx.staging((len * 4) as u64));
            }
        }
        phases.prepare += lap.lap();
        let profile = self.profiles_next();
        let scope = self.ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let n = steps.len() as u32;
        let qs = profile.then(|| self.ctx.query_set("ktune steps", (2 * n).max(2)));
        let mut encoder = Some(self.ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("forward") }));
        if let (Some(prog), Some(enc)) = (embed, encoder.as_mut()) {
            let mut pass = self.ctx.begin_pass(enc, "embed", None);
            self.ctx.record(&mut pass, prog);
        }
        let mut i = 0usize;
        while i < steps.len() {
            let enc = encoder
                .get_or_insert_with(|| self.ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step") }));
            if let StepKind::Plumb(Plumb::Copy { src, src_off, dst, dst_off, len }) = steps[i].kind {
                enc.copy_buffer_to_buffer(&self.bufs[src], (src_off * 4) as u64, &self.bufs[dst], (dst_off * 4) as u64, (len * 4) as u64);
                i += 1;
            } else {
                // One pass over consecutive program steps (or one step when profiling / not batching).
                let single = profile || !self.batch;
                let ts = qs.as_ref().map(|q| wgpu::ComputePassTimestampWrites {
                    query_set: q,
                    beginning_of_pass_write_index: Some(2 * i as u32),
                    end_of_pass_write_index: Some(2 * i as u32 + 1),
                });
                let mut pass = self.ctx.begin_pass(enc, steps[i].slot.name(), ts);
                loop {
                    if let Some((_, Some(prog))) = self.progs.get(&(tokens, i)) {
                        self.ctx.record(&mut pass, prog);
                    }
                    i += 1;
                    if single || i >= steps.len() || matches!(steps[i].kind, StepKind::Plumb(Plumb::Copy { .. })) {
                        break;
                    }
                }
            }
            if !self.batch
                && let Some(enc) = encoder.take()
            {
                let cmd = enc.finish();
                phases.encode += lap.lap();
                self.ctx.submit(cmd);
                phases.submit += lap.lap();
            }
        }
        let resolve = qs.as_ref().map(|q| {
            let usage = wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC;
            let buf = self.ctx.buffer("step timestamps", (16 * n as u64).max(16), usage);
            let enc = encoder
                .get_or_insert_with(|| self.ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("resolve") }));
            enc.resolve_query_set(q, 0..2 * n, &buf, 0);
            buf
        });
        if let Some(sel) = self.selector.as_ref().filter(|_| select.is_some()) {
            let enc = encoder
                .get_or_insert_with(|| self.ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("select") }));
            {
                let mut pass = self.ctx.begin_pass(enc, "select", None);
                for p in &sel.progs {
                    self.ctx.record(&mut pass, p);
                }
            }
            enc.copy_buffer_to_buffer(&sel.out, sel.at, &sel.staging, 0, 8);
        }
        if !reads.is_empty() {
            let enc = encoder
                .get_or_insert_with(|| self.ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("read") }));
            for &(id, len) in reads {
                let size = crate::gpu::padded((len * 4) as u64).min(self.bufs[id].size());
                enc.copy_buffer_to_buffer(&self.bufs[id], 0, &self.staging[&id], 0, size);
            }
        }
        if let Some(enc) = encoder.take() {
            let cmd = enc.finish();
            phases.encode += lap.lap();
            self.ctx.submit(cmd);
        }
        phases.submit += lap.lap();
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(RuntimeError::Gpu(format!("validation error running the forward pass: {e}")));
        }
        self.ctx.wait().map_err(err)?;
        phases.wait += lap.lap();
        if let Some(buf) = resolve {
            let bytes = self.ctx.read(&buf, 16 * n as u64).map_err(err)?;
            let t: &[u64] = bytemuck::cast_slice(&bytes);
            let period = self.ctx.queue.get_timestamp_period() as f64;
            for (k, s) in steps.iter().enumerate() {
                let ns = t[2 * k + 1].saturating_sub(t[2 * k]) as f64 * period;
                times.add(s.slot, ns * 1e-9);
            }
            self.profile = false;
        }
        let mut out = Vec::with_capacity(reads.len());
        for &(id, len) in reads {
            let bytes = self.ctx.read_mapped(&self.staging[&id], (len * 4) as u64).map_err(err)?;
            out.push(bytemuck::pod_collect_to_vec(&bytes));
        }
        let picked = match self.selector.as_ref().filter(|_| select.is_some()) {
            Some(sel) => {
                let bytes = self.ctx.read_mapped(&sel.staging, 8).map_err(err)?;
                Some(Selector::token(&bytemuck::pod_collect_to_vec::<u8, u32>(&bytes)))
            }
            None => None,
        };
        phases.post += lap.lap();
        Ok((out, picked))
    }

    /// Whether a decode token's embedding is looked up on the GPU (else the
    /// host writes the row: the table is not on the GPU, untied from the LM head).
    pub fn embeds_on_gpu(&self) -> bool {
        self.embed.is_some()
    }

    /// Whether the next [`GpuExec::run`] times each step (asked, and the adapter
    /// has timestamp queries).
    pub fn profiles_next(&self) -> bool {
        self.profile && self.ctx.caps.timestamp_query
    }

    /// GPU dispatches of the prepared steps of layer `l` in the pass of `tokens` tokens.
    pub fn dispatches(&self, tokens: usize, steps: &[Step], layer: usize) -> usize {
        steps
            .iter()
            .enumerate()
            .filter(|(_, s)| s.layer == Some(layer))
            .map(|(i, _)| self.progs.get(&(tokens, i)).and_then(|(_, p)| p.as_ref()).map_or(0, GpuProgram::dispatches))
            .sum()
    }

    pub fn write(&self, id: BufId, data: &[f32]) {
        self.ctx.write(&self.bufs[id], 0, bytemuck::cast_slice(data));
    }
}

#[cfg(test)]
mod tests {
    use super::Selector;
    use crate::kernels::{DType, Problem, find};
    use crate::testing::test_gpu;

    /// The GPU's greedy selection picks what the host's `argmax` picks: the
    /// first of equal maxima (across a workgroup's lanes and across LM-head
    /// blocks), NaN never winning, 0 when logit 0 is NaN, -0 equal to +0, and
    /// the softcapped row's first maximum (saturated ties included).
    #[test]
    fn gpu_argmax_agrees_with_the_host_on_ties_and_nans() {
        let Some(gpu) = test_gpu() else { return };
        let n = 1000usize;
        let nan = f32::NAN;
        let ramp: Vec<f32> = (0..n).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
        let mut cases: Vec<(&str, Vec<f32>, f32)> = vec![("ramp", ramp.clone(), 0.0)];
        let mut ties = vec![1.0f32; n];
        ties[700] = 3.0;
        ties[300] = 3.0;
        ties[301] = 3.0;
        cases.push(("ties", ties.clone(), 0.0));
        cases.push(("all equal", vec![2.0; n], 0.0));
        let mut nans = ramp.clone();
        nans.iter_mut().step_by(3).for_each(|v| *v = nan);
        nans[5] = f32::INFINITY;
        cases.push(("nans", nans, 0.0));
        let mut nan0 = ties.clone();
        nan0[0] = nan;
        cases.push(("nan first", nan0, 0.0));
        cases.push(("all nan", vec![nan; n], 0.0));
        let mut zeros = vec![f32::NEG_INFINITY; n];
        zeros[400] = -0.0;
        zeros[200] = 0.0;
        cases.push(("signed zeros", zeros, 0.0));
        cases.push(("all -inf", vec![f32::NEG_INFINITY; n], 0.0));
        // tanh saturates: 1e4 and 2e4 both cap to exactly 30.
        let mut capped = ramp.clone();
        capped[900] = 2e4;
        capped[600] = 1e4;
        cases.push(("softcapped", capped, 30.0));
        for (what, row, cap) in cases {
            let host_row: Vec<f32> =
                if cap > 0.0 { row.iter().map(|&v| ((v as f64 / cap as f64).tanh() * cap as f64) as f32).collect() } else { row.clone() };
            let want = crate::runtime::argmax(&host_row);
            // One block, and the row cut into blocks of 333 rows (own buffers).
            for block in [n, 333] {
                let mut bufs = Vec::new();
                let mut blocks = Vec::new();
                for (k, part) in row.chunks(block).enumerate() {
                    bufs.push(gpu.upload("logits", bytemuck::cast_slice(part)));
                    blocks.push((k, part.len(), k * block));
                }
                let sel = Selector::new(&gpu, &bufs, &blocks, cap).expect("builds");
                let progs: Vec<&crate::gpu::GpuProgram> = sel.progs.iter().collect();
                gpu.run("argmax", &progs).expect("runs");
                let bytes = gpu.read(&sel.out, sel.at + 8).expect("reads");
                let got = Selector::token(&bytemuck::pod_collect_to_vec::<u8, u32>(&bytes[sel.at as usize..]));
                assert_eq!(got, want, "{what}, blocks of {block}");
            }
        }
    }

    /// A program rebuilt for other values of its problem (what prefill attention
    /// gets as the position moves) takes over its predecessor's uniform and
    /// scratch buffers and bind groups (no creation), and computes what a program
    /// built from scratch for those values computes.
    #[test]
    fn a_rebuilt_step_reuses_its_buffers_and_computes_the_same() {
        let Some(gpu) = test_gpu() else { return };
        let k = find("attention_decode_splitkv").expect("registered");
        let params = k.default_params();
        let (heads, kv_heads, d, cap) = (4usize, 2usize, 32usize, 256usize);
        let at = |kv_len| Problem::AttentionDecode { kv_len, kv_cap: cap, heads, kv_heads, head_dim: d, window: 0, scale: 0.2 };
        let data = |n: usize, s: u32| -> Vec<f32> {
            (0..n as u32).map(|i| ((i.wrapping_mul(2654435761) ^ s) % 1000) as f32 / 500.0 - 1.0).collect()
        };
        let q = gpu.upload("q", bytemuck::cast_slice(&data(heads * d, 1)));
        let kc = gpu.upload("k", bytemuck::cast_slice(&data(kv_heads * cap * d, 2)));
        let vc = gpu.upload("v", bytemuck::cast_slice(&data(kv_heads * cap * d, 3)));
        let (out1, out2) = (gpu.storage("out1", (heads * d * 4) as u64), gpu.storage("out2", (heads * d * 4) as u64));
        // 100 and 120 keys: the same number of 256-key splits, so same-size scratch.
        let old = k.prepare_wgsl(&gpu, &at(100), DType::F32, &params, &[&q, &kc, &vc, &out1], None).expect("builds");
        let (old_owned, old_groups): (Vec<wgpu::Buffer>, Vec<wgpu::BindGroup>) =
            (old.owned.clone(), old.steps.iter().map(|s| s.bind_group.clone()).collect());
        let rebuilt =
            gpu.rebuild(old, || k.prepare_wgsl(&gpu, &at(120), DType::F32, &params, &[&q, &kc, &vc, &out1], None)).expect("rebuilds");
        assert_eq!(rebuilt.owned, old_owned, "uniform and scratch buffers carried over");
        assert_eq!(rebuilt.steps.iter().map(|s| s.bind_group.clone()).collect::<Vec<_>>(), old_groups, "bind groups carried over");
        let fresh = k.prepare_wgsl(&gpu, &at(120), DType::F32, &params, &[&q, &kc, &vc, &out2], None).expect("builds");
        assert!(fresh.owned.iter().all(|b| !old_owned.contains(b)), "outside a rebuild, new buffers");
        gpu.run("rebuilt", &[&rebuilt, &fresh]).expect("runs");
        let (a, b) = (gpu.read(&out1, (heads * d * 4) as u64).expect("reads"), gpu.read(&out2, (heads * d * 4) as u64).expect("reads"));
        assert_eq!(a, b, "the rebuilt program computes what a fresh one does");
        assert!(a.iter().any(|&x| x != 0), "an output was written");
    }
}
