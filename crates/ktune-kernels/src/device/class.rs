//! Device classes: what a profile tuned on one device tells about another. The
//! exact fingerprint (identity, features, limits, driver) decides whether a
//! profile is this device's own; the class is coarser, the facts that decide
//! which kernels win, so a colleague's identical machine or a CI runner of the
//! same kind can use a profile tuned elsewhere (with a warning).
//!
//! - GPU: vendor, architecture family (NVIDIA: the generation from the PCI device
//!   id; others: the adapter name without its parenthesized details), wgpu backend,
//!   driver major version.
//! - CPU: vendor, family and model (CPUID on x86, the model name elsewhere), the
//!   SIMD extensions kernels dispatch on, logical CPUs.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{CpuCaps, Device, GpuInfo};

/// The class of a device, as recorded in a profile's `tuning.device_class`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeviceClass {
    /// `cpu` or `gpu`.
    pub kind: String,
    pub vendor: String,
    /// GPU architecture family, or the CPU's family/model.
    pub family: String,
    /// `cpu`, or the wgpu backend (vulkan, metal, dx12, gl).
    pub backend: String,
    /// GPU driver major version (absent when the driver does not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_major: Option<u32>,
    /// CPU: the SIMD extensions (sorted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub isa: Vec<String>,
    /// CPU: logical CPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<usize>,
}

impl std::fmt::Display for DeviceClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {} ({})", self.kind, self.vendor, self.family, self.backend)?;
        if let Some(d) = self.driver_major {
            write!(f, ", driver {d}")?;
        }
        if !self.isa.is_empty() {
            write!(f, ", {}", self.isa.join("+"))?;
        }
        if let Some(c) = self.cores {
            write!(f, ", {c} threads")?;
        }
        Ok(())
    }
}

impl Device {
    /// This device's class.
    pub fn class(&self) -> DeviceClass {
        match self {
            Device::Gpu(g) => gpu_class(&self.vendor(), &g.info),
            Device::Cpu(c) => cpu_class(&self.vendor(), c),
        }
    }
}

/// A GPU's last-level cache as the slot races must overflow it: bytes and where the
/// figure comes from. wgpu does not report cache sizes, so this is an estimate per
/// vendor and class, erring large (a larger estimate only costs memory for more
/// copies; a smaller one would time weights that stay in the cache).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct L2Estimate {
    pub bytes: u64,
    pub source: String,
}

const MIB: u64 = 1 << 20;

impl Device {
    /// The last-level cache of this GPU (`None` for the CPU): per vendor and
    /// architecture family; a software adapter (lavapipe) runs on the host, whose
    /// last-level cache it is.
    pub fn gpu_l2_estimate(&self) -> Option<L2Estimate> {
        let Device::Gpu(g) = self else { return None };
        let vendor = self.vendor();
        Some(gpu_l2(&vendor, &g.info, || {
            let c = CpuCaps::detect();
            if c.cache_l3 > 0 { c.cache_l3 } else { c.cache_l2 }
        }))
    }
}

/// [`Device::gpu_l2_estimate`] from the adapter's identity; `host_llc` is asked
/// only for software adapters.
pub fn gpu_l2(vendor: &str, info: &GpuInfo, host_llc: impl FnOnce() -> u64) -> L2Estimate {
    let family = gpu_family(vendor, info);
    let est = |mib: u64, what: &str| L2Estimate { bytes: mib * MIB, source: format!("estimate: {what}") };
    if info.software {
        let llc = host_llc();
        return if llc > 0 {
            L2Estimate { bytes: llc, source: "estimate: software adapter, the host's last-level cache".into() }
        } else {
            est(64, "software adapter, host cache unknown")
        };
    }
    match (vendor, family.as_str()) {
        ("nvidia", "maxwell") => est(4, "nvidia maxwell"),
        ("nvidia", "pascal") => est(4, "nvidia pascal"),
        ("nvidia", "turing") => est(6, "nvidia turing"),
        // GA100 (A100, device ids 0x20xx) has 40 MB; the GA10x parts 6 MB.
        ("nvidia", "ampere") if info.device_id >> 8 == 0x20 => est(40, "nvidia ampere ga100"),
        ("nvidia", "ampere") => est(6, "nvidia ampere ga10x"),
        ("nvidia", "ada") => est(72, "nvidia ada (ad102)"),
        ("nvidia", "hopper") => est(50, "nvidia hopper"),
        ("nvidia", "blackwell") => est(128, "nvidia blackwell"),
        ("nvidia", _) => est(128, "nvidia, unknown generation"),
        // Instinct MI300 has a 256 MB Infinity Cache; Radeon parts up to 128 MB.
        ("amd", f) if f.contains("mi3") => est(256, "amd instinct mi300"),
        ("amd", _) => est(128, "amd (infinity cache)"),
        ("apple", _) => est(96, "apple (system level cache)"),
        ("intel", _) => est(32, "intel"),
        _ => est(128, "unknown vendor"),
    }
}

