//! The vision tower: a SigLIP encoder and Gemma 3's multimodal projector run as
//! the steps of the vision plan ([`VisionPlan`]: patch embedding, LayerNorm,
//! Linear with bias and GELU, bidirectional attention, each residual add fused
//! with the LayerNorm after it, the average pool, the projector's `(1 + w)`
//! RMSNorm and GEMM), by one engine over either backend ([`TowerBackend`]): the
//! CPU kernels on host memory here ([`VisionEngine`]), the WGSL kernels in one
//! compute pass on a wgpu adapter in [`super::vision_gpu`]. Each step's kernel
//! is picked like the runtime's defaults (the backend's preference list, then
//! any valid kernel of the op of that backend, default parameters) or forced per
//! op ([`VisionTower::with_kernel`], or a profile's `vision` slots through
//! [`VisionTower::with_selection`], checked at every shape the slot runs).
//!
//! One image in (`[channels, image, image]` pixels, normalized as the image
//! processor does: [`super::image`]), the tower's last hidden state
//! (`[patches, hidden]`, after `post_layernorm`) and the projected soft tokens
//! (`[mm_tokens_per_image, text hidden]`) out, as transformers'
//! `vision_tower(...).last_hidden_state` and `get_image_features` return them.

use std::collections::BTreeMap;

use super::RuntimeError;
use crate::device::CpuCaps;
use crate::kernels::{self, Backend, Caps, CpuArgs, CpuIn, CpuOuts, DType, KernelDef, Op, Params, Problem};
use crate::model::{VisionConfig, Weights};
use crate::plan::Regime;
use crate::plan::select::{Selection, Slot, preferred};
use crate::plan::vision::{VisionPlan, VisionRole, VisionStep};

/// What one image becomes.
#[derive(Clone, Debug)]
pub struct VisionOutput {
    /// The tower's last hidden state, `[patches, hidden]`.
    pub features: Vec<f32>,
    /// The projected soft tokens, `[mm_tokens_per_image, text hidden]`.
    pub tokens: Vec<f32>,
}

