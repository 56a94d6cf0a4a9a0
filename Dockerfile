# syntax=docker/dockerfile:1
# The managed-jobs operator image: one static-ish binary (glibc, bundled SQLite) on distroless.
#   docker build -t managed-jobs .

FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
# Cache mounts keep the crate registry and build artefacts between builds (BuildKit); the binary is
# copied out of the cached target dir so the next stage can see it.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin managed-jobs \
    && cp target/release/managed-jobs /managed-jobs

# cc-debian12: glibc and libgcc_s for a Rust binary built on bookworm (same Debian release); no shell.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /managed-jobs /managed-jobs
USER 65532:65532
ENTRYPOINT ["/managed-jobs"]
CMD ["run"]
