//! The kubelet's side of CRI for `cargo xtask e2e-container` (client only), generated with a
//! vendored protoc as node-api does.
fn main() {
    let protoc = protoc_bin_vendored::protoc_bin_path().expect("vendored protoc");
    // SAFETY: build scripts are single-threaded.
    unsafe { std::env::set_var("PROTOC", protoc) };
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        .build_server(false)
        .compile_protos(&["proto/cri_kubelet_v1.proto"], &["proto"])
        .expect("compiling proto/cri_kubelet_v1.proto");
}
