//! Tells the tests whether a Chromium is installed (`cfg(no_chromium)` when not): the status
//! page's browser test is then ignored, with `STATUS PAGE BROWSER TEST NOT RUN` as the reason,
//! so it is counted as not run rather than passed. `make test` installs Chromium first.
//!
//! Likewise for the S3-compatible server the object-store tests start (`s3s-fs`, which
//! `make s3-server` installs from crates.io into `target/tools/bin`): found, its path is
//! `SLUICE_S3S_FS_BIN` for the tests; not found, `cfg(no_s3_server)` makes them ignored with
//! `OBJECT STORE TESTS NOT RUN` as the reason.
//!
//! And for the MiniDFSCluster the HDFS test starts (`tests/hdfs`, which `make hdfs-server`
//! compiles, writing its class path to `tests/hdfs/target/classpath.txt`): with it and a
//! `java`, `SLUICE_JAVA_BIN` and `SLUICE_MINIDFS_CP` for the test; without either,
//! `cfg(no_minidfs)` makes it ignored with `HDFS TESTS NOT RUN` as the reason, and a build
//! warning says which is missing.
//!
//! And for kTLS: a kernel without the `tls` ULP gives `cfg(no_ktls)`, and the kTLS test is
//! ignored with `KTLS TEST NOT RUN` as the reason.

fn main() {
    s3_server();
    minidfs();
    ktls();
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
    on_path("chromium")
}

/// `name` in a directory of the `PATH`.
fn on_path(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// `$SLUICE_S3S_FS`, else `target/tools/bin/s3s-fs` of this workspace, else `s3s-fs` on the
/// `PATH`: told to the tests, or `cfg(no_s3_server)`.
fn s3_server() {
    println!("cargo::rustc-check-cfg=cfg(no_s3_server)");
    println!("cargo::rerun-if-env-changed=SLUICE_S3S_FS");
    let manifest =
        std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let installed = manifest.join("../../target/tools/bin/s3s-fs");
    // A missing file makes cargo run this script again at the next build: installing it later
    // is noticed.
    println!("cargo::rerun-if-changed={}", installed.display());
    let found = match std::env::var_os("SLUICE_S3S_FS") {
        Some(p) => Some(std::path::PathBuf::from(p)).filter(|p| p.is_file()),
        None => Some(installed).filter(|p| p.is_file()).or_else(|| on_path("s3s-fs")),
    };
    match found {
        Some(p) => {
            let p = p.canonicalize().unwrap_or(p);
            println!("cargo::rustc-env=SLUICE_S3S_FS_BIN={}", p.display());
        }
        None => println!("cargo::rustc-cfg=no_s3_server"),
    }
}

/// `java` (`$JAVA_HOME/bin/java`, else on the `PATH`) and the MiniDFS's classes and class path
/// under `tests/hdfs/target`: told to the test, or `cfg(no_minidfs)`.
fn minidfs() {
    println!("cargo::rustc-check-cfg=cfg(no_minidfs)");
    println!("cargo::rerun-if-env-changed=JAVA_HOME");
    let manifest =
        std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let target = manifest.join("../../tests/hdfs/target");
    let listed = target.join("classpath.txt");
    let classes = target.join("classes");
    // Missing, it makes cargo run this script again at the next build: building it later is
    // noticed; rebuilt, too.
    println!("cargo::rerun-if-changed={}", listed.display());
    let java = std::env::var_os("JAVA_HOME")
        .map(|h| std::path::PathBuf::from(h).join("bin/java"))
        .filter(|p| p.is_file())
        .or_else(|| on_path("java"));
    let jars = std::fs::read_to_string(&listed).ok().filter(|s| !s.trim().is_empty());
    let built = classes.join("sluice/minidfs/MiniHdfs.class").is_file();
    match (java, jars) {
        (Some(java), Some(jars)) if built => {
            let classes = classes.canonicalize().unwrap_or(classes);
            println!("cargo::rustc-env=SLUICE_JAVA_BIN={}", java.display());
            println!("cargo::rustc-env=SLUICE_MINIDFS_CP={}:{}", classes.display(), jars.trim());
        }
        (None, _) => {
            println!("cargo::warning=HDFS TESTS NOT RUN: no java (JAVA_HOME or PATH)");
            println!("cargo::rustc-cfg=no_minidfs");
        }
        _ => {
            println!(
                "cargo::warning=HDFS TESTS NOT RUN: tests/hdfs is not built (make hdfs-server)"
            );
            println!("cargo::rustc-cfg=no_minidfs");
        }
    }
}

/// Whether this kernel offers kTLS (`tls` in /proc/sys/net/ipv4/tcp_available_ulp): not,
/// `cfg(no_ktls)` makes the kTLS test ignored with `KTLS TEST NOT RUN` as the reason.
fn ktls() {
    println!("cargo::rustc-check-cfg=cfg(no_ktls)");
    let ulps = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp").unwrap_or_default();
    if !ulps.split_whitespace().any(|u| u == "tls") {
        println!("cargo::rustc-cfg=no_ktls");
    }
}
