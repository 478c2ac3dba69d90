//! The vision tower on a GPU: the vision plan's steps (the op sequence the CPU
//! engine runs, [`crate::plan::vision`]) with the ops' WGSL kernels on one wgpu
//! adapter, the GPU backend of [`VisionTower`]: weights uploaded once (f32),
//! activations in storage buffers allocated per image, every dispatch of an
//! image recorded into one compute pass, the features and soft tokens read back
//! at the end. Kernels are chosen and forced as on the CPU ([`VisionTower`]),
//! from the WGSL preference list and kernels.

use std::sync::Arc;

use super::RuntimeError;
use super::vision::{Chosen, TowerBackend, VisionOutput, VisionTower, load_weights, step_err};
use crate::gpu::{GpuCtx, GpuProgram};
use crate::kernels::{Caps, DType};
use crate::model::{VisionConfig, Weights};
use crate::plan::vision::{VisionPlan, VisionRole};

/// The tower on a GPU.
pub type VisionGpu = VisionTower<GpuTower>;

/// The GPU backend: the plan's weights in storage buffers of one adapter, the
/// WGSL kernels.
pub struct GpuTower {
    ctx: Arc<GpuCtx>,
    /// By plan buffer: a weight's buffer, None for the other buffers.
    weights: Vec<Option<wgpu::Buffer>>,
}

impl VisionGpu {
    /// Loads the tower and projector weights of `config` from `weights` (as the
    /// CPU engine reads them) and uploads them to `ctx`.
    pub fn new(config: &VisionConfig, weights: &Weights, ctx: Arc<GpuCtx>) -> Result<VisionGpu, RuntimeError> {
        let plan = VisionPlan::new(config);
        let host = load_weights(&plan, weights)?;
        let weights = plan
            .buffers
            .iter()
            .zip(&host)
            .map(|(b, v)| {
                matches!(b.role, VisionRole::Weight { .. }).then(|| ctx.upload(&format!("vision {}", b.name), bytemuck::cast_slice(v)))
            })
            .collect();
        Ok(VisionTower::with_backend(config, plan, GpuTower { ctx, weights }))
    }
}

impl TowerBackend for GpuTower {
    fn caps(&self) -> Caps<'_> {
        Caps::Gpu(&self.ctx.caps)
    }

    fn on(&self) -> String {
        format!("the GPU {}", self.ctx.name)
    }

    /// Every step's program over the plan's buffers, run in one compute pass.
    fn run(&self, plan: &VisionPlan, kernels: &[Chosen], pixels: &[f32]) -> Result<VisionOutput, RuntimeError> {
        let px = self.ctx.upload("vision pixels", bytemuck::cast_slice(pixels));
        let acts: Vec<Option<wgpu::Buffer>> = plan
            .buffers
            .iter()
            .map(|b| match b.role {
                VisionRole::Scratch | VisionRole::Output => Some(self.ctx.storage(&format!("vision {}", b.name), (b.len * 4) as u64)),
                VisionRole::Weight { .. } | VisionRole::Input => None,
            })
            .collect();
        let buffer = |b: usize| -> Result<&wgpu::Buffer, RuntimeError> {
            let buf = match plan.buffers[b].role {
                VisionRole::Weight { .. } => self.weights[b].as_ref(),
                VisionRole::Input => Some(&px),
                VisionRole::Scratch | VisionRole::Output => acts[b].as_ref(),
            };
            buf.ok_or_else(|| RuntimeError::Internal(format!("vision buffer `{}` is not on the GPU", plan.buffers[b].name)))
        };
        let mut progs: Vec<GpuProgram> = Vec::with_capacity(plan.steps.len());
        for (step, (k, params)) in plan.steps.iter().zip(kernels) {
            let bufs = step.binds.iter().map(|&b| buffer(b)).collect::<Result<Vec<_>, _>>()?;
            progs.push(k.prepare_wgsl(&self.ctx, &step.problem, DType::F32, params, &bufs, None).map_err(|e| step_err(step, e))?);
        }
        let refs: Vec<&GpuProgram> = progs.iter().collect();
        self.ctx.run("vision tower", &refs).map_err(|e| RuntimeError::Gpu(e.to_string()))?;
        let read = |b: usize| -> Result<Vec<f32>, RuntimeError> {
            let bytes = self.ctx.read(buffer(b)?, (plan.buffers[b].len * 4) as u64).map_err(|e| RuntimeError::Gpu(e.to_string()))?;
            Ok(bytemuck::pod_collect_to_vec(&bytes))
        };
        Ok(VisionOutput { features: read(plan.features)?, tokens: read(plan.tokens)? })
    }
}
