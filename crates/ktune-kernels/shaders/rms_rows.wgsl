// The uniform block and row count of the row-wise RMSNorm interfaces (norm_rms.wgsl,
// fused_residual_rms_norm.wgsl), and the norm weight `w` read as u32 words decoded by
// W_F16 (wload.wgsl).
// Requires: wload.wgsl.

struct Dims { rows: u32, dim: u32, eps: f32, unit_offset: u32 }

fn wload(i: u32) -> f32 { return wpick(w[wword(i)], i); }

fn row_count() -> u32 {
    return dims.rows;
}
