//! The app's secrets: the key Generate asks an LLM endpoint with, and the token Publish uploads with
//! ([`keys`]); typed once in the window and kept in the operating system's keychain.

pub mod commands;
pub mod keys;
