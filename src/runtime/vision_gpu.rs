//! The vision tower on a GPU: the op sequence of [`super::vision::VisionEngine`]
//! (patch embedding, position add, the first layer's LayerNorm 1; per layer q/k/v
//! Linear, bidirectional attention, out_proj, residual add fused with LayerNorm 2,
//! fc1 with GELU, fc2, residual add fused with the next layer's LayerNorm 1 or the
//! post LayerNorm; the projector's pool, `(1 + w)` RMSNorm and GEMM) with
//! the ops' WGSL kernels on one wgpu adapter: weights uploaded once (f32),
//! activations in storage buffers, every dispatch of an image recorded into one
//! compute pass, the features and soft tokens read back at the end.
//!
//! Each op's kernel is picked as the runtime's defaults pick (the WGSL preference
//! list, then any valid WGSL kernel of the op, default parameters) or forced per
//! op ([`VisionGpu::with_kernel`], or a profile's `vision` slots through
//! [`VisionGpu::with_selection`], as the CPU engine takes them).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::RuntimeError;
use super::vision::{Pair, VisionEngine, VisionOutput, kernels_of, selected};
use crate::gpu::{GpuCtx, GpuProgram};
use crate::kernels::{self, Backend, Caps, DType, KernelDef, Op, Params, Problem};
use crate::model::{VisionConfig, Weights};
use crate::plan::Selection;
use crate::plan::select::{Slot, preferred};

/// A weight and its bias on the GPU.
type BufPair = (wgpu::Buffer, wgpu::Buffer);

/// One encoder layer's weights on the GPU, in [`super::vision::LayerWeights`] order.
struct Layer {
    ln1: BufPair,
    q: BufPair,
    k: BufPair,
    v: BufPair,
    o: BufPair,
    ln2: BufPair,
    fc1: BufPair,
    fc2: BufPair,
}

/// A vision tower and projector loaded on a GPU, with the kernel of each op.
pub struct VisionGpu {
    pub config: VisionConfig,
    ctx: Arc<GpuCtx>,
    patch: BufPair,
    pos: wgpu::Buffer,
    layers: Vec<Layer>,
    post: BufPair,
    mm_norm: wgpu::Buffer,
    mm_proj: wgpu::Buffer,
    forced: BTreeMap<Op, (&'static KernelDef, Params)>,
}

impl VisionGpu {
    /// Loads the tower and projector weights of `config` from `weights` (as the
    /// CPU engine reads them) and uploads them to `ctx`.
    pub fn new(config: &VisionConfig, weights: &Weights, ctx: Arc<GpuCtx>) -> Result<VisionGpu, RuntimeError> {
        let host = VisionEngine::new(config, weights)?;
        let w = host.weights();
        let up = |name: &str, data: &[f32]| ctx.upload(name, bytemuck::cast_slice(data));
        let pair = |name: &str, (a, b): Pair<'_>| (up(name, a), up(name, b));
        let layers = w
            .layers
            .iter()
            .map(|l| Layer {
                ln1: pair("vision ln1", l[0]),
                q: pair("vision q", l[1]),
                k: pair("vision k", l[2]),
                v: pair("vision v", l[3]),
                o: pair("vision o", l[4]),
                ln2: pair("vision ln2", l[5]),
                fc1: pair("vision fc1", l[6]),
                fc2: pair("vision fc2", l[7]),
            })
            .collect();
        Ok(VisionGpu {
            config: config.clone(),
            patch: pair("vision patch", w.patch),
            pos: up("vision pos", w.pos),
            layers,
            post: pair("vision post", w.post),
            mm_norm: up("vision mm_norm", w.mm_norm),
            mm_proj: up("vision mm_proj", w.mm_proj),
            forced: BTreeMap::new(),
            ctx,
        })
    }

    /// Runs `op` with `kernel` (its default parameters) instead of the default choice.
    pub fn with_kernel(mut self, kernel: &'static KernelDef) -> VisionGpu {
        self.forced.insert(kernel.op, (kernel, kernel.default_params()));
        self
    }

