//! Opening (or cloning) a repository and reading the policy files at a ref.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use orchestrator_policy::MAX_POLICY_BYTES;

/// Most policy files read from one commit; a repository with more is
/// misconfigured (or hostile) and is refused rather than read into memory.
pub const MAX_POLICY_FILES: usize = 1_000;

/// Where the repository is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepoLocation {
    /// A repository on this machine, opened in place (bare or not).
    Local(PathBuf),
    /// A URL (`https://`, `http://`, `file://`, `ssh://`, `git://`, scp-like `git@host:path`),
    /// cloned into the cache directory.
    Remote(String),
}

impl RepoLocation {
    /// Classifies a configured `repo` string: anything with a scheme or in
    /// scp form (`user@host:path`) is a URL, the rest a local path.
    pub fn parse(repo: &str) -> Self {
        let scp_like = repo
            .split_once(':')
            .is_some_and(|(host, _)| host.contains('@') && !host.contains('/'));
        if repo.contains("://") || scp_like {
            RepoLocation::Remote(repo.to_owned())
        } else {
            RepoLocation::Local(PathBuf::from(repo))
        }
    }
}

/// Why reading policies from git failed.
#[derive(Debug, thiserror::Error)]
pub enum GitSourceError {
    /// The local repository could not be opened.
    #[error("cannot open git repository {path}")]
    Open {
        /// The path given.
        path: PathBuf,
        /// gix's error.
        #[source]
        source: Box<gix::Error>,
    },
    /// Cloning the remote failed.
    #[error("cannot clone {url} into {path}")]
    Clone {
        /// The URL (as configured; credentials belong in git config, not here).
        url: String,
        /// Where the clone was going.
        path: PathBuf,
        /// gix's error.
        #[source]
        source: Box<gix::Error>,
    },
    /// The cache directory could not be prepared.
    #[error("cannot prepare the clone directory {path}")]
    CacheDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The ref does not name a commit.
    #[error("git ref {git_ref:?} does not resolve to a commit")]
    Ref {
        /// The ref asked for.
        git_ref: String,
        /// gix's error.
        #[source]
        source: Box<gix::Error>,
    },
    /// An object could not be read.
    #[error("cannot read git object {id}")]
    Object {
        /// The object id.
        id: String,
        /// gix's error.
        #[source]
        source: Box<gix::Error>,
    },
    /// Not a valid object id.
    #[error("{id:?} is not a git object id")]
    BadId {
        /// As given.
        id: String,
    },
    /// Too many policy files.
    #[error("more than {MAX_POLICY_FILES} policy files at commit {commit}")]
    TooManyFiles {
        /// The commit.
        commit: String,
    },
}

/// One policy file at one commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyFile {
    /// Path inside the repository, `/`-separated.
    pub path: String,
    /// Hex id of the file's blob: what a rollout pins.
    pub blob_id: String,
    /// The file's bytes (at most [`MAX_POLICY_BYTES`] are kept; a larger
    /// file is truncated here and refused by validation as too large).
    pub content: Vec<u8>,
}

/// Every policy file at one commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Hex id of the commit the ref resolved to.
    pub commit_id: String,
    /// Policy files (`*.yaml`, `*.yml`), sorted by path.
    pub files: Vec<PolicyFile>,
    /// RMA criteria files (`*.yaml` under an [`RMA_CRITERIA_DIR`] directory), sorted by path.
    pub rma_files: Vec<PolicyFile>,
}

/// A configured policy repository.
#[derive(Debug, Clone)]
pub struct GitPolicySource {
    /// Where the repository is.
    pub location: RepoLocation,
    /// Branch, tag or commit id.
    pub git_ref: String,
    /// Directory inside the repository holding the policies; `None` is the
    /// whole repository.
    pub subdir: Option<String>,
    /// Where remote repositories are cloned.
    pub cache_dir: PathBuf,
}

