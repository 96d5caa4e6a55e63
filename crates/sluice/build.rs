//! Tells the tests whether a Chromium is installed (`cfg(no_chromium)` when not): the status
//! page's browser test is then ignored, with `STATUS PAGE BROWSER TEST NOT RUN` as the reason,
//! so it is counted as not run rather than passed. `make test` installs Chromium first.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(no_chromium)");
    println!("cargo::rerun-if-env-changed=SLUICE_CHROMIUM");
    println!("cargo::rerun-if-env-changed=PATH");
    let found = chromium().is_some();
    // A missing file makes cargo run this script again at the next build: installing
    // Chromium later is noticed.
    println!("cargo::rerun-if-changed=/usr/bin/chromium");
    if !found {
        println!("cargo::rustc-cfg=no_chromium");
    }
}

/// `$SLUICE_CHROMIUM`, else `chromium` on the `PATH`.
fn chromium() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("SLUICE_CHROMIUM") {
        return Some(p.into()).filter(|p: &std::path::PathBuf| p.is_file());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("chromium")).find(|p| p.is_file())
}
