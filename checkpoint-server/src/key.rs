//! Secret keys: the checkpoint servers' and cluster's shared authentication key, and the
//! certifier oracle's key, whose 32 bytes are its Ed25519 secret key (the RFC 8032 seed; see
//! `veriflow_certifier::signing`).
//!
//! Rules:
//!
//! 1. A key file holds 32 random bytes written as 64 hex digits and a newline.
//! 2. A key file is created with owner-only permissions (0600) and never overwritten: writing to
//!    an existing path is an error, so a key in use cannot be lost by a typo.
//! 3. Loading refuses a file that group or others can read or write (as ssh does), a file of
//!    the wrong length and a file that is not hex, each with a message that says how to fix it.
//! 4. Loading reads only a regular file (a symlink to one is fine), and at most
//!    [`MAX_KEY_FILE_BYTES`] of it: a FIFO, socket, device or directory is refused before any
//!    byte is read, so a key path can never block a process or feed it an endless stream. The
//!    file is opened without blocking and checked through the open handle, so nothing can be
//!    swapped in between the check and the read.

use std::fmt;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

/// Largest key file read (rule 4): 64 hex digits and a newline fit many times over; a key
/// written by hand with a few blank lines or a comment-free CRLF still fits.
pub const MAX_KEY_FILE_BYTES: u64 = 1024;

/// A 32-byte secret key.
#[derive(Clone, PartialEq, Eq)]
pub struct Key([u8; 32]);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(..)") // never print a secret
    }
}

/// Why a key could not be created or loaded.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The file exists already (rule 2).
    #[error(
        "key file {0} exists already; refusing to overwrite it (delete it first if you mean to)"
    )]
    Exists(PathBuf),
    /// An I/O error on the key file.
    #[error("key file {path}: {reason}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// The file's permissions let others read it (rule 3).
    #[error(
        "key file {path} is accessible by group or others (mode {mode:o}); run `chmod 600 {path}`"
    )]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its mode bits.
        mode: u32,
    },
    /// The content is not 64 hex digits (rule 1).
    #[error("key file {path} is not a key: {reason} (expected 64 hex digits; create one with `keygen FILE`)")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The path is not a regular file (rule 4): a FIFO would block the reader forever.
    #[error("key file {path} is a {kind}, not a regular file; give the path of a key file written by `keygen FILE`")]
    NotAFile {
        /// The file.
        path: PathBuf,
        /// What it is instead ("FIFO", "directory", ...).
        kind: &'static str,
    },
    /// No config directory to put the default key in.
    #[error("no config directory for the default key: pass --key FILE")]
    NoConfigDir,
}

impl Key {
    /// A fresh random key from the operating system's generator.
    pub fn generate() -> Key {
        Key(random_bytes())
    }

    /// A key from its bytes (tests, derived keys).
    pub fn from_bytes(bytes: [u8; 32]) -> Key {
        Key(bytes)
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Writes a fresh key to `path` (rules 1-2) and returns it.
    pub fn create(path: &Path) -> Result<Key, KeyError> {
        let io = |e: std::io::Error| KeyError::Io {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        if path.exists() {
            return Err(KeyError::Exists(path.to_path_buf()));
        }
        // Written whole under a temporary name, then linked into place: a reader never sees a
        // half-written key, and a key that appeared meanwhile is not overwritten (rule 2).
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let key = Key::generate();
        let hex = crate::hex::encode(&key.0);
        let written = opts.open(&tmp).and_then(|mut file| {
            file.write_all(format!("{hex}\n").as_bytes())?;
            file.sync_all()
        });
        let linked = written.and_then(|()| std::fs::hard_link(&tmp, path));
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(KeyError::Exists(path.to_path_buf()))
            }
            Err(e) => return Err(io(e)),
        }
        Ok(key)
    }

    /// Loads the key in `path` (rules 3-4).
    pub fn load(path: &Path) -> Result<Key, KeyError> {
        let text = read_key_text(path, true)?;
        Key::parse_hex(text.trim()).map_err(|reason| KeyError::Malformed {
            path: path.to_path_buf(),
            reason,
        })
    }

    fn parse_hex(text: &str) -> Result<Key, String> {
        crate::hex::decode(text).map(Key).map_err(|e| e.to_string())
    }

    /// Where the default key of `purpose` lives: `<config dir>/veriflow/<purpose>.key`.
    pub fn default_path(purpose: &str) -> Result<PathBuf, KeyError> {
        let dir = dirs::config_dir().ok_or(KeyError::NoConfigDir)?;
        Ok(dir.join("veriflow").join(format!("{purpose}.key")))
    }

