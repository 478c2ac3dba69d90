//! Device faults: what went wrong on a GPU device outside an error scope (an
//! uncaptured error, which wgpu's default handler would turn into a panic, and
//! the loss of the device), recorded by the callbacks [`Faults::install`] sets and
//! turned into a typed [`GpuError`] at the next sync point
//! ([`GpuCtx::wait_for`](super::GpuCtx::wait_for)); and the hidden, test-only
//! fault injection `KTUNE_FAULT`, read here and nowhere else, which makes the
//! context call wgpu's real API so that the real error paths run:
//!
//! - `device-lost@submit:N`: `Device::destroy()` just before the N-th submit.
//! - `bad-shader:NAME`: the shaders whose own file is NAME (`.wgsl` optional) are
//!   built from their source with a line naga rejects appended (a driver
//!   rejecting a kernel).
//! - `limit:BYTES`: the device is opened with `max_buffer_size` and
//!   `max_storage_buffer_binding_size` at BYTES (an adapter that allows less).

use std::sync::{Arc, Mutex};

use super::GpuError;

/// The environment variable of the fault injection (see the module doc).
pub const FAULT_ENV: &str = "KTUNE_FAULT";

/// A fault to inject, parsed from [`FAULT_ENV`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inject {
    /// Destroy the device before this submit (1-based).
    LostAtSubmit(u64),
    /// Shaders whose own file is this (`.wgsl` optional) are built invalid.
    BadShader(String),
    /// The device's buffer and storage-binding size limit, in bytes.
    Limit(u64),
}

impl Inject {
    /// The fault [`FAULT_ENV`] names, if set; an unknown form is an error naming
    /// the forms.
    pub fn from_env() -> Result<Option<Inject>, GpuError> {
        match std::env::var(FAULT_ENV) {
            Ok(s) if !s.is_empty() => Inject::parse(&s).map(Some),
            _ => Ok(None),
        }
    }

    fn parse(s: &str) -> Result<Inject, GpuError> {
        let bad = || {
            GpuError::Fault(format!(
                "{FAULT_ENV}={s:?} is not a fault; give `device-lost@submit:N`, `bad-shader:NAME` or `limit:BYTES`, or unset it"
            ))
        };
        if let Some(n) = s.strip_prefix("device-lost@submit:") {
            return n.parse().ok().filter(|n| *n > 0).map(Inject::LostAtSubmit).ok_or_else(bad);
        }
        if let Some(name) = s.strip_prefix("bad-shader:").filter(|n| !n.is_empty()) {
            return Ok(Inject::BadShader(name.to_string()));
        }
        if let Some(b) = s.strip_prefix("limit:") {
            return b.parse().ok().filter(|b| *b >= 16).map(Inject::Limit).ok_or_else(bad);
        }
        Err(bad())
    }

    /// `source` as the device builds shader `name`: with a line naga rejects
    /// appended when this fault names it.
    pub(crate) fn shader_source(this: Option<&Inject>, name: &str, source: &'static str) -> std::borrow::Cow<'static, str> {
        match this {
            Some(Inject::BadShader(n)) if name == n || name.strip_suffix(".wgsl") == Some(n) => {
                format!("{source}\nfn injected_fault() -> u32 {{ return undeclared_name; }}\n").into()
            }
            _ => source.into(),
        }
    }
}

/// A wgpu error on one line: its causes' lines joined by `; `, without the
/// headings and the source excerpt naga draws under a shader error.
pub fn describe(e: &wgpu::Error) -> String {
    let text = e.to_string();
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with('┌'))
        .filter(|l| !l.is_empty() && *l != "Caused by:" && *l != "Validation Error")
        .collect();
    if lines.is_empty() { text } else { lines.join("; ") }
}

/// What the device's callbacks saw: its loss (kept: a lost device stays lost)
/// and the first uncaptured error since the last sync point.
#[derive(Debug, Default)]
pub struct Faults {
    lost: Option<String>,
    uncaptured: Option<GpuError>,
}

impl Faults {
    /// Installs the callbacks that record into a new [`Faults`] on `device`: the
    /// uncaptured-error handler (instead of wgpu's default, which panics) and the
    /// device-lost callback.
    pub fn install(device: &wgpu::Device) -> Arc<Mutex<Faults>> {
        let faults = Arc::new(Mutex::new(Faults::default()));
        let f = faults.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let mut f = f.lock().unwrap_or_else(|p| p.into_inner());
            if f.uncaptured.is_none() {
                f.uncaptured = Some(match e {
                    wgpu::Error::OutOfMemory { source } => {
                        GpuError::OutOfMemory { what: "running on the GPU".into(), message: source.to_string() }
                    }
                    other => GpuError::Uncaptured(describe(&other)),
                });
            }
        }));
        let f = faults.clone();
        device.set_device_lost_callback(move |reason, message| {
            let why = match reason {
                wgpu::DeviceLostReason::Destroyed => {
                    format!("destroyed{}", if message.is_empty() { String::new() } else { format!(": {message}") })
                }
                wgpu::DeviceLostReason::Unknown => {
                    if message.is_empty() {
                        "reason unknown".to_string()
                    } else {
                        message
                    }
                }
            };
            f.lock().unwrap_or_else(|p| p.into_inner()).lost = Some(why);
        });
        faults
    }

    /// The device's loss, if it was lost.
    pub fn lost(this: &Mutex<Faults>) -> Option<GpuError> {
        this.lock().unwrap_or_else(|p| p.into_inner()).lost.clone().map(GpuError::DeviceLost)
    }

    /// The device's loss, else the uncaptured error recorded since the last
    /// call (taken), else Ok.
    pub fn check(this: &Mutex<Faults>) -> Result<(), GpuError> {
        let mut f = this.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(why) = &f.lost {
            return Err(GpuError::DeviceLost(why.clone()));
        }
        f.uncaptured.take().map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_and_unknown_forms_name_the_known_ones() {
        assert_eq!(Inject::parse("device-lost@submit:3").ok(), Some(Inject::LostAtSubmit(3)));
        assert_eq!(Inject::parse("bad-shader:rmsnorm").ok(), Some(Inject::BadShader("rmsnorm".into())));
        assert_eq!(Inject::parse("limit:4096").ok(), Some(Inject::Limit(4096)));
        for bad in ["device-lost@submit:0", "device-lost@submit:x", "bad-shader:", "limit:8", "oom", "nonsense"] {
            let e = Inject::parse(bad).expect_err(bad).to_string();
            assert!(e.contains("device-lost@submit:N") && e.contains("unset it"), "{bad}: {e}");
        }
        let bad = Some(Inject::BadShader("norm_rms".into()));
        assert!(Inject::shader_source(bad.as_ref(), "norm_rms.wgsl", "fn main() {}").contains("undeclared_name"));
        assert!(Inject::shader_source(Some(&Inject::BadShader("norm_rms.wgsl".into())), "norm_rms.wgsl", "").contains("undeclared_name"));
        assert_eq!(Inject::shader_source(bad.as_ref(), "norm_rms_wg.wgsl", "x"), "x", "another file that starts alike");
        assert_eq!(Inject::shader_source(None, "rmsnorm.wgsl", "x"), "x");
    }
}
