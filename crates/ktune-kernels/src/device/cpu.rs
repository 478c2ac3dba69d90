//! The CPU as a device: model name, core counts, SIMD extensions detected at run
//! time, and cache sizes (from CPUID on x86, sysfs on Linux elsewhere).

use serde::Serialize;

/// What CPU kernels can rely on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CpuCaps {
    pub model: String,
    pub arch: String,
    /// Logical CPUs the process may use (rayon's pool size).
    pub threads: usize,
    /// SIMD and arithmetic extensions, sorted: avx, avx2, avx512f, fma, f16c, neon, ...
    pub features: Vec<String>,
    /// Data/unified cache sizes in bytes per level (L1d, L2, L3), 0 when unknown.
    pub cache_l1d: u64,
    pub cache_l2: u64,
    pub cache_l3: u64,
}

impl CpuCaps {
    pub fn has(&self, feature: &str) -> bool {
        self.features.iter().any(|f| f == feature)
    }

    pub fn detect() -> CpuCaps {
        let (model, caches) = model_and_caches();
        let mut features = simd_features();
        features.sort();
        CpuCaps {
            model,
            arch: std::env::consts::ARCH.to_string(),
            threads: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            features,
            cache_l1d: caches[0],
            cache_l2: caches[1],
            cache_l3: caches[2],
        }
    }
}

/// The names among `$name`s that std's `$detect` macro finds on this CPU.
#[cfg(any(target_arch = "x86", target_arch = "x86_64", target_arch = "aarch64"))]
macro_rules! detected {
    ($detect:ident: $($name:tt),*) => {
        [$(($name, std::arch::$detect!($name))),*].into_iter().filter(|(_, has)| *has).map(|(name, _)| name.to_string()).collect::<Vec<_>>()
    };
}

#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
fn simd_features() -> Vec<String> {
    let mut f = detected!(is_x86_feature_detected: "sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512fp16", "avx512bf16", "avx512vnni");
    // AMX detection through std is unstable; read CPUID leaf 7 directly. This says
    // what the CPU advertises, not whether the OS lets a process use the tiles.
    if let Some(ext) = raw_cpuid::CpuId::new().get_extended_feature_info() {
        for (has, name) in [(ext.has_amx_tile(), "amx-tile"), (ext.has_amx_int8(), "amx-int8"), (ext.has_amx_bf16(), "amx-bf16")] {
            if has {
                f.push(name.to_string());
            }
        }
    }
    f
}

#[cfg(target_arch = "aarch64")]
fn simd_features() -> Vec<String> {
    detected!(is_aarch64_feature_detected: "neon", "fp16", "dotprod", "sve", "sve2", "i8mm", "bf16")
}

#[cfg(not(any(target_arch = "x86", target_arch = "x86_64", target_arch = "aarch64")))]
fn simd_features() -> Vec<String> {
    Vec::new()
}

#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
fn model_and_caches() -> (String, [u64; 3]) {
    let cpuid = raw_cpuid::CpuId::new();
    let model = cpuid
        .get_processor_brand_string()
        .map(|b| b.as_str().trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(proc_model)
        .unwrap_or_else(|| "unknown x86 CPU".into());
    let mut caches = [0u64; 3];
    if let Some(params) = cpuid.get_cache_parameters() {
        for c in params {
            let size = (c.associativity() * c.physical_line_partitions() * c.coherency_line_size() * c.sets()) as u64;
            let data = !matches!(c.cache_type(), raw_cpuid::CacheType::Instruction);
            match (c.level(), data) {
                (1, true) => caches[0] = size,
                (2, _) => caches[1] = size,
                (3, _) => caches[2] = size,
                _ => {}
            }
        }
    }
    if caches == [0, 0, 0] {
        caches = sysfs_caches();
    }
    (model, caches)
}

#[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
fn model_and_caches() -> (String, [u64; 3]) {
    (proc_model().unwrap_or_else(|| format!("unknown {} CPU", std::env::consts::ARCH)), sysfs_caches())
}

fn proc_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find(|l| l.starts_with("model name") || l.starts_with("Model") || l.starts_with("Hardware"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// Cache sizes from `/sys/devices/system/cpu/cpu0/cache` (Linux); zeros elsewhere.
fn sysfs_caches() -> [u64; 3] {
    let mut out = [0u64; 3];
    let Ok(dir) = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache") else {
        return out;
    };
    for entry in dir.flatten() {
        let path = entry.path();
        let read = |f: &str| std::fs::read_to_string(path.join(f)).ok().map(|s| s.trim().to_string());
        let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size")) else {
            continue;
        };
        let bytes = parse_size(&size);
        match (level.as_str(), kind.as_str()) {
            ("1", "Data") => out[0] = bytes,
            ("2", _) => out[1] = bytes,
            ("3", _) => out[2] = bytes,
            _ => {}
        }
    }
    out
}

fn parse_size(s: &str) -> u64 {
    let (num, mul) = match s.chars().last() {
        Some('K') => (&s[..s.len() - 1], 1024),
        Some('M') => (&s[..s.len() - 1], 1024 * 1024),
        _ => (s, 1),
    };
    num.parse::<u64>().map(|n| n * mul).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sysfs_sizes() {
        assert_eq!(parse_size("48K"), 48 * 1024);
        assert_eq!(parse_size("2M"), 2 * 1024 * 1024);
        assert_eq!(parse_size("512"), 512);
        assert_eq!(parse_size("junk"), 0);
    }

    #[test]
    fn detection_is_stable() {
        assert_eq!(CpuCaps::detect(), CpuCaps::detect());
    }
}
