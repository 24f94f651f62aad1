//! `checkpoint-server`: serve fragments, make a key, or scrub a strategy.
//!
//! ```text
//! checkpoint-server --listen 127.0.0.1:7000 --data [ENGINE:]DIR --key FILE [--memory]
//!                   [--max-connections N] [--max-connections-per-peer N] [--memory-budget-mib M]
//! checkpoint-server keygen FILE
//! checkpoint-server scrub --store SPEC --key FILE [--json]
//! ```
//!
//! Exit status: 0 done; 1 an error (a key file that cannot be read, a server that cannot bind,
//! a store that cannot be reached; for `scrub`, a value that can no longer be rebuilt); 2 bad
//! usage (clap's own errors, and options that contradict each other); 3 `scrub` found the
//! strategy degraded but whole: every value can be read, yet fragments are missing or servers
//! unreachable (scrub again once they are back).
//!
//! `--data` is a directory of sled (a plain `DIR`, or `local:DIR`), or `fjall:DIR` or
//! `redb:DIR` for those engines (`store/mod.rs`, "Choosing the engine": fjall takes a third
//! of sled's CPU for a server's many small flushes). A directory keeps the engine it was
//! made with: name it the same way on every start.

use std::path::PathBuf;
use std::str::FromStr as _;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use veriflow_checkpoint::server::{Server, ServerConfig};
use veriflow_checkpoint::strategy::RemoteStore;
use veriflow_checkpoint::{open_store, Key, MemoryStore, Store, StoreSpec};

#[derive(Parser, Debug)]
#[command(
    name = "checkpoint-server",
    version,
    about = "veriflow checkpoint server: stores fragments of logs and blobs"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Address to listen on (port 0: any free port; the bound address is printed).
    #[arg(long)]
    listen: Option<String>,
    /// Where the fragments are kept: DIR (sled), local:DIR, fjall:DIR or redb:DIR.
    #[arg(long, value_name = "[ENGINE:]DIR")]
    data: Option<String>,
    /// Shared key file (create one with `checkpoint-server keygen FILE`).
    #[arg(long)]
    key: Option<PathBuf>,
    /// Keep fragments in RAM only (paper 002's diskless checkpoint): nothing survives a restart.
    #[arg(long)]
    memory: bool,
    /// Most open connections; extra ones are closed at once and logged.
    #[arg(long, default_value_t = ServerConfig::default().max_connections)]
    max_connections: usize,
    /// Most open connections from one IP address.
    #[arg(long, default_value_t = ServerConfig::default().max_connections_per_peer)]
    max_connections_per_peer: usize,
    /// MiB of request frames held at once over all connections (at least 64: one largest frame).
    #[arg(long, default_value_t = ServerConfig::default().memory_budget >> 20)]
    memory_budget_mib: usize,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Writes a fresh 32-byte key with owner-only permissions (never overwrites).
    Keygen {
        /// Where to write the key.
        file: PathBuf,
    },
    /// Checks every fragment of every key and rewrites the missing or corrupt ones.
    Scrub {
        /// The strategy to scrub, e.g. ida:4,2:HOST:PORT,...
        #[arg(long)]
        store: String,
        /// Shared key file.
        #[arg(long)]
        key: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// A command line that cannot be served as asked: exit 2.
#[derive(Debug)]
struct Usage(String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// `scrub` found fragments missing or servers unreachable, every value still readable: exit 3.
#[derive(Debug)]
struct Degraded(String);

impl std::fmt::Display for Degraded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Degraded {}

/// `--data`: a plain directory is sled's; an engine prefix names another (module docs).
fn data_spec(data: &str) -> Result<StoreSpec> {
    match StoreSpec::from_str(data) {
        Ok(spec @ (StoreSpec::Local(_) | StoreSpec::Redb(_) | StoreSpec::Fjall(_))) => Ok(spec),
        Ok(other) => Err(usage(format!(
            "--data {data}: a directory of this machine (DIR, local:DIR, fjall:DIR or redb:DIR), \
             not the store {other}"
        ))),
        Err(_) => Ok(StoreSpec::Local(PathBuf::from(data))),
    }
}

fn usage(why: impl Into<String>) -> anyhow::Error {
    Usage(why.into()).into()
}

fn main() {
    veriflow_checkpoint::logging::init_tracing();
    if let Err(e) = run() {
        if e.downcast_ref::<Usage>().is_some() {
            eprintln!("error: {e:#}\n\nFor more information, try '--help'.");
            std::process::exit(2);
        }
        eprintln!("error: {e:#}");
        std::process::exit(if e.downcast_ref::<Degraded>().is_some() {
            3
        } else {
            1
        });
    }
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Keygen { file }) => {
            Key::create(&file).with_context(|| format!("creating key {}", file.display()))?;
            println!("wrote key {}", file.display());
            Ok(())
        }
        Some(Command::Scrub { store, key, json }) => scrub(&store, &key, json),
        None => serve(cli),
    }
}

