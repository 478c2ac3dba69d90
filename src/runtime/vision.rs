//! The vision tower on the CPU: a SigLIP encoder and Gemma 3's multimodal
//! projector run as a sequence of registered kernels (patch embedding, LayerNorm,
//! Linear with bias and GELU, bidirectional attention, each residual add fused
//! with the LayerNorm after it (`residual_layer_norm`), the average pool, the projector's `(1 + w)` RMSNorm and GEMM), each op's kernel picked
//! like the runtime's defaults (the preference list, then any valid kernel of the
//! op) or forced per op ([`VisionEngine::with_kernel`], or a profile's `vision`
//! slots through [`VisionEngine::with_selection`]).
//!
//! One image in (`[channels, image, image]` pixels, normalized as the image
//! processor does: [`super::image`]), the tower's last hidden state
//! (`[patches, hidden]`, after `post_layernorm`) and the projected soft tokens
//! (`[mm_tokens_per_image, text hidden]`) out, as transformers'
//! `vision_tower(...).last_hidden_state` and `get_image_features` return them.

use std::collections::BTreeMap;

use super::RuntimeError;
use crate::device::CpuCaps;
use crate::kernels::{self, Backend, Caps, CpuArgs, CpuIn, DType, KernelDef, Op, Params, Problem};
use crate::model::vision::{PROJECTOR, TOWER};
use crate::model::{VisionConfig, Weights};
use crate::plan::Regime;
use crate::plan::select::{Selection, Slot, preferred};

/// One encoder layer's weights (f32, as stored: Linear weights `[out, in]`).
struct Layer {
    ln1: (Vec<f32>, Vec<f32>),
    ln2: (Vec<f32>, Vec<f32>),
    q: (Vec<f32>, Vec<f32>),
    k: (Vec<f32>, Vec<f32>),
    v: (Vec<f32>, Vec<f32>),
    o: (Vec<f32>, Vec<f32>),
    fc1: (Vec<f32>, Vec<f32>),
    fc2: (Vec<f32>, Vec<f32>),
}

/// What one image becomes.
#[derive(Clone, Debug)]
pub struct VisionOutput {
    /// The tower's last hidden state, `[patches, hidden]`.
    pub features: Vec<f32>,
    /// The projected soft tokens, `[mm_tokens_per_image, text hidden]`.
    pub tokens: Vec<f32>,
}