    /// Runs the op of each vision slot chosen in `selection` (a profile's
    /// `vision` section, regime `vision`) with that choice (kernel and
    /// parameters); the other ops keep the defaults. A choice this GPU tower
    /// cannot run (a CPU kernel, another op than the slot's, a kernel invalid on
    /// this adapter at the tower's shapes) is an error naming the slot, the
    /// kernel and the reason.
    pub fn with_selection(mut self, selection: &Selection) -> Result<VisionGpu, RuntimeError> {
        self.set_selection(selection)?;
        Ok(self)
    }

    /// [`VisionGpu::with_selection`] in place: the choices of `selection` replace
    /// every earlier one.
    pub fn set_selection(&mut self, selection: &Selection) -> Result<(), RuntimeError> {
        let on = format!("the GPU {}", self.ctx.name);
        self.forced = selected(selection, &self.config, Caps::Gpu(&self.ctx.caps), &on)?;
        Ok(())
    }

    /// The kernel (with its parameters) of each vision slot, as `encode` runs them.
    pub fn kernels(&self) -> Result<Vec<(Slot, String)>, RuntimeError> {
        kernels_of(&self.config, |p| self.choose(p))
    }

    /// The kernel that runs `problem`: the forced one, else the first valid of the
    /// WGSL preference list, else the first valid WGSL kernel of the op.
    fn choose(&self, problem: &Problem) -> Result<(&'static KernelDef, Params), RuntimeError> {
        let caps = Caps::Gpu(&self.ctx.caps);
        if let Some((k, p)) = self.forced.get(&problem.op()) {
            k.check(caps, problem, DType::F32, p)
                .map_err(|reason| kernel_err(problem, kernels::KernelError::Invalid { kernel: k.id.into(), reason }))?;
            return Ok((*k, p.clone()));
        }
        let listed = preferred(problem, Backend::Wgsl).iter().filter_map(|id| kernels::find(id).ok());
        let rest = kernels::for_op(problem.op()).filter(|k| k.backend() == Backend::Wgsl);
        let mut reasons = Vec::new();
        for k in listed.chain(rest) {
            let p = k.default_params();
            match k.check(caps, problem, DType::F32, &p) {
                Ok(()) => return Ok((k, p)),
                Err(r) => reasons.push(format!("{}: {r}", k.id)),
            }
        }
        Err(RuntimeError::Internal(format!("no WGSL kernel can run {} on {}: {}", problem.describe(), self.ctx.name, reasons.join("; "))))
    }

    /// One op's program over `bufs` (the op's buffers in binding order).
    fn op(&self, problem: &Problem, bufs: &[&wgpu::Buffer]) -> Result<GpuProgram, RuntimeError> {
        let (k, params) = self.choose(problem)?;
        k.prepare_wgsl(&self.ctx, problem, DType::F32, &params, bufs).map_err(|e| kernel_err(problem, e))
    }

    fn buffer(&self, label: &str, floats: usize) -> wgpu::Buffer {
        self.ctx.storage(label, (floats * 4) as u64)
    }