/// A kernel with its parameters, as a step runs it.
pub type Chosen = (&'static KernelDef, Params);

/// Where a vision plan runs: the device's capabilities (which kernels are valid)
/// and the execution of the plan's steps with one chosen kernel each.
pub trait TowerBackend {
    /// The capabilities kernels are checked against.
    fn caps(&self) -> Caps<'_>;
    /// The device in messages ("the CPU", "the GPU <adapter>").
    fn on(&self) -> String;
    /// Runs every step of `plan` with its kernel of `kernels` over `pixels`
    /// (already checked to be the plan's input length).
    fn run(&self, plan: &VisionPlan, kernels: &[Chosen], pixels: &[f32]) -> Result<VisionOutput, RuntimeError>;
}

/// A loaded vision tower and projector on one backend, with the kernel of each op.
pub struct VisionTower<B> {
    pub config: VisionConfig,
    plan: VisionPlan,
    forced: BTreeMap<Op, Chosen>,
    backend: B,
}

/// The tower on the CPU.
pub type VisionEngine = VisionTower<CpuTower>;

/// The plan's weights as f32 host values, by buffer (empty for the other
/// buffers): each tensor read with its shape checked, a transposed one transposed.
pub(super) fn load_weights(plan: &VisionPlan, weights: &Weights) -> Result<Vec<Vec<f32>>, RuntimeError> {
    plan.buffers
        .iter()
        .map(|b| {
            let VisionRole::Weight { tensor, shape, transposed } = &b.role else { return Ok(Vec::new()) };
            let v = weights.f32(tensor, shape).map_err(|e| RuntimeError::Weights(e.to_string()))?;
            match (transposed, shape.as_slice()) {
                (true, &[rows, cols]) => {
                    let mut t = vec![0f32; v.len()];
                    for r in 0..rows {
                        for c in 0..cols {
                            t[c * rows + r] = v[r * cols + c];
                        }
                    }
                    Ok(t)
                }
                _ => Ok(v),
            }
        })
        .collect()
}

impl<B: TowerBackend> VisionTower<B> {
    pub(super) fn with_backend(config: &VisionConfig, plan: VisionPlan, backend: B) -> VisionTower<B> {
        VisionTower { config: config.clone(), plan, forced: BTreeMap::new(), backend }
    }

    /// Runs `op` with `kernel` (its default parameters) instead of the default choice.
    pub fn with_kernel(mut self, kernel: &'static KernelDef) -> VisionTower<B> {
        self.forced.insert(kernel.op, (kernel, kernel.default_params()));
        self
    }

    /// Runs the op of each vision slot chosen in `selection` (a profile's
    /// `vision` section, [`Regime::Vision`]) with that choice (kernel and
    /// parameters); the other ops keep the defaults. A choice this tower cannot
    /// run (a kernel of the other backend, another op than the slot's, a kernel
    /// invalid on this device at the tower's shapes) is an error naming the
    /// slot, the kernel and the reason.
    pub fn with_selection(mut self, selection: &Selection) -> Result<VisionTower<B>, RuntimeError> {
        self.set_selection(selection)?;
        Ok(self)
    }

    /// [`VisionTower::with_selection`] in place: the choices of `selection`
    /// replace every earlier one (`bench --image` switches one engine between
    /// its entries).
    pub fn set_selection(&mut self, selection: &Selection) -> Result<(), RuntimeError> {
        self.forced = self.selected(selection)?;
        Ok(())
    }

    fn backend_kind(&self) -> Backend {
        match self.backend.caps() {
            Caps::Cpu(_) => Backend::Cpu,
            Caps::Gpu(_) => Backend::Wgsl,
        }
    }

    /// The forced kernel per op: the vision slots' choices of `selection`, each
    /// checked to be a kernel of this backend computing the slot's op and valid
    /// at every shape the slot runs.
    fn selected(&self, selection: &Selection) -> Result<BTreeMap<Op, Chosen>, RuntimeError> {
        let (caps, backend, on) = (self.backend.caps(), self.backend_kind(), self.backend.on());
        let problems = self.plan.slot_problems();
        let mut forced = BTreeMap::new();
        for &slot in Slot::VISION {
            let Some(c) = selection.slots.get(&(slot, Regime::Vision)) else { continue };
            let bad = |why: String| RuntimeError::Kernel {
                slot: slot.name().into(),
                layer: None,
                source: Box::new(kernels::KernelError::Invalid { kernel: c.kernel.id.into(), reason: why }),
            };
            if c.kernel.backend() != backend {
                return Err(bad(format!(
                    "a {} kernel; the vision tower runs on {on} ({} kernels)",
                    c.kernel.backend().name(),
                    backend.name()
                )));
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

    /// The kernel (with its parameters) of each vision slot, as `encode` runs
    /// them (its choice for the slot's first shape).
    pub fn kernels(&self) -> Result<Vec<(Slot, String)>, RuntimeError> {
        let mut out: Vec<(Slot, String)> = Vec::new();
        for (slot, p, _) in self.plan.slot_problems() {
            if out.iter().any(|(s, _)| *s == slot) {
                continue;
            }
            let (k, params) = self.choose(&p, None)?;
            out.push((slot, k.label(&params)));
        }
        Ok(out)
    }

    /// The kernel that runs `problem`: the forced one, else the first valid of the
    /// backend's preference list, else the first valid kernel of the op.
    fn choose(&self, problem: &Problem, layer: Option<usize>) -> Result<Chosen, RuntimeError> {
        let (caps, backend) = (self.backend.caps(), self.backend_kind());
        if let Some((k, p)) = self.forced.get(&problem.op()) {
            k.check(caps, problem, DType::F32, p)
                .map_err(|reason| kernel_err(problem, layer, kernels::KernelError::Invalid { kernel: k.id.into(), reason }))?;
            return Ok((*k, p.clone()));
        }
        let listed = preferred(problem, backend).iter().filter_map(|id| kernels::find(id).ok());
        let rest = kernels::for_op(problem.op()).filter(|k| k.backend() == backend);
        let mut reasons = Vec::new();
        for k in listed.chain(rest) {
            let p = k.default_params();
            match k.check(caps, problem, DType::F32, &p) {
                Ok(()) => return Ok((k, p)),
                Err(r) => reasons.push(format!("{}: {r}", k.id)),
            }
        }
        Err(RuntimeError::Internal(format!(
            "no {} kernel can run {} on {}: {}",
            backend.name().to_uppercase(),
            problem.describe(),
            self.backend.on(),
            reasons.join("; ")
        )))
    }

    /// The tower and the projector over one image of normalized pixels
    /// (`[channels, image, image]`).
    pub fn encode(&self, pixels: &[f32]) -> Result<VisionOutput, RuntimeError> {
        let want = self.plan.buffers[self.plan.pixels].len;
        if pixels.len() != want {
            return Err(RuntimeError::Internal(format!("{} pixel values for a {want}-value image", pixels.len())));
        }
        let kernels = self.plan.steps.iter().map(|s| self.choose(&s.problem, s.layer)).collect::<Result<Vec<_>, _>>()?;
        self.backend.run(&self.plan, &kernels, pixels)
    }
}

/// A kernel's failure in a step of the tower.
pub(super) fn kernel_err(problem: &Problem, layer: Option<usize>, e: kernels::KernelError) -> RuntimeError {
    RuntimeError::Kernel { slot: format!("vision {}", problem.op()), layer, source: Box::new(e) }
}

/// The CPU backend: the plan's weights in host memory, the CPU kernels.
pub struct CpuTower {
    caps: CpuCaps,
    /// By plan buffer: a weight's values, empty for the other buffers.
    weights: Vec<Vec<f32>>,
}

impl VisionEngine {
    /// Loads the tower and projector weights of `config` from `weights`.
    pub fn new(config: &VisionConfig, weights: &Weights) -> Result<VisionEngine, RuntimeError> {
        let plan = VisionPlan::new(config);
        let weights = load_weights(&plan, weights)?;
        Ok(VisionTower::with_backend(config, plan, CpuTower { caps: CpuCaps::detect(), weights }))
    }
}

impl TowerBackend for CpuTower {
    fn caps(&self) -> Caps<'_> {
        Caps::Cpu(&self.caps)
    }

    fn on(&self) -> String {
        "the CPU".into()
    }

    /// Each step in turn on host buffers (allocated per image): its outputs
    /// taken out of the activations while its inputs are read.
    fn run(&self, plan: &VisionPlan, kernels: &[Chosen], pixels: &[f32]) -> Result<VisionOutput, RuntimeError> {
        let mut acts: Vec<Vec<f32>> = plan
            .buffers
            .iter()
            .map(|b| match b.role {
                VisionRole::Scratch | VisionRole::Output => vec![0f32; b.len],
                VisionRole::Weight { .. } | VisionRole::Input => Vec::new(),
            })
            .collect();
        for (step, (k, params)) in plan.steps.iter().zip(kernels) {
            let mut outs: Vec<Vec<f32>> = step.outputs().map(|b| std::mem::take(&mut acts[b])).collect();
            let result = {
                let ins = step
                    .inputs()
                    .map(|b| {
                        CpuIn::F32(match plan.buffers[b].role {
                            VisionRole::Weight { .. } => &self.weights[b],
                            VisionRole::Input => pixels,
                            VisionRole::Scratch | VisionRole::Output => &acts[b],
                        })
                    })
                    .collect();
                let outs: CpuOuts<'_> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
                k.run_cpu(&step.problem, DType::F32, params, CpuArgs { ins, outs })
            };
            for (b, o) in step.outputs().zip(outs.drain(..)) {
                acts[b] = o;
            }
            result.map_err(|e| step_err(step, e))?;
        }
        Ok(VisionOutput { features: std::mem::take(&mut acts[plan.features]), tokens: std::mem::take(&mut acts[plan.tokens]) })
    }
}

/// A kernel's failure in `step`.
pub(super) fn step_err(step: &VisionStep, e: kernels::KernelError) -> RuntimeError {
    kernel_err(&step.problem, step.layer, e)
}
