//! (being written) kernel family `gemm`.

use super::KernelDef;

pub fn variants() -> Vec<KernelDef> {
    Vec::new()
}
