//! (being written) kernel family `elementwise`.

use super::KernelDef;

pub fn variants() -> Vec<KernelDef> {
    Vec::new()
}
