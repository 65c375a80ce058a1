//! Compiles the gRPC protocols in `proto/` into Rust, without protoc.
//!
//! `protox` parses the `.proto` files into a descriptor set in pure Rust, and
//! `tonic-prost-build` turns that into messages, clients and servers. Each
//! protocol is compiled on its own into its own directory under `OUT_DIR`,
//! because kubelet APIs reuse package names (the device plugin API is package
//! `v1beta1`, the pod resources API and DRA resource health v1 are both `v1`)
//! and prost writes one file per package. Add a protocol by adding a line to [`PROTOS`] and an `include!` of
//! `concat!(env!("OUT_DIR"), "/<out_dir>/<package>.rs")` where it is used.

use std::io;
use std::path::{Path, PathBuf};

/// One protocol to compile.
struct Proto {
    /// The file, relative to `proto/` (which is also the include root).
    file: &'static str,
    /// Directory under `OUT_DIR` that receives the generated `<package>.rs`.
    out_dir: &'static str,
}

const PROTOS: &[Proto] = &[
    Proto {
        file: "k8s.io/kubelet/deviceplugin/v1beta1/api.proto",
        out_dir: "deviceplugin",
    },
    Proto {
        file: "k8s.io/kubelet/podresources/v1/api.proto",
        out_dir: "podresources",
    },
    Proto {
        file: "k8s.io/kubelet/pluginregistration/v1/api.proto",
        out_dir: "pluginregistration",
    },
    Proto {
        file: "k8s.io/kubelet/dra/v1/api.proto",
        out_dir: "dra-v1",
    },
    Proto {
        file: "k8s.io/kubelet/dra/v1beta1/api.proto",
        out_dir: "dra-v1beta1",
    },
    Proto {
        file: "k8s.io/kubelet/dra-health/v1alpha1/api.proto",
        out_dir: "dra-health-v1alpha1",
    },
    Proto {
        file: "k8s.io/kubelet/dra-health/v1beta1/api.proto",
        out_dir: "dra-health-v1beta1",
    },
    Proto {
        file: "k8s.io/kubelet/dra-health/v1/api.proto",
        out_dir: "dra-health-v1",
    },
    // The health socket of AMD's device-metrics-exporter (src/metricssvc/).
    Proto {
        file: "metricssvc/metricssvc.proto",
        out_dir: "metricssvc",
    },
];

fn main() -> io::Result<()> {
    let include = Path::new("proto");
    let out_root = PathBuf::from(std::env::var_os("OUT_DIR").ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "OUT_DIR is not set (not run by cargo?)",
        )
    })?);
    println!("cargo:rerun-if-changed=build.rs");
    for proto in PROTOS {
        let path = include.join(proto.file);
        println!("cargo:rerun-if-changed={}", path.display());
        let descriptors = protox::compile([proto.file], [include]).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        })?;
        let out_dir = out_root.join(proto.out_dir);
        std::fs::create_dir_all(&out_dir)?;
        tonic_prost_build::configure()
            .build_client(true)
            .build_server(true)
            .out_dir(&out_dir)
            .compile_fds(descriptors)?;
    }
    Ok(())
}
