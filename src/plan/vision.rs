//! The vision plan: a SigLIP tower and Gemma 3's multimodal projector as steps
//! over named buffers, written once for every engine that runs it. Each buffer
//! has a role (a checkpoint tensor, the image's pixels, an activation of one
//! image, an output read back) and a length; each step has its problem, the
//! profile slot that picks its kernel (none for the ops that keep the defaults),
//! its layer and its buffers in the problem's binding order.
//!
//! The op sequence: patch embedding, position add, the first layer's LayerNorm 1;
//! per layer q/k/v Linear, bidirectional attention, out_proj, the residual add
//! fused with LayerNorm 2 (`residual_layer_norm`), fc1 with GELU, fc2, the
//! residual add fused with the next layer's LayerNorm 1 (or the post LayerNorm,
//! into the features); the projector's average pool, `(1 + w)` RMSNorm and GEMM
//! into the soft tokens. The residual stream alternates between `x` and `a`
//! within a layer and is back in `x` at the start of the next.
//!
//! The CPU engine (`runtime::vision`) runs the steps with the CPU kernels on host
//! memory, the GPU engine (`runtime::vision_gpu`) with the WGSL kernels in one
//! compute pass per image; [`VisionPlan::slot_problems`] (the shapes the tuner
//! races the `vision` regime at, and a profile's choices are checked against)
//! is read off the steps.

use super::select::Slot;
use crate::kernels::{DType, Problem, Role};
use crate::model::VisionConfig;
use crate::model::vision::{LayerModule, VisionModule};

/// Index of a buffer in [`VisionPlan::buffers`].
pub type VisionBufId = usize;

/// What a buffer of the vision plan holds.
#[derive(Clone, Debug, PartialEq)]
pub enum VisionRole {
    /// A tensor of the checkpoint by its canonical name, with its shape as
    /// stored, loaded once; `transposed`: the kernel reads the stored
    /// `[rows, cols]` matrix as `[cols, rows]` (the projector's parameter, held
    /// as transformers holds it, read as a Linear weight).
    Weight { tensor: String, shape: Vec<usize>, transposed: bool },
    /// The image's normalized pixels, `[channels, image, image]`.
    Input,
    /// An activation of one image.
    Scratch,
    /// An activation read back after the image (the features, the soft tokens).
    Output,
}

/// One named buffer.
#[derive(Clone, Debug)]
pub struct VisionBuffer {
    pub name: String,
    pub role: VisionRole,
    /// f32 elements.
    pub len: usize,
}

/// One op of the tower or the projector.
#[derive(Clone, Debug)]
pub struct VisionStep {
    /// The profile slot whose choice runs it (regime `vision`); None for the ops
    /// that keep the runtime's defaults (the position add, the projector's RMSNorm).
    pub slot: Option<Slot>,
    /// The encoder layer it belongs to.
    pub layer: Option<usize>,
    pub problem: Problem,
    /// Buffers in the problem's binding order.
    pub binds: Vec<VisionBufId>,
    /// Bit i set: `binds[i]` is an output.
    outputs: u32,
}

impl VisionStep {
    /// The buffers read, in binding order.
    pub fn inputs(&self) -> impl Iterator<Item = VisionBufId> + '_ {
        self.binds.iter().enumerate().filter(|(i, _)| self.outputs & (1 << i) == 0).map(|(_, &b)| b)
    }

    /// The buffers written, in binding order.
    pub fn outputs(&self) -> impl Iterator<Item = VisionBufId> + '_ {
        self.binds.iter().enumerate().filter(|(i, _)| self.outputs & (1 << i) != 0).map(|(_, &b)| b)
    }
}

/// The tower and projector of one [`VisionConfig`] as buffers and steps.
#[derive(Clone, Debug)]
pub struct VisionPlan {
    pub buffers: Vec<VisionBuffer>,
    pub steps: Vec<VisionStep>,
    /// The image's pixels.
    pub pixels: VisionBufId,
    /// The tower's last hidden state, `[patches, hidden]` (after `post_layernorm`).
    pub features: VisionBufId,
    /// The projected soft tokens, `[mm_tokens_per_image, text hidden]`.
    pub tokens: VisionBufId,
}

