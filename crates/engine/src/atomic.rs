//! Writing a file so that readers see the old one or the whole new one, never half of it.

use std::io::{self, Write};
use std::path::Path;

/// Writes `bytes` to `path` through a temporary file in the same directory, synced and then renamed
/// over the target: an interrupted write never leaves a half-written adapter or `.cact` behind.
/// Missing folders on the way are created, as a save dialog's "new folder" would have.
///
/// The temporary file (`.<name>.<random>.partial`) is locked while it is written. A process killed
/// mid-write cannot delete it, so a later write of the same target removes every such file that is
/// a minute old and whose lock is free: its writer is gone.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir)?;
    let prefix = match path.file_name() {
        Some(name) => format!(".{}.", name.to_string_lossy()),
        None => return Err(io::Error::new(io::ErrorKind::InvalidInput, "the path names no file")),
    };
    remove_abandoned(dir, &prefix);
    let mut file = tempfile::Builder::new().prefix(&prefix).suffix(PARTIAL).tempfile_in(dir)?;
    // Best effort: a file system without locks only loses the cleanup's certainty, not the write.
    let _ = file.as_file().lock();
    file.write_all(bytes)?;
    // Temporary files are created private (0600); the result is an ordinary user file.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.as_file().set_permissions(std::fs::Permissions::from_mode(0o644))?;
    }
    file.as_file().sync_all()?;
    file.persist(path).map_err(|e| e.error)?;
    Ok(())
}

const PARTIAL: &str = ".partial";

/// A partial file younger than this may be a writer's between its creation and its lock.
const ABANDONED_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// Deletes the partial files of a target (`prefix…PARTIAL` in `dir`) that no live writer holds.
fn remove_abandoned(dir: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with(prefix) && name.ends_with(PARTIAL)) {
            continue;
        }
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|at| at.elapsed().is_ok_and(|age| age >= ABANDONED_AFTER));
        // A file we cannot open or lock is someone's write in progress; leave it be.
        if old && std::fs::File::open(entry.path()).is_ok_and(|file| file.try_lock().is_ok()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_whole_file_and_leaves_no_temporary_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new").join("out.bin");
        write_atomically(&path, b"first").unwrap();
        write_atomically(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        assert_eq!(std::fs::read_dir(path.parent().unwrap()).unwrap().count(), 1);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o644);
        }
    }

    #[test]
    fn the_next_write_removes_what_a_killed_writer_left_but_not_a_live_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("adapter.pkl");
        // A writer that died mid-write: its partial file is there and unlocked.
        let abandoned = dir.path().join(".adapter.pkl.abc123.partial");
        std::fs::write(&abandoned, b"half").unwrap();
        // A writer still at work holds its lock; another may have just created its file.
        let live = dir.path().join(".adapter.pkl.def456.partial");
        std::fs::write(&live, b"busy").unwrap();
        let fresh = dir.path().join(".adapter.pkl.ghi789.partial");
        std::fs::write(&fresh, b"new").unwrap();
        let long_ago = std::time::SystemTime::now() - 2 * ABANDONED_AFTER;
        for old in [&abandoned, &live] {
            std::fs::File::options().write(true).open(old).unwrap().set_modified(long_ago).unwrap();
        }
        let held = std::fs::File::open(&live).unwrap();
        held.lock().unwrap();
        let other = dir.path().join(".other.pkl.abc123.partial");
        std::fs::write(&other, b"another target's").unwrap();
        write_atomically(&path, b"whole").unwrap();
        assert!(!abandoned.exists() && live.exists() && fresh.exists() && other.exists());
        assert_eq!(std::fs::read(&path).unwrap(), b"whole");
    }
}
