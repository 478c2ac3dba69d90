//! `list-devices` as a table.

use tabled::Tabled;

use super::{Report, bytes, sharp_table, short};
use crate::report::DevicesReport;

#[derive(Tabled)]
struct DeviceRow {
    #[tabled(rename = "#")]
    index: String,
    name: String,
    backend: String,
    #[tabled(rename = "type")]
    device_type: String,
    ids: String,
    driver: String,
    features: String,
    limits: String,
    fingerprint: String,
}

impl Report for DevicesReport {
    fn table(&self) -> String {
        let r = self;
        let rows = r.devices.iter().map(|d| {
            let mark = if d.index == r.default_index { "*" } else { "" };
            match (&d.gpu, &d.caps, &d.cpu) {
                (Some(g), Some(c), _) => {
                    let mut feats = Vec::new();
                    if c.shader_f16 {
                        feats.push("f16".to_string());
                    }
                    if c.subgroups {
                        feats.push(format!("subgroups {}-{}", c.subgroup_min_size, c.subgroup_max_size));
                    }
                    if c.timestamp_query {
                        feats.push(if c.timestamp_inside_passes { "timestamps in passes" } else { "timestamps" }.into());
                    }
                    if !c.coop_matrix.is_empty() {
                        // `coop 16x16x16 f16->f32, ...`: the shapes the matrix-unit kernels can use.
                        let shapes: Vec<String> =
                            c.coop_matrix.iter().map(|m| format!("{}x{}x{} {}->{}", m.m, m.n, m.k, m.ab, m.cr)).collect();
                        feats.push(format!("coop {}", shapes.join(" ")));
                    }
                    DeviceRow {
                        index: format!("{}{mark}", d.index),
                        name: g.name.clone(),
                        backend: g.backend.clone(),
                        device_type: format!("{}{}", g.device_type, if g.software { " (software)" } else { "" }),
                        ids: format!("{:04x}:{:04x}", g.vendor_id, g.device_id),
                        driver: format!("{} {}", g.driver, g.driver_info).trim().to_string(),
                        features: feats.join(", "),
                        limits: format!(
                            "wg mem {}, {} inv/wg, wg {}x{}x{}, binding {}, buffer {}",
                            bytes(c.max_workgroup_storage as u64),
                            c.max_invocations_per_workgroup,
                            c.max_workgroup_size[0],
                            c.max_workgroup_size[1],
                            c.max_workgroup_size[2],
                            bytes(c.max_storage_binding),
                            bytes(c.max_buffer_size)
                        ),
                        fingerprint: short(&d.fingerprint),
                    }
                }
                (_, _, Some(c)) => DeviceRow {
                    index: format!("{}{mark}", d.index),
                    name: c.model.clone(),
                    backend: "cpu".into(),
                    device_type: format!("Cpu ({})", c.arch),
                    ids: "-".into(),
                    driver: "-".into(),
                    features: c.features.join(" "),
                    limits: format!(
                        "{} threads, L1d {}, L2 {}, L3 {}",
                        c.threads,
                        bytes(c.cache_l1d),
                        bytes(c.cache_l2),
                        bytes(c.cache_l3)
                    ),
                    fingerprint: short(&d.fingerprint),
                },
                _ => DeviceRow {
                    index: d.index.to_string(),
                    name: d.name.clone(),
                    backend: d.backend.clone(),
                    device_type: d.device_type.clone(),
                    ids: "-".into(),
                    driver: "-".into(),
                    features: "-".into(),
                    limits: "-".into(),
                    fingerprint: short(&d.fingerprint),
                },
            }
        });
        let t = sharp_table(rows);
        format!("{t}\n* default device (--device picks another)")
    }
}
