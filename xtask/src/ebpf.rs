//! Building the eBPF object. Everything it needs is installed under target/bpf-tools on
//! first use, so a fresh machine needs nothing but rustup and the pinned nightly.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::workspace_root;

/// The nightly that builds the eBPF crate (-Z build-std); its libLLVM must match bpf-linker's.
const TOOLCHAIN: &str = "nightly";
const BPF_LINKER_VERSION: &str = "0.13.0";
const LLVM_FEATURE: &str = "llvm-22";
const TARGET: &str = "bpfel-unknown-none";

pub fn object_path() -> PathBuf {
    workspace_root()
        .join("target")
        .join(TARGET)
        .join("release")
        .join("agent-ebpf")
}

pub fn build() -> Result<PathBuf> {
    let root = workspace_root();
    let tools = root.join("target").join("bpf-tools");
    let sysroot = toolchain_sysroot()?;
    ensure_rust_src(&sysroot)?;
    let linker = ensure_bpf_linker(&tools, &sysroot)?;

    let path = format!(
        "{}:{}",
        linker.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    eprintln!("xtask: building the eBPF object ({TARGET}, +{TOOLCHAIN})");
    let status = Command::new("rustup")
        .args([
            "run",
            TOOLCHAIN,
            "cargo",
            "build",
            "-p",
            "agent-ebpf",
            "--release",
        ])
        .args(["--target", TARGET, "-Z", "build-std=core"])
        .current_dir(&root)
        .env("PATH", path)
        // BTF in the object: aya-log and the verifier's messages need it.
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            "-Cdebuginfo=2\x1f-Clink-arg=--btf",
        )
        // The workspace's release LTO is for the agent: with these the programs' code is
        // byte for byte what the kernel matrix verified (only its DWARF differs).
        .env("CARGO_PROFILE_RELEASE_LTO", "false")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16")
        .env_remove("RUSTFLAGS")
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO")
        .status()
        .context("running rustup (is rustup installed?)")?;
    if !status.success() {
        bail!("building agent-ebpf failed ({status})");
    }
    let obj = object_path();
    if !obj.exists() {
        bail!("the build succeeded but {} is missing", obj.display());
    }
    eprintln!("xtask: eBPF object at {}", obj.display());
    Ok(obj)
}

fn toolchain_sysroot() -> Result<PathBuf> {
    let out = Command::new("rustup")
        .args(["run", TOOLCHAIN, "rustc", "--print", "sysroot"])
        .output()
        .context("running rustup: the eBPF build needs rustup with a nightly toolchain")?;
    if !out.status.success() {
        bail!(
            "no {TOOLCHAIN} toolchain: install it with `rustup toolchain install {TOOLCHAIN}` ({})",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

fn ensure_rust_src(sysroot: &Path) -> Result<()> {
    if sysroot.join("lib/rustlib/src/rust/library/core").exists() {
        return Ok(());
    }
    eprintln!("xtask: installing rust-src for {TOOLCHAIN} (needed by -Z build-std=core)");
    let status = Command::new("rustup")
        .args(["component", "add", "rust-src", "--toolchain", TOOLCHAIN])
        .status()?;
    if !status.success() {
        bail!("`rustup component add rust-src --toolchain {TOOLCHAIN}` failed; run it by hand");
    }
    Ok(())
}

/// bpf-linker linked against the toolchain's own libLLVM, so both speak the same bitcode.
fn ensure_bpf_linker(tools: &Path, sysroot: &Path) -> Result<PathBuf> {
    let bin = tools.join("bin").join("bpf-linker");
    let llvm_lib = find_libllvm(sysroot)?;
    let stamp = tools.join("bpf-linker.stamp");
    let want = format!("{BPF_LINKER_VERSION} {}", llvm_lib.display());
    if bin.exists() && fs::read_to_string(&stamp).ok().as_deref() == Some(want.as_str()) {
        return Ok(bin);
    }
    // bpf-linker's build looks for $LLVM_PREFIX/lib/libLLVM.so; the toolchain ships it
    // under a versioned name only. The prefix must outlive the build: the binary keeps an
    // rpath to it.
    let prefix = tools.join("llvm");
    let lib = prefix.join("lib");
    fs::create_dir_all(&lib)?;
    let name = llvm_lib.file_name().unwrap();
    for link in [lib.join("libLLVM.so"), lib.join(name)] {
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(&llvm_lib, &link)
            .with_context(|| format!("linking {}", link.display()))?;
    }
    eprintln!(
        "xtask: installing bpf-linker {BPF_LINKER_VERSION} into {}",
        tools.display()
    );
    let status = Command::new("cargo")
        .args([
            "install",
            "bpf-linker",
            "--locked",
            "--version",
            BPF_LINKER_VERSION,
        ])
        .args([
            "--no-default-features",
            "--features",
            LLVM_FEATURE,
            "--root",
        ])
        .arg(tools)
        .env("LLVM_PREFIX", &prefix)
        .env_remove("CARGO_TARGET_DIR")
        .status()
        .context("running cargo install")?;
    if !status.success() {
        bail!(
            "installing bpf-linker failed; it needs crates.io and a C++ compiler (gcc/g++), \
             and links against {}",
            llvm_lib.display()
        );
    }
    fs::write(&stamp, want)?;
    Ok(bin)
}

fn find_libllvm(sysroot: &Path) -> Result<PathBuf> {
    let dir = sysroot.join("lib");
    for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("libLLVM.so.") {
            return Ok(path);
        }
    }
    bail!(
        "no libLLVM.so.* in {}: the {TOOLCHAIN} toolchain must ship LLVM (install it with rustup)",
        dir.display()
    )
}