/// A loaded vision tower and projector with the kernel of each op.
pub struct VisionEngine {
    pub config: VisionConfig,
    patch: (Vec<f32>, Vec<f32>),
    pos: Vec<f32>,
    layers: Vec<Layer>,
    post: (Vec<f32>, Vec<f32>),
    mm_norm: Vec<f32>,
    /// `mm_input_projection_weight` transposed to a Linear's `[text hidden, vision hidden]`.
    mm_proj: Vec<f32>,
    caps: CpuCaps,
    forced: BTreeMap<Op, (&'static KernelDef, Params)>,
}

fn w(weights: &Weights, name: &str, shape: &[usize]) -> Result<Vec<f32>, RuntimeError> {
    weights.f32(name, shape).map_err(|e| RuntimeError::Weights(e.to_string()))
}

impl VisionEngine {
    /// Loads the tower and projector weights of `config` from `weights`.
    pub fn new(config: &VisionConfig, weights: &Weights) -> Result<VisionEngine, RuntimeError> {
        let c = config;
        let (h, i, p) = (c.hidden_size, c.intermediate_size, c.patch_size);
        let pair = |name: &str, out: usize, inp: Option<usize>| -> Result<(Vec<f32>, Vec<f32>), RuntimeError> {
            let shape: Vec<usize> = match inp {
                Some(k) => vec![out, k],
                None => vec![out],
            };
            Ok((w(weights, &format!("{name}.weight"), &shape)?, w(weights, &format!("{name}.bias"), &[out])?))
        };
        let e = format!("{TOWER}.embeddings");
        let patch = (
            w(weights, &format!("{e}.patch_embedding.weight"), &[h, c.num_channels, p, p])?,
            w(weights, &format!("{e}.patch_embedding.bias"), &[h])?,
        );
        let pos = w(weights, &format!("{e}.position_embedding.weight"), &[c.num_patches(), h])?;
        let layers = (0..c.num_layers)
            .map(|l| {
                let n = format!("{TOWER}.encoder.layers.{l}");
                Ok(Layer {
                    ln1: pair(&format!("{n}.layer_norm1"), h, None)?,
                    ln2: pair(&format!("{n}.layer_norm2"), h, None)?,
                    q: pair(&format!("{n}.self_attn.q_proj"), h, Some(h))?,
                    k: pair(&format!("{n}.self_attn.k_proj"), h, Some(h))?,
                    v: pair(&format!("{n}.self_attn.v_proj"), h, Some(h))?,
                    o: pair(&format!("{n}.self_attn.out_proj"), h, Some(h))?,
                    fc1: pair(&format!("{n}.mlp.fc1"), i, Some(h))?,
                    fc2: pair(&format!("{n}.mlp.fc2"), h, Some(i))?,
                })
            })
            .collect::<Result<Vec<_>, RuntimeError>>()?;
        let post = pair(&format!("{TOWER}.post_layernorm"), h, None)?;
        let mm_norm = w(weights, &format!("{PROJECTOR}.mm_soft_emb_norm.weight"), &[h])?;
        let t = c.text_hidden_size;
        let proj = w(weights, &format!("{PROJECTOR}.mm_input_projection_weight"), &[h, t])?;
        let mut mm_proj = vec![0f32; t * h];
        for r in 0..h {
            for col in 0..t {
                mm_proj[col * h + r] = proj[r * t + col];
            }
        }
        Ok(VisionEngine { config: c.clone(), patch, pos, layers, post, mm_norm, mm_proj, caps: CpuCaps::detect(), forced: BTreeMap::new() })
    }

    /// Runs `op` with `kernel` (its default parameters) instead of the default choice.
    pub fn with_kernel(mut self, kernel: &'static KernelDef) -> VisionEngine {
        self.forced.insert(kernel.op, (kernel, kernel.default_params()));
        self
    }

    /// Runs the op of each vision slot chosen in `selection` (a profile's
    /// `vision` section, [`Regime::Vision`]) with that choice; the other ops keep
    /// the defaults. A choice this CPU tower cannot run (a WGSL kernel, another
    /// op than the slot's, a kernel invalid at the tower's shapes) is an error
    /// naming the slot, the kernel and the reason.
    pub fn with_selection(mut self, selection: &Selection) -> Result<VisionEngine, RuntimeError> {
        self.set_selection(selection)?;
        Ok(self)
    }

    /// [`VisionEngine::with_selection`] in place: the choices of `selection`
    /// replace every earlier one (`bench --image` switches one engine between
    /// its entries).
    pub fn set_selection(&mut self, selection: &Selection) -> Result<(), RuntimeError> {
        self.forced = selected(selection, &self.config, Caps::Cpu(&self.caps), "the CPU")?;
        Ok(())
    }

    /// The kernel (with its parameters) of each vision slot, as `encode` runs them.
    pub fn kernels(&self) -> Result<Vec<(Slot, String)>, RuntimeError> {
        kernels_of(&self.config, |p| self.choose(p))
    }

    /// The kernel that runs `problem`: the forced one, else the first valid of the
    /// CPU preference list, else the first valid CPU kernel of the op.
    fn choose(&self, problem: &Problem) -> Result<(&'static KernelDef, Params), RuntimeError> {
        let caps = Caps::Cpu(&self.caps);
        if let Some((k, p)) = self.forced.get(&problem.op()) {
            k.check(caps, problem, DType::F32, p)
                .map_err(|reason| kernel_err(problem, kernels::KernelError::Invalid { kernel: k.id.into(), reason }))?;
            return Ok((*k, p.clone()));
        }
        let listed = preferred(problem, Backend::Cpu).iter().filter_map(|id| kernels::find(id).ok());
        let rest = kernels::for_op(problem.op()).filter(|k| k.backend() == Backend::Cpu);
        let mut reasons = Vec::new();
        for k in listed.chain(rest) {
            let p = k.default_params();
            match k.check(caps, problem, DType::F32, &p) {
                Ok(()) => return Ok((k, p)),
                Err(r) => reasons.push(format!("{}: {r}", k.id)),
            }
        }
        Err(RuntimeError::Internal(format!("no CPU kernel can run {}: {}", problem.describe(), reasons.join("; "))))
    }

