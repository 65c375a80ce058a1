//! The simulated KFD: its topology (CPU and GPU nodes, memory banks, io and
//! p2p links) and the processes it shows under `/sys/class/kfd/kfd/proc`.
//!
//! This file owns KFD's layout. It must not write the PCI or DRM trees (the
//! module's `mod.rs` does) nor decide the partitions (the spec does).

use std::fmt::Write as _;

use super::{GpuLayout, KFD_TOPOLOGY, Layout, NodeLayout, SimError, SimSpec, Writer, write_atomic};
use crate::host::{HostError, HostRoot};

/// KFD's view of one process, as `kfd_process.c` lays it out under
/// `/sys/class/kfd/kfd/proc/<pid>`: a queue on each of `nodes` (KFD
/// topology node ids) and, per node, `stats_<gpu_id>/cu_occupancy` (the
/// compute units its waves occupy now) and `evicted_ms`.
pub fn add_kfd_process(host: &HostRoot, pid: u32, nodes: &[(u32, u32)]) -> Result<(), SimError> {
    let proc = format!("/sys/class/kfd/kfd/proc/{pid}");
    write_atomic(
        host,
        format!("{proc}/pasid"),
        format!("{}\n", 32768 + pid % 32768),
    )?;
    for (queue, (node, cu_occupancy)) in nodes.iter().enumerate() {
        let gpu_id = host.read_attr(format!("{KFD_TOPOLOGY}/nodes/{node}/gpu_id"))?;
        write_atomic(
            host,
            format!("{proc}/queues/{queue}/gpuid"),
            format!("{gpu_id}\n"),
        )?;
        write_atomic(host, format!("{proc}/queues/{queue}/size"), "1048576\n")?;
        let stats = format!("{proc}/stats_{gpu_id}");
        write_atomic(
            host,
            format!("{stats}/cu_occupancy"),
            format!("{cu_occupancy}\n"),
        )?;
        write_atomic(host, format!("{stats}/evicted_ms"), "0\n")?;
        write_atomic(host, format!("{proc}/vram_{gpu_id}"), "0\n")?;
    }
    Ok(())
}

