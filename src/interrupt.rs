//! Ctrl-C never loses a run: `run` turns SIGINT and SIGTERM into a stop that keeps the log and
//! says how to resume, and the log directories it makes itself do not pile up in /tmp.
//!
//! Rules:
//!
//! 1. `run` prints where its log goes (`log dir: DIR` or `store: SPEC`) on stderr before the
//!    first task, once it is ready to handle a signal.
//! 2. While the run's tasks run, the first SIGINT or SIGTERM stops it (rule 7 of the runtime's
//!    `exec/mod.rs`): no task starts any more, those running finish, every vnode's log is
//!    synced, so its durable watermark covers every event logged, and the manifest says
//!    `Interrupted`. `run` then prints the exact command that resumes it (the command line as
//!    typed, plus `--log-dir DIR` when the directory was made for it, plus `--resume`) and
//!    exits with status 128 + the signal's number: 130 for SIGINT, 143 for SIGTERM.
//! 3. A second signal exits at once with the same status, after printing the same command: the
//!    log then holds what its last group commit made durable, and `--resume` finishes the run
//!    from it as it would after a crash.
//! 4. A run that logs nothing durable (`--no-checkpoint`, `--store memory`) stops the same way,
//!    and says that there is nothing to resume.
//! 5. Outside the run's tasks (before them, or while `--certify` works after them) a signal
//!    has its default effect: the process ends at once. The handler is installed once per
//!    process and stays (a handler removed would leave SIGINT ignored).
//! 6. A log directory that `run` made itself (no `--log-dir`, no `--store`) holds the marker
//!    file [`AUTO_MARKER`]. Such a directory is removed when its run finishes, resumed or not,
//!    with a right result (and ACCEPT, with `--certify`), unless `--keep-log` is given or the
//!    certificate was written to a file (`--cert-out`: a certificate is verified against its
//!    log). It is kept, and the summary says why, when the run stops, fails, or its result is
//!    wrong or rejected. One made for a run that fails before its first task (an option found
//!    wrong late, a store that does not open) is removed at once: it holds nothing.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use signal_hook::consts::{SIGINT, SIGTERM};
use veriflow_runtime::StopToken;

/// The marker file of a log directory made by `run` (rule 6).
pub(crate) const AUTO_MARKER: &str = "veriflow.auto";

/// The run the handler stops, if one is running (rules 2-3).
struct Current {
    /// The program's name, to begin messages with.
    program: &'static str,
    token: StopToken,
    /// The first signal received (0: none yet).
    signal: AtomicI32,
    /// What to print before exiting at once (rule 3).
    on_exit: String,
}

static CURRENT: Mutex<Option<Arc<Current>>> = Mutex::new(None);

/// The name of a signal the handler takes.
pub(crate) fn signal_name(signal: i32) -> &'static str {
    match signal {
        SIGINT => "SIGINT",
        SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}

/// The exit status after `signal` (rule 2).
pub(crate) fn exit_status(signal: i32) -> u8 {
    u8::try_from(128 + signal).unwrap_or(u8::MAX)
}

/// Installs the handler once (rule 5). Returns false if the system refused it: runs then end
/// at the first signal, as before.
fn install() -> bool {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    *INSTALLED.get_or_init(|| {
        let mut signals = match signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("cannot handle SIGINT and SIGTERM: {e}");
                return false;
            }
        };
        let spawned = std::thread::Builder::new()
            .name("veriflow-signals".to_string())
            .spawn(move || {
                for signal in signals.forever() {
                    on_signal(signal);
                }
            });
        spawned.is_ok()
    })
}

fn on_signal(signal: i32) {
    let current = CURRENT.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let Some(run) = current else {
        // Rule 5: no run to stop.
        if signal_hook::low_level::emulate_default_handler(signal).is_err() {
            std::process::exit(i32::from(exit_status(signal)));
        }
        return;
    };
    if run.signal.swap(signal, Ordering::SeqCst) == 0 {
        // Rule 2.
        run.token.stop();
        eprintln!(
            "{}: {}: stopping: no new task starts; making the log durable (again to exit at once)",
            run.program,
            signal_name(signal)
        );
    } else {
        // Rule 3.
        eprint!(
            "{}: {} again: {}",
            run.program,
            signal_name(signal),
            run.on_exit
        );
        std::process::exit(i32::from(exit_status(signal)));
    }
}

