//! Elementwise and row-wise ops of the MLP and attention glue: the gated activation
//! (`gated_act`, `silu(gate) * up` or `gelu_tanh(gate) * up`), row softmax
//! (`softmax`) and the residual add (`residual_add`); plus [`lanes`], the lane-width
//! abstraction the CPU microkernels of the norm, RoPE and elementwise families are
//! written against, and the rayon orchestrators they share.
//!
//! WGSL: one element per invocation (`*_scalar`, any n) vs 16-byte vectors with
//! several per invocation (`*_vec4`, n % 4 == 0); softmax three-pass with workgroup
//! reductions (`softmax_wg`), online single pass with a workgroup (max, sum) merge
//! (`softmax_online`) and one subgroup per row (`softmax_subgroup`).
//! CPU: AVX-512 / AVX2 / portable microkernels (vectorised exp and sigmoid) under
//! rayon chunking, and a second kernel per op with another orchestration: static
//! per-thread ranges with libm (`*_static_cpu`), or a feature-split online softmax
//! for few long rows (`softmax_split_cpu`, decode).

use rayon::prelude::*;

use self::lanes::{Lanes, isa_dispatch};
use super::simd::{self, Isa};
use super::{
    Activation, CpuArgs, CpuImpl, DType, Impl, KernelDef, KernelError, Op, ParamSpec, Params, Problem, WgslImpl, WgslSetup, p, packed_f16,
    wrong_op,
};
use crate::device::{CpuCaps, GpuCaps};
use crate::gpu::{GpuProgram, Shader, grid_2d, groups};
use crate::shader;

static SCALAR: Shader = shader!("elementwise_scalar.wgsl", "act.wgsl");
static VEC4: Shader = shader!("elementwise_vec4.wgsl", "act.wgsl");
static SOFTMAX_WG: Shader = shader!("elementwise_softmax_wg.wgsl", "elementwise_softmax.wgsl", "row_wg.wgsl", "reduce_wg.wgsl");
static SOFTMAX_ONLINE: Shader = shader!("elementwise_softmax_online.wgsl", "elementwise_softmax.wgsl", "row_wg.wgsl");
static SOFTMAX_SG: Shader = shader!("elementwise_softmax_subgroup.wgsl", "elementwise_softmax.wgsl", "row_sg.wgsl", "reduce_sg.wgsl");

/// These ops have no weight buffer: the dtype changes no buffer, so only f32 is listed.
const F32_ONLY: &[DType] = &[DType::F32];

pub(crate) const ISA: ParamSpec = ParamSpec { name: "isa", values: simd::ISA_VALUES, default: 0, help: simd::ISA_HELP };

const SCALAR_PARAMS: &[ParamSpec] =
    &[ParamSpec { name: "workgroup_size", values: &[64, 128, 256, 512], default: 256, help: "invocations (elements) per workgroup" }];

const VEC4_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "workgroup_size", values: &[64, 128, 256], default: 128, help: "invocations per workgroup" },
    ParamSpec { name: "vec_per_thread", values: &[1, 2, 4, 8], default: 2, help: "vec4s per invocation (strided by the workgroup size)" },
];

const SOFTMAX_WG_PARAMS: &[ParamSpec] =
    &[ParamSpec { name: "workgroup_size", values: &[32, 64, 128, 256], default: 128, help: "invocations per row (one workgroup per row)" }];

const SOFTMAX_SG_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "workgroup_size", values: &[32, 64, 128, 256], default: 64, help: "invocations per workgroup" },
    ParamSpec { name: "rows_per_wg", values: &[1, 2, 4, 8, 16], default: 4, help: "rows per workgroup, one subgroup each" },
];

const ELEM_CPU_PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "elems_per_task",
        values: &[2048, 8192, 32768, 131072],
        default: 8192,
        help: "elements per rayon task (a problem no larger runs on the calling thread)",
    },
    ISA,
];

pub(crate) const THREADS: ParamSpec = ParamSpec {
    name: "threads",
    values: &[0, 1, 2, 4, 8, 16],
    default: 0,
    help: "contiguous static ranges, one per thread: 0 all of rayon's threads, 1 single-threaded",
};

const STATIC_CPU_PARAMS: &[ParamSpec] = &[THREADS];

pub(crate) const ROWS_CPU_PARAMS: &[ParamSpec] = &[
    ParamSpec { name: "rows_per_task", values: &[1, 2, 4, 8, 16, 32], default: 4, help: "rows per rayon task (dynamic strategy)" },
    ParamSpec {
        name: "strategy",
        values: &[0, 1, 2],
        default: 0,
        help: "0 dynamic work stealing by rows_per_task, 1 one static row range per thread, 2 single-threaded",
    },
    ISA,
];

pub(crate) const SPLIT_CPU_PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "chunk",
        values: &[256, 512, 1024, 2048, 4096, 8192],
        default: 1024,
        help: "features per rayon task within one row (decode: one long row split over threads)",
    },
    ISA,
];

