//! Writes the golden vectors to `protocol/vectors/` (or the directory given as the argument).

#[path = "../tests/support/vectors_gen.rs"]
mod vectors_gen;

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let dir = std::env::args().nth(1).map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../protocol/vectors")
    });
    std::fs::create_dir_all(&dir)?;
    let cases = vectors_gen::cases();
    for c in &cases {
        std::fs::write(dir.join(format!("{}.bin", c.name)), &c.bytes)?;
    }
    std::fs::write(dir.join("manifest.json"), vectors_gen::manifest(&cases))?;
    println!("wrote {} vectors to {}", cases.len(), dir.display());
    Ok(())
}