    /// Runs one op: `ins` in binding order, `out` its single output.
    fn op(&self, problem: &Problem, ins: &[&[f32]], out: &mut [f32]) -> Result<(), RuntimeError> {
        let (k, params) = self.choose(problem)?;
        let args = CpuArgs { ins: ins.iter().map(|s| CpuIn::F32(s)).collect(), outs: smallvec::smallvec![out] };
        k.run_cpu(problem, DType::F32, &params, args).map_err(|e| kernel_err(problem, e))
    }

    /// Runs one op of two outputs (a fused residual norm: the stream, its norm).
    fn op2(&self, problem: &Problem, ins: &[&[f32]], out0: &mut [f32], out1: &mut [f32]) -> Result<(), RuntimeError> {
        let (k, params) = self.choose(problem)?;
        let args = CpuArgs { ins: ins.iter().map(|s| CpuIn::F32(s)).collect(), outs: smallvec::smallvec![out0, out1] };
        k.run_cpu(problem, DType::F32, &params, args).map_err(|e| kernel_err(problem, e))
    }

    /// The tower and the projector over one image of normalized pixels
    /// (`[channels, image, image]`).
    pub fn encode(&self, pixels: &[f32]) -> Result<VisionOutput, RuntimeError> {
        let c = &self.config;
        let (h, inter, n) = (c.hidden_size, c.intermediate_size, c.num_patches());
        let want = c.num_channels * c.image_size * c.image_size;
        if pixels.len() != want {
            return Err(RuntimeError::Internal(format!("{} pixel values for a {want}-value image", pixels.len())));
        }
        let eps = c.layer_norm_eps as f32;
        let mut x = vec![0f32; n * h];
        let mut t = vec![0f32; n * h];
        self.op(
            &Problem::PatchEmbed { channels: c.num_channels, image: c.image_size, patch: c.patch_size, hidden: h },
            &[pixels, &self.patch.0, &self.patch.1],
            &mut t,
        )?;
        self.op(&Problem::ResidualAdd { n: n * h }, &[&t, &self.pos], &mut x)?;
        let ln = Problem::LayerNorm { rows: n, dim: h, eps };
        let res_ln = Problem::ResidualLayerNorm { rows: n, dim: h, eps };
        let lin = |out: usize, k: usize, gelu: bool| Problem::Linear { m: n, n: out, k, gelu };
        let heads = c.num_heads;
        let attn = Problem::AttentionFull { tokens: n, heads, head_dim: c.head_dim(), scale: (c.head_dim() as f64).powf(-0.5) as f32 };
        let (mut q, mut k, mut v, mut a) = (vec![0f32; n * h], vec![0f32; n * h], vec![0f32; n * h], vec![0f32; n * h]);
        let mut mid = vec![0f32; n * inter];
        let mut features = vec![0f32; n * h];
        // `xn`: the LayerNorm of the residual stream `x` that the next block reads.
        // The first layer's LayerNorm 1 follows the position add; every other
        // LayerNorm follows a residual add and runs fused with it (x + t into the
        // stream, its norm into `xn`, or the features after the last layer).
        let mut xn = vec![0f32; n * h];
        let first = self.layers.first().map_or(&self.post, |l| &l.ln1);
        self.op(&ln, &[&x, &first.0, &first.1], if self.layers.is_empty() { &mut features } else { &mut xn })?;
        for (i, layer) in self.layers.iter().enumerate() {
            self.op(&lin(h, h, false), &[&xn, &layer.q.0, &layer.q.1], &mut q)?;
            self.op(&lin(h, h, false), &[&xn, &layer.k.0, &layer.k.1], &mut k)?;
            self.op(&lin(h, h, false), &[&xn, &layer.v.0, &layer.v.1], &mut v)?;
            self.op(&attn, &[&q, &k, &v], &mut a)?;
            self.op(&lin(h, h, false), &[&a, &layer.o.0, &layer.o.1], &mut t)?;
            self.op2(&res_ln, &[&x, &t, &layer.ln2.0, &layer.ln2.1], &mut a, &mut xn)?;
            std::mem::swap(&mut x, &mut a);
            self.op(&lin(inter, h, true), &[&xn, &layer.fc1.0, &layer.fc1.1], &mut mid)?;
            self.op(&lin(h, inter, false), &[&mid, &layer.fc2.0, &layer.fc2.1], &mut t)?;
            match self.layers.get(i + 1) {
                Some(next) => self.op2(&res_ln, &[&x, &t, &next.ln1.0, &next.ln1.1], &mut a, &mut xn)?,
                None => self.op2(&res_ln, &[&x, &t, &self.post.0, &self.post.1], &mut a, &mut features)?,
            }
            std::mem::swap(&mut x, &mut a);
        }
        // Projector: pool the patch grid, (1 + w) RMSNorm, project to the text width.
        let m = c.mm_tokens_per_image;
        let mut pooled = vec![0f32; m * h];
        self.op(&Problem::AvgPool { side: c.patches_per_side(), kernel: c.pool_kernel(), dim: h }, &[&features], &mut pooled)?;
        let mut normed = vec![0f32; m * h];
        self.op(&Problem::RmsNorm { rows: m, dim: h, eps, unit_offset: true }, &[&pooled, &self.mm_norm], &mut normed)?;
        let th = c.text_hidden_size;
        let mut tokens = vec![0f32; m * th];
        self.op(&Problem::Gemm { m, n: th, k: h }, &[&normed, &self.mm_proj], &mut tokens)?;
        Ok(VisionOutput { features, tokens })
    }
}

fn kernel_err(problem: &Problem, e: kernels::KernelError) -> RuntimeError {
    RuntimeError::Kernel { slot: format!("vision {}", problem.op()), layer: None, source: Box::new(e) }
}

/// A weight and its bias.
pub(super) type Pair<'a> = (&'a [f32], &'a [f32]);

/// One encoder layer's weights as the ops read them: LayerNorm 1, q, k, v,
/// out_proj, LayerNorm 2, fc1, fc2 (each a weight and its bias).
pub(super) type LayerWeights<'a> = [Pair<'a>; 8];