pub fn variants() -> Vec<KernelDef> {
    vec![
        // gated_act
        KernelDef {
            id: "gated_act_scalar",
            op: Op::GatedAct,
            summary: "one element per invocation, any n; activation specialised as a pipeline constant",
            dtypes: F32_ONLY,
            params: SCALAR_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &SCALAR,
                workgroup_size: wg_size,
                shared_memory: super::no_shared,
                needs_f16: packed_f16,
                needs_subgroups: false,
                check: check_scalar,
                prepare: prepare_gated_scalar,
            }),
        },
        KernelDef {
            id: "gated_act_vec4",
            op: Op::GatedAct,
            summary: "16-byte vec4 loads, vec_per_thread vec4s per invocation; n % 4 == 0",
            dtypes: F32_ONLY,
            params: VEC4_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &VEC4,
                workgroup_size: wg_size,
                shared_memory: super::no_shared,
                needs_f16: packed_f16,
                needs_subgroups: false,
                check: check_vec4,
                prepare: prepare_gated_vec4,
            }),
        },
        KernelDef {
            id: "gated_act_simd_cpu",
            op: Op::GatedAct,
            summary: "SIMD microkernel (AVX-512/AVX2/portable) with a polynomial exp and sigmoid; rayon over element chunks",
            dtypes: F32_ONLY,
            params: ELEM_CPU_PARAMS,
            imp: Impl::Cpu(CpuImpl { run: run_gated_simd, check: check_isa }),
        },
        KernelDef {
            id: "gated_act_static_cpu",
            op: Op::GatedAct,
            summary: "scalar libm exp per element (reference-accurate); one static contiguous range per thread",
            dtypes: F32_ONLY,
            params: STATIC_CPU_PARAMS,
            imp: Impl::Cpu(CpuImpl { run: run_gated_static, check: check_threads }),
        },
        // softmax
        KernelDef {
            id: "softmax_wg",
            op: Op::Softmax,
            summary: "three passes (max, sum of exp, write), one workgroup per row, workgroup-memory tree reductions",
            dtypes: F32_ONLY,
            params: SOFTMAX_WG_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &SOFTMAX_WG,
                workgroup_size: wg_size,
                shared_memory: shared_wg_f32,
                needs_f16: packed_f16,
                needs_subgroups: false,
                check: check_rows_grid,
                prepare: prepare_softmax_wg,
            }),
        },
        KernelDef {
            id: "softmax_online",
            op: Op::Softmax,
            summary: "online softmax: max and sum fused in one pass per invocation, (max, sum) pairs merged in workgroup memory",
            dtypes: F32_ONLY,
            params: SOFTMAX_WG_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &SOFTMAX_ONLINE,
                workgroup_size: wg_size,
                shared_memory: shared_wg_pairs,
                needs_f16: packed_f16,
                needs_subgroups: false,
                check: check_rows_grid,
                prepare: prepare_softmax_online,
            }),
        },
        KernelDef {
            id: "softmax_subgroup",
            op: Op::Softmax,
            summary: "online softmax, one subgroup per row (subgroupMax + subgroupAdd), several rows per workgroup, no barriers",
            dtypes: F32_ONLY,
            params: SOFTMAX_SG_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &SOFTMAX_SG,
                workgroup_size: wg_size,
                shared_memory: super::no_shared,
                needs_f16: packed_f16,
                needs_subgroups: true,
                check: check_softmax_sg,
                prepare: prepare_softmax_sg,
            }),
        },
        KernelDef {
            id: "softmax_rows_cpu",
            op: Op::Softmax,
            summary: "three-pass SIMD row microkernel (max, exp and sum, scale); rayon over rows (prefill)",
            dtypes: F32_ONLY,
            params: ROWS_CPU_PARAMS,
            imp: Impl::Cpu(CpuImpl { run: run_softmax_rows, check: check_isa }),
        },
        KernelDef {
            id: "softmax_split_cpu",
            op: Op::Softmax,
            summary: "online (max, sum) SIMD pass over feature chunks in parallel, merged, then a parallel write (decode: few long rows)",
            dtypes: F32_ONLY,
            params: SPLIT_CPU_PARAMS,
            imp: Impl::Cpu(CpuImpl { run: run_softmax_split, check: check_isa }),
        },
        // residual_add
        KernelDef {
            id: "residual_add_scalar",
            op: Op::ResidualAdd,
            summary: "one element per invocation, any n",
            dtypes: F32_ONLY,
            params: SCALAR_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &SCALAR,
                workgroup_size: wg_size,
                shared_memory: super::no_shared,
                needs_f16: packed_f16,
                needs_subgroups: false,
                check: check_scalar,
                prepare: prepare_add_scalar,
            }),
        },
        KernelDef {
            id: "residual_add_vec4",
            op: Op::ResidualAdd,
            summary: "16-byte vec4 loads, vec_per_thread vec4s per invocation; n % 4 == 0",
            dtypes: F32_ONLY,
            params: VEC4_PARAMS,
            imp: Impl::Wgsl(WgslImpl {
                shader: &VEC4,
                workgroup_size: wg_size,
                shared_memory: super::no_shared,
                needs_f16: packed_f16,
                needs_subgroups: false,
                check: check_vec4,
                prepare: prepare_add_vec4,
            }),
        },
        KernelDef {
            id: "residual_add_simd_cpu",
            op: Op::ResidualAdd,
            summary: "explicit SIMD add (AVX-512/AVX2/portable); rayon over element chunks",
            dtypes: F32_ONLY,
            params: ELEM_CPU_PARAMS,
            imp: Impl::Cpu(CpuImpl { run: run_add_simd, check: check_isa }),
        },
        KernelDef {
            id: "residual_add_static_cpu",
            op: Op::ResidualAdd,
            summary: "autovectorised add over one static contiguous range per thread (threads = 1: single-threaded)",
            dtypes: F32_ONLY,
            params: STATIC_CPU_PARAMS,
            imp: Impl::Cpu(CpuImpl { run: run_add_static, check: check_threads }),
        },
    ]
}