    /// Loads `path`, or when `path` is `None` the default key of `purpose`, creating it on
    /// first use (rules 1-2).
    pub fn load_or_default(path: Option<&Path>, purpose: &str) -> Result<(Key, PathBuf), KeyError> {
        match path {
            Some(p) => Ok((Key::load(p)?, p.to_path_buf())),
            None => {
                let p = Key::default_path(purpose)?;
                match Key::create(&p) {
                    Ok(k) => Ok((k, p)),
                    Err(KeyError::Exists(_)) => Ok((Key::load(&p)?, p)),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// A keyed blake3 MAC of `data` under this key, for `context` (a fixed string naming the
    /// use, so one key never authenticates two kinds of message alike).
    pub fn mac(&self, context: &str, data: &[u8]) -> [u8; 32] {
        let sub = blake3::derive_key(context, &self.0);
        *blake3::keyed_hash(&sub, data).as_bytes()
    }

    /// Whether `tag` is the MAC of `data` (constant time).
    pub fn verify(&self, context: &str, data: &[u8], tag: &[u8; 32]) -> bool {
        blake3::Hash::from(self.mac(context, data)) == blake3::Hash::from(*tag)
    }
}

/// Reads the text of a key file by rule 4, and by rule 3 too when `secret` (a public key, such
/// as the oracle's Ed25519 verifying key, may be readable by anyone).
pub fn read_key_text(path: &Path, secret: bool) -> Result<String, KeyError> {
    let io = |e: std::io::Error| KeyError::Io {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    // Rule 4: open without blocking (opening a FIFO for reading otherwise waits for a
    // writer), then check what the handle points at before reading a byte.
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NONBLOCK);
    }
    let file = opts.open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(KeyError::NotAFile {
            path: path.to_path_buf(),
            kind: file_kind(&meta.file_type()),
        });
    }
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Permissions {
                path: path.to_path_buf(),
                mode,
            });
        }
    }
    #[cfg(not(unix))]
    let _ = secret;
    let too_long = |len: u64| KeyError::Malformed {
        path: path.to_path_buf(),
        reason: format!("{len} bytes long, more than the {MAX_KEY_FILE_BYTES} a key file may be"),
    };
    if meta.len() > MAX_KEY_FILE_BYTES {
        return Err(too_long(meta.len()));
    }
    // The size read is bounded too, should the file grow after the check.
    let mut bytes = Vec::new();
    file.take(MAX_KEY_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_KEY_FILE_BYTES {
        return Err(too_long(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|_| KeyError::Malformed {
        path: path.to_path_buf(),
        reason: "not text".to_string(),
    })
}

/// `N` bytes from the operating system's random generator: keys, secrets and tokens (never a
/// seeded generator).
///
/// # Panics
///
/// When the operating system has no random generator to give (no `getrandom` nor
/// `/dev/urandom`): nothing secret can be made then.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    use rand::TryRng as _;
    let mut out = [0u8; N];
    rand::rngs::SysRng
        .try_fill_bytes(&mut out)
        .expect("the operating system's random generator failed");
    out
}

/// What a non-regular file is, for [`KeyError::NotAFile`].
fn file_kind(t: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "FIFO";
        }
        if t.is_socket() {
            return "socket";
        }
        if t.is_char_device() {
            return "character device";
        }
        if t.is_block_device() {
            return "block device";
        }
    }
    if t.is_dir() {
        "directory"
    } else {
        "special file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_load_and_refuse_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/k.key");
        let k = Key::create(&p).unwrap();
        assert_eq!(Key::load(&p).unwrap(), k);
        assert!(matches!(Key::create(&p), Err(KeyError::Exists(_))));
        assert_eq!(Key::load(&p).unwrap(), k, "a refused create keeps the key");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
            let e = Key::load(&p).unwrap_err();
            assert!(e.to_string().contains("chmod 600"), "{e}");
        }
    }

    #[test]
    fn malformed_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        for (name, body) in [("short", "abcd\n"), ("nothex", &"zz".repeat(32)[..])] {
            let p = dir.path().join(name);
            std::fs::write(&p, body).unwrap();
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
            }
            let e = Key::load(&p).unwrap_err();
            assert!(matches!(e, KeyError::Malformed { .. }), "{e}");
        }
    }

    #[cfg(unix)]
    fn owner_only(p: &Path) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    /// Issue 13 point 6: a FIFO given as a key file blocked `load` forever (opening it for
    /// reading waits for a writer). It must be refused at once, naming what it is.
    #[cfg(unix)]
    #[test]
    fn a_fifo_key_file_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("key.fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("run mkfifo");
        assert!(made.success(), "mkfifo failed");
        owner_only(&fifo); // so that only the file type can be the reason
                           // Guard against the hang this test reproduces: run the load on its own thread, and if
                           // it blocks, open the FIFO for writing to release it so the test fails instead.
        let (tx, rx) = std::sync::mpsc::channel();
        let p = fifo.clone();
        let loader = std::thread::spawn(move || tx.send(Key::load(&p)).unwrap());
        let r = match rx.recv_timeout(std::time::Duration::from_secs(30)) {
            Ok(r) => r,
            Err(_) => {
                let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
                loader.join().unwrap();
                panic!("Key::load blocked on a FIFO");
            }
        };
        let e = r.expect_err("a FIFO is not a key file");
        assert!(
            matches!(e, KeyError::NotAFile { kind: "FIFO", .. }),
            "{e:?}"
        );
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn a_symlink_to_a_key_loads_and_directories_and_big_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.key");
        let k = Key::create(&real).unwrap();
        let link = dir.path().join("link.key");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(
            Key::load(&link).unwrap(),
            k,
            "a symlink to a regular file is fine"
        );

        let sub = dir.path().join("d");
        std::fs::create_dir(&sub).unwrap();
        owner_only(&sub);
        let e = Key::load(&sub).unwrap_err();
        assert!(
            matches!(
                e,
                KeyError::NotAFile {
                    kind: "directory",
                    ..
                }
            ),
            "{e:?}"
        );

        let big = dir.path().join("big.key");
        std::fs::write(&big, vec![b'a'; 4096]).unwrap();
        owner_only(&big);
        let e = Key::load(&big).unwrap_err();
        assert!(matches!(e, KeyError::Malformed { .. }), "{e:?}");
    }

    #[test]
    fn mac_depends_on_key_context_and_data() {
        let a = Key::from_bytes([1; 32]);
        let b = Key::from_bytes([2; 32]);
        let t = a.mac("ctx", b"data");
        assert!(a.verify("ctx", b"data", &t));
        assert!(!b.verify("ctx", b"data", &t));
        assert!(!a.verify("other", b"data", &t));
        assert!(!a.verify("ctx", b"datb", &t));
    }
}
