//! The server side of kubelet's pod-resources API v1, from the agent's copy of the proto
//! (agent/kube/proto/podresources.proto, kubelet's `api.proto`).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    println!("cargo:rerun-if-changed=../../agent/kube/proto/podresources.proto");
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .compile_protos(
            &["../../agent/kube/proto/podresources.proto"],
            &["../../agent/kube/proto"],
        )?;
    Ok(())
}
