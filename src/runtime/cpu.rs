//! The CPU executor: plan buffers as host vectors, kernel steps through the CPU
//! kernels of the registry, parallel groups (q/k/v, gate/up) run concurrently on
//! the kernels' thread pool (`kernels::cpu::pool`), and the runtime's own data
//! movement (QKV split, bias, KV-cache write).

use std::time::Instant;

use half::f16;

use super::{RuntimeError, SlotTimes};
use crate::kernels::quant::QMatrix;
use crate::kernels::{CpuArgs, CpuIn, DType};
use crate::plan::{BufId, Plan, Plumb, Step, StepKind};

/// One host buffer in its storage type.
#[derive(Clone)]
pub enum HostBuf {
    F32(Vec<f32>),
    F16(Vec<f16>),
    /// A block-quantized weight matrix.
    Q(QMatrix),
    /// A weight shared with other engines of the same model (read only).
    Shared(std::sync::Arc<HostBuf>),
}

impl HostBuf {
    /// A zeroed buffer (a quantized one as all-zero blocks, one block a row).
    pub fn zeros(dtype: DType, len: usize) -> HostBuf {
        match (dtype, dtype.quant()) {
            (_, Some(format)) => {
                let blocks = format.blocks_for(len);
                HostBuf::Q(QMatrix {
                    format,
                    rows: blocks,
                    cols: format.block_elems(),
                    quants: vec![0; blocks * format.quant_bytes()],
                    scales: vec![f16::ZERO; blocks * format.scales_per_block()],
                })
            }
            (DType::F16, _) => HostBuf::F16(vec![f16::ZERO; len]),
            _ => HostBuf::F32(vec![0.0; len]),
        }
    }
    fn as_in(&self) -> CpuIn<'_> {
        match self {
            HostBuf::F32(v) => CpuIn::F32(v),
            HostBuf::F16(v) => CpuIn::F16(v),
            HostBuf::Q(m) => CpuIn::Q(m.view()),
            HostBuf::Shared(b) => b.as_in(),
        }
    }
    /// Elements (a quantized matrix: rows x cols).
    pub fn len(&self) -> usize {
        match self {
            HostBuf::F32(v) => v.len(),
            HostBuf::F16(v) => v.len(),
            HostBuf::Q(m) => m.rows * m.cols,
            HostBuf::Shared(b) => b.len(),
        }
    }
    /// The bytes of a GPU buffer holding this (a quantized matrix in its
    /// single-buffer layout).
    pub fn into_bytes(self) -> Vec<u8> {
        match self {
            HostBuf::F32(v) => bytemuck::cast_slice(&v).to_vec(),
            HostBuf::F16(v) => bytemuck::cast_slice::<f16, u8>(&v).to_vec(),
            HostBuf::Q(m) => m.gpu_bytes(),
            HostBuf::Shared(b) => std::sync::Arc::unwrap_or_clone(b).into_bytes(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Buffers of a plan on the host.
pub struct CpuExec {
    pub bufs: Vec<HostBuf>,
}

fn f32s<'a>(bufs: &'a [HostBuf], id: BufId, what: &str) -> Result<&'a [f32], RuntimeError> {
    let b = match bufs.get(id) {
        Some(HostBuf::Shared(b)) => Some(&**b),
        other => other,
    };
    match b {
        Some(HostBuf::F32(v)) => Ok(v),
        _ => Err(RuntimeError::Internal(format!("{what}: buffer {id} is not an f32 buffer"))),
    }
}

fn f32s_mut<'a>(bufs: &'a mut [HostBuf], id: BufId, what: &str) -> Result<&'a mut Vec<f32>, RuntimeError> {
    match bufs.get_mut(id) {
        Some(HostBuf::F32(v)) => Ok(v),
        _ => Err(RuntimeError::Internal(format!("{what}: buffer {id} is not an f32 buffer"))),
    }
}

impl CpuExec {
    /// Host buffers for `plan`, weights filled by `fill(buffer index, decl)`.
    pub fn new(plan: &Plan, mut fill: impl FnMut(usize) -> Result<Option<HostBuf>, RuntimeError>) -> Result<CpuExec, RuntimeError> {
        let mut bufs = Vec::with_capacity(plan.buffers.len());
        for (i, b) in plan.buffers.iter().enumerate() {
            let hb = match fill(i)? {
                Some(h) => {
                    if h.len() != b.len {
                        return Err(RuntimeError::Internal(format!(
                            "buffer `{}` filled with {} elements, expected {}",
                            b.name,
                            h.len(),
                            b.len
                        )));
                    }
                    h
                }
                None => match &b.constant {
                    Some(c) => HostBuf::F32(c.clone()),
                    None => HostBuf::zeros(b.dtype, b.len),
                },
            };
            bufs.push(hb);
        }
        Ok(CpuExec { bufs })
    }