/// The order [`VisionPlan::slot_problems`] lists the slots in (and a tower
/// reports its kernels in).
const SLOT_ORDER: [Slot; 7] = [
    Slot::VisionPatchEmbed,
    Slot::VisionNorm,
    Slot::VisionResidualNorm,
    Slot::VisionMlp,
    Slot::VisionAttention,
    Slot::VisionPool,
    Slot::Projector,
];

/// Builds a plan: buffers as they are declared, steps as they are added.
struct Builder {
    buffers: Vec<VisionBuffer>,
    steps: Vec<VisionStep>,
    config: VisionConfig,
}

impl Builder {
    fn buffer(&mut self, name: &str, role: VisionRole, len: usize) -> VisionBufId {
        self.buffers.push(VisionBuffer { name: name.into(), role, len });
        self.buffers.len() - 1
    }

    /// The weight buffer of `module`, and its bias's when it has one.
    fn module(&mut self, module: VisionModule) -> (VisionBufId, Option<VisionBufId>) {
        let shape = module.shape(&self.config);
        let (tensor, out) = (module.weight(), shape[0]);
        let transposed = module == VisionModule::InputProjection;
        let len = shape.iter().product();
        let w = self.buffer(&tensor.clone(), VisionRole::Weight { tensor, shape, transposed }, len);
        let b = module
            .bias()
            .map(|tensor| self.buffer(&tensor.clone(), VisionRole::Weight { tensor, shape: vec![out], transposed: false }, out));
        (w, b)
    }

    /// `module`'s weight and bias buffers (a module with a bias: every one but
    /// the position embedding, the soft-embedding norm and the input projection).
    fn pair(&mut self, module: VisionModule) -> [VisionBufId; 2] {
        let (w, b) = self.module(module);
        [w, b.expect("the plan binds a bias only of modules that have one")]
    }

    fn step(&mut self, slot: Option<Slot>, layer: Option<usize>, problem: Problem, binds: &[VisionBufId]) {
        let outputs =
            problem.buffers(DType::F32).iter().enumerate().filter(|(_, s)| s.role == Role::Output).fold(0u32, |m, (i, _)| m | (1 << i));
        self.steps.push(VisionStep { slot, layer, problem, binds: binds.to_vec(), outputs });
    }
}

