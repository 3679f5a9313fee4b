//! The kubelet pod-resources gRPC client from proto/podresources.proto (the kubelet's `api.proto`),
//! compiled with the protoc that the protoc-bin-vendored crate ships (no system protoc needed).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    // The client only: the tests' fake kubelet generates its server side (tests/fake-kubelet).
    tonic_prost_build::configure()
        .build_server(false)
        .compile_protos(&["proto/podresources.proto"], &["proto"])?;
    Ok(())
}
