//! What every room of the app stands on: small helpers that import nothing of the app, so that any
//! room may use them without an import running back up to the one that composes it.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// What a command returns to the window: its value, or the sentence to show.
pub type Answer<T> = Result<T, String>;

/// A poisoned lock only means a thread panicked mid-update; the state itself is still whole.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `work` on the blocking pool, keeping the window responsive.
pub async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Answer<T> + Send + 'static) -> Answer<T> {
    tauri::async_runtime::spawn_blocking(work).await.map_err(|error| format!("internal error: {error}"))?
}

/// `path`, with `.{extension}` added unless it already ends in it: a save dialog that kept
/// `notes.txt` must not overwrite that file.
pub fn ending_in(path: &Path, extension: &str) -> PathBuf {
    if path.extension().is_some_and(|ext| ext.eq_ignore_ascii_case(extension)) {
        return path.to_owned();
    }
    let mut name = path.as_os_str().to_owned();
    name.push(".");
    name.push(extension);
    PathBuf::from(name)
}

/// The bytes of one of the app's own files, refusing one larger than `limit` before reading it: a
/// stray huge file in the app's folder must not cost the window its memory.
pub fn read_limited(path: &Path, limit: u64) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    let file = std::fs::File::open(path).map_err(|error| format!("could not read {}: {error}", path.display()))?;
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| format!("could not read {}: {error}", path.display()))?;
    if bytes.len() as u64 > limit {
        return Err(format!("{} is larger than {limit} bytes, too large for what it should hold", path.display()));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_over_its_limit_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("training.json");
        std::fs::write(&path, vec![b' '; 2048]).unwrap();
        let error = read_limited(&path, 1024).unwrap_err();
        assert!(error.contains("training.json") && error.contains("larger than 1024 bytes"), "{error}");
        assert_eq!(read_limited(&path, 4096).unwrap().len(), 2048);
    }

    #[test]
    fn a_saved_name_gets_its_extension_once() {
        assert_eq!(ending_in(Path::new("/out/notes.txt"), "cact"), Path::new("/out/notes.txt.cact"));
        assert_eq!(ending_in(Path::new("/out/tuned.CACT"), "cact"), Path::new("/out/tuned.CACT"));
    }
}
