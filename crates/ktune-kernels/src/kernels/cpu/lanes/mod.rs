//! The lane-width abstraction the CPU microkernels are written against: a kernel is
//! written once, generic over [`Lanes`], and [`isa_dispatch!`] instantiates it inside
//! a `#[target_feature]` function per instruction set (AVX-512F: 16 lanes,
//! AVX2+FMA+F16C: 8 lanes) or with the portable 8-lane arrays the compiler vectorises
//! for the baseline target (the `isa = 1` scalar level, and every level on other
//! architectures). The AVX paths only differ from the portable one in these
//! primitives, each one instruction. Also the vector `exp` the activation and
//! softmax kernels share.

use half::f16;

/// Vector primitives of one instruction set. Methods are `#[inline(always)]` so a
/// generic kernel collapses into the `#[target_feature]` function that calls it.
/// A helper inside a generic kernel is an `#[inline(always)]` function, not a
/// closure: a closure does not take the target features of the function it is
/// inlined into, so LLVM leaves its primitives as calls when it keeps the
/// closure out of line (the gated activation's per-vector closure did: its
/// `_mm512_*` calls were a tenth of a decode batch's samples, and a lone decode
/// token 17% slower). `nm -C target/release/ktune | grep core_arch` lists any
/// intrinsic left out of line.
pub trait Lanes: Copy {
    type V: Copy;
    /// Lanes per vector.
    const N: usize;
    fn splat(self, a: f32) -> Self::V;
    /// Loads `s[..N]` (panics when `s` is shorter).
    fn load(self, s: &[f32]) -> Self::V;
    /// Loads `s[..N]` halves widened to f32.
    fn load_f16(self, s: &[f16]) -> Self::V;
    /// Loads `s[..N]` signed bytes widened to f32 (a q8_0 block's codes).
    fn load_i8(self, s: &[i8]) -> Self::V;
    /// A half widened to f32 in every lane (a q8_0 block's scale: one vector
    /// conversion, not `f16::to_f32`'s call).
    fn splat_f16(self, h: f16) -> Self::V;
    /// Stores into `s[..N]`.
    fn store(self, s: &mut [f32], v: Self::V);
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    fn sub(self, a: Self::V, b: Self::V) -> Self::V;
    fn mul(self, a: Self::V, b: Self::V) -> Self::V;
    fn div(self, a: Self::V, b: Self::V) -> Self::V;
    fn max(self, a: Self::V, b: Self::V) -> Self::V;
    fn min(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a * b + c`.
    fn fma(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// Round to the nearest integer.
    fn round(self, a: Self::V) -> Self::V;
    /// `2^n` for integral `n` in `[-126, 127]`.
    fn pow2i(self, n: Self::V) -> Self::V;
    fn hsum(self, a: Self::V) -> f32;
    fn hmax(self, a: Self::V) -> f32;
    /// Swaps lanes `2i` and `2i + 1`.
    fn swap_pairs(self, a: Self::V) -> Self::V;
}

/// A weight element (f32 or f16), loadable as lanes.
pub trait Elem: Copy + Send + Sync + 'static {
    fn f32(self) -> f32;
    fn load<L: Lanes>(l: L, s: &[Self]) -> L::V;
}

impl Elem for f32 {
    #[inline(always)]
    fn f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn load<L: Lanes>(l: L, s: &[f32]) -> L::V {
        l.load(s)
    }
}

impl Elem for f16 {
    #[inline(always)]
    fn f32(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn load<L: Lanes>(l: L, s: &[f16]) -> L::V {
        l.load_f16(s)
    }
}

/// Portable 8-lane arrays: plain loops the compiler vectorises for the target.
#[derive(Clone, Copy, Debug, Default)]
pub struct Portable;

#[inline(always)]
fn map2(a: [f32; 8], b: [f32; 8], f: impl Fn(f32, f32) -> f32) -> [f32; 8] {
    std::array::from_fn(|i| f(a[i], b[i]))
}

impl Lanes for Portable {
    type V = [f32; 8];
    const N: usize = 8;
    #[inline(always)]
    fn splat(self, a: f32) -> [f32; 8] {
        [a; 8]
    }
    #[inline(always)]
    fn load(self, s: &[f32]) -> [f32; 8] {
        let mut v = [0.0; 8];
        v.copy_from_slice(&s[..8]);
        v
    }
    #[inline(always)]
    fn load_f16(self, s: &[f16]) -> [f32; 8] {
        let s = &s[..8];
        std::array::from_fn(|i| s[i].to_f32())
    }
    #[inline(always)]
    fn load_i8(self, s: &[i8]) -> [f32; 8] {
        let s = &s[..8];
        std::array::from_fn(|i| f32::from(s[i]))
    }
    #[inline(always)]
    fn splat_f16(self, h: f16) -> [f32; 8] {
        [h.to_f32(); 8]
    }
    #[inline(always)]
    fn store(self, s: &mut [f32], v: [f32; 8]) {
        s[..8].copy_from_slice(&v);
    }
    #[inline(always)]
    fn add(self, a: [f32; 8], b: [f32; 8]) -> [f32; 8] {
        map2(a, b, |x, y| x + y)
    }
    #[inline(always)]
    fn sub(self, a: [f32; 8], b: [f32; 8]) -> [f32; 8] {
        map2(a, b, |x, y| x - y)
    }
    #[inline(always)]
    fn mul(self, a: [f32; 8], b: [f32; 8]) -> [f32; 8] {
        map2(a, b, |x, y| x * y)
    }
    #[inline(always)]
    fn div(self, a: [f32; 8], b: [f32; 8]) -> [f32; 8] {
        map2(a, b, |x, y| x / y)
    }
    #[inline(always)]
    fn max(self, a: [f32; 8], b: [f32; 8]) -> [f32; 8] {
        map2(a, b, |x, y| if x > y { x } else { y })
    }
    #[inline(always)]
    fn min(self, a: [f32; 8], b: [f32; 8]) -> [f32; 8] {
        map2(a, b, |x, y| if x < y { x } else { y })
    }
    #[inline(always)]
    fn fma(self, a: [f32; 8], b: [f32; 8], c: [f32; 8]) -> [f32; 8] {
        std::array::from_fn(|i| a[i] * b[i] + c[i])
    }
    #[inline(always)]
    fn round(self, a: [f32; 8]) -> [f32; 8] {
        a.map(f32::round)
    }
    #[inline(always)]
    fn pow2i(self, n: [f32; 8]) -> [f32; 8] {
        n.map(|v| f32::from_bits(((v as i32 + 127) as u32) << 23))
    }
    #[inline(always)]
    fn hsum(self, a: [f32; 8]) -> f32 {
        ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))
    }
    #[inline(always)]
    fn hmax(self, a: [f32; 8]) -> f32 {
        a.iter().fold(f32::MIN, |m, &v| if v > m { v } else { m })
    }
    #[inline(always)]
    fn swap_pairs(self, a: [f32; 8]) -> [f32; 8] {
        [a[1], a[0], a[3], a[2], a[5], a[4], a[7], a[6]]
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::{Avx2, Avx512};

#[cfg(target_arch = "x86_64")]
mod x86;

/// Runs `$body` with `$l` bound to the [`Lanes`] of `$isa`, inside a function
/// compiled for that instruction set (`#[target_feature]`), so the generic
/// kernels it calls are inlined and vectorised for it. The arguments are passed
/// explicitly (`name: type = value`): the body cannot capture.
macro_rules! isa_dispatch {
    ($isa:expr, |$l:ident| ($($arg:ident : $ty:ty = $val:expr),* $(,)?) -> $ret:ty $body:block) => {{
        match $isa {
            // SAFETY (both x86 arms): `Isa::best`/`from_param` yield Avx512 only where the
            // CPU reports avx512f, and Simd256 on x86 only where it reports avx2, fma
            // and f16c; the function is compiled for and only called with them.
            #[cfg(target_arch = "x86_64")]
            $crate::kernels::cpu::Isa::Avx512 => $crate::kernels::cpu::lanes::isa_arm!("avx512f", Avx512, |$l| ($($arg: $ty = $val),*) -> $ret $body),
            #[cfg(target_arch = "x86_64")]
            $crate::kernels::cpu::Isa::Simd256 => $crate::kernels::cpu::lanes::isa_arm!("avx2,fma,f16c", Avx2, |$l| ($($arg: $ty = $val),*) -> $ret $body),
            _ => {
                fn run($($arg: $ty),*) -> $ret {
                    let $l = $crate::kernels::cpu::lanes::Portable;
                    $body
                }
                run($($val),*)
            }
        }
    }};
}

/// One x86 arm of [`isa_dispatch!`]: `$body` in a function compiled with `$features`,
/// `$l` the lanes type `$lanes` of that instruction set.
#[cfg(target_arch = "x86_64")]
macro_rules! isa_arm {
    ($features:literal, $lanes:ident, |$l:ident| ($($arg:ident : $ty:ty = $val:expr),*) -> $ret:ty $body:block) => {{
        #[target_feature(enable = $features)]
        fn run($($arg: $ty),*) -> $ret {
            // SAFETY: this function is compiled for and only called with `$features`.
            let $l = unsafe { $crate::kernels::cpu::lanes::$lanes::new_unchecked() };
            $body
        }
        // SAFETY: the dispatching `Isa` was detected on this CPU (see `isa_dispatch!`).
        unsafe { run($($val),*) }
    }};
}
#[cfg(target_arch = "x86_64")]
pub(crate) use isa_arm;
pub(crate) use isa_dispatch;

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
const EXP_P: [f32; 6] = [1.987_569_1e-4, 1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5];

/// `e^x` per lane (Cephes `expf`: exact-split range reduction by ln 2, degree-6
/// polynomial; relative error about 1e-7). Inputs are clamped to
/// `[-87.3, 88]`, so very negative inputs give about 1e-38 rather than 0.
#[inline(always)]
pub fn exp<L: Lanes>(l: L, x: L::V) -> L::V {
    let x = l.min(l.max(x, l.splat(-87.3)), l.splat(88.0));
    let n = l.round(l.mul(x, l.splat(LOG2E)));
    let r = l.fma(n, l.splat(-LN2_HI), x);
    let r = l.fma(n, l.splat(-LN2_LO), r);
    let mut q = l.splat(EXP_P[0]);
    for c in &EXP_P[1..] {
        q = l.fma(q, r, l.splat(*c));
    }
    let e = l.add(l.fma(q, l.mul(r, r), r), l.splat(1.0));
    l.mul(e, l.pow2i(n))
}
