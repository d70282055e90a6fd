//! WireGuard keys: a peer's public key as the config gives it, and this
//! gateway's private key, read from a file the daemon may trust (the
//! rules of `trust`, and more: nobody else may read it) or from a systemd
//! credential (`LoadCredential=`, `$CREDENTIALS_DIRECTORY`). A private key
//! never prints: no Debug, Display or Serialize shows it, no error quotes
//! the file's text, and its bytes are zeroed when it is dropped. A leaf
//! besides `trust`.

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use base64::Engine as _;

/// A WireGuard key's length, and its base64 form's (as `wg genkey` and
/// `wg pubkey` print it).
pub(crate) const KEY_LEN: usize = 32;
const BASE64_LEN: usize = 44;
/// The most of a key file read: a key, a newline, room for a comment-free
/// file with trailing whitespace. Anything longer is not a key file.
const MAX_FILE: usize = 256;

/// `base64` as a WireGuard key, or `None`.
fn decode(text: &str) -> Option<[u8; KEY_LEN]> {
    if text.len() != BASE64_LEN {
        return None;
    }
    let mut out = [0u8; KEY_LEN];
    match base64::engine::general_purpose::STANDARD.decode_slice(text, &mut out) {
        Ok(KEY_LEN) => Some(out),
        _ => None,
    }
}

/// A peer's public key. Public keys are not secret: they print in base64.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey(pub [u8; KEY_LEN]);

impl PublicKey {
    pub(crate) fn parse(text: &str) -> Option<PublicKey> {
        decode(text).map(PublicKey)
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&base64::engine::general_purpose::STANDARD.encode(self.0))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

impl serde::Serialize for PublicKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Where this gateway's private key is: a file, or a systemd credential
/// of the unit (`credential:NAME`).
#[derive(Clone, PartialEq, Eq, serde::Serialize)]
#[serde(into = "String")]
pub(crate) enum KeySource {
    File(PathBuf),
    Credential(String),
}

const CREDENTIAL: &str = "credential:";

impl KeySource {
    /// `private_key_file` as written: an absolute path, or
    /// `credential:NAME` (a plain file name). The reason when it is
    /// neither.
    pub(crate) fn parse(text: &str) -> Result<KeySource, String> {
        if let Some(name) = text.strip_prefix(CREDENTIAL) {
            if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
                return Err(format!(
                    "\"{text}\" names no credential; give the name LoadCredential= gives it, as credential:site-a.key"
                ));
            }
            return Ok(KeySource::Credential(name.to_string()));
        }
        let path = Path::new(text);
        if !path.is_absolute() || text.contains('\0') {
            return Err(format!("\"{text}\" is not an absolute path (or credential:NAME)"));
        }
        Ok(KeySource::File(path.to_path_buf()))
    }

    /// The file to read: a credential is `$CREDENTIALS_DIRECTORY/NAME`
    /// (`creds`: that variable's value, if set).
    fn path(&self, creds: Option<&Path>) -> Result<PathBuf, KeyError> {
        match self {
            KeySource::File(p) => Ok(p.clone()),
            KeySource::Credential(name) => match creds {
                Some(dir) => Ok(dir.join(name)),
                None => Err(KeyError::NoCredentials { name: name.clone() }),
            },
        }
    }
}

impl fmt::Display for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySource::File(p) => write!(f, "{}", p.display()),
            KeySource::Credential(n) => write!(f, "{CREDENTIAL}{n}"),
        }
    }
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeySource({self})")
    }
}

impl From<KeySource> for String {
    fn from(k: KeySource) -> String {
        k.to_string()
    }
}

/// This gateway's private key: it prints as `PrivateKey(redacted)`, and
/// its bytes are zeroed when it is dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct PrivateKey([u8; KEY_LEN]);

impl PrivateKey {
    /// The bytes, for the one caller that hands them to the kernel.
    pub(crate) fn expose(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    /// The public key peers know this gateway by, as `wg pubkey` prints
    /// it (the X25519 base point times the key; the secret copy made for
    /// it is zeroed when dropped).
    pub(crate) fn public_key(&self) -> PublicKey {
        let secret = x25519_dalek::StaticSecret::from(self.0);
        PublicKey(x25519_dalek::PublicKey::from(&secret).to_bytes())
    }
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PrivateKey(redacted)")
    }
}

impl Drop for PrivateKey {
    fn drop(&mut self) {
        wipe(&mut self.0);
    }
}

