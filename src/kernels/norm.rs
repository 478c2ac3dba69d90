//! (being written) kernel family `norm`.

use super::KernelDef;

pub fn variants() -> Vec<KernelDef> {
    Vec::new()
}
