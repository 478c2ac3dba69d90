//! A vision tower on the device a session runs on: the vision plan on the CPU
//! ([`VisionEngine`]) or on the GPU ([`VisionGpu`]), one type that switches
//! between kernel selections and times an image through the tower and projector
//! (what `bench --image` and the tuner's end-to-end stage measure).

use std::sync::Arc;
use std::time::Instant;

use super::RuntimeError;
use super::vision::{VisionEngine, VisionOutput};
use super::vision_gpu::VisionGpu;
use crate::gpu::GpuCtx;
use crate::model::{VisionConfig, Weights};
use crate::plan::Selection;

/// The vision tower on the CPU or on the GPU, as `run` runs it on that device.
pub enum Tower {
    Cpu(VisionEngine),
    Gpu(VisionGpu),
}

impl Tower {
    /// The tower of `config` on the GPU of `ctx`, else on the CPU, with the
    /// runtime's default kernels.
    pub fn new(config: &VisionConfig, weights: &Weights, ctx: Option<Arc<GpuCtx>>) -> Result<Tower, RuntimeError> {
        Ok(match ctx {
            Some(g) => Tower::Gpu(VisionGpu::new(config, weights, g)?),
            None => Tower::Cpu(VisionEngine::new(config, weights)?),
        })
    }

    /// Switches the tower to `sel`'s vision choices.
    pub fn select(&mut self, sel: &Selection) -> Result<(), RuntimeError> {
        match self {
            Tower::Cpu(t) => t.set_selection(sel),
            Tower::Gpu(t) => t.set_selection(sel),
        }
    }

    /// The kernel of each vision slot under the current selection, as `slot kernel`.
    pub fn kernels(&self) -> Result<Vec<String>, RuntimeError> {
        let k = match self {
            Tower::Cpu(t) => t.kernels()?,
            Tower::Gpu(t) => t.kernels()?,
        };
        Ok(k.into_iter().map(|(slot, k)| format!("{} {k}", slot.name())).collect())
    }

    /// One image (`[3, size, size]` normalized pixels) through the tower and projector.
    pub fn encode(&self, pixels: &[f32]) -> Result<VisionOutput, RuntimeError> {
        match self {
            Tower::Cpu(t) => t.encode(pixels),
            Tower::Gpu(t) => t.encode(pixels),
        }
    }

    /// Seconds for one image through the tower with `sel`'s choices.
    pub fn sample(&mut self, sel: &Selection, pixels: &[f32]) -> Result<f64, RuntimeError> {
        self.select(sel)?;
        let t0 = Instant::now();
        self.encode(pixels)?;
        Ok(t0.elapsed().as_secs_f64())
    }
}

/// A deterministic image of `size x size` pixels as the tower reads it
/// (`[3, size, size]`, normalized to [-1, 1]): smooth gradients per channel with
/// a little pseudo-random texture, so timing a tower needs no image file.
pub fn synthetic_image(size: usize) -> Vec<f32> {
    let plane = size * size;
    let mut out = vec![0f32; 3 * plane];
    let mut state: u32 = 0x9e37_79b9;
    let span = size.max(2) as f32 - 1.0;
    for c in 0..3 {
        for y in 0..size {
            for x in 0..size {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                let noise = (state >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
                let g = match c {
                    0 => x as f32 / span,
                    1 => y as f32 / span,
                    _ => (x + y) as f32 / (2.0 * span),
                };
                out[c * plane + y * size + x] = ((2.0 * g - 1.0) * 0.8 + 0.4 * noise).clamp(-1.0, 1.0);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    /// The synthetic image has the tower's input size, stays in the normalized
    /// range, is the same every time and is not flat.
    #[test]
    fn synthetic_image_is_deterministic_and_in_range() {
        let a = super::synthetic_image(16);
        assert_eq!(a.len(), 3 * 16 * 16);
        assert_eq!(a, super::synthetic_image(16));
        assert!(a.iter().all(|v| (-1.0..=1.0).contains(v)));
        let (lo, hi) = a.iter().fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
        assert!(hi - lo > 1.0, "{lo}..{hi}");
    }
}
