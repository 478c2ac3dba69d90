use clap::Parser;

fn main() {
    let cli = ktune::cli::Cli::parse();
    match ktune::commands::dispatch(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            let mut msg = format!("ktune: {e}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(&format!("\n  caused by: {s}"));
                src = s.source();
            }
            eprintln!("{msg}");
            std::process::exit(e.exit_code());
        }
    }
}
