# syntax=docker/dockerfile:1
#
# The gpu-operator image: one static-ish Rust binary on distroless.
#
#   docker build -t gpu-operator:0.1.0 .
#
# The build stage compiles with the `udev` feature (hotplug on bare metal, and
# wherever the host root is "/"), which links libudev.so.1; the final stage is
# gcr.io/distroless/cc-debian12 (glibc and libgcc, no shell, no package
# manager) plus libudev and whatever else the binary links that distroless
# lacks, and kmod's `modprobe` with its libraries: driver management
# (spec.driver.enable) loads amdgpu with `modprobe --dirname <bundle>`, as
# KMM's worker images do, and distroless has none. Both stages are Debian 12, so the copied libraries match the glibc
# they run on. The cache mounts need BuildKit (the default builder since
# Docker 23).
#
# Pinning by digest. A tag (rust:1-bookworm, cc-debian12, gpu-operator:0.1.0)
# can be moved to another image by whoever can push to its registry; a digest
# names one image for good, and the agent runs as root on every GPU node.
# - The base images: pass them with their digests, e.g.
#     docker build \
#       --build-arg RUST_IMAGE=rust:1-bookworm@sha256:<digest> \
#       --build-arg RUNTIME_IMAGE=gcr.io/distroless/cc-debian12@sha256:<digest> \
#       -t registry.example.com/gpu-operator:0.1.0 .
#   where `docker buildx imagetools inspect IMAGE` prints each digest (the
#   index's, so that every architecture resolves). With name:tag@digest the
#   tag is only a label; the digest is what is pulled.
# - The image built here: push it, then deploy it as
#   registry.example.com/gpu-operator:0.1.0@sha256:<digest> (deploy/README.md,
#   Install, step 1, shows the commands).

ARG RUST_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12

FROM ${RUST_IMAGE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends libudev-dev pkg-config kmod \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# --locked: build exactly the dependency versions the tests ran with.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --features udev --bin gpu-operator \
 && install -D -m 0755 target/release/gpu-operator /out/usr/local/bin/gpu-operator \
 && install -D -m 0755 "$(readlink -f /usr/sbin/modprobe)" /out/usr/bin/kmod \
 && mkdir -p /out/usr/sbin \
 && ln -s ../bin/kmod /out/usr/sbin/modprobe
# Shared libraries the binary needs beyond what distroless/cc provides (glibc,
# libgcc_s): today libudev.so.1, which itself needs only glibc. Listing them
# with ldd rather than by name keeps the image right if a dependency changes.
# They go to /usr/lib/<multiarch>, where the dynamic loader looks by default.
RUN set -eu; \
    libdir="/out/usr/lib/$(gcc -print-multiarch)"; \
    mkdir -p "$libdir"; \
    for bin in /out/usr/local/bin/gpu-operator /out/usr/bin/kmod; do \
      if ldd "$bin" | grep -q 'not found'; then \
        ldd "$bin"; exit 1; \
      fi; \
      for lib in $(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'); do \
        name=$(basename "$lib"); \
        case "$name" in \
          libc.so.*|libm.so.*|libdl.so.*|librt.so.*|libpthread.so.*|libgcc_s.so.*|ld-linux*) ;; \
          *) cp -L "$lib" "$libdir/$name"; echo "bundling $name for $bin" ;; \
        esac; \
      done; \
    done; \
    test -e "$libdir/libudev.so.1"

FROM ${RUNTIME_IMAGE}
LABEL org.opencontainers.image.title="gpu-operator" \
      org.opencontainers.image.description="Runs AMD Instinct and Radeon GPUs on Kubernetes and on bare metal" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/ /
# Fails the build if the binary cannot load its libraries here (exec form: no
# shell needed).
RUN ["/usr/local/bin/gpu-operator", "--version"]
RUN ["/usr/sbin/modprobe", "--version"]
# distroless's "nonroot" user, for the subcommands that need no host access
# (validate, crd, discover --host-root on a copy). The agent DaemonSet
# overrides it with runAsUser: 0 because the kubelet's device-plugins and
# pod-resources directories and sockets are root-only; it still drops every
# capability (deploy/20-daemonset.yaml explains each privilege).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/gpu-operator"]
CMD ["--help"]