fn gpu_class(vendor: &str, info: &GpuInfo) -> DeviceClass {
    DeviceClass {
        kind: "gpu".into(),
        vendor: vendor.into(),
        family: gpu_family(vendor, info),
        backend: info.backend.to_lowercase(),
        driver_major: driver_major(&info.driver_info),
        isa: Vec::new(),
        cores: None,
    }
}

/// NVIDIA: the generation from the PCI device id's upper bits; others: the name
/// without parenthesized details (`llvmpipe (LLVM 19.1.7, 256 bits)` → `llvmpipe`).
fn gpu_family(vendor: &str, info: &GpuInfo) -> String {
    if vendor == "nvidia" {
        let generation = match info.device_id >> 8 {
            0x13 | 0x14 | 0x17 => "maxwell",
            0x15 | 0x1b | 0x1c | 0x1d => "pascal",
            0x1e | 0x1f | 0x21 => "turing",
            0x20 | 0x22 | 0x24 | 0x25 => "ampere",
            0x26..=0x28 => "ada",
            0x23 => "hopper",
            0x29 | 0x2b | 0x2c | 0x2d | 0x2f => "blackwell",
            _ => "",
        };
        if !generation.is_empty() {
            return generation.into();
        }
    }
    let mut name = String::new();
    let mut depth = 0usize;
    for ch in info.name.chars() {
        match ch {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            _ if depth == 0 => name.push(ch),
            _ => {}
        }
    }
    let name = name.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase();
    if name.is_empty() { "unknown".into() } else { name }
}

