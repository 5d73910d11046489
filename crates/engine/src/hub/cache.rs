//! The Hugging Face cache layout, shared with the reference's `huggingface_hub`: a model that either
//! tool downloaded is found by the other.
//!
//! ```text
//! <cache>/models--<org>--<name>/
//!     blobs/<etag>                  the bytes, named by the hub's content hash
//!     blobs/<etag>.incomplete       a transfer in progress or cut short (resumed from its length)
//!     refs/<revision>               the commit a branch or tag pointed at when last fetched
//!     snapshots/<commit>/<path>     a link to the blob, at the file's path in the repository
//! ```

use std::io;
use std::path::{Path, PathBuf};

use super::RepoFile;

/// The cache folder of one repository.
#[derive(Debug, Clone)]
pub struct RepoCache {
    dir: PathBuf,
}

impl RepoCache {
    pub fn new(cache: &Path, repo: &str) -> Self {
        Self { dir: cache.join(format!("models--{}", repo.replace('/', "--"))) }
    }

    /// The file as last fetched for its revision, without asking the hub: a branch or tag is looked
    /// up in `refs/`, a commit hash is used as is.
    pub fn cached(&self, file: &RepoFile) -> Option<PathBuf> {
        let commit = if is_commit_hash(&file.revision) {
            file.revision.clone()
        } else {
            std::fs::read_to_string(self.dir.join("refs").join(&file.revision)).ok()?.trim().to_string()
        };
        let path = self.snapshot_path(&commit, &file.path);
        path.is_file().then_some(path)
    }

    pub fn blob_path(&self, etag: &str) -> PathBuf {
        self.dir.join("blobs").join(etag)
    }

    pub fn incomplete_path(&self, etag: &str) -> PathBuf {
        self.dir.join("blobs").join(format!("{etag}.incomplete"))
    }

    pub fn snapshot_path(&self, commit: &str, path: &str) -> PathBuf {
        path.split('/').fold(self.dir.join("snapshots").join(commit), |dir, part| dir.join(part))
    }

    /// Records that `revision` points at `commit` and links the snapshot's `path` to the blob `etag`.
    pub fn commit(&self, revision: &str, commit: &str, path: &str, etag: &str) -> io::Result<PathBuf> {
        let snapshot = self.snapshot_path(commit, path);
        if let Some(dir) = snapshot.parent() {
            std::fs::create_dir_all(dir)?;
        }
        link_blob(&self.blob_path(etag), &snapshot)?;
        if revision != commit {
            let reference = self.dir.join("refs").join(revision);
            crate::atomic::write_atomically(&reference, commit.as_bytes())?;
        }
        Ok(snapshot)
    }
}

/// A 40-hex-digit git commit hash, as `--revision` may name one.
pub fn is_commit_hash(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Points `snapshot` at `blob`: a relative symbolic link where the system allows one (as
/// `huggingface_hub` makes them), else a hard link, else a copy. Made beside the snapshot and
/// renamed over it, so a reader never finds the path missing or a copy half-written; nothing is
/// done when the snapshot already holds the blob.
fn link_blob(blob: &Path, snapshot: &Path) -> io::Result<()> {
    if same_file(blob, snapshot) {
        return Ok(());
    }
    let mut staged = snapshot.as_os_str().to_owned();
    staged.push(format!(".{}.tmp", std::process::id()));
    let staged = PathBuf::from(staged);
    let _ = std::fs::remove_file(&staged);
    let made = symlink(&relative_to(blob, &staged), &staged)
        .or_else(|_| std::fs::hard_link(blob, &staged))
        .or_else(|_| std::fs::copy(blob, &staged).map(drop));
    made.and_then(|()| std::fs::rename(&staged, snapshot)).inspect_err(|_| {
        let _ = std::fs::remove_file(&staged);
    })
}

/// Whether `path` is (or leads to) the same file as `blob`.
fn same_file(blob: &Path, path: &Path) -> bool {
    match (std::fs::canonicalize(blob), std::fs::canonicalize(path)) {
        (Ok(a), Ok(b)) if a == b => true,
        _ => {
            #[cfg(unix)]
            {
                use std::os::unix::fs::MetadataExt;
                if let (Ok(a), Ok(b)) = (std::fs::metadata(blob), std::fs::metadata(path)) {
                    return a.dev() == b.dev() && a.ino() == b.ino();
                }
            }
            false
        }
    }
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) -> io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(windows)]
fn symlink(target: &Path, link: &Path) -> io::Result<()> {
    // Needs developer mode or the privilege; the caller falls back to a hard link.
    std::os::windows::fs::symlink_file(target, link)
}

/// `blob` as seen from the folder of `link`, both inside the same repository folder.
fn relative_to(blob: &Path, link: &Path) -> PathBuf {
    let from = link.parent().unwrap_or(link);
    let common = from.components().zip(blob.components()).take_while(|(a, b)| a == b).count();
    let ups = from.components().count() - common;
    std::iter::repeat_n(Path::new(".."), ups)
        .collect::<PathBuf>()
        .join(blob.components().skip(common).collect::<PathBuf>())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(revision: &str, path: &str) -> RepoFile {
        RepoFile { repo: "org/model".into(), revision: revision.into(), path: path.into() }
    }

    #[test]
    fn a_committed_blob_is_found_by_branch_and_by_commit() {
        let dir = tempfile::tempdir().unwrap();
        let cache = RepoCache::new(dir.path(), "org/model");
        let commit = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(cache.cached(&file("main", "checkpoints/a.pkl")), None);
        std::fs::create_dir_all(cache.blob_path("e").parent().unwrap()).unwrap();
        std::fs::write(cache.blob_path("e"), b"bytes").unwrap();
        let snapshot = cache.commit("main", commit, "checkpoints/a.pkl", "e").unwrap();
        assert!(snapshot.ends_with(format!("models--org--model/snapshots/{commit}/checkpoints/a.pkl")));
        assert_eq!(std::fs::read(&snapshot).unwrap(), b"bytes");
        assert_eq!(cache.cached(&file("main", "checkpoints/a.pkl")), Some(snapshot.clone()));
        assert_eq!(cache.cached(&file(commit, "checkpoints/a.pkl")), Some(snapshot));
        assert_eq!(cache.cached(&file("v2", "checkpoints/a.pkl")), None, "another branch was never fetched");
        #[cfg(unix)]
        assert_eq!(
            std::fs::read_link(cache.snapshot_path(commit, "checkpoints/a.pkl")).unwrap(),
            Path::new("../../../blobs/e"),
            "a relative link, as huggingface_hub makes"
        );
    }
}
