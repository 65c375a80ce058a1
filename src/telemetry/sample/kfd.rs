//! The processes that opened `/dev/kfd`, per KFD node, with the compute
//! units each occupies there: read in a few rounds of batched reads, matched
//! to the nodes by a pure rule ([`processes_by_node`]).
//!
//! This file owns KFD's process files. It must not read anything but them
//! nor know the rest of a sample (the [`super::Sampler`] asks for this part).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::device::Inventory;
use crate::host::reader::{Answer, BoundedReader, Op, Requests};
use crate::telemetry::sysfs::parse_u64;

/// Where the kernel lists the processes that opened `/dev/kfd`: one
/// directory per pid, with a `queues/<id>/gpuid` file per queue naming the
/// KFD GPU (a topology node's `gpu_id`) it runs on, which is how amd-smi
/// finds a GPU's processes.
pub(super) const KFD_PROC: &str = "/sys/class/kfd/kfd/proc";
pub(super) const KFD_NODES: &str = "/sys/class/kfd/kfd/topology/nodes";

/// What [`kfd_processes`] found: the pids with a queue on each KFD node, and
/// the compute units each occupies there.
#[derive(Debug, Default)]
pub(super) struct KfdProcesses {
    pub(super) by_node: BTreeMap<u32, Vec<u32>>,
    pub(super) cu_occupancy: BTreeMap<u32, BTreeMap<u32, u32>>,
}

/// KFD node → the pids with a queue on it, and their CU occupancy: four
/// rounds of reads (the process list and every GPU node's `gpu_id`; each
/// process's queues; each queue's `gpuid`; each (process, GPU) pair's
/// `stats_<gpu_id>/cu_occupancy`). What cannot be read is left out.
pub(super) async fn kfd_processes(
    reader: &BoundedReader,
    inventory: &Inventory,
    timeout: Duration,
) -> KfdProcesses {
    let nodes: Vec<u32> = inventory
        .gpus
        .iter()
        .flat_map(|g| {
            g.kfd_node
                .into_iter()
                .chain(g.partitions.iter().filter_map(|p| p.kfd_node))
        })
        .collect::<std::collections::BTreeSet<u32>>()
        .into_iter()
        .collect();
    let mut requests = vec![(Op::List, KFD_PROC.to_owned())];
    requests.extend(
        nodes
            .iter()
            .map(|n| (Op::Read, format!("{KFD_NODES}/{n}/gpu_id"))),
    );
    let mut answers = reader.batch(requests, timeout).await.into_iter();
    let pids: Vec<u32> = match answers.next() {
        Some(Ok(Answer::Names(names))) => names.iter().filter_map(|n| n.parse().ok()).collect(),
        _ => Vec::new(),
    };
    let node_ids: Vec<(u32, u64)> = nodes
        .iter()
        .zip(answers)
        .filter_map(|(n, a)| match a {
            Ok(Answer::Text(t)) => parse_u64(&t, "a KFD gpu_id").ok().map(|id| (*n, id)),
            _ => None,
        })
        .collect();
    if pids.is_empty() || node_ids.is_empty() {
        return KfdProcesses::default();
    }
    let lists = reader
        .batch(
            pids.iter()
                .map(|p| (Op::List, format!("{KFD_PROC}/{p}/queues")))
                .collect::<Requests>(),
            timeout,
        )
        .await;
    let queues: Vec<(u32, String)> = pids
        .iter()
        .zip(lists)
        .flat_map(|(pid, list)| match list {
            Ok(Answer::Names(names)) => names
                .into_iter()
                .filter(|q| q.bytes().all(|b| b.is_ascii_digit()))
                .map(|q| (*pid, format!("{KFD_PROC}/{pid}/queues/{q}/gpuid")))
                .collect(),
            _ => Vec::new(),
        })
        .collect();
    let gpuids = reader
        .batch(
            queues
                .iter()
                .map(|(_, p)| (Op::Read, p.clone()))
                .collect::<Requests>(),
            timeout,
        )
        .await;
    let used: Vec<(u32, u64)> = queues
        .iter()
        .zip(gpuids)
        .filter_map(|((pid, _), a)| match a {
            Ok(Answer::Text(t)) => parse_u64(&t, "a KFD gpu_id").ok().map(|id| (*pid, id)),
            _ => None,
        })
        .collect();
    let by_node = processes_by_node(&node_ids, &used);
    // One read per (process, node) pair: the occupancy of the GPUs each
    // process has queues on.
    let pairs: Vec<(u32, u32, u64)> = by_node
        .iter()
        .flat_map(|(node, pids)| {
            let gpu_id = node_ids.iter().find(|(n, _)| n == node).map(|(_, id)| *id);
            pids.iter()
                .filter_map(move |pid| Some((*node, *pid, gpu_id?)))
        })
        .collect();
    let answers = reader
        .batch(
            pairs
                .iter()
                .map(|(_, pid, gpu_id)| {
                    (
                        Op::Read,
                        format!("{KFD_PROC}/{pid}/stats_{gpu_id}/cu_occupancy"),
                    )
                })
                .collect::<Requests>(),
            timeout,
        )
        .await;
    let mut cu_occupancy: BTreeMap<u32, BTreeMap<u32, u32>> = BTreeMap::new();
    for ((node, pid, _), answer) in pairs.into_iter().zip(answers) {
        if let Ok(Answer::Text(t)) = answer
            && let Ok(cus) = parse_u64(&t, "a CU count")
        {
            let cus = u32::try_from(cus).unwrap_or(u32::MAX);
            cu_occupancy.entry(node).or_default().insert(pid, cus);
        }
    }
    KfdProcesses {
        by_node,
        cu_occupancy,
    }
}

/// Pure: (KFD node, its `gpu_id`) and (pid, a queue's `gpuid`) → node →
/// its pids, ascending, each once. Nodes without processes are left out.
pub fn processes_by_node(node_ids: &[(u32, u64)], used: &[(u32, u64)]) -> BTreeMap<u32, Vec<u32>> {
    let mut out: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (node, gpu_id) in node_ids {
        let mut pids: Vec<u32> = used
            .iter()
            .filter(|(_, id)| id == gpu_id)
            .map(|(pid, _)| *pid)
            .collect();
        pids.sort_unstable();
        pids.dedup();
        if !pids.is_empty() {
            out.insert(*node, pids);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_are_matched_to_nodes_by_gpu_id() {
        let nodes = [(2, 1111), (3, 2222), (4, 3333)];
        // pid 9 has two queues on node 2, and one on node 3.
        let used = [(9, 1111), (7, 1111), (9, 1111), (9, 2222), (5, 4444)];
        assert_eq!(
            processes_by_node(&nodes, &used),
            BTreeMap::from([(2, vec![7, 9]), (3, vec![9])])
        );
    }
}