/// The loaded weights of a [`VisionEngine`], for the GPU sibling
/// ([`super::vision_gpu`]), which uploads them.
pub(super) struct TowerWeights<'a> {
    pub patch: Pair<'a>,
    pub pos: &'a [f32],
    pub layers: Vec<LayerWeights<'a>>,
    pub post: Pair<'a>,
    pub mm_norm: &'a [f32],
    /// `[text hidden, vision hidden]` (a Linear's layout).
    pub mm_proj: &'a [f32],
}

impl VisionEngine {
    pub(super) fn weights(&self) -> TowerWeights<'_> {
        fn p(x: &(Vec<f32>, Vec<f32>)) -> Pair<'_> {
            (&x.0, &x.1)
        }
        TowerWeights {
            patch: p(&self.patch),
            pos: &self.pos,
            layers: self.layers.iter().map(|l| [p(&l.ln1), p(&l.q), p(&l.k), p(&l.v), p(&l.o), p(&l.ln2), p(&l.fc1), p(&l.fc2)]).collect(),
            post: p(&self.post),
            mm_norm: &self.mm_norm,
            mm_proj: &self.mm_proj,
        }
    }
}

/// The kernel problems of one image through the tower and projector, by vision
/// slot, with how many times each runs (the ops [`VisionEngine::encode`] runs
/// but the position embedding's add and the projector's RMSNorm, which keep the
/// defaults; the first layer's LayerNorm 1 under `vision.norm`, the other
/// LayerNorms fused with the residual add before each under `vision.residual_norm`):
/// the shapes the tuner races the `vision` regime at and a profile's choices are
/// checked against.
pub fn slot_problems(c: &VisionConfig) -> Vec<(Slot, Problem, usize)> {
    let (h, inter, n, l) = (c.hidden_size, c.intermediate_size, c.num_patches(), c.num_layers);
    let lin = |out: usize, k: usize, gelu: bool| Problem::Linear { m: n, n: out, k, gelu };
    let hd = c.head_dim();
    vec![
        (Slot::VisionPatchEmbed, Problem::PatchEmbed { channels: c.num_channels, image: c.image_size, patch: c.patch_size, hidden: h }, 1),
        (Slot::VisionNorm, Problem::LayerNorm { rows: n, dim: h, eps: c.layer_norm_eps as f32 }, 1),
        (Slot::VisionResidualNorm, Problem::ResidualLayerNorm { rows: n, dim: h, eps: c.layer_norm_eps as f32 }, 2 * l),
        (Slot::VisionMlp, lin(h, h, false), 4 * l),
        (Slot::VisionMlp, lin(inter, h, true), l),
        (Slot::VisionMlp, lin(h, inter, false), l),
        (
            Slot::VisionAttention,
            Problem::AttentionFull { tokens: n, heads: c.num_heads, head_dim: hd, scale: (hd as f64).powf(-0.5) as f32 },
            l,
        ),
        (Slot::VisionPool, Problem::AvgPool { side: c.patches_per_side(), kernel: c.pool_kernel(), dim: h }, 1),
        (Slot::Projector, Problem::Gemm { m: c.mm_tokens_per_image, n: c.text_hidden_size, k: h }, 1),
    ]
    .into_iter()
    .filter(|(_, _, count)| *count > 0)
    .collect()
}