    /// Runs `steps` in order, timing each slot.
    pub fn run(&mut self, steps: &[Step], times: &mut SlotTimes) -> Result<(), RuntimeError> {
        let mut i = 0;
        while i < steps.len() {
            // A parallel group: consecutive kernel steps sharing a group number.
            let mut j = i + 1;
            if let Some(g) = steps[i].group {
                while j < steps.len() && steps[j].group == Some(g) {
                    j += 1;
                }
            }
            let t0 = Instant::now();
            if j - i > 1 {
                self.run_group(&steps[i..j])?;
            } else {
                self.run_one(&steps[i])?;
            }
            let dt = t0.elapsed().as_secs_f64();
            let n = (j - i) as f64;
            for s in &steps[i..j] {
                times.add(s.slot, dt / n);
            }
            i = j;
        }
        Ok(())
    }

    fn run_one(&mut self, step: &Step) -> Result<(), RuntimeError> {
        match &step.kind {
            StepKind::Kernel { kernel, params, dtype, problem, binds } => {
                let specs = problem.buffers(*dtype);
                let out_ids: Vec<BufId> = specs.iter().zip(binds).filter(|(s, _)| s.is_output()).map(|(_, &b)| b).collect();
                let mut outs: Vec<Vec<f32>> = Vec::with_capacity(out_ids.len());
                for &b in &out_ids {
                    outs.push(std::mem::take(f32s_mut(&mut self.bufs, b, kernel.id)?));
                }
                let res = {
                    let ins: Vec<CpuIn<'_>> =
                        specs.iter().zip(binds).filter(|(s, _)| !s.is_output()).map(|(_, &b)| self.bufs[b].as_in()).collect();
                    let args = CpuArgs { ins, outs: outs.iter_mut().map(|v| v.as_mut_slice()).collect() };
                    kernel.run_cpu(problem, *dtype, params, args)
                };
                for (&b, v) in out_ids.iter().zip(outs) {
                    self.bufs[b] = HostBuf::F32(v);
                }
                res.map_err(|e| RuntimeError::Kernel { slot: step.slot.name().into(), layer: step.layer, source: Box::new(e) })
            }
            StepKind::Plumb(p) => self.plumb(p),
        }
    }

