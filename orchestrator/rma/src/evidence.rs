//! The evidence package of a case: a deterministic tar archive with a manifest of sha256 hashes.
//!
//! Deterministic means the same inputs give the same bytes, whatever order the files were gathered
//! in and whenever it is built: entries are sorted by path, every header carries the case's own
//! timestamp, owner 0 and mode 0644, and the manifest is serialised with a fixed field order. A
//! vendor (or an auditor, years later) can then check a package against the manifest hash recorded
//! in the case. A package never holds a secret: every file is swept before it is written.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Format tag in every manifest; bump it when the layout changes.
pub const MANIFEST_FORMAT: &str = "waveguard-rma-evidence/1";
/// Name of the manifest inside the archive (always the first entry).
pub const MANIFEST_PATH: &str = "manifest.json";
/// Largest package accepted: vendor portals cap uploads, and a package is built in memory.
pub const MAX_PACKAGE_BYTES: usize = 256 * 1024 * 1024;

/// One file to put in the package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvidenceFile {
    /// Relative path inside the archive (`inventory.json`, `logs/sel.json`).
    pub path: String,
    /// Contents.
    pub bytes: Vec<u8>,
}

/// One manifest line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// Path inside the archive.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Lowercase hex sha256 of the contents.
    pub sha256: String,
}

/// What the package holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_FORMAT`].
    pub format: String,
    /// Case id.
    pub case_id: String,
    /// Serial of the failed part.
    pub serial: String,
    /// Vendor document edition the claim is made under.
    pub criteria_edition: String,
    /// The case's timestamp for the package (not the wall clock: that would break determinism).
    pub created_at: DateTime<Utc>,
    /// Files, sorted by path.
    pub files: Vec<ManifestEntry>,
}

/// A built package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvidencePackage {
    /// The manifest.
    pub manifest: Manifest,
    /// sha256 of `manifest.json` as written in the archive: the package's identity in the case.
    pub manifest_sha256: String,
    /// The tar archive.
    pub archive: Vec<u8>,
}

/// Why a package was not built.
#[derive(Debug, thiserror::Error)]
pub enum EvidenceError {
    /// A path is not a plain relative path.
    #[error("evidence file {path:?}: {reason}")]
    InvalidPath {
        /// The path given.
        path: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// Two files share a path.
    #[error("evidence file {path:?} is given twice")]
    DuplicatePath {
        /// The path.
        path: String,
    },
    /// The sweep found a secret; the secret itself is never put in the message.
    #[error("evidence file {path:?} contains {what}; remove it before packaging")]
    SecretFound {
        /// The file.
        path: String,
        /// What kind of secret.
        what: &'static str,
    },
    /// Over [`MAX_PACKAGE_BYTES`].
    #[error("evidence package would be larger than {MAX_PACKAGE_BYTES} bytes")]
    TooLarge,
    /// The archive writer failed (writing into memory; not expected).
    #[error("writing the evidence archive entry {path:?}")]
    Archive {
        /// The entry.
        path: String,
        /// The writer's error.
        #[source]
        source: std::io::Error,
    },
    /// The manifest could not be serialised (not expected).
    #[error("serialising the evidence manifest")]
    Manifest(#[source] serde_json::Error),
}

/// Lowercase hex sha256, as manifests and attachments record it.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn check_path(path: &str) -> Result<(), EvidenceError> {
    let bad = |reason| {
        Err(EvidenceError::InvalidPath {
            path: path.to_owned(),
            reason,
        })
    };
    if path.is_empty() || path.len() > 200 {
        return bad("must be 1-200 bytes");
    }
    if path.starts_with('/') || path.contains('\\') {
        return bad("must be relative, with '/' separators");
    }
    if path.split('/').any(|seg| seg.is_empty() || seg == "." || seg == "..") {
        return bad("must not contain empty, '.' or '..' segments");
    }
    if path.chars().any(|c| c.is_control()) {
        return bad("must not contain control characters");
    }
    if path == MANIFEST_PATH {
        return bad("is reserved for the manifest");
    }
    Ok(())
}

fn find_ci(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || needle.len() > haystack.len() {
        return None;
    }
    haystack
        .windows(needle.len())
        .position(|w| w.eq_ignore_ascii_case(needle))
}

/// Looks for secrets in a file's bytes: private keys, HTTP credentials, a JSON `Password` with a
/// value (Redfish `CollectDiagnosticData` takes `UserName`/`Password` parameters that must never be
/// stored), and any of the `known` secrets the caller holds (BMC passwords, tokens). Returns what
/// kind was found, never where or what it is.
pub fn secret_sweep(bytes: &[u8], known: &[&str]) -> Option<&'static str> {
    if find_ci(bytes, b"PRIVATE KEY-----").is_some() {
        return Some("a private key");
    }
    for header in [
        &b"authorization: basic "[..],
        b"authorization: bearer ",
        b"x-auth-token: ",
    ] {
        if find_ci(bytes, header).is_some() {
            return Some("an HTTP credential header");
        }
    }
    let mut rest = bytes;
    while let Some(i) = find_ci(rest, b"\"password\"") {
        let after = &rest[i + 10..];
        let mut value = after.iter().copied().skip_while(u8::is_ascii_whitespace);
        if value.next() == Some(b':') {
            let mut value = value.skip_while(u8::is_ascii_whitespace);
            // A non-empty string value; `null` and `""` are how a redacted field reads.
            if value.next() == Some(b'"') && value.next().is_some_and(|b| b != b'"') {
                return Some("a password value");
            }
        }
        rest = after;
    }
    // The text forms logs and config dumps use: `password: x`, `passwd=x`. A masked value (`***`,
    // `<redacted>`) or a quoted one (the JSON form, judged above) does not count.
    for key in [&b"password"[..], b"passwd"] {
        let mut rest = bytes;
        while let Some(i) = find_ci(rest, key) {
            let after = &rest[i + key.len()..];
            let mut value = after.iter().copied().skip_while(|b| *b == b' ' || *b == b'\t');
            if matches!(value.next(), Some(b':' | b'=')) {
                let mut value = value.skip_while(|b| *b == b' ' || *b == b'\t');
                if value
                    .next()
                    .is_some_and(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'*' | b'<' | b'{' | b'['))
                {
                    return Some("a password value");
                }
            }
            rest = after;
        }
    }
    if known
        .iter()
        .filter(|s| !s.is_empty())
        .any(|s| bytes.windows(s.len()).any(|w| w == s.as_bytes()))
    {
        return Some("a known credential");
    }
    None
}

