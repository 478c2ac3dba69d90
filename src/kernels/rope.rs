//! (being written) kernel family `rope`.

use super::KernelDef;

pub fn variants() -> Vec<KernelDef> {
    Vec::new()
}
