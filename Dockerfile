# The managed-jobs operator image: the release binary and the few shared libraries it loads, on
# no base image, so that it builds with `podman build`, `buildah bud` or `docker build` without
# pulling anything. Build it with:
#
#   hack/image.sh                   # cargo build --release, assembles target/image, builds
#                                   # managed-jobs:dev with podman, buildah or docker
#
# which runs, after assembling the build context target/image/rootfs:
#
#   podman build -f Dockerfile -t managed-jobs:dev target/image
#
# target/image/rootfs holds (hack/image.sh, from a Debian 12 "bookworm" build machine):
#   /managed-jobs                 cargo build --release --locked --bin managed-jobs
#   /lib/x86_64-linux-gnu/...     the shared libraries `ldd` lists for it (glibc's libc and libm,
#   /lib64/ld-linux-x86-64.so.2   libgcc_s) and the dynamic loader, copied from the build machine
#   /etc/passwd, /etc/group       root and nonroot (65532)
#   /tmp                          mode 1777 (the chart mounts an emptyDir there)
#
# How it differs from the image this file built before (a rust:1.95-bookworm builder stage, then
# gcr.io/distroless/cc-debian12:nonroot): the binary is built on the host instead of in a builder
# stage, and the base is only what the binary loads, from the same Debian release distroless
# cc-debian12 is made of (glibc 2.36, libgcc_s); distroless also carries libssl, CA certificates,
# tzdata and os-release, none of which the operator reads (it trusts only its ServiceAccount's
# CA). Same user (65532), no shell, same entrypoint.
FROM scratch
COPY rootfs/ /
USER 65532:65532
ENTRYPOINT ["/managed-jobs"]
CMD ["run"]