/// The forced kernel per op of a tower on `caps` (`on` names it in errors): the
/// vision slots' choices of `selection`, each checked to be a kernel of that
/// backend computing the slot's op and valid at every shape the slot runs.
pub(super) fn selected(
    selection: &Selection,
    config: &VisionConfig,
    caps: Caps<'_>,
    on: &str,
) -> Result<BTreeMap<Op, (&'static KernelDef, Params)>, RuntimeError> {
    let backend = match caps {
        Caps::Cpu(_) => Backend::Cpu,
        Caps::Gpu(_) => Backend::Wgsl,
    };
    let problems = slot_problems(config);
    let mut forced = BTreeMap::new();
    for &slot in Slot::VISION {
        let Some(c) = selection.slots.get(&(slot, Regime::Vision)) else { continue };
        let bad = |why: String| RuntimeError::Kernel {
            slot: slot.name().into(),
            layer: None,
            source: Box::new(kernels::KernelError::Invalid { kernel: c.kernel.id.into(), reason: why }),
        };
        if c.kernel.backend() != backend {
            return Err(bad(format!("a {} kernel; the vision tower runs on {on} ({} kernels)", c.kernel.backend().name(), backend.name())));
        }
        if slot.op(Regime::Vision) != Some(c.kernel.op) {
            return Err(bad(format!("computes {}, not this slot's op", c.kernel.op)));
        }
        for (_, p, _) in problems.iter().filter(|(s, _, _)| *s == slot) {
            c.kernel.check(caps, p, DType::F32, &c.params).map_err(|why| bad(format!("invalid on {on} at {}: {why}", p.describe())))?;
        }
        forced.insert(c.kernel.op, (c.kernel, c.params.clone()));
    }
    Ok(forced)
}

/// Each vision slot's kernel label (id and non-default parameters) as `choose`
/// picks it for the slot's first shape.
pub(super) fn kernels_of(
    config: &VisionConfig,
    choose: impl Fn(&Problem) -> Result<(&'static KernelDef, Params), RuntimeError>,
) -> Result<Vec<(Slot, String)>, RuntimeError> {
    let mut out: Vec<(Slot, String)> = Vec::new();
    for (slot, p, _) in slot_problems(config) {
        if out.iter().any(|(s, _)| *s == slot) {
            continue;
        }
        let (k, params) = choose(&p)?;
        out.push((slot, k.label(&params)));
    }
    Ok(out)
}