// ---------------------------------------------------------------------------------
// Lanes: one kernel body, three instruction sets
// ---------------------------------------------------------------------------------

/// The lane-width abstraction of this crate's elementwise, norm and RoPE
/// microkernels: a kernel is written once, generic over [`Lanes`], and
/// [`isa_dispatch!`] instantiates it inside a `#[target_feature]` function per
/// instruction set (AVX-512F: 16 lanes, AVX2+FMA+F16C: 8 lanes) or with the
/// portable 8-lane arrays the compiler vectorises for the baseline target (the
/// `isa = 1` scalar level, and every level on other architectures). The AVX paths
/// only differ from the portable one in these primitives, each one instruction.
pub mod lanes {
    use half::f16;

    /// Vector primitives of one instruction set. Methods are `#[inline(always)]` so a
    /// generic kernel collapses into the `#[target_feature]` function that calls it.
    pub trait Lanes: Copy {
        type V: Copy;
        /// Lanes per vector.
        const N: usize;
        fn splat(self, a: f32) -> Self::V;
        /// Loads `s[..N]` (panics when `s` is shorter).
        fn load(self, s: &[f32]) -> Self::V;
        /// Loads `s[..N]` halves widened to f32.
        fn load_f16(self, s: &[f16]) -> Self::V;
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
    mod x86 {
        use half::f16;
        use std::arch::x86_64::*;

        use super::Lanes;

        const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

        /// AVX2 + FMA + F16C, 8 lanes. Exists only where the CPU has them.
        #[derive(Clone, Copy, Debug)]
        pub struct Avx2(());

        impl Avx2 {
            /// # Safety
            /// The CPU must support AVX2, FMA and F16C.
            #[inline(always)]
            pub unsafe fn new_unchecked() -> Avx2 {
                Avx2(())
            }
        }