    /// Independent kernels run concurrently; each writes its own outputs.
    fn run_group(&mut self, steps: &[Step]) -> Result<(), RuntimeError> {
        struct Job<'s> {
            step: &'s Step,
            out_ids: Vec<BufId>,
            outs: Vec<Vec<f32>>,
        }
        let mut jobs = Vec::new();
        for step in steps {
            let StepKind::Kernel { kernel, dtype, problem, binds, .. } = &step.kind else {
                return self.run_sequential(steps);
            };
            let specs = problem.buffers(*dtype);
            let out_ids: Vec<BufId> = specs.iter().zip(binds).filter(|(s, _)| s.is_output()).map(|(_, &b)| b).collect();
            let mut outs = Vec::new();
            for &b in &out_ids {
                outs.push(std::mem::take(f32s_mut(&mut self.bufs, b, kernel.id)?));
            }
            jobs.push(Job { step, out_ids, outs });
        }
        let bufs = &self.bufs;
        let mut results: Vec<Result<(), RuntimeError>> = jobs.iter().map(|_| Ok(())).collect();
        {
            // One pool task per kernel; each kernel's own parallel loop then runs
            // inline on its task's thread.
            crate::kernels::cpu::pool::for_chunks_mut2(&mut jobs, 1, &mut results, 1, |_, job, res| {
                let job = &mut job[0];
                res[0] = (|| {
                    let StepKind::Kernel { kernel, params, dtype, problem, binds } = &job.step.kind else { return Ok(()) };
                    let specs = problem.buffers(*dtype);
                    let ins: Vec<CpuIn<'_>> =
                        specs.iter().zip(binds).filter(|(s, _)| !s.is_output()).map(|(_, &b)| bufs[b].as_in()).collect();
                    let args = CpuArgs { ins, outs: job.outs.iter_mut().map(|v| v.as_mut_slice()).collect() };
                    kernel.run_cpu(problem, *dtype, params, args).map_err(|e| RuntimeError::Kernel {
                        slot: job.step.slot.name().into(),
                        layer: job.step.layer,
                        source: Box::new(e),
                    })
                })();
            });
        }
        for job in jobs {
            for (b, v) in job.out_ids.into_iter().zip(job.outs) {
                self.bufs[b] = HostBuf::F32(v);
            }
        }
        results.into_iter().collect()
    }

    fn run_sequential(&mut self, steps: &[Step]) -> Result<(), RuntimeError> {
        for s in steps {
            self.run_one(s)?;
        }
        Ok(())
    }

    fn plumb(&mut self, p: &Plumb) -> Result<(), RuntimeError> {
        match *p {
            Plumb::SplitQkv { src, bias, q, k, v, tokens, nq, nkv } => {
                let w = nq + 2 * nkv;
                let mut outs = [q, k, v].map(|id| f32s_mut(&mut self.bufs, id, "split_qkv").map(std::mem::take));
                let mut taken = Vec::new();
                for o in outs.iter_mut() {
                    taken.push(std::mem::replace(o, Ok(Vec::new()))?);
                }
                {
                    let s = f32s(&self.bufs, src, "split_qkv")?;
                    let b = match bias {
                        Some(b) => Some(f32s(&self.bufs, b, "split_qkv bias")?),
                        None => None,
                    };
                    for t in 0..tokens {
                        let row = &s[t * w..(t + 1) * w];
                        for (part, (off, n)) in [(0usize, nq), (nq, nkv), (nq + nkv, nkv)].into_iter().enumerate() {
                            let dst = &mut taken[part][t * n..(t + 1) * n];
                            dst.copy_from_slice(&row[off..off + n]);
                            if let Some(b) = b {
                                for (d, bb) in dst.iter_mut().zip(&b[off..off + n]) {
                                    *d += bb;
                                }
                            }
                        }
                    }
                }
                for (id, vv) in [q, k, v].into_iter().zip(taken) {
                    self.bufs[id] = HostBuf::F32(vv);
                }
            }
            Plumb::BiasAdd { buf, bias, rows, n } => {
                let b = f32s(&self.bufs, bias, "bias_add")?.to_vec();
                let y = f32s_mut(&mut self.bufs, buf, "bias_add")?;
                for r in 0..rows {
                    for (d, bb) in y[r * n..(r + 1) * n].iter_mut().zip(&b) {
                        *d += bb;
                    }
                }
            }
            Plumb::KvWrite { k, v, k_cache, v_cache, tokens, kv_heads, head_dim, kv_cap, pos0 } => {
                for (src, dst) in [(k, k_cache), (v, v_cache)] {
                    let s = f32s(&self.bufs, src, "kv_write")?.to_vec();
                    let write = |h: usize, t: usize| ((h * kv_cap + pos0 + t) * head_dim, (t * kv_heads + h) * head_dim);
                    match &mut self.bufs[dst] {
                        HostBuf::F32(c) => {
                            for t in 0..tokens {
                                for h in 0..kv_heads {
                                    let (d, o) = write(h, t);
                                    c[d..d + head_dim].copy_from_slice(&s[o..o + head_dim]);
                                }
                            }
                        }
                        HostBuf::Q(_) | HostBuf::Shared(_) => {
                            return Err(RuntimeError::Internal("kv_write: the KV cache is never quantized or shared".into()));
                        }
                        HostBuf::F16(c) => {
                            for t in 0..tokens {
                                for h in 0..kv_heads {
                                    let (d, o) = write(h, t);
                                    for i in 0..head_dim {
                                        c[d + i] = f16::from_f32(s[o + i]);
                                    }
                                }
                            }
                        }
                    }
                }
            }
            Plumb::Copy { src, src_off, dst, dst_off, len } => {
                let s = f32s(&self.bufs, src, "copy")?[src_off..src_off + len].to_vec();
                f32s_mut(&mut self.bufs, dst, "copy")?[dst_off..dst_off + len].copy_from_slice(&s);
            }
        }
        Ok(())
    }

    /// Writes `data` into an f32 buffer at offset 0.
    pub fn write(&mut self, id: BufId, data: &[f32]) -> Result<(), RuntimeError> {
        let b = f32s_mut(&mut self.bufs, id, "write")?;
        b[..data.len()].copy_from_slice(data);
        Ok(())
    }

    /// The first `len` elements of an f32 buffer.
    pub fn read(&self, id: BufId, len: usize) -> Result<Vec<f32>, RuntimeError> {
        Ok(f32s(&self.bufs, id, "read")?[..len].to_vec())
    }
}
