//! Devices: discovery of every wgpu adapter on every backend plus the CPU, the
//! capabilities kernels are checked against, stable fingerprints (sha256 over a
//! canonical serialization), and the `--device` selector every command shares.

pub mod class;
pub mod cpu;

use serde::{Deserialize, Serialize};

pub use class::DeviceClass;
pub use cpu::CpuCaps;

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(
        "no device matches `{selector}`; devices here:\n{listing}\nselect one with --device cpu, an index, a backend (vulkan, gl, metal, dx12), part of its name, or a fingerprint prefix"
    )]
    NoMatch { selector: String, listing: String },
    #[error("`{selector}` matches several devices ({names}); use an index or a fingerprint prefix")]
    Ambiguous { selector: String, names: String },
}

/// What a WGSL kernel can rely on from an adapter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GpuCaps {
    pub shader_f16: bool,
    pub subgroups: bool,
    pub subgroup_min_size: u32,
    pub subgroup_max_size: u32,
    pub timestamp_query: bool,
    /// Timestamps written between the dispatches of one compute pass
    /// (`TIMESTAMP_QUERY_INSIDE_PASSES`): a profiled decode step is then timed
    /// step by step in the passes an unprofiled one runs. Serialized (so part of
    /// the fingerprint) only when true, so an adapter without it keeps the
    /// fingerprint it had.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub timestamp_inside_passes: bool,
    pub max_workgroup_storage: u32,
    pub max_invocations_per_workgroup: u32,
    pub max_workgroup_size: [u32; 3],
    pub max_workgroups_per_dimension: u32,
    pub max_storage_binding: u64,
    pub max_buffer_size: u64,
    pub max_storage_buffers_per_stage: u32,
    /// The cooperative-matrix configurations the adapter reports
    /// (`Adapter::cooperative_matrix_properties`, subgroup scope; Vulkan
    /// `VK_KHR_cooperative_matrix`, Metal simdgroup matrices), when wgpu also offers
    /// `EXPERIMENTAL_COOPERATIVE_MATRIX`; empty otherwise (and then not part of the
    /// fingerprint, which stays what it was for such adapters).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub coop_matrix: Vec<CoopShape>,
    /// A software rasterizer (lavapipe, llvmpipe, WARP): the runtime's default
    /// kernel order differs from a hardware GPU's (`kernels::preferred`).
    /// Not serialized, so not part of the fingerprint.
    #[serde(skip)]
    pub software: bool,
}

/// One cooperative-matrix configuration: `C[m x n] += A[m x k] · B[k x n]` with A
/// and B of type `ab` and C of type `cr` (`f16`, `f32`, `i32`, `u32`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CoopShape {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub ab: &'static str,
    pub cr: &'static str,
}

impl GpuCaps {
    /// Whether the adapter runs square `size` cooperative matrices of f16 inputs
    /// accumulated in f32 (the only shapes naga 30's WGSL has: `coop_mat8x8`,
    /// `coop_mat16x16`); `Err` says what it reports instead.
    pub fn coop_f16_f32(&self, size: u32) -> Result<(), String> {
        if self.coop_matrix.iter().any(|c| c.m == size && c.n == size && c.k == size && c.ab == "f16" && c.cr == "f32") {
            return Ok(());
        }
        if self.coop_matrix.is_empty() {
            return Err("no cooperative matrices (the adapter lacks EXPERIMENTAL_COOPERATIVE_MATRIX or reports no configuration)".into());
        }
        let have: Vec<String> = self.coop_matrix.iter().map(|c| format!("{}x{}x{} {}->{}", c.m, c.n, c.k, c.ab, c.cr)).collect();
        Err(format!("no {size}x{size}x{size} f16->f32 cooperative matrix (the adapter reports {})", have.join(", ")))
    }
}

/// Identity of an adapter as wgpu reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GpuInfo {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub vendor_id: u32,
    pub device_id: u32,
    pub driver: String,
    pub driver_info: String,
    pub software: bool,
}

/// One adapter with its capabilities.
pub struct GpuDevice {
    pub adapter: wgpu::Adapter,
    pub info: GpuInfo,
    pub caps: GpuCaps,
}

/// Everything that can run kernels here.
pub enum Device {
    Gpu(Box<GpuDevice>),
    Cpu(CpuCaps),
}

/// Which backend a kernel runs on: WGSL on a wgpu adapter, or the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    Wgsl,
    Cpu,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Wgsl => "wgsl",
            Backend::Cpu => "cpu",
        }
    }
}

/// The device a validity check is made against.
#[derive(Clone, Copy, Debug)]
pub enum Caps<'a> {
    Cpu(&'a CpuCaps),
    Gpu(&'a GpuCaps),
}

/// Capabilities of the device kernels are selected for (an owned [`Caps`]).
#[derive(Clone, Debug)]
pub enum DeviceCaps {
    Cpu(CpuCaps),
    Gpu(GpuCaps),
}

impl DeviceCaps {
    pub fn caps(&self) -> Caps<'_> {
        match self {
            DeviceCaps::Cpu(c) => Caps::Cpu(c),
            DeviceCaps::Gpu(g) => Caps::Gpu(g),
        }
    }
    pub fn backend(&self) -> Backend {
        match self {
            DeviceCaps::Cpu(_) => Backend::Cpu,
            DeviceCaps::Gpu(_) => Backend::Wgsl,
        }
    }
}