fn serve(cli: Cli) -> Result<()> {
    let listen = cli
        .listen
        .ok_or_else(|| usage("--listen ADDR is required to serve"))?;
    let key_path = cli
        .key
        .ok_or_else(|| usage("--key FILE is required to serve"))?;
    let key =
        Key::load(&key_path).with_context(|| format!("loading key {}", key_path.display()))?;
    let config = ServerConfig {
        max_connections: cli.max_connections,
        max_connections_per_peer: cli.max_connections_per_peer,
        memory_budget: cli.memory_budget_mib.saturating_mul(1 << 20),
        ..ServerConfig::default()
    };
    config
        .validate()
        .map_err(|e| usage(format!("checking the limits: {e}")))?;
    let store: Arc<dyn Store> = match (cli.memory, cli.data) {
        (true, None) => Arc::new(MemoryStore::default()),
        (true, Some(_)) => {
            return Err(usage(
                "--memory keeps fragments in RAM: drop --data, or drop --memory",
            ))
        }
        (false, Some(data)) => {
            let spec = data_spec(&data)?;
            open_store(&spec, None).with_context(|| format!("opening the data dir {spec}"))?
        }
        (false, None) => return Err(usage("--data DIR is required (or --memory for RAM only)")),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(async {
        let server = Server::bind_with(&listen, store, key, config)
            .await
            .with_context(|| format!("binding {listen}"))?;
        let addr = server.local_addr().context("reading the bound address")?;
        println!("listening on {addr}");
        use std::io::Write as _;
        std::io::stdout().flush().context("writing to stdout")?;
        server.run().await.context("serving")
    })
}

fn scrub(spec: &str, key_path: &std::path::Path, json: bool) -> Result<()> {
    let key = Key::load(key_path).with_context(|| format!("loading key {}", key_path.display()))?;
    let spec: StoreSpec = spec.parse().map_err(|e| usage(format!("--store: {e}")))?;
    let StoreSpec::Remote(remote) = spec else {
        return Err(usage(format!(
            "scrub checks fragments on checkpoint servers; {spec} has none (use central:, \
             replicate:, parity: or ida:)"
        )));
    };
    let store = RemoteStore::open(remote, key, Default::default())?;
    let report = store.scrub()?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("scrub of {}", report.store);
        println!("  keys:                {}", report.keys);
        println!("  fragments ok:        {}", report.fragments_ok);
        println!("  fragments repaired:  {}", report.fragments_repaired);
        println!("  fragments missing:   {}", report.fragments_missing);
        println!("  unrecoverable keys:  {}", report.unrecoverable.len());
        for k in &report.unrecoverable {
            println!("    {k}");
        }
        println!("  unreachable servers: {}", report.unreachable.len());
        for s in &report.unreachable {
            println!("    {s}");
        }
    }
    if !report.is_healthy() {
        bail!("{} keys cannot be rebuilt", report.unrecoverable.len());
    }
    if report.fragments_missing > 0 || !report.unreachable.is_empty() {
        return Err(Degraded(format!(
            "degraded: every value can be read, but {} fragments are missing and {} servers \
             unreachable; scrub again once they are back",
            report.fragments_missing,
            report.unreachable.len()
        ))
        .into());
    }
    Ok(())
}