impl GitPolicySource {
    /// Reads the policy files at the configured ref. A remote repository is
    /// cloned afresh (bare) on every call, into a directory of its own that
    /// is removed afterwards: policy repositories are small, and a fresh
    /// clone has no local state to go stale or corrupt.
    pub fn read(&self) -> Result<Snapshot, GitSourceError> {
        match &self.location {
            RepoLocation::Local(path) => {
                let repo = gix::open(path).map_err(|e| GitSourceError::Open {
                    path: path.clone(),
                    source: Box::new(e),
                })?;
                read_snapshot(&repo, &self.git_ref, self.subdir.as_deref())
            }
            RepoLocation::Remote(url) => {
                let repo = self.clone_fresh(url)?;
                let snapshot = read_snapshot(&repo, &self.git_ref, self.subdir.as_deref());
                // Everything needed was copied out; the clone is not reused.
                let dir = repo.path().to_owned();
                drop(repo);
                if let Err(err) = std::fs::remove_dir_all(&dir) {
                    // Harmless beyond disk space: the next read clones afresh.
                    tracing::warn!(path = %dir.display(), error = %err, "cannot remove a policy clone");
                }
                snapshot
            }
        }
    }

    fn clone_fresh(&self, url: &str) -> Result<gix::Repository, GitSourceError> {
        // A directory of its own per read: the CLI and a running server may
        // sync at the same time from the same cache directory.
        let serial = CLONE_SERIAL.fetch_add(1, Ordering::Relaxed);
        let target = self
            .cache_dir
            .join(format!("policy-repo-{}-{serial}", std::process::id()));
        let cache_err = |source| GitSourceError::CacheDir {
            path: target.clone(),
            source,
        };
        if target.exists() {
            std::fs::remove_dir_all(&target).map_err(cache_err)?;
        }
        std::fs::create_dir_all(&self.cache_dir).map_err(|source| GitSourceError::CacheDir {
            path: self.cache_dir.clone(),
            source,
        })?;
        let clone_err = |e: gix::Error| GitSourceError::Clone {
            url: redact_url(url),
            path: target.clone(),
            source: Box::new(e),
        };
        let mut prepare = gix::prepare_clone_bare(url, &target).map_err(clone_err)?;
        let (repo, _outcome) = prepare
            .fetch_only(gix::progress::Discard, &AtomicBool::new(false))
            .map_err(clone_err)?;
        Ok(repo)
    }
}

/// Tells clones made by one process apart.
static CLONE_SERIAL: AtomicU64 = AtomicU64::new(0);

/// The repository URL with any password replaced, safe for logs, errors
/// and the audit log (a token in an HTTPS URL is a password too).
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let authority_end = url[scheme_end..].find('/').map_or(url.len(), |i| scheme_end + i);
    match url[scheme_end..authority_end].rfind('@') {
        Some(at) => {
            let userinfo = &url[scheme_end..scheme_end + at];
            match userinfo.split_once(':') {
                Some((user, _secret)) => format!("{}{user}:***{}", &url[..scheme_end], &url[scheme_end + at..]),
                None => url.to_owned(),
            }
        }
        None => url.to_owned(),
    }
}

fn object_err(id: impl ToString) -> impl FnOnce(gix::Error) -> GitSourceError {
    let id = id.to_string();
    move |e| GitSourceError::Object {
        id,
        source: Box::new(e),
    }
}

/// Name of the directory holding RMA criteria files in the policy repository (at any depth),
/// skipped by the policy sync.
pub const RMA_CRITERIA_DIR: &str = "rma";

