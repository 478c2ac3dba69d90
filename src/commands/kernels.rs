//! `ktune kernels [--verify]`: the kernel set, each kernel's validity on the device,
//! and with `--verify` the parity check of every valid variant against the f64 CPU
//! reference.

use crate::cli::KernelsArgs;
use crate::device::Device;
use crate::gpu::GpuCtx;
use crate::kernels::verify::{self, Runner};
use crate::kernels::{self, Caps, KernelDef, problem::test_problems};
use crate::progress::Progress;
use crate::report::{KernelRow, KernelsReport, ValidityRow};
use crate::session;
use crate::{Error, Result};

/// Validity of `k` with default params: valid if any of the op's test shapes is accepted.
fn validity(k: &KernelDef, caps: Caps<'_>) -> Vec<ValidityRow> {
    k.dtypes
        .iter()
        .map(|&dtype| {
            let params = k.default_params();
            let mut reason = None;
            for prob in test_problems(k.op) {
                match k.check(caps, &prob, dtype, &params) {
                    Ok(()) => return ValidityRow { dtype, valid: true, reason: None },
                    Err(r) => reason = reason.or(Some(r)),
                }
            }
            ValidityRow { dtype, valid: false, reason }
        })
        .collect()
}

/// The kernel rows; with `--verify`, `progress` sees one step per kernel.
pub fn run(selector: Option<&str>, args: &KernelsArgs, progress: &dyn Progress) -> Result<KernelsReport> {
    if let Some(op) = &args.op
        && !kernels::Op::ALL.iter().any(|o| o.name() == op)
    {
        let ops: Vec<_> = kernels::Op::ALL.iter().map(|o| o.name()).collect();
        return Err(Error::Usage(format!("unknown op `{op}`; ops: {}", ops.join(", "))));
    }
    if let Some(id) = &args.kernel {
        kernels::find(id)?;
    }
    let device = session::pick_device(selector)?;
    let gpu = match &device {
        Device::Gpu(g) if args.verify => Some(GpuCtx::open(g)?.with_trusted_shaders(args.trusted_shaders)),
        _ => None,
    };
    let caps = match &device {
        Device::Gpu(g) => Caps::Gpu(&g.caps),
        Device::Cpu(c) => Caps::Cpu(c),
    };
    let runner = match &gpu {
        Some(g) => Runner::Gpu(g),
        None => Runner::Cpu,
    };
    let selected: Vec<&KernelDef> = kernels::registry()
        .iter()
        .filter(|k| args.op.as_ref().is_none_or(|o| k.op.name() == o))
        .filter(|k| args.kernel.as_ref().is_none_or(|id| k.id == id))
        .collect();
    if args.verify {
        progress.phase("", selected.len() as u64);
    }
    let mut rows = Vec::new();
    for k in selected {
        let validity = validity(k, caps);
        let verify = if args.verify && verify::runs_on(k, &runner) {
            progress.step(k.id);
            Some(verify::verify_kernel(&runner, caps, k, if args.all_params { verify::Sweep::Full } else { verify::Sweep::Axes }))
        } else {
            None
        };
        if args.verify {
            progress.tick();
        }
        rows.push(KernelRow {
            id: k.id,
            op: k.op.name(),
            backend: k.backend().name(),
            dtypes: k.dtypes.to_vec(),
            params: k.params.to_vec(),
            summary: k.summary,
            validity,
            verify,
        });
    }
    if args.verify {
        progress.done();
    }
    Ok(KernelsReport {
        device: device.name(),
        backend: device.backend_name(),
        fingerprint: device.fingerprint(),
        kernel_set_hash: kernels::kernel_set_hash(),
        verified: args.verify,
        kernels: rows,
    })
}
