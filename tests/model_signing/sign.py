#!/usr/bin/env python3
"""Signs a model directory with the real OpenSSF model_signing library, for the verifier's tests.

usage: sign.py MODEL_DIR SIGNATURE KEY_DIR files|shards [SHARD_SIZE] [CURVE] [IGNORE_PATH ...]

Makes an ECDSA key pair on CURVE (secp256r1, the default; secp384r1; secp521r1: the curves
model_signing signs with) in KEY_DIR (private.pem, public.pem) unless one is there. The
`files` bundle is made with the `model_signing sign key` command line, as a release pipeline
would; the `shards` bundle with the Python API, the only way model_signing offers shard
serialization.
"""
import pathlib
import subprocess
import sys

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec


CURVES = {"secp256r1": ec.SECP256R1, "secp384r1": ec.SECP384R1, "secp521r1": ec.SECP521R1}


def ensure_key(key_dir: pathlib.Path, curve: str) -> pathlib.Path:
    private = key_dir / "private.pem"
    if not private.exists():
        key = ec.generate_private_key(CURVES[curve]())
        private.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        (key_dir / "public.pem").write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM,
                serialization.PublicFormat.SubjectPublicKeyInfo,
            )
        )
    return private


def main() -> None:
    model, signature, key_dir, method = sys.argv[1:5]
    curve = sys.argv[6] if len(sys.argv) > 6 else "secp256r1"
    ignored = [arg for path in sys.argv[7:] for arg in ("--ignore-paths", str(pathlib.Path(model) / path))]
    private = ensure_key(pathlib.Path(key_dir), curve)
    if method == "files":
        subprocess.run(
            ["model_signing", "sign", "key", "--private_key", str(private), "--signature", signature, *ignored, model],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    elif method == "shards":
        import model_signing
        from model_signing import hashing

        shard_size = int(sys.argv[5])
        config = model_signing.signing.Config().use_elliptic_key_signer(private_key=private)
        config.set_hashing_config(hashing.Config().use_shard_serialization(shard_size=shard_size))
        config.sign(model, signature)
    else:
        sys.exit(f"unknown method {method!r}")


if __name__ == "__main__":
    main()
