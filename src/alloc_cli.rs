//! `APP alloc slurm|list|cancel`: workers from Slurm allocations (`veriflow_cluster::alloc`).
//! This file parses and prints; the decisions are `AutoAlloc`'s, the Slurm calls the driver's.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand, ValueEnum};
use veriflow_checkpoint::Key;
use veriflow_cluster::alloc::slurm::{Per, Slurm, SlurmSpec};
use veriflow_cluster::alloc::{parse_time_limit, Allocation, AutoAlloc, Demand, Pool, Role, Step};

use crate::app::CliError;

#[derive(Args, Debug)]
pub(crate) struct AllocArgs {
    #[command(subcommand)]
    command: AllocCommand,
}

#[derive(Subcommand, Debug)]
enum AllocCommand {
    /// Submit Slurm allocations, each one worker joining the coordinator; with --watch, keep
    /// them queued or running while the coordinator has work.
    Slurm(SlurmArgs),
    /// List this program's allocations, ended ones too while Slurm keeps them.
    List(ListArgs),
    /// Cancel allocations by id, or all of this program's.
    Cancel(CancelArgs),
}

/// One worker per Slurm task or per node.
#[derive(ValueEnum, Debug, Clone, Copy)]
enum PerArg {
    /// One task of --threads CPUs; allocations share nodes.
    Task,
    /// A whole node (--exclusive); the worker takes all its CPUs unless --threads says.
    Node,
}

#[derive(Args, Debug)]
struct SlurmArgs {
    /// The coordinators' addresses the workers join (as reachable from the compute nodes).
    #[arg(long, value_name = "ADDR,...", value_delimiter = ',', required = true)]
    coordinator: Vec<String>,
    /// The cluster's key file, on a file system the compute nodes share.
    #[arg(long, value_name = "FILE")]
    key: PathBuf,
    /// Worker allocations.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    workers: u32,
    /// Spare allocations (workers idle until a lost worker's vnodes need a host).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=4096))]
    spares: u32,
    /// Threads of each worker [default: 1 per task, the node's CPUs per node].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    threads: Option<u32>,
    /// One worker per Slurm task or per node.
    #[arg(long, value_enum, default_value = "task")]
    per: PerArg,
    /// Each allocation's time limit: 90s, 30m, 1h, 1h30m, 2d, or minutes [default: the
    /// partition's].
    #[arg(long, value_name = "TIME", value_parser = parse_time_limit)]
    time_limit: Option<Duration>,
    /// The address workers listen on for their peers [default: the node's hostname].
    #[arg(long, value_name = "HOST")]
    worker_host: Option<String>,
    /// Where Slurm writes each allocation's output (veriflow-APP-JOBID.log).
    #[arg(long, value_name = "DIR", default_value = ".")]
    log_dir: PathBuf,
    /// Keep the allocations queued or running, resubmitting those that end while the
    /// coordinator has a job or submissions waiting; runs until interrupted.
    #[arg(long)]
    watch: bool,
    /// How often --watch looks at Slurm and the coordinator, in seconds.
    #[arg(long, value_name = "S", default_value_t = 5, requires = "watch",
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    watch_interval: u64,
    /// More sbatch arguments (after `--`), e.g. `-- --partition=long --account=proj`.
    #[arg(last = true, value_name = "SBATCH ARGS")]
    sbatch: Vec<String>,
}

