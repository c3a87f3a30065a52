//! Generates the clients and servers from proto/ with a vendored protoc: no system protoc.
fn main() {
    let protoc = protoc_bin_vendored::protoc_bin_path().expect("vendored protoc");
    // SAFETY: build scripts are single-threaded.
    unsafe { std::env::set_var("PROTOC", protoc) };
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        .compile_protos(
            &["proto/cri_runtime_v1.proto", "proto/podresources_v1.proto"],
            &["proto"],
        )
        .expect("compiling the node API protos");
}
