#!/usr/bin/env python3
"""Signs a model directory with the real OpenSSF model_signing library, for the verifier's tests.

usage: sign.py MODEL_DIR SIGNATURE KEY_DIR files|shards|certificate [SHARD_SIZE] [CURVE] [IGNORE_PATH ...]

Makes an ECDSA key pair on CURVE (secp256r1, the default; secp384r1; secp521r1: the curves
model_signing signs with) in KEY_DIR (private.pem, public.pem) unless one is there. The
`files` bundle is made with the `model_signing sign key` command line, as a release pipeline
would; the `shards` bundle with the Python API, the only way model_signing offers shard
serialization. `certificate` also makes a root CA (RSA 3072, as CAs still are; KEY_DIR/ca.pem), an
intermediate CA (P-384; intermediate.pem) and a code-signing certificate for the key (signing.pem),
and signs with `model_signing sign certificate`, the bundle carrying the signing certificate and
the intermediate. With CERT_FLAW set, the chain has one flaw a verifier must catch: `expired` (the
intermediate's validity ended before the signing certificate's began), `not-for-signing` (the
signing certificate allows key encipherment only), `intermediate-not-ca` (no CA basic constraint),
`path-length` (the root allows no CA below it, and the intermediate is one).
With HASH set (blake3 or blake2: model_signing 1.1's `hashing_algorithm`, which only its API
takes), `files` and `shards` bundles hash the files with it, through the API.
"""
import os
import datetime
import pathlib
import subprocess
import sys

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


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


def certificate(subject, key, issuer_name, issuer_key, ca, flaw=None):
    now = datetime.datetime.now(datetime.timezone.utc)
    valid_from, valid_until = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=30)
    if flaw == "expired":
        valid_from, valid_until = now - datetime.timedelta(days=60), now - datetime.timedelta(days=1)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid_from)
        .not_valid_after(valid_until)
        .add_extension(
            x509.BasicConstraints(
                ca=ca and flaw != "intermediate-not-ca", path_length=0 if flaw == "path-length" else None
            ),
            critical=True,
        )
        .add_extension(
            x509.KeyUsage(
                digital_signature=not ca and flaw != "not-for-signing", content_commitment=False,
                key_encipherment=flaw == "not-for-signing",
                data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
    )
    if not ca and flaw != "not-for-signing":
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def make_chain(key_dir: pathlib.Path, private: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    root_key = rsa.generate_private_key(public_exponent=65537, key_size=3072)
    intermediate_key = ec.generate_private_key(ec.SECP384R1())
    signer_key = serialization.load_pem_private_key(private.read_bytes(), password=None)
    flaw = os.environ.get("CERT_FLAW")
    root = certificate("test root CA", root_key, "test root CA", root_key, True, flaw if flaw == "path-length" else None)
    intermediate = certificate(
        "test intermediate CA", intermediate_key, "test root CA", root_key, True,
        flaw if flaw in ("expired", "intermediate-not-ca") else None,
    )
    signing = certificate(
        "model signer", signer_key, "test intermediate CA", intermediate_key, False,
        flaw if flaw == "not-for-signing" else None,
    )
    pem = lambda cert: cert.public_bytes(serialization.Encoding.PEM)
    (key_dir / "ca.pem").write_bytes(pem(root))
    (key_dir / "intermediate.pem").write_bytes(pem(intermediate))
    (key_dir / "signing.pem").write_bytes(pem(signing))
    return key_dir / "signing.pem", key_dir / "intermediate.pem"


def main() -> None:
    model, signature, key_dir, method = sys.argv[1:5]
    curve = sys.argv[6] if len(sys.argv) > 6 else "secp256r1"
    ignored = [arg for path in sys.argv[7:] for arg in ("--ignore-paths", str(pathlib.Path(model) / path))]
    private = ensure_key(pathlib.Path(key_dir), curve)
    algorithm = os.environ.get("HASH")
    if algorithm and method in ("files", "shards"):
        import model_signing
        from model_signing import hashing

        config = model_signing.signing.Config().use_elliptic_key_signer(private_key=private)
        if method == "files":
            hashed = hashing.Config().use_file_serialization(hashing_algorithm=algorithm)
        else:
            hashed = hashing.Config().use_shard_serialization(
                hashing_algorithm=algorithm, shard_size=int(sys.argv[5])
            )
        config.set_hashing_config(hashed)
        config.sign(model, signature)
    elif method == "files":
        subprocess.run(
            ["model_signing", "sign", "key", "--private_key", str(private), "--signature", signature, *ignored, model],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    elif method == "certificate":
        signing, intermediate = make_chain(pathlib.Path(key_dir), private)
        subprocess.run(
            ["model_signing", "sign", "certificate", "--private_key", str(private),
             "--signing_certificate", str(signing), "--certificate_chain", str(intermediate),
             "--signature", signature, *ignored, model],
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
