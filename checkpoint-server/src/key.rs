//! Shared secret keys: the checkpoint servers' and cluster's authentication key and the
//! certifier oracle's MAC key.
//!
//! Rules:
//!
//! 1. A key file holds 32 random bytes written as 64 hex digits and a newline.
//! 2. A key file is created with owner-only permissions (0600) and never overwritten: writing to
//!    an existing path is an error, so a key in use cannot be lost by a typo.
//! 3. Loading refuses a file that group or others can read or write (as ssh does), a file of
//!    the wrong length and a file that is not hex, each with a message that says how to fix it.

use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use rand::RngCore;

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
    /// No config directory to put the default key in.
    #[error("no config directory for the default key: pass --key FILE")]
    NoConfigDir,
}

impl Key {
    /// A fresh random key from the operating system's generator.
    pub fn generate() -> Key {
        let mut k = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut k);
        Key(k)
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
        let hex: String = key.0.iter().map(|b| format!("{b:02x}")).collect();
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

    /// Loads the key in `path` (rule 3).
    pub fn load(path: &Path) -> Result<Key, KeyError> {
        let io = |e: std::io::Error| KeyError::Io {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(KeyError::Permissions {
                    path: path.to_path_buf(),
                    mode,
                });
            }
        }
        if meta.len() > 1024 {
            return Err(KeyError::Malformed {
                path: path.to_path_buf(),
                reason: format!("{} bytes long", meta.len()),
            });
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        Key::parse_hex(text.trim()).map_err(|reason| KeyError::Malformed {
            path: path.to_path_buf(),
            reason,
        })
    }

    fn parse_hex(text: &str) -> Result<Key, String> {
        if text.len() != 64 {
            return Err(format!("{} characters", text.len()));
        }
        let mut k = [0u8; 32];
        for (i, chunk) in text.as_bytes().chunks(2).enumerate() {
            let s = std::str::from_utf8(chunk).map_err(|_| "not text".to_string())?;
            k[i] = u8::from_str_radix(s, 16).map_err(|_| format!("{s:?} is not hex"))?;
        }
        Ok(Key(k))
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