impl From<&Device> for DeviceCaps {
    fn from(device: &Device) -> DeviceCaps {
        match device {
            Device::Cpu(c) => DeviceCaps::Cpu(c.clone()),
            Device::Gpu(g) => DeviceCaps::Gpu(g.caps.clone()),
        }
    }
}

/// One row of `list-devices`, serializable.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceSummary {
    pub index: usize,
    pub kind: &'static str,
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub software: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caps: Option<GpuCaps>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuCaps>,
    pub fingerprint: String,
}

#[derive(Serialize)]
struct GpuCanon<'a> {
    kind: &'static str,
    info: &'a GpuInfo,
    caps: &'a GpuCaps,
}

impl Device {
    pub fn is_cpu(&self) -> bool {
        matches!(self, Device::Cpu(_))
    }

    pub fn name(&self) -> String {
        match self {
            Device::Gpu(g) => g.info.name.clone(),
            Device::Cpu(c) => c.model.clone(),
        }
    }

    /// Vendor in profile spelling: nvidia, amd, intel, apple, arm, qualcomm, mesa
    /// (software adapters), or `unknown`.
    pub fn vendor(&self) -> String {
        match self {
            Device::Gpu(g) => match g.info.vendor_id {
                0x10de => "nvidia",
                0x1002 | 0x1022 => "amd",
                0x8086 => "intel",
                0x106b => "apple",
                0x13b5 => "arm",
                0x5143 => "qualcomm",
                0x10005 => "mesa",
                _ if g.info.software => "mesa",
                _ => "unknown",
            }
            .to_string(),
            Device::Cpu(c) => {
                let m = c.model.to_lowercase();
                if m.contains("amd") {
                    "amd"
                } else if m.contains("intel") {
                    "intel"
                } else if m.contains("apple") {
                    "apple"
                } else if c.arch == "aarch64" {
                    "arm"
                } else {
                    "unknown"
                }
                .to_string()
            }
        }
    }

    pub fn backend_name(&self) -> String {
        match self {
            Device::Gpu(g) => g.info.backend.clone(),
            Device::Cpu(_) => "cpu".into(),
        }
    }

    /// sha256 over the canonical JSON of the identity, features and limits (driver
    /// version included). Stable across runs on the same machine.
    pub fn fingerprint(&self) -> String {
        let canon = match self {
            Device::Gpu(g) => serde_json::to_vec(&GpuCanon { kind: "gpu", info: &g.info, caps: &g.caps }),
            Device::Cpu(c) => serde_json::to_vec(&(("kind", "cpu"), c)),
        };
        crate::hash::sha256_hex(canon.unwrap_or_default())
    }

    pub fn summary(&self, index: usize) -> DeviceSummary {
        match self {
            Device::Gpu(g) => DeviceSummary {
                index,
                kind: "gpu",
                name: g.info.name.clone(),
                backend: g.info.backend.clone(),
                device_type: g.info.device_type.clone(),
                software: g.info.software,
                gpu: Some(g.info.clone()),
                caps: Some(g.caps.clone()),
                cpu: None,
                fingerprint: self.fingerprint(),
            },
            Device::Cpu(c) => DeviceSummary {
                index,
                kind: "cpu",
                name: c.model.clone(),
                backend: "cpu".into(),
                device_type: "Cpu".into(),
                software: false,
                gpu: None,
                caps: None,
                cpu: Some(c.clone()),
                fingerprint: self.fingerprint(),
            },
        }
    }
}

fn caps_of(adapter: &wgpu::Adapter) -> GpuCaps {
    let f = adapter.features();
    let l = adapter.limits();
    let info = adapter.get_info();
    let subgroups = f.contains(wgpu::Features::SUBGROUP);
    GpuCaps {
        shader_f16: f.contains(wgpu::Features::SHADER_F16),
        subgroups,
        subgroup_min_size: if subgroups { info.subgroup_min_size } else { 0 },
        subgroup_max_size: if subgroups { info.subgroup_max_size } else { 0 },
        timestamp_query: f.contains(wgpu::Features::TIMESTAMP_QUERY),
        timestamp_inside_passes: f.contains(wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES),
        max_workgroup_storage: l.max_compute_workgroup_storage_size,
        max_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
        max_workgroup_size: [l.max_compute_workgroup_size_x, l.max_compute_workgroup_size_y, l.max_compute_workgroup_size_z],
        max_workgroups_per_dimension: l.max_compute_workgroups_per_dimension,
        max_storage_binding: l.max_storage_buffer_binding_size,
        max_buffer_size: l.max_buffer_size,
        max_storage_buffers_per_stage: l.max_storage_buffers_per_shader_stage,
        coop_matrix: coop_shapes(adapter),
        software: info.device_type == wgpu::DeviceType::Cpu,
    }
}

