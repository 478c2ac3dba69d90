//! The kernel set: the registry of every CPU and WGSL kernel, and the op families
//! that define them. The registry sits on top: it gathers every family, and no
//! family imports it; what every family builds on (the kernel definition,
//! parameters, CPU buffers, errors, validity helpers) is the [`contract`] below
//! them all, re-exported here for the crate's users.
//!
//! A kernel is one implementation of one [`Op`] for one backend with tunable
//! parameters; a *variant* is a kernel with its parameters fixed ([`Params`]).
//! Adding a variant touches its shader, its family module and its test only:
//! the registry gathers `variants()` from every family module.
//!
//! Families, one directory per op family holding all its variants (float and block
//! formats, WGSL and CPU, fused forms beside the op they produce): [`matvec`]
//! (GEMV, RMSNorm-prologue GEMV, and the decode projections gate_up and qkv_proj),
//! [`matmul`] (GEMM), [`attention`], [`norm`] (RMSNorm, LayerNorm, residual +
//! RMSNorm), [`rope`] (RoPE, per-head norm + RoPE), [`act`] (gated activation,
//! residual add, softmax), [`moe`] (mixture-of-experts router and expert
//! projections); outside the registry, [`sample`] (the token sampler,
//! CPU and WGSL). Shared layers: [`cpu`] (the one SIMD and orchestration
//! layer of every CPU kernel) and [`wgsl`] (the rules and bindings WGSL kernels share).

pub mod act;
pub mod attention;
pub mod contract;
pub mod convert;
pub mod cpu;
pub mod matmul;
pub mod matvec;
pub mod memory;
pub mod moe;
pub mod norm;
pub mod preferred;
pub mod problem;
pub mod quant;
pub mod reference;
pub mod rope;
pub mod sample;
pub mod verify;
pub mod vision;
pub mod wgsl;

use std::sync::OnceLock;

pub use contract::{
    CpuArgs, CpuCheckFn, CpuImpl, CpuIn, CpuIns, CpuOuts, CpuRunFn, Impl, KernelDef, KernelError, ParamSpec, Params, PassPosition,
    WgslCheckFn, WgslImpl, WgslPrepareFn, WgslSetup, cpu_any, native_f16, no_shared, outs, packed_f16, param, pass_position, variant_label,
    wgsl_any, wrong_op,
};
pub use problem::{Activation, BufSpec, NormResidual, Op, Problem, Role, RopeLayout, attention_keys};
pub use quant::{DType, QStack, RowFormats};

pub use crate::device::{Backend, Caps};
use crate::gpu::Shader;
use crate::hash::Hasher;

/// Every kernel of the set, in a stable order (op, then id).
pub fn registry() -> &'static [KernelDef] {
    static REG: OnceLock<Vec<KernelDef>> = OnceLock::new();
    REG.get_or_init(|| {
        let families = [
            matvec::variants(),
            matvec::quant::variants(),
            matvec::qdp4a::variants(),
            matvec::norm_gemv::variants(),
            matvec::gate_up::variants(),
            matvec::qkv::variants(),
            matmul::variants(),
            matmul::quant::variants(),
            attention::variants(),
            norm::variants(),
            norm::residual::variants(),
            rope::variants(),
            rope::qk_norm::variants(),
            rope::qkv_cache::variants(),
            act::variants(),
            moe::variants(),
            vision::variants(),
        ];
        let mut all: Vec<KernelDef> = families.into_iter().flatten().collect();
        all.sort_by(|a, b| (a.op, a.id).cmp(&(b.op, b.id)));
        all
    })
}

/// Looks a kernel up by id; the error lists the known ids.
pub fn find(id: &str) -> Result<&'static KernelDef, KernelError> {
    registry()
        .iter()
        .find(|k| k.id == id)
        .ok_or_else(|| KernelError::Unknown { id: id.to_string(), known: registry().iter().map(|k| k.id).collect::<Vec<_>>().join(", ") })
}

/// Kernels of one op.
pub fn for_op(op: Op) -> impl Iterator<Item = &'static KernelDef> {
    registry().iter().filter(move |k| k.op == op)
}

/// Every WGSL shader the set uses, once each (its heads, its file and its includes),
/// and the sampler's.
pub fn shaders() -> Vec<&'static Shader> {
    let mut out: Vec<&'static Shader> = Vec::new();
    for k in registry() {
        if let Impl::Wgsl(w) = &k.imp {
            // The row-position forms of RoPE's kernels (a batch of sequences,
            // `PassPosition::Rows`).
            let rows = matches!(k.op, Op::Rope | Op::QkNormRope).then(|| w.shader.rows_form()).flatten();
            for sh in std::iter::once(w.shader).chain(w.alt_shaders.iter().copied()).chain(rows) {
                // One file can serve several shaders that prepend or append different files.
                if !out.iter().any(|s| s.key() == sh.key()) {
                    out.push(sh);
                }
            }
        }
    }
    out.push(&sample::gpu::SHADER);
    out.sort_by_key(|s| s.key());
    out
}

