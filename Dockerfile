# The agent image: built with the project's Rust toolchain, shipped on distroless (no shell, no
# package manager) as a fixed non-root user. `docker run IMAGE --version` works in it.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
ARG BUILD_GIT_REVISION=unknown
ENV BUILD_GIT_REVISION=${BUILD_GIT_REVISION}
RUN cargo build --release --locked -p mlnode-agent && strip target/release/mlnode-agent

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/mlnode-agent /usr/local/bin/mlnode-agent
USER 65532:65532
EXPOSE 9400
ENTRYPOINT ["/usr/local/bin/mlnode-agent"]
CMD ["serve", "--config", "/etc/mlnode/config.yaml"]