/// Reads every `*.yaml` / `*.yml` file under `subdir` at `git_ref`: RMA criteria under
/// [`RMA_CRITERIA_DIR`] apart from the policies.
pub fn read_snapshot(repo: &gix::Repository, git_ref: &str, subdir: Option<&str>) -> Result<Snapshot, GitSourceError> {
    let ref_err = |e: gix::Error| GitSourceError::Ref {
        git_ref: git_ref.to_owned(),
        source: Box::new(e),
    };
    let id = repo.rev_parse_single(git_ref).map_err(ref_err)?;
    let commit = id.object().map_err(ref_err)?.peel_to_commit().map_err(ref_err)?;
    let commit_id = commit.id.to_string();
    let tree = commit.tree().map_err(object_err(&commit_id))?;
    let entries = tree.traverse().breadthfirst.files().map_err(object_err(&commit_id))?;
    let prefix = subdir
        .map(|d| d.trim_matches('/'))
        .filter(|d| !d.is_empty())
        .map(|d| format!("{d}/"));
    let mut files = Vec::new();
    let mut rma_files = Vec::new();
    for entry in entries {
        if !entry.mode.is_blob() {
            continue;
        }
        let path = entry.filepath.to_string();
        let in_dir = prefix.as_deref().is_none_or(|p| path.starts_with(p));
        let is_yaml = Path::new(&path).extension().is_some_and(|e| e == "yaml" || e == "yml");
        // RMA criteria share the repository (an `rma/` directory, read by orchestrator-rma) but
        // are not rollout policies.
        let in_rma_dir = path.rsplit('/').skip(1).any(|dir| dir == RMA_CRITERIA_DIR);
        if !in_dir || !is_yaml {
            continue;
        }
        if files.len() + rma_files.len() >= MAX_POLICY_FILES {
            return Err(GitSourceError::TooManyFiles { commit: commit_id });
        }
        let mut content = repo.find_blob(entry.oid).map_err(object_err(entry.oid))?.take_data();
        // One byte over the limit is enough for validation to refuse it.
        content.truncate(MAX_POLICY_BYTES + 1);
        let file = PolicyFile {
            path,
            blob_id: entry.oid.to_string(),
            content,
        };
        if in_rma_dir {
            rma_files.push(file);
        } else {
            files.push(file);
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    rma_files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(Snapshot {
        commit_id,
        files,
        rma_files,
    })
}

/// Reads a pinned policy back by its blob id.
pub fn read_blob(repo: &gix::Repository, blob_id: &str) -> Result<Vec<u8>, GitSourceError> {
    let id =
        gix::ObjectId::from_hex(blob_id.as_bytes()).map_err(|_| GitSourceError::BadId { id: blob_id.to_owned() })?;
    Ok(repo.find_blob(id).map_err(object_err(blob_id))?.take_data())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations() {
        assert_eq!(
            RepoLocation::parse("/srv/policies"),
            RepoLocation::Local("/srv/policies".into())
        );
        assert_eq!(RepoLocation::parse("policies"), RepoLocation::Local("policies".into()));
        assert!(matches!(
            RepoLocation::parse("file:///srv/p.git"),
            RepoLocation::Remote(_)
        ));
        assert!(matches!(
            RepoLocation::parse("git@github.com:org/p.git"),
            RepoLocation::Remote(_)
        ));
        assert!(matches!(
            RepoLocation::parse("ssh://git@host/p.git"),
            RepoLocation::Remote(_)
        ));
        assert_eq!(RepoLocation::parse("C:/x"), RepoLocation::Local("C:/x".into()));
    }

    #[test]
    fn passwords_are_redacted_from_urls() {
        assert_eq!(
            redact_url("https://bot:ghp_secret@github.com/org/p.git"),
            "https://bot:***@github.com/org/p.git"
        );
        assert_eq!(redact_url("ssh://git@host/p.git"), "ssh://git@host/p.git");
        assert_eq!(redact_url("git@github.com:org/p.git"), "git@github.com:org/p.git");
        assert_eq!(redact_url("file:///srv/a@b/p.git"), "file:///srv/a@b/p.git");
        assert_eq!(redact_url("/srv/policies"), "/srv/policies");
    }
}
