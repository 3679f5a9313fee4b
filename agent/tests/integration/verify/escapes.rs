//! Opening files safely, both ways (openat2 and the O_NOFOLLOW walk): manifest paths that escape,
//! symlinks out of the root, chains, loops, and bundles that do not allow symlinks.

use super::*;

#[test]
fn unsafe_manifest_paths_are_refused_before_any_open() {
    let model = PlainModel::new();
    let digest = sha256_hex(b"x");
    for path in [
        "../outside.json",
        "/etc/passwd",
        "a/../config.json",
        "./config.json",
        "a//b",
        "dir/",
        "",
    ] {
        let manifest = serde_json::json!({"revision": "v1", "files": {path: digest}}).to_string();
        let report = run(model.root(), &manifest, Strategy::Auto);
        assert_eq!(
            status(&report, path),
            FileStatus::UnsafePath,
            "path {path:?}"
        );
        assert_eq!(report.status, Verdict::Failed);
    }
}

#[test]
fn symlink_to_etc_passwd_escapes_root() {
    for strategy in STRATEGIES {
        let model = PlainModel::new();
        std::fs::remove_file(model.path("config.json")).unwrap();
        symlink("/etc/passwd", model.path("config.json")).unwrap();
        let report = run(model.root(), &model.manifest_json("v1", true), strategy);
        assert_eq!(
            status(&report, "config.json"),
            FileStatus::EscapesRoot,
            "{strategy:?}"
        );

        // The same file reached by climbing out with `..` is caught too.
        std::fs::remove_file(model.path("config.json")).unwrap();
        symlink(
            "../../../../../../../../etc/passwd",
            model.path("config.json"),
        )
        .unwrap();
        let report = run(model.root(), &model.manifest_json("v1", true), strategy);
        assert_eq!(
            status(&report, "config.json"),
            FileStatus::EscapesRoot,
            "{strategy:?}"
        );
    }
}

#[test]
fn directory_symlink_that_escapes_is_caught_on_the_way() {
    for strategy in STRATEGIES {
        let model = PlainModel::new();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(
            outside.path().join("tokenizer.json"),
            &model.files["tokenizer/tokenizer.json"],
        )
        .unwrap();
        std::fs::remove_dir_all(model.path("tokenizer")).unwrap();
        symlink(outside.path(), model.path("tokenizer")).unwrap();
        let report = run(model.root(), &model.manifest_json("v1", true), strategy);
        // Same content, but outside ROOT: not acceptable.
        assert_eq!(
            status(&report, "tokenizer/tokenizer.json"),
            FileStatus::EscapesRoot,
            "{strategy:?}"
        );
    }
}

#[test]
fn symlink_chain_inside_root_is_fine() {
    for strategy in STRATEGIES {
        let model = PlainModel::new();
        let shard = "model-00002-of-00002.safetensors";
        std::fs::create_dir_all(model.path("store/deep")).unwrap();
        std::fs::rename(model.path(shard), model.path("store/deep/real.bin")).unwrap();
        symlink("deep/real.bin", model.path("store/hop")).unwrap();
        symlink("store/hop", model.path(shard)).unwrap();
        let report = run(model.root(), &model.manifest_json("v1", true), strategy);
        assert_eq!(
            status(&report, shard),
            FileStatus::Ok,
            "{strategy:?}: {report:#?}"
        );
        assert_eq!(report.status, Verdict::Verified);
        assert_eq!(status(&report, "store/deep/real.bin"), FileStatus::Extra);
    }
}

/// A model_signing bundle signed with `allow_symlinks: false` (model_signing's default) reaches no
/// file through a symlink, even one that stays inside ROOT, in either way of opening; the other
/// files still verify. A directory symlink on the way is refused the same.
#[test]
fn a_bundle_without_allow_symlinks_refuses_every_symlink() {
    for strategy in STRATEGIES {
        let model = PlainModel::new();
        let shard = "model-00002-of-00002.safetensors";
        std::fs::create_dir_all(model.path("store")).unwrap();
        std::fs::rename(model.path(shard), model.path("store/real.bin")).unwrap();
        symlink("store/real.bin", model.path(shard)).unwrap();
        let mut manifest = manifest::parse(
            Path::new("bundle.sig"),
            model.manifest_json("v1", true).as_bytes(),
            &TrustPolicy::RequireKey,
        )
        .unwrap();
        manifest.allow_symlinks = false;
        let options = VerifyOptions {
            strategy,
            ..VerifyOptions::default()
        };
        let report = verify(model.root(), &manifest, &options, &Control::default()).unwrap();
        assert_eq!(
            status(&report, shard),
            FileStatus::UnsafePath,
            "{strategy:?}"
        );
        assert!(
            error(&report, shard).contains("allow_symlinks"),
            "{report:#?}"
        );
        assert_eq!(status(&report, "config.json"), FileStatus::Ok);
        assert_eq!(report.status, Verdict::Failed);

        // The file back in place, its folder reached through a symlinked directory instead.
        std::fs::remove_file(model.path(shard)).unwrap();
        std::fs::rename(model.path("store/real.bin"), model.path(shard)).unwrap();
        let nested = "tokenizer/tokenizer.json";
        std::fs::rename(model.path("tokenizer"), model.path("store/tok")).unwrap();
        symlink("store/tok", model.path("tokenizer")).unwrap();
        let report = verify(model.root(), &manifest, &options, &Control::default()).unwrap();
        assert_eq!(
            status(&report, nested),
            FileStatus::UnsafePath,
            "{strategy:?}"
        );
        assert_eq!(status(&report, shard), FileStatus::Ok, "{strategy:?}");
        manifest.allow_symlinks = true;
        let report = verify(model.root(), &manifest, &options, &Control::default()).unwrap();
        assert_eq!(status(&report, nested), FileStatus::Ok, "{strategy:?}");
    }
}

#[test]
fn symlink_loop_is_an_io_error_not_a_hang() {
    for strategy in STRATEGIES {
        let model = PlainModel::new();
        std::fs::remove_file(model.path("config.json")).unwrap();
        symlink("loop-b", model.path("config.json")).unwrap();
        symlink("config.json", model.path("loop-b")).unwrap();
        let report = run(model.root(), &model.manifest_json("v1", true), strategy);
        assert_eq!(
            status(&report, "config.json"),
            FileStatus::IoError,
            "{strategy:?}"
        );
        assert!(
            error(&report, "config.json").contains("symbolic links"),
            "{report:#?}"
        );
    }
}
