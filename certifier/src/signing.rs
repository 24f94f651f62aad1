//! The oracle's key pair: certificates are signed with Ed25519, so that anyone who holds the
//! oracle's public key can verify them, and only the oracle can make them.
//!
//! Rules:
//!
//! 1. The oracle's key file is a secret key file of `veriflow_checkpoint::key` (64 hex digits,
//!    owner-only, never overwritten; `APP keygen FILE`). Its 32 bytes are the oracle's Ed25519
//!    secret key (RFC 8032's seed). They are also the keyed-blake3 MAC key of format-1
//!    certificates (`certificate.rs` rule 3), so a key made before signatures still verifies
//!    the certificates it made then.
//! 2. A public key file holds one line: `ed25519:` and the 32-byte public key in 64 hex digits
//!    (`APP public-key`, or `APP keygen FILE --public PUB`). It is read like a key file (a
//!    regular file of at most 1 KiB, never blocking: rule 4 of the key module) but may be
//!    readable by anyone. A file without the prefix is refused: 64 bare hex digits are what a
//!    *secret* key file holds, and a secret key must not travel where a public key goes.
//! 3. Writing a public key file never replaces another key: a file that holds the same key is
//!    left as it is, one that holds anything else is an error.
//! 4. A key's fingerprint, `ed25519:` and the first 16 hex digits of the public key, names it in
//!    messages; verification always compares whole keys.
//!
//! ```text
//! $ knary keygen oracle.key --public oracle.pub
//! $ cat oracle.pub
//! ed25519:<64 hex digits>
//! ```

use std::fmt;
use std::path::{Path, PathBuf};

use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use veriflow_checkpoint::key::read_key_text;
use veriflow_checkpoint::{Key, KeyError};

/// The name of the signature scheme, as certificates and public key files write it.
pub const SCHEME: &str = "ed25519";

/// The oracle's secret key: signs certificates (rule 1).
pub struct OracleKey {
    secret: Key,
    signing: SigningKey,
}

impl fmt::Debug for OracleKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OracleKey({})", self.public().fingerprint()) // never the secret
    }
}

impl From<Key> for OracleKey {
    fn from(secret: Key) -> Self {
        let signing = SigningKey::from_bytes(secret.as_bytes());
        OracleKey { secret, signing }
    }
}

impl OracleKey {
    /// The public key that verifies this key's signatures.
    pub fn public(&self) -> OraclePublicKey {
        OraclePublicKey(self.signing.verifying_key())
    }

    /// Signs `message`.
    pub(crate) fn sign(&self, message: &[u8]) -> Signature {
        self.signing.sign(message)
    }

    /// The key as the MAC key of format-1 certificates (rule 1).
    pub(crate) fn mac_key(&self) -> &Key {
        &self.secret
    }
}

/// The oracle's public key: verifies certificates (rule 2).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct OraclePublicKey(VerifyingKey);

impl fmt::Debug for OraclePublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OraclePublicKey({})", self.fingerprint())
    }
}

/// `ed25519:` and the key in hex, as a public key file holds it (without the newline).
impl fmt::Display for OraclePublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}:{}", self.to_hex())
    }
}

/// Why a public key could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum PublicKeyError {
    /// The file cannot be read (missing, not a regular file, too long, not text).
    #[error(transparent)]
    File(#[from] KeyError),
    /// The file holds no public key (rule 2).
    #[error("public key file {path} is not an oracle public key: {reason} (expected `ed25519:` and 64 hex digits; write one with `public-key --out FILE`)")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The file exists and holds something else (rule 3).
    #[error("public key file {0} exists already and holds another key; refusing to overwrite it")]
    Exists(PathBuf),
    /// The file cannot be written.
    #[error("public key file {path}: {reason}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
}

impl OraclePublicKey {
    /// The key from its 32 bytes; `None` if they are not a point of the curve.
    pub fn from_bytes(bytes: &[u8; 32]) -> Option<OraclePublicKey> {
        VerifyingKey::from_bytes(bytes).ok().map(OraclePublicKey)
    }

    /// The key's 32 bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    /// The key as 64 hex digits.
    pub fn to_hex(&self) -> String {
        veriflow_checkpoint::hex::encode(self.0.as_bytes())
    }

    /// The key from 64 hex digits.
    pub fn from_hex(text: &str) -> Result<OraclePublicKey, String> {
        let bytes = veriflow_checkpoint::hex::decode::<32>(text).map_err(|e| e.to_string())?;
        OraclePublicKey::from_bytes(&bytes)
            .ok_or_else(|| "not a valid Ed25519 public key".to_string())
    }

