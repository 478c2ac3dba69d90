//! (being written) kernel family `fused`.

use super::KernelDef;

pub fn variants() -> Vec<KernelDef> {
    Vec::new()
}