/// The KFD topology; `generation` is its `generation_id`, which the kernel
/// bumps on every topology change.
pub(super) fn write_kfd(
    w: &mut Writer<'_>,
    spec: &SimSpec,
    layout: &Layout,
    generation: u64,
    topo: &str,
) -> Result<(), HostError> {
    let profile = spec.profile;
    let model = &profile.model;
    w.file(format!("{topo}/generation_id"), format!("{generation}\n"))?;
    w.file(
        format!("{topo}/system_properties"),
        "platform_oem 0\nplatform_id 0\nplatform_rev 0\n",
    )?;
    for cpu in 0..profile.cpu_nodes {
        let props = "cpu_cores_count 96\nsimd_count 0\nmem_banks_count 1\ngfx_target_version 0\n\
                     vendor_id 0\ndevice_id 0\nlocation_id 0\ndomain 0\ndrm_render_minor 0\n\
                     hive_id 0\nunique_id 0\n";
        w.file(format!("{topo}/nodes/{cpu}/properties"), props)?;
    }
    let gfx = model.gfx_target_version;
    let gfx_name = crate::device::gfx_target_name(gfx);
    for gpu in &layout.gpus {
        let per_gpu = spec.partitions_of(gpu.index);
        let simds = model.cu_count / per_gpu * model.simd_per_cu;
        for node in &gpu.nodes {
            let dir = format!("{topo}/nodes/{}", node.kfd_id);
            let (io_links, p2p_links) = links(spec, layout, gpu, node);
            let mut props = String::new();
            for (key, value) in [
                ("cpu_cores_count", 0),
                ("simd_count", u64::from(simds)),
                ("mem_banks_count", 1),
                ("io_links_count", io_links.len() as u64),
                ("p2p_links_count", p2p_links.len() as u64),
                ("simd_per_cu", u64::from(model.simd_per_cu)),
                ("max_waves_per_simd", 8),
                ("wave_front_size", 64),
                ("gfx_target_version", u64::from(gfx)),
                ("vendor_id", 4098),
                ("device_id", u64::from(model.device_id)),
                (
                    "location_id",
                    u64::from(gpu.bus) << 8 | u64::from(node.partition),
                ),
                ("domain", 0),
                ("drm_render_minor", u64::from(node.render_minor)),
                ("hive_id", gpu.hive_id),
                ("num_sdma_engines", 2),
                ("fw_version", u64::from(model.firmware_version("mec"))),
                ("sdma_fw_version", u64::from(model.firmware_version("sdma"))),
                ("unique_id", gpu.unique_id),
                ("num_xcc", u64::from(8 / per_gpu.min(8))),
                ("local_mem_size", 0),
                ("max_engine_clk_fcompute", model.clocks.sclk_mhz[2]),
            ] {
                let _ = writeln!(props, "{key} {value}");
            }
            w.file(format!("{dir}/properties"), props)?;
            w.file(
                format!("{dir}/gpu_id"),
                format!("{}\n", gpu.unique_id % 65521),
            )?;
            w.file(format!("{dir}/name"), format!("{gfx_name}\n"))?;
            w.file(
                format!("{dir}/mem_banks/0/properties"),
                format!(
                    "heap_type 1\nsize_in_bytes {}\nflags 0\nwidth 8192\nmem_clk_max {}\n",
                    model.vram_bytes / u64::from(per_gpu),
                    model.clocks.mclk.levels_mhz.last().copied().unwrap_or(0),
                ),
            )?;
            for (kind, list) in [("io_links", io_links), ("p2p_links", p2p_links)] {
                for (i, (link_type, to, weight)) in list.into_iter().enumerate() {
                    w.file(
                        format!("{dir}/{kind}/{i}/properties"),
                        format!(
                            "type {link_type}\nversion_major 0\nversion_minor 0\nnode_from {}\n\
                             node_to {to}\nweight {weight}\n",
                            node.kfd_id
                        ),
                    )?;
                }
            }
        }
    }
    Ok(())
}

/// (type, node_to, weight) of a node's io_links and p2p_links. XGMI peers and the
/// local CPU are io_links; GPUs reached only over PCIe are p2p_links, as in the
/// MI210 capture.
type LinkList = Vec<(u32, u32, u32)>;

fn links(
    spec: &SimSpec,
    layout: &Layout,
    gpu: &GpuLayout,
    node: &NodeLayout,
) -> (LinkList, LinkList) {
    const XGMI: u32 = 11;
    const PCIE: u32 = 2;
    let cpu = u32::try_from(gpu.numa.max(0)).unwrap_or(0) % spec.profile.cpu_nodes.max(1);
    let mut io = vec![(PCIE, cpu, 20)];
    let mut p2p = Vec::new();
    for peer in &layout.gpus {
        for other in &peer.nodes {
            if other.kfd_id == node.kfd_id {
                continue;
            }
            if peer.index == gpu.index {
                io.push((XGMI, other.kfd_id, 13));
            } else if gpu.hive_id != 0 && peer.hive_id == gpu.hive_id {
                io.push((XGMI, other.kfd_id, 15));
            } else {
                p2p.push((PCIE, other.kfd_id, 40));
            }
        }
    }
    (io, p2p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::write_host;

    #[test]
    fn a_kfd_process_is_laid_out_as_the_kernel_does() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        write_host(&host, &SimSpec::new("mi210", Some(2), None).unwrap()).unwrap();
        let node = 3;
        let gpu_id = host
            .read_attr(format!("{KFD_TOPOLOGY}/nodes/{node}/gpu_id"))
            .unwrap();
        add_kfd_process(&host, 4242, &[(node, 26)]).unwrap();
        let proc = "/sys/class/kfd/kfd/proc/4242";
        assert_eq!(
            host.read_attr(format!("{proc}/queues/0/gpuid")).unwrap(),
            gpu_id
        );
        assert_eq!(
            host.read_attr(format!("{proc}/stats_{gpu_id}/cu_occupancy"))
                .unwrap(),
            "26"
        );
    }
}
