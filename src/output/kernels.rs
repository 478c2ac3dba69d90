//! `kernels` as a table, with the verification verdicts.

use tabled::Tabled;

use super::{Report, sharp_table, short};
use crate::report::KernelsReport;

#[derive(Tabled)]
struct KernelLine {
    id: String,
    op: String,
    backend: String,
    dtypes: String,
    params: String,
    #[tabled(rename = "on this device")]
    valid: String,
    #[tabled(rename = "verify")]
    verify: String,
}

impl Report for KernelsReport {
    fn table(&self) -> String {
        let r = self;
        let rows = r.kernels.iter().map(|k| KernelLine {
            id: k.id.to_string(),
            op: k.op.to_string(),
            backend: k.backend.to_string(),
            dtypes: k.dtypes.iter().map(|d| d.name()).collect::<Vec<_>>().join(","),
            params: k.params.iter().map(|p| format!("{}={:?}", p.name, p.values).replace(' ', "")).collect::<Vec<_>>().join("\n"),
            valid: k
                .validity
                .iter()
                .map(|v| match &v.reason {
                    None => format!("{}: yes", v.dtype),
                    Some(r) => format!("{}: no ({r})", v.dtype),
                })
                .collect::<Vec<_>>()
                .join("\n"),
            verify: match &k.verify {
                None => "-".into(),
                Some(v) if v.checks == 0 => format!("not run: {}", v.not_run.clone().unwrap_or_default()),
                Some(v) if v.failed == 0 => format!("ok {} checks, max rel err {:.1e}", v.checks, v.worst_rel_err),
                Some(v) => {
                    let first = &v.failures[0];
                    format!(
                        "FAIL {}/{} (rel err {:.1e} > {:.0e}; {} {}{})",
                        v.failed,
                        v.checks,
                        first.rel_err,
                        first.tolerance,
                        first.problem,
                        first.dtype,
                        first.error.as_ref().map(|e| format!(": {e}")).unwrap_or_default()
                    )
                }
            },
        });
        let t = sharp_table(rows);
        let mut s = format!("device: {} [{}] {}\n{t}", r.device, r.backend, short(&r.fingerprint));
        if r.verified {
            let (checks, failed) = r.checks();
            s.push_str(&format!("\n{} passed, {} failed", checks - failed, failed));
        }
        s
    }
}