        // SAFETY (every `unsafe` block of this impl): an `Avx2` value exists only on a
        // CPU with AVX2+FMA+F16C (see `new_unchecked`), and loads/stores go through
        // slices checked to hold 8 elements.
        impl Lanes for Avx2 {
            type V = __m256;
            const N: usize = 8;
            #[inline(always)]
            fn splat(self, a: f32) -> __m256 {
                unsafe { _mm256_set1_ps(a) }
            }
            #[inline(always)]
            fn load(self, s: &[f32]) -> __m256 {
                let s = &s[..8];
                unsafe { _mm256_loadu_ps(s.as_ptr()) }
            }
            #[inline(always)]
            fn load_f16(self, s: &[f16]) -> __m256 {
                let s = &s[..8];
                unsafe { _mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr() as *const __m128i)) }
            }
            #[inline(always)]
            fn store(self, s: &mut [f32], v: __m256) {
                let s = &mut s[..8];
                unsafe { _mm256_storeu_ps(s.as_mut_ptr(), v) }
            }
            #[inline(always)]
            fn add(self, a: __m256, b: __m256) -> __m256 {
                unsafe { _mm256_add_ps(a, b) }
            }
            #[inline(always)]
            fn sub(self, a: __m256, b: __m256) -> __m256 {
                unsafe { _mm256_sub_ps(a, b) }
            }
            #[inline(always)]
            fn mul(self, a: __m256, b: __m256) -> __m256 {
                unsafe { _mm256_mul_ps(a, b) }
            }
            #[inline(always)]
            fn div(self, a: __m256, b: __m256) -> __m256 {
                unsafe { _mm256_div_ps(a, b) }
            }
            #[inline(always)]
            fn max(self, a: __m256, b: __m256) -> __m256 {
                unsafe { _mm256_max_ps(a, b) }
            }
            #[inline(always)]
            fn min(self, a: __m256, b: __m256) -> __m256 {
                unsafe { _mm256_min_ps(a, b) }
            }
            #[inline(always)]
            fn fma(self, a: __m256, b: __m256, c: __m256) -> __m256 {
                unsafe { _mm256_fmadd_ps(a, b, c) }
            }
            #[inline(always)]
            fn round(self, a: __m256) -> __m256 {
                unsafe { _mm256_round_ps::<NEAREST>(a) }
            }
            #[inline(always)]
            fn pow2i(self, n: __m256) -> __m256 {
                unsafe { _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)))) }
            }
            #[inline(always)]
            fn hsum(self, a: __m256) -> f32 {
                unsafe {
                    let s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
                    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
                }
            }
            #[inline(always)]
            fn hmax(self, a: __m256) -> f32 {
                unsafe {
                    let s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
                    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
                    _mm_cvtss_f32(_mm_max_ss(s, _mm_shuffle_ps::<1>(s, s)))
                }
            }
            #[inline(always)]
            fn swap_pairs(self, a: __m256) -> __m256 {
                unsafe { _mm256_permute_ps::<0xB1>(a) }
            }
        }

        /// AVX-512F, 16 lanes. Exists only where the CPU has it.
        #[derive(Clone, Copy, Debug)]
        pub struct Avx512(());

        impl Avx512 {
            /// # Safety
            /// The CPU must support AVX-512F.
            #[inline(always)]
            pub unsafe fn new_unchecked() -> Avx512 {
                Avx512(())
            }
        }

        // SAFETY (every `unsafe` block of this impl): an `Avx512` value exists only on
        // a CPU with AVX-512F (see `new_unchecked`), and loads/stores go through
        // slices checked to hold 16 elements.
        impl Lanes for Avx512 {
            type V = __m512;
            const N: usize = 16;
            #[inline(always)]
            fn splat(self, a: f32) -> __m512 {
                unsafe { _mm512_set1_ps(a) }
            }
            #[inline(always)]
            fn load(self, s: &[f32]) -> __m512 {
                let s = &s[..16];
                unsafe { _mm512_loadu_ps(s.as_ptr()) }
            }
            #[inline(always)]
            fn load_f16(self, s: &[f16]) -> __m512 {
                let s = &s[..16];
                unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(s.as_ptr() as *const __m256i)) }
            }
            #[inline(always)]
            fn store(self, s: &mut [f32], v: __m512) {
                let s = &mut s[..16];
                unsafe { _mm512_storeu_ps(s.as_mut_ptr(), v) }
            }
            #[inline(always)]
            fn add(self, a: __m512, b: __m512) -> __m512 {
                unsafe { _mm512_add_ps(a, b) }
            }
            #[inline(always)]
            fn sub(self, a: __m512, b: __m512) -> __m512 {
                unsafe { _mm512_sub_ps(a, b) }
            }
            #[inline(always)]
            fn mul(self, a: __m512, b: __m512) -> __m512 {
                unsafe { _mm512_mul_ps(a, b) }
            }
            #[inline(always)]
            fn div(self, a: __m512, b: __m512) -> __m512 {
                unsafe { _mm512_div_ps(a, b) }
            }
            #[inline(always)]
            fn max(self, a: __m512, b: __m512) -> __m512 {
                unsafe { _mm512_max_ps(a, b) }
            }
            #[inline(always)]
            fn min(self, a: __m512, b: __m512) -> __m512 {
                unsafe { _mm512_min_ps(a, b) }
            }
            #[inline(always)]
            fn fma(self, a: __m512, b: __m512, c: __m512) -> __m512 {
                unsafe { _mm512_fmadd_ps(a, b, c) }
            }
            #[inline(always)]
            fn round(self, a: __m512) -> __m512 {
                unsafe { _mm512_roundscale_ps::<NEAREST>(a) }
            }
            #[inline(always)]
            fn pow2i(self, n: __m512) -> __m512 {
                unsafe { _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)))) }
            }
            #[inline(always)]
            fn hsum(self, a: __m512) -> f32 {
                unsafe { _mm512_reduce_add_ps(a) }
            }
            #[inline(always)]
            fn hmax(self, a: __m512) -> f32 {
                unsafe { _mm512_reduce_max_ps(a) }
            }
            #[inline(always)]
            fn swap_pairs(self, a: __m512) -> __m512 {
                unsafe { _mm512_permute_ps::<0xB1>(a) }
            }
        }
    }

    /// Runs `$body` with `$l` bound to the [`Lanes`] of `$isa`, inside a function
    /// compiled for that instruction set (`#[target_feature]`), so the generic
    /// kernels it calls are inlined and vectorised for it. The arguments are passed
    /// explicitly (`name: type = value`): the body cannot capture.
    macro_rules! isa_dispatch {
        ($isa:expr, |$l:ident| ($($arg:ident : $ty:ty = $val:expr),* $(,)?) -> $ret:ty $body:block) => {{
            match $isa {
                #[cfg(target_arch = "x86_64")]
                $crate::kernels::simd::Isa::Avx512 => {
                    #[target_feature(enable = "avx512f")]
                    fn run($($arg: $ty),*) -> $ret {
                        // SAFETY: this function is compiled for and only called with AVX-512F.
                        let $l = unsafe { $crate::kernels::elementwise::lanes::Avx512::new_unchecked() };
                        $body
                    }
                    // SAFETY: `Isa::best`/`from_param` yield Avx512 only where the CPU reports avx512f.
                    unsafe { run($($val),*) }
                }
                #[cfg(target_arch = "x86_64")]
                $crate::kernels::simd::Isa::Simd256 => {
                    #[target_feature(enable = "avx2,fma,f16c")]
                    fn run($($arg: $ty),*) -> $ret {
                        // SAFETY: this function is compiled for and only called with AVX2+FMA+F16C.
                        let $l = unsafe { $crate::kernels::elementwise::lanes::Avx2::new_unchecked() };
                        $body
                    }
                    // SAFETY: `Isa::best`/`from_param` yield Simd256 on x86 only where the CPU
                    // reports avx2, fma and f16c.
                    unsafe { run($($val),*) }
                }
                _ => {
                    fn run($($arg: $ty),*) -> $ret {
                        let $l = $crate::kernels::elementwise::lanes::Portable;
                        $body
                    }
                    run($($val),*)
                }
            }
        }};
    }
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
}

// ---------------------------------------------------------------------------------
// Orchestration shared by the row-wise CPU kernels of this crate
// ---------------------------------------------------------------------------------

/// Splits `y` (`rows` rows of `dim`) into row ranges by the `rows_per_task` /
/// `strategy` parameters and runs `f(first_row, rows_chunk)` on each: dynamic work
/// stealing, one static range per thread, or all rows on the calling thread.
pub(crate) fn par_rows(y: &mut [f32], dim: usize, params: &Params, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    let rows = y.len().checked_div(dim).unwrap_or(0);
    if rows == 0 {
        return;
    }
    let y = &mut y[..rows * dim];
    let grain = match p(params, "strategy") {
        2 => {
            f(0, y);
            return;
        }
        1 => rows.div_ceil(rayon::current_num_threads()).max(1),
        _ => (p(params, "rows_per_task") as usize).max(1),
    };
    y.par_chunks_mut(grain * dim).enumerate().for_each(|(i, chunk)| f(i * grain, chunk));
}

