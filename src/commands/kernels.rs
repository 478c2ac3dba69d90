//! `ktune kernels [--verify]`: the kernel set, each kernel's validity on the device,
//! and with `--verify` the parity check of every valid variant against the f64 CPU
//! reference.

use serde::Serialize;

use crate::cli::KernelsArgs;
use crate::device::Device;
use crate::gpu::GpuCtx;
use crate::kernels::verify::{self, KernelVerdict, Runner};
use crate::kernels::{self, Caps, DType, KernelDef, ParamSpec, problem::test_problems};
use crate::{Error, Result};

#[derive(Debug, Serialize)]
pub struct ValidityRow {
    pub dtype: DType,
    pub valid: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct KernelRow {
    pub id: &'static str,
    pub op: &'static str,
    pub backend: &'static str,
    pub dtypes: Vec<DType>,
    pub params: Vec<ParamSpec>,
    pub summary: &'static str,
    /// Validity on the device with default parameters, per dtype, for the op's test shapes.
    pub validity: Vec<ValidityRow>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify: Option<KernelVerdict>,
}

#[derive(Debug, Serialize)]
pub struct KernelsReport {
    pub device: String,
    pub backend: String,
    pub fingerprint: String,
    pub kernel_set_hash: String,
    pub verified: bool,
    pub kernels: Vec<KernelRow>,
}

impl KernelsReport {
    pub fn failed(&self) -> bool {
        self.kernels.iter().any(|k| k.verify.as_ref().is_some_and(|v| v.failed > 0))
    }
    pub fn checks(&self) -> (usize, usize) {
        self.kernels.iter().filter_map(|k| k.verify.as_ref()).fold((0, 0), |(c, f), v| (c + v.checks, f + v.failed))
    }
}

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

pub fn run(selector: Option<&str>, args: &KernelsArgs) -> Result<KernelsReport> {
    if let Some(op) = &args.op
        && !kernels::Op::ALL.iter().any(|o| o.name() == op)
    {
        let ops: Vec<_> = kernels::Op::ALL.iter().map(|o| o.name()).collect();
        return Err(Error::Usage(format!("unknown op `{op}`; ops: {}", ops.join(", "))));
    }
    if let Some(id) = &args.kernel {
        kernels::find(id)?;
    }
    let device = super::pick_device(selector)?;
    let gpu = match &device {
        Device::Gpu(g) if args.verify => Some(GpuCtx::open(g)?),
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
    let progress = if args.verify { crate::output::progress(selected.len() as u64, "verifying") } else { None };
    let mut rows = Vec::new();
    for k in selected {
        let validity = validity(k, caps);
        let verify = if args.verify && verify::runs_on(k, &runner) {
            if let Some(pb) = &progress {
                pb.set_message(k.id);
            }
            Some(verify::verify_kernel(&runner, caps, k, args.all_params))
        } else {
            None
        };
        if let Some(pb) = &progress {
            pb.inc(1);
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
    if let Some(pb) = progress {
        pb.finish_and_clear();
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
