//! The simulated firmware image format.
//!
//! An image says what it is, so the simulated BMC can refuse a corrupt or wrong-platform image the way a real
//! one verifies its signature and applicability. Layout (a text header, then the payload bytes):
//!
//! ```text
//! WGFW1\n
//! kind: gpu\n
//! version: 96.00.61.00.01\n
//! skus: hgx-h100-8gpu,hgx-b200-8gpu\n
//! payload-length: 4096\n
//! payload-sha256: <64 lowercase hex digits>\n
//! \n
//! <payload-length bytes of payload>
//! ```
//!
//! The header is UTF-8, at most [`MAX_HEADER_LEN`] bytes, lines in exactly this order; the blank line ends
//! it. `skus` is a comma-separated list (no spaces) of platform SKUs the image applies to. The image is valid
//! only when the payload is exactly `payload-length` bytes and its SHA-256 matches.

use orchestrator_types::ComponentKind;
use sha2::{Digest, Sha256};

/// First line of every image.
pub const MAGIC: &str = "WGFW1";
/// Upper bound on the header, so garbage input is rejected without scanning megabytes.
pub const MAX_HEADER_LEN: usize = 4096;

/// What an image header declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageHeader {
    /// Component kind the firmware is for.
    pub kind: ComponentKind,
    /// Version the component reports once the image is active.
    pub version: String,
    /// Platform SKUs the image may be installed on.
    pub skus: Vec<String>,
    /// Payload length in bytes.
    pub payload_len: u64,
    /// SHA-256 of the payload, lowercase hex.
    pub payload_sha256: String,
}

impl ImageHeader {
    /// Whether the image may be installed on platform `sku`.
    pub fn applies_to(&self, sku: &str) -> bool {
        self.skus.iter().any(|s| s == sku)
    }
}

/// Why an image was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// The image does not start with [`MAGIC`].
    #[error("not a firmware image (bad magic)")]
    BadMagic,
    /// The header is malformed.
    #[error("malformed image header: {0}")]
    BadHeader(String),
    /// The payload is shorter or longer than the header says.
    #[error("payload length mismatch: header says {expected} bytes, image has {actual}")]
    LengthMismatch {
        /// Length from the header.
        expected: u64,
        /// Actual payload length.
        actual: u64,
    },
    /// The payload's SHA-256 differs from the header's.
    #[error("payload checksum mismatch: header says {expected}, payload hashes to {actual}")]
    ChecksumMismatch {
        /// Checksum from the header.
        expected: String,
        /// Checksum of the bytes received.
        actual: String,
    },
}

/// Builds an image for `kind`/`version` applicable to `skus`, around `payload`.
///
/// SKUs and the version must not contain newlines (SKUs also no commas); such values would make an image
/// that [`parse`] rejects, which is handy for tests of corrupt images but never what a caller wants.
pub fn build(kind: ComponentKind, version: &str, skus: &[&str], payload: &[u8]) -> Vec<u8> {
    let sha = hex::encode(Sha256::digest(payload));
    let header = format!(
        "{MAGIC}\nkind: {}\nversion: {version}\nskus: {}\npayload-length: {}\npayload-sha256: {sha}\n\n",
        kind.as_str(),
        skus.join(","),
        payload.len()
    );
    let mut out = header.into_bytes();
    out.extend_from_slice(payload);
    out
}

/// Parses and verifies an image: header shape, payload length and checksum.
pub fn parse(image: &[u8]) -> Result<ImageHeader, ImageError> {
    if !image.starts_with(format!("{MAGIC}\n").as_bytes()) {
        return Err(ImageError::BadMagic);
    }
    let window = &image[..image.len().min(MAX_HEADER_LEN)];
    let end = window.windows(2).position(|w| w == b"\n\n").ok_or_else(|| {
        ImageError::BadHeader(format!(
            "no blank line ending the header in the first {MAX_HEADER_LEN} bytes"
        ))
    })?;
    let header = std::str::from_utf8(&image[..end]).map_err(|_| ImageError::BadHeader("header is not UTF-8".into()))?;
    let payload = &image[end + 2..];

    let mut lines = header.lines().skip(1);
    let mut field = |name: &str| -> Result<String, ImageError> {
        let line = lines
            .next()
            .ok_or_else(|| ImageError::BadHeader(format!("missing `{name}` line")))?;
        let value = line
            .strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(": "))
            .ok_or_else(|| ImageError::BadHeader(format!("expected `{name}: ...`, found `{}`", snippet(line))))?;
        Ok(value.to_owned())
    };
    let kind_raw = field("kind")?;
    let kind = kind_raw
        .parse::<ComponentKind>()
        .map_err(|_| ImageError::BadHeader(format!("unknown component kind `{}`", snippet(&kind_raw))))?;
    let version = field("version")?;
    if version.trim().is_empty() {
        return Err(ImageError::BadHeader("empty version".into()));
    }
    let skus: Vec<String> = field("skus")?
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let len_raw = field("payload-length")?;
    let payload_len: u64 = len_raw
        .parse()
        .map_err(|_| ImageError::BadHeader(format!("payload-length `{}` is not a number", snippet(&len_raw))))?;
    let payload_sha256 = field("payload-sha256")?;
    if payload_sha256.len() != 64
        || !payload_sha256
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(ImageError::BadHeader(
            "payload-sha256 is not 64 lowercase hex digits".into(),
        ));
    }
    if let Some(extra) = lines.next() {
        return Err(ImageError::BadHeader(format!(
            "unexpected header line `{}`",
            snippet(extra)
        )));
    }
    let actual_len = payload.len() as u64;
    if actual_len != payload_len {
        return Err(ImageError::LengthMismatch {
            expected: payload_len,
            actual: actual_len,
        });
    }
    let actual = hex::encode(Sha256::digest(payload));
    if actual != payload_sha256 {
        return Err(ImageError::ChecksumMismatch {
            expected: payload_sha256,
            actual,
        });
    }
    Ok(ImageHeader {
        kind,
        version,
        skus,
        payload_len,
        payload_sha256,
    })
}

fn snippet(s: &str) -> String {
    s.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let img = build(
            ComponentKind::Gpu,
            "96.00.61.00.01",
            &["hgx-h100-8gpu", "hgx-b200"],
            b"payload bytes",
        );
        let h = parse(&img).expect("valid image");
        assert_eq!(h.kind, ComponentKind::Gpu);
        assert_eq!(h.version, "96.00.61.00.01");
        assert!(h.applies_to("hgx-b200"));
        assert!(!h.applies_to("other"));
        assert_eq!(h.payload_len, 13);
    }

    #[test]
    fn rejects_corruption() {
        let img = build(ComponentKind::Bmc, "24.04.2", &["x"], b"0123456789");
        let mut flipped = img.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(matches!(parse(&flipped), Err(ImageError::ChecksumMismatch { .. })));
        assert!(matches!(
            parse(&img[..img.len() - 1]),
            Err(ImageError::LengthMismatch { .. })
        ));
        assert_eq!(parse(b"garbage"), Err(ImageError::BadMagic));
        let bad_kind = String::from_utf8_lossy(&img).replace("kind: bmc", "kind: toaster");
        assert!(matches!(parse(bad_kind.as_bytes()), Err(ImageError::BadHeader(_))));
        assert!(matches!(parse(b"WGFW1\nkind: bmc\n"), Err(ImageError::BadHeader(_))));
    }
}