    /// Rule 4: `ed25519:` and the first 16 hex digits.
    pub fn fingerprint(&self) -> String {
        format!("{SCHEME}:{}", &self.to_hex()[..16])
    }

    /// The key from the text of a public key file (rule 2).
    pub fn parse(text: &str) -> Result<OraclePublicKey, String> {
        let text = text.trim();
        match text.split_once(':') {
            Some((SCHEME, hex)) => OraclePublicKey::from_hex(hex.trim()),
            Some((scheme, _)) => Err(format!(
                "scheme {scheme:?}, this version reads {SCHEME:?} keys"
            )),
            None if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) => Err(
                "64 bare hex digits are a secret key file; give the oracle's public key"
                    .to_string(),
            ),
            None => Err("no `ed25519:` prefix".to_string()),
        }
    }

    /// Reads a public key file (rule 2).
    pub fn load(path: &Path) -> Result<OraclePublicKey, PublicKeyError> {
        let text = read_key_text(path, false)?;
        OraclePublicKey::parse(&text).map_err(|reason| PublicKeyError::Malformed {
            path: path.to_path_buf(),
            reason,
        })
    }

    /// Writes the key to `path` (rules 2-3).
    pub fn write(&self, path: &Path) -> Result<(), PublicKeyError> {
        let io = |e: std::io::Error| PublicKeyError::Io {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        if path.exists() {
            return match OraclePublicKey::load(path) {
                Ok(k) if k == *self => Ok(()),
                _ => Err(PublicKeyError::Exists(path.to_path_buf())),
            };
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        // Whole under a temporary name, then linked into place: a reader never sees half a
        // key, and a file that appeared meanwhile is not replaced (rule 3).
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let linked =
            std::fs::write(&tmp, format!("{self}\n")).and_then(|()| std::fs::hard_link(&tmp, path));
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                Err(PublicKeyError::Exists(path.to_path_buf()))
            }
            Err(e) => Err(io(e)),
        }
    }

    /// Whether `signature` is this key's signature of `message` (strict RFC 8032 checks: no
    /// small-order keys, no malleable signatures).
    pub(crate) fn verify(&self, message: &[u8], signature: &Signature) -> bool {
        self.0.verify_strict(message, signature).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> OracleKey {
        OracleKey::from(Key::from_bytes([b; 32]))
    }

    #[test]
    fn public_key_text_round_trips_and_secret_keys_are_refused() {
        let k = key(3).public();
        let text = format!("{k}\n");
        assert!(text.starts_with("ed25519:"));
        assert_eq!(OraclePublicKey::parse(&text).unwrap(), k);
        assert_eq!(k.fingerprint().len(), "ed25519:".len() + 16);
        let bare = "ab".repeat(32);
        let e = OraclePublicKey::parse(&bare).unwrap_err();
        assert!(e.contains("secret key"), "{e}");
        assert!(OraclePublicKey::parse("rsa:abcd").is_err());
        assert!(OraclePublicKey::parse("ed25519:abcd").is_err());
        assert!(OraclePublicKey::parse(&format!("ed25519:{}", "zz".repeat(32))).is_err());
    }

    #[test]
    fn a_public_key_file_is_written_once_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/oracle.pub");
        let k = key(4).public();
        k.write(&p).unwrap();
        assert_eq!(OraclePublicKey::load(&p).unwrap(), k);
        k.write(&p).expect("the same key again is fine");
        let e = key(5).public().write(&p).unwrap_err();
        assert!(matches!(e, PublicKeyError::Exists(_)), "{e}");
        assert_eq!(
            OraclePublicKey::load(&p).unwrap(),
            k,
            "the file is untouched"
        );
        // A secret key file given as a public key is refused, naming the mistake.
        let secret = dir.path().join("oracle.key");
        Key::create(&secret).unwrap();
        let e = OraclePublicKey::load(&secret).unwrap_err();
        assert!(e.to_string().contains("secret key"), "{e}");
    }

    #[test]
    fn signatures_verify_under_their_key_only() {
        let (a, b) = (key(1), key(2));
        let sig = a.sign(b"certified");
        assert!(a.public().verify(b"certified", &sig));
        assert!(!a.public().verify(b"certifiec", &sig));
        assert!(!b.public().verify(b"certified", &sig));
    }
}