    /// The tower and the projector over one image of normalized pixels
    /// (`[channels, image, image]`), as [`VisionEngine::encode`] computes them.
    pub fn encode(&self, pixels: &[f32]) -> Result<VisionOutput, RuntimeError> {
        let c = &self.config;
        let (h, inter, n) = (c.hidden_size, c.intermediate_size, c.num_patches());
        let want = c.num_channels * c.image_size * c.image_size;
        if pixels.len() != want {
            return Err(RuntimeError::Internal(format!("{} pixel values for a {want}-value image", pixels.len())));
        }
        let eps = c.layer_norm_eps as f32;
        let px = self.ctx.upload("vision pixels", bytemuck::cast_slice(pixels));
        let (mut x, t) = (self.buffer("vision x", n * h), self.buffer("vision t", n * h));
        let (q, k, v, mut a) = (
            self.buffer("vision q", n * h),
            self.buffer("vision k", n * h),
            self.buffer("vision v", n * h),
            self.buffer("vision a", n * h),
        );
        let mid = self.buffer("vision mid", n * inter);
        let features = self.buffer("vision features", n * h);
        let m = c.mm_tokens_per_image;
        let th = c.text_hidden_size;
        let (pooled, normed, tokens) =
            (self.buffer("vision pooled", m * h), self.buffer("vision normed", m * h), self.buffer("vision tokens", m * th));

        let mut progs = Vec::new();
        progs.push(self.op(
            &Problem::PatchEmbed { channels: c.num_channels, image: c.image_size, patch: c.patch_size, hidden: h },
            &[&px, &self.patch.0, &self.patch.1, &t],
        )?);
        let add = Problem::ResidualAdd { n: n * h };
        progs.push(self.op(&add, &[&t, &self.pos, &x])?);
        let ln = Problem::LayerNorm { rows: n, dim: h, eps };
        let res_ln = Problem::ResidualLayerNorm { rows: n, dim: h, eps };
        let lin = |out: usize, k: usize, gelu: bool| Problem::Linear { m: n, n: out, k, gelu };
        let attn = Problem::AttentionFull {
            tokens: n,
            heads: c.num_heads,
            head_dim: c.head_dim(),
            scale: (c.head_dim() as f64).powf(-0.5) as f32,
        };
        // `xn`: the LayerNorm of the stream `x` the next block reads; every
        // LayerNorm but the first layer's LayerNorm 1 runs fused with the residual
        // add before it (as the CPU engine runs them).
        let xn = self.buffer("vision xn", n * h);
        let first = self.layers.first().map_or(&self.post, |l| &l.ln1);
        progs.push(self.op(&ln, &[&x, &first.0, &first.1, if self.layers.is_empty() { &features } else { &xn }])?);
        for (i, l) in self.layers.iter().enumerate() {
            progs.push(self.op(&lin(h, h, false), &[&xn, &l.q.0, &l.q.1, &q])?);
            progs.push(self.op(&lin(h, h, false), &[&xn, &l.k.0, &l.k.1, &k])?);
            progs.push(self.op(&lin(h, h, false), &[&xn, &l.v.0, &l.v.1, &v])?);
            progs.push(self.op(&attn, &[&q, &k, &v, &a])?);
            progs.push(self.op(&lin(h, h, false), &[&a, &l.o.0, &l.o.1, &t])?);
            progs.push(self.op(&res_ln, &[&x, &t, &l.ln2.0, &l.ln2.1, &a, &xn])?);
            std::mem::swap(&mut x, &mut a);
            progs.push(self.op(&lin(inter, h, true), &[&xn, &l.fc1.0, &l.fc1.1, &mid])?);
            progs.push(self.op(&lin(h, inter, false), &[&mid, &l.fc2.0, &l.fc2.1, &t])?);
            let (norm, out) = match self.layers.get(i + 1) {
                Some(next) => (&next.ln1, &xn),
                None => (&self.post, &features),
            };
            progs.push(self.op(&res_ln, &[&x, &t, &norm.0, &norm.1, &a, out])?);
            std::mem::swap(&mut x, &mut a);
        }
        // Projector: pool the patch grid, (1 + w) RMSNorm, project to the text width.
        progs.push(self.op(&Problem::AvgPool { side: c.patches_per_side(), kernel: c.pool_kernel(), dim: h }, &[&features, &pooled])?);
        progs.push(self.op(&Problem::RmsNorm { rows: m, dim: h, eps, unit_offset: true }, &[&pooled, &self.mm_norm, &normed])?);
        progs.push(self.op(&Problem::Gemm { m, n: th, k: h }, &[&normed, &self.mm_proj, &tokens])?);

        let refs: Vec<&GpuProgram> = progs.iter().collect();
        self.ctx.run("vision tower", &refs).map_err(|e| RuntimeError::Gpu(e.to_string()))?;
        let read = |b: &wgpu::Buffer, floats: usize| -> Result<Vec<f32>, RuntimeError> {
            let bytes = self.ctx.read(b, (floats * 4) as u64).map_err(|e| RuntimeError::Gpu(e.to_string()))?;
            Ok(bytemuck::pod_collect_to_vec(&bytes))
        };
        Ok(VisionOutput { features: read(&features, n * h)?, tokens: read(&tokens, m * th)? })
    }
}

fn kernel_err(problem: &Problem, e: kernels::KernelError) -> RuntimeError {
    RuntimeError::Kernel { slot: format!("vision {}", problem.op()), layer: None, source: Box::new(e) }
}
