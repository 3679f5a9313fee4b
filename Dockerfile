# The agent image: built with the project's Rust toolchain, shipped on distroless (no shell, no
# package manager) as a fixed non-root user. `docker run IMAGE --version` works in it.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
ARG BUILD_GIT_REVISION=unknown
ENV BUILD_GIT_REVISION=${BUILD_GIT_REVISION}
RUN cargo build --release --locked -p mlnode-agent && strip target/release/mlnode-agent

# The kernel log's reader: Debian's libsystemd0 (bookworm's 252, the newest the base offers: it reads
# the compact-mode and zstd journals of newer hosts) and the libraries it links (libcap, libgcrypt,
# libgpg-error and the compressions lz4, xz, zstd), which distroless/cc lacks; glibc is the base's.
# Loaded at run time, LGPL-2.1-or-later (docs/security.md); the agent runs without it.
FROM debian:bookworm-slim AS libsystemd
RUN apt-get update \
 && apt-get install -y --no-install-recommends libsystemd0 \
 && lib=$(readlink -f /usr/lib/*-linux-gnu/libsystemd.so.0) \
 && dir=/out$(dirname "$lib") \
 && mkdir -p "$dir" \
 && for dep in "libsystemd.so.0=$lib" $(ldd "$lib" | awk '$2 == "=>" && $1 !~ /^(libc[.]so|ld-linux)/ {print $1 "=" $3}'); do \
      real=$(readlink -f "${dep#*=}") \
      && cp "$real" "$dir/${dep%%=*}" \
      && package=$(dpkg -S "*/$(basename "$real")" | head -n 1 | cut -d: -f1) \
      && mkdir -p "/out/usr/share/doc/$package" \
      && cp "/usr/share/doc/$package/copyright" "/out/usr/share/doc/$package/"; \
    done

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/mlnode-agent /usr/local/bin/mlnode-agent
COPY --from=libsystemd /out/ /
USER 65532:65532
EXPOSE 9400
ENTRYPOINT ["/usr/local/bin/mlnode-agent"]
CMD ["serve", "--config", "/etc/mlnode/config.yaml"]