/// Splits a flat `y` into chunks of `grain` elements run in parallel (`f(first, chunk)`);
/// a problem no larger than one chunk runs on the calling thread.
pub(crate) fn par_elems(y: &mut [f32], grain: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    let grain = grain.max(1);
    if y.len() <= grain {
        f(0, y);
        return;
    }
    y.par_chunks_mut(grain).enumerate().for_each(|(i, chunk)| f(i * grain, chunk));
}

/// Splits a flat `y` into `threads` contiguous ranges (0: rayon's pool size).
pub(crate) fn static_ranges(y: &mut [f32], threads: u32, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    let t = if threads == 0 { rayon::current_num_threads() } else { threads as usize }.max(1);
    if t == 1 || y.len() < 2 {
        f(0, y);
        return;
    }
    let grain = y.len().div_ceil(t).max(1);
    y.par_chunks_mut(grain).enumerate().for_each(|(i, chunk)| f(i * grain, chunk));
}

pub(crate) fn check_isa(_: &CpuCaps, _: &Problem, _: DType, params: &Params) -> Result<(), String> {
    Isa::param_available(p(params, "isa"))
}

pub(crate) fn check_threads(caps: &CpuCaps, _: &Problem, _: DType, params: &Params) -> Result<(), String> {
    let t = p(params, "threads") as usize;
    if t > caps.threads.max(1) {
        return Err(format!("threads = {t} exceeds the {} threads this process may use", caps.threads));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// CPU microkernels
// ---------------------------------------------------------------------------------

const GELU_K: f32 = 1.595_769; // 2 * sqrt(2 / pi)

/// The sigmoid argument of the activation: `act(g) = g * sigmoid(k(g))`
/// (gelu_tanh: `0.5 (1 + tanh(z)) = sigmoid(2z)`).
#[inline(always)]
fn act_arg<L: Lanes>(l: L, act: Activation, g: L::V) -> L::V {
    match act {
        Activation::Silu => g,
        Activation::GeluTanh => {
            let g2 = l.mul(g, g);
            l.mul(l.mul(g, l.splat(GELU_K)), l.fma(g2, l.splat(0.044715), l.splat(1.0)))
        }
    }
}

/// The activation in scalar f32 with libm's exp.
#[inline]
pub(crate) fn act_scalar(act: Activation, g: f32) -> f32 {
    let k = match act {
        Activation::Silu => g,
        Activation::GeluTanh => GELU_K * g * (1.0 + 0.044715 * g * g),
    };
    g / (1.0 + (-k).exp())
}

/// `y = act(gate) * up` over equal-length slices.
#[inline(always)]
fn gated_k<L: Lanes>(l: L, act: Activation, gate: &[f32], up: &[f32], y: &mut [f32]) {
    let n = y.len();
    let (gate, up) = (&gate[..n], &up[..n]);
    let mut ys = y.chunks_exact_mut(L::N);
    for ((yc, gc), uc) in (&mut ys).zip(gate.chunks_exact(L::N)).zip(up.chunks_exact(L::N)) {
        let g = l.load(gc);
        let e = lanes::exp(l, l.sub(l.splat(0.0), act_arg(l, act, g)));
        l.store(yc, l.div(l.mul(g, l.load(uc)), l.add(l.splat(1.0), e)));
    }
    let t = n - n % L::N;
    for (i, o) in ys.into_remainder().iter_mut().enumerate() {
        *o = act_scalar(act, gate[t + i]) * up[t + i];
    }
}

/// `y = a + b` over equal-length slices.
#[inline(always)]
fn add_k<L: Lanes>(l: L, a: &[f32], b: &[f32], y: &mut [f32]) {
    let n = y.len();
    let (a, b) = (&a[..n], &b[..n]);
    let mut ys = y.chunks_exact_mut(L::N);
    for ((yc, ac), bc) in (&mut ys).zip(a.chunks_exact(L::N)).zip(b.chunks_exact(L::N)) {
        l.store(yc, l.add(l.load(ac), l.load(bc)));
    }
    let t = n - n % L::N;
    for (i, o) in ys.into_remainder().iter_mut().enumerate() {
        *o = a[t + i] + b[t + i];
    }
}

/// Row maximum.
#[inline(always)]
fn max_k<L: Lanes>(l: L, x: &[f32]) -> f32 {
    let mut m = l.splat(f32::MIN);
    let mut xs = x.chunks_exact(L::N);
    for c in &mut xs {
        m = l.max(m, l.load(c));
    }
    xs.remainder().iter().fold(l.hmax(m), |a, &v| if v > a { v } else { a })
}

/// `y = exp(x - m)`; returns the sum of `y`.
#[inline(always)]
fn exp_sum_k<L: Lanes>(l: L, x: &[f32], m: f32, y: &mut [f32]) -> f32 {
    let n = y.len();
    let x = &x[..n];
    let mv = l.splat(m);
    let mut acc = l.splat(0.0);
    let mut ys = y.chunks_exact_mut(L::N);
    for (yc, xc) in (&mut ys).zip(x.chunks_exact(L::N)) {
        let e = lanes::exp(l, l.sub(l.load(xc), mv));
        acc = l.add(acc, e);
        l.store(yc, e);
    }
    let mut s = l.hsum(acc);
    let t = n - n % L::N;
    for (i, o) in ys.into_remainder().iter_mut().enumerate() {
        *o = (x[t + i] - m).exp();
        s += *o;
    }
    s
}

/// `y *= s`.
#[inline(always)]
fn scale_k<L: Lanes>(l: L, y: &mut [f32], s: f32) {
    let sv = l.splat(s);
    let mut ys = y.chunks_exact_mut(L::N);
    for yc in &mut ys {
        let v = l.mul(l.load(yc), sv);
        l.store(yc, v);
    }
    for o in ys.into_remainder() {
        *o *= s;
    }
}

/// `y = exp(x - m) * s`.
#[inline(always)]
fn exp_scale_k<L: Lanes>(l: L, x: &[f32], m: f32, s: f32, y: &mut [f32]) {
    let n = y.len();
    let x = &x[..n];
    let (mv, sv) = (l.splat(m), l.splat(s));
    let mut ys = y.chunks_exact_mut(L::N);
    for (yc, xc) in (&mut ys).zip(x.chunks_exact(L::N)) {
        l.store(yc, l.mul(lanes::exp(l, l.sub(l.load(xc), mv)), sv));
    }
    let t = n - n % L::N;
    for (i, o) in ys.into_remainder().iter_mut().enumerate() {
        *o = (x[t + i] - m).exp() * s;
    }
}

/// Online softmax statistics of a slice: `(max, sum of exp(x - max))`, each lane
/// running its own recurrence, merged at the end. `(f32::MIN, 0)` when empty.
#[inline(always)]
fn online_k<L: Lanes>(l: L, x: &[f32]) -> (f32, f32) {
    let mut m = l.splat(f32::MIN);
    let mut s = l.splat(0.0);
    let mut xs = x.chunks_exact(L::N);
    for c in &mut xs {
        let v = l.load(c);
        let mn = l.max(m, v);
        s = l.fma(s, lanes::exp(l, l.sub(m, mn)), lanes::exp(l, l.sub(v, mn)));
        m = mn;
    }
    let (mut mb, mut sb) = ([0f32; 16], [0f32; 16]);
    l.store(&mut mb[..L::N], m);
    l.store(&mut sb[..L::N], s);
    let mut acc = (f32::MIN, 0.0);
    for i in 0..L::N {
        acc = merge_stats(acc, (mb[i], sb[i]));
    }
    for &v in xs.remainder() {
        acc = merge_stats(acc, (v, 1.0));
    }
    acc
}

/// Merges two online softmax partials.
#[inline]
pub(crate) fn merge_stats(a: (f32, f32), b: (f32, f32)) -> (f32, f32) {
    let m = a.0.max(b.0);
    let s = a.1 * (a.0 - m).exp() + b.1 * (b.0 - m).exp();
    (m, s)
}

// ---------------------------------------------------------------------------------
// CPU kernels
// ---------------------------------------------------------------------------------

fn gated_simd(isa: Isa, act: Activation, gate: &[f32], up: &[f32], y: &mut [f32]) {
    isa_dispatch!(isa, |l| (act: Activation = act, gate: &[f32] = gate, up: &[f32] = up, y: &mut [f32] = y) -> () {
        gated_k(l, act, gate, up, y)
    })
}

fn run_gated_simd(prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::GatedAct { rows, dim, act } = *prob else { return Ok(()) };
    let isa = Isa::from_param(p(params, "isa"));
    let (gate, up) = (a.ins[0].f32(), a.ins[1].f32());
    par_elems(&mut a.outs[0][..rows * dim], p(params, "elems_per_task") as usize, |first, y| {
        gated_simd(isa, act, &gate[first..], &up[first..], y)
    });
    Ok(())
}

fn run_gated_static(prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::GatedAct { rows, dim, act } = *prob else { return Ok(()) };
    let (gate, up) = (a.ins[0].f32(), a.ins[1].f32());
    static_ranges(&mut a.outs[0][..rows * dim], p(params, "threads"), |first, y| {
        for (i, o) in y.iter_mut().enumerate() {
            *o = act_scalar(act, gate[first + i]) * up[first + i];
        }
    });
    Ok(())
}

fn add_simd(isa: Isa, a: &[f32], b: &[f32], y: &mut [f32]) {
    isa_dispatch!(isa, |l| (a: &[f32] = a, b: &[f32] = b, y: &mut [f32] = y) -> () { add_k(l, a, b, y) })
}

fn run_add_simd(prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::ResidualAdd { n } = *prob else { return Ok(()) };
    let isa = Isa::from_param(p(params, "isa"));
    let (x, r) = (a.ins[0].f32(), a.ins[1].f32());
    par_elems(&mut a.outs[0][..n], p(params, "elems_per_task") as usize, |first, y| add_simd(isa, &x[first..], &r[first..], y));
    Ok(())
}

fn run_add_static(prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::ResidualAdd { n } = *prob else { return Ok(()) };
    let (x, r) = (a.ins[0].f32(), a.ins[1].f32());
    static_ranges(&mut a.outs[0][..n], p(params, "threads"), |first, y| {
        let len = y.len();
        for ((o, u), v) in y.iter_mut().zip(&x[first..first + len]).zip(&r[first..first + len]) {
            *o = u + v;
        }
    });
    Ok(())
}

/// Softmax of one row, three SIMD passes: max, exp and sum (stored in `y`), scale.
pub(crate) fn softmax_row(isa: Isa, x: &[f32], y: &mut [f32]) {
    isa_dispatch!(isa, |l| (x: &[f32] = x, y: &mut [f32] = y) -> () {
        let m = max_k(l, x);
        let s = exp_sum_k(l, x, m, y);
        scale_k(l, y, 1.0 / s);
    })
}

fn online_stats(isa: Isa, x: &[f32]) -> (f32, f32) {
    isa_dispatch!(isa, |l| (x: &[f32] = x) -> (f32, f32) { online_k(l, x) })
}

fn exp_scale(isa: Isa, x: &[f32], m: f32, s: f32, y: &mut [f32]) {
    isa_dispatch!(isa, |l| (x: &[f32] = x, m: f32 = m, s: f32 = s, y: &mut [f32] = y) -> () { exp_scale_k(l, x, m, s, y) })
}

fn run_softmax_rows(prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::Softmax { rows, dim } = *prob else { return Ok(()) };
    let isa = Isa::from_param(p(params, "isa"));
    let x = a.ins[0].f32();
    par_rows(&mut a.outs[0][..rows * dim], dim, params, |first, ys| {
        for (r, y) in ys.chunks_mut(dim).enumerate() {
            softmax_row(isa, &x[(first + r) * dim..][..dim], y);
        }
    });
    Ok(())
}

fn run_softmax_split(prob: &Problem, params: &Params, mut a: CpuArgs<'_>) -> Result<(), KernelError> {
    let Problem::Softmax { rows, dim } = *prob else { return Ok(()) };
    let isa = Isa::from_param(p(params, "isa"));
    let chunk = (p(params, "chunk") as usize).max(1);
    let x = a.ins[0].f32();
    for (r, y) in a.outs[0][..rows * dim].chunks_mut(dim.max(1)).enumerate() {
        let xr = &x[r * dim..][..dim];
        let (m, s) = xr.par_chunks(chunk).map(|c| online_stats(isa, c)).reduce(|| (f32::MIN, 0.0), merge_stats);
        let inv = 1.0 / s;
        y.par_chunks_mut(chunk).enumerate().for_each(|(i, yc)| exp_scale(isa, &xr[i * chunk..], m, inv, yc));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// WGSL
// ---------------------------------------------------------------------------------

fn wg_size(params: &Params) -> [u32; 3] {
    [p(params, "workgroup_size"), 1, 1]
}

fn shared_wg_f32(_: &Problem, _: DType, params: &Params) -> u64 {
    4 * p(params, "workgroup_size") as u64
}

fn shared_wg_pairs(_: &Problem, _: DType, params: &Params) -> u64 {
    8 * p(params, "workgroup_size") as u64
}

/// Elements of an elementwise problem.
fn elems(prob: &Problem) -> usize {
    match *prob {
        Problem::GatedAct { rows, dim, .. } => rows * dim,
        Problem::ResidualAdd { n } => n,
        Problem::Softmax { rows, dim } => rows * dim,
        _ => 0,
    }
}

/// A launch of `count` workgroups must fit the 2D grid the kernels decode.
pub(crate) fn grid_fits(caps: &GpuCaps, count: usize, what: &str) -> Result<(), String> {
    let lim = caps.max_workgroups_per_dimension.max(1) as usize;
    if count > lim * lim {
        return Err(format!("{count} workgroups ({what}) exceed the adapter's {lim}x{lim} grid"));
    }
    Ok(())
}

fn check_scalar(caps: &GpuCaps, prob: &Problem, _: DType, params: &Params) -> Result<(), String> {
    grid_fits(caps, groups(elems(prob), p(params, "workgroup_size")) as usize, "one per workgroup_size elements")
}

fn check_vec4(caps: &GpuCaps, prob: &Problem, _: DType, params: &Params) -> Result<(), String> {
    let n = elems(prob);
    if !n.is_multiple_of(4) {
        return Err(format!("n = {n} elements is not a multiple of 4 (the buffers are read as vec4<f32>)"));
    }
    let per = p(params, "workgroup_size") * p(params, "vec_per_thread");
    grid_fits(caps, groups(n / 4, per) as usize, "one per workgroup_size * vec_per_thread vec4s")
}

fn check_rows_grid(caps: &GpuCaps, prob: &Problem, _: DType, _: &Params) -> Result<(), String> {
    match *prob {
        Problem::Softmax { rows, .. } => grid_fits(caps, rows, "one per row"),
        _ => Ok(()),
    }
}

fn check_softmax_sg(caps: &GpuCaps, prob: &Problem, _: DType, params: &Params) -> Result<(), String> {
    let wg = p(params, "workgroup_size");
    if caps.subgroup_max_size > wg {
        return Err(format!("workgroup of {wg} is smaller than the adapter's subgroup size {}", caps.subgroup_max_size));
    }
    match *prob {
        Problem::Softmax { rows, .. } => grid_fits(caps, groups(rows, p(params, "rows_per_wg")) as usize, "one per rows_per_wg rows"),
        _ => Ok(()),
    }
}

fn gated_dims(s: &WgslSetup<'_>) -> Result<(usize, Activation), KernelError> {
    match *s.problem {
        Problem::GatedAct { rows, dim, act } => Ok((rows * dim, act)),
        _ => Err(wrong_op(s.kernel, s.problem)),
    }
}

fn add_len(s: &WgslSetup<'_>) -> Result<usize, KernelError> {
    match *s.problem {
        Problem::ResidualAdd { n } => Ok(n),
        _ => Err(wrong_op(s.kernel, s.problem)),
    }
}

fn softmax_dims(s: &WgslSetup<'_>) -> Result<(usize, usize), KernelError> {
    match *s.problem {
        Problem::Softmax { rows, dim } => Ok((rows, dim)),
        _ => Err(wrong_op(s.kernel, s.problem)),
    }
}

fn prepare_scalar(s: &WgslSetup<'_>, entry: &str, n: usize, act: u32) -> Result<GpuProgram, KernelError> {
    let wg = p(s.params, "workgroup_size");
    let consts = [("WG", wg as f64), ("ACT", act as f64)];
    s.one_step(&SCALAR, entry, &consts, &[n as u32], grid_2d(groups(n, wg)))
}

fn prepare_vec4(s: &WgslSetup<'_>, entry: &str, n: usize, act: u32) -> Result<GpuProgram, KernelError> {
    let (wg, vpt) = (p(s.params, "workgroup_size"), p(s.params, "vec_per_thread"));
    let consts = [("WG", wg as f64), ("VPT", vpt as f64), ("ACT", act as f64)];
    s.one_step(&VEC4, entry, &consts, &[(n / 4) as u32], grid_2d(groups(n / 4, wg * vpt)))
}

fn prepare_gated_scalar(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (n, act) = gated_dims(s)?;
    prepare_scalar(s, "gated_act", n, act.code())
}

fn prepare_gated_vec4(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (n, act) = gated_dims(s)?;
    prepare_vec4(s, "gated_act", n, act.code())
}

fn prepare_add_scalar(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let n = add_len(s)?;
    prepare_scalar(s, "residual_add", n, 0)
}

fn prepare_add_vec4(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let n = add_len(s)?;
    prepare_vec4(s, "residual_add", n, 0)
}

fn prepare_softmax_wg(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (rows, dim) = softmax_dims(s)?;
    let consts = [("WG", p(s.params, "workgroup_size") as f64)];
    s.one_step(&SOFTMAX_WG, "main", &consts, &[rows as u32, dim as u32], grid_2d(rows as u32))
}

fn prepare_softmax_online(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (rows, dim) = softmax_dims(s)?;
    let consts = [("WG", p(s.params, "workgroup_size") as f64)];
    s.one_step(&SOFTMAX_ONLINE, "main", &consts, &[rows as u32, dim as u32], grid_2d(rows as u32))
}

fn prepare_softmax_sg(s: &WgslSetup<'_>) -> Result<GpuProgram, KernelError> {
    let (rows, dim) = softmax_dims(s)?;
    let (wg, per) = (p(s.params, "workgroup_size"), p(s.params, "rows_per_wg"));
    let consts = [("WG", wg as f64), ("ROWS", per as f64)];
    s.one_step(&SOFTMAX_SG, "main", &consts, &[rows as u32, dim as u32], grid_2d(groups(rows, per)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn isas() -> Vec<Isa> {
        vec![Isa::Scalar, Isa::from_param(2), Isa::best()]
    }

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n).map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 250.0 - 4.0).collect()
    }

    #[test]
    fn vector_exp_matches_libm_on_every_isa() {
        let x: Vec<f32> = (0..4000).map(|i| -90.0 + i as f32 * 0.0445).collect();
        for isa in isas() {
            let mut y = vec![0f32; x.len()];
            // exp_scale with m = 0, s = 1 is exp itself (tail included)
            exp_scale(isa, &x, 0.0, 1.0, &mut y);
            for (v, e) in x.iter().zip(&y) {
                let want = (*v as f64).exp();
                if *v > -87.0 {
                    assert!(((*e as f64) - want).abs() <= 5e-7 * want, "{isa:?} exp({v}) = {e}, want {want}");
                } else {
                    assert!(*e < 1e-37, "{isa:?} exp({v}) = {e}");
                }
            }
        }
    }

    #[test]
    fn gated_and_softmax_microkernels_agree_across_isas() {
        for n in [0, 1, 7, 8, 15, 16, 17, 33, 100, 1027] {
            let (g, u) = (data(n, 1), data(n, 7));
            for act in [Activation::Silu, Activation::GeluTanh] {
                let want: Vec<f64> = g.iter().zip(&u).map(|(g, u)| act.apply_f64(*g as f64) * *u as f64).collect();
                for isa in isas() {
                    let mut y = vec![0f32; n];
                    gated_simd(isa, act, &g, &u, &mut y);
                    for i in 0..n {
                        assert!((y[i] as f64 - want[i]).abs() < 1e-5, "{isa:?} {act:?} n={n} i={i}");
                    }
                }
            }
            if n == 0 {
                continue;
            }
            let m = g.iter().cloned().fold(f64::MIN, |a, b| a.max(b as f64));
            let z: f64 = g.iter().map(|v| (*v as f64 - m).exp()).sum();
            for isa in isas() {
                let mut y = vec![0f32; n];
                softmax_row(isa, &g, &mut y);
                let (om, os) = online_stats(isa, &g);
                assert!((om as f64 - m).abs() < 1e-6 && (os as f64 - z).abs() < 1e-5 * z, "{isa:?} online n={n}");
                for i in 0..n {
                    assert!((y[i] as f64 - (g[i] as f64 - m).exp() / z).abs() < 1e-6, "{isa:?} softmax n={n}");
                }
            }
        }
    }
}
