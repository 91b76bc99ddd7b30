//! Names the commit the binary is built from, for `wsr-gateway --version`: `git rev-parse`
//! when the source is a git checkout, "unknown" otherwise (a source tarball).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_owned())
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    // Not a WSR_* name: `cargo test` and `cargo run` also set it in the environment of what
    // they run, and a gateway started from there refuses WSR_* variables it does not know.
    println!("cargo:rustc-env=GATEWAY_BUILD_COMMIT={commit}");
    // Built again when HEAD moves (a new commit, a checkout); only paths that exist are
    // named, since cargo runs the script at every build for one that does not.
    let dir = git(&["rev-parse", "--git-dir"]);
    let common = git(&["rev-parse", "--git-common-dir"]);
    let watched = [
        dir.map(|d| format!("{d}/HEAD")),
        common.as_ref().map(|d| format!("{d}/refs/heads")),
        common.map(|d| format!("{d}/packed-refs")),
    ];
    for path in watched.into_iter().flatten() {
        if std::path::Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
