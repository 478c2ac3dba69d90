//! The aarch64 dot microkernels (NEON).

use std::arch::aarch64::*;

#[target_feature(enable = "neon")]
pub unsafe fn dot_f32_neon(x: &[f32], w: &[f32]) -> f32 {
    let n = x.len();
    let mut a = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    // SAFETY: loads read [i, i+4) with i + 4 <= n.
    unsafe {
        while i + 16 <= n {
            for l in 0..4 {
                a[l] = vfmaq_f32(a[l], vld1q_f32(x.as_ptr().add(i + 4 * l)), vld1q_f32(w.as_ptr().add(i + 4 * l)));
            }
            i += 16;
        }
    }
    let mut s = vaddvq_f32(vaddq_f32(vaddq_f32(a[0], a[1]), vaddq_f32(a[2], a[3])));
    while i < n {
        s += x[i] * w[i];
        i += 1;
    }
    s
}
