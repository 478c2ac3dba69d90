//! Parity of every kernel variant against the f64 CPU reference: every CPU kernel on
//! the CPU, every WGSL kernel on the test GPU (lavapipe in CI; see
//! `ktune::testing::test_gpu` for when a missing adapter skips and when it fails).

use ktune::device::CpuCaps;
use ktune::kernels::verify::{self, Runner};
use ktune::kernels::{self, Backend, Caps};
use ktune::testing::test_gpu;

fn report(verdicts: &[verify::KernelVerdict]) -> String {
    let mut s = String::new();
    for v in verdicts {
        for f in &v.failures {
            s.push_str(&format!(
                "{} {} {:?} on {}: rel err {:.3e} (tol {:.1e}) {}\n",
                f.kernel,
                f.dtype,
                f.params,
                f.problem,
                f.rel_err,
                f.tolerance,
                f.error.as_deref().unwrap_or("")
            ));
        }
    }
    s
}

#[test]
fn cpu_kernels_match_reference() {
    let caps = CpuCaps::detect();
    let mut verdicts = Vec::new();
    // The quantized kernels have their own test below.
    for k in kernels::registry().iter().filter(|k| k.backend() == Backend::Cpu && !k.dtypes.iter().any(|d| d.is_quant())) {
        let v = verify::verify_kernel(&Runner::Cpu, Caps::Cpu(&caps), k, false);
        assert!(v.checks > 0, "{} ran no check: {:?}", k.id, v.not_run);
        verdicts.push(v);
    }
    let failed = report(&verdicts);
    assert!(failed.is_empty(), "CPU parity failures:\n{failed}");
}

#[test]
fn wgsl_kernels_match_reference() {
    let Some(gpu) = test_gpu() else { return };
    let mut verdicts = Vec::new();
    let mut ran = 0;
    for k in kernels::registry().iter().filter(|k| k.backend() == Backend::Wgsl && !k.dtypes.iter().any(|d| d.is_quant())) {
        let v = verify::verify_kernel(&Runner::Gpu(&gpu), Caps::Gpu(&gpu.caps), k, false);
        ran += v.checks;
        verdicts.push(v);
    }
    assert!(ran > 0, "no WGSL check ran on {}", gpu.name);
    let failed = report(&verdicts);
    assert!(failed.is_empty(), "WGSL parity failures on {}:\n{failed}", gpu.name);
}

/// Issue requirement: every op has at least two WGSL and two CPU kernels, and each
/// kernel declares tunable parameters.
#[test]
fn every_op_has_two_wgsl_and_two_cpu_kernels_with_parameters() {
    use ktune::kernels::{Op, for_op};
    for op in Op::ALL {
        let wgsl = for_op(op).filter(|k| k.backend() == Backend::Wgsl).count();
        let cpu = for_op(op).filter(|k| k.backend() == Backend::Cpu).count();
        assert!(wgsl >= 2 && cpu >= 2, "{op}: {wgsl} WGSL and {cpu} CPU kernels");
        for k in for_op(op) {
            assert!(!k.params.is_empty(), "{} has no tunable parameter", k.id);
        }
    }
}

/// The block-quantized kernels (q8_0, q4_0, q4_1) against the f64 reference over
/// the dequantized weights, on the CPU and on the test GPU: every one of them runs
/// checks (shapes with k in whole blocks but not whole tiles, rows not a multiple
/// of the workgroup's), and every format of every quantized op has both backends.
#[test]
fn quantized_kernels_match_dequantized_reference() {
    use ktune::kernels::{DType, Op, for_op};
    for op in [Op::Gemv, Op::Gemm, Op::GateUp, Op::QkvProj, Op::NormGemv] {
        for d in DType::QUANT {
            for b in [Backend::Cpu, Backend::Wgsl] {
                assert!(for_op(op).any(|k| k.backend() == b && k.dtypes.contains(d)), "{op}: no {} kernel for {d}", b.name());
            }
        }
    }
    let quant = |k: &&kernels::KernelDef| k.dtypes.iter().any(|d| d.is_quant());
    let caps = CpuCaps::detect();
    let mut verdicts = Vec::new();
    for k in kernels::registry().iter().filter(quant).filter(|k| k.backend() == Backend::Cpu) {
        let v = verify::verify_kernel(&Runner::Cpu, Caps::Cpu(&caps), k, false);
        assert!(v.checks > 0, "{} ran no check: {:?}", k.id, v.not_run);
        verdicts.push(v);
    }
    if let Some(gpu) = test_gpu() {
        for k in kernels::registry().iter().filter(quant).filter(|k| k.backend() == Backend::Wgsl) {
            let v = verify::verify_kernel(&Runner::Gpu(&gpu), Caps::Gpu(&gpu.caps), k, false);
            assert!(v.checks > 0, "{} ran no check on {}: {:?}", k.id, gpu.name, v.not_run);
            verdicts.push(v);
        }
    }
    let failed = report(&verdicts);
    assert!(failed.is_empty(), "quantized parity failures:\n{failed}");
}

/// The runtime's preference lists (`plan::select::preferred`) name kernels that
/// exist and compute the op of the problem on that backend: the runtime skips an id
/// it cannot find, so a typo there would silently change the defaults.
#[test]
fn preferred_kernels_exist_and_compute_their_op() {
    use ktune::kernels::problem::test_problems;
    use ktune::kernels::{Op, registry};
    use ktune::plan::select::preferred;
    let mut named = 0;
    for op in Op::ALL {
        for problem in test_problems(op) {
            for backend in [Backend::Cpu, Backend::Wgsl] {
                for id in preferred(&problem, backend) {
                    let k = registry().iter().find(|k| k.id == *id).unwrap_or_else(|| {
                        panic!("the {} preference list for {op} names `{id}`, which is not in the registry", backend.name())
                    });
                    assert_eq!(k.op, op, "the {} preference list for {op} names `{id}`, which computes {}", backend.name(), k.op);
                    assert_eq!(
                        k.backend(),
                        backend,
                        "the {} preference list for {op} names `{id}`, a {} kernel",
                        backend.name(),
                        k.backend().name()
                    );
                    named += 1;
                }
            }
        }
    }
    assert!(named > 0, "no preference list was reached");
}
