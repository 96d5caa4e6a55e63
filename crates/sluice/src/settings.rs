//! Configuration layering shared by `sluice server` and `sluice coordinator`: a TOML file, then
//! environment variables, then command-line flags, each overriding the one before; the result is
//! deserialized into the component's config struct (unknown keys are errors).
//!
//! Environment: `SLUICE_SERVER_MEMORY_BUDGET_BYTES=1073741824` sets `memory_budget_bytes`;
//! a double underscore reaches into a table: `SLUICE_SERVER_TRANSPORT__ZERO_COPY=false`.

use anyhow::{bail, Context};
use serde::de::DeserializeOwned;
use toml::{Table, Value};

/// Parses a flag or environment value: TOML syntax when it parses (numbers, booleans, arrays),
/// otherwise a plain string.
fn parse_value(raw: &str) -> Value {
    format!("v = {raw}")
        .parse::<Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| Value::String(raw.to_owned()))
}

/// Sets `a.b.c = value` in `table`, creating tables on the way.
fn set_path(table: &mut Table, path: &[&str], value: Value) -> anyhow::Result<()> {
    let (last, parents) = path.split_last().context("empty key")?;
    let mut t = table;
    for p in parents {
        let entry = t.entry(p.to_string()).or_insert_with(|| Value::Table(Table::new()));
        let Value::Table(inner) = entry else { bail!("{p} is not a table") };
        t = inner;
    }
    t.insert(last.to_string(), value);
    Ok(())
}

/// Environment variables that share a config prefix but are no config key: `sluice admin`'s
/// (a coordinator started in the same environment, as `sluice local` starts one, must not take
/// it for an unknown key and refuse to start).
const NOT_CONFIG: &[&str] = &["SLUICE_COORDINATOR_ADMIN"];

/// Builds a config: `file` (optional), then env vars with `env_prefix`, then `sets` given as
/// `key.path=value`.
pub fn load<T: DeserializeOwned>(
    file: Option<&std::path::Path>,
    env_prefix: &str,
    sets: &[(String, Value)],
) -> anyhow::Result<T> {
    let mut table = match file {
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("reading {}", p.display()))?
            .parse::<Table>()
            .with_context(|| format!("parsing {}", p.display()))?,
        None => Table::new(),
    };
    for (k, v) in std::env::vars() {
        if NOT_CONFIG.contains(&k.as_str()) {
            continue;
        }
        if let Some(key) = k.strip_prefix(env_prefix) {
            let key = key.to_ascii_lowercase();
            let path: Vec<&str> = key.split("__").collect();
            set_path(&mut table, &path, parse_value(&v))
                .with_context(|| format!("environment {k}"))?;
        }
    }
    for (k, v) in sets {
        let path: Vec<&str> = k.split('.').collect();
        set_path(&mut table, &path, v.clone()).with_context(|| format!("setting {k}"))?;
    }
    Value::Table(table).try_into().context("invalid configuration")
}

/// Parses `--set key=value`.
pub fn parse_set(s: &str) -> Result<(String, Value), String> {
    let (k, v) = s.split_once('=').ok_or_else(|| format!("expected key=value, got {s}"))?;
    Ok((k.trim().to_owned(), parse_value(v.trim())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug, Default)]
    #[serde(default, deny_unknown_fields)]
    struct Inner {
        zero_copy: bool,
    }
    #[derive(serde::Deserialize, Debug, Default)]
    #[serde(default, deny_unknown_fields)]
    struct Conf {
        budget: u64,
        dirs: Vec<String>,
        name: String,
        transport: Inner,
    }

    #[test]
    fn layers_file_then_sets() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.toml");
        std::fs::write(&f, "budget = 5\nname = \"a\"\n[transport]\nzero_copy = false\n").unwrap();
        let sets = vec![
            parse_set("budget=7").unwrap(),
            parse_set("transport.zero_copy=true").unwrap(),
            parse_set("dirs=[\"/x\"]").unwrap(),
        ];
        let c: Conf = load(Some(&f), "SLUICE_TEST_NOPE_", &sets).unwrap();
        assert_eq!(
            (c.budget, c.name.as_str(), c.transport.zero_copy, c.dirs.len()),
            (7, "a", true, 1)
        );
        assert!(load::<Conf>(None, "SLUICE_TEST_NOPE_", &[parse_set("bogus=1").unwrap()]).is_err());
    }
}
