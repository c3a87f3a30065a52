//! `gpu-agent rightsize` run as an operator runs it: flags and environment in; exit code,
//! output and errors out.
use std::{path::Path, process::Command};

use serde_json::Value;

use crate::agent_binary;

/// What one run of the command gave.
pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// `gpu-agent rightsize ARGS` with `env` added to the environment.
pub fn rightsize(args: &[&str], env: &[(&str, &str)]) -> Output {
    let out = Command::new(agent_binary())
        .arg("rightsize")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("running gpu-agent rightsize");
    Output {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The recommendations for the records in `file`, one JSON object per workload and GPU
/// model (`--format json`); panics, with its stderr, when the command fails.
pub fn rightsize_json(file: &Path, args: &[&str], env: &[(&str, &str)]) -> Vec<Value> {
    rightsize_json_from(&["--file", file.to_str().unwrap()], args, env)
}

/// The same from a source of `from`'s flags (`--file F`, `--prometheus URL`).
pub fn rightsize_json_from(from: &[&str], args: &[&str], env: &[(&str, &str)]) -> Vec<Value> {
    let all = [from, &["--format", "json"], args].concat();
    let out = rightsize(&all, env);
    assert_eq!(out.code, 0, "rightsize {all:?}: {}", out.stderr);
    (out.stdout.lines())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// The line of `workload` in `lines` (any namespace and GPU model).
pub fn line<'a>(lines: &'a [Value], workload: &str) -> &'a Value {
    (lines.iter())
        .find(|l| l["workload"] == workload)
        .unwrap_or_else(|| panic!("no line for {workload}: {lines:#?}"))
}
