//! Needle Studio's binary: the desktop app, or — run as `needle-studio worker <needle arguments>` —
//! the worker process in which the app trains and builds, so a crash there never takes the window.

// Release builds on Windows are GUI programs: no console window behind the app.
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|arg| arg == needle_studio::WORKER_ARG) {
        let needle_args = std::iter::once(OsString::from("needle")).chain(args.into_iter().skip(2));
        return needle_cli::main_with(needle_args);
    }
    needle_studio::open_window(needle_studio::Launch::parse_from(args))
}
