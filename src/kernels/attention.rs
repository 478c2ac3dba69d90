//! (being written) kernel family `attention`.

use super::KernelDef;

pub fn variants() -> Vec<KernelDef> {
    Vec::new()
}