/// While alive, a signal stops the run that `token` stops (rules 2-3); dropping it restores
/// rule 5.
pub(crate) struct Guard(Arc<Current>);

impl Guard {
    /// Starts handling signals for one run; `on_exit` is printed if a second signal comes.
    pub(crate) fn start(program: &'static str, token: StopToken, on_exit: String) -> Guard {
        let current = Arc::new(Current {
            program,
            token,
            signal: AtomicI32::new(0),
            on_exit,
        });
        if install() {
            *CURRENT.lock().unwrap_or_else(|p| p.into_inner()) = Some(current.clone());
        }
        Guard(current)
    }

    /// The first signal received, if any.
    pub(crate) fn signal(&self) -> Option<i32> {
        Some(self.0.signal.load(Ordering::SeqCst)).filter(|&s| s != 0)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut slot = CURRENT.lock().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, &self.0)) {
            *slot = None;
        }
    }
}

/// The command that resumes the run typed as `argv` (rule 2): the same arguments, plus
/// `--log-dir DIR` if the directory was made for it, plus `--resume` unless there already.
pub(crate) fn resume_command(argv: &[OsString], made_dir: Option<&Path>) -> String {
    let mut words: Vec<String> = argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if let Some(dir) = made_dir {
        words.push("--log-dir".to_string());
        words.push(dir.display().to_string());
    }
    if !words.iter().skip(1).any(|w| w == "--resume") {
        words.push("--resume".to_string());
    }
    words
        .iter()
        .map(|w| shell_quote(w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `word` as a POSIX shell reads it back: bare when safe, else in single quotes.
fn shell_quote(word: &str) -> String {
    let safe = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-./=:,+@%".contains(&b));
    if safe {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Makes a fresh log directory in the temporary directory, with its marker (rule 6).
pub(crate) fn make_log_dir(program: &str) -> std::io::Result<PathBuf> {
    let dir = tempfile::Builder::new()
        .prefix(&format!("veriflow-{program}-"))
        .tempdir()?
        .keep();
    std::fs::write(
        dir.join(AUTO_MARKER),
        "made by `run` for its log; removed when the run finishes (unless --keep-log)\n",
    )?;
    Ok(dir)
}

/// Whether `dir` is a log directory made by `run` (rule 6).
pub(crate) fn is_auto(dir: &Path) -> bool {
    dir.join(AUTO_MARKER).is_file()
}

/// A directory made for a run that has not started: dropped before [`Unstarted::started`], it
/// removes the directory (rule 6). Declare it before the store, so that it drops after it.
pub(crate) struct Unstarted(Option<PathBuf>);

impl Unstarted {
    /// Guards `dir`, if one was made.
    pub(crate) fn new(dir: Option<PathBuf>) -> Unstarted {
        Unstarted(dir)
    }

    /// The run starts: from now on the directory holds it.
    pub(crate) fn started(&mut self) {
        self.0 = None;
    }
}

impl Drop for Unstarted {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = remove_log_dir(&dir);
        }
    }
}

/// Removes a log directory made by `run` (rule 6). The store was closed; its engine may still
/// let go of a file for a moment, so a directory that reappears is removed again, for at most
/// a second.
pub(crate) fn remove_log_dir(dir: &Path) -> std::io::Result<()> {
    let t0 = Instant::now();
    loop {
        match std::fs::remove_dir_all(dir) {
            Ok(()) if !dir.exists() => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if t0.elapsed() > Duration::from_secs(1) => return Err(e),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resume_command_is_the_command_line_with_the_log_and_resume() {
        let argv: Vec<OsString> = ["knary", "run", "--depth", "5", "--log-dir", "/tmp/a b"]
            .iter()
            .map(OsString::from)
            .collect();
        assert_eq!(
            resume_command(&argv, None),
            "knary run --depth 5 --log-dir '/tmp/a b' --resume"
        );
        let argv: Vec<OsString> = ["/x/knary", "run", "-n", "3", "--json"]
            .iter()
            .map(OsString::from)
            .collect();
        assert_eq!(
            resume_command(&argv, Some(Path::new("/tmp/veriflow-knary-x"))),
            "/x/knary run -n 3 --json --log-dir /tmp/veriflow-knary-x --resume"
        );
        let again: Vec<OsString> = ["knary", "run", "--resume", "--log-dir", "d"]
            .iter()
            .map(OsString::from)
            .collect();
        assert_eq!(
            resume_command(&again, None),
            "knary run --resume --log-dir d"
        );
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