#[derive(Args, Debug)]
struct ListArgs {
    /// Only the allocations joining these coordinators (as given to `alloc slurm`).
    #[arg(long, value_name = "ADDR,...")]
    coordinator: Option<String>,
    /// Print a JSON array instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["ids", "all"])))]
struct CancelArgs {
    /// Slurm job ids of allocations.
    #[arg(value_name = "ID")]
    ids: Vec<String>,
    /// Every allocation of this program (with --coordinator: of those coordinators).
    #[arg(long)]
    all: bool,
    /// With --all: only the allocations joining these coordinators.
    #[arg(long, value_name = "ADDR,...", requires = "all")]
    coordinator: Option<String>,
}

/// `APP alloc ...`.
pub(crate) fn alloc_cmd(args: &AllocArgs, program: &'static str) -> Result<(), CliError> {
    match &args.command {
        AllocCommand::Slurm(a) => slurm_cmd(a, program),
        AllocCommand::List(a) => list_cmd(a, program),
        AllocCommand::Cancel(a) => cancel_cmd(a, program),
    }
}

/// Prints a line and flushes it (a script or test reads them as they come).
fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

fn absolute(path: &Path, what: &'static str) -> Result<PathBuf, CliError> {
    std::path::absolute(path).map_err(|source| CliError::Io {
        what,
        path: path.to_path_buf(),
        source,
    })
}

fn slurm_cmd(args: &SlurmArgs, program: &'static str) -> Result<(), CliError> {
    let key = Key::load(&args.key)?;
    std::fs::create_dir_all(&args.log_dir).map_err(|source| CliError::Io {
        what: "cannot create the log directory",
        path: args.log_dir.clone(),
        source,
    })?;
    let spec = SlurmSpec {
        program: program.to_string(),
        exe: std::env::current_exe()
            .map_err(|e| CliError::Invalid(format!("cannot find this program's binary: {e}")))?,
        coordinators: args.coordinator.clone(),
        key: absolute(&args.key, "cannot resolve the key file")?,
        threads: args.threads,
        per: match args.per {
            PerArg::Task => Per::Task,
            PerArg::Node => Per::Node,
        },
        time_limit: args.time_limit,
        worker_host: args.worker_host.clone(),
        log_dir: absolute(&args.log_dir, "cannot resolve the log directory")?,
        extra: args.sbatch.clone(),
    };
    let pool = Pool {
        workers: args.workers,
        spares: args.spares,
    };
    let slurm = Slurm;
    if !args.watch {
        // Exactly what was asked, whatever is there already.
        return submit(&slurm, &spec, pool, None);
    }
    let coordinators = spec.coordinators.join(",");
    let mut auto = AutoAlloc::new(pool);
    let start = Instant::now();
    let mut first = true;
    loop {
        let allocs = match slurm.list(program) {
            Ok(a) => a
                .into_iter()
                .filter(|a| a.coordinator == coordinators)
                .collect::<Vec<_>>(),
            Err(e) if first => return Err(e.into()),
            Err(e) => {
                // A controller that is busy or restarting: the next round asks again.
                eprintln!("{program}: alloc: squeue failed, trying again next round: {e}");
                std::thread::sleep(Duration::from_secs(args.watch_interval));
                continue;
            }
        };
        first = false;
        let demand = demand(&spec.coordinators, &key);
        match auto.tick(start.elapsed(), &allocs, demand) {
            Step::Wait => {}
            Step::Submit(need) => submit(&slurm, &spec, need, Some((&mut auto, start)))?,
            Step::Stop(why) => {
                return Err(CliError::Invalid(format!(
                    "alloc: stopped keeping the allocations: {why}; their logs are in {}",
                    spec.log_dir.display()
                )))
            }
        }
        std::thread::sleep(Duration::from_secs(args.watch_interval));
    }
}

/// Submits `need`, printing each allocation's id. Without `auto`, the first refusal is the
/// command's error; with it, each result goes to the decisions and a refusal ends the round.
fn submit(
    slurm: &Slurm,
    spec: &SlurmSpec,
    need: Pool,
    mut auto: Option<(&mut AutoAlloc, Instant)>,
) -> Result<(), CliError> {
    let roles = std::iter::repeat_n(Role::Worker, need.workers as usize)
        .chain(std::iter::repeat_n(Role::Spare, need.spares as usize));
    for role in roles {
        let result = slurm.submit(spec, role);
        match (&result, &mut auto) {
            (Ok(id), _) => say(&format!("allocation {id} submitted ({role})")),
            (Err(e), Some(_)) => eprintln!("{}: alloc: sbatch failed: {e}", spec.program),
            (Err(_), None) => {}
        }
        match &mut auto {
            Some((a, start)) => {
                let failed = result.is_err();
                a.submitted(start.elapsed(), result.map_err(|e| e.to_string()));
                if failed {
                    break;
                }
            }
            None => {
                result?;
            }
        }
    }
    Ok(())
}

/// What the active one of `coordinators` needs (`alloc` rule 4): the first active answer.
fn demand(coordinators: &[String], key: &Key) -> Demand {
    coordinators
        .iter()
        .filter_map(|c| veriflow_cluster::status(c, key).ok())
        .map(|s| Demand::of(&s))
        .find(|d| *d != Demand::Unknown)
        .unwrap_or(Demand::Unknown)
}

/// This program's allocations, only those of `coordinator` if given.
fn ours(program: &str, coordinator: Option<&str>) -> Result<Vec<Allocation>, CliError> {
    let all = Slurm.list(program)?;
    Ok(all
        .into_iter()
        .filter(|a| coordinator.is_none_or(|c| a.coordinator == c))
        .collect())
}

fn list_cmd(args: &ListArgs, program: &'static str) -> Result<(), CliError> {
    let allocs = ours(program, args.coordinator.as_deref())?;
    if args.json {
        let text = serde_json::to_string(&allocs)
            .map_err(|e| CliError::Invalid(format!("cannot print the allocations: {e}")))?;
        say(&text);
        return Ok(());
    }
    if allocs.is_empty() {
        say(&format!("no {program} allocations"));
        return Ok(());
    }
    say(&format!(
        "{:>10}  {:<6}  {:<11}  {:>10}  {:>10}  {:<16}  coordinator",
        "id", "role", "state", "time", "limit", "where"
    ));
    for a in &allocs {
        say(&format!(
            "{:>10}  {:<6}  {:<11}  {:>10}  {:>10}  {:<16}  {}",
            a.id, a.role, a.raw_state, a.time, a.time_limit, a.nodes, a.coordinator
        ));
    }
    Ok(())
}

fn cancel_cmd(args: &CancelArgs, program: &'static str) -> Result<(), CliError> {
    let ids: Vec<String> = if args.all {
        // Those that still count: scancel refuses an ended one.
        ours(program, args.coordinator.as_deref())?
            .into_iter()
            .filter(Allocation::counts)
            .map(|a| a.id)
            .collect()
    } else {
        for id in &args.ids {
            if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit() || c == '_') {
                return Err(CliError::Usage(format!(
                    "{id:?} is not a Slurm job id (see `{program} alloc list`)"
                )));
            }
        }
        args.ids.clone()
    };
    Slurm.cancel(&ids)?;
    say(&format!(
        "cancelled {} allocation(s){}{}",
        ids.len(),
        if ids.is_empty() { "" } else { ": " },
        ids.join(" ")
    ));
    Ok(())
}
