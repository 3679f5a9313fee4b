//! The git commit for `mlnode_build_info{revision}` (a container build without `.git` passes it as
//! BUILD_GIT_REVISION).
fn main() {
    let revision = std::env::var("BUILD_GIT_REVISION")
        .ok()
        .filter(|r| !r.is_empty())
        .or_else(|| {
            let out = std::process::Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=BUILD_GIT_REVISION={revision}");
    println!("cargo:rerun-if-env-changed=BUILD_GIT_REVISION");
    // HEAD moves on a checkout; the branch it names moves on every commit (or in packed-refs).
    println!("cargo:rerun-if-changed=../.git/HEAD");
    if let Some(branch) = std::fs::read_to_string("../.git/HEAD")
        .ok()
        .and_then(|head| head.trim().strip_prefix("ref: ").map(str::to_string))
    {
        println!("cargo:rerun-if-changed=../.git/{branch}");
        println!("cargo:rerun-if-changed=../.git/packed-refs");
    }
}
