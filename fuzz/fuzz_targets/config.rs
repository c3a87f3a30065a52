//! Config parsing and validation, TOML and YAML, with OTEL_* variables: whatever the input,
//! an error or a config, never a panic, a hang or an overflow.
#![no_main]

use gpu_agent::config::Config;
use libfuzzer_sys::fuzz_target;

// Input: the first byte picks TOML (even) or YAML (odd); the text runs to the first NUL;
// each further NUL-separated "NAME=VALUE" is the variable OTEL_NAME.
fuzz_target!(|data: &[u8]| {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let mut parts = rest.split(|&b| b == 0);
    let Ok(text) = std::str::from_utf8(parts.next().unwrap_or_default()) else {
        return;
    };
    let env: Vec<(String, String)> = parts
        .filter_map(|p| {
            let (k, v) = std::str::from_utf8(p).ok()?.split_once('=')?;
            Some((format!("OTEL_{k}"), v.to_string()))
        })
        .collect();
    let parsed = if kind % 2 == 0 {
        Config::from_toml(text)
    } else {
        Config::from_yaml(text)
    };
    if let Ok(config) = parsed {
        let _ = config.resolve(|k| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()));
    }
});
