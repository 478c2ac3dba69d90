use clap::Parser;
use std::io::Write;

fn main() {
    quiet_headless_egl();
    let cli = ktune::cli::Cli::parse();
    let code = match ktune::app::dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            let mut msg = format!("ktune: {e}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(&format!("\n  caused by: {s}"));
                src = s.source();
            }
            // A stderr that cannot be written (a full disk) leaves the exit code to say it.
            let _ = writeln!(std::io::stderr(), "{msg}");
            e.exit_code()
        }
    };
    std::process::exit(code.into());
}

/// On a headless machine Mesa's EGL (probed by wgpu's GL backend) tries Wayland and
/// prints "XDG_RUNTIME_DIR is invalid or not set" to stderr. Without a display there
/// is nothing to connect to, so point it at the temp dir to keep stderr clean.
fn quiet_headless_egl() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() && std::env::var_os("WAYLAND_DISPLAY").is_none() {
        // SAFETY: called first thing in main, before any thread exists.
        unsafe { std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir()) };
    }
}