/// The driver's major version: the number after `Mesa` when the text names Mesa
/// (GL's `4.5 (Core Profile) Mesa 22.3.6` → 22), else the first number
/// (`580.95.05` → 580).
fn driver_major(text: &str) -> Option<u32> {
    let text = text.find("Mesa").map_or(text, |i| &text[i..]);
    let start = text.find(|c: char| c.is_ascii_digit())?;
    let digits: String = text[start..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn cpu_class(vendor: &str, c: &CpuCaps) -> DeviceClass {
    DeviceClass {
        kind: "cpu".into(),
        vendor: vendor.into(),
        family: cpu_family(c),
        backend: "cpu".into(),
        driver_major: None,
        isa: c.features.clone(),
        cores: Some(c.threads),
    }
}

/// x86: `x86_64 family 25 model 1` from CPUID (the same silicon across SKUs and
/// clock speeds); elsewhere the architecture and the model name.
#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
fn cpu_family(c: &CpuCaps) -> String {
    match raw_cpuid::CpuId::new().get_feature_info() {
        Some(f) => format!("{} family {} model {}", c.arch, f.family_id(), f.model_id()),
        None => format!("{} {}", c.arch, c.model.to_lowercase()),
    }
}

#[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
fn cpu_family(c: &CpuCaps) -> String {
    format!("{} {}", c.arch, c.model.to_lowercase())
}

#[cfg(test)]
mod tests {

    fn gpu_info(name: &str, vendor_id: u32, device_id: u32, software: bool) -> GpuInfo {
        GpuInfo {
            name: name.into(),
            backend: "Vulkan".into(),
            device_type: if software { "Cpu".into() } else { "DiscreteGpu".into() },
            vendor_id,
            device_id,
            driver: String::new(),
            driver_info: String::new(),
            software,
        }
    }

    /// The L2 estimates per vendor and class: an H100 50 MB, an RTX 4090 72 MB,
    /// an A100 40 MB against a GA102's 6 MB; lavapipe the host's last-level cache
    /// (asked only for a software adapter).
    #[test]
    fn l2_estimates_follow_vendor_and_class() {
        let no_host = || -> u64 { panic!("a hardware adapter must not ask for the host cache") };
        let mib = |m: u64| m << 20;
        assert_eq!(gpu_l2("nvidia", &gpu_info("NVIDIA H100 80GB HBM3", 0x10de, 0x2330, false), no_host).bytes, mib(50));
        assert_eq!(gpu_l2("nvidia", &gpu_info("NVIDIA GeForce RTX 4090", 0x10de, 0x2684, false), no_host).bytes, mib(72));
        assert_eq!(gpu_l2("nvidia", &gpu_info("NVIDIA A100", 0x10de, 0x20b0, false), no_host).bytes, mib(40));
        assert_eq!(gpu_l2("nvidia", &gpu_info("NVIDIA GeForce RTX 3090", 0x10de, 0x2204, false), no_host).bytes, mib(6));
        let h100 = gpu_l2("nvidia", &gpu_info("NVIDIA H100", 0x10de, 0x2330, false), no_host);
        assert!(h100.source.contains("hopper"), "{}", h100.source);
        let lvp = gpu_l2("mesa", &gpu_info("llvmpipe (LLVM 19.1.7, 256 bits)", 0x10005, 0, true), || mib(32));
        assert_eq!(lvp.bytes, mib(32));
        assert!(lvp.source.contains("host"), "{}", lvp.source);
        assert_eq!(gpu_l2("mesa", &gpu_info("llvmpipe", 0x10005, 0, true), || 0).bytes, mib(64));
        assert!(gpu_l2("acme", &gpu_info("Acme GPU", 0x1234, 1, false), no_host).bytes >= mib(64));
    }

    use super::*;

    fn info(name: &str, vendor_id: u32, device_id: u32, driver_info: &str) -> GpuInfo {
        GpuInfo {
            name: name.into(),
            backend: "Vulkan".into(),
            device_type: "DiscreteGpu".into(),
            vendor_id,
            device_id,
            driver: String::new(),
            driver_info: driver_info.into(),
            software: false,
        }
    }

    #[test]
    fn gpu_classes() {
        let h100 = gpu_class("nvidia", &info("NVIDIA H100 80GB HBM3", 0x10de, 0x2330, "580.95.05"));
        assert_eq!((h100.family.as_str(), h100.backend.as_str(), h100.driver_major), ("hopper", "vulkan", Some(580)));
        let lvp = gpu_class("mesa", &info("llvmpipe (LLVM 19.1.7, 256 bits)", 0x10005, 0, "Mesa 25.0.7-2 (LLVM 19.1.7)"));
        assert_eq!((lvp.family.as_str(), lvp.driver_major), ("llvmpipe", Some(25)));
        // Another build of the same driver major: the same class.
        let lvp2 = gpu_class("mesa", &info("llvmpipe (LLVM 20.1.0, 512 bits)", 0x10005, 0, "Mesa 25.2.1"));
        assert_eq!(lvp, lvp2);
        assert_eq!(driver_major("no digits"), None);
        assert_eq!(driver_major("4.5 (Core Profile) Mesa 22.3.6"), Some(22));
        assert_eq!(driver_major("llvmpipe Mesa 22.3.6 (LLVM 15.0.6)"), Some(22));
    }

    #[test]
    fn cpu_class_keeps_isa_and_cores() {
        let caps = CpuCaps {
            model: "AMD EPYC 7B13".into(),
            arch: "x86_64".into(),
            threads: 2,
            features: vec!["avx2".into(), "fma".into()],
            cache_l1d: 0,
            cache_l2: 0,
            cache_l3: 0,
        };
        let a = cpu_class("amd", &caps);
        let b = cpu_class("amd", &CpuCaps { threads: 4, ..caps.clone() });
        assert_eq!(a.isa, vec!["avx2", "fma"]);
        assert_ne!(a, b, "a different core count is another class");
        assert!(a.to_string().contains("2 threads"));
    }
}
