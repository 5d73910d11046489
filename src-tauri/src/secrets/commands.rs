//! Keep and Forget of a secret's field (Data's Generate key, Export's hub token).

use tauri::State;

use crate::ground::{blocking, Answer};
use crate::secrets::keys::{KeySource, SecretName, Secrets};

/// Keeps a typed key or token in the keychain (or, without one, in memory until the app closes).
#[tauri::command]
pub async fn remember_key(secrets: State<'_, Secrets>, name: SecretName, key: String) -> Answer<KeySource> {
    let secrets = secrets.inner().clone();
    blocking(move || secrets.named(name).remember(&key)).await
}

#[tauri::command]
pub async fn forget_key(secrets: State<'_, Secrets>, name: SecretName) -> Answer<KeySource> {
    let secrets = secrets.inner().clone();
    blocking(move || Ok(secrets.named(name).forget())).await
}
