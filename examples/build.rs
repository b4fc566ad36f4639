//! Compiles `proto/stock.proto` for the `tonic-stack` example with protox, a
//! protobuf compiler written in Rust, so no `protoc` binary is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/stock.proto");
    let descriptors = protox::compile(["proto/stock.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