impl VisionPlan {
    /// The plan of the tower and projector `c` describes.
    pub fn new(c: &VisionConfig) -> VisionPlan {
        let (h, inter, n, m, th) = (c.hidden_size, c.intermediate_size, c.num_patches(), c.mm_tokens_per_image, c.text_hidden_size);
        let eps = c.layer_norm_eps as f32;
        let mut b = Builder { buffers: Vec::new(), steps: Vec::new(), config: c.clone() };
        use VisionRole::{Input, Output, Scratch};
        let pixels = b.buffer("pixels", Input, c.num_channels * c.image_size * c.image_size);
        let [x, t, q, k, v, a, xn] = ["x", "t", "q", "k", "v", "a", "xn"].map(|name| b.buffer(name, Scratch, n * h));
        let mid = b.buffer("mid", Scratch, n * inter);
        let features = b.buffer("features", Output, n * h);
        let pooled = b.buffer("pooled", Scratch, m * h);
        let normed = b.buffer("normed", Scratch, m * h);
        let tokens = b.buffer("tokens", Output, m * th);

        let [pw, pb] = b.pair(VisionModule::PatchEmbedding);
        let patch = Problem::PatchEmbed { channels: c.num_channels, image: c.image_size, patch: c.patch_size, hidden: h };
        b.step(Some(Slot::VisionPatchEmbed), None, patch, &[pixels, pw, pb, t]);
        let (pos, _) = b.module(VisionModule::PositionEmbedding);
        b.step(None, None, Problem::ResidualAdd { n: n * h }, &[t, pos, x]);
        // `xn`: the LayerNorm of the stream that the next block reads. The first
        // layer's LayerNorm 1 follows the position add; every other LayerNorm
        // follows a residual add and runs fused with it.
        let norm_before =
            |l: usize| if l < c.num_layers { VisionModule::Layer(l, LayerModule::LayerNorm1) } else { VisionModule::PostLayerNorm };
        let into = |l: usize| if l < c.num_layers { xn } else { features };
        let [w, bias] = b.pair(norm_before(0));
        b.step(Some(Slot::VisionNorm), None, Problem::LayerNorm { rows: n, dim: h, eps }, &[x, w, bias, into(0)]);
        let lin = |out: usize, k: usize, gelu: bool| Problem::Linear { m: n, n: out, k, gelu };
        let hd = c.head_dim();
        let attn = Problem::AttentionFull { tokens: n, heads: c.num_heads, head_dim: hd, scale: (hd as f64).powf(-0.5) as f32 };
        let res_ln = Problem::ResidualLayerNorm { rows: n, dim: h, eps };
        for l in 0..c.num_layers {
            let layer = Some(l);
            let linear = |b: &mut Builder, part: LayerModule, problem: Problem, src: VisionBufId, dst: VisionBufId| {
                let [w, bias] = b.pair(VisionModule::Layer(l, part));
                b.step(Some(Slot::VisionMlp), layer, problem, &[src, w, bias, dst]);
            };
            linear(&mut b, LayerModule::Q, lin(h, h, false), xn, q);
            linear(&mut b, LayerModule::K, lin(h, h, false), xn, k);
            linear(&mut b, LayerModule::V, lin(h, h, false), xn, v);
            b.step(Some(Slot::VisionAttention), layer, attn.clone(), &[q, k, v, a]);
            linear(&mut b, LayerModule::Out, lin(h, h, false), a, t);
            let [w, bias] = b.pair(VisionModule::Layer(l, LayerModule::LayerNorm2));
            b.step(Some(Slot::VisionResidualNorm), layer, res_ln.clone(), &[x, t, w, bias, a, xn]);
            linear(&mut b, LayerModule::Fc1, lin(inter, h, true), xn, mid);
            linear(&mut b, LayerModule::Fc2, lin(h, inter, false), mid, t);
            let [w, bias] = b.pair(norm_before(l + 1));
            b.step(Some(Slot::VisionResidualNorm), layer, res_ln.clone(), &[a, t, w, bias, x, into(l + 1)]);
        }
        // Projector: pool the patch grid, (1 + w) RMSNorm, project to the text width.
        b.step(
            Some(Slot::VisionPool),
            None,
            Problem::AvgPool { side: c.patches_per_side(), kernel: c.pool_kernel(), dim: h },
            &[features, pooled],
        );
        let (norm, _) = b.module(VisionModule::SoftEmbNorm);
        b.step(None, None, Problem::RmsNorm { rows: m, dim: h, eps, unit_offset: true }, &[pooled, norm, normed]);
        let (proj, _) = b.module(VisionModule::InputProjection);
        b.step(Some(Slot::Projector), None, Problem::Gemm { m, n: th, k: h }, &[normed, proj, tokens]);
        VisionPlan { buffers: b.buffers, steps: b.steps, pixels, features, tokens }
    }

    /// The kernel problems of one image by vision slot, each with how many times
    /// it runs (the steps but the position add and the projector's RMSNorm,
    /// which keep the defaults): the shapes the tuner races the `vision` regime
    /// at and a profile's choices are checked against. Slots in a fixed order,
    /// each slot's problems in the order they first run.
    pub fn slot_problems(&self) -> Vec<(Slot, Problem, usize)> {
        let mut out: Vec<(Slot, Problem, usize)> = Vec::new();
        for step in &self.steps {
            let Some(slot) = step.slot else { continue };
            match out.iter_mut().find(|(s, p, _)| *s == slot && *p == step.problem) {
                Some(e) => e.2 += 1,
                None => out.push((slot, step.problem.clone(), 1)),
            }
        }
        out.sort_by_key(|(s, _, _)| SLOT_ORDER.iter().position(|o| o == s));
        out
    }
}

