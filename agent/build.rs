//! Embeds the eBPF object built by `cargo xtask build-ebpf`. Without it (plain `cargo check`,
//! clippy, a machine without the BPF toolchain) an empty placeholder is embedded and the
//! agent runs in its /proc mode, saying why.
use std::{env, fs, path::PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=GPU_AGENT_EBPF_OBJECT");
    let object = env::var_os("GPU_AGENT_EBPF_OBJECT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap());
            let target = env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| manifest.parent().unwrap().join("target"));
            target.join("bpfel-unknown-none/release/agent-ebpf")
        });
    println!("cargo:rerun-if-changed={}", object.display());
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap()).join("agent-ebpf.o");
    match fs::read(&object) {
        Ok(bytes) => fs::write(&out, bytes).expect("writing OUT_DIR/agent-ebpf.o"),
        Err(_) => {
            println!(
                "cargo:warning=no eBPF object at {}: the agent will run in /proc mode; \
                 run `cargo xtask build-ebpf` first",
                object.display()
            );
            fs::write(&out, []).expect("writing the placeholder object");
        }
    }
}
