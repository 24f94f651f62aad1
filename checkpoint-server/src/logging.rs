//! The `VERIFLOW_LOG` subscriber every veriflow binary installs (the checkpoint server's and
//! the apps'), so that one filter means the same everywhere.
//!
//! Rules:
//!
//! 1. `VERIFLOW_LOG` is a `tracing` filter (`info`, `debug`, `veriflow_runtime=trace`, ...);
//!    unset or invalid, only warnings and errors show (refused clients among them).
//! 2. sled's own lines stay at `warn` unless the filter names `sled`: its debug output would
//!    drown veriflow's.
//! 3. Lines go to stderr, coloured only when stderr is a terminal: a redirected stderr (a
//!    process log) stays plain text.

/// Installs the subscriber (rules 1-3); a second call, or a subscriber already installed, is
/// left alone.
pub fn init_tracing() {
    let asked = std::env::var("VERIFLOW_LOG").unwrap_or_default();
    let filter = tracing_subscriber::EnvFilter::try_from_env("VERIFLOW_LOG")
        .map(|f| {
            if asked.contains("sled") {
                f
            } else {
                f.add_directive("sled=warn".parse().expect("a valid directive"))
            }
        })
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}
