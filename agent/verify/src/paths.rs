//! What a path in a manifest may look like. Checked before the path touches the file system, by
//! every stage that takes one from a manifest (the verifier, the layout's symlink checks).

/// Checks that a manifest path is relative and normalised: no leading `/`, no empty, `.` or `..`
/// components, no NUL. Anything else could name a file outside the model, or a different file
/// than the one the manifest's author meant.
pub fn check_relative_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("the path is empty".into());
    }
    if path.contains('\0') {
        return Err("the path contains a NUL byte".into());
    }
    if path.starts_with('/') {
        return Err("the path is absolute".into());
    }
    for component in path.split('/') {
        match component {
            "" => return Err("the path has an empty component (`//` or a trailing `/`)".into()),
            "." => {
                return Err("the path has a `.` component; manifests use normalised paths".into())
            }
            ".." => return Err("the path has a `..` component".into()),
            _ => {}
        }
    }
    Ok(())
}