/// [`VisionPlan::slot_problems`] of the tower `c` describes.
pub fn slot_problems(c: &VisionConfig) -> Vec<(Slot, Problem, usize)> {
    VisionPlan::new(c).slot_problems()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(layers: usize) -> VisionConfig {
        VisionConfig { num_layers: layers, text_hidden_size: 12, ..VisionConfig::tiny() }
    }

    /// Every step binds as many buffers as its problem has, each of the
    /// problem's length, none twice; weights are only read, the pixels only
    /// read, and every activation a step reads was written by an earlier step.
    #[test]
    fn steps_bind_buffers_of_their_problems_shapes() {
        for layers in [0, 1, 3] {
            let plan = VisionPlan::new(&config(layers));
            let mut written = vec![false; plan.buffers.len()];
            for (i, s) in plan.steps.iter().enumerate() {
                let specs = s.problem.buffers(DType::F32);
                assert_eq!(specs.len(), s.binds.len(), "step {i} {}", s.problem.describe());
                for (spec, &b) in specs.iter().zip(&s.binds) {
                    assert_eq!(
                        spec.len(),
                        plan.buffers[b].len,
                        "step {i} {}: {} on {}",
                        s.problem.describe(),
                        spec.id,
                        plan.buffers[b].name
                    );
                }
                let mut seen = s.binds.clone();
                seen.sort();
                seen.dedup();
                assert_eq!(seen.len(), s.binds.len(), "step {i} binds a buffer twice");
                for b in s.inputs() {
                    let role = &plan.buffers[b].role;
                    let ready = matches!(role, VisionRole::Weight { .. } | VisionRole::Input) || written[b];
                    assert!(ready, "step {i} reads {} before it is written", plan.buffers[b].name);
                }
                for b in s.outputs() {
                    assert!(
                        matches!(plan.buffers[b].role, VisionRole::Scratch | VisionRole::Output),
                        "step {i} writes {}",
                        plan.buffers[b].name
                    );
                    written[b] = true;
                }
            }
            assert!(written[plan.features] && written[plan.tokens]);
        }
    }

    /// The weight buffers are the config's tensors, each once, with its shape.
    #[test]
    fn weights_are_the_configs_tensors() {
        let c = config(2);
        let plan = VisionPlan::new(&c);
        let mut got: Vec<(String, Vec<usize>)> = plan
            .buffers
            .iter()
            .filter_map(|b| match &b.role {
                VisionRole::Weight { tensor, shape, .. } => Some((tensor.clone(), shape.clone())),
                _ => None,
            })
            .collect();
        let mut want = c.tensor_shapes();
        got.sort();
        want.sort();
        assert_eq!(got, want);
    }

    /// The slots' problems and counts: each layer's four h x h projections, fc1,
    /// fc2, attention and two fused norms; one patch embedding, first norm, pool
    /// and projection; nothing of a layer without layers.
    #[test]
    fn slot_problems_count_each_shape() {
        let c = config(3);
        let got = slot_problems(&c);
        let lin = |out: usize, k: usize, gelu: bool| Problem::Linear { m: 16, n: out, k, gelu };
        let slots: Vec<(Slot, usize)> = got.iter().map(|(s, _, n)| (*s, *n)).collect();
        assert_eq!(
            slots,
            vec![
                (Slot::VisionPatchEmbed, 1),
                (Slot::VisionNorm, 1),
                (Slot::VisionResidualNorm, 6),
                (Slot::VisionMlp, 12),
                (Slot::VisionMlp, 3),
                (Slot::VisionMlp, 3),
                (Slot::VisionAttention, 3),
                (Slot::VisionPool, 1),
                (Slot::Projector, 1),
            ]
        );
        let mlp: Vec<&Problem> = got.iter().filter(|(s, _, _)| *s == Slot::VisionMlp).map(|(_, p, _)| p).collect();
        assert_eq!(mlp, vec![&lin(8, 8, false), &lin(16, 8, true), &lin(8, 16, false)]);
        assert_eq!(got.last().map(|e| &e.1), Some(&Problem::Gemm { m: 4, n: 12, k: 8 }));
        let none: Vec<Slot> = slot_problems(&config(0)).into_iter().map(|(s, _, _)| s).collect();
        assert_eq!(none, vec![Slot::VisionPatchEmbed, Slot::VisionNorm, Slot::VisionPool, Slot::Projector]);
    }
}