/// The adapter's cooperative-matrix configurations, when wgpu offers the feature.
fn coop_shapes(adapter: &wgpu::Adapter) -> Vec<CoopShape> {
    if !adapter.features().contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
        return Vec::new();
    }
    let name = |t: wgpu::CooperativeScalarType| match t {
        wgpu::CooperativeScalarType::F16 => "f16",
        wgpu::CooperativeScalarType::F32 => "f32",
        wgpu::CooperativeScalarType::I32 => "i32",
        wgpu::CooperativeScalarType::U32 => "u32",
    };
    adapter
        .cooperative_matrix_properties()
        .into_iter()
        .map(|p| CoopShape { m: p.m_size, n: p.n_size, k: p.k_size, ab: name(p.ab_type), cr: name(p.cr_type) })
        .collect()
}

fn info_of(adapter: &wgpu::Adapter) -> GpuInfo {
    let i = adapter.get_info();
    GpuInfo {
        name: i.name.clone(),
        backend: i.backend.to_str().to_string(),
        device_type: format!("{:?}", i.device_type),
        vendor_id: i.vendor,
        device_id: i.device,
        driver: i.driver.clone(),
        driver_info: i.driver_info.clone(),
        software: i.device_type == wgpu::DeviceType::Cpu,
    }
}

/// Every adapter on every backend (that can run compute shaders), then the CPU.
/// The order is stable: wgpu's enumeration order, CPU last.
pub fn discover() -> Vec<Device> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    let mut out: Vec<Device> = Vec::new();
    for adapter in adapters {
        let dl = adapter.get_downlevel_capabilities();
        if !dl.flags.contains(wgpu::DownlevelFlags::COMPUTE_SHADERS) {
            continue;
        }
        let info = info_of(&adapter);
        let caps = caps_of(&adapter);
        out.push(Device::Gpu(Box::new(GpuDevice { adapter, info, caps })));
    }
    out.push(Device::Cpu(CpuCaps::detect()));
    out
}

/// Resolves a `--device` selector against `devices`; returns the index.
///
/// `None` picks the first hardware GPU, else the CPU (software adapters such as
/// llvmpipe only when asked for). A selector is `cpu`, an index, a backend name,
/// part of an adapter name (case-insensitive), or a fingerprint prefix.
pub fn select(devices: &[Device], selector: Option<&str>) -> Result<usize, DeviceError> {
    let cpu_index = devices.iter().position(Device::is_cpu).unwrap_or(devices.len().saturating_sub(1));
    let Some(sel) = selector.map(str::trim) else {
        let hw = devices.iter().position(|d| matches!(d, Device::Gpu(g) if !g.info.software));
        return Ok(hw.unwrap_or(cpu_index));
    };
    let lower = sel.to_ascii_lowercase();
    if lower == "cpu" {
        return Ok(cpu_index);
    }
    if let Ok(i) = sel.parse::<usize>()
        && i < devices.len()
    {
        return Ok(i);
    }
    let by_backend: Vec<usize> = devices
        .iter()
        .enumerate()
        .filter(|(_, d)| matches!(d, Device::Gpu(g) if g.info.backend.eq_ignore_ascii_case(&lower)))
        .map(|(i, _)| i)
        .collect();
    if !by_backend.is_empty() {
        // Prefer hardware within a backend, then the first.
        let hw = by_backend.iter().copied().find(|&i| matches!(&devices[i], Device::Gpu(g) if !g.info.software));
        return Ok(hw.unwrap_or(by_backend[0]));
    }
    let matches: Vec<usize> = devices
        .iter()
        .enumerate()
        .filter(|(_, d)| (lower.len() >= 4 && d.fingerprint().starts_with(&lower)) || d.name().to_ascii_lowercase().contains(&lower))
        .map(|(i, _)| i)
        .collect();
    match matches.len() {
        1 => Ok(matches[0]),
        0 => Err(DeviceError::NoMatch { selector: sel.to_string(), listing: listing(devices) }),
        _ => {
            // The same adapter seen through two backends is still one choice: take the first.
            let first = devices[matches[0]].name();
            if matches.iter().all(|&i| devices[i].name() == first) {
                Ok(matches[0])
            } else {
                Err(DeviceError::Ambiguous {
                    selector: sel.to_string(),
                    names: matches.iter().map(|&i| format!("{i}: {}", devices[i].name())).collect::<Vec<_>>().join(", "),
                })
            }
        }
    }
}

/// One line per device, for error messages.
pub fn listing(devices: &[Device]) -> String {
    devices
        .iter()
        .enumerate()
        .map(|(i, d)| format!("  {i}: {} [{}] {}", d.name(), d.backend_name(), &d.fingerprint()[..12]))
        .collect::<Vec<_>>()
        .join("\n")
}