/// A WireGuard device's key as hostmesh wants it or finds it: the public
/// key, which is what compares and prints, and (when wanted) the private
/// key to hand the kernel, shared, never printed or serialized. Two keys
/// with the same public half are the same key.
#[derive(Clone)]
pub struct DeviceKey {
    pub public: PublicKey,
    pub private: Option<std::sync::Arc<PrivateKey>>,
}

impl DeviceKey {
    pub(crate) fn of(private: PrivateKey) -> DeviceKey {
        DeviceKey { public: private.public_key(), private: Some(std::sync::Arc::new(private)) }
    }
}

impl PartialEq for DeviceKey {
    fn eq(&self, other: &Self) -> bool {
        self.public == other.public
    }
}

impl Eq for DeviceKey {}

impl fmt::Debug for DeviceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceKey({})", self.public)
    }
}

impl serde::Serialize for DeviceKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.public.serialize(s)
    }
}

/// Zeroes `bytes` in a way the compiler keeps.
fn wipe(bytes: &mut [u8]) {
    for b in bytes.iter_mut() {
        // SAFETY: a valid, aligned &mut u8.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

/// Why a private key was not read. Each names the file and the fix, and
/// none quotes the file's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum KeyError {
    #[error("private key {}: {reason}", path.display())]
    Unreadable { path: PathBuf, reason: String },
    #[error("private key credential:{name}: $CREDENTIALS_DIRECTORY is not set; give the unit LoadCredential={name}:/path/to/the/key (hostmesh.service shows how)")]
    NoCredentials { name: String },
    #[error("private key {}: not a regular file", path.display())]
    NotAFile { path: PathBuf },
    #[error("private key {}: readable by {who} (mode {mode:04o}); fix: chmod 0600 {}", path.display(), path.display())]
    Readable { path: PathBuf, who: &'static str, mode: u32 },
    #[error("private key: {0}")]
    Unsafe(crate::trust::Unsafe),
    #[error("private key {}: not a WireGuard key (one line of 44 base64 characters, as `wg genkey` writes)", path.display())]
    NotAKey { path: PathBuf },
}

/// Reads the private key `src` names, as sshd's StrictModes would trust
/// it: a regular file owned by root (or the daemon's uid), readable and
/// writable by nobody else, in a dir nobody else may write. `creds` is
/// `$CREDENTIALS_DIRECTORY`, if set.
pub(crate) fn read_private_key(src: &KeySource, creds: Option<&Path>) -> Result<PrivateKey, KeyError> {
    let path = src.path(creds)?;
    let unreadable = |e: std::io::Error| KeyError::Unreadable { path: path.clone(), reason: e.to_string() };
    if let Some(dir) = path.parent() {
        let meta = std::fs::metadata(dir).map_err(unreadable)?;
        crate::trust::check_trusted(dir, meta.uid(), meta.mode()).map_err(KeyError::Unsafe)?;
    }
    // No symlink is followed: the file checked is the file read.
    let mut file = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(&path)
        .map_err(unreadable)?;
    let meta = file.metadata().map_err(unreadable)?;
    if !meta.file_type().is_file() {
        return Err(KeyError::NotAFile { path });
    }
    crate::trust::check_trusted(&path, meta.uid(), meta.mode()).map_err(KeyError::Unsafe)?;
    let who = match (meta.mode() & 0o040 != 0, meta.mode() & 0o004 != 0) {
        (true, true) => Some("group and others"),
        (true, false) => Some("its group"),
        (false, true) => Some("others"),
        (false, false) => None,
    };
    if let Some(who) = who {
        return Err(KeyError::Readable { path, who, mode: meta.mode() & 0o7777 });
    }
    let mut buf = [0u8; MAX_FILE + 1];
    let mut len = 0;
    let read = loop {
        match file.read(&mut buf[len..]) {
            Ok(0) => break Ok(()),
            Ok(n) => {
                len += n;
                if len == buf.len() {
                    break Ok(());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    let key = match read {
        Err(e) => Err(unreadable(e)),
        Ok(()) if len > MAX_FILE => Err(KeyError::NotAKey { path }),
        Ok(()) => std::str::from_utf8(&buf[..len])
            .ok()
            .and_then(|t| decode(t.trim_matches(|c: char| c.is_ascii_whitespace())))
            .map(PrivateKey)
            .ok_or(KeyError::NotAKey { path }),
    };
    wipe(&mut buf);
    key
}

#[cfg(test)]
mod tests;