fn append(builder: &mut tar::Builder<Vec<u8>>, path: &str, bytes: &[u8], mtime: u64) -> Result<(), EvidenceError> {
    let mut header = tar::Header::new_gnu();
    header.set_size(bytes.len() as u64);
    header.set_mode(0o644);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(mtime);
    header.set_entry_type(tar::EntryType::Regular);
    builder
        .append_data(&mut header, path, bytes)
        .map_err(|source| EvidenceError::Archive {
            path: path.to_owned(),
            source,
        })
}

/// Builds the package. `known_secrets` are swept for along with the generic patterns; a finding
/// refuses the whole package.
pub fn build_package(
    case_id: &str,
    serial: &str,
    criteria_edition: &str,
    created_at: DateTime<Utc>,
    mut files: Vec<EvidenceFile>,
    known_secrets: &[&str],
) -> Result<EvidencePackage, EvidenceError> {
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let mut total = 0usize;
    for (i, f) in files.iter().enumerate() {
        check_path(&f.path)?;
        if i > 0 && files[i - 1].path == f.path {
            return Err(EvidenceError::DuplicatePath { path: f.path.clone() });
        }
        if let Some(what) = secret_sweep(&f.bytes, known_secrets) {
            return Err(EvidenceError::SecretFound {
                path: f.path.clone(),
                what,
            });
        }
        total = total.saturating_add(f.bytes.len());
    }
    if total > MAX_PACKAGE_BYTES {
        return Err(EvidenceError::TooLarge);
    }
    let manifest = Manifest {
        format: MANIFEST_FORMAT.to_owned(),
        case_id: case_id.to_owned(),
        serial: serial.to_owned(),
        criteria_edition: criteria_edition.to_owned(),
        created_at,
        files: files
            .iter()
            .map(|f| ManifestEntry {
                path: f.path.clone(),
                size: f.bytes.len() as u64,
                sha256: sha256_hex(&f.bytes),
            })
            .collect(),
    };
    let mut manifest_json = serde_json::to_vec_pretty(&manifest).map_err(EvidenceError::Manifest)?;
    manifest_json.push(b'\n');
    // The manifest names the case and serial the caller gave; sweep it too.
    if let Some(what) = secret_sweep(&manifest_json, known_secrets) {
        return Err(EvidenceError::SecretFound {
            path: MANIFEST_PATH.to_owned(),
            what,
        });
    }
    let mtime = u64::try_from(created_at.timestamp()).unwrap_or(0);
    let mut builder = tar::Builder::new(Vec::with_capacity(total + 4096));
    append(&mut builder, MANIFEST_PATH, &manifest_json, mtime)?;
    for f in &files {
        append(&mut builder, &f.path, &f.bytes, mtime)?;
    }
    let archive = builder.into_inner().map_err(|source| EvidenceError::Archive {
        path: "(end of archive)".to_owned(),
        source,
    })?;
    Ok(EvidencePackage {
        manifest_sha256: sha256_hex(&manifest_json),
        manifest,
        archive,
    })
}