/// sha256 over the shader sources and the registry (ids, ops, dtypes, parameter
/// spaces): changes whenever a kernel or its space changes. Profiles record it.
pub fn kernel_set_hash() -> String {
    let mut h = Hasher::new();
    for s in shaders() {
        h.part(s.label()).part(s.source);
    }
    for k in registry() {
        h.update(format!("{}|{}|{:?}|{:?}|", k.id, k.op, k.dtypes, k.backend()));
        for p in k.params {
            h.update(format!("{}={:?}/{};", p.name, p.values, p.default));
        }
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use strum::IntoEnumIterator;

    use super::*;

    #[test]
    fn op_and_dtype_names_are_the_profile_strings() {
        let ops: Vec<&str> = Op::iter().map(Op::name).collect();
        assert_eq!(
            ops,
            [
                "gemm",
                "gemv",
                "attention_prefill",
                "attention_decode",
                "attention_paged",
                "rms_norm",
                "layer_norm",
                "rope",
                "gated_act",
                "softmax",
                "residual_add",
                "qk_norm_rope",
                "gate_up",
                "residual_rms_norm",
                "qkv_proj",
                "norm_gemv",
                "patch_embed",
                "linear",
                "attention_full",
                "avg_pool",
                "residual_layer_norm",
                "qkv_rope_cache",
                "moe_route",
                "moe_gate_up",
                "moe_down",
            ]
        );
        assert_eq!(Op::ALL.to_vec(), Op::iter().collect::<Vec<_>>());
        for op in Op::ALL {
            assert_eq!(op.name().parse::<Op>().unwrap(), op);
            assert_eq!(op.to_string(), op.name());
            assert_eq!(serde_json::to_value(op).unwrap(), op.name());
        }
        let dtypes: Vec<&str> = DType::iter().map(DType::name).collect();
        assert_eq!(
            dtypes,
            ["f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs"]
        );
        assert_eq!(DType::ALL.to_vec(), DType::iter().collect::<Vec<_>>());
        let quant: Vec<DType> = quant::QFormat::ALL.into_iter().map(DType::from).collect();
        assert_eq!(DType::QUANT.to_vec(), quant);
        for d in DType::ALL {
            assert_eq!(d.name().to_uppercase().parse::<DType>().unwrap(), d);
            assert_eq!(d.to_string(), d.name());
            assert_eq!(serde_json::to_value(d).unwrap(), d.name());
        }
        assert_eq!(
            "bf16".parse::<DType>().unwrap_err(),
            "unknown dtype `bf16` (allowed: f32, f16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs)"
        );
    }

    #[test]
    fn a_typo_in_a_parameter_name_is_an_error_not_zero() {
        let k = find("gemv_wg").unwrap();
        let params = k.default_params();
        assert_eq!(param(&params, "rows_per_wg").unwrap(), 2);
        let err = param(&params, "rows_per_wgg").unwrap_err();
        assert!(matches!(err, KernelError::Param { ref name, .. } if name == "rows_per_wgg"), "{err}");
        assert!(err.to_string().contains("rows_per_wg, workgroup_size"), "{err}");
        // A kernel reading a parameter its variant lacks fails its validity check.
        let Impl::Wgsl(w) = &k.imp else { panic!("gemv_wg is a WGSL kernel") };
        let mut missing = params.clone();
        missing.remove("workgroup_size");
        assert!((w.workgroup_size)(&missing).is_err());
    }

    /// Every CPU kernel handed a problem of another op reports `WrongOp`, as the WGSL
    /// side does, whether called through the registry or directly.
    #[test]
    fn cpu_kernels_given_another_ops_problem_error() {
        let other = |op: Op| if op == Op::Gemv { Problem::ResidualAdd { n: 4 } } else { Problem::Gemv { n: 4, k: 32 } };
        for k in registry() {
            let Impl::Cpu(c) = &k.imp else { continue };
            let prob = other(k.op);
            let params = k.default_params();
            let direct = (c.run)(k, &prob, &params, CpuArgs { ins: Default::default(), outs: Default::default() });
            assert!(matches!(direct, Err(KernelError::WrongOp { .. })), "{}: {direct:?}", k.id);
            let via = k.run_cpu(&prob, k.dtypes[0], &params, CpuArgs { ins: Default::default(), outs: Default::default() });
            assert!(matches!(via, Err(KernelError::WrongOp { .. })), "{}: {via:?}", k.id);
        }
    }

    /// The fused ops keep a float variety on both backends: two WGSL and two CPU
    /// float kernels each, ids prefixed by the op.
    #[test]
    fn every_fused_op_has_two_wgsl_and_two_cpu_float_kernels() {
        for op in [Op::QkNormRope, Op::GateUp, Op::ResidualRmsNorm, Op::ResidualLayerNorm, Op::QkvProj] {
            let ks: Vec<_> = for_op(op).filter(|k| !k.dtypes.iter().any(|d| d.is_quant())).collect();
            let wgsl = ks.iter().filter(|k| matches!(k.imp, Impl::Wgsl(_))).count();
            assert!(wgsl >= 2 && ks.len() - wgsl >= 2, "{op}: {wgsl} WGSL of {} kernels", ks.len());
            for k in &ks {
                assert!(k.id.starts_with(op.name()), "{} does not start with {op}", k.id);
                assert_eq!(k.dtypes, DType::FLOAT, "{} lacks a dtype", k.id);
            }
        }
    }
}
